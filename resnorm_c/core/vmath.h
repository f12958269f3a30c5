/* Loops that call exp or erfc once per element: GELU (exact and tanh forms, forward and
 * backward), the exponentials of the attention softmax, and the sigmoid of the gated
 * residual with its rows (typed template; element.h includes it after vec.h).  The 16-bit
 * types get the gated residual only: the other loops serve resnorm.nn's float32 / float64
 * layers.
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
 * computed as 0.5 * erfc(|x|/sqrt 2) directly, not as 1 + erf(x)); sigmoid within 3 ulp
 * (docs/residual.md).
 */
#ifndef RN_VMATH_SCALARS
#define RN_VMATH_SCALARS

/* exp(x) for float: x = n ln2 + r, |r| <= ln2/2 (Cody-Waite: ln2 = hi + lo, hi has few bits
 * so n*hi is exact), exp(r) = p = 1 + r + r^2 q(r), then the exponent field gets n.  q is a
 * degree-4 Chebyshev fit of (exp(r) - 1 - r) / r^2 on [-ln2/2, ln2/2] (tools/fit_vmath.py).
 * RN_EXPF_PARTS defines n and p for a float or a float vector T (the same operations for
 * both, so a vector lane gets a scalar's bits). */
#define RN_EXPF_PARTS(T, x, n, p)                                                        \
    const T n = ((x) * 1.44269504f + 12582912.0f) - 12582912.0f;  /* round(x / ln2) */  \
    T n##_r = (x) - n * 0.693359375f;                                                    \
    n##_r = n##_r - n * -2.12194440e-4f;                                                 \
    T n##_q = (T){0} + 1.393364393e-03f;                                                 \
    n##_q = n##_q * n##_r + 8.363175206e-03f;                                            \
    n##_q = n##_q * n##_r + 4.166646674e-02f;                                            \
    n##_q = n##_q * n##_r + 1.666657627e-01f;                                            \
    n##_q = n##_q * n##_r + 5.000000000e-01f;                                            \
    const T p = n##_q * n##_r * n##_r + n##_r + 1.0f

/* 2^n for an integer n in [-126, 127] */
static inline float rn_pow2f(int32_t n)
{
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return scale;
}

/* Inputs are clamped to [-87, 88]: the result stays a finite normal float (exp(-87) =
 * 1.6e-38). */
static inline float rn_expf(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    RN_EXPF_PARTS(float, x, n, p);
    return p * rn_pow2f((int32_t)n);
}

/* exp(x) for x <= 0, correct down to 0 (the sigmoid's e = exp(-|g|)): rn_expf's formula,
 * except that below 2^-125, where rn_expf stops, 2^n is applied as 2^(n+64) then 2^-64
 * (exact scalings; the last one rounds once, into the subnormals).  Below -110 exp rounds
 * to 0 anyway, and x is clamped there. */
