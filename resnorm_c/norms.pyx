"""RMSNorm and LayerNorm kernels, forward and backward, over the rows of a (N, D) array.

Outputs come first, then inputs, then sizes.  The kernels do not validate (resnorm.norms
does that) and do not allocate, except the small dweight/dbias partial sums of backward.

Rows run in parallel (OpenMP, GIL released).  Every row statistic is a double-precision
reduction with a fixed lane order (resnorm_c/rowops.h), so results are bitwise identical
for any thread count.  dweight/dbias sum over rows: each block of rows writes its own
partial row, and the partials are added in block order.  The split into blocks depends on
N only (never on the thread count), so those are bitwise reproducible too.
"""
import numpy as np

from resnorm._scratch import give_back, lend_partials

cimport numpy as cnp
from cpython.mem cimport PyMem_RawFree, PyMem_RawMalloc
from cython.parallel cimport prange
from libc.float cimport DBL_MIN, FLT_MIN
from libc.math cimport isfinite, sqrt
from libc.string cimport memset

from common cimport row_blocks, sum_partials, opt_ptr, RN_GROUP, omp_get_max_threads
from primitives cimport (element, rn_import_core, rn_sum, rn_sumsq, rn_sumsqdev, rn_rms_bwd_dot,
                         rn_ln_bwd_sums, rn_rms_apply, rn_ln_apply, rn_rms_bwd_apply_rows,
                         rn_ln_bwd_apply_rows)
# the scalar paths for the few rows the fast paths cannot take (see rare_rows.pxd)
from rare_rows cimport (_rms_rstd_rescaled, _ln_stats_trusted, _ln_forward_careful,
                        _ln_backward_careful, _overflowed)

rn_import_core()
cnp.import_array()


cpdef Py_ssize_t n_row_blocks(Py_ssize_t n_rows) noexcept:
    """Number of row blocks backward uses for N rows (depends on N only; common.row_blocks)."""
    return row_blocks(n_rows)


# --------------------------------------------------------------------------- RMSNorm

def rms_norm_forward(element[:, ::1] out, double[::1] rstd, const element[:, ::1] x,
                     const element[::1] weight, double eps, int n_threads, bint stream=False):
    """y := x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps), per row.

    Backward (rms_norm_backward): dx = rstd*(g - x*rstd^2*mean(g*x)), g = dy*w;
    dw = sum_rows dy*x*rstd.   NumPy reference: resnorm.reference.rms_norm_forward.

    out (N, D) may be x itself (in place); rstd (N,) float64 receives the row statistic.
    weight may be None (w = 1).  stream: write out with non-temporal stores.
    """
    cdef const element *w = opt_ptr(weight)
    if x.shape[0] > 0:
        with nogil:
            _rms_forward(&out[0, 0], &rstd[0], &x[0, 0], w, x.shape[0], x.shape[1], eps,
                         n_threads, stream)


cdef void _rms_forward(element *out, double *rstd, const element *x, const element *w,
                       Py_ssize_t n, Py_ssize_t d, double eps, int n_threads,
                       bint stream) noexcept nogil:
    """rms_norm_forward over n rows of d (row pointers: x + i*d); one thread runs a plain
    loop, so a small call starts no parallel region at all."""
    cdef Py_ssize_t i
    if n_threads == 1:
        for i in range(n):
            _rms_forward_row(out + i * d, &rstd[i], x + i * d, w, d, eps, stream)
    else:
        for i in prange(n, schedule="static", num_threads=n_threads):
            _rms_forward_row(out + i * d, &rstd[i], x + i * d, w, d, eps, stream)


cdef inline void _rms_forward_row(element *y, double *rstd, const element *x,
                                  const element *w, Py_ssize_t d, double eps,
                                  bint stream) noexcept nogil:
    # one reduction: the sum of squares, accumulated in double
    cdef double sumsq = rn_sumsq(x, d)
    if element is double and not isfinite(sumsq):
        # |x| beyond ~1e154 squares past the double range (float32 rows cannot)
        rstd[0] = _rms_rstd_rescaled(x, d, eps)
    else:
        rstd[0] = 1.0 / sqrt(sumsq / d + eps)
    rn_rms_apply(y, x, w, rstd[0], d, stream)


