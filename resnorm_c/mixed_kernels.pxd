# The norms of 16-bit rows (float16, bfloat16) with float32 parameters: torch's mixed
# precision, where a norm module keeps float32 weight and bias and receives the half-precision
# output of a layer before it (torch.autocast).
#
# The result is by definition the float32 norm of the widened input with one rounding per
# output element: the same statistics, the same rare-row paths and the same dweight/dbias
# partial rows as float32 (float64 partials in fixed row blocks, then float32), bitwise
# reproducible for any thread count.  Both directions read the 16-bit rows themselves: the
# reductions widen every element exactly into the same lanes as float32's (the forward
# statistics in double; the backward terms formed in float with the float32 parameters,
# as float32's are), so their bits are the widened rows', and the mixed passes do
# float32's arithmetic on the widened lanes, then round each output once.  A rare row (a
# forward row for the careful path; in backward, a LayerNorm group with a row whose
# x - mean overflowed float32) is widened to float32 in this thread's buffer, exactly (a
# group of RN_GROUP rows in backward), through the float32 kernels of norm_kernels.pxd,
# and its output rounded once to the 16-bit type.  16-bit parameters widened once per call
# take these kernels too (mixed_forward, mixed_backward: the 16-bit kernels' bits), with
# the 16-bit kernels' careful paths for the rare rows.  Rows are stored streaming
# (non-temporal) when the caller asks, as the other kernels store theirs.
#
# buf: per thread, forward_floats(d) (forward) or backward_floats(d) (backward) floats, at
# buf + threadid() * that; the caller's scratch.  Names as in norm_kernels.pxd.
from cython.parallel cimport prange, threadid

from common cimport (RN_GROUP, RN_STREAM_UNFENCED, first_row, rn_sfence, row_blocks,
                     sum_partials, zero_partials)
from norm_kernels cimport (PAIRED_ROW_BYTES, backward_prefetch_dx, forward_prefetch,
                          layer_backward_group, layer_forward_row_stats, ln_moments, ln_stats,
                          one_group, rms_rstd)
from primitives cimport (half, rn_from_float32, rn_ln_apply_mixed, rn_ln_bwd_apply_rows_mixed,
                         rn_ln_bwd_sums_mixed, rn_rms_apply_mixed, rn_rms_bwd_apply_rows_mixed,
                         rn_rms_bwd_dot_mixed, rn_sumsq, rn_to_float32)
from rare_rows cimport _overflowed


cdef inline Py_ssize_t forward_floats(Py_ssize_t d) noexcept nogil:
    """Floats of buffer per thread in forward: one widened row (a rare row's; the output
    overwrites it)."""
    return d


cdef inline Py_ssize_t backward_floats(Py_ssize_t d) noexcept nogil:
    """Floats of buffer per thread in backward: a rare group's dy rows (dx overwrites them)
    and its x rows."""
    return 2 * <Py_ssize_t>RN_GROUP * d


cdef inline void widen_params(float *wf, float *bf, const half *w, const half *b,
                              Py_ssize_t d) noexcept nogil:
    """wf, bf := w, b widened to float32 (exactly), each where present: 16-bit parameters
    for the mixed kernels, once per call (mixed_forward, mixed_backward: widened)."""
    if w != NULL:
        rn_to_float32(wf, w, d)
    if b != NULL:
        rn_to_float32(bf, b, d)


# --------------------------------------------------------------------------- forward

cdef inline void mixed_forward_row(bint layer, half *y, double *mean, double *rstd,
                                   const half *x, const float *w, const float *b,
                                   const half *wh, const half *bh, bint widened, Py_ssize_t d,
                                   double eps, int stream, Py_ssize_t ahead,
                                   float *buf) noexcept nogil:
    """One row; stream and ahead: the primitives' (stream 0, 1, or RN_STREAM_UNFENCED: the
    caller fences).  widened: w and b are the 16-bit parameters wh and bh widened (see
    mixed_forward), and a rare row takes the 16-bit kernel's careful path with wh and bh;
    else a rare row takes float32's on the widened row in buf."""
    cdef double m = 0.0, var
    mixed_moments(layer, &m, &var, x, d, ahead)
    mixed_forward_row_from(layer, y, mean, rstd, x, w, b, wh, bh, widened, d, eps, m, var,
                           stream, ahead, buf)


