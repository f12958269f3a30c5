# Fused add + norm kernels, forward and backward (Pre-Norm and Post-Norm, RMSNorm and
# LayerNorm, alpha and dropout), over N rows of D contiguous elements.
#
# h = residual + alpha * dropout(x), then y = norm(h).  Outputs first, then inputs, then
# sizes; scratch is the caller's.  The Pre-Norm forward moves four streams, each once: it
# reads x and residual, and writes h and y.  Reductions over rows (dweight, dbias, dalpha)
# go through fixed row blocks and float64 partial rows added in block order (common.pxd):
# bitwise reproducible for any thread count.
#
# Names follow docs/residual.md: g = dy*w; RMSNorm hn = h*rstd, m = mean(g*hn); LayerNorm
# hhat = (h - mean)*rstd, mean_g = mean(g), mean_ghhat = mean(g*hhat); gh, the gradient
# reaching h.
#
# 16-bit rows with float32 parameters (torch's mixed precision): buf, that kernel's float32
# scratch per thread, is given, the parameters are wf and bf (either may be NULL), and w, b
# are NULL.  h is formed and rounded to the 16-bit type as ever, and the norm is
# mixed_kernels.pxd's, the float32 norm of the widened h (its backward rounds the gradient
# reaching h, as the 16-bit kernels do).
from cython.parallel cimport prange, threadid
from libc.math cimport isfinite, sqrt
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memset

from common cimport (RN_GROUP, RN_STREAM_UNFENCED, at, first_row, rn_sfence, row_blocks,
                    sum_partials, zero_partials)
from dropout_masks cimport SEGMENT, active, extend_bits, mask_words, rn_dropout
from mixed_kernels cimport (backward_floats, forward_floats, mixed_backward_group,
                           mixed_forward_row)
from primitives cimport (element, real, rn_bf16, rn_f16, rn_residual_add, rn_residual_add_reduce,
                         rn_residual_reduce, rn_residual_shifted_sums,
                         rn_residual_add_shifted_sums, rn_residual_norm_apply,
                         rn_residual_bwd, rn_rms_apply)
from norm_kernels cimport (CARRY_DOUBLES, backward_prefetch_dx, carried, carry_start,
                           forward_prefetch, layer_backward_group, layer_backward_run,
                           layer_forward_row, layer_forward_row_stats, ln_moments_from,
                           one_group, rms_backward_group, rms_backward_run, rms_forward_row,
                           rms_forward_row_from, shifted_moments)
# the norm kernels' scalar paths for the few rows the fast paths cannot take
from rare_rows cimport _ln_forward_careful, _ln_stats_trusted, _rms_rstd_rescaled


cdef inline Py_ssize_t add_norm_mask_words(Py_ssize_t d, const rn_dropout *dp) noexcept nogil:
    """64-bit words of scratch per thread for the keep bits (this row's and the next's)."""
    return 2 * mask_words(d) if active(dp) != NULL else 0


# --------------------------------------------------------------------------- forward

cdef inline void apply_row(real *y, real *h, const real *residual, const real *x,
                           const real *alpha, const real *w, const real *b,
                           double mean, double rstd, const uint8_t *keep, Py_ssize_t kpos,
                           uint64_t *next_words, const rn_dropout *dp, uint64_t next_start,
                           Py_ssize_t d, int stream) noexcept nogil:
    """y (and h) of one row from its cached x and residual, slice by slice; between
    slices the keep bits of the next row (flat elements from next_start) go into next_words
    (when it is not NULL).  keep, kpos: this row's bits, element k at bit kpos + k.  float
    and double (the 16-bit types store h first)."""
    cdef Py_ssize_t k = 0, length
    cdef double scale = dp.scale if dp != NULL else 1.0
    cdef uint64_t first = next_start // 64, made = next_start // 64
    while k < d:
        length = min(<Py_ssize_t>SEGMENT, d - k)
        rn_residual_norm_apply(y + k, h + k if h != NULL else NULL, residual + k, x + k,
                               at(alpha, k), keep, kpos + k, scale, at(w, k), at(b, k), mean,
                               rstd, length, stream)
        if next_words != NULL:
            made = extend_bits(next_words, dp, first, made, next_start + k + length)
        k += length