#define RN_EXP_ZERO -110.0f
static inline float rn_exp_nonposf(float x)
{
    x = x < RN_EXP_ZERO ? RN_EXP_ZERO : x;
    RN_EXPF_PARTS(float, x, n, p);
    const int tail = n < -125.0f;
    const float e = p * rn_pow2f((int32_t)n + (tail ? 64 : 0));
    return tail ? e * 0x1p-64f : e;
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

/* sigmoid(g) from e = exp(-|g|): 1/(1 + e) for g >= 0, e/(1 + e) below, so nothing
 * overflows; *ds = s (1 - s) = e/(1 + e)^2, which keeps its precision where s rounds to 1
 * (1 - s would be 0 there).  NaN stays NaN. */
static inline float rn_sigmoidf(float g, float *ds)
{
    const float e = rn_exp_nonposf(-fabsf(g));
    const float q = 1.0f / (1.0f + e);
    *ds = e * q * q;
    return g >= 0.0f ? q : e * q;
}

/* The same in double, with libm's exp. */
static inline double rn_sigmoid(double g, double *ds)
{
    const double e = exp(-fabs(g));
    const double q = 1.0 / (1.0 + e);
    *ds = e * q * q;
    return g >= 0.0 ? q : e * q;
}

#define RN_INV_SQRT2 0.70710678118654752440
#define RN_INV_SQRT_2PI 0.39894228040143267794
#define RN_SQRT_2_OVER_PI 0.79788456080286535588
#define RN_GELU_CUBIC 0.044715

#endif /* RN_VMATH_SCALARS */

#if !RN_HALF
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
#endif /* !RN_HALF */

/* ---- the gated residual: h = x + s F, s = sigmoid(g), and its backward
 *
 * float (and the 16-bit types, computed in float): in vector code at every level.  The
 * vector functions below repeat rn_exp_nonposf and rn_sigmoidf operation by operation
 * (clamps and branches as lane selects), so an element gets the same bits from the vector
 * body as from the scalar head and tail, on every level;
 * -ffp-contract=off keeps a*b+c unfused everywhere.  One pass: the sigmoid is formed in
 * registers, never stored.  double: scalar, libm exp (float64 is for checking, not speed).
 */
#if RN_TFLOAT
#define RN_IVEC RN_NAME(ivec)

static inline RN_VEC RN_NAME(vselect)(RN_IVEC mask, RN_VEC a, RN_VEC b)
{
    return (RN_VEC)((mask & (RN_IVEC)a) | (~mask & (RN_IVEC)b));
}

/* rn_exp_nonposf, lane by lane */
static inline RN_VEC RN_NAME(vexp_nonpos)(RN_VEC x)
{
    const RN_VEC lo = (RN_VEC){0} + RN_EXP_ZERO;
    x = RN_NAME(vselect)(x < lo, lo, x);
    RN_EXPF_PARTS(RN_VEC, x, n, p);
    const RN_IVEC tail = n < -125.0f;
    const RN_IVEC k = __builtin_convertvector(n, RN_IVEC) + (tail & 64);
    const RN_VEC e = p * (RN_VEC)((k + 127) << 23);
    return RN_NAME(vselect)(tail, e * 0x1p-64f, e);
}

/* rn_sigmoidf, lane by lane */
static inline RN_VEC RN_NAME(vsigmoid)(RN_VEC g, RN_VEC *ds)
{
    const RN_VEC e = RN_NAME(vexp_nonpos)(-(RN_VEC)((RN_IVEC)g & 0x7fffffff)); /* -fabsf(g) */
    const RN_VEC q = 1.0f / (1.0f + e);
    *ds = e * q * q;
    return RN_NAME(vselect)(g >= 0.0f, q, e * q);
}
#define RN_SIG_ rn_sigmoidf
#else
#define RN_SIG_ rn_sigmoid
#endif

/* The loop of the rows below: vector code for float (partial vectors at the ends: the same
 * lane operations, so the same bits), a scalar loop for double. */
#if RN_TFLOAT
#define RN_GATED_LOOP_(out) RN_ELEMENTWISE(d, out, stream, PF_, V_)
#else
#define RN_GATED_LOOP_(out) do { (void)stream; for (Py_ssize_t k = 0; k < d; k++) S_(k) } while (0)
#endif

#if !RN_HALF
/* s_k = sigmoid(g_k), ds_k = s_k (1 - s_k) (ds may be NULL): the per-channel gate of
 * float and double, formed once per call */
static void RN_NAME(sigmoid)(RN_T *s, RN_T *ds, const RN_T *g, Py_ssize_t d)
{
    const int stream = 0;
#define PF_(k)
#define S_(k) { RN_T dsk; s[k] = RN_SIG_(g[k], &dsk); if (ds) { ds[k] = dsk; } }
#define V_(k) { RN_VEC dsk; RN_PUT(s + (k), RN_NAME(vsigmoid)(RN_GET(g + (k)), &dsk));         \
                if (ds) { RN_PUT(ds + (k), dsk); } }
    RN_GATED_LOOP_(s);
#undef PF_
#undef S_
#undef V_
}
#endif