def rms_norm_backward(element[:, ::1] dx, element[::1] dweight, const element[:, ::1] dy,
                      const element[:, ::1] x, const element[::1] weight,
                      const double[::1] rstd, int n_threads, bint stream=False):
    """dx := rstd * (g - xn * mean(g*xn)),  g = dy*w,  xn = x*rstd;   dw := sum_rows dy * xn.

    (The same as rstd * (g - x * rstd^2 * mean(g*x)), written with the normalised xn so no
    product can overflow where the result would not.)

    Forward: y = x*rstd*w.  NumPy reference: resnorm.reference.rms_norm_backward.
    dweight (D,) may be None (no weight, or its gradient not wanted); weight None means w = 1.
    dx may be dy itself.
    """
    cdef Py_ssize_t n = x.shape[0], d = x.shape[1]
    cdef Py_ssize_t nb = n_row_blocks(n), b, i, r, g
    cdef const element *w = opt_ptr(weight)
    cdef double[::1] m = np.empty(n)        # each row's reduction, mean(g * xn)
    cdef bint has_dw = dweight is not None
    buffer, (dw_array,) = lend_partials(nb, d, has_dw)
    cdef double[:, ::1] dw_part = dw_array
    cdef double *part
    with nogil:
        for b in prange(nb, schedule="static", num_threads=n_threads):
            part = NULL
            if has_dw:
                part = &dw_part[b, 0]
                memset(part, 0, d * sizeof(double))
            # groups of up to RN_GROUP rows: first each row's reduction, then one
            # elementwise pass over the group that writes dx and adds the group's terms to
            # this block's dw partial (rowops.h, "backward, several rows")
            i = b * n // nb
            while i < (b + 1) * n // nb:
                g = min(<Py_ssize_t>RN_GROUP, (b + 1) * n // nb - i)
                for r in range(i, i + g):
                    m[r] = rn_rms_bwd_dot(&dy[r, 0], &x[r, 0], w, rstd[r], d) / d
                rn_rms_bwd_apply_rows(&dx[i, 0], part, &dy[i, 0], &x[i, 0], w, &rstd[i], &m[i],
                                       <int>g, d, stream)
                i = i + g
    if has_dw:
        sum_partials(dweight, dw_part, n_threads)
    give_back(buffer)


# --------------------------------------------------------------------------- LayerNorm

def layer_norm_forward(element[:, ::1] out, double[::1] mean, double[::1] rstd,
                       const element[:, ::1] x, const element[::1] weight,
                       const element[::1] bias, double eps, int n_threads, bint stream=False):
    """y := (x - mean) * rstd * w + b,  mean = mean(x),  rstd = 1/sqrt(mean((x-mean)^2) + eps).

    Backward (layer_norm_backward): xhat = (x-mean)*rstd, g = dy*w,
    dx = rstd*(g - mean(g) - xhat*mean(g*xhat)); dw = sum_rows dy*xhat; db = sum_rows dy.
    NumPy reference: resnorm.reference.layer_norm_forward.

    Two-pass statistics in double: the variance is the mean of squared deviations, never
    E[x^2] - E[x]^2, so a large mean (1e4 + N(0,1) in float32) costs no precision.
    weight and bias may be None, independently.  out may be x itself.
    """
    cdef const element *w = opt_ptr(weight)
    cdef const element *b = opt_ptr(bias)
    if x.shape[0] > 0:
        with nogil:
            _layer_forward(&out[0, 0], &mean[0], &rstd[0], &x[0, 0], w, b, x.shape[0],
                           x.shape[1], eps, n_threads, stream)


cdef void _layer_forward(element *out, double *mean, double *rstd, const element *x,
                         const element *w, const element *b, Py_ssize_t n, Py_ssize_t d,
                         double eps, int n_threads, bint stream) noexcept nogil:
    """layer_norm_forward over n rows of d; one thread runs a plain loop."""
    cdef Py_ssize_t i
    if n_threads == 1:
        for i in range(n):
            _layer_forward_row(out + i * d, &mean[i], &rstd[i], x + i * d, w, b, d, eps, stream)
    else:
        for i in prange(n, schedule="static", num_threads=n_threads):
            _layer_forward_row(out + i * d, &mean[i], &rstd[i], x + i * d, w, b, d, eps, stream)


cdef inline void _layer_forward_row(element *y, double *mean, double *rstd, const element *x,
                                    const element *w, const element *b, Py_ssize_t d,
                                    double eps, bint stream) noexcept nogil:
    # two reductions: the mean, then the mean squared deviation from it
    mean[0] = rn_sum(x, d) / d
    cdef double var = rn_sumsqdev(x, d, mean[0]) / d
    if _ln_stats_trusted(x, mean[0], var, d):
        rstd[0] = 1.0 / sqrt(var + eps)
        rn_ln_apply(y, x, w, b, mean[0], rstd[0], d, stream)
    else:
        _ln_forward_careful(y, mean, rstd, x, w, b, var, eps, d, stream)


def layer_norm_backward(element[:, ::1] dx, element[::1] dweight, element[::1] dbias,
                        const element[:, ::1] dy, const element[:, ::1] x,
                        const element[::1] weight, const double[::1] mean,
                        const double[::1] rstd, int n_threads, bint stream=False):
    """dx := rstd * (g - mean(g) - xhat * mean(g*xhat)),  g = dy*w,  xhat = (x - mean)*rstd;
    dw := sum_rows dy * xhat;  db := sum_rows dy.

    Forward: y = xhat*w + b.  NumPy reference: resnorm.reference.layer_norm_backward.
    dweight / dbias may be None (gradient not wanted); weight None means w = 1.
    dx may be dy itself.
    """
    cdef Py_ssize_t n = x.shape[0], d = x.shape[1]
    cdef Py_ssize_t nb = n_row_blocks(n), b, i, r, g
    cdef const element *w = opt_ptr(weight)
    cdef double[::1] mg = np.empty(n)       # each row's mean(g)
    cdef double[::1] mgx = np.empty(n)      # each row's mean(g * xhat)
    cdef bint has_dw = dweight is not None, has_db = dbias is not None, trusted
    buffer, (dw_array, db_array) = lend_partials(nb, d, has_dw, has_db)
    cdef double[:, ::1] dw_part = dw_array
    cdef double[:, ::1] db_part = db_array
    cdef double *wpart
    cdef double *bpart
    with nogil:
        for b in prange(nb, schedule="static", num_threads=n_threads):
            wpart = NULL
            bpart = NULL
            if has_dw:
                wpart = &dw_part[b, 0]
                memset(wpart, 0, d * sizeof(double))
            if has_db:
                bpart = &db_part[b, 0]
                memset(bpart, 0, d * sizeof(double))
            # groups of up to RN_GROUP rows, as in rms_norm_backward
            i = b * n // nb
            while i < (b + 1) * n // nb:
                g = min(<Py_ssize_t>RN_GROUP, (b + 1) * n // nb - i)
                trusted = True
                for r in range(i, i + g):
                    # two reductions in one pass: sum(g) and sum(g * xhat)
                    rn_ln_bwd_sums(&mg[r], &mgx[r], &dy[r, 0], &x[r, 0], w, mean[r], rstd[r], d)
                    mg[r] = mg[r] / d
                    mgx[r] = mgx[r] / d
                    trusted = trusted and not _overflowed(mg[r], mgx[r], &dy[r, 0], &x[r, 0], d)
                if trusted:
                    rn_ln_bwd_apply_rows(&dx[i, 0], wpart, bpart, &dy[i, 0], &x[i, 0], w,
                                          &mean[i], &rstd[i], &mg[i], &mgx[i], <int>g, d, stream)
                else:
                    for r in range(i, i + g):
                        if _overflowed(mg[r], mgx[r], &dy[r, 0], &x[r, 0], d):
                            _ln_backward_careful(&dx[r, 0], wpart, bpart, &dy[r, 0], &x[r, 0],
                                                 w, mean[r], rstd[r], d)
                        else:
                            rn_ln_bwd_apply_rows(&dx[r, 0], wpart, bpart, &dy[r, 0], &x[r, 0],
                                                  w, &mean[r], &rstd[r], &mg[r], &mgx[r], 1, d,
                                                  stream)
                i = i + g
    if has_dw:
        sum_partials(dweight, dw_part, n_threads)
    if has_db:
        sum_partials(dbias, db_part, n_threads)
    give_back(buffer)


# --------------------------------------------------------------------------- fast paths
#
# The inference forms resnorm.rms_norm / layer_norm first offer their arguments here.  When
# every argument is already in its final form, the kernel runs at once; otherwise these
# return None and the caller runs the full checks of resnorm._checks, which raise the
# errors or make the copies.  They never raise for bad input, and accept strictly less
# than the checked path: a (1, 4096) call then costs about a microsecond of Python.

cdef inline bint _ready(object a, int typenum) noexcept:
    """a is exactly an ndarray (not a subclass: masked arrays take the checked path) of
    this type in native byte order, C-contiguous and aligned."""
    if type(a) is not cnp.ndarray:
        return False
    return (cnp.PyArray_TYPE(<cnp.ndarray>a) == typenum
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a)
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a)
            and cnp.PyArray_ISALIGNED(<cnp.ndarray>a))


