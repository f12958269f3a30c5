# RMSNorm and LayerNorm kernels, forward and backward, over N rows of D contiguous elements.
#
# Outputs come first, then inputs, then sizes; every pointer is to C-contiguous data; scratch
# is the caller's (api.pyx lends it).  The kernels do not validate and do not allocate.
#
# Rows run in parallel (OpenMP, GIL released); one thread runs a plain loop, so a small call
# starts no parallel region at all.  Every row statistic is a double-precision reduction
# with a fixed lane order (resnorm_c/core/reduce.h), so results are bitwise identical for
# any thread count.  dweight/dbias sum over rows: each block of rows (common.row_blocks, a
# function of N only) writes its own partial row, and the partials are added in block order.
#
# Row helpers take `ahead`, the rows that follow theirs in the arrays (the primitives
# prefetch the next row only when there is one; see resnorm_c/primitives.py); the forward
# passes (and the fused add + norm forward's) give 0 where they leave prefetching to the
# CPU (forward_prefetch).
#
# Names follow docs/rms_norm.md and docs/layer_norm.md: x (N, D) rows, w weight, b bias,
# y output; rstd = 1/sqrt(ms + eps) per row, xn = x*rstd, xhat = (x - mean)*rstd,
# g = dy*w, m = mean(g*xn), mean_g = mean(g), mean_gxhat = mean(g*xhat).
from cython.parallel cimport prange
from libc.math cimport isfinite, sqrt
from libc.string cimport memset

from common cimport (RN_GROUP, RN_STREAM_UNFENCED, at, first_row, rn_sfence, row_blocks,
                     sum_partials, zero_partials)
from primitives cimport (element, rn_sum, rn_sumsq, rn_sumsqdev, rn_shifted_sums,
                         rn_rms_bwd_dot, rn_ln_bwd_sums, rn_rms_apply, rn_ln_apply,
                         rn_rms_bwd_apply_rows, rn_ln_bwd_apply_rows, rn_rms_bwd_row_carry,
                         rn_ln_bwd_row_carry, rn_carry_flush, rn_residual_bwd)
# the scalar paths for the few rows the fast paths cannot take (see rare_rows.pxd)
from rare_rows cimport (_rms_rstd_rescaled, _ln_stats_trusted, _ln_forward_careful,
                        _ln_backward_careful, _overflowed)


cdef enum:
    PAIRED_ROW_BYTES = 2048   # the norms' forward takes rows up to this size two at a time
    PREFETCHED_STREAMED_ROW_BYTES = 8192   # see forward_prefetch
    PREFETCHED_DX_ROW_BYTES = 4096   # see backward_prefetch_dx
    PREFETCHED_DX_MIN_BYTES = 1 << 20
    CARRY_DOUBLES = 4096   # the longest carried row of sums, in doubles (32 KiB, on the
                           # stack of a row block)


cdef inline Py_ssize_t forward_prefetch(bint stream, Py_ssize_t row_bytes) noexcept nogil:
    """1 when the norms' forward passes, and the streamed reductions of the fused
    add + norm forward (add_norm_kernels.pxd), prefetch each next row (the primitives'
    `ahead` is then the rows after this one), 0 when they leave it to the CPU's own
    prefetchers: streamed rows (outputs of 8 MiB and more, read from memory) shorter than
    PREFETCHED_STREAMED_ROW_BYTES, which those prefetchers fetch in time, where the
    software prefetches only add instructions; longer rows, and rows from cache, are
    fetched faster with them.  The backward passes keep their prefetch of the next group
    of rows at every width.  (Measurements: benchmarks/TUNING.md.)"""
    return 0 if stream and row_bytes < PREFETCHED_STREAMED_ROW_BYTES else 1


cdef inline bint backward_prefetch_dx(Py_ssize_t n, Py_ssize_t row_bytes) noexcept nogil:
    """Whether the norms' backward passes prefetch the next group's rows of dx (unless they
    stream them), as they do its rows of dy and x (so does the fused add + norm backward,
    of dx and dresidual, where its norm pass writes both): for rows up to
    PREFETCHED_DX_ROW_BYTES in a dx of PREFETCHED_DX_MIN_BYTES or more.  A group's apply
    pass stores to RN_GROUP rows at once, streams too short, at such widths, for the CPU's
    prefetchers to fetch the lines of an output not in cache before the stores need them.
    Smaller outputs stay in cache, where the prefetches only cost; longer rows are long
    enough streams.  (Measurements: benchmarks/TUNING.md.)"""
    return row_bytes <= PREFETCHED_DX_ROW_BYTES and n * row_bytes >= PREFETCHED_DX_MIN_BYTES