cdef inline void mixed_moments(bint layer, double *m, double *var, const half *x, Py_ssize_t d,
                               Py_ssize_t ahead) noexcept nogil:
    """A row's reductions: LayerNorm's moments (ln_moments), or RMSNorm's sum of squares
    (rn_sumsq, in var; m untouched)."""
    if layer:
        ln_moments(m, var, x, d, ahead)
    else:
        var[0] = rn_sumsq(x, d, ahead)


cdef inline void mixed_forward_row_from(bint layer, half *y, double *mean, double *rstd,
                                        const half *x, const float *w, const float *b,
                                        const half *wh, const half *bh, bint widened,
                                        Py_ssize_t d, double eps, double m, double var,
                                        int stream, Py_ssize_t ahead,
                                        float *buf) noexcept nogil:
    """mixed_forward_row given the row's reductions m, var (mixed_moments' bits)."""
    if not layer:
        rstd[0] = rms_rstd(x, d, eps, var)
        rn_rms_apply_mixed(y, x, w, rstd[0], d, stream, ahead)
    elif ln_stats(mean, rstd, x, m, var, d, eps):
        rn_ln_apply_mixed(y, x, w, b, m, rstd[0], d, stream, ahead)
    elif widened:
        layer_forward_row_stats(y, mean, rstd, x, wh, bh, d, eps, m, var, stream, 0)
    else:
        # float32's careful path on the widened row (the same moments)
        rn_to_float32(buf, x, d)
        layer_forward_row_stats(buf, mean, rstd, buf, w, b, d, eps, m, var, False, 0)
        rn_from_float32(y, buf, d, stream)


cdef inline void mixed_forward(bint layer, half *y, double *mean, double *rstd, const half *x,
                               const float *w, const float *b, const half *wh, const half *bh,
                               bint widened, Py_ssize_t n, Py_ssize_t d, double eps,
                               int n_threads, bint stream, float *buf) noexcept nogil:
    """y := round(norm(float32(x)) with w, b), row by row: what rms_forward (mean unused) or
    layer_forward of norm_kernels.pxd computes on the widened row.  y may be x.

    widened: the call's parameters are 16-bit, wh and bh, and w and b their exact float32
    copies (made once per call): then y is bitwise rms_forward / layer_forward of the 16-bit
    rows with wh and bh, whose apply passes widen the parameters at every row.  buf: unused
    when widened."""
    cdef Py_ssize_t t, per = forward_floats(d)
    if n_threads == 1:
        mixed_forward_rows(layer, y, mean, rstd, x, w, b, wh, bh, widened, 0, n, d, eps, stream,
                           buf if not widened else NULL)
    else:
        for t in prange(n_threads, schedule="static", num_threads=n_threads):
            mixed_forward_rows(layer, y, mean, rstd, x, w, b, wh, bh, widened,
                               first_row(t, n, n_threads), first_row(t + 1, n, n_threads), d,
                               eps, stream, buf + threadid() * per if not widened else NULL)


cdef inline void mixed_forward_rows(bint layer, half *y, double *mean, double *rstd,
                                    const half *x, const float *w, const float *b,
                                    const half *wh, const half *bh, bint widened,
                                    Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t d, double eps,
                                    bint stream, float *buf) noexcept nogil:
    """Rows lo .. hi of mixed_forward on one thread, as norm_kernels.pxd's rms_forward_rows
    and layer_forward_rows take theirs: the next row prefetched, rows up to
    PAIRED_ROW_BYTES two at a time (both rows' reductions before either apply pass: the
    same bits), streamed rows fenced once after the last."""
    cdef Py_ssize_t i = lo, pf = forward_prefetch(stream, d * <Py_ssize_t>sizeof(half))
    cdef int s = RN_STREAM_UNFENCED if stream else 0
    cdef double m0 = 0.0, m1 = 0.0, v0, v1
    if d * <Py_ssize_t>sizeof(half) <= PAIRED_ROW_BYTES:
        while i + 1 < hi:
            mixed_moments(layer, &m0, &v0, x + i * d, d, pf * (hi - 1 - i))
            mixed_moments(layer, &m1, &v1, x + (i + 1) * d, d, pf * (hi - 2 - i))
            mixed_forward_row_from(layer, y + i * d, &mean[i] if layer else NULL, &rstd[i],
                                   x + i * d, w, b, wh, bh, widened, d, eps, m0, v0, s,
                                   pf * (hi - 1 - i), buf)
            mixed_forward_row_from(layer, y + (i + 1) * d, &mean[i + 1] if layer else NULL,
                                   &rstd[i + 1], x + (i + 1) * d, w, b, wh, bh, widened, d,
                                   eps, m1, v1, s, pf * (hi - 2 - i), buf)
            i += 2
    for i in range(i, hi):
        mixed_forward_row(layer, y + i * d, &mean[i] if layer else NULL, &rstd[i], x + i * d,
                          w, b, wh, bh, widened, d, eps, s, pf * (hi - 1 - i), buf)
    if stream:
        rn_sfence()