cdef inline bint _ready_param(object p, int typenum, Py_ssize_t d) noexcept:
    """p is None or a ready (d,) vector."""
    return p is None or (_ready(p, typenum) and cnp.PyArray_NDIM(<cnp.ndarray>p) == 1
                         and cnp.PyArray_DIM(<cnp.ndarray>p, 0) == d)


cdef inline bint _disjoint(object a, object b) noexcept:
    """Two contiguous arrays (or None) whose memory does not overlap."""
    if a is None or b is None:
        return True
    cdef char *pa = <char *>cnp.PyArray_DATA(<cnp.ndarray>a)
    cdef char *pb = <char *>cnp.PyArray_DATA(<cnp.ndarray>b)
    return (pa + cnp.PyArray_NBYTES(<cnp.ndarray>a) <= pb
            or pb + cnp.PyArray_NBYTES(<cnp.ndarray>b) <= pa)


cdef object _ready_out(object x, object out, object weight, object bias, int typenum):
    """The output array when x, out, weight and bias fit the fast path, else None: out None
    (a new array), x itself (in place), or a ready array of x's shape that overlaps
    nothing it reads."""
    cdef int k, ndim = cnp.PyArray_NDIM(<cnp.ndarray>x)
    if out is None:
        return np.empty_like(x)
    if not _ready(out, typenum) or not cnp.PyArray_ISWRITEABLE(<cnp.ndarray>out):
        return None
    if cnp.PyArray_NDIM(<cnp.ndarray>out) != ndim:
        return None
    for k in range(ndim):
        if cnp.PyArray_DIM(<cnp.ndarray>out, k) != cnp.PyArray_DIM(<cnp.ndarray>x, k):
            return None
    if cnp.PyArray_DATA(<cnp.ndarray>out) != cnp.PyArray_DATA(<cnp.ndarray>x) \
            and not _disjoint(out, x):
        return None
    if not (_disjoint(out, weight) and _disjoint(out, bias)):
        return None
    return out