cdef inline bint one_group(Py_ssize_t n, bint stream) noexcept nogil:
    """Whether the backward passes (the norms' and the fused add + norm's) take all n rows
    as one group and write the sums over rows (dweight, dbias) from it, rounded once,
    instead of adding them into a zeroed partial row per row block and narrowing the
    partials' total (the same bits: core/backward.h, put_total): calls of 1 to RN_GROUP rows
    not streamed (a group's streamed rows take the chunked pass, whose sums go through
    memory).  Those two passes over float64 rows of D weighed most where D is large and the
    rows few: small calls took up to twice the time with them (benchmarks/TUNING.md)."""
    return 0 < n <= RN_GROUP and not stream


cdef inline bint carried(const element *x, Py_ssize_t d) noexcept nogil:
    """Whether the backward passes (the norms' and the fused add + norm's, over row blocks)
    take their rows in runs of RN_GROUP rows (from the block's first row), each run's
    reductions, then each row's apply pass alone, with the sums over rows (dweight, dbias)
    carried in the row's type over the run and then added, widened, into the float64
    partial row (core/backward.h): float and double rows of up to CARRY_DOUBLES doubles.
    The sums are formed exactly as the groups of rows form them (rms_backward_group), so
    the bits are the same; the groups' column-by-column apply pass, which moves a group's
    rows of every array at once, took up to twice the time (benchmarks/TUNING.md).  Carried
    over 16 rows, float32's dweight was less accurate than torch's.  The 16-bit rows keep
    their groups, as do longer rows, whose carried sums would not fit the block's stack."""
    return ((element is float or element is double)
            and d * <Py_ssize_t>sizeof(element) <= CARRY_DOUBLES * <Py_ssize_t>sizeof(double))


cdef inline void carry_start(element *cw, element *cb, Py_ssize_t d) noexcept nogil:
    """The carried sums cw and cb (NULL: none) start at zero, before a block's first row."""
    if cw != NULL:
        memset(cw, 0, d * sizeof(element))
    if cb != NULL:
        memset(cb, 0, d * sizeof(element))


cdef inline void rms_backward_run(element *dx, element *dx2, element *cw, double *dw_part,
                                  double *m, const element *dy, const element *dh,
                                  const element *x, const element *w, const double *rstd,
                                  Py_ssize_t rows, Py_ssize_t d,
                                  Py_ssize_t ahead) noexcept nogil:
    """`rows` (<= RN_GROUP) consecutive carried rows of rms_backward (see carried): each
    row's reduction m[r] = mean(g * xn), then each row's apply pass, its dweight terms
    added into cw (NULL: none), which then goes into dw_part.  dx2, dh and ahead as in
    rms_backward_group."""
    cdef Py_ssize_t r
    if element is float or element is double:
        for r in range(rows):
            m[r] = rn_rms_bwd_dot(dy + r * d, x + r * d, w, rstd[r], d,
                                  ahead + rows - 1 - r) / d
        for r in range(rows):
            rn_rms_bwd_row_carry(dx + r * d, at(dx2, r * d), cw, dy + r * d, at(dh, r * d),
                                 x + r * d, w, rstd[r], m[r], d)
        rn_carry_flush(dw_part, cw, d)


