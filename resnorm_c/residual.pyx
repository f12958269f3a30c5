"""Residual-connection kernels over the rows of (N, D) arrays: inverted dropout, fused
add + RMSNorm / LayerNorm (Pre-Norm and Post-Norm), scaled and gated residuals, forward
and backward.

Outputs come first, then inputs, then sizes.  The kernels do not validate (resnorm.residual
and resnorm.dropout do that).  Besides the partial-sum rows of backward they allocate a few
scratch rows per thread: a row is assembled there (h = residual + alpha*dropout(x), or the
gradient reaching h), reduced and applied while it sits in L1/L2, and written to memory
once.  So the fused Pre-Norm forward moves four streams (read x and residual, write h and
y), each once.

Dropout multipliers come from Philox-4x32-10 (resnorm_c/philox.h) as a function of
(seed, flat element index): regenerated in backward, never stored, and identical for any
thread count.  The forward kernels generate them slice by slice just before use, inside a
loop that also reads and writes memory (see add_rms_norm_forward); backward generates the
next row's multipliers during the current row's write pass.  Either way the Philox
arithmetic runs while memory traffic is in flight, not in a phase of its own.

Reductions over rows (dweight, dbias, dalpha) go through fixed row blocks
(common.row_blocks) and float64 partial rows added in block order: bitwise reproducible.
Every other result is computed row by row, so no result depends on the thread count.
"""
import numpy as np

from cython.parallel cimport prange, threadid
from libc.math cimport sqrt
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memset

from common cimport (floating, rn_cpu_init, opt_ptr, row_blocks, sum_partials, row_sumsqdev,
                     row_rms_apply_copy, row_ln_apply_copy, row_rms_bwd_dot, row_rms_bwd_apply,
                     row_ln_bwd_sums, row_ln_bwd_apply, row_dropout_mult, row_residual_add,
                     row_residual_add_lanes, row_residual_bwd, row_sigmoid, span_uniforms,
                     span_keep)

rn_cpu_init()

cdef enum:
    DROPOUT_CHUNK = 8192  # elements per task of the flat dropout kernels
    SEGMENT = 512         # elements per slice of a write pass (see the module docstring)


cdef struct rn_dropout:
    # on = 0: no dropout.  Else element k is kept when its Philox uniform is >= threshold,
    # and kept values are multiplied by scale = 1/(1-p).  (From a dict, in Python.)
    bint on
    uint64_t seed
    uint32_t threshold
    double scale


cdef inline const rn_dropout *active(const rn_dropout *dp) noexcept nogil:
    """dp when it drops anything, else NULL."""
    return dp if dp.on else NULL


cdef inline void multipliers(floating *m, const rn_dropout *dp, uint64_t start,
                             Py_ssize_t n) noexcept nogil:
    """m[k] := the dropout multiplier of flat element start + k, k < n."""
    row_dropout_mult(m, dp.seed, start, n, dp.threshold, dp.scale)


cdef inline const floating *at(const floating *p, Py_ssize_t k) noexcept nogil:
    """p + k for an optional row (NULL stays NULL)."""
    if p == NULL:
        return NULL
    return p + k


