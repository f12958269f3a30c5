/* Loops of the Transformer layers that call exp or erfc once per element: GELU (exact and
 * tanh forms, forward and backward) and the exponentials of the attention softmax (typed
 * template; element.h includes it after vec.h).
 *
 * float32: libm's expf/erff are scalar calls, which made GELU a quarter of a training step.
 * Here exp and erfc are written with +, *, / and integer bit operations only, so the loops
 * vectorise at every level; -ffp-contract=off (setup.py) keeps every level from fusing
 * a*b+c, so all levels give bitwise the same numbers.
 *
 * float64: libm exp / erfc (accuracy first; float64 runs are for checking, not speed).
 *
 * Accuracy (float32, measured against float64; docs/blocks.md): rn_expf relative error
 * <= 9e-8 (about 1.5 ulp); GELU absolute error <= 4e-7 for |x| <= 20, and relative error
 * <= 3e-6 wherever |gelu(x)| > 1e-6 (no cancellation in the negative tail: the tail is
 * computed as 0.5 * erfc(|x|/sqrt 2) directly, not as 1 + erf(x)).
 */
#ifndef RN_VMATH_SCALARS
#define RN_VMATH_SCALARS

/* exp(x) for float: x = n ln2 + r, |r| <= ln2/2 (Cody-Waite: ln2 = hi + lo, hi has few bits
 * so n*hi is exact), exp(r) = 1 + r + r^2 q(r), then the exponent field gets n.  q is a
 * degree-4 Chebyshev fit of (exp(r) - 1 - r) / r^2 on [-ln2/2, ln2/2] (tools/fit_vmath.py).
 * Inputs are clamped to [-87, 88]: the result stays a finite normal float (exp(-87) = 1.6e-38). */
static inline float rn_expf(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  /* round(x / ln2) */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float q = 1.393364393e-03f;
    q = q * r + 8.363175206e-03f;
    q = q * r + 4.166646674e-02f;
    q = q * r + 1.666657627e-01f;
    q = q * r + 5.000000000e-01f;
    const int32_t bits = ((int32_t)n + 127) << 23;                   /* 2^n */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return (q * r * r + r + 1.0f) * scale;
}

/* erfc(z) for z >= 0, as t exp(-z^2 + P(t)) with t = 1 / (1 + z/2).  P is a degree-9
 * Chebyshev fit of log(erfc(z)/t) + z^2 over t in [1/5.5, 1] (z in [0, 9]); relative error
 * 4e-8 in exact arithmetic, 8e-7 in float32 for z <= 4 (tools/fit_vmath.py).  z is clamped
 * to 9 (erfc(9) = 4e-37).  *gauss receives exp(-z^2),
 * which the GELU derivative needs as well. */
static inline float rn_erfcf(float z, float *gauss)
{
    z = z > 9.0f ? 9.0f : z;
    const float t = 1.0f / (1.0f + 0.5f * z);
    float p = 1.354247183e-01f;
    p = p * t + -6.286317110e-01f;
    p = p * t + 1.032769918e+00f;
    p = p * t + -5.295532942e-01f;
    p = p * t + -2.197604477e-01f;
    p = p * t + 7.634551823e-02f;
    p = p * t + 8.687084541e-03f;
    p = p * t + 3.921549618e-01f;
    p = p * t + 9.979783297e-01f;
    p = p * t + -1.265415072e+00f;
    const float g = rn_expf(-z * z);
    *gauss = g;
    return t * g * rn_expf(p);
}

#define RN_INV_SQRT2 0.70710678118654752440
#define RN_INV_SQRT_2PI 0.39894228040143267794
#define RN_SQRT_2_OVER_PI 0.79788456080286535588
#define RN_GELU_CUBIC 0.044715

#endif /* RN_VMATH_SCALARS */

/* ---- exact GELU: y = x Phi(x), Phi(x) = 1 - erfc(x/sqrt2)/2 (x >= 0) or erfc(|x|/sqrt2)/2 */