# --------------------------------------------------------------------------- backward

cdef inline void mixed_backward_group(bint layer, half *dx, float *dw, float *db,
                                      double *dw_part, double *db_part, double *mean_g,
                                      double *m, const half *dy, const half *x, const float *w,
                                      const half *wh, const double *mean, const double *rstd,
                                      Py_ssize_t rows, Py_ssize_t d, bint stream,
                                      Py_ssize_t ahead, bint prefetch_dx,
                                      float *buf) noexcept nogil:
    """One group of up to RN_GROUP rows, as norm_kernels.pxd's rms_backward_group and
    layer_backward_group take theirs, with the mixed reductions and apply passes.  mean_g
    (LayerNorm only), m: the group's row reductions.  dw, db: the totals, for a group that
    is all the rows (as in norm_kernels.pxd's groups; NULL: none); dw_part, db_part then
    scratch.  ahead, prefetch_dx: as there.  dx may be dy.  wh: the 16-bit weight that w
    widens (see mixed_backward), whose kernel takes a LayerNorm group with a rare row; NULL:
    float32's kernel takes it, on the widened group."""
    cdef Py_ssize_t r
    cdef bint trusted = True
    if not layer:
        for r in range(rows):
            m[r] = rn_rms_bwd_dot_mixed(dy + r * d, x + r * d, w, rstd[r], d,
                                        ahead + rows - 1 - r) / d
        rn_rms_bwd_apply_rows_mixed(dx, dw, dw_part, dy, x, w, rstd, m, <int>rows, d, stream,
                                    ahead, prefetch_dx)
        return
    for r in range(rows):
        rn_ln_bwd_sums_mixed(&mean_g[r], &m[r], dy + r * d, x + r * d, w, mean[r], rstd[r], d,
                             ahead + rows - 1 - r)
        mean_g[r] = mean_g[r] / d
        m[r] = m[r] / d
        trusted = trusted and not _overflowed(mean_g[r], m[r], dy + r * d, x + r * d, d)
    if trusted:
        rn_ln_bwd_apply_rows_mixed(dx, dw, db, dw_part if dw == NULL else NULL,
                                   db_part if db == NULL else NULL, dy, x, w, mean, rstd,
                                   mean_g, m, <int>rows, d, stream, ahead, prefetch_dx)
    elif wh != NULL:
        # (the totals are never wanted here: see mixed_backward)
        layer_backward_group(dx, NULL, NULL, NULL, dw_part, db_part, mean_g, m, dy, NULL, x, wh,
                             mean, rstd, rows, d, stream, ahead, prefetch_dx)
    else:
        widened_backward_group(dx, dw, db, dw_part, db_part, mean_g, m, dy, x, w, mean, rstd,
                               rows, d, stream, buf)


cdef inline void widened_backward_group(half *dx, float *dw, float *db, double *dw_part,
                                        double *db_part, double *mean_g, double *m,
                                        const half *dy, const half *x, const float *w,
                                        const double *mean, const double *rstd,
                                        Py_ssize_t rows, Py_ssize_t d, bint stream,
                                        float *buf) noexcept nogil:
    """A LayerNorm group of mixed_backward_group with a row for float32's careful path:
    widened into buf (dy rows, then x rows), float32's layer_backward_group with dx written
    over the widened dy, then dx rounded."""
    cdef float *gdy = buf
    cdef float *gx = buf + <Py_ssize_t>RN_GROUP * d
    rn_to_float32(gdy, dy, rows * d)
    rn_to_float32(gx, x, rows * d)
    # (buf holds one group: no rows after it)
    layer_backward_group(gdy, NULL, dw, db, dw_part, db_part, mean_g, m, gdy, NULL, gx, w, mean,
                         rstd, rows, d, False, 0, False)
    rn_from_float32(dx, gdy, rows * d, stream)