cdef object thread_rows(object dtype, Py_ssize_t itemsize, int n_threads, Py_ssize_t width):
    """Scratch: one row of `width` elements per thread, padded to whole cache lines."""
    cdef Py_ssize_t per_line = 64 // itemsize
    return np.empty((max(1, n_threads), (width + per_line - 1) // per_line * per_line), dtype)


# --------------------------------------------------------------------------- dropout

def dropout_forward(floating[::1] out, const floating[::1] x, rn_dropout dropout, int n_threads,
                    bint stream=False):
    """y := x * m,  m_k = scale if uniform(seed, k) >= threshold else 0  (flat index k).

    Backward is the same call on dy (dx = dy * m, the mask regenerated from the seed).
    NumPy reference: resnorm.reference.dropout_forward.  out may be x itself.
    """
    cdef Py_ssize_t n = x.shape[0], n_chunks = (n + DROPOUT_CHUNK - 1) // DROPOUT_CHUNK
    cdef Py_ssize_t c, k, end, length
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, sizeof(floating), n_threads, SEGMENT)
    cdef floating *m
    with nogil:
        for c in prange(n_chunks, schedule="static", num_threads=n_threads):
            m = &scratch[threadid(), 0]
            end = min(n, (c + 1) * DROPOUT_CHUNK)
            k = c * DROPOUT_CHUNK
            while k < end:
                # slice by slice, so that Philox and memory traffic interleave finely
                length = min(<Py_ssize_t>SEGMENT, end - k)
                multipliers(m, &dropout, k, length)
                row_residual_add(&out[k], NULL, &x[k], NULL, m, length, stream)
                k = k + length


def dropout_mask(uint8_t[::1] keep, rn_dropout dropout, int n_threads):
    """keep[k] := uniform(seed, k) >= threshold: the keep-mask dropout applies (bool bytes)."""
    cdef Py_ssize_t n = keep.shape[0], n_chunks = (n + DROPOUT_CHUNK - 1) // DROPOUT_CHUNK
    cdef Py_ssize_t c, k0
    with nogil:
        for c in prange(n_chunks, schedule="static", num_threads=n_threads):
            k0 = c * DROPOUT_CHUNK
            span_keep(&keep[k0], dropout.seed, k0, min(<Py_ssize_t>DROPOUT_CHUNK, n - k0),
                      dropout.threshold)


def philox_uniforms(uint32_t[::1] u, uint64_t seed, uint64_t start):
    """u[k] := the 32-bit Philox uniform of flat element start + k (for tests and teaching).
    NumPy reference: resnorm.reference.dropout_uniforms."""
    with nogil:
        span_uniforms(&u[0], seed, start, u.shape[0])


# --------------------------------------------------------------------------- fused add + norm

def add_rms_norm_forward(floating[:, ::1] y, floating[:, ::1] h, double[::1] rstd,
                         const floating[:, ::1] x, const floating[:, ::1] residual,
                         const floating[::1] weight, const floating[::1] alpha, double eps,
                         rn_dropout dropout, int n_threads, bint stream=False):
    """h := residual + alpha * dropout(x);  y := h * rstd * w,  rstd = 1/sqrt(mean(h^2) + eps).

    Pre-Norm when h is given (h is written: the new residual stream); Post-Norm when h is
    None (only y is written).  weight, alpha (D,) may be None (1).
    Backward: add_rms_norm_backward.  NumPy reference: resnorm.reference.add_rms_norm_forward.

    Each thread walks its rows as a two-stage pipeline, slice by slice: it reads row i (x
    and residual, into a cached row of h, reducing on the way) while it writes row i-1 (y,
    and h in Pre-Norm), whose statistic is known.  Reads and streamed writes then share
    every moment, instead of alternating row by row; so does the Philox arithmetic.
    """
    cdef Py_ssize_t n = x.shape[0], d = x.shape[1], t, i, k, lo, hi, length
    cdef int nt = max(1, n_threads)
    cdef const floating *w = opt_ptr(weight)
    cdef const floating *a = opt_ptr(alpha)
    cdef const rn_dropout *dp = active(&dropout)
    cdef bint pre = h is not None
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, sizeof(floating), nt, 2 * d + SEGMENT)
    cdef double[:, ::1] lane_rows = thread_rows(np.float64, 8, nt, 32)
    cdef floating *h_in
    cdef floating *h_out
    cdef floating *swap
    cdef floating *m
    cdef double *lanes
    cdef double ss
    with nogil:
        for t in prange(nt, schedule="static", num_threads=nt):
            # h_in: the row being read; h_out: the row being written; m: multipliers of a slice
            h_in = &scratch[t, 0]
            h_out = h_in + d
            m = h_in + 2 * d
            lanes = &lane_rows[t, 0]
            lo = t * n // nt
            hi = (t + 1) * n // nt
            for i in range(lo, hi + 1):
                memset(lanes, 0, 32 * sizeof(double))
                k = 0
                while k < d:
                    length = min(<Py_ssize_t>SEGMENT, d - k)
                    if i < hi:
                        if dp != NULL:
                            multipliers(m, dp, i * d + k, length)
                        ss = row_residual_add_lanes(lanes, h_in + k, &residual[i, k], &x[i, k],
                                                    at(a, k), m if dp != NULL else NULL,
                                                    length, d, True)
                    if i > lo:
                        row_rms_apply_copy(&y[i - 1, k], &h[i - 1, k] if pre else NULL,
                                           h_out + k, at(w, k), rstd[i - 1], length, stream)
                    k = k + length
                if i < hi:
                    rstd[i] = 1.0 / sqrt(ss / d + eps)
                swap = h_in
                h_in = h_out
                h_out = swap


