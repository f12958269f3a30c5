# How a kernel is launched (included by api.pyx): its thread count, whether it streams its
# output past the caches, and the scratch it borrows.

# Below this many elements a call runs on one thread: waking a second thread and meeting it
# at the barrier costs more than the work.  benchmarks/thread_threshold.py measured the
# crossing on a 2-core machine (float32 rows of 1024): at 8192 elements 2 threads took
# 1.24x (RMSNorm) / 1.03x (LayerNorm) the 1-thread time, at 16384 1.01x / 0.84x, at
# 32768 0.77x / 0.68x.
cdef Py_ssize_t parallel_min_elements = 1 << 14

# Outputs at least this large are written with non-temporal stores: they would not stay in
# cache anyway, and skipping the read-for-ownership of each output line saves a third of
# the traffic of a forward pass.  Smaller outputs stay in cache for whoever reads them next.
cdef Py_ssize_t stream_min_bytes = 8 << 20


cdef extern from "cores.h":
    int rn_cores() noexcept
    int rn_free_cores() noexcept

# A team larger than this many threads per core is never faster, and thousands of threads
# cost milliseconds to start: n_threads above it runs on OVERSUBSCRIBE * cores threads.
# (Oversubscribing a little is kept possible: results are the same on any team, and the
# tests compare 1, 2 and 4 threads on 2 cores.)
cdef enum:
    OVERSUBSCRIBE = 4

# A process made by fork() runs every kernel on one thread.  Its OpenMP runtime is the
# parent's memory without the parent's threads: GNU OpenMP then waits forever for a team it
# believes it has (a multiprocessing.Pool with the fork start method hung on its first
# threaded call).  The spawn and forkserver start methods give workers a fresh runtime.
cdef bint forked_child = False
cdef bint fork_warned = False

FORK_WARNING = (
    "resnorm runs on one thread in this process: it was started by fork(), and OpenMP "
    "cannot safely start threads after a fork (GNU OpenMP hangs).  For threaded resnorm "
    "calls in worker processes, start them with the 'spawn' or 'forkserver' method, e.g. "
    "multiprocessing.get_context('forkserver').Pool(...)")


def _after_fork_in_child():
    global forked_child
    forked_child = True


os.register_at_fork(after_in_child=_after_fork_in_child)


cdef int one_thread_after_fork() except -1:
    """1, after the warning (once per process) that a forked process runs on one thread."""
    global fork_warned
    if not fork_warned:
        fork_warned = True
        warnings.warn(FORK_WARNING, RuntimeWarning)
    return 1


cdef inline int team(int n_threads, Py_ssize_t n_elements) except -1:
    """The thread count of a call over n_elements, for n_threads as threads_of gives it:
    1 when the work is too small to pay for a parallel region or in a forked process; else
    for 0 (None) the OpenMP default, but no more threads than there are cores other
    processes leave free (cores.h); for -1 every core; else n_threads, at most
    OVERSUBSCRIBE per core (a count up to OVERSUBSCRIBE needs no look at the cores:
    rn_cores is a system call)."""
    cdef int cores, default
    if n_elements < parallel_min_elements or n_threads == 1:
        return 1
    if n_threads == 0:
        default = omp_get_max_threads()
        if default <= 1:
            return 1
        n_threads = min(default, rn_free_cores())
    elif n_threads == -1:
        n_threads = rn_cores()
    elif n_threads > OVERSUBSCRIBE:
        n_threads = min(n_threads, OVERSUBSCRIBE * rn_cores())
    if forked_child and n_threads > 1:
        return one_thread_after_fork()
    return n_threads


cdef extern from "Python.h":
    ctypedef struct PyThreadState
    PyThreadState *PyEval_SaveThread() noexcept
    void PyEval_RestoreThread(PyThreadState *) noexcept


cdef inline PyThreadState *release_gil(Py_ssize_t n_elements) noexcept:
    """Releases the GIL for the kernel of a call over n_elements when the call is large
    enough to run on several threads (team()); returns what take_gil_back needs (NULL: the
    GIL was kept).  A smaller call keeps it: releasing and taking it back (mutex handoffs
    and a condition signal) took 460 of the 4,600 instructions of an rms_norm call at
    (1, 16), and such a kernel is over within microseconds."""
    return PyEval_SaveThread() if n_elements >= parallel_min_elements else NULL


