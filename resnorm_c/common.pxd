# Shared Cython declarations of the kernels: the OpenMP stub, the core's constants, and the
# fixed row blocks through which every reduction over rows goes.
from cython.parallel cimport prange
from libc.string cimport memset

from primitives cimport element, rn_accumulate, rn_narrow

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define RN_HAVE_OPENMP 1
    #else
    #define RN_HAVE_OPENMP 0
    static int omp_get_max_threads(void) { return 1; }
    #endif
    """
    bint RN_HAVE_OPENMP
    int omp_get_max_threads() noexcept nogil

cdef extern from "core.h" nogil:
    enum: RN_GROUP
    int RN_STREAM_UNFENCED
    void rn_sfence()


cdef inline const element *at(const element *p, Py_ssize_t k) noexcept nogil:
    """p + k for an optional row (NULL stays NULL)."""
    if p == NULL:
        return NULL
    return p + k


cdef inline Py_ssize_t first_row(Py_ssize_t t, Py_ssize_t n, int n_threads) noexcept nogil:
    """The first of thread t's rows when the kernels that split by thread give n rows to
    n_threads threads in contiguous ranges: thread t takes first_row(t) .. first_row(t + 1)."""
    return t * n // n_threads


# ---- reductions over rows: fixed row blocks, one float64 partial row per block ----

# At most MAX_ROW_BLOCKS blocks of at least MIN_BLOCK_ROWS rows each (fewer rows than that
# make one block).  A function of N alone, for reproducibility across thread counts.
cdef enum:
    MAX_ROW_BLOCKS = 64
    MIN_BLOCK_ROWS = 16
    REDUCE_COLUMNS = 512  # columns per task when the partial rows are summed


cdef inline void zero_partials(double *a, double *b, Py_ssize_t d) noexcept nogil:
    """A row block's partial rows (of d columns; NULL: not wanted) start at zero."""
    if a != NULL:
        memset(a, 0, d * sizeof(double))
    if b != NULL:
        memset(b, 0, d * sizeof(double))


cdef inline Py_ssize_t row_blocks(Py_ssize_t n_rows) noexcept nogil:
    """Number of row blocks a reduction over N rows uses (depends on N only)."""
    cdef Py_ssize_t nb = (n_rows + MIN_BLOCK_ROWS - 1) // MIN_BLOCK_ROWS
    return max(1, min(MAX_ROW_BLOCKS, nb))


cdef inline void sum_columns(element *out, double *part, Py_ssize_t nb, Py_ssize_t d,
                             Py_ssize_t j0) noexcept nogil:
    cdef Py_ssize_t b, m = min(<Py_ssize_t>REDUCE_COLUMNS, d - j0)
    for b in range(1, nb):
        rn_accumulate(part + j0, part + b * d + j0, m)
    rn_narrow(out + j0, part + j0, m)


cdef inline void sum_partials(element *out, double *part, Py_ssize_t nb, Py_ssize_t d,
                              int n_threads) noexcept nogil:
    """out[j] := sum_b part[b, j] for the (nb, d) partial rows, added in block order
    b = 0, 1, ... for every j.  (part is overwritten: row 0 accumulates the total.)"""
    cdef Py_ssize_t n_tasks = (d + REDUCE_COLUMNS - 1) // REDUCE_COLUMNS, t
    if n_threads == 1 or n_tasks == 1:
        for t in range(n_tasks):
            sum_columns(out, part, nb, d, t * REDUCE_COLUMNS)
    else:
        for t in prange(n_tasks, schedule="static", num_threads=n_threads):
            sum_columns(out, part, nb, d, t * REDUCE_COLUMNS)