cdef inline bint stats_trusted(bint layer, const element *row, double mean, double var,
                               Py_ssize_t d) noexcept nogil:
    """False for a row the fast path cannot normalise (rare_rows.pxd): LayerNorm, as in
    layer_forward; RMSNorm, a float64 sum of squares beyond the double range (float32
    squares cannot leave it, nor can those of the 16-bit types).  row only selects the
    element type."""
    if layer:
        return _ln_stats_trusted(row, mean, var, d)
    if element is not double:
        return True
    else:
        return isfinite(var)


cdef inline void rare_row(element *y, element *hrow, double *mean, double *rstd,
                   const element *residual, const element *x, const element *alpha,
                   const element *w, const element *b, const uint8_t *keep, Py_ssize_t kpos,
                   double scale, double var, double eps, Py_ssize_t d) noexcept nogil:
    """A row of add_norm_forward that stats_trusted rejected: h is stored in hrow (which may
    be y, never w or b), then normalised by the norm kernels' scalar path (rare_rows.pxd).
    mean NULL: RMSNorm.  Kept out of the kernel's loop, which it would only make longer."""
    # (no prefetch: a rare row)
    rn_residual_add(hrow, residual, x, alpha, keep, kpos, scale, d, False, 0)
    if mean != NULL:
        _ln_forward_careful(y, mean, rstd, hrow, w, b, var, eps, d, False)
    else:
        rstd[0] = _rms_rstd_rescaled(hrow, d, eps)
        rn_rms_apply(y, hrow, w, rstd[0], d, False, 0)


