"""Residual-connection kernels over the rows of (N, D) arrays: inverted dropout, fused
add + RMSNorm / LayerNorm (Pre-Norm and Post-Norm), scaled and gated residuals, forward
and backward.

Outputs come first, then inputs, then sizes.  The kernels do not validate (resnorm.residual
and resnorm.dropout do that).  Besides the partial-sum rows of backward they allocate one
scratch row pair per thread: a row is assembled there (h = residual + alpha*dropout(x), or
the gradient reaching h), reduced and applied while it sits in L1/L2, and written to memory
once.  So the fused Pre-Norm forward moves four streams (read x and residual, write h and
y), each once.

Dropout multipliers come from Philox-4x32-10 (resnorm_c/philox.h) as a function of
(seed, flat element index): regenerated in backward, never stored, and identical for any
thread count.  Reductions over rows (dweight, dbias, dalpha) go through fixed row blocks
(common.row_blocks) and float64 partial rows added in block order: bitwise reproducible.
"""
import numpy as np

from cython.parallel cimport prange, threadid
from libc.math cimport sqrt
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memset

from common cimport (floating, rn_dropout, rn_cpu_init, opt_ptr, row_blocks, sum_partials,
                     row_sumsqdev, row_rms_apply_copy, row_ln_apply_copy, row_rms_bwd_dot,
                     row_rms_bwd_apply, row_ln_bwd_sums, row_ln_bwd_apply, row_dropout_mult,
                     row_residual_add, row_residual_add_reduce, row_residual_bwd, row_sigmoid,
                     span_uniforms, span_keep)

rn_cpu_init()

# Elements per task of the flat dropout kernels (dropout does not care where rows end).
cdef enum:
    DROPOUT_CHUNK = 8192


cdef inline const floating *row_mult(floating *m, const rn_dropout *dp, Py_ssize_t row,
                                     Py_ssize_t d) noexcept nogil:
    """The dropout multipliers of row `row` (flat elements row*d ..), written into m;
    NULL when there is no dropout (dp NULL)."""
    if dp == NULL:
        return NULL
    row_dropout_mult(m, dp.seed, <uint64_t>row * <uint64_t>d, d, dp.threshold, dp.scale)
    return m


cdef inline const rn_dropout *active(const rn_dropout *dp) noexcept nogil:
    """dp when it drops anything, else NULL (what the row primitives take)."""
    return dp if dp.on else NULL