static void RN_NAME(gelu)(RN_T *y, const RN_T *x, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
#if RN_TFLOAT
        float g;
        const float e = rn_erfcf(fabsf(x[i]) * (float)RN_INV_SQRT2, &g);
        const float phi = x[i] >= 0.0f ? 1.0f - 0.5f * e : 0.5f * e;
        y[i] = x[i] * phi;
#else
        y[i] = x[i] * 0.5 * erfc(-x[i] * RN_INV_SQRT2);
#endif
    }
}

/* dx = dy (Phi(x) + x phi(x)),  phi(x) = exp(-x^2/2) / sqrt(2 pi) */
static void RN_NAME(gelu_backward)(RN_T *dx, const RN_T *dy, const RN_T *x, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
#if RN_TFLOAT
        float g;
        const float e = rn_erfcf(fabsf(x[i]) * (float)RN_INV_SQRT2, &g);
        const float phi = x[i] >= 0.0f ? 1.0f - 0.5f * e : 0.5f * e;
        dx[i] = dy[i] * (phi + x[i] * (float)RN_INV_SQRT_2PI * g);
#else
        dx[i] = dy[i] * (0.5 * erfc(-x[i] * RN_INV_SQRT2)
                         + x[i] * RN_INV_SQRT_2PI * exp(-0.5 * x[i] * x[i]));
#endif
    }
}

/* ---- tanh GELU: y = 0.5 x (1 + tanh(u)) = x s,  s = sigmoid(2u) = 1 / (1 + e),
 * u = sqrt(2/pi) (x + 0.044715 x^3),  e = exp(-2u);
 * dx = dy (s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2))   (0.5 (1 - tanh^2) = 2 s (1 - s)).
 * s (1 - s) = 1 / (2 + e + 1/e): no cancellation of 1 - s where s is close to 1, and exactly 0
 * (not inf * 0) where e overflows or underflows.  u is computed from x clamped to +-CLAMP,
 * where the sigmoid has saturated (float: exp's own clamp; double: e = inf or 0), which
 * keeps x^3 finite for any input. */
#if RN_TFLOAT
#define RN_EXP_ rn_expf
#define RN_CLAMP_ 20
#else
#define RN_EXP_ exp
#define RN_CLAMP_ 30
#endif
#define RN_GELU_TANH_S_                                                                       \
    const RN_T xc = x[i] > (RN_T)RN_CLAMP_ ? (RN_T)RN_CLAMP_                                  \
                    : (x[i] < (RN_T)-RN_CLAMP_ ? (RN_T)-RN_CLAMP_ : x[i]);                    \
    const RN_T e = RN_EXP_((RN_T)-2 * (RN_T)RN_SQRT_2_OVER_PI                                 \
                           * (xc + (RN_T)RN_GELU_CUBIC * xc * xc * xc));                      \
    const RN_T s = (RN_T)1 / ((RN_T)1 + e);

static void RN_NAME(gelu_tanh)(RN_T *y, const RN_T *x, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        RN_GELU_TANH_S_
        y[i] = x[i] * s;
    }
}

static void RN_NAME(gelu_tanh_backward)(RN_T *dx, const RN_T *dy, const RN_T *x, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        RN_GELU_TANH_S_
        dx[i] = dy[i] * (s + xc * (RN_T)2 / ((RN_T)2 + e + (RN_T)1 / e) * (RN_T)RN_SQRT_2_OVER_PI
                                 * ((RN_T)1 + (RN_T)(3 * RN_GELU_CUBIC) * xc * xc));
    }
}
#undef RN_GELU_TANH_S_
#undef RN_CLAMP_

/* ---- softmax exponentials: p[j] = exp(scale * (s[j] - m)) */
static void RN_NAME(exp_shifted)(RN_T *p, const RN_T *s, RN_T m, RN_T scale, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++)
        p[j] = RN_EXP_(scale * (s[j] - m));
}
#undef RN_EXP_