cdef inline void layer_backward_run(element *dx, element *dx2, element *cw, element *cb,
                                    double *dw_part, double *db_part, double *mean_g,
                                    double *mean_gxhat, const element *dy, const element *dh,
                                    const element *x, const element *w, const double *mean,
                                    const double *rstd, Py_ssize_t rows, Py_ssize_t d,
                                    Py_ssize_t ahead) noexcept nogil:
    """`rows` (<= RN_GROUP) consecutive carried rows of layer_backward, as
    rms_backward_run, its dweight and dbias terms carried in cw and cb.  A run with a row
    whose reductions overflowed goes row by row, as layer_backward_group does: that row
    through the scalar path (which adds its terms into dw_part and db_part), every other
    row's terms added alone."""
    cdef Py_ssize_t r
    cdef bint trusted = True
    if element is float or element is double:
        for r in range(rows):
            # two reductions in one pass: sum(g) and sum(g * xhat)
            rn_ln_bwd_sums(&mean_g[r], &mean_gxhat[r], dy + r * d, x + r * d, w, mean[r],
                           rstd[r], d, ahead + rows - 1 - r)
            mean_g[r] = mean_g[r] / d
            mean_gxhat[r] = mean_gxhat[r] / d
            trusted = trusted and not _overflowed(mean_g[r], mean_gxhat[r], dy + r * d,
                                                  x + r * d, d)
        for r in range(rows):
            if trusted or not _overflowed(mean_g[r], mean_gxhat[r], dy + r * d, x + r * d,
                                          d):
                rn_ln_bwd_row_carry(dx + r * d, at(dx2, r * d), cw, cb, dy + r * d,
                                    at(dh, r * d), x + r * d, w, mean[r], rstd[r], mean_g[r],
                                    mean_gxhat[r], d)
            else:
                _ln_backward_careful(dx + r * d, dw_part, db_part, dy + r * d, x + r * d, w,
                                     mean[r], rstd[r], d)
                if dx2 != NULL:   # dh added (dx in place) and dx2 written, as the apply pass
                    rn_residual_bwd(dx + r * d, dx2 + r * d, NULL, dx + r * d, at(dh, r * d),
                                    NULL, NULL, NULL, 0, 1.0, d, False, 0)
            if not trusted or r == rows - 1:
                rn_carry_flush(dw_part, cw, d)
                rn_carry_flush(db_part, cb, d)


# --------------------------------------------------------------------------- RMSNorm

cdef inline void rms_forward_row(element *y, double *rstd, const element *x, const element *w,
                                 Py_ssize_t d, double eps, int stream,
                                 Py_ssize_t ahead) noexcept nogil:
    # one reduction: the sum of squares, accumulated in double
    rms_forward_row_from(y, rstd, x, w, d, eps, rn_sumsq(x, d, ahead), stream, ahead)


cdef inline void rms_forward_row_from(element *y, double *rstd, const element *x,
                                      const element *w, Py_ssize_t d, double eps, double sumsq,
                                      int stream, Py_ssize_t ahead) noexcept nogil:
    """rms_forward_row given the row's sum of squares (rn_sumsq's bits).  stream: the
    primitives' (0, 1, or RN_STREAM_UNFENCED: the caller fences)."""
    rstd[0] = rms_rstd(x, d, eps, sumsq)
    rn_rms_apply(y, x, w, rstd[0], d, stream, ahead)


cdef inline double rms_rstd(const element *x, Py_ssize_t d, double eps,
                            double sumsq) noexcept nogil:
    """rstd = 1/sqrt(mean(x^2) + eps) of a row from its sum of squares (rn_sumsq's bits)."""
    if element is double and not isfinite(sumsq):
        # |x| beyond ~1e154 squares past the double range (float32 rows cannot)
        return _rms_rstd_rescaled(x, d, eps)
    return 1.0 / sqrt(sumsq / d + eps)


cdef inline void rms_forward(element *y, double *rstd, const element *x, const element *w,
                             Py_ssize_t n, Py_ssize_t d, double eps, int n_threads,
                             bint stream) noexcept nogil:
    """y := x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps), per row (w NULL: 1).  y may be x.
    NumPy reference: resnorm.reference.rms_norm_forward."""
    cdef Py_ssize_t t
    if n_threads == 1:
        rms_forward_rows(y, rstd, x, w, 0, n, n, d, eps, stream)
    else:
        for t in prange(n_threads, schedule="static", num_threads=n_threads):
            rms_forward_rows(y, rstd, x, w, first_row(t, n, n_threads),
                             first_row(t + 1, n, n_threads), n, d, eps, stream)