cdef inline void take_gil_back(PyThreadState *state) noexcept:
    if state != NULL:
        PyEval_RestoreThread(state)


cdef inline bint streams(Py_ssize_t nbytes) noexcept nogil:
    """True when an output of nbytes should be written with streaming stores."""
    return nbytes >= stream_min_bytes


# The forward passes (norms, add + norm, residuals, dropout: each vector of the inputs is
# loaded, then its output stored) store plainly an output that starts 1 to ALIAS_BYTES - 1
# bytes past an input, modulo 4 KiB: a load waits for an earlier store whose address has
# the same low 12 bits ("4K aliasing"), so there the input's next vectors wait for the
# stores just made, and a streamed store stays pending far longer than a plain one.
# float32, one thread, (65536, 256) to (4096, 4096): streamed, an output 16-48 bytes past
# x took 2.0-2.4x the plain time (rms_norm, layer_norm, add_rms_norm), 96 bytes 1.0-1.2x,
# 128 bytes 0.8-1.1x, from 192 on streaming was as fast or faster.  The backward passes
# stream as before: there it depends on the shape (at 16 bytes past dy, streaming took
# 1.25x the plain time at D = 256 but 0.67x at D = 1024).
cdef enum:
    ALIAS_BYTES = 128


cdef inline bint trails(void *out, void *a) noexcept nogil:
    """Whether out starts 1 .. ALIAS_BYTES - 1 bytes past a, modulo 4 KiB (NULL: no)."""
    return out != NULL and a != NULL and 0 < (<size_t>out - <size_t>a) % 4096 < ALIAS_BYTES


cdef inline bint streams_over(cnp.ndarray out, out2, a, b) noexcept:
    """Whether a forward pass's outputs out (and out2; None: none), written while the rows
    of a (and b) are read, take streaming stores: from stream_min_bytes on, unless an
    output trails an input."""
    if not streams(cnp.PyArray_NBYTES(out)):
        return False
    cdef void *o = cnp.PyArray_DATA(out)
    cdef void *o2 = data_of(out2)
    cdef void *pa = data_of(a)
    cdef void *pb = data_of(b)
    return not (trails(o, pa) or trails(o, pb) or trails(o2, pa) or trails(o2, pb))


def threads_for(n_threads, n_elements):
    """The thread count a call over n_elements runs on for this n_threads (None: the OpenMP
    default, sized to the free cores; -1: every core), by the rule of team()."""
    return team(threads_of(n_threads), n_elements)


def stream_output(nbytes):
    """True when an output of nbytes is written with streaming stores (unless it trails an
    input: stream_output_over)."""
    return streams(nbytes)


def stream_output_over(cnp.ndarray out not None, cnp.ndarray source not None):
    """True when a forward pass writes out with streaming stores while reading source's
    rows."""
    return streams_over(out, None, source, None)


def launch_limits():
    """(parallel_min_elements, stream_min_bytes): below the first a call runs on one thread,
    from the second on outputs are written with streaming stores."""
    return parallel_min_elements, stream_min_bytes


def set_launch_limits(parallel_min_elements_=None, stream_min_bytes_=None):
    """Changes the limits of launch_limits() (for experiments and tests); returns the old
    ones.  The results of every kernel are the same for any value: only speed changes."""
    global parallel_min_elements, stream_min_bytes
    old = (parallel_min_elements, stream_min_bytes)
    if parallel_min_elements_ is not None:
        parallel_min_elements = parallel_min_elements_
    if stream_min_bytes_ is not None:
        stream_min_bytes = stream_min_bytes_
    return old