/* h_k = x_k + F_k * sigmoid(g_k), one pass; h may be x, F or g.  x, F and g are prefetched
 * one row ahead when ahead is set (the caller's: a next row of all three exists). */
static void RN_NAME(gated_add)(RN_T *h, const RN_T *x, const RN_T *F, const RN_T *g,
                               Py_ssize_t d, int stream, Py_ssize_t ahead)
{
#define PF_(k) if (ahead) { RN_NAME(prefetch_next)(x, d, (k), RN_W);                       \
                            RN_NAME(prefetch_next)(F, d, (k), RN_W);                       \
                            RN_NAME(prefetch_next)(g, d, (k), RN_W); }
#define S_(k) { RN_T dsk; h[k] = x[k] + F[k] * RN_SIG_(g[k], &dsk); }
#define V_(k) { RN_VEC dsk;                                                                \
                RN_PUT(h + (k), RN_GET(x + (k))                                            \
                                + RN_GET(F + (k)) * RN_NAME(vsigmoid)(RN_GET(g + (k)), &dsk)); }
    RN_GATED_LOOP_(h);
#undef PF_
#undef S_
#undef V_
}

/* Backward of h = x + s F:  dx_k = dh_k,  dF_k = dh_k * s_k,  dg_k = F_k * (dh_k * ds_k),
 * s and ds = s (1 - s) recomputed from g.  dg_part NULL: dg is written.  Otherwise dg is
 * not, and dg_part_k += dg_k, widened to double: the gradient of a per-channel gate (g the
 * same (D,) row for every row), summed over the rows.  Every output may be dh itself (each
 * element is read before it is written); none may be F or g.  dh, F and g are prefetched
 * one row ahead when ahead is set (the caller's: a next row of all three exists). */
static void RN_NAME(gated_bwd)(RN_T *dx, RN_T *dF, RN_T *dg, double *dg_part, const RN_T *dh,
                               const RN_T *F, const RN_T *g, Py_ssize_t d, int stream,
                               Py_ssize_t ahead)
{
#define PF_(k) if (ahead) { RN_NAME(prefetch_next)(dh, d, (k), RN_W);                      \
                            RN_NAME(prefetch_next)(F, d, (k), RN_W);                       \
                            RN_NAME(prefetch_next)(g, d, (k), RN_W); }
#define S_(k) { RN_T dsk; const RN_T dhk = dh[k], fk = F[k], sk = RN_SIG_(g[k], &dsk);    \
                dx[k] = dhk; dF[k] = dhk * sk;                                             \
                if (dg_part) { dg_part[k] += fk * (dhk * dsk); }                           \
                else { dg[k] = fk * (dhk * dsk); } }
#define V_(k) { RN_VEC dsk;                                                                \
                const RN_VEC dhk = RN_GET(dh + (k)), fk = RN_GET(F + (k));                 \
                const RN_VEC sk = RN_NAME(vsigmoid)(RN_GET(g + (k)), &dsk);                \
                RN_PUT(dx + (k), dhk); RN_PUT(dF + (k), dhk * sk);                         \
                if (dg_part) { RN_ADD_WIDENED(dg_part + (k), fk * (dhk * dsk)); }          \
                else { RN_PUT(dg + (k), fk * (dhk * dsk)); } }
    if (!RN_NAME(same_phase)(dx, dF) || (!dg_part && !RN_NAME(same_phase)(dx, dg))) stream = 0;
    /* one expansion per case, so the compiler drops the dead branch from the loop */
    if (dg_part) RN_GATED_LOOP_(dx);
    else { double *dg_part = NULL; RN_GATED_LOOP_(dx); }
#undef PF_
#undef S_
#undef V_
}
#undef RN_GATED_LOOP_
#undef RN_SIG_
#ifdef RN_IVEC
#undef RN_IVEC
#endif
