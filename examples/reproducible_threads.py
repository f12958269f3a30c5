"""The same bits on any number of threads.

The row reductions have a fixed lane structure and the gradients summed over rows
(dweight, dbias) go through fixed blocks of rows that depend only on the shape, so
LayerNorm's forward and backward give bitwise identical results on 1 thread and on every
core.  n_threads=None (the default) sizes the team to the cores other processes leave free.
"""
import os

import numpy as np

import resnorm

rng = np.random.default_rng(0)
x = rng.standard_normal((512, 1024), dtype=np.float32)
weight, bias = np.ones(1024, np.float32), np.zeros(1024, np.float32)
dy = rng.standard_normal(x.shape, dtype=np.float32)


def run(n_threads):
    y, cache = resnorm.layer_norm_forward(x, weight, bias, n_threads=n_threads)
    return (y, *resnorm.layer_norm_backward(dy, cache, n_threads=n_threads))


print(f"OpenMP: {resnorm.openmp_enabled()}, SIMD level: {resnorm.simd_level()}, "
      f"cores: {os.cpu_count()}")
one = run(1)
for n_threads in (2, -1):   # -1: every core
    for name, a, b in zip(("y", "dx", "dweight", "dbias"), one, run(n_threads)):
        assert a.tobytes() == b.tobytes(), f"{name} differs on n_threads={n_threads}"
    print(f"n_threads={n_threads}: y, dx, dweight and dbias bitwise equal to one thread's")
