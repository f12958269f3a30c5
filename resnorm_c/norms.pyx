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

from cython.parallel cimport prange
from libc.math cimport isfinite, sqrt
from libc.string cimport memset

from common cimport (floating, rn_cpu_init, row_sum, row_sumsq, row_sumsqdev, row_rms_bwd_dot,
                     row_ln_bwd_sums, row_rms_apply, row_ln_apply, row_rms_bwd_apply_rows,
                     row_ln_bwd_apply_rows, row_blocks, sum_partials, opt_ptr, RN_GROUP)
# the scalar paths for the few rows the fast paths cannot take (see rare_rows.pxd)
from rare_rows cimport (_rms_rstd_rescaled, _ln_stats_trusted, _ln_forward_careful,
                        _ln_backward_careful, _overflowed)

rn_cpu_init()


cpdef Py_ssize_t n_row_blocks(Py_ssize_t n_rows) noexcept:
    """Number of row blocks backward uses for N rows (depends on N only; common.row_blocks)."""
    return row_blocks(n_rows)


# --------------------------------------------------------------------------- RMSNorm

def rms_norm_forward(floating[:, ::1] out, double[::1] rstd, const floating[:, ::1] x,
                     const floating[::1] weight, double eps, int n_threads, bint stream=False):
    """y := x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps), per row.

    Backward (rms_norm_backward): dx = rstd*(g - x*rstd^2*mean(g*x)), g = dy*w;
    dw = sum_rows dy*x*rstd.   NumPy reference: resnorm.reference.rms_norm_forward.

    out (N, D) may be x itself (in place); rstd (N,) float64 receives the row statistic.
    weight may be None (w = 1).  stream: write out with non-temporal stores.
    """
    cdef Py_ssize_t i, n = x.shape[0], d = x.shape[1]
    cdef const floating *w = opt_ptr(weight)
    cdef double sumsq
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            # one reduction: the sum of squares, accumulated in double
            sumsq = row_sumsq(&x[i, 0], d)
            if floating is double and not isfinite(sumsq):
                # |x| beyond ~1e154 squares past the double range (float32 rows cannot)
                rstd[i] = _rms_rstd_rescaled(&x[i, 0], d, eps)
            else:
                rstd[i] = 1.0 / sqrt(sumsq / d + eps)
            row_rms_apply(&out[i, 0], &x[i, 0], w, rstd[i], d, stream)


