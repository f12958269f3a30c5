"""How many threads a call uses and when it streams its output past the caches."""
from . import _runtime

# Below this many elements a call runs on one thread: starting a team costs more than the
# work (measured in benchmarks/thread_threshold.py).
PARALLEL_MIN_ELEMENTS = 1 << 15

# Outputs at least this large are written with non-temporal stores: they would not stay in
# cache anyway, and skipping the read-for-ownership of each output line saves a third of
# the traffic of a forward pass.  Smaller outputs stay in cache for whoever reads them next.
STREAM_MIN_BYTES = 8 << 20


def threads_for(n_threads, n_elements):
    """The thread count for a call over n_elements: n_threads (None: the OpenMP default),
    but 1 when the work is too small to pay for a parallel region."""
    if n_elements < PARALLEL_MIN_ELEMENTS:
        return 1
    return _runtime.get_max_threads() if n_threads is None else n_threads


def streams(nbytes):
    """True when an output of nbytes should be written with streaming stores."""
    return nbytes >= STREAM_MIN_BYTES