def add_layer_norm_forward(floating[:, ::1] y, floating[:, ::1] h, double[::1] mean,
                           double[::1] rstd, const floating[:, ::1] x,
                           const floating[:, ::1] residual, const floating[::1] weight,
                           const floating[::1] bias, const floating[::1] alpha, double eps,
                           rn_dropout dropout, int n_threads, bint stream=False):
    """h := residual + alpha * dropout(x);  y := (h - mean) * rstd * w + b (two-pass stats).

    Pre-Norm when h is given, Post-Norm when h is None.  weight, bias, alpha may be None.
    The same pipeline as add_rms_norm_forward; the variance pass runs on the cached row.
    Backward: add_layer_norm_backward.  NumPy reference: resnorm.reference.add_layer_norm_forward.
    """
    cdef Py_ssize_t n = x.shape[0], d = x.shape[1], t, i, k, lo, hi, length
    cdef int nt = max(1, n_threads)
    cdef const floating *w = opt_ptr(weight)
    cdef const floating *b = opt_ptr(bias)
    cdef const floating *a = opt_ptr(alpha)
    cdef const rn_dropout *dp = active(&dropout)
    cdef bint pre = h is not None
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, sizeof(floating), nt, 2 * d + SEGMENT)
    cdef double[:, ::1] lane_rows = thread_rows(np.float64, 8, nt, 32)
    cdef floating *h_in
    cdef floating *h_out
    cdef floating *swap
    cdef floating *m
    cdef double *lanes
    cdef double total
    with nogil:
        for t in prange(nt, schedule="static", num_threads=nt):
            h_in = &scratch[t, 0]
            h_out = h_in + d
            m = h_in + 2 * d
            lanes = &lane_rows[t, 0]
            lo = t * n // nt
            hi = (t + 1) * n // nt
            for i in range(lo, hi + 1):
                memset(lanes, 0, 32 * sizeof(double))
                k = 0
                while k < d:
                    length = min(<Py_ssize_t>SEGMENT, d - k)
                    if i < hi:
                        if dp != NULL:
                            multipliers(m, dp, i * d + k, length)
                        total = row_residual_add_lanes(lanes, h_in + k, &residual[i, k],
                                                       &x[i, k], at(a, k),
                                                       m if dp != NULL else NULL, length, d,
                                                       False)
                    if i > lo:
                        row_ln_apply_copy(&y[i - 1, k], &h[i - 1, k] if pre else NULL,
                                          h_out + k, at(w, k), at(b, k), mean[i - 1],
                                          rstd[i - 1], length, stream)
                    k = k + length
                if i < hi:
                    # the second LayerNorm reduction, on the cached row
                    mean[i] = total / d
                    rstd[i] = 1.0 / sqrt(row_sumsqdev(h_in, d, mean[i]) / d + eps)
                swap = h_in
                h_in = h_out
                h_out = swap


cdef inline void through_add(floating *dx, floating *dresidual, double *apart,
                             const floating *gh, const floating *dh, const floating *x,
                             const floating *a, const floating *m, floating *m_next,
                             const rn_dropout *dp, uint64_t next_start, Py_ssize_t d,
                             bint stream) noexcept nogil:
    """Backward of one row of h = residual + a*(x*m), given the gradient gh reaching h from
    the norm (+ dh along the stream): dresidual, dx and the dalpha partial, slice by slice;
    between slices the next row's multipliers go into m_next (when it is not NULL)."""
    cdef Py_ssize_t k = 0, length
    while k < d:
        length = min(<Py_ssize_t>SEGMENT, d - k)
        row_residual_bwd(dx + k, dresidual + k, apart + k if apart != NULL else NULL, gh + k,
                         at(dh, k), at(x, k), at(a, k), at(m, k), length, stream)
        if m_next != NULL:
            multipliers(m_next + k, dp, next_start + k, length)
        k += length


