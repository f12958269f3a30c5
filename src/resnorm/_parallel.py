"""How many threads a call uses and when it streams its output past the caches."""
from . import _core

# Below this many elements a call runs on one thread: waking a second thread and meeting it
# at the barrier costs more than the work.  benchmarks/thread_threshold.py measured the
# crossing here (2-core AMD EPYC, float32 rows of 1024): at 8192 elements 2 threads take
# 1.24x (RMSNorm) / 1.03x (LayerNorm) the 1-thread time, at 16384 1.01x / 0.84x, at
# 32768 0.77x / 0.68x.
PARALLEL_MIN_ELEMENTS = 1 << 14

# Outputs at least this large are written with non-temporal stores: they would not stay in
# cache anyway, and skipping the read-for-ownership of each output line saves a third of
# the traffic of a forward pass.  Smaller outputs stay in cache for whoever reads them next.
STREAM_MIN_BYTES = 8 << 20


def threads_for(n_threads, n_elements):
    """The thread count for a call over n_elements: n_threads (None: the OpenMP default),
    but 1 when the work is too small to pay for a parallel region."""
    if n_elements < PARALLEL_MIN_ELEMENTS:
        return 1
    return _core.get_max_threads() if n_threads is None else n_threads


def streams(nbytes):
    """True when an output of nbytes should be written with streaming stores."""
    return nbytes >= STREAM_MIN_BYTES