cdef inline void mixed_backward_block(bint layer, half *dx, double *dw_part, double *db_part,
                                      double *red, Py_ssize_t n, const half *dy, const half *x,
                                      const float *w, const half *wh, const double *mean,
                                      const double *rstd, Py_ssize_t lo, Py_ssize_t hi,
                                      Py_ssize_t d, bint stream, float *buf) noexcept nogil:
    """Rows lo .. hi in groups of up to RN_GROUP rows from lo, as norm_kernels.pxd's
    *_backward_block, each through mixed_backward_group."""
    cdef Py_ssize_t i = lo, rows
    cdef bint pf_dx = backward_prefetch_dx(n, d * <Py_ssize_t>sizeof(half))
    zero_partials(dw_part, db_part, d)
    while i < hi:
        rows = min(<Py_ssize_t>RN_GROUP, hi - i)
        mixed_backward_group(layer, dx + i * d, NULL, NULL, dw_part, db_part, red + i,
                             red + n + i, dy + i * d, x + i * d, w, wh,
                             mean + i if layer else NULL, rstd + i, rows, d, stream,
                             n - i - rows, pf_dx, buf)
        i += rows


cdef inline void mixed_backward(bint layer, half *dx, void *dw, void *db, double *red,
                                double *dw_part, double *db_part, const half *dy,
                                const half *x, const float *w, const half *wh,
                                const double *mean, const double *rstd, Py_ssize_t n,
                                Py_ssize_t d, int n_threads, bint stream,
                                float *buf) noexcept nogil:
    """dx := round(the float32 norm backward of the widened dy and x); dw, db: its float32
    column sums (NULL: not wanted; else dw_part / db_part are (row_blocks(n), d) scratch).
    red: 2n doubles of scratch (the rows' reductions).  dx may be dy.

    wh: NULL, or the call's 16-bit weight, of which w is the exact float32 copy (made once
    per call; widened): then dw and db are of the 16-bit type, and everything is bitwise
    rms_backward / layer_backward of norm_kernels.pxd with that weight, whose passes widen
    it at every row (their dweight and dbias: the same float64 partials, narrowed once to
    the 16-bit type; the rows go in row blocks even where they are one group, whose totals
    have the same bits).  buf may then be NULL: a LayerNorm group with a rare row takes the
    16-bit kernel, on the rows themselves."""
    cdef Py_ssize_t nb = row_blocks(n), blk, per = backward_floats(d)
    cdef double *wpart
    cdef double *bpart
    cdef bint widened = wh != NULL
    if one_group(n, stream) and not widened:
        mixed_backward_group(layer, dx, <float *>dw, <float *>db,
                             dw_part if dw != NULL else NULL,
                             db_part if db != NULL else NULL, red, red + n, dy, x, w, NULL,
                             mean if layer else NULL, rstd, n, d, False, 0, False, buf)
        return
    if n_threads == 1:
        for blk in range(nb):
            mixed_backward_block(layer, dx, dw_part + blk * d if dw != NULL else NULL,
                                 db_part + blk * d if db != NULL else NULL, red, n, dy, x, w,
                                 wh, mean, rstd, blk * n // nb, (blk + 1) * n // nb, d,
                                 stream, buf)
    else:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            wpart = dw_part + blk * d if dw != NULL else NULL
            bpart = db_part + blk * d if db != NULL else NULL
            mixed_backward_block(layer, dx, wpart, bpart, red, n, dy, x, w, wh, mean, rstd,
                                 blk * n // nb, (blk + 1) * n // nb, d, stream,
                                 buf + threadid() * per if buf != NULL else NULL)
    if widened:
        if dw != NULL:
            sum_partials(<half *>dw, dw_part, nb, d, n_threads)
        if db != NULL:
            sum_partials(<half *>db, db_part, nb, d, n_threads)
    else:
        if dw != NULL:
            sum_partials(<float *>dw, dw_part, nb, d, n_threads)
        if db != NULL:
            sum_partials(<float *>db, db_part, nb, d, n_threads)