cdef inline void add_norm_forward_rows(element *y, element *h, double *mean, double *rstd,
                                       const element *x, const element *residual,
                                       const element *w, const element *b,
                                       const element *alpha, const float *wf, const float *bf,
                                       double eps, const rn_dropout *dp, uint64_t *masks,
                                       float *buf, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t d,
                                       bint stream) noexcept nogil:
    """Rows lo .. hi of add_norm_forward on one thread (masks: its keep-bit scratch).
    Streamed outputs, per row: reduction passes over x and residual that only load (h is
    not stored: a plain store would queue behind the streamed stores still draining), then
    one pass that recomputes h from the cached rows and writes y and h (apply_row).
    Otherwise, for float and double, h is formed once and stored (into y for Post-Norm) by
    the pass that takes the norm's first reduction (residual_add_reduce: RMSNorm's sum of
    squares; residual_add_shifted_sums: LayerNorm's shifted sums), and the norm kernels
    finish the row from it: fewer operations per element, and the same bits, as the
    residual reductions reduce h exactly as the norms' reductions do.  The 16-bit types
    always store h first, rounded, and normalise that stored h with the norm's own row
    kernel (the mixed kernel for float32 parameters): y is then bitwise the norm of the h
    the caller gets, as in the unfused h = residual + alpha*x; y = norm(h), and the
    backward, which reads that h with these statistics, differentiates the function that
    was computed (statistics of the unrounded h beside the rounded h made xhat = (h16 -
    h32)*rstd where it is 0, up to inf on near-constant rows).  Each row prefetches the
    next of this range (ahead = hi - 1 - i), none past it, but for the streamed rows that
    forward_prefetch leaves to the CPU."""
    cdef Py_ssize_t i, nw = mask_words(d)
    cdef Py_ssize_t pf = forward_prefetch(stream, d * <Py_ssize_t>sizeof(element))
    cdef int unfenced = RN_STREAM_UNFENCED if stream else 0
    cdef double scale = dp.scale if dp != NULL else 1.0, mu, var, total = 0.0
    cdef double sums[3]
    cdef bint layer = mean != NULL
    # keep, keep_next: the bits of this row and of the next (from their first group)
    cdef uint64_t *keep = masks if dp != NULL else NULL
    cdef uint64_t *keep_next = masks + nw if dp != NULL else NULL
    cdef uint64_t *swap
    cdef uint64_t *next_words
    cdef element *hrow
    if dp != NULL and lo < hi:
        extend_bits(keep, dp, lo * d // 64, lo * d // 64, lo * d + d)
    for i in range(lo, hi):
        # the next row's keep bits, made after this row (unless the apply pass makes them)
        next_words = keep_next if dp != NULL and i + 1 < hi else NULL
        if element is rn_bf16 or element is rn_f16:
            # h stored first (into y for Post-Norm), rounded, then normalised by the norm's
            # row kernel (h is not streamed: the norm reads it back)
            hrow = h + i * d if h != NULL else y + i * d
            rn_residual_add(hrow, residual + i * d, x + i * d, alpha, <uint8_t *>keep,
                            i * d % 64, scale, d, False, hi - 1 - i)
            if buf != NULL:
                mixed_forward_row(layer, y + i * d, &mean[i] if layer else NULL, &rstd[i],
                                  hrow, wf, bf, NULL, NULL, False, d, eps, unfenced, 0, buf)
            elif wf != NULL or bf != NULL:   # w, b widened once per call
                mixed_forward_row(layer, y + i * d, &mean[i] if layer else NULL, &rstd[i],
                                  hrow, wf, bf, w, b, True, d, eps, unfenced, hi - 1 - i, NULL)
            elif layer:
                layer_forward_row(y + i * d, &mean[i], &rstd[i], hrow, w, b, d, eps, unfenced,
                                  hi - 1 - i)
            else:
                rms_forward_row(y + i * d, &rstd[i], hrow, w, d, eps, unfenced, hi - 1 - i)
        elif not stream:
            # h stored first (into y for Post-Norm), by the pass that takes the norm's first
            # reduction
            hrow = h + i * d if h != NULL else y + i * d
            if layer:
                if element is float:   # one branch per type: the primitives have no 16-bit form
                    rn_residual_add_shifted_sums(sums, hrow, residual + i * d, x + i * d, alpha,
                                                 <uint8_t *>keep, i * d % 64, scale, d,
                                                 hi - 1 - i)
                elif element is double:
                    rn_residual_add_shifted_sums(sums, hrow, residual + i * d, x + i * d, alpha,
                                                 <uint8_t *>keep, i * d % 64, scale, d,
                                                 hi - 1 - i)
                ln_moments_from(&mu, &var, sums, hrow, d)
                layer_forward_row_stats(y + i * d, &mean[i], &rstd[i], hrow, w, b, d, eps, mu,
                                        var, False, hi - 1 - i)
            else:
                if element is float:
                    total = rn_residual_add_reduce(hrow, residual + i * d, x + i * d, alpha,
                                                   <uint8_t *>keep, i * d % 64, scale, d,
                                                   hi - 1 - i)
                elif element is double:
                    total = rn_residual_add_reduce(hrow, residual + i * d, x + i * d, alpha,
                                                   <uint8_t *>keep, i * d % 64, scale, d,
                                                   hi - 1 - i)
                rms_forward_row_from(y + i * d, &rstd[i], hrow, w, d, eps, total, False,
                                     hi - 1 - i)
        else:
            # the reductions: LayerNorm's mean and variance as ln_moments takes them (in one
            # pass about a shift, else two-pass); RMSNorm's mean of h^2
            mu = 0.0
            if layer:
                rn_residual_shifted_sums(sums, residual + i * d, x + i * d, alpha,
                                         <uint8_t *>keep, i * d % 64, scale, d,
                                         pf * (hi - 1 - i))
                if not shifted_moments(&mu, &var, sums, d, element is not double):
                    # (the first pass prefetched the next row)
                    mu = rn_residual_reduce(residual + i * d, x + i * d, alpha,
                                            <uint8_t *>keep, i * d % 64, scale, d, False, 0.0,
                                            0) / d
                    var = rn_residual_reduce(residual + i * d, x + i * d, alpha,
                                             <uint8_t *>keep, i * d % 64, scale, d, True, mu,
                                             0) / d
                mean[i] = mu
            else:
                var = rn_residual_reduce(residual + i * d, x + i * d, alpha, <uint8_t *>keep,
                                         i * d % 64, scale, d, True, 0.0,
                                         pf * (hi - 1 - i)) / d
            if stats_trusted(layer, residual, mu, var, d):
                rstd[i] = 1.0 / sqrt(var + eps)
                apply_row(y + i * d, h + i * d if h != NULL else NULL, residual + i * d,
                          x + i * d, alpha, w, b, mu, rstd[i], <uint8_t *>keep, i * d % 64,
                          next_words, dp, (i + 1) * d, d, unfenced)
                next_words = NULL
            else:
                # h is stored first, in h (Pre-Norm) or in y (Post-Norm)
                rare_row(y + i * d, h + i * d if h != NULL else y + i * d,
                         &mean[i] if layer else NULL, &rstd[i], residual + i * d, x + i * d,
                         alpha, w, b, <uint8_t *>keep, i * d % 64, scale, var, eps, d)
        if next_words != NULL:
            extend_bits(next_words, dp, (i + 1) * d // 64, (i + 1) * d // 64, (i + 1) * d + d)
        swap = keep
        keep = keep_next
        keep_next = swap
    if stream:
        rn_sfence()


cdef inline void add_norm_forward(element *y, element *h, double *mean, double *rstd,
                                  const element *x, const element *residual, const element *w,
                                  const element *b, const element *alpha, const float *wf,
                                  const float *bf, double eps, const rn_dropout *dropout,
                                  uint64_t *masks, float *buf, Py_ssize_t n, Py_ssize_t d,
                                  int n_threads, bint stream) noexcept nogil:
    """h := residual + alpha * dropout(x), then y := norm(h):
    RMSNorm (mean NULL):    y = h * rstd * w,                rstd = 1/sqrt(mean(h^2) + eps)
    LayerNorm (mean given): y = (h - mean) * rstd * w + b,  rstd = 1/sqrt(var(h) + eps),
                            mean and var as layer_forward takes them (ln_moments).

    Pre-Norm when h is given (h is written: the new residual stream); Post-Norm when h is
    NULL (only y is written).  w, b, alpha may be NULL.  mean, rstd (n) receive the row
    statistics.  masks: add_norm_mask_words(d, dropout) words of scratch per thread.  buf:
    forward_floats(d) floats per thread for float32 parameters wf, bf beside 16-bit rows
    (w, b NULL), else NULL.  wf, bf without buf: the 16-bit parameters w, b widened to
    float32 (once per call), which the mixed norm reads in their place (the same bits).  A
    thread takes a contiguous range of rows.  Backward: add_norm_backward.  NumPy
    references: resnorm.reference.add_rms_norm_forward, add_layer_norm_forward.
    """
    cdef const rn_dropout *dp = active(dropout)
    cdef Py_ssize_t t, nw = add_norm_mask_words(d, dropout)
    if n_threads == 1:
        add_norm_forward_rows(y, h, mean, rstd, x, residual, w, b, alpha, wf, bf, eps, dp,
                              masks, buf, 0, n, d, stream)
        return
    for t in prange(n_threads, schedule="static", num_threads=n_threads):
        add_norm_forward_rows(y, h, mean, rstd, x, residual, w, b, alpha, wf, bf, eps, dp,
                              masks + t * nw,
                              buf + t * forward_floats(d) if buf != NULL else NULL,
                              first_row(t, n, n_threads), first_row(t + 1, n, n_threads), d,
                              stream)


# --------------------------------------------------------------------------- backward

cdef inline void through_add(element *dx, element *dresidual, double *dalpha_part,
                             const element *gh, const element *dh, const element *x,
                             const element *alpha, const uint8_t *keep, Py_ssize_t kpos,
                             uint64_t *next_words, const rn_dropout *dp, uint64_t next_start,
                             Py_ssize_t d, int stream, bint ahead) noexcept nogil:
    """Backward of one row of h = residual + alpha*(x*m), given the gradient gh reaching h
    from the norm (+ dh along the stream): dresidual, dx and the dalpha partial, slice by
    slice; between slices the next row's keep bits go into next_words (when not NULL).
    ahead: the arrays read have a next row.  A slice prefetches the span one slice ahead,
    so it does so within the row, or into the next row when there is one."""
    cdef Py_ssize_t k = 0, length
    cdef double scale = dp.scale if dp != NULL else 1.0
    cdef uint64_t first = next_start // 64, made = next_start // 64
    while k < d:
        length = min(<Py_ssize_t>SEGMENT, d - k)
        rn_residual_bwd(dx + k, dresidual + k, dalpha_part + k if dalpha_part != NULL else NULL,
                        gh + k, at(dh, k), at(x, k), at(alpha, k), keep, kpos + k, scale, length,
                        stream, ahead or k + 2 * length <= d)
        if next_words != NULL:
            made = extend_bits(next_words, dp, first, made, next_start + k + length)
        k += length


cdef inline Py_ssize_t gs_bytes(Py_ssize_t d) noexcept nogil:
    """RN_GROUP rows of the gradient reaching h, in whole cache lines of doubles (enough
    for any element type)."""
    return ((RN_GROUP * d * sizeof(double) + 63) // 64) * 64


cdef inline Py_ssize_t add_norm_backward_scratch(Py_ssize_t d, const rn_dropout *dp) noexcept nogil:
    """Bytes of scratch per thread of add_norm_backward: a group of rows of gs and the keep
    bits, in whole cache lines (so that each thread's scratch starts on one)."""
    return (gs_bytes(d) + add_norm_mask_words(d, dp) * 8 + 63) // 64 * 64


cdef inline void add_norm_backward_carried(element *dx, element *dresidual, double *dw_part,
                                           double *db_part, const element *dy,
                                           const element *dh, const element *h,
                                           const element *x, const element *residual,
                                           const element *w, const double *mean,
                                           const double *rstd, Py_ssize_t lo, Py_ssize_t hi,
                                           Py_ssize_t n, Py_ssize_t d) noexcept nogil:
    """Rows lo .. hi of add_norm_backward_block's direct form (float and double rows, no
    dropout, no alpha) in the norms' carried runs (norm_kernels.pxd, carried): each row's
    pass writes dx and dresidual, dh added.  Post-Norm (h NULL) recomputes a run's rows of
    h into dresidual's rows first, which that pass reads back before it stores each
    element.  dw_part, db_part: the block's partial rows (NULL: not wanted), zeroed."""
    cdef double carry[2 * CARRY_DOUBLES]
    cdef element *cw = <element *>carry if dw_part != NULL else NULL
    cdef element *cb = <element *>(carry + CARRY_DOUBLES) if db_part != NULL else NULL
    cdef double m[RN_GROUP]
    cdef double mean_g[RN_GROUP]
    cdef const element *hp
    cdef Py_ssize_t i = lo, r, rows
    carry_start(cw, cb, d)
    while i < hi:
        rows = min(<Py_ssize_t>RN_GROUP, hi - i)
        if h != NULL:
            hp = h + i * d
        else:
            for r in range(i, i + rows):
                rn_residual_add(dresidual + r * d, residual + r * d, x + r * d, NULL, NULL, 0,
                                1.0, d, False, hi - 1 - r)
            hp = dresidual + i * d
        if mean == NULL:
            rms_backward_run(dx + i * d, dresidual + i * d, cw, dw_part, m, dy + i * d,
                             at(dh, i * d), hp, w, rstd + i, rows, d, n - i - rows)
        else:
            layer_backward_run(dx + i * d, dresidual + i * d, cw, cb, dw_part, db_part, mean_g,
                               m, dy + i * d, at(dh, i * d), hp, w, mean + i, rstd + i, rows,
                               d, n - i - rows)
        i += rows


cdef inline void add_norm_backward_block(element *dx, element *dresidual, double *partials,
                                         void *dw, void *db, bint want_dw, bint want_db,
                                         bint want_dalpha,
                                         const element *dy, const element *dh,
                                         const element *h, const element *x,
                                         const element *residual, const element *w,
                                         const element *alpha, const float *wf,
                                         const double *mean, const double *rstd,
                                         const rn_dropout *dp, char *mine, float *buf,
                                         Py_ssize_t blk, Py_ssize_t nb, Py_ssize_t n,
                                         Py_ssize_t d, bint stream) noexcept nogil:
    """Row block blk (of nb) of add_norm_backward, adding into its partial rows of the
    wanted sums (partials: as add_norm_backward's), or, with the totals dw and db given (a
    call whose rows are one group: see add_norm_backward), writing those sums there; their
    partial rows are then scratch for the norm's scalar path.  mine: this thread's scratch,
    a group of rows for the gradient reaching h (in Post-Norm first h itself), then the keep
    bits of this row and of the next.  Without dropout the norm's passes take groups of
    RN_GROUP rows, as the norms' backward kernels do (the dweight and dbias terms are then
    widened once per group); with it, one row at a time, its keep bits made while the row
    before goes through the add."""
    cdef double *dw_part = partials + blk * d if want_dw else NULL
    cdef double *db_part = partials + (nb + blk) * d if want_db else NULL
    cdef double *dalpha_part = partials + (2 * nb + blk) * d if want_dalpha else NULL
    cdef element *gs = <element *>mine
    cdef uint64_t *masks = <uint64_t *>(mine + gs_bytes(d))
    cdef Py_ssize_t lo = blk * n // nb, hi = (blk + 1) * n // nb
    cdef Py_ssize_t i = lo, r, rows, ahead, nw = mask_words(d)
    cdef Py_ssize_t group = 1 if dp != NULL else RN_GROUP
    cdef double m[RN_GROUP]
    cdef double mean_g[RN_GROUP]
    cdef int unfenced = RN_STREAM_UNFENCED if stream else 0
    cdef double scale = dp.scale if dp != NULL else 1.0
    cdef uint64_t *keep = masks if dp != NULL else NULL
    cdef uint64_t *keep_next = masks + nw if dp != NULL else NULL
    cdef uint64_t *swap
    cdef const element *hp
    cdef element *hrows
    # Without dropout, alpha (and so dalpha), dx and dresidual are the same gradient, the
    # one reaching h plus dh: the norm's apply pass writes both, dh added (float and double
    # rows: the 16-bit ones round the norm's part before dh is added, through the add).
    # One pass over the rows instead of three (the norm's into gs, then dresidual and dx).
    # Post-Norm recomputes h into dresidual's rows first, for that pass to read back
    # (before it stores each element), or into gs where dresidual is streamed (h's plain
    # stores would first read dresidual's lines from memory).  (Measurements:
    # benchmarks/TUNING.md.)
    cdef bint direct = (dp == NULL and alpha == NULL
                        and (element is float or element is double))
    cdef bint pf_dx = backward_prefetch_dx(n, d * <Py_ssize_t>sizeof(element))
    # the totals, of the parameters' type (float32 beside 16-bit rows: buf given)
    cdef element *dw_t = NULL
    cdef element *db_t = NULL
    cdef float *dwf_t = NULL
    cdef float *dbf_t = NULL
    if buf != NULL:
        dwf_t, dbf_t = <float *>dw, <float *>db
    else:
        dw_t, db_t = <element *>dw, <element *>db
    if dw == NULL and db == NULL:
        zero_partials(dw_part, db_part, d)
    if dalpha_part != NULL:
        memset(dalpha_part, 0, d * sizeof(double))
    if dp != NULL:
        # the words past a row's last group are read (and their lanes discarded) by the
        # vector multipliers: zero, not whatever the scratch held (gs is written before
        # it is read)
        memset(masks, 0, 2 * nw * 8)
    if dp != NULL and lo < hi:
        extend_bits(keep, dp, lo * d // 64, lo * d // 64, lo * d + d)
    if direct and dw == NULL and db == NULL and carried(dy, d):
        add_norm_backward_carried(dx, dresidual, dw_part, db_part, dy, dh, h, x, residual, w,
                                  mean, rstd, lo, hi, n, d)
        return
    while i < hi:
        rows = min(group, hi - i)
        if h != NULL:
            hp = h + i * d
        else:
            # Post-Norm: h recomputed, into dresidual's rows when the norm's pass writes them
            # unstreamed, else into gs
            hrows = dresidual + i * d if direct and not stream else gs
            for r in range(rows):
                rn_residual_add(hrows + r * d, residual + (i + r) * d, x + (i + r) * d, alpha,
                                <uint8_t *>keep, (i + r) * d % 64, scale, d, False,
                                hi - 1 - i - r)
            hp = hrows
        # the rows after this group that the norm's passes may prefetch: none when h is
        # the scratch group gs
        ahead = hi - i - rows if h != NULL or hp != gs else 0
        if direct:
            if mean == NULL:
                rms_backward_group(dx + i * d, dresidual + i * d, dw_t, dw_part, m, dy + i * d,
                                   at(dh, i * d), hp, w, rstd + i, rows, d, stream, ahead,
                                   pf_dx)
            else:
                layer_backward_group(dx + i * d, dresidual + i * d, dw_t, db_t, dw_part,
                                     db_part, mean_g, m, dy + i * d, at(dh, i * d), hp, w,
                                     mean + i, rstd + i, rows, d, stream, ahead, pf_dx)
            i += rows
            continue
        # the norm's backward leaves the gradient reaching h in gs (over h in Post-Norm): a
        # scratch group, whose next rows are not prefetched
        if buf != NULL or wf != NULL:   # float32 parameters (or 16-bit ones widened)
            if element is rn_bf16 or element is rn_f16:
                mixed_backward_group(mean != NULL, gs, dwf_t, dbf_t, dw_part, db_part, mean_g,
                                     m, dy + i * d, hp, wf, w,
                                     mean + i if mean != NULL else NULL, rstd + i, rows, d,
                                     False, ahead, False, buf)
        elif mean == NULL:
            rms_backward_group(gs, NULL, dw_t, dw_part, m, dy + i * d, NULL, hp, w, rstd + i,
                               rows, d, False, ahead, False)
        else:
            layer_backward_group(gs, NULL, dw_t, db_t, dw_part, db_part, mean_g, m, dy + i * d,
                                 NULL, hp, w, mean + i, rstd + i, rows, d, False, ahead, False)
        for r in range(i, i + rows):
            through_add(dx + r * d, dresidual + r * d, dalpha_part, gs + (r - i) * d,
                        at(dh, r * d), x + r * d if want_dalpha else NULL, alpha,
                        <uint8_t *>keep, r * d % 64, keep_next if r + 1 < hi else NULL, dp,
                        (r + 1) * d, d, unfenced, r + 1 < i + rows)
            swap = keep
            keep = keep_next
            keep_next = swap
        i += rows
    if stream:
        rn_sfence()


cdef inline void add_norm_backward(element *dx, element *dresidual, void *dw, void *db,
                                   double *dalpha, double *partials, char *scratch,
                                   const element *dy, const element *dh, const element *h,
                                   const element *x, const element *residual,
                                   const element *w, const element *alpha, const float *wf,
                                   const double *mean, const double *rstd,
                                   const rn_dropout *dropout, float *buf, Py_ssize_t n,
                                   Py_ssize_t d, int n_threads, bint stream) noexcept nogil:
    """gh := dh + J_norm(h)^T dy, the gradient reaching h, with g = dy*w:
      RMSNorm (mean NULL):    J^T dy = rstd * (g - hn * mean(g*hn)),  hn = h*rstd
      LayerNorm (mean given): J^T dy = rstd * (g - mean(g) - hhat * mean(g*hhat)),
                              hhat = (h - mean)*rstd
    then dresidual := gh;  dx := gh * alpha * m;  dw := sum_rows dy*hn (dy*hhat);
    db := sum_rows dy;  dalpha (float64, per channel) := sum_rows gh * (x*m).

    Pre-Norm: h is the cached forward output.  Post-Norm: h is NULL and each row of h is
    recomputed from x and residual (dh must then be NULL).  dh may be NULL (0); dw, db,
    dalpha NULL: not wanted (x may then be NULL in Pre-Norm).  dw, db: of the element type;
    float32 when buf is given (backward_floats(d) floats per thread): float32 parameters
    beside 16-bit rows, the weight wf (w NULL).  wf with w given (buf NULL): w is 16-bit,
    wf its exact float32 copy (made once per call; more than RN_GROUP rows), and the norm's
    passes are mixed_kernels.pxd's as with float32 parameters (the same bits as the 16-bit
    kernels').  partials: 3 * row_blocks(n) * d doubles (dw, db, dalpha partial rows);
    scratch: add_norm_backward_scratch(d) bytes per thread, 64-byte aligned.  NumPy
    references: resnorm.reference.add_rms_norm_backward, add_layer_norm_backward.
    """
    cdef const rn_dropout *dp = active(dropout)
    cdef Py_ssize_t nb = row_blocks(n), blk, per_thread = add_norm_backward_scratch(d, dropout)
    cdef bint want_dw = dw != NULL, want_db = db != NULL, want_dalpha = dalpha != NULL
    if one_group(n, stream) and (dp == NULL or n == 1):
        # the rows are one group (with dropout, the block's groups are single rows): dw and
        # db come out of it; dalpha's partial row is still added and narrowed
        add_norm_backward_block(dx, dresidual, partials, dw, db, want_dw, want_db,
                                want_dalpha, dy, dh, h, x, residual, w, alpha, wf, mean, rstd,
                                dp, scratch, buf, 0, 1, n, d, stream)
        if want_dalpha:
            sum_partials(dalpha, partials + 2 * d, 1, d, 1)
        return
    if n_threads == 1:
        for blk in range(nb):
            add_norm_backward_block(dx, dresidual, partials, NULL, NULL, want_dw, want_db,
                                    want_dalpha, dy, dh, h, x, residual, w, alpha, wf, mean,
                                    rstd, dp, scratch, buf, blk, nb, n, d, stream)
    else:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            add_norm_backward_block(dx, dresidual, partials, NULL, NULL, want_dw, want_db,
                                    want_dalpha, dy, dh, h, x, residual, w, alpha, wf, mean,
                                    rstd, dp, scratch + threadid() * per_thread,
                                    buf + threadid() * backward_floats(d) if buf != NULL
                                    else NULL,
                                    blk, nb, n, d, stream)
    # (the float32 sums exist only in the 16-bit kernels: float and double keep one call each)
    if (element is rn_bf16 or element is rn_f16) and buf != NULL:
        if want_dw:
            sum_partials(<float *>dw, partials, nb, d, n_threads)
        if want_db:
            sum_partials(<float *>db, partials + nb * d, nb, d, n_threads)
    else:
        if want_dw:
            sum_partials(<element *>dw, partials, nb, d, n_threads)
        if want_db:
            sum_partials(<element *>db, partials + nb * d, nb, d, n_threads)
    if want_dalpha:
        sum_partials(dalpha, partials + 2 * nb * d, nb, d, n_threads)