cdef bint _ready_scalars(object eps, object n_threads, int typenum, int max_threads) noexcept:
    """eps a Python float, finite and >= the dtype's smallest normal; n_threads None or an
    int in [1, max_threads]."""
    if type(eps) is not float:
        return False
    cdef double e = <double>eps
    if not (isfinite(e) and e >= (FLT_MIN if typenum == cnp.NPY_FLOAT else DBL_MIN)):
        return False
    if n_threads is None:
        return True
    # compared as Python ints: a C cast would overflow on 2**70
    return type(n_threads) is int and 1 <= n_threads <= max_threads


cdef int _x_type(object x) noexcept:
    """NPY_FLOAT or NPY_DOUBLE when x is a ready, non-empty array with at least one axis,
    else -1."""
    if _ready(x, cnp.NPY_FLOAT):
        typenum = cnp.NPY_FLOAT
    elif _ready(x, cnp.NPY_DOUBLE):
        typenum = cnp.NPY_DOUBLE
    else:
        return -1
    if cnp.PyArray_NDIM(<cnp.ndarray>x) == 0 or cnp.PyArray_SIZE(<cnp.ndarray>x) == 0:
        return -1
    return typenum


cdef (int, bint) _launch(Py_ssize_t size, Py_ssize_t nbytes, object n_threads, tuple limits):
    """(threads, stream) as resnorm._parallel decides them; limits = (parallel_min_elements,
    stream_min_bytes, max_threads)."""
    cdef int nt
    if size < <Py_ssize_t>limits[0]:
        nt = 1
    elif n_threads is None:
        nt = omp_get_max_threads()
    else:
        nt = <int>n_threads
    return nt, nbytes >= <Py_ssize_t>limits[1]