def thread_rows(dtype, int n_threads, Py_ssize_t width):
    """Scratch: one row of `width` elements per thread, padded to whole cache lines."""
    cdef Py_ssize_t per_line = 64 // np.dtype(dtype).itemsize
    return np.empty((max(1, n_threads), (width + per_line - 1) // per_line * per_line), dtype)


# --------------------------------------------------------------------------- dropout

def dropout_forward(floating[::1] out, const floating[::1] x, rn_dropout dropout, int n_threads,
                    bint stream=False):
    """y := x * m,  m_k = scale if uniform(seed, k) >= threshold else 0  (flat index k).

    Backward is the same call on dy (dx = dy * m, the mask regenerated from the seed).
    NumPy reference: resnorm.reference.dropout_forward.  out may be x itself.
    """
    cdef Py_ssize_t n = x.shape[0], n_chunks = (n + DROPOUT_CHUNK - 1) // DROPOUT_CHUNK
    cdef Py_ssize_t c, k0, length
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, n_threads, DROPOUT_CHUNK)
    cdef floating *m
    with nogil:
        for c in prange(n_chunks, schedule="static", num_threads=n_threads):
            m = &scratch[threadid(), 0]
            k0 = c * DROPOUT_CHUNK
            length = min(<Py_ssize_t>DROPOUT_CHUNK, n - k0)
            row_dropout_mult(m, dropout.seed, k0, length, dropout.threshold, dropout.scale)
            row_residual_add(&out[k0], NULL, &x[k0], NULL, m, length, stream)


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
    """
    cdef Py_ssize_t i, n = x.shape[0], d = x.shape[1]
    cdef const floating *w = opt_ptr(weight)
    cdef const floating *a = opt_ptr(alpha)
    cdef bint pre = h is not None
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, n_threads, 2 * d)
    cdef const rn_dropout *dp = active(&dropout)
    cdef floating *hs
    cdef floating *hp
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            # hs: this row of h, assembled in cache (with its dropout multipliers after it);
            # one reduction on the way, then y and h leave in one pass
            hs = &scratch[threadid(), 0]
            rstd[i] = 1.0 / sqrt(row_residual_add_reduce(hs, hs + d, &residual[i, 0], &x[i, 0],
                                                         a, dp, <uint64_t>i * d, d, True) / d
                                 + eps)
            hp = &h[i, 0] if pre else NULL
            row_rms_apply_copy(&y[i, 0], hp, hs, w, rstd[i], d, stream)


def add_layer_norm_forward(floating[:, ::1] y, floating[:, ::1] h, double[::1] mean,
                           double[::1] rstd, const floating[:, ::1] x,
                           const floating[:, ::1] residual, const floating[::1] weight,
                           const floating[::1] bias, const floating[::1] alpha, double eps,
                           rn_dropout dropout, int n_threads, bint stream=False):
    """h := residual + alpha * dropout(x);  y := (h - mean) * rstd * w + b (two-pass stats).

    Pre-Norm when h is given, Post-Norm when h is None.  weight, bias, alpha may be None.
    Backward: add_layer_norm_backward.  NumPy reference: resnorm.reference.add_layer_norm_forward.
    """
    cdef Py_ssize_t i, n = x.shape[0], d = x.shape[1]
    cdef const floating *w = opt_ptr(weight)
    cdef const floating *b = opt_ptr(bias)
    cdef const floating *a = opt_ptr(alpha)
    cdef bint pre = h is not None
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, n_threads, 2 * d)
    cdef const rn_dropout *dp = active(&dropout)
    cdef floating *hs
    cdef floating *hp
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            hs = &scratch[threadid(), 0]
            # the two LayerNorm reductions: the mean on the way in, then the mean squared
            # deviation on the cached row
            mean[i] = row_residual_add_reduce(hs, hs + d, &residual[i, 0], &x[i, 0], a, dp,
                                              <uint64_t>i * d, d, False) / d
            rstd[i] = 1.0 / sqrt(row_sumsqdev(hs, d, mean[i]) / d + eps)
            hp = &h[i, 0] if pre else NULL
            row_ln_apply_copy(&y[i, 0], hp, hs, w, b, mean[i], rstd[i], d, stream)


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
    cdef Py_ssize_t nb = row_blocks(n), blk, i
    cdef const floating *w = opt_ptr(weight)
    cdef const floating *a = opt_ptr(alpha)
    cdef bint pre = h is not None, has_dh = dh is not None
    cdef bint has_dw = dweight is not None, has_da = dalpha is not None
    cdef double[:, ::1] dw_part = np.empty((nb, d if has_dw else 0))
    cdef double[:, ::1] da_part = np.empty((nb, d if has_da else 0))
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, n_threads, 2 * d)
    cdef const rn_dropout *dp = active(&dropout)
    cdef floating *gs
    cdef const floating *hp
    cdef const floating *mp
    cdef const floating *dhp
    cdef const floating *xp
    cdef double *wpart
    cdef double *apart
    cdef double m
    with nogil:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            gs = &scratch[threadid(), 0]
            wpart = NULL
            apart = NULL
            if has_dw:
                wpart = &dw_part[blk, 0]
                memset(wpart, 0, d * sizeof(double))
            if has_da:
                apart = &da_part[blk, 0]
                memset(apart, 0, d * sizeof(double))
            for i in range(blk * n // nb, (blk + 1) * n // nb):
                if pre:
                    hp = &h[i, 0]
                    mp = row_mult(gs + d, dp, i, d)
                else:
                    # recompute this row of h (and its multipliers) in scratch
                    row_residual_add_reduce(gs, gs + d, &residual[i, 0], &x[i, 0], a, dp,
                                            <uint64_t>i * d, d, True)
                    hp = gs
                    mp = gs + d if dp != NULL else NULL
                dhp = &dh[i, 0] if has_dh else NULL
                xp = &x[i, 0] if has_da else NULL
                # the norm backward (one reduction) leaves the gradient reaching h in gs
                m = row_rms_bwd_dot(&dy[i, 0], hp, w, rstd[i], d) / d
                row_rms_bwd_apply(gs, wpart, &dy[i, 0], hp, w, rstd[i], m, d, False)
                # through the add: dresidual, dx and this block's dalpha partial
                row_residual_bwd(&dx[i, 0], &dresidual[i, 0], apart, gs, dhp, xp, a, mp, d,
                                 stream)
    if has_dw:
        sum_partials(dweight, dw_part, n_threads)
    if has_da:
        sum_partials(dalpha, da_part, n_threads)


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
    cdef Py_ssize_t nb = row_blocks(n), blk, i
    cdef const floating *w = opt_ptr(weight)
    cdef const floating *a = opt_ptr(alpha)
    cdef bint pre = h is not None, has_dh = dh is not None
    cdef bint has_dw = dweight is not None, has_db = dbias is not None
    cdef bint has_da = dalpha is not None
    cdef double[:, ::1] dw_part = np.empty((nb, d if has_dw else 0))
    cdef double[:, ::1] db_part = np.empty((nb, d if has_db else 0))
    cdef double[:, ::1] da_part = np.empty((nb, d if has_da else 0))
    cdef floating[:, ::1] scratch = thread_rows(
        np.float32 if floating is float else np.float64, n_threads, 2 * d)
    cdef const rn_dropout *dp = active(&dropout)
    cdef floating *gs
    cdef const floating *hp
    cdef const floating *mp
    cdef const floating *dhp
    cdef const floating *xp
    cdef double *wpart
    cdef double *bpart
    cdef double *apart
    cdef double sum_g, sum_ghhat
    with nogil:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            gs = &scratch[threadid(), 0]
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
            for i in range(blk * n // nb, (blk + 1) * n // nb):
                if pre:
                    hp = &h[i, 0]
                    mp = row_mult(gs + d, dp, i, d)
                else:
                    # recompute this row of h (and its multipliers) in scratch
                    row_residual_add_reduce(gs, gs + d, &residual[i, 0], &x[i, 0], a, dp,
                                            <uint64_t>i * d, d, True)
                    hp = gs
                    mp = gs + d if dp != NULL else NULL
                dhp = &dh[i, 0] if has_dh else NULL
                xp = &x[i, 0] if has_da else NULL
                # two reductions in one pass; assigned here so that they are thread-private
                # (Cython shares a variable written only through a pointer)
                sum_g = 0.0
                sum_ghhat = 0.0
                row_ln_bwd_sums(&sum_g, &sum_ghhat, &dy[i, 0], hp, w, mean[i], rstd[i], d)
                row_ln_bwd_apply(gs, wpart, bpart, &dy[i, 0], hp, w, mean[i], rstd[i],
                                 sum_g / d, sum_ghhat / d, d, False)
                row_residual_bwd(&dx[i, 0], &dresidual[i, 0], apart, gs, dhp, xp, a, mp, d,
                                 stream)
    if has_dw:
        sum_partials(dweight, dw_part, n_threads)
    if has_db:
        sum_partials(dbias, db_part, n_threads)
    if has_da:
        sum_partials(dalpha, da_part, n_threads)


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
        np.float32 if floating is float else np.float64, n_threads, d)
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
        np.float32 if floating is float else np.float64, n_threads, 2 * d)
    cdef floating *s
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            s = &scratch[threadid(), 0]
            row_sigmoid(s, s + d, &gate[i, 0], d)
            row_residual_bwd(&dbranch[i, 0], &dx[i, 0], NULL, &dh[i, 0], NULL, NULL, s, NULL,
                             d, stream)
            # dg = ds * (F * dh): residual_add's product chain with no residual stream
            row_residual_add(&dgate[i, 0], NULL, &branch[i, 0], s + d, &dh[i, 0], d, stream)
