"""The bandwidth reference: np.copyto of an op's minimum traffic, on as many threads as the
op's resnorm call uses.

A copy of traffic/2 bytes reads and writes `traffic` bytes.  NumPy copies on one thread, so
for a call that resnorm runs on n threads the copy is split into n page-aligned slices,
n - 1 of them copied by Python worker threads (NumPy releases the GIL while it copies):
the ratio "x copy" then compares like with like, in the same rounds and under the same
load.  Calls that resnorm keeps on one thread (resnorm._parallel.threads_for) copy on one.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._parallel import threads_for

_SLICE_ALIGN = 4096  # bytes: slices start on page boundaries (no shared cache lines)


class CopyReference:
    """Makes copy callables; owns the worker threads (close() when done)."""

    def __init__(self, max_threads):
        self._pool = ThreadPoolExecutor(max(1, max_threads - 1))

    def close(self):
        self._pool.shutdown()

    def make(self, traffic, dtype, n_threads, n_elements):
        """(copy(), bytes it moves, threads it uses): a copy of traffic/2 bytes on the threads
        a resnorm call with n_threads over n_elements uses."""
        threads = threads_for(n_threads, n_elements)
        n = max(1, traffic // (2 * dtype.itemsize))
        src = np.ones(n, dtype)
        dst = np.empty_like(src)
        if threads == 1:
            return (lambda: np.copyto(dst, src)), 2 * src.nbytes, 1
        align = _SLICE_ALIGN // dtype.itemsize
        cuts = [min(n, -(-n * i // threads) // align * align) for i in range(threads + 1)]
        cuts[-1] = n
        slices = [(dst[a:b], src[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]

        def copy():
            pending = [self._pool.submit(np.copyto, d, s) for d, s in slices[1:]]
            np.copyto(*slices[0])
            for p in pending:
                p.result()
        return copy, 2 * src.nbytes, threads