def rms_norm_ready(x, weight, eps, out, n_threads, tuple limits):
    """resnorm.rms_norm when every argument is already final (see the section comment),
    else None."""
    cdef int typenum = _x_type(x)
    if typenum < 0:
        return None
    cdef Py_ssize_t d = cnp.PyArray_DIM(<cnp.ndarray>x, cnp.PyArray_NDIM(<cnp.ndarray>x) - 1)
    if not (_ready_param(weight, typenum, d)
            and _ready_scalars(eps, n_threads, typenum, <int>limits[2])):
        return None
    y = _ready_out(x, out, weight, None, typenum)
    if y is None:
        return None
    cdef Py_ssize_t n = cnp.PyArray_SIZE(<cnp.ndarray>x) // d
    cdef int nt
    cdef bint stream
    nt, stream = _launch(n * d, cnp.PyArray_NBYTES(<cnp.ndarray>y), n_threads, limits)
    cdef double *rstd = <double *>PyMem_RawMalloc(n * sizeof(double))
    if rstd == NULL:
        return None
    cdef void *w = NULL if weight is None else cnp.PyArray_DATA(<cnp.ndarray>weight)
    cdef void *px = cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void *py = cnp.PyArray_DATA(<cnp.ndarray>y)
    cdef double e = <double>eps
    with nogil:
        if typenum == cnp.NPY_FLOAT:
            _rms_forward(<float *>py, rstd, <const float *>px, <const float *>w, n, d, e, nt,
                         stream)
        else:
            _rms_forward(<double *>py, rstd, <const double *>px, <const double *>w, n, d, e,
                         nt, stream)
    PyMem_RawFree(rstd)
    return y


def layer_norm_ready(x, weight, bias, eps, out, n_threads, tuple limits):
    """resnorm.layer_norm when every argument is already final, else None."""
    cdef int typenum = _x_type(x)
    if typenum < 0:
        return None
    cdef Py_ssize_t d = cnp.PyArray_DIM(<cnp.ndarray>x, cnp.PyArray_NDIM(<cnp.ndarray>x) - 1)
    if not (_ready_param(weight, typenum, d) and _ready_param(bias, typenum, d)
            and _ready_scalars(eps, n_threads, typenum, <int>limits[2])):
        return None
    y = _ready_out(x, out, weight, bias, typenum)
    if y is None:
        return None
    cdef Py_ssize_t n = cnp.PyArray_SIZE(<cnp.ndarray>x) // d
    cdef int nt
    cdef bint stream
    nt, stream = _launch(n * d, cnp.PyArray_NBYTES(<cnp.ndarray>y), n_threads, limits)
    cdef double *stats = <double *>PyMem_RawMalloc(2 * n * sizeof(double))
    if stats == NULL:
        return None
    cdef void *w = NULL if weight is None else cnp.PyArray_DATA(<cnp.ndarray>weight)
    cdef void *b = NULL if bias is None else cnp.PyArray_DATA(<cnp.ndarray>bias)
    cdef void *px = cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void *py = cnp.PyArray_DATA(<cnp.ndarray>y)
    cdef double e = <double>eps
    with nogil:
        if typenum == cnp.NPY_FLOAT:
            _layer_forward(<float *>py, stats, stats + n, <const float *>px, <const float *>w,
                           <const float *>b, n, d, e, nt, stream)
        else:
            _layer_forward(<double *>py, stats, stats + n, <const double *>px,
                           <const double *>w, <const double *>b, n, d, e, nt, stream)
    PyMem_RawFree(stats)
    return y