def add_rms_norm_backward(floating[:, ::1] dx, floating[:, ::1] dresidual,
                          floating[::1] dweight, double[::1] dalpha,
                          const floating[:, ::1] dy, const floating[:, ::1] dh,
                          const floating[:, ::1] h, const floating[:, ::1] x,
                          const floating[:, ::1] residual, const floating[::1] weight,
                          const floating[::1] alpha, const double[::1] rstd, rn_dropout dropout,
                          int n_threads, bint stream=False):
    """gh := dh + rstd * (g - hn * mean(g*hn)),  g = dy*w,  hn = h*rstd   (gradient reaching h)
    dresidual := gh;  dx := gh * alpha * m;  dweight := sum_rows dy*hn;
    dalpha (float64, per channel) := sum_rows gh * (x*m).

    Pre-Norm: h is the cached forward output.  Post-Norm: h is None and each row of h is
    recomputed from x and residual (dh must then be None).  dh may be None (0); dweight,
    dalpha None: not wanted (x may then be None in Pre-Norm).
    NumPy reference: resnorm.reference.add_rms_norm_backward.
    """
    cdef Py_ssize_t n = dy.shape[0], d = dy.shape[1]
    cdef Py_ssize_t nb = row_blocks(n), blk, i, lo, hi
    cdef int nt = max(1, n_threads)
    cdef const floating *w = opt_ptr(weight)
    cdef const floating *a = opt_ptr(alpha)
    cdef const rn_dropout *dp = active(&dropout)
    cdef bint pre = h is not None, has_dh = dh is not None
    cdef bint has_dw = dweight is not None, has_da = dalpha is not None
    cdef double[:, ::1] dw_part = np.empty((nb, d if has_dw else 0))
    cdef double[:, ::1] da_part = np.empty((nb, d if has_da else 0))
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, sizeof(floating), nt, 3 * d)
    cdef floating *gs
    cdef floating *mc
    cdef floating *mn
    cdef floating *swap
    cdef const floating *hp
    cdef double *wpart
    cdef double *apart
    cdef double m
    with nogil:
        for blk in prange(nb, schedule="static", num_threads=nt):
            # gs: the gradient reaching this row of h (in Post-Norm first h itself);
            # mc, mn: the dropout multipliers of this row and of the next
            gs = &scratch[threadid(), 0]
            mc = gs + d
            mn = gs + 2 * d
            wpart = NULL
            apart = NULL
            if has_dw:
                wpart = &dw_part[blk, 0]
                memset(wpart, 0, d * sizeof(double))
            if has_da:
                apart = &da_part[blk, 0]
                memset(apart, 0, d * sizeof(double))
            lo = blk * n // nb
            hi = (blk + 1) * n // nb
            if dp != NULL and lo < hi:
                multipliers(mc, dp, lo * d, d)
            for i in range(lo, hi):
                if pre:
                    hp = &h[i, 0]
                else:
                    row_residual_add(gs, &residual[i, 0], &x[i, 0], a,
                                     mc if dp != NULL else NULL, d, False)
                    hp = gs
                # the norm backward (one reduction) leaves the gradient reaching h in gs
                m = row_rms_bwd_dot(&dy[i, 0], hp, w, rstd[i], d) / d
                row_rms_bwd_apply(gs, wpart, &dy[i, 0], hp, w, rstd[i], m, d, False)
                through_add(&dx[i, 0], &dresidual[i, 0], apart, gs, &dh[i, 0] if has_dh else NULL,
                            &x[i, 0] if has_da else NULL, a, mc if dp != NULL else NULL,
                            mn if dp != NULL and i + 1 < hi else NULL, dp, (i + 1) * d, d, stream)
                swap = mc
                mc = mn
                mn = swap
    if has_dw:
        sum_partials(dweight, dw_part, nt)
    if has_da:
        sum_partials(dalpha, da_part, nt)


