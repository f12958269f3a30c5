# The norms of 16-bit rows (float16, bfloat16) with float32 parameters: torch's mixed
# precision, where a norm module keeps float32 weight and bias and receives the half-precision
# output of a layer before it (torch.autocast).
#
# The result is by definition the float32 norm of the widened input with one rounding per
# output element: the same statistics, the same rare-row paths and the same dweight/dbias
# partial rows as float32 (float64 partials in fixed row blocks, then float32), bitwise
# reproducible for any thread count.  Forward reads the 16-bit row itself: the reductions
# widen every element exactly into the same double lanes as float32's (so their bits are
# the widened row's), and the mixed apply passes do float32's arithmetic on the widened
# lanes, then round.  Backward, and a rare forward row, widen the row (a group of RN_GROUP
# rows in backward) to float32 in this thread's buffer, exactly, run the float32 kernels of
# norm_kernels.pxd on the buffer and round each output row once to the 16-bit type.
# Memory sees 16-bit rows; the widened copies stay in this thread's cache, and the rounded
# rows are stored streaming (non-temporal) when the caller asks, as the other kernels store
# theirs.
#
# buf: per thread, forward_floats(d) (forward) or backward_floats(d) (backward) floats, at
# buf + threadid() * that; the caller's scratch.  Names as in norm_kernels.pxd.
from cython.parallel cimport prange, threadid

from common cimport (RN_GROUP, RN_STREAM_UNFENCED, first_row, rn_sfence, row_blocks,
                     sum_partials, zero_partials)
from norm_kernels cimport (PAIRED_ROW_BYTES, forward_prefetch, layer_backward_group,
                          layer_forward_row_stats, ln_moments, ln_stats, one_group,
                          rms_backward_group, rms_rstd)
from primitives cimport (half, rn_from_float32, rn_ln_apply_mixed, rn_rms_apply_mixed,
                         rn_sumsq, rn_to_float32)


cdef inline Py_ssize_t forward_floats(Py_ssize_t d) noexcept nogil:
    """Floats of buffer per thread in forward: one widened row (a rare row's; the output
    overwrites it)."""
    return d


cdef inline Py_ssize_t backward_floats(Py_ssize_t d) noexcept nogil:
    """Floats of buffer per thread in backward: a group's dy rows (dx overwrites them) and
    its x rows."""
    return 2 * <Py_ssize_t>RN_GROUP * d


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
                           buf)
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
                                      const double *mean, const double *rstd, Py_ssize_t rows,
                                      Py_ssize_t d, bint stream, float *buf) noexcept nogil:
    """One group of up to RN_GROUP rows: widened into buf (dy rows, then x rows), the
    float32 backward group of norm_kernels.pxd with dx written over the widened dy, then dx
    rounded.  mean_g (LayerNorm only), m: the group's row reductions.  dw, db: the totals,
    for a group that is all the rows (as in norm_kernels.pxd's groups; NULL: none)."""
    cdef float *gdy = buf
    cdef float *gx = buf + <Py_ssize_t>RN_GROUP * d
    rn_to_float32(gdy, dy, rows * d)
    rn_to_float32(gx, x, rows * d)
    if layer:
        # (buf holds one group: no rows after it)
        layer_backward_group(gdy, NULL, dw, db, dw_part, db_part, mean_g, m, gdy, NULL, gx, w,
                             mean, rstd, rows, d, False, 0, False)
    else:
        rms_backward_group(gdy, NULL, dw, dw_part, m, gdy, NULL, gx, w, rstd, rows, d, False, 0,
                           False)
    rn_from_float32(dx, gdy, rows * d, stream)


cdef inline void mixed_backward_block(bint layer, half *dx, double *dw_part, double *db_part,
                                      double *red, Py_ssize_t n, const half *dy, const half *x,
                                      const float *w, const double *mean, const double *rstd,
                                      Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t d,
                                      bint stream, float *buf) noexcept nogil:
    """Rows lo .. hi in groups of up to RN_GROUP rows from lo, as norm_kernels.pxd's
    *_backward_block, each through mixed_backward_group."""
    cdef Py_ssize_t i = lo, rows
    zero_partials(dw_part, db_part, d)
    while i < hi:
        rows = min(<Py_ssize_t>RN_GROUP, hi - i)
        mixed_backward_group(layer, dx + i * d, NULL, NULL, dw_part, db_part, red + i,
                             red + n + i, dy + i * d, x + i * d, w,
                             mean + i if layer else NULL, rstd + i, rows, d, stream, buf)
        i += rows


cdef inline void mixed_backward(bint layer, half *dx, float *dw, float *db, double *red,
                                double *dw_part, double *db_part, const half *dy,
                                const half *x, const float *w, const double *mean,
                                const double *rstd, Py_ssize_t n, Py_ssize_t d, int n_threads,
                                bint stream, float *buf) noexcept nogil:
    """dx := round(the float32 norm backward of the widened dy and x); dw, db: its float32
    column sums (NULL: not wanted; else dw_part / db_part are (row_blocks(n), d) scratch).
    red: 2n doubles of scratch (the rows' reductions).  dx may be dy."""
    cdef Py_ssize_t nb = row_blocks(n), blk, per = backward_floats(d)
    cdef double *wpart
    cdef double *bpart
    if one_group(n, stream):
        mixed_backward_group(layer, dx, dw, db, dw_part if dw != NULL else NULL,
                             db_part if db != NULL else NULL, red, red + n, dy, x, w,
                             mean if layer else NULL, rstd, n, d, False, buf)
        return
    if n_threads == 1:
        for blk in range(nb):
            mixed_backward_block(layer, dx, dw_part + blk * d if dw != NULL else NULL,
                                 db_part + blk * d if db != NULL else NULL, red, n, dy, x, w,
                                 mean, rstd, blk * n // nb, (blk + 1) * n // nb, d, stream,
                                 buf)
    else:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            wpart = dw_part + blk * d if dw != NULL else NULL
            bpart = db_part + blk * d if db != NULL else NULL
            mixed_backward_block(layer, dx, wpart, bpart, red, n, dy, x, w, mean, rstd,
                                 blk * n // nb, (blk + 1) * n // nb, d, stream,
                                 buf + threadid() * per)
    if dw != NULL:
        sum_partials(dw, dw_part, nb, d, n_threads)
    if db != NULL:
        sum_partials(db, db_part, nb, d, n_threads)
