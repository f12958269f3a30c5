"""Residual-connection kernels over the rows of (N, D) arrays: inverted dropout, fused
add + RMSNorm / LayerNorm (Pre-Norm and Post-Norm), scaled and gated residuals, forward
and backward.

Outputs come first, then inputs, then sizes.  The kernels do not validate (resnorm.residual
and resnorm.inverted_dropout do that).  Besides the partial-sum rows of backward they
allocate a few scratch rows per thread (keep masks, the gradient reaching h).  The fused
Pre-Norm forward moves four streams, each once: it reads x and residual, and writes h and y.

Dropout keeps element k when its Philox-4x32-10 uniform (resnorm_c/philox.h), a function
of (seed, flat element index), passes the threshold; the mask is regenerated in backward,
never stored between the passes, and identical for any thread count.  Inside a kernel it is
a bit string, 1 bit per element (a row's mask stays in L1 beside the row), made one row
ahead: a thread generates the mask of its next row slice by slice during the current row's
write pass, which waits on streamed stores draining to memory and leaves the core time to
spare.

Reductions over rows (dweight, dbias, dalpha) go through fixed row blocks
(common.row_blocks) and float64 partial rows added in block order: bitwise reproducible.
Every other result is computed row by row, so no result depends on the thread count.
"""
import numpy as np

from resnorm._scratch import give_back, lend_partials

from cython.parallel cimport prange, threadid
from libc.math cimport isfinite, sqrt
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memset

from common cimport opt_ptr, row_blocks, sum_partials, RN_STREAM_UNFENCED, rn_sfence
from primitives cimport (element, rn_import_core, rn_rms_bwd_dot, rn_rms_bwd_apply_rows,
                         rn_ln_bwd_sums, rn_ln_bwd_apply_rows, rn_residual_add, rn_residual_reduce,
                         rn_residual_norm_apply, rn_residual_bwd, rn_sigmoid, rn_philox_uniforms,
                         rn_dropout_keep, rn_dropout_bits, rn_rms_apply)
# the norm kernels' scalar paths for the few rows the fast paths cannot take
from rare_rows cimport (_rms_rstd_rescaled, _ln_stats_trusted, _ln_forward_careful,
                        _ln_backward_careful, _overflowed)

rn_import_core()

cdef enum:
    DROPOUT_CHUNK = 8192  # elements per task of the flat dropout kernels
    SEGMENT = 1024        # elements per slice of a write pass (see the module docstring)


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


cdef inline Py_ssize_t mask_words(Py_ssize_t d) noexcept nogil:
    """64-bit words that hold the keep bits of d consecutive elements starting anywhere in
    a group, plus a word of padding for the readers' 8-byte loads."""
    return (d + 63) // 64 + 2


cdef inline uint64_t extend_bits(uint64_t *words, const rn_dropout *dp, uint64_t first_group,
                                 uint64_t made, uint64_t end) noexcept nogil:
    """Makes the keep bits of the groups from `made` up to the one holding flat element
    end - 1, into words (word j: group first_group + j); returns the new `made`."""
    cdef uint64_t need = (end + 63) // 64
    if need > made:
        rn_dropout_bits(words + (made - first_group), dp.seed, made, need - made, dp.threshold)
    return need if need > made else made


cdef inline const element *at(const element *p, Py_ssize_t k) noexcept nogil:
    """p + k for an optional row (NULL stays NULL)."""
    if p == NULL:
        return NULL
    return p + k


