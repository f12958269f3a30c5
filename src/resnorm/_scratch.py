"""Float64 scratch for the dweight/dbias/dalpha partial sums of the backward kernels, lent
from a small pool instead of allocated per call.

Why: the partials are (row blocks, D) float64, 2 MiB each at D=4096.  Once the process has
freed big arrays (a PyTorch step does), glibc hands memory of that size back to the kernel
on free, and every call page-faults its partials in again: LayerNorm backward at
(2048, 4096) float32 on one thread went from 3.3 ms to 5.2 ms, 1000 page faults per call.

Thread safe (the kernels release the GIL): a buffer is lent to one caller at a time.
"""
import threading

import numpy as np

KEEP_BUFFERS = 4                   # enough for a few concurrent callers
KEEP_MAX_BYTES = 32 * 1024 * 1024  # larger buffers are freed, not kept

_free = []
_lock = threading.Lock()


def lend_partials(n_blocks, d, *wanted):
    """One (n_blocks, d) float64 array per flag in `wanted` ((n_blocks, 0) where the flag
    is false), all views of one lent buffer, uninitialised (the kernels zero each block's
    row before adding to it).  Returns (buffer, arrays); pass the buffer to give_back when
    the kernel is done."""
    widths = [d if w else 0 for w in wanted]
    buffer = _take(n_blocks * sum(widths))
    arrays, start = [], 0
    for width in widths:
        arrays.append(buffer[start:start + n_blocks * width].reshape(n_blocks, width))
        start += n_blocks * width
    return buffer, arrays


def give_back(buffer):
    """Return a buffer from lend_partials to the pool (keeping the largest few)."""
    if buffer.size == 0 or buffer.nbytes > KEEP_MAX_BYTES:
        return
    with _lock:
        _free.append(buffer)
        if len(_free) > KEEP_BUFFERS:
            # by position: list.remove would compare arrays elementwise
            del _free[min(range(len(_free)), key=lambda k: _free[k].size)]


def _take(size):
    """The smallest free buffer of at least `size` elements (whole, so that it goes back
    whole), or a new one."""
    if size == 0:
        return np.empty(0)
    with _lock:
        fitting = [k for k in range(len(_free)) if _free[k].size >= size]
        if fitting:
            return _free.pop(min(fitting, key=lambda k: _free[k].size))
    return np.empty(size)
