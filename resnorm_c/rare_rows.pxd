# Rare rows: the scalar paths of the norm statistics, shared by the norm kernels
# (norm_kernels.pxd) and the fused add + norm kernels (add_norm_kernels.pxd).
#
# The fast paths trust the double statistics of the row primitives (core/reduce.h).  A few
# finite rows defeat them, and the kernels send those (and rows holding inf/NaN, whose
# non-finite result then stands) through the plain scalar code below.  A kernel spends one
# cheap check per row on this (_ln_stats_trusted, or isfinite of RMSNorm's sum of squares,
# or _overflowed of LayerNorm backward's sums); every other row is untouched by it.
#
# * float64 rows with |x| beyond ~1e154: x^2 (RMSNorm), (x - mean)^2 or the sum
#   (LayerNorm) overflow double.  The statistics are recomputed on u = x * 2**-e, with
#   e the exponent of the row's largest |x| (exact: scaling by a power of two), and
#   RMSNorm: rstd = 2**-e / sqrt(mean(u^2) + eps * 2**-2e);
#   LayerNorm: mean = 2**e * mean(u),  rstd = 2**-e / sqrt(var(u) + eps * 2**-2e),
#   xhat = (x - mean) * rstd = (u - mean(u)) * (rstd * 2**e), which cannot overflow.
# * float32 LayerNorm rows spanning more than FLT_MAX ([3e38, -3e38, ...]): x - mean
#   overflows float in the row primitives; here it is formed in double.
# * exactly constant LayerNorm rows in float64: the rounded mean of d equal values can
#   miss them by an ulp, which rstd = 1/sqrt(ulp^2 + eps) turns into an O(1) output for
#   |x| >~ 1e12.  Their mean is taken as the value itself, so y = b exactly.
#   (float32 constant rows are exact already: d equal floats sum exactly in double.)
#
# Every function takes one row (a pointer to d contiguous elements) and its statistics.
from libc.float cimport DBL_EPSILON, FLT_MAX
from libc.math cimport fabs, frexp, isfinite, ldexp, sqrt

from primitives cimport (element, rn_bf16, rn_bf16_to_f32, rn_f16, rn_f16_to_f32, rn_f64_to_bf16,
                         rn_f64_to_f16, rn_ln_apply)


# Element access of the scalar paths: the 16-bit types are read as their float value and
# written rounded once from double (core/rn_half.h).
cdef inline double value(const element *p) noexcept nogil:
    if element is rn_bf16:
        return rn_bf16_to_f32(p[0])
    elif element is rn_f16:
        return rn_f16_to_f32(p[0])
    else:
        return p[0]


cdef inline void put(element *p, double v) noexcept nogil:
    if element is rn_bf16:
        p[0] = rn_f64_to_bf16(v)
    elif element is rn_f16:
        p[0] = rn_f64_to_f16(v)
    else:
        p[0] = <element>v


cdef inline bint _overflowed(double mg, double mgx, const element *dy, const element *x,
                             Py_ssize_t d) noexcept nogil:
    """True when a LayerNorm backward row of finite inputs got non-finite reductions: x - mean
    overflowed the element type, and the row needs _ln_backward_careful.  A row holding
    inf/NaN stays on the fast path, whose non-finite result is the right one; keeping it
    there also keeps dbias, which does not depend on x, bitwise unchanged."""
    cdef Py_ssize_t k
    if isfinite(mg) and isfinite(mgx):
        return False
    for k in range(d):
        if not (isfinite(value(x + k)) and isfinite(value(dy + k))):
            return False
    return True


cdef inline int _row_exponent(const element *x, Py_ssize_t d) noexcept nogil:
    """e with max|x| < 2**e <= 2 max|x|, so x * 2**-e lies in (-1, 1);  0 (no scaling)
    when the row holds inf or NaN: nothing to rescue, the non-finite result stands."""
    cdef double amax = 0.0, a
    cdef Py_ssize_t k
    cdef int e = 0
    for k in range(d):
        a = fabs(value(x + k))
        if not a <= amax:  # also takes a NaN, which then sticks
            amax = a
    if isfinite(amax):
        frexp(amax, &e)
    return e


cdef inline double _rms_rstd_rescaled(const element *x, Py_ssize_t d, double eps) noexcept nogil:
    """rstd of a row whose sum of squares overflowed: computed on u = x * 2**-e."""
    cdef int e = _row_exponent(x, d)
    cdef double sumsq = 0.0, u
    cdef Py_ssize_t k
    for k in range(d):
        u = ldexp(value(x + k), -e)
        sumsq += u * u
    return ldexp(1.0 / sqrt(sumsq / d + ldexp(eps, -2 * e)), -e)


