# The norms of 16-bit rows (float16, bfloat16) with float32 parameters: torch's mixed
# precision, where a norm module keeps float32 weight and bias and receives the half-precision
# output of a layer before it (torch.autocast).
#
# Each row (a group of RN_GROUP rows in backward) is widened to float32 in this thread's
# buffer, exactly; the float32 kernels of norm_kernels.pxd run on the buffer; each output row
# is rounded once to the 16-bit type.  So the result is by definition the float32 norm of the
# widened input with one rounding per output element: the same statistics, the same rare-row
# paths and the same dweight/dbias partial rows as float32 (float64 partials in fixed row
# blocks, then float32), bitwise reproducible for any thread count.  Memory sees 16-bit rows;
# the widened copies stay in this thread's cache, and the rounded rows are stored streaming
# (non-temporal) when the caller asks, as the other kernels store theirs.
#
# buf: per thread, forward_floats(d) (forward) or backward_floats(d) (backward) floats, at
# buf + threadid() * that; the caller's scratch.  Names as in norm_kernels.pxd.
from cython.parallel cimport prange, threadid

from common cimport (RN_GROUP, RN_STREAM_UNFENCED, first_row, rn_sfence, row_blocks,
                     sum_partials, zero_partials)
from norm_kernels cimport (layer_backward_group, layer_forward_row, one_group,
                          rms_backward_group, rms_forward_row)
from primitives cimport rn_bf16, rn_f16, rn_from_float32, rn_to_float32


ctypedef fused half:
    rn_bf16
    rn_f16


cdef inline Py_ssize_t forward_floats(Py_ssize_t d) noexcept nogil:
    """Floats of buffer per thread in forward: one widened row (the output overwrites it)."""
    return d


cdef inline Py_ssize_t backward_floats(Py_ssize_t d) noexcept nogil:
    """Floats of buffer per thread in backward: a group's dy rows (dx overwrites them) and
    its x rows."""
    return 2 * <Py_ssize_t>RN_GROUP * d


# --------------------------------------------------------------------------- forward

cdef inline void mixed_forward_row(bint layer, half *y, double *mean, double *rstd,
                                   const half *x, const float *w, const float *b, Py_ssize_t d,
                                   double eps, int stream, float *buf) noexcept nogil:
    """One row; stream: rn_from_float32's (0, 1, or RN_STREAM_UNFENCED: the caller fences)."""
    rn_to_float32(buf, x, d)
    if layer:
        layer_forward_row(buf, mean, rstd, buf, w, b, d, eps, False, 0)   # (buf: one row)
    else:
        rms_forward_row(buf, rstd, buf, w, d, eps, False, 0)
    rn_from_float32(y, buf, d, stream)


cdef inline void mixed_forward(bint layer, half *y, double *mean, double *rstd, const half *x,
                               const float *w, const float *b, Py_ssize_t n, Py_ssize_t d,
                               double eps, int n_threads, bint stream,
                               float *buf) noexcept nogil:
    """y := round(norm(float32(x)) with w, b), row by row: rms_forward (mean unused) or
    layer_forward of norm_kernels.pxd on the widened row.  y may be x."""
    cdef Py_ssize_t t, per = forward_floats(d)
    if n_threads == 1:
        mixed_forward_rows(layer, y, mean, rstd, x, w, b, 0, n, d, eps, stream, buf)
    else:
        for t in prange(n_threads, schedule="static", num_threads=n_threads):
            mixed_forward_rows(layer, y, mean, rstd, x, w, b, first_row(t, n, n_threads),
                               first_row(t + 1, n, n_threads), d, eps, stream,
                               buf + threadid() * per)


cdef inline void mixed_forward_rows(bint layer, half *y, double *mean, double *rstd,
                                    const half *x, const float *w, const float *b,
                                    Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t d, double eps,
                                    bint stream, float *buf) noexcept nogil:
    """Rows lo .. hi of mixed_forward on one thread, streamed rows fenced once after the
    last (as norm_kernels.pxd's rms_forward_rows)."""
    cdef Py_ssize_t i
    for i in range(lo, hi):
        mixed_forward_row(layer, y + i * d, &mean[i] if layer else NULL, &rstd[i], x + i * d,
                          w, b, d, eps, RN_STREAM_UNFENCED if stream else 0, buf)
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