cdef inline void rms_forward_rows(element *y, double *rstd, const element *x, const element *w,
                                  Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n, Py_ssize_t d,
                                  double eps, bint stream) noexcept nogil:
    """Rows lo .. hi (of n) of rms_forward on one thread.  Streamed rows are fenced once,
    after the last: a fence after each row waited for its lines to reach memory, and at
    D = 256 the streamed call took twice the time of an unstreamed one.

    Short rows go two at a time, as in layer_forward_rows: both sums of squares, then each
    row's rstd and apply pass, so the other row's work fills the wait on a row's sqrt and
    division; the same bits.  float32, one thread, against one row at a time: (65536, 256)
    0.78 of the time back to back, 0.85 in the benchmark; rows of 3 KiB, (2048, 768), took
    1.25x in the benchmark (which runs other libraries between calls), hence only rows up
    to PAIRED_ROW_BYTES."""
    cdef Py_ssize_t i = lo, pf = forward_prefetch(stream, d * <Py_ssize_t>sizeof(element))
    cdef int s = RN_STREAM_UNFENCED if stream else 0
    cdef double s0, s1
    if d * <Py_ssize_t>sizeof(element) <= PAIRED_ROW_BYTES:
        while i + 1 < hi:
            s0 = rn_sumsq(x + i * d, d, pf * (n - 1 - i))
            s1 = rn_sumsq(x + (i + 1) * d, d, pf * (n - 2 - i))
            rms_forward_row_from(y + i * d, &rstd[i], x + i * d, w, d, eps, s0, s,
                                 pf * (n - 1 - i))
            rms_forward_row_from(y + (i + 1) * d, &rstd[i + 1], x + (i + 1) * d, w, d, eps,
                                 s1, s, pf * (n - 2 - i))
            i += 2
    for i in range(i, hi):
        rms_forward_row(y + i * d, &rstd[i], x + i * d, w, d, eps, s, pf * (n - 1 - i))
    if stream:
        rn_sfence()


cdef inline void rms_backward_group(element *dx, element *dx2, element *dw, double *dw_part,
                                    double *m, const element *dy, const element *dh,
                                    const element *x, const element *w, const double *rstd,
                                    Py_ssize_t rows, Py_ssize_t d, bint stream,
                                    Py_ssize_t ahead, bint prefetch_dx) noexcept nogil:
    """`rows` (<= RN_GROUP) consecutive rows of rms_backward, adding their dweight terms
    into dw_part (NULL: none): first each row's reduction m[r] = mean(g * xn), then one
    elementwise pass over the group (core/backward.h).  dw (NULL: none) is for a group that
    is all the rows of a call (see one_group): the dweight sums are written there instead,
    rounded once.  dx may be dy or x.  dh (NULL: none)
    is added to dx, and dx2 (NULL: none) receives dx too: the fused backward's gradients of
    a plain residual add (float and double rows only, core/backward.h says why); dx2 may be
    x (the fused Post-Norm backward recomputes h there).  ahead: the rows after the group;
    prefetch_dx: dx's rows go on as dy's do, and its next group is prefetched
    (backward_prefetch_dx; False when dx is a scratch group)."""
    cdef Py_ssize_t r
    for r in range(rows):
        m[r] = rn_rms_bwd_dot(dy + r * d, x + r * d, w, rstd[r], d, ahead + rows - 1 - r) / d
    rn_rms_bwd_apply_rows(dx, dx2, dw, dw_part, dy, dh, x, w, rstd, m, <int>rows, d, stream,
                          ahead, prefetch_dx)


cdef inline void rms_backward_block(element *dx, double *dw_part, double *m, const element *dy,
                                    const element *x, const element *w, const double *rstd,
                                    Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n, Py_ssize_t d,
                                    bint stream) noexcept nogil:
    """Rows lo .. hi (of n) of rms_backward in runs (see carried) or groups of up to
    RN_GROUP rows (both start at lo), adding their dweight terms into this block's partial
    row (dw_part NULL: none)."""
    cdef Py_ssize_t i = lo, rows
    cdef bint pf_dx = backward_prefetch_dx(n, d * <Py_ssize_t>sizeof(element))
    cdef double carry[CARRY_DOUBLES]
    cdef element *cw = <element *>carry if dw_part != NULL else NULL
    zero_partials(dw_part, NULL, d)
    if carried(x, d):
        carry_start(cw, NULL, d)
        while i < hi:
            rows = min(<Py_ssize_t>RN_GROUP, hi - i)
            rms_backward_run(dx + i * d, NULL, cw, dw_part, m + i, dy + i * d, NULL, x + i * d,
                             w, rstd + i, rows, d, n - i - rows)
            i += rows
        return
    while i < hi:
        rows = min(<Py_ssize_t>RN_GROUP, hi - i)
        rms_backward_group(dx + i * d, NULL, NULL, dw_part, m + i, dy + i * d, NULL, x + i * d,
                           w, rstd + i, rows, d, stream, n - i - rows, pf_dx)
        i += rows