cdef inline bint _ln_stats_trusted(const element *x, double mean, double var,
                                   Py_ssize_t d) noexcept nogil:
    """False for the rows _ln_forward_careful must see (and for rows holding inf/NaN).
    x only selects the element type."""
    cdef double mean_error
    if element is double:
        # finite, and well above the rounding error of a mean of d equal values
        # (at most (d/32 + 6) half-ulps of it for the 32-lane sum of core/reduce.h)
        mean_error = (d + 8) * DBL_EPSILON * mean
        return isfinite(var) and var > mean_error * mean_error
    else:
        # |x - mean| <= sqrt(d * var) <= FLT_MAX / 2: the float x - mean cannot overflow
        return d * var <= 0.25 * <double>FLT_MAX * <double>FLT_MAX


cdef inline bint _row_is_constant(const element *x, Py_ssize_t d) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(1, d):
        if value(x + k) != value(x):
            return False
    return True


cdef inline void _ln_forward_careful(element *y, double *mean, double *rstd, const element *x,
                                     const element *w, const element *b, double var,
                                     double eps, Py_ssize_t d, int stream) noexcept nogil:
    """One LayerNorm row that _ln_stats_trusted rejected (see the top of this file).
    y may be x itself: x is read in full before y is written, then element by element.
    stream: as rn_ln_apply's (the scalar path stores plainly)."""
    cdef int e = 0
    cdef double mu = 0.0, lo, hi, u, ru, v
    cdef Py_ssize_t k
    if _row_is_constant(x, d):
        mean[0] = value(x)
        rstd[0] = 1.0 / sqrt(eps)
        rn_ln_apply(y, x, w, b, mean[0], rstd[0], d, stream, 0)   # (a rare row: no prefetch)
        return
    if element is double:
        if not isfinite(var):
            e = _row_exponent(x, d)
    if e != 0:
        # the statistics of u = x * 2**-e.  mean(u) is kept within [min u, max u], where
        # the true mean lies, so that 2**e * mean(u) cannot round past DBL_MAX.
        lo = hi = ldexp(value(x), -e)
        for k in range(d):
            u = ldexp(value(x + k), -e)
            mu += u
            lo = min(lo, u)
            hi = max(hi, u)
        mu = min(max(mu / d, lo), hi)
        var = 0.0
        for k in range(d):
            u = ldexp(value(x + k), -e) - mu
            var += u * u
        mean[0] = ldexp(mu, e)
        rstd[0] = ldexp(1.0 / sqrt(var / d + ldexp(eps, -2 * e)), -e)
    else:
        rstd[0] = 1.0 / sqrt(var + eps)
    e, mu, ru = _xhat_scale(x, d, mean[0], rstd[0])
    for k in range(d):
        v = (ldexp(value(x + k), -e) - mu) * ru
        if w != NULL:
            v = v * value(w + k)
        if b != NULL:
            v = v + value(b + k)
        put(y + k, v)


cdef inline (int, double, double) _xhat_scale(const element *x, Py_ssize_t d, double mean,
                                              double rstd) noexcept nogil:
    """(e, mean * 2**-e, rstd * 2**e) such that xhat = (x * 2**-e - mean * 2**-e) *
    (rstd * 2**e) is formed without overflow in double.  Scaling is needed only when the
    row spans beyond DBL_MAX, and then rstd * 2**e is finite; when it is not, the row's
    spread is small and e = 0 is safe."""
    cdef int e = _row_exponent(x, d)
    if not isfinite(ldexp(rstd, e)):
        e = 0
    return e, ldexp(mean, -e), ldexp(rstd, e)


cdef inline void _ln_backward_careful(element *dx, double *dw_part, double *db_part,
                                      const element *dy, const element *x, const element *w,
                                      double mean, double rstd, Py_ssize_t d) noexcept nogil:
    """One LayerNorm-backward row whose sums overflowed (or hold inf/NaN): the same
    formulas as rn_ln_bwd_sums / row_ln_bwd_apply, in double, with xhat formed as in
    _xhat_scale.  dx may be x or dy itself (read before written, element by element)."""
    cdef int e
    cdef double mu, ru, xhat, g, sum_g = 0.0, sum_gxhat = 0.0, mg, mgx
    cdef Py_ssize_t k
    e, mu, ru = _xhat_scale(x, d, mean, rstd)
    for k in range(d):
        xhat = (ldexp(value(x + k), -e) - mu) * ru
        g = value(dy + k) if w == NULL else value(dy + k) * value(w + k)
        sum_g += g
        sum_gxhat += g * xhat
    mg = sum_g / d
    mgx = sum_gxhat / d
    for k in range(d):
        xhat = (ldexp(value(x + k), -e) - mu) * ru
        g = value(dy + k) if w == NULL else value(dy + k) * value(w + k)
        if dw_part != NULL:
            dw_part[k] += value(dy + k) * xhat
        if db_part != NULL:
            db_part[k] += value(dy + k)
        put(dx + k, rstd * ((g - mg) - xhat * mgx))