def add_layer_norm_backward(floating[:, ::1] dx, floating[:, ::1] dresidual,
                            floating[::1] dweight, floating[::1] dbias, double[::1] dalpha,
                            const floating[:, ::1] dy, const floating[:, ::1] dh,
                            const floating[:, ::1] h, const floating[:, ::1] x,
                            const floating[:, ::1] residual, const floating[::1] weight,
                            const floating[::1] alpha, const double[::1] mean,
                            const double[::1] rstd, rn_dropout dropout, int n_threads,
                            bint stream=False):
    """gh := dh + rstd * (g - mean(g) - hhat * mean(g*hhat)),  g = dy*w,  hhat = (h-mean)*rstd
    dresidual := gh;  dx := gh * alpha * m;  dweight := sum_rows dy*hhat;  dbias := sum_rows dy;
    dalpha (float64, per channel) := sum_rows gh * (x*m).

    Pre-Norm / Post-Norm and the optional arguments as in add_rms_norm_backward.
    NumPy reference: resnorm.reference.add_layer_norm_backward.
    """
    cdef Py_ssize_t n = dy.shape[0], d = dy.shape[1]
    cdef Py_ssize_t nb = row_blocks(n), blk, i, lo, hi
    cdef int nt = max(1, n_threads)
    cdef const floating *w = opt_ptr(weight)
    cdef const floating *a = opt_ptr(alpha)
    cdef const rn_dropout *dp = active(&dropout)
    cdef bint pre = h is not None, has_dh = dh is not None
    cdef bint has_dw = dweight is not None, has_db = dbias is not None
    cdef bint has_da = dalpha is not None
    cdef double[:, ::1] dw_part = np.empty((nb, d if has_dw else 0))
    cdef double[:, ::1] db_part = np.empty((nb, d if has_db else 0))
    cdef double[:, ::1] da_part = np.empty((nb, d if has_da else 0))
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, sizeof(floating), nt, 3 * d)
    cdef floating *gs
    cdef floating *mc
    cdef floating *mn
    cdef floating *swap
    cdef const floating *hp
    cdef double *wpart
    cdef double *bpart
    cdef double *apart
    cdef double sum_g, sum_ghhat
    with nogil:
        for blk in prange(nb, schedule="static", num_threads=nt):
            gs = &scratch[threadid(), 0]
            mc = gs + d
            mn = gs + 2 * d
            wpart = NULL
            bpart = NULL
            apart = NULL
            if has_dw:
                wpart = &dw_part[blk, 0]
                memset(wpart, 0, d * sizeof(double))
            if has_db:
                bpart = &db_part[blk, 0]
                memset(bpart, 0, d * sizeof(double))
            if has_da:
                apart = &da_part[blk, 0]
                memset(apart, 0, d * sizeof(double))
            lo = blk * n // nb
            hi = (blk + 1) * n // nb
            if dp != NULL and lo < hi:
                multipliers(mc, dp, lo * d, d)
            for i in range(lo, hi):
                if pre:
                    hp = &h[i, 0]
                else:
                    row_residual_add(gs, &residual[i, 0], &x[i, 0], a,
                                     mc if dp != NULL else NULL, d, False)
                    hp = gs
                # two reductions in one pass; assigned here so that they are thread-private
                # (Cython shares a variable written only through a pointer)
                sum_g = 0.0
                sum_ghhat = 0.0
                row_ln_bwd_sums(&sum_g, &sum_ghhat, &dy[i, 0], hp, w, mean[i], rstd[i], d)
                row_ln_bwd_apply(gs, wpart, bpart, &dy[i, 0], hp, w, mean[i], rstd[i],
                                 sum_g / d, sum_ghhat / d, d, False)
                through_add(&dx[i, 0], &dresidual[i, 0], apart, gs, &dh[i, 0] if has_dh else NULL,
                            &x[i, 0] if has_da else NULL, a, mc if dp != NULL else NULL,
                            mn if dp != NULL and i + 1 < hi else NULL, dp, (i + 1) * d, d, stream)
                swap = mc
                mc = mn
                mn = swap
    if has_dw:
        sum_partials(dweight, dw_part, nt)
    if has_db:
        sum_partials(dbias, db_part, nt)
    if has_da:
        sum_partials(dalpha, da_part, nt)


# --------------------------------------------------------------------------- scaled residual