cdef object thread_rows(object dtype, Py_ssize_t itemsize, int n_threads, Py_ssize_t width):
    """Scratch: one row of `width` elements per thread, padded to whole cache lines."""
    cdef Py_ssize_t per_line = 64 // itemsize
    return np.empty((max(1, n_threads), (width + per_line - 1) // per_line * per_line), dtype)


# --------------------------------------------------------------------------- dropout

def dropout_forward(element[::1] out, const element[::1] x, rn_dropout dropout, int n_threads,
                    bint stream=False):
    """y := x * m,  m_k = scale if uniform(seed, k) >= threshold else 0  (flat index k).

    Backward is the same call on dy (dx = dy * m, the mask regenerated from the seed).
    NumPy reference: resnorm.reference.dropout_forward.  out may be x itself.
    """
    cdef Py_ssize_t n = x.shape[0], n_chunks = (n + DROPOUT_CHUNK - 1) // DROPOUT_CHUNK
    cdef Py_ssize_t c, k, end, length
    cdef int unfenced = RN_STREAM_UNFENCED if stream else 0
    cdef uint64_t[:, ::1] masks = np.zeros((max(1, n_threads), mask_words(SEGMENT)), np.uint64)
    cdef uint64_t *words
    with nogil:
        for c in prange(n_chunks, schedule="static", num_threads=n_threads):
            words = &masks[threadid(), 0]
            end = min(n, (c + 1) * DROPOUT_CHUNK)
            k = c * DROPOUT_CHUNK
            while k < end:
                # slice by slice (slices start on a group), so that Philox and memory traffic
                # interleave finely
                length = min(<Py_ssize_t>SEGMENT, end - k)
                extend_bits(words, &dropout, k // 64, k // 64, k + length)
                rn_residual_add(&out[k], NULL, &x[k], NULL, <uint8_t *>words, 0, dropout.scale,
                                 length, unfenced)
                k = k + length
            if stream:
                rn_sfence()


def dropout_mask(uint8_t[::1] keep, rn_dropout dropout, int n_threads):
    """keep[k] := uniform(seed, k) >= threshold: the keep-mask dropout applies (bool bytes)."""
    cdef Py_ssize_t n = keep.shape[0], n_chunks = (n + DROPOUT_CHUNK - 1) // DROPOUT_CHUNK
    cdef Py_ssize_t c, k0
    with nogil:
        for c in prange(n_chunks, schedule="static", num_threads=n_threads):
            k0 = c * DROPOUT_CHUNK
            rn_dropout_keep(&keep[k0], dropout.seed, k0, min(<Py_ssize_t>DROPOUT_CHUNK, n - k0),
                      dropout.threshold)


def philox_uniforms(uint32_t[::1] u, uint64_t seed, uint64_t start):
    """u[k] := the 32-bit Philox uniform of flat element start + k (for tests and teaching).
    NumPy reference: resnorm.reference.dropout_uniforms."""
    with nogil:
        rn_philox_uniforms(&u[0], seed, start, u.shape[0])


# --------------------------------------------------------------------------- fused add + norm

cdef inline void apply_row(element *y, element *hout, const element *residual,
                           const element *x, const element *a, const element *w,
                           const element *b, double mean, double rstd, const uint8_t *keep,
                           Py_ssize_t kpos, uint64_t *next_words, const rn_dropout *dp,
                           uint64_t next_start, Py_ssize_t d, int stream) noexcept nogil:
    """y (and hout) of one row from its cached x and residual, slice by slice; between
    slices the keep bits of the next row (flat elements from next_start) go into next_words
    (when it is not NULL).  keep, kpos: this row's bits, element k at bit kpos + k."""
    cdef Py_ssize_t k = 0, length
    cdef double scale = dp.scale if dp != NULL else 1.0
    cdef uint64_t first = next_start // 64, made = next_start // 64
    while k < d:
        length = min(<Py_ssize_t>SEGMENT, d - k)
        rn_residual_norm_apply(y + k, hout + k if hout != NULL else NULL, residual + k, x + k,
                                at(a, k), keep, kpos + k, scale, at(w, k), at(b, k), mean, rstd,
                                length, stream)
        if next_words != NULL:
            made = extend_bits(next_words, dp, first, made, next_start + k + length)
        k += length


cdef inline bint stats_trusted(bint layer, const element *row, double mean, double var,
                               Py_ssize_t d) noexcept nogil:
    """False for a row the fast path cannot normalise (rare_rows.pxd): LayerNorm, as in
    layer_norm_forward; RMSNorm, a float64 sum of squares beyond the double range (float32
    squares cannot leave it).  row only selects the element type."""
    if layer:
        return _ln_stats_trusted(row, mean, var, d)
    if element is float:
        return True
    else:
        return isfinite(var)


cdef void rare_row(element *y, element *hrow, double *mean, double *rstd,
                   const element *residual, const element *x, const element *a,
                   const element *w, const element *b, const uint8_t *keep, Py_ssize_t kpos,
                   double scale, double var, double eps, Py_ssize_t d) noexcept nogil:
    """A row of add_norm_forward that stats_trusted rejected: h is stored in hrow (which may
    be y, never w or b), then normalised by the norm kernels' scalar path (rare_rows.pxd).
    mean NULL: RMSNorm.  Kept out of the kernel's loop, which it would only make longer."""
    rn_residual_add(hrow, residual, x, a, keep, kpos, scale, d, False)
    if mean != NULL:
        _ln_forward_careful(y, mean, rstd, hrow, w, b, var, eps, d, False)
    else:
        rstd[0] = _rms_rstd_rescaled(hrow, d, eps)
        rn_rms_apply(y, hrow, w, rstd[0], d, False)


def add_norm_forward(element[:, ::1] y, element[:, ::1] h, double[::1] mean,
                     double[::1] rstd, const element[:, ::1] x, const element[:, ::1] residual,
                     const element[::1] weight, const element[::1] bias,
                     const element[::1] alpha, double eps, rn_dropout dropout, int n_threads,
                     bint stream=False):
    """h := residual + alpha * dropout(x), then y := norm(h):
    RMSNorm (mean None):   y = h * rstd * w,                rstd = 1/sqrt(mean(h^2) + eps)
    LayerNorm (mean given): y = (h - mean) * rstd * w + b,  rstd = 1/sqrt(var(h) + eps), two-pass.

    Pre-Norm when h is given (h is written: the new residual stream); Post-Norm when h is
    None (only y is written).  weight, bias, alpha (D,) may be None.  mean, rstd (N,)
    float64 receive the row statistics.  Backward: add_norm_backward.  NumPy references:
    resnorm.reference.add_rms_norm_forward, add_layer_norm_forward.

    A thread takes a contiguous range of rows.  Per row: reduction passes over x and
    residual that only load (h is not stored: a plain store would queue behind the streamed
    stores still draining), then one pass that recomputes h from the cached rows and writes
    y and h (apply_row).  Memory sees x and residual read once, y and h written once.
    """
    cdef Py_ssize_t n = x.shape[0], d = x.shape[1], t, i, lo, hi
    cdef int nt = max(1, n_threads), unfenced = RN_STREAM_UNFENCED if stream else 0
    cdef const element *w = opt_ptr(weight)
    cdef const element *b = opt_ptr(bias)
    cdef const element *a = opt_ptr(alpha)
    cdef const rn_dropout *dp = active(&dropout)
    cdef double scale = dropout.scale if dp != NULL else 1.0
    cdef bint pre = h is not None, layer = mean is not None
    cdef Py_ssize_t nw = mask_words(d)
    cdef uint64_t[:, ::1] masks = np.zeros((nt, 2 * nw if dp != NULL else 1), np.uint64)
    cdef uint64_t *keep
    cdef uint64_t *keep_next
    cdef uint64_t *swap
    cdef double mu, var
    with nogil:
        for t in prange(nt, schedule="static", num_threads=nt):
            # keep, keep_next: the bits of this row and of the next (from their first group)
            keep = &masks[t, 0] if dp != NULL else NULL
            keep_next = keep + nw if dp != NULL else NULL
            lo = t * n // nt
            hi = (t + 1) * n // nt
            if dp != NULL and lo < hi:
                extend_bits(keep, dp, lo * d // 64, lo * d // 64, lo * d + d)
            for i in range(lo, hi):
                # the reductions: LayerNorm's mean, then the mean of (h - mean)^2 (mean 0:
                # RMSNorm's mean of h^2)
                mu = 0.0
                if layer:
                    mu = rn_residual_reduce(&residual[i, 0], &x[i, 0], a, <uint8_t *>keep,
                                             i * d % 64, scale, d, False, 0.0) / d
                    mean[i] = mu
                var = rn_residual_reduce(&residual[i, 0], &x[i, 0], a, <uint8_t *>keep,
                                          i * d % 64, scale, d, True, mu) / d
                if stats_trusted(layer, &residual[i, 0], mu, var, d):
                    rstd[i] = 1.0 / sqrt(var + eps)
                    apply_row(&y[i, 0], &h[i, 0] if pre else NULL, &residual[i, 0], &x[i, 0],
                              a, w, b, mu, rstd[i], <uint8_t *>keep, i * d % 64,
                              keep_next if i + 1 < hi else NULL, dp, (i + 1) * d, d, unfenced)
                else:
                    # h is stored first, in h (Pre-Norm) or in y (Post-Norm)
                    rare_row(&y[i, 0], &h[i, 0] if pre else &y[i, 0],
                             &mean[i] if layer else NULL, &rstd[i], &residual[i, 0], &x[i, 0],
                             a, w, b, <uint8_t *>keep, i * d % 64, scale, var, eps, d)
                    if dp != NULL and i + 1 < hi:
                        extend_bits(keep_next, dp, (i + 1) * d // 64, (i + 1) * d // 64,
                                    (i + 1) * d + d)
                swap = keep
                keep = keep_next
                keep_next = swap
            if stream:
                rn_sfence()


cdef inline void through_add(element *dx, element *dresidual, double *apart,
                             const element *gh, const element *dh, const element *x,
                             const element *a, const uint8_t *keep, Py_ssize_t kpos,
                             uint64_t *next_words, const rn_dropout *dp, uint64_t next_start,
                             Py_ssize_t d, int stream) noexcept nogil:
    """Backward of one row of h = residual + a*(x*m), given the gradient gh reaching h from
    the norm (+ dh along the stream): dresidual, dx and the dalpha partial, slice by slice;
    between slices the next row's keep bits go into next_words (when it is not NULL)."""
    cdef Py_ssize_t k = 0, length
    cdef double scale = dp.scale if dp != NULL else 1.0
    cdef uint64_t first = next_start // 64, made = next_start // 64
    while k < d:
        length = min(<Py_ssize_t>SEGMENT, d - k)
        rn_residual_bwd(dx + k, dresidual + k, apart + k if apart != NULL else NULL, gh + k,
                         at(dh, k), at(x, k), at(a, k), keep, kpos + k, scale, length, stream)
        if next_words != NULL:
            made = extend_bits(next_words, dp, first, made, next_start + k + length)
        k += length


def add_norm_backward(element[:, ::1] dx, element[:, ::1] dresidual, element[::1] dweight,
                      element[::1] dbias, double[::1] dalpha, const element[:, ::1] dy,
                      const element[:, ::1] dh, const element[:, ::1] h,
                      const element[:, ::1] x, const element[:, ::1] residual,
                      const element[::1] weight, const element[::1] alpha,
                      const double[::1] mean, const double[::1] rstd, rn_dropout dropout,
                      int n_threads, bint stream=False):
    """gh := dh + J_norm(h)^T dy, the gradient reaching h, with g = dy*w:
      RMSNorm (mean None):    J^T dy = rstd * (g - hn * mean(g*hn)),  hn = h*rstd
      LayerNorm (mean given): J^T dy = rstd * (g - mean(g) - hhat * mean(g*hhat)),
                              hhat = (h - mean)*rstd
    then dresidual := gh;  dx := gh * alpha * m;  dweight := sum_rows dy*hn (dy*hhat);
    dbias := sum_rows dy;  dalpha (float64, per channel) := sum_rows gh * (x*m).

    Pre-Norm: h is the cached forward output.  Post-Norm: h is None and each row of h is
    recomputed from x and residual (dh must then be None).  dh may be None (0); dweight,
    dbias, dalpha None: not wanted (x may then be None in Pre-Norm).  NumPy references:
    resnorm.reference.add_rms_norm_backward, add_layer_norm_backward.
    """
    cdef Py_ssize_t n = dy.shape[0], d = dy.shape[1]
    cdef Py_ssize_t nb = row_blocks(n), blk, i, lo, hi
    cdef int nt = max(1, n_threads), unfenced = RN_STREAM_UNFENCED if stream else 0
    cdef const element *w = opt_ptr(weight)
    cdef const element *a = opt_ptr(alpha)
    cdef const rn_dropout *dp = active(&dropout)
    cdef double scale = dropout.scale if dp != NULL else 1.0
    cdef bint pre = h is not None, layer = mean is not None, has_dh = dh is not None
    cdef bint has_dw = dweight is not None, has_db = dbias is not None
    cdef bint has_da = dalpha is not None
    buffer, (dw_array, db_array, da_array) = lend_partials(nb, d, has_dw, has_db, has_da)
    cdef double[:, ::1] dw_part = dw_array
    cdef double[:, ::1] db_part = db_array
    cdef double[:, ::1] da_part = da_array
    cdef element[:, ::1] scratch = thread_rows(
        np.float32 if element is float else np.float64, sizeof(element), nt, d)
    cdef Py_ssize_t nw = mask_words(d)
    cdef uint64_t[:, ::1] masks = np.zeros((nt, 2 * nw if dp != NULL else 1), np.uint64)
    cdef element *gs
    cdef uint64_t *keep
    cdef uint64_t *keep_next
    cdef uint64_t *swap
    cdef const element *hp
    cdef double *wpart
    cdef double *bpart
    cdef double *apart
    cdef double m, sum_g, sum_ghhat, mean_g, mean_ghhat
    with nogil:
        for blk in prange(nb, schedule="static", num_threads=nt):
            # gs: the gradient reaching this row of h (in Post-Norm first h itself);
            # keep, keep_next: the dropout bits of this row and of the next
            gs = &scratch[threadid(), 0]
            keep = &masks[threadid(), 0] if dp != NULL else NULL
            keep_next = keep + nw if dp != NULL else NULL
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
                extend_bits(keep, dp, lo * d // 64, lo * d // 64, lo * d + d)
            for i in range(lo, hi):
                if pre:
                    hp = &h[i, 0]
                else:
                    rn_residual_add(gs, &residual[i, 0], &x[i, 0], a, <uint8_t *>keep,
                                     i * d % 64, scale, d, False)
                    hp = gs
                # the norm backward leaves the gradient reaching h in gs
                if layer:
                    # two reductions in one pass; assigned here so that they are
                    # thread-private (Cython shares a variable written only through a pointer)
                    sum_g = 0.0
                    sum_ghhat = 0.0
                    rn_ln_bwd_sums(&sum_g, &sum_ghhat, &dy[i, 0], hp, w, mean[i], rstd[i], d)
                    if _overflowed(sum_g / d, sum_ghhat / d, &dy[i, 0], hp, d):
                        # h - mean overflowed the element type (rare_rows.pxd)
                        _ln_backward_careful(gs, wpart, bpart, &dy[i, 0], hp, w, mean[i],
                                             rstd[i], d)
                    else:
                        mean_g = sum_g / d
                        mean_ghhat = sum_ghhat / d
                        rn_ln_bwd_apply_rows(gs, wpart, bpart, &dy[i, 0], hp, w, &mean[i],
                                             &rstd[i], &mean_g, &mean_ghhat, 1, d, False)
                else:
                    m = rn_rms_bwd_dot(&dy[i, 0], hp, w, rstd[i], d) / d
                    rn_rms_bwd_apply_rows(gs, wpart, &dy[i, 0], hp, w, &rstd[i], &m, 1, d, False)
                through_add(&dx[i, 0], &dresidual[i, 0], apart, gs, &dh[i, 0] if has_dh else NULL,
                            &x[i, 0] if has_da else NULL, a, <uint8_t *>keep, i * d % 64,
                            keep_next if i + 1 < hi else NULL, dp, (i + 1) * d, d, unfenced)
                swap = keep
                keep = keep_next
                keep_next = swap
            if stream:
                rn_sfence()
    if has_dw:
        sum_partials(dweight, dw_part, nt)
    if has_db:
        sum_partials(dbias, db_part, nt)
    if has_da:
        sum_partials(dalpha, da_part, nt)
    give_back(buffer)


# --------------------------------------------------------------------------- scaled residual

def scaled_residual_forward(element[:, ::1] out, const element[:, ::1] x,
                            const element[:, ::1] branch, const element[::1] alpha,
                            int n_threads, bint stream=False):
    """h := x + alpha * F  (alpha (D,), or None: 1).  The gated residual with a per-channel
    gate is this op with alpha = sigmoid(g).
    Backward: scaled_residual_backward.  NumPy reference: resnorm.reference.scaled_residual_forward.
    out may be x or F itself.
    """
    cdef Py_ssize_t i, n = x.shape[0], d = x.shape[1]
    cdef const element *a = opt_ptr(alpha)
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            rn_residual_add(&out[i, 0], &x[i, 0], &branch[i, 0], a, NULL, 0, 1.0, d, stream)


def scaled_residual_backward(element[:, ::1] dx, element[:, ::1] dbranch, double[::1] dalpha,
                             const element[:, ::1] dh, const element[:, ::1] branch,
                             const element[::1] alpha, int n_threads, bint stream=False):
    """dx := dh;  dF := dh * alpha;  dalpha (float64, per channel) := sum_rows dh * F.

    dalpha None: not wanted (branch may then be None).
    NumPy reference: resnorm.reference.scaled_residual_backward.
    """
    cdef Py_ssize_t n = dh.shape[0], d = dh.shape[1]
    cdef Py_ssize_t nb = row_blocks(n), blk, i
    cdef const element *a = opt_ptr(alpha)
    cdef bint has_da = dalpha is not None
    buffer, (da_array,) = lend_partials(nb, d, has_da)
    cdef double[:, ::1] da_part = da_array
    cdef double *apart
    cdef const element *fp
    with nogil:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            apart = NULL
            if has_da:
                apart = &da_part[blk, 0]
                memset(apart, 0, d * sizeof(double))
            for i in range(blk * n // nb, (blk + 1) * n // nb):
                fp = &branch[i, 0] if has_da else NULL
                rn_residual_bwd(&dbranch[i, 0], &dx[i, 0], apart, &dh[i, 0], NULL, fp, a,
                                 NULL, 0, 1.0, d, stream)
    if has_da:
        sum_partials(dalpha, da_part, n_threads)
    give_back(buffer)


# --------------------------------------------------------------------------- gated residual

def sigmoid(element[:, ::1] s, element[:, ::1] ds, const element[:, ::1] g, int n_threads):
    """s := 1/(1 + exp(-g));  ds := s*(1-s), both computed in double (ds may be None)."""
    cdef Py_ssize_t i, n = g.shape[0], d = g.shape[1]
    cdef bint has_ds = ds is not None
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            rn_sigmoid(&s[i, 0], &ds[i, 0] if has_ds else NULL, &g[i, 0], d)


def gated_residual_forward(element[:, ::1] out, const element[:, ::1] x,
                           const element[:, ::1] branch, const element[:, ::1] gate,
                           int n_threads, bint stream=False):
    """h := x + sigmoid(g) * F, g of F's shape (a per-channel g goes through
    scaled_residual_forward).  NumPy reference: resnorm.reference.gated_residual_forward."""
    cdef Py_ssize_t i, n = x.shape[0], d = x.shape[1]
    cdef element[:, ::1] scratch = thread_rows(
        np.float32 if element is float else np.float64, sizeof(element), n_threads, d)
    cdef element *s
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            s = &scratch[threadid(), 0]
            rn_sigmoid(s, NULL, &gate[i, 0], d)
            rn_residual_add(&out[i, 0], &x[i, 0], &branch[i, 0], s, NULL, 0, 1.0, d, stream)


def gated_residual_backward(element[:, ::1] dx, element[:, ::1] dbranch,
                            element[:, ::1] dgate, const element[:, ::1] dh,
                            const element[:, ::1] branch, const element[:, ::1] gate,
                            int n_threads, bint stream=False):
    """dx := dh;  dF := dh * s;  dg := F * (dh * s*(1-s)),  s = sigmoid(g) recomputed.
    NumPy reference: resnorm.reference.gated_residual_backward."""
    cdef Py_ssize_t i, n = dh.shape[0], d = dh.shape[1]
    cdef element[:, ::1] scratch = thread_rows(
        np.float32 if element is float else np.float64, sizeof(element), n_threads, 3 * d)
    cdef element *s
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            # s, s + d, s + 2d: sigmoid(g), its derivative s(1-s), and dh * s(1-s)
            s = &scratch[threadid(), 0]
            rn_sigmoid(s, s + d, &gate[i, 0], d)
            rn_residual_bwd(&dbranch[i, 0], &dx[i, 0], NULL, &dh[i, 0], NULL, NULL, s, NULL, 0,
                             1.0, d, stream)
            rn_residual_add(s + 2 * d, NULL, &dh[i, 0], s + d, NULL, 0, 1.0, d, False)
            rn_residual_add(&dgate[i, 0], NULL, &branch[i, 0], s + 2 * d, NULL, 0, 1.0, d,
                             stream)
