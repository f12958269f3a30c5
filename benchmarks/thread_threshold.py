"""Where does a second thread start to pay?  Times the RMSNorm and LayerNorm forward kernels
on 1 and 2 threads over growing inputs (rows of 1024 float32), calling the compiled kernels
directly so that resnorm's own small-input rule (_parallel.PARALLEL_MIN_ELEMENTS) does not
decide for them, and prints the 2-thread / 1-thread time ratio per size.

    python benchmarks/thread_threshold.py [--repeats N]

A parallel region costs a thread wake-up and a barrier (a few microseconds); below the size
where the ratio crosses 1, one thread is faster.  PARALLEL_MIN_ELEMENTS is set near that
crossing.  On a machine where other processes hold a core, OpenMP's spin-waiting makes every
2-thread time much worse: run this on an otherwise idle machine.
"""
import argparse

import numpy as np

from resnorm import _norms
from resnorm._parallel import PARALLEL_MIN_ELEMENTS
from resnorm.bench import time_interleaved

D = 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=301)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"PARALLEL_MIN_ELEMENTS = {PARALLEL_MIN_ELEMENTS}\n")
    print("| elements | rows x 1024 | rms 1 thr us | rms 2 thr us | 2/1 | layer 1 thr us | layer 2 thr us | 2/1 |")
    print("|---|---|---|---|---|---|---|---|")
    for rows in (2, 4, 8, 16, 32, 64, 128, 256):
        x = rng.standard_normal((rows, D)).astype(np.float32)
        w, b = np.ones(D, np.float32), np.zeros(D, np.float32)
        y, mean, rstd = np.empty_like(x), np.empty(rows), np.empty(rows)
        calls = [
            lambda: _norms.rms_norm_forward(y, rstd, x, w, 1e-6, 1, False),
            lambda: _norms.rms_norm_forward(y, rstd, x, w, 1e-6, 2, False),
            lambda: _norms.layer_norm_forward(y, mean, rstd, x, w, b, 1e-5, 1, False),
            lambda: _norms.layer_norm_forward(y, mean, rstd, x, w, b, 1e-5, 2, False),
        ]
        r1, r2, l1, l2 = (t * 1e6 for t in time_interleaved(calls, args.repeats))
        print(f"| {rows * D} | {rows} | {r1:.2f} | {r2:.2f} | {r2 / r1:.2f} | "
              f"{l1:.2f} | {l2:.2f} | {l2 / l1:.2f} |")


if __name__ == "__main__":
    main()