def scaled_residual_forward(floating[:, ::1] out, const floating[:, ::1] x,
                            const floating[:, ::1] branch, const floating[::1] alpha,
                            int n_threads, bint stream=False):
    """h := x + alpha * F  (alpha (D,), or None: 1).  The gated residual with a per-channel
    gate is this op with alpha = sigmoid(g).
    Backward: scaled_residual_backward.  NumPy reference: resnorm.reference.scaled_residual_forward.
    out may be x or F itself.
    """
    cdef Py_ssize_t i, n = x.shape[0], d = x.shape[1]
    cdef const floating *a = opt_ptr(alpha)
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            row_residual_add(&out[i, 0], &x[i, 0], &branch[i, 0], a, NULL, d, stream)


def scaled_residual_backward(floating[:, ::1] dx, floating[:, ::1] dbranch, double[::1] dalpha,
                             const floating[:, ::1] dh, const floating[:, ::1] branch,
                             const floating[::1] alpha, int n_threads, bint stream=False):
    """dx := dh;  dF := dh * alpha;  dalpha (float64, per channel) := sum_rows dh * F.

    dalpha None: not wanted (branch may then be None).
    NumPy reference: resnorm.reference.scaled_residual_backward.
    """
    cdef Py_ssize_t n = dh.shape[0], d = dh.shape[1]
    cdef Py_ssize_t nb = row_blocks(n), blk, i
    cdef const floating *a = opt_ptr(alpha)
    cdef bint has_da = dalpha is not None
    cdef double[:, ::1] da_part = np.empty((nb, d if has_da else 0))
    cdef double *apart
    cdef const floating *fp
    with nogil:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            apart = NULL
            if has_da:
                apart = &da_part[blk, 0]
                memset(apart, 0, d * sizeof(double))
            for i in range(blk * n // nb, (blk + 1) * n // nb):
                fp = &branch[i, 0] if has_da else NULL
                row_residual_bwd(&dbranch[i, 0], &dx[i, 0], apart, &dh[i, 0], NULL, fp, a,
                                 NULL, d, stream)
    if has_da:
        sum_partials(dalpha, da_part, n_threads)


# --------------------------------------------------------------------------- gated residual

def sigmoid(floating[:, ::1] s, floating[:, ::1] ds, const floating[:, ::1] g, int n_threads):
    """s := 1/(1 + exp(-g));  ds := s*(1-s), both computed in double (ds may be None)."""
    cdef Py_ssize_t i, n = g.shape[0], d = g.shape[1]
    cdef bint has_ds = ds is not None
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            row_sigmoid(&s[i, 0], &ds[i, 0] if has_ds else NULL, &g[i, 0], d)


def gated_residual_forward(floating[:, ::1] out, const floating[:, ::1] x,
                           const floating[:, ::1] branch, const floating[:, ::1] gate,
                           int n_threads, bint stream=False):
    """h := x + sigmoid(g) * F, g of F's shape (a per-channel g goes through
    scaled_residual_forward).  NumPy reference: resnorm.reference.gated_residual_forward."""
    cdef Py_ssize_t i, n = x.shape[0], d = x.shape[1]
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, sizeof(floating), n_threads, d)
    cdef floating *s
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            s = &scratch[threadid(), 0]
            row_sigmoid(s, NULL, &gate[i, 0], d)
            row_residual_add(&out[i, 0], &x[i, 0], &branch[i, 0], s, NULL, d, stream)


def gated_residual_backward(floating[:, ::1] dx, floating[:, ::1] dbranch,
                            floating[:, ::1] dgate, const floating[:, ::1] dh,
                            const floating[:, ::1] branch, const floating[:, ::1] gate,
                            int n_threads, bint stream=False):
    """dx := dh;  dF := dh * s;  dg := (dh * F) * s*(1-s),  s = sigmoid(g) recomputed.
    NumPy reference: resnorm.reference.gated_residual_backward."""
    cdef Py_ssize_t i, n = dh.shape[0], d = dh.shape[1]
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, sizeof(floating), n_threads, 2 * d)
    cdef floating *s
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            s = &scratch[threadid(), 0]
            row_sigmoid(s, s + d, &gate[i, 0], d)
            row_residual_bwd(&dbranch[i, 0], &dx[i, 0], NULL, &dh[i, 0], NULL, NULL, s, NULL,
                             d, stream)
            # dg = ds * (F * dh): residual_add's product chain with no residual stream
            row_residual_add(&dgate[i, 0], NULL, &branch[i, 0], s + d, &dh[i, 0], d, stream)