def rms_norm_backward(floating[:, ::1] dx, floating[::1] dweight, const floating[:, ::1] dy,
                      const floating[:, ::1] x, const floating[::1] weight,
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
    cdef const floating *w = opt_ptr(weight)
    cdef double[::1] m = np.empty(n)        # each row's reduction, mean(g * xn)
    cdef bint has_dw = dweight is not None
    cdef double[:, ::1] dw_part = np.empty((nb, d if has_dw else 0))
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
                    m[r] = row_rms_bwd_dot(&dy[r, 0], &x[r, 0], w, rstd[r], d) / d
                row_rms_bwd_apply_rows(&dx[i, 0], part, &dy[i, 0], &x[i, 0], w, &rstd[i], &m[i],
                                       <int>g, d, stream)
                i = i + g
    if has_dw:
        sum_partials(dweight, dw_part, n_threads)


# --------------------------------------------------------------------------- LayerNorm

def layer_norm_forward(floating[:, ::1] out, double[::1] mean, double[::1] rstd,
                       const floating[:, ::1] x, const floating[::1] weight,
                       const floating[::1] bias, double eps, int n_threads, bint stream=False):
    """y := (x - mean) * rstd * w + b,  mean = mean(x),  rstd = 1/sqrt(mean((x-mean)^2) + eps).

    Backward (layer_norm_backward): xhat = (x-mean)*rstd, g = dy*w,
    dx = rstd*(g - mean(g) - xhat*mean(g*xhat)); dw = sum_rows dy*xhat; db = sum_rows dy.
    NumPy reference: resnorm.reference.layer_norm_forward.

    Two-pass statistics in double: the variance is the mean of squared deviations, never
    E[x^2] - E[x]^2, so a large mean (1e4 + N(0,1) in float32) costs no precision.
    weight and bias may be None, independently.  out may be x itself.
    """
    cdef Py_ssize_t i, n = x.shape[0], d = x.shape[1]
    cdef const floating *w = opt_ptr(weight)
    cdef const floating *b = opt_ptr(bias)
    cdef double var
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            # two reductions: the mean, then the mean squared deviation from it
            mean[i] = row_sum(&x[i, 0], d) / d
            var = row_sumsqdev(&x[i, 0], d, mean[i]) / d
            if _ln_stats_trusted(&x[i, 0], mean[i], var, d):
                rstd[i] = 1.0 / sqrt(var + eps)
                row_ln_apply(&out[i, 0], &x[i, 0], w, b, mean[i], rstd[i], d, stream)
            else:
                _ln_forward_careful(&out[i, 0], &mean[i], &rstd[i], &x[i, 0], w, b, var, eps,
                                    d, stream)


def layer_norm_backward(floating[:, ::1] dx, floating[::1] dweight, floating[::1] dbias,
                        const floating[:, ::1] dy, const floating[:, ::1] x,
                        const floating[::1] weight, const double[::1] mean,
                        const double[::1] rstd, int n_threads, bint stream=False):
    """dx := rstd * (g - mean(g) - xhat * mean(g*xhat)),  g = dy*w,  xhat = (x - mean)*rstd;
    dw := sum_rows dy * xhat;  db := sum_rows dy.

    Forward: y = xhat*w + b.  NumPy reference: resnorm.reference.layer_norm_backward.
    dweight / dbias may be None (gradient not wanted); weight None means w = 1.
    dx may be dy itself.
    """
    cdef Py_ssize_t n = x.shape[0], d = x.shape[1]
    cdef Py_ssize_t nb = n_row_blocks(n), b, i, r, g
    cdef const floating *w = opt_ptr(weight)
    cdef double[::1] mg = np.empty(n)       # each row's mean(g)
    cdef double[::1] mgx = np.empty(n)      # each row's mean(g * xhat)
    cdef bint has_dw = dweight is not None, has_db = dbias is not None, trusted
    cdef double[:, ::1] dw_part = np.empty((nb, d if has_dw else 0))
    cdef double[:, ::1] db_part = np.empty((nb, d if has_db else 0))
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
                    row_ln_bwd_sums(&mg[r], &mgx[r], &dy[r, 0], &x[r, 0], w, mean[r], rstd[r], d)
                    mg[r] = mg[r] / d
                    mgx[r] = mgx[r] / d
                    trusted = trusted and not _overflowed(mg[r], mgx[r], &dy[r, 0], &x[r, 0], d)
                if trusted:
                    row_ln_bwd_apply_rows(&dx[i, 0], wpart, bpart, &dy[i, 0], &x[i, 0], w,
                                          &mean[i], &rstd[i], &mg[i], &mgx[i], <int>g, d, stream)
                else:
                    for r in range(i, i + g):
                        if _overflowed(mg[r], mgx[r], &dy[r, 0], &x[r, 0], d):
                            _ln_backward_careful(&dx[r, 0], wpart, bpart, &dy[r, 0], &x[r, 0],
                                                 w, mean[r], rstd[r], d)
                        else:
                            row_ln_bwd_apply_rows(&dx[r, 0], wpart, bpart, &dy[r, 0], &x[r, 0],
                                                  w, &mean[r], &rstd[r], &mg[r], &mgx[r], 1, d,
                                                  stream)
                i = i + g
    if has_dw:
        sum_partials(dweight, dw_part, n_threads)
    if has_db:
        sum_partials(dbias, db_part, n_threads)