cdef inline void rms_backward(element *dx, element *dw, double *m, double *dw_part,
                              const element *dy, const element *x, const element *w,
                              const double *rstd, Py_ssize_t n, Py_ssize_t d, int n_threads,
                              bint stream) noexcept nogil:
    """dx := rstd * (g - xn * m),  m = mean(g * xn);   dw := sum_rows dy * xn.

    (The same as rstd * (g - x * rstd^2 * mean(g*x)), written with the normalised xn so no
    product can overflow where the result would not.)  Forward: y = x*rstd*w.
    dw NULL: not wanted (w NULL means w = 1); else dw_part is (row_blocks(n), d) scratch.
    m: n doubles of scratch.  dx may be dy.  NumPy reference: resnorm.reference.rms_norm_backward.
    """
    cdef Py_ssize_t nb = row_blocks(n), blk
    cdef double *part
    if one_group(n, stream):
        rms_backward_group(dx, NULL, dw, NULL, m, dy, NULL, x, w, rstd, n, d, False, 0, False)
        return
    if n_threads == 1:
        for blk in range(nb):
            rms_backward_block(dx, dw_part + blk * d if dw != NULL else NULL, m, dy, x, w, rstd,
                               blk * n // nb, (blk + 1) * n // nb, n, d, stream)
    else:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            part = dw_part + blk * d if dw != NULL else NULL
            rms_backward_block(dx, part, m, dy, x, w, rstd, blk * n // nb, (blk + 1) * n // nb,
                               n, d, stream)
    if dw != NULL:
        sum_partials(dw, dw_part, nb, d, n_threads)


# --------------------------------------------------------------------------- LayerNorm

cdef inline void layer_forward_row(element *y, double *mean, double *rstd, const element *x,
                                   const element *w, const element *b, Py_ssize_t d,
                                   double eps, int stream, Py_ssize_t ahead) noexcept nogil:
    # the row's mean and variance (one reduction pass, two where the shift is far), then
    # the apply pass
    cdef double m, var
    ln_moments(&m, &var, x, d, ahead)
    layer_forward_row_stats(y, mean, rstd, x, w, b, d, eps, m, var, stream, ahead)


cdef inline bint shifted_moments(double *mean, double *var, const double *sums,
                                 Py_ssize_t d, bint float_lanes) noexcept nogil:
    """mean and var of a row from its shifted sums (c, sum(x - c), sum((x - c)^2)):
    mean = c + dm,  var = mean((x - c)^2) - dm^2,  dm = mean(x - c), when c lies within
    half a standard deviation of the mean (dm^2 <= var / 4) and the float lanes of
    rn_shifted_sums held the squares (below); else False, and the caller takes the two-pass
    statistics (sum, then sumsqdev about the mean, in double).

    In one pass over the row, where the two-pass statistics read it twice: the LayerNorm
    forward's second pass was compute that the memory traffic did not hide.  Why the
    bound: with g the relative error bound of a sum of the lanes (core/reduce.h; float
    lanes: about 16 float roundings, 2**-20, at worst, far less in practice), the
    second sum carries at most g * (var + dm^2) and dm^2 at most 2 g |dm| sqrt(var + dm^2),
    so var's rounding error is at most (1.25 + 1.12) g var with dm^2 <= var / 4: 2.4 times
    the two-pass bound, g var.  A shift c far from the mean (the row's first 32 elements
    unlike the rest) would scale it by dm^2 / var, hence the two-pass rows.  A row holding
    inf or NaN fails the test too.

    float_lanes: the sums of float and 16-bit rows, taken in float lanes.  A square past
    FLT_MAX (|x - c| > 1.8e19) makes the sum inf, and squares under FLT_MIN (a mean
    square under 2**-100, every |x - c| under about 1e-15) lose their precision in the
    subnormals: both rows take the two-pass statistics.  A sum of exactly 0 (a constant
    row, every x - c = 0) is exact."""
    cdef double dm = sums[1] / d
    mean[0] = sums[0] + dm
    var[0] = sums[2] / d - dm * dm
    if float_lanes and not (isfinite(sums[2]) and
                            (sums[2] == 0.0 or sums[2] >= d * 7.888609052210118e-31)):  # 2**-100
        return False
    return 4.0 * (dm * dm) <= var[0]


cdef inline void ln_moments(double *mean, double *var, const element *x, Py_ssize_t d,
                            Py_ssize_t ahead) noexcept nogil:
    """A LayerNorm row's mean and (biased) variance: in one pass about the shift c of
    rn_shifted_sums (see shifted_moments), or two-pass where c is far from the mean."""
    cdef double sums[3]
    rn_shifted_sums(sums, x, d, ahead)
    ln_moments_from(mean, var, sums, x, d)


cdef inline void ln_moments_from(double *mean, double *var, const double *sums,
                                 const element *x, Py_ssize_t d) noexcept nogil:
    """ln_moments given the row's shifted sums (rn_shifted_sums' bits)."""
    if not shifted_moments(mean, var, sums, d, element is not double):
        mean[0] = rn_sum(x, d, 0) / d
        var[0] = rn_sumsqdev(x, d, mean[0]) / d


cdef inline void layer_forward_row_stats(element *y, double *mean, double *rstd,
                                         const element *x, const element *w, const element *b,
                                         Py_ssize_t d, double eps, double m, double var,
                                         int stream, Py_ssize_t ahead) noexcept nogil:
    """layer_forward_row given the row's mean m and variance var (the reductions' bits)."""
    if ln_stats(mean, rstd, x, m, var, d, eps):
        rn_ln_apply(y, x, w, b, m, rstd[0], d, stream, ahead)
    else:
        _ln_forward_careful(y, mean, rstd, x, w, b, var, eps, d, stream)


cdef inline bint ln_stats(double *mean, double *rstd, const element *x, double m, double var,
                          Py_ssize_t d, double eps) noexcept nogil:
    """A LayerNorm row's mean = m and rstd = 1/sqrt(var + eps) from its moments: True when
    the apply pass takes them; False (rstd not set) for a row _ln_forward_careful must see."""
    mean[0] = m
    if not _ln_stats_trusted(x, m, var, d):
        return False
    rstd[0] = 1.0 / sqrt(var + eps)
    return True


cdef inline void layer_forward(element *y, double *mean, double *rstd, const element *x,
                               const element *w, const element *b, Py_ssize_t n, Py_ssize_t d,
                               double eps, int n_threads, bint stream) noexcept nogil:
    """y := (x - mean) * rstd * w + b,  mean = mean(x),  rstd = 1/sqrt(mean((x-mean)^2) + eps).

    Statistics about a shift near the row's mean (ln_moments: float lanes finished in
    double for float and 16-bit rows, double for double rows), never
    E[x^2] - E[x]^2, so a large mean (1e4 + N(0,1) in float32) costs no precision.
    w and b may be NULL, independently.  y may be x.
    NumPy reference: resnorm.reference.layer_norm_forward.
    """
    cdef Py_ssize_t t
    if n_threads == 1:
        layer_forward_rows(y, mean, rstd, x, w, b, 0, n, n, d, eps, stream)
    else:
        for t in prange(n_threads, schedule="static", num_threads=n_threads):
            layer_forward_rows(y, mean, rstd, x, w, b, first_row(t, n, n_threads),
                               first_row(t + 1, n, n_threads), n, d, eps, stream)


cdef inline void layer_forward_rows(element *y, double *mean, double *rstd, const element *x,
                                    const element *w, const element *b, Py_ssize_t lo,
                                    Py_ssize_t hi, Py_ssize_t n, Py_ssize_t d, double eps,
                                    bint stream) noexcept nogil:
    """Rows lo .. hi (of n) of layer_forward on one thread, fenced as in rms_forward_rows.

    Short rows go two at a time, both rows' reductions (ln_moments) before either apply
    pass: a row's apply pass waits on its statistics (the sums' folds, division, sqrt), and
    the other row's reduction fills that wait.  Each row is computed as alone, so the bits
    are the same.  float32, one thread, against one row at a time: (65536, 256) and
    (4096, 128) 0.87 of the time, (32768, 512) 0.93 (the two-pass statistics gained more:
    0.78 at (65536, 256), 0.49 in float64); rows of 8 KiB read from memory took 1.1x,
    hence only rows up to PAIRED_ROW_BYTES."""
    cdef Py_ssize_t i = lo, pf = forward_prefetch(stream, d * <Py_ssize_t>sizeof(element))
    cdef int s = RN_STREAM_UNFENCED if stream else 0
    cdef double m0, m1, v0, v1
    if d * <Py_ssize_t>sizeof(element) <= PAIRED_ROW_BYTES:
        while i + 1 < hi:
            ln_moments(&m0, &v0, x + i * d, d, pf * (n - 1 - i))
            ln_moments(&m1, &v1, x + (i + 1) * d, d, pf * (n - 2 - i))
            layer_forward_row_stats(y + i * d, &mean[i], &rstd[i], x + i * d, w, b, d, eps,
                                    m0, v0, s, pf * (n - 1 - i))
            layer_forward_row_stats(y + (i + 1) * d, &mean[i + 1], &rstd[i + 1],
                                    x + (i + 1) * d, w, b, d, eps, m1, v1, s, pf * (n - 2 - i))
            i += 2
    for i in range(i, hi):
        layer_forward_row(y + i * d, &mean[i], &rstd[i], x + i * d, w, b, d, eps, s,
                          pf * (n - 1 - i))
    if stream:
        rn_sfence()


cdef inline void layer_backward_group(element *dx, element *dx2, element *dw, element *db,
                                      double *dw_part, double *db_part, double *mean_g,
                                      double *mean_gxhat, const element *dy, const element *dh,
                                      const element *x, const element *w, const double *mean,
                                      const double *rstd, Py_ssize_t rows, Py_ssize_t d,
                                      bint stream, Py_ssize_t ahead,
                                      bint prefetch_dx) noexcept nogil:
    """`rows` (<= RN_GROUP) consecutive rows of layer_backward, as in rms_backward_group,
    with two reductions per row; a row whose reductions overflowed takes the scalar path.
    dx may be dy or x.  dx2, dh, ahead, prefetch_dx, and the totals dw and db: as in
    rms_backward_group, but with totals, dw_part and db_part (where dw, db are wanted) are
    scratch rows for the scalar path, whose sums are then narrowed into dw and db."""
    cdef Py_ssize_t r
    cdef bint trusted = True
    for r in range(rows):
        # two reductions in one pass: sum(g) and sum(g * xhat)
        rn_ln_bwd_sums(&mean_g[r], &mean_gxhat[r], dy + r * d, x + r * d, w, mean[r], rstd[r],
                       d, ahead + rows - 1 - r)
        mean_g[r] = mean_g[r] / d
        mean_gxhat[r] = mean_gxhat[r] / d
        trusted = trusted and not _overflowed(mean_g[r], mean_gxhat[r], dy + r * d, x + r * d,
                                              d)
    if trusted:
        rn_ln_bwd_apply_rows(dx, dx2, dw, db, dw_part if dw == NULL else NULL,
                             db_part if db == NULL else NULL, dy, dh, x, w, mean, rstd, mean_g,
                             mean_gxhat, <int>rows, d, stream, ahead, prefetch_dx)
        return
    if dw != NULL or db != NULL:
        # the scalar path adds into partial rows: the totals from zeroed ones
        zero_partials(dw_part, db_part, d)
    for r in range(rows):
        if _overflowed(mean_g[r], mean_gxhat[r], dy + r * d, x + r * d, d):
            # x - mean overflowed the element type (rare_rows.pxd)
            _ln_backward_careful(dx + r * d, dw_part, db_part, dy + r * d, x + r * d, w,
                                 mean[r], rstd[r], d)
            if dx2 != NULL:   # dh added (dx in place) and dx2 written, as the apply pass does
                rn_residual_bwd(dx + r * d, dx2 + r * d, NULL, dx + r * d, at(dh, r * d), NULL,
                                NULL, NULL, 0, 1.0, d, False, 0)
        else:
            rn_ln_bwd_apply_rows(dx + r * d, dx2 + r * d if dx2 != NULL else NULL, NULL, NULL,
                                 dw_part, db_part, dy + r * d, at(dh, r * d), x + r * d, w,
                                 &mean[r], &rstd[r], &mean_g[r], &mean_gxhat[r], 1, d, stream,
                                 ahead + rows - 1 - r, prefetch_dx)
    if dw != NULL:
        sum_partials(dw, dw_part, 1, d, 1)
    if db != NULL:
        sum_partials(db, db_part, 1, d, 1)


cdef inline void layer_backward_block(element *dx, double *dw_part, double *db_part,
                                      double *mean_g, double *mean_gxhat, const element *dy,
                                      const element *x, const element *w, const double *mean,
                                      const double *rstd, Py_ssize_t lo, Py_ssize_t hi,
                                      Py_ssize_t n, Py_ssize_t d, bint stream) noexcept nogil:
    """Rows lo .. hi (of n) of layer_backward, in runs or groups as in
    rms_backward_block."""
    cdef Py_ssize_t i = lo, rows
    cdef bint pf_dx = backward_prefetch_dx(n, d * <Py_ssize_t>sizeof(element))
    cdef double carry[2 * CARRY_DOUBLES]
    cdef element *cw = <element *>carry if dw_part != NULL else NULL
    cdef element *cb = <element *>(carry + CARRY_DOUBLES) if db_part != NULL else NULL
    zero_partials(dw_part, db_part, d)
    if carried(x, d):
        carry_start(cw, cb, d)
        while i < hi:
            rows = min(<Py_ssize_t>RN_GROUP, hi - i)
            layer_backward_run(dx + i * d, NULL, cw, cb, dw_part, db_part, mean_g + i,
                               mean_gxhat + i, dy + i * d, NULL, x + i * d, w, mean + i,
                               rstd + i, rows, d, n - i - rows)
            i += rows
        return
    while i < hi:
        rows = min(<Py_ssize_t>RN_GROUP, hi - i)
        layer_backward_group(dx + i * d, NULL, NULL, NULL, dw_part, db_part, mean_g + i,
                             mean_gxhat + i, dy + i * d, NULL, x + i * d, w, mean + i, rstd + i,
                             rows, d, stream, n - i - rows, pf_dx)
        i += rows


cdef inline void layer_backward(element *dx, element *dw, element *db, double *mean_g,
                                double *mean_gxhat, double *dw_part, double *db_part,
                                const element *dy, const element *x, const element *w,
                                const double *mean, const double *rstd, Py_ssize_t n,
                                Py_ssize_t d, int n_threads, bint stream) noexcept nogil:
    """dx := rstd * (g - mean_g - xhat * mean_gxhat);  dw := sum_rows dy * xhat;
    db := sum_rows dy.   Forward: y = xhat*w + b.

    dw / db NULL: not wanted (w NULL means w = 1); else dw_part / db_part are
    (row_blocks(n), d) scratch.  mean_g, mean_gxhat: n doubles of scratch each.  dx may be
    dy.  NumPy reference: resnorm.reference.layer_norm_backward.
    """
    cdef Py_ssize_t nb = row_blocks(n), blk
    cdef double *wpart
    cdef double *bpart
    if one_group(n, stream):
        layer_backward_group(dx, NULL, dw, db, dw_part if dw != NULL else NULL,
                             db_part if db != NULL else NULL, mean_g, mean_gxhat, dy, NULL, x,
                             w, mean, rstd, n, d, False, 0, False)
        return
    if n_threads == 1:
        for blk in range(nb):
            layer_backward_block(dx, dw_part + blk * d if dw != NULL else NULL,
                                 db_part + blk * d if db != NULL else NULL, mean_g, mean_gxhat,
                                 dy, x, w, mean, rstd, blk * n // nb, (blk + 1) * n // nb, n,
                                 d, stream)
    else:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            wpart = dw_part + blk * d if dw != NULL else NULL
            bpart = db_part + blk * d if db != NULL else NULL
            layer_backward_block(dx, wpart, bpart, mean_g, mean_gxhat, dy, x, w, mean, rstd,
                                 blk * n // nb, (blk + 1) * n // nb, n, d, stream)
    if dw != NULL:
        sum_partials(dw, dw_part, nb, d, n_threads)
    if db != NULL:
        sum_partials(db, db_part, nb, d, n_threads)
