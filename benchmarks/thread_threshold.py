"""Where does a second thread start to pay?  Times the RMSNorm and LayerNorm forward kernels
on 1 and 2 threads over growing inputs (rows of 1024 float32), with resnorm's own
small-input rule (_parallel.PARALLEL_MIN_ELEMENTS) set to 0 so that it does not decide for
them, and prints the 2-thread / 1-thread time ratio per size.

    python benchmarks/thread_threshold.py [--repeats N]

A parallel region costs a thread wake-up and a barrier (a few microseconds); below the size
where the ratio crosses 1, one thread is faster.  PARALLEL_MIN_ELEMENTS is set near that
crossing.  On a machine where other processes hold a core, OpenMP's spin-waiting makes every
2-thread time much worse: run this on an otherwise idle machine.
"""
import argparse

import numpy as np

import resnorm
from resnorm import _parallel
from resnorm.bench import time_interleaved

D = 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=301)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"PARALLEL_MIN_ELEMENTS = {_parallel.PARALLEL_MIN_ELEMENTS} (set to 0 while timing)\n")
    saved, _parallel.PARALLEL_MIN_ELEMENTS = _parallel.PARALLEL_MIN_ELEMENTS, 0
    try:
        _table(rng, args.repeats)
    finally:
        _parallel.PARALLEL_MIN_ELEMENTS = saved


def _table(rng, repeats):
    print("| elements | rows x 1024 | rms 1 thr us | rms 2 thr us | 2/1 | layer 1 thr us | layer 2 thr us | 2/1 |")
    print("|---|---|---|---|---|---|---|---|")
    for rows in (2, 4, 8, 16, 32, 64, 128, 256):
        x = rng.standard_normal((rows, D)).astype(np.float32)
        w, b = np.ones(D, np.float32), np.zeros(D, np.float32)
        y = np.empty_like(x)
        calls = [
            lambda: resnorm.rms_norm(x, w, out=y, n_threads=1),
            lambda: resnorm.rms_norm(x, w, out=y, n_threads=2),
            lambda: resnorm.layer_norm(x, w, b, out=y, n_threads=1),
            lambda: resnorm.layer_norm(x, w, b, out=y, n_threads=2),
        ]
        r1, r2, l1, l2 = (t * 1e6 for t in time_interleaved(calls, repeats))
        print(f"| {rows * D} | {rows} | {r1:.2f} | {r2:.2f} | {r2 / r1:.2f} | "
              f"{l1:.2f} | {l2:.2f} | {l2 / l1:.2f} |")


if __name__ == "__main__":
    main()