# --------------------------------------------------------------------------- scratch
#
# Scratch (row statistics of the inference forms, the float64 partial sums of backward,
# per-thread rows and keep masks) is lent from a small pool instead of allocated per call.
# Why: the partials are (row blocks, D) float64, 2 MiB each at D=4096.  Once the process has
# freed big arrays (a PyTorch step does), glibc hands memory of that size back to the kernel
# on free, and every call page-faulted its partials in again: LayerNorm backward at
# (2048, 4096) float32 on one thread went from 3.3 ms to 5.2 ms, 1000 page faults per call.
# The pool is used with the GIL held (lend before the kernel releases it, give back after),
# so a buffer is lent to one caller at a time.  Memory comes from PyMem_RawMalloc, which
# tracemalloc sees.

cdef enum:
    KEEP_BUFFERS = 4          # enough for a few concurrent callers
    SCRATCH_ALIGN = 64        # a cache line: per-thread rows never share one

cdef Py_ssize_t keep_max_bytes = 32 * 1024 * 1024  # larger buffers are freed, not kept

cdef void *pool_block[KEEP_BUFFERS]    # as allocated
cdef Py_ssize_t pool_bytes[KEEP_BUFFERS]
cdef int pool_count = 0


cdef class Scratch:
    """One lent buffer of at least `nbytes` bytes, 64-byte aligned, uninitialised; it goes
    back to the pool when give_back() is called (or the object is freed)."""
    cdef void *block
    cdef Py_ssize_t nbytes
    cdef char *data

    def __dealloc__(self):
        self.give_back()

    cdef void give_back(self) noexcept:
        """Returns the buffer to the pool, keeping the largest KEEP_BUFFERS of at most
        keep_max_bytes."""
        global pool_count
        cdef int k, smallest
        if self.block == NULL:
            return
        if self.nbytes <= keep_max_bytes:
            if pool_count < KEEP_BUFFERS:
                pool_block[pool_count] = self.block
                pool_bytes[pool_count] = self.nbytes
                pool_count += 1
                self.block = NULL
            else:
                smallest = 0
                for k in range(1, pool_count):
                    if pool_bytes[k] < pool_bytes[smallest]:
                        smallest = k
                if pool_bytes[smallest] < self.nbytes:
                    PyMem_RawFree(pool_block[smallest])
                    pool_block[smallest] = self.block
                    pool_bytes[smallest] = self.nbytes
                    self.block = NULL
        if self.block != NULL:
            PyMem_RawFree(self.block)
        self.block = NULL
        self.data = NULL


cdef Scratch lend(Py_ssize_t nbytes):
    """A Scratch of at least nbytes: the smallest pooled buffer that fits, else a new one."""
    global pool_count
    cdef Scratch s = Scratch.__new__(Scratch)
    cdef int k, best = -1
    for k in range(pool_count):
        if pool_bytes[k] >= nbytes and (best < 0 or pool_bytes[k] < pool_bytes[best]):
            best = k
    if best >= 0:
        s.block, s.nbytes = pool_block[best], pool_bytes[best]
        pool_count -= 1
        pool_block[best], pool_bytes[best] = pool_block[pool_count], pool_bytes[pool_count]
    else:
        s.nbytes = max(nbytes, <Py_ssize_t>SCRATCH_ALIGN)
        s.block = PyMem_RawMalloc(s.nbytes + SCRATCH_ALIGN)
        if s.block == NULL:
            raise MemoryError(f"could not allocate {nbytes} bytes of scratch")
    s.data = <char *>s.block + (-<uintptr_t>s.block) % SCRATCH_ALIGN
    return s


def scratch_pool():
    """The sizes in bytes of the buffers the pool keeps now (for tests)."""
    return sorted(pool_bytes[k] for k in range(pool_count))


def scratch_limits():
    """(buffers kept at most, largest buffer kept in bytes)."""
    return KEEP_BUFFERS, keep_max_bytes


def clear_scratch_pool():
    """Frees every buffer the pool keeps (for tests)."""
    global pool_count
    while pool_count:
        pool_count -= 1
        PyMem_RawFree(pool_block[pool_count])


def lend_scratch(Py_ssize_t nbytes):
    """A Scratch of at least nbytes, for tests of the pool; give it back with del."""
    return lend(nbytes)
