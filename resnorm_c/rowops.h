/* Row primitives of the norm kernels: one template, instantiated by cpu.h once per
 * (ISA level, element type).  Before each inclusion the includer defines
 *
 *   RN_T       float or double             RN_TS      f32 or f64 (name suffix)
 *   RN_TFLOAT  1 for float, 0 for double   RN_ISA     level name suffix
 *   RN_LEVEL   3 avx512 | 2 avx2 | 1 sse2 | 0 portable
 *   RN_VBYTES  native vector width in bytes
 *
 * Reductions (sums over a row) accumulate in double.  Element i of a row goes into lane
 * i % 32 of thirty-two accumulators, held as native vectors (4 x 8 doubles on avx512,
 * 8 x 4 on avx2, 16 x 2 on sse2), and the lanes are folded in one fixed pairwise order.
 * Many independent add chains keep the adders busy, and because the lane structure is
 * the same on every level, results are bitwise identical on every level, thread count
 * and machine, not merely close.  A term is widened to double before it is added: the
 * forward statistics square in double (x^2 of a float near 1e30 would overflow float);
 * the backward terms are products of normalised values (dy*w * x*rstd), formed in the
 * input precision and widened once.
 *
 * Elementwise passes (writing y or dx) use native vectors and, when asked, non-temporal
 * ("streaming") stores that skip the read-for-ownership of each output line.  Scalar head
 * and tail code performs the same operations in the same order, so an element's value
 * never depends on whether it was vectorised.
 *
 * Every pass prefetches the same offset one row ahead (p + n): the kernels walk
 * C-contiguous rows, so that is the row they read next, and spreading those prefetches
 * over all passes keeps memory busy while a row is being computed on.  A prefetch past
 * the end of an array is a hint, never a fault.
 */

#define RN_NAME(base) RN_CAT3(base, RN_TS, RN_ISA)

/* native vector of T; vector of RN_DW doubles; vector of RN_DW T (widens into a dvec) */
#define RN_W ((Py_ssize_t)(RN_VBYTES / sizeof(RN_T)))
#define RN_DW ((Py_ssize_t)(RN_VBYTES / sizeof(double)))
#define RN_NACC (32 / RN_DW)
typedef RN_T RN_NAME(vec) __attribute__((vector_size(RN_VBYTES)));
typedef double RN_NAME(dvec) __attribute__((vector_size(RN_VBYTES)));
typedef RN_T RN_NAME(hvec) __attribute__((vector_size(RN_DW * sizeof(RN_T))));
#define RN_VEC RN_NAME(vec)
#define RN_DVEC RN_NAME(dvec)
#define RN_HVEC RN_NAME(hvec)

/* ---------------------------------------------------------------- loads and stores */

static inline RN_VEC RN_NAME(vload)(const RN_T *p)
{
    RN_VEC v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void RN_NAME(vstore)(RN_T *p, RN_VEC v) { memcpy(p, &v, sizeof v); }

static inline RN_HVEC RN_NAME(hload)(const RN_T *p)
{
    RN_HVEC v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* RN_DW values widened to double.  For float the level's own convert instruction is
 * spelled out: GCC lowers __builtin_convertvector(8 floats -> 8 doubles) on avx512 into
 * two half-width converts and an insert, which halves the speed of every reduction. */
static inline RN_DVEC RN_NAME(widen)(RN_HVEC h)
{
#if RN_TFLOAT && RN_LEVEL == 3
    return (RN_DVEC)_mm512_cvtps_pd((__m256)h);
#elif RN_TFLOAT && RN_LEVEL == 2
    return (RN_DVEC)_mm256_cvtps_pd((__m128)h);
#elif RN_TFLOAT && RN_LEVEL == 1
    __m128 v = _mm_setzero_ps();
    memcpy(&v, &h, sizeof h); /* two floats into the low half, which is all cvtps2pd reads */
    return (RN_DVEC)_mm_cvtps_pd(v);
#else
    return __builtin_convertvector(h, RN_DVEC);
#endif
}

static inline RN_DVEC RN_NAME(dload)(const RN_T *p) { return RN_NAME(widen)(RN_NAME(hload)(p)); }

/* Dropout multipliers from keep bits (philox.h's dropout_bits): element k of a span uses
 * bit kpos + k of `keep`, and its multiplier is scale when the bit is set, 0 when not:
 * selected, never computed, so a vector lane equals the scalar RN_KEEP(k) ? scale : 0.  A
 * vector's bits are read as one (unaligned) 64-bit word, broadcast, and tested against the
 * lane bits 1, 2, 4, ...: plain vector code on every level.  One bit per element keeps a
 * row's mask in a few hundred bytes, in L1 beside the row; readers may read up to 8 bytes
 * past the last bit used. */
#if RN_TFLOAT
#define RN_ITYPE int32_t
#else
#define RN_ITYPE int64_t
#endif
typedef RN_ITYPE RN_NAME(ivec) __attribute__((vector_size(RN_VBYTES)));
typedef RN_ITYPE RN_NAME(hivec) __attribute__((vector_size(RN_DW * sizeof(RN_ITYPE))));
#define RN_KEEP(k) ((keep[(kpos + (k)) >> 3] >> ((kpos + (k)) & 7)) & 1)

static inline uint64_t RN_NAME(keep_word)(const uint8_t *keep, Py_ssize_t pos)
{
    uint64_t word;
    memcpy(&word, keep + (pos >> 3), sizeof word);
    return word >> (pos & 7);
}

/* The multipliers of NL elements from position pos, as a vector VT (integer twin IVT). */
#define RN_MULT_BODY(VT, IVT, NL)                                                          \
    {                                                                                      \
        IVT lane_bit;                                                                      \
        for (int j = 0; j < (NL); j++)                                                     \
            lane_bit[j] = (RN_ITYPE)1 << j;                                                \
        IVT word = (IVT){0} + (RN_ITYPE)RN_NAME(keep_word)(keep, pos);                     \
        IVT on = (word & lane_bit) != 0;                                                   \
        return (VT)(on & (IVT)((VT){0} + scale));                                          \
    }
static inline RN_VEC RN_NAME(vmult)(const uint8_t *keep, Py_ssize_t pos, RN_T scale)
    RN_MULT_BODY(RN_VEC, RN_NAME(ivec), RN_W)
static inline RN_HVEC RN_NAME(hmult)(const uint8_t *keep, Py_ssize_t pos, RN_T scale)
    RN_MULT_BODY(RN_HVEC, RN_NAME(hivec), RN_DW)
#undef RN_MULT_BODY

/* The RN_NHALF double vectors of one native vector of T, widened in registers (a float
 * vector has two halves; a double vector is already one).  Going through memory instead
 * (store, then two half loads) stalls on store forwarding in every partial-sum update. */
#define RN_NHALF (RN_W / RN_DW)
static inline void RN_NAME(widen_vec)(RN_VEC v, RN_DVEC out[RN_NHALF])
{
#if !RN_TFLOAT
    out[0] = (RN_DVEC)v;
#elif RN_LEVEL == 3
    out[0] = (RN_DVEC)_mm512_cvtps_pd(_mm512_castps512_ps256((__m512)v));
    out[1] = (RN_DVEC)_mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd((__m512)v), 1)));
#elif RN_LEVEL == 2
    out[0] = (RN_DVEC)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)v));
    out[1] = (RN_DVEC)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)v, 1));
#elif RN_LEVEL == 1
    out[0] = (RN_DVEC)_mm_cvtps_pd((__m128)v);
    out[1] = (RN_DVEC)_mm_cvtps_pd(_mm_movehl_ps((__m128)v, (__m128)v));
#else
    RN_T t[RN_W];
    memcpy(t, &v, sizeof t);
    for (Py_ssize_t h = 0; h < RN_NHALF; h++)
        out[h] = RN_NAME(widen)(RN_NAME(hload)(t + h * RN_DW));
#endif
}

/* part[0 .. RN_W) += v, widened to double: the per-block dweight/dbias partial sums. */
static inline void RN_NAME(add_widened)(double *part, RN_VEC v)
{
    RN_DVEC w[RN_NHALF];
    RN_NAME(widen_vec)(v, w);
    for (Py_ssize_t h = 0; h < RN_NHALF; h++) {
        RN_DVEC p;
        memcpy(&p, part + h * RN_DW, sizeof p);
        p += w[h];
        memcpy(part + h * RN_DW, &p, sizeof p);
    }
}

/* Non-temporal store of one native vector; p must be RN_VBYTES-aligned. */
static inline void RN_NAME(vstream)(RN_T *p, RN_VEC v)
{
#if RN_TFLOAT && RN_LEVEL == 3
    _mm512_stream_ps((float *)p, (__m512)v);
#elif RN_LEVEL == 3
    _mm512_stream_pd((double *)p, (__m512d)v);
#elif RN_TFLOAT && RN_LEVEL == 2
    _mm256_stream_ps((float *)p, (__m256)v);
#elif RN_LEVEL == 2
    _mm256_stream_pd((double *)p, (__m256d)v);
#elif RN_TFLOAT && RN_LEVEL == 1
    _mm_stream_ps((float *)p, (__m128)v);
#elif RN_LEVEL == 1
    _mm_stream_pd((double *)p, (__m128d)v);
#else
    RN_NAME(vstore)(p, v);
#endif
}

/* Leading elements to write with scalar stores before out + k is vector-aligned (n when
 * streaming is impossible: the pointer is not even aligned to its element size). */
static inline Py_ssize_t RN_NAME(stream_head)(const RN_T *out, Py_ssize_t n)
{
    uintptr_t addr = (uintptr_t)out;
    if (addr % sizeof(RN_T) != 0)
        return n;
    Py_ssize_t k = (Py_ssize_t)(((RN_VBYTES - addr % RN_VBYTES) % RN_VBYTES) / sizeof(RN_T));
    return k < n ? k : n;
}

/* Prefetch the cache lines of p[n + i .. n + i + count): the same span, one row ahead. */
static inline void RN_NAME(prefetch_next)(const RN_T *p, Py_ssize_t n, Py_ssize_t i,
                                          Py_ssize_t count)
{
    const char *a = (const char *)(p + n + i);
    for (Py_ssize_t b = 0; b < count * (Py_ssize_t)sizeof(RN_T); b += 64)
        __builtin_prefetch(a + b, 0, RN_PF_LOCALITY);
}

/* ---------------------------------------------------------------- reductions */

/* The 32 lanes summed pairwise: lane j + lane j+16, then j + j+8, ... */
static inline double RN_NAME(fold32)(double *lanes)
{
    for (int s = 16; s >= 1; s /= 2)
        for (int j = 0; j < s; j++)
            lanes[j] += lanes[j + s];
    return lanes[0];
}

/* Adds a term of every element into the 32 lanes and folds them into `result`.
 * VTERM(i): the terms of elements i .. i+RN_DW-1 as an RN_DVEC; STERM(i): one term, as a
 * double, computed exactly as its lane of VTERM is.  PF(i): prefetch for chunk i. */
#define RN_REDUCE(n, PF, VTERM, STERM, result)                                          \
    do {                                                                                \
        RN_DVEC acc_[RN_NACC] = {{0}};                                                  \
        double lanes_[32];                                                              \
        Py_ssize_t i_ = 0;                                                              \
        for (; i_ + 32 <= (n); i_ += 32) {                                              \
            PF(i_);                                                                     \
            for (int q_ = 0; q_ < RN_NACC; q_++)                                        \
                acc_[q_] += VTERM(i_ + q_ * RN_DW);                                     \
        }                                                                               \
        memcpy(lanes_, acc_, sizeof lanes_);                                            \
        for (Py_ssize_t j_ = 0; i_ + j_ < (n); j_++)                                    \
            lanes_[j_] += STERM(i_ + j_);                                               \
        (result) = RN_NAME(fold32)(lanes_);                                             \
    } while (0)

/* As RN_REDUCE, for terms formed in the input precision (the backward products): VTERM(i)
 * gives the terms of elements i .. i+RN_W-1 as a native vector.  In each block of 64
 * elements, lane j first adds the terms of elements j and 32+j in the input precision,
 * then widens that pair sum once: widening float to double is a lane-crossing conversion
 * and was the limit of these passes.  The pairing is defined on the 32 lanes, not on the
 * vector width, so every level still computes the same bits.  A last block of 32 and the
 * scalar tail add their terms unpaired. */
#define RN_REDUCE_NATIVE(n, PF, VTERM, STERM, result)                                   \
    do {                                                                                \
        RN_DVEC acc_[RN_NACC] = {{0}}, t_[RN_NHALF];                                    \
        double lanes_[32];                                                              \
        Py_ssize_t i_ = 0;                                                              \
        for (; i_ + 64 <= (n); i_ += 64) {                                              \
            PF(i_);                                                                     \
            PF(i_ + 32);                                                                \
            for (int c_ = 0; c_ < 32 / RN_W; c_++) {                                    \
                RN_NAME(widen_vec)(VTERM(i_ + c_ * RN_W) + VTERM(i_ + 32 + c_ * RN_W), t_); \
                for (int h_ = 0; h_ < RN_NHALF; h_++)                                   \
                    acc_[c_ * RN_NHALF + h_] += t_[h_];                                 \
            }                                                                           \
        }                                                                               \
        if (i_ + 32 <= (n)) {                                                           \
            PF(i_);                                                                     \
            for (int c_ = 0; c_ < 32 / RN_W; c_++) {                                    \
                RN_NAME(widen_vec)(VTERM(i_ + c_ * RN_W), t_);                          \
                for (int h_ = 0; h_ < RN_NHALF; h_++)                                   \
                    acc_[c_ * RN_NHALF + h_] += t_[h_];                                 \
            }                                                                           \
            i_ += 32;                                                                   \
        }                                                                               \
        memcpy(lanes_, acc_, sizeof lanes_);                                            \
        for (Py_ssize_t j_ = 0; i_ + j_ < (n); j_++)                                    \
            lanes_[j_] += STERM(i_ + j_);                                               \
        (result) = RN_NAME(fold32)(lanes_);                                             \
    } while (0)

#define RN_PF_X(i) RN_NAME(prefetch_next)(x, n, (i), 32)
#define RN_PF_DY_X(i) (RN_NAME(prefetch_next)(dy, n, (i), 32), RN_NAME(prefetch_next)(x, n, (i), 32))

static inline RN_DVEC RN_NAME(square)(RN_DVEC v) { return v * v; }

/* sum_i x_i */
static double RN_NAME(sum)(const RN_T *x, Py_ssize_t n)
{
    double r;
#define V_(i) RN_NAME(dload)(x + (i))
#define S_(i) ((double)x[i])
    RN_REDUCE(n, RN_PF_X, V_, S_, r);
#undef V_
#undef S_
    return r;
}

/* sum_i x_i^2 */
static double RN_NAME(sumsq)(const RN_T *x, Py_ssize_t n)
{
    double r;
#define V_(i) RN_NAME(square)(RN_NAME(dload)(x + (i)))
#define S_(i) ((double)x[i] * (double)x[i])
    RN_REDUCE(n, RN_PF_X, V_, S_, r);
#undef V_
#undef S_
    return r;
}

/* sum_i (x_i - mean)^2: the second pass of a two-pass variance, never E[x^2] - E[x]^2. */
static double RN_NAME(sumsqdev)(const RN_T *x, Py_ssize_t n, double mean)
{
    double r;
#define V_(i) RN_NAME(square)(RN_NAME(dload)(x + (i)) - mean)
#define S_(i) (((double)x[i] - mean) * ((double)x[i] - mean))
    RN_REDUCE(n, RN_PF_X, V_, S_, r);
#undef V_
#undef S_
    return r;
}

/* RMSNorm backward reduction: sum_i g_i * xn_i with g = dy*w, xn = x*rstd (w NULL: 1). */
static double RN_NAME(rms_bwd_dot)(const RN_T *dy, const RN_T *x, const RN_T *w, double rstd,
                                   Py_ssize_t n)
{
    const RN_T r = (RN_T)rstd;
    double s;
#define V_(i) (RN_NAME(vload)(dy + (i)) * RN_NAME(vload)(w + (i)) * (RN_NAME(vload)(x + (i)) * r))
#define S_(i) ((double)(dy[i] * w[i] * (x[i] * r)))
    if (w) RN_REDUCE_NATIVE(n, RN_PF_DY_X, V_, S_, s);
#undef V_
#undef S_
#define V_(i) (RN_NAME(vload)(dy + (i)) * (RN_NAME(vload)(x + (i)) * r))
#define S_(i) ((double)(dy[i] * (x[i] * r)))
    else RN_REDUCE_NATIVE(n, RN_PF_DY_X, V_, S_, s);
#undef V_
#undef S_
    return s;
}

/* The residual sum of a row, h_k = r_k + a_k * (x_k * m_k) (m_k = RN_KEEP(k) ? scale : 0;
 * a, keep NULL: 1), formed in the input precision exactly as residual_add forms it, then
 * reduced without being stored:
 *   sum_k (h_k - shift)     (squares = 0, shift = 0: the LayerNorm mean pass)
 *   sum_k (h_k - shift)^2   (squares = 1: shift = 0 for RMSNorm, = mean for LayerNorm)
 * with RN_REDUCE's lanes, so the result is bitwise sum / sumsq / sumsqdev of the stored h.
 * A pass that only loads: nothing waits behind streamed stores still draining (a plain
 * store would, as stores leave the core in program order).  x and r are prefetched one row
 * ahead; the apply pass (residual_norm_apply) finds the row in cache. */
static double RN_NAME(residual_reduce)(const RN_T *r, const RN_T *x, const RN_T *a,
                                       const uint8_t *keep, Py_ssize_t kpos, double scale,
                                       Py_ssize_t n, int squares, double shift)
{
    const RN_T sc = (RN_T)scale;
    double s;
#define PF_(i) (RN_NAME(prefetch_next)(x, n, (i), 32), RN_NAME(prefetch_next)(r, n, (i), 32))
#define H_(i) ({ RN_HVEC v_ = RN_NAME(hload)(x + (i));                                  \
                 if (keep) { v_ *= RN_NAME(hmult)(keep, kpos + (i), sc); }              \
                 if (a) { v_ *= RN_NAME(hload)(a + (i)); }                              \
                 RN_NAME(widen)(RN_NAME(hload)(r + (i)) + v_) - shift; })
#define HS_(i) ({ RN_T v_ = x[i]; if (keep) { v_ *= RN_KEEP(i) ? sc : (RN_T)0; }        \
                  if (a) { v_ *= a[i]; } (double)(r[i] + v_) - shift; })
#define V1_(i) RN_NAME(square)(H_(i))
#define S1_(i) ({ double t_ = HS_(i); t_ * t_; })
    if (squares) RN_REDUCE(n, PF_, V1_, S1_, s);
    else RN_REDUCE(n, PF_, H_, HS_, s);
#undef PF_
#undef H_
#undef HS_
#undef V1_
#undef S1_
    return s;
}

/* The mean is cached in double.  For float rows it enters the float arithmetic as
 * hi + lo (two floats), so x - mean keeps its precision when |mean| >> std
 * (x = 1e4 + N(0,1)): x - hi is exact for x near hi (Sterbenz), then lo is removed. */
static inline void RN_NAME(split_mean)(double mean, RN_T *hi, RN_T *lo)
{
    *hi = (RN_T)mean;
    *lo = (RN_T)(mean - (double)*hi);
}

/* The two LayerNorm-backward reductions in one pass, with g = dy*w and
 * xhat = (x - mean)*rstd:  *sum_g = sum g,  *sum_gxhat = sum g*xhat.
 * Same lanes, pairing and fold as RN_REDUCE_NATIVE, with two sets of accumulators. */
static void RN_NAME(ln_bwd_sums)(double *sum_g, double *sum_gxhat, const RN_T *dy,
                                 const RN_T *x, const RN_T *w, double mean, double rstd,
                                 Py_ssize_t n)
{
    RN_T mh, ml;
    RN_NAME(split_mean)(mean, &mh, &ml);
    const RN_T r = (RN_T)rstd;
    RN_DVEC ag[RN_NACC] = {{0}}, aq[RN_NACC] = {{0}}, tg[RN_NHALF], tq[RN_NHALF];
    double lg[32], lq[32];
    Py_ssize_t i = 0;
    /* g and g*xhat of the elements at k, and (when pair) plus those at k + 32 */
#define TERMS_(k, pair)                                                                 \
    {                                                                                   \
        RN_VEC g = RN_NAME(vload)(dy + (k));                                            \
        if (w) g *= RN_NAME(vload)(w + (k));                                            \
        RN_VEC gx = g * (((RN_NAME(vload)(x + (k)) - mh) - ml) * r);                    \
        if (pair) {                                                                     \
            RN_VEC g2 = RN_NAME(vload)(dy + (k) + 32);                                  \
            if (w) g2 *= RN_NAME(vload)(w + (k) + 32);                                  \
            gx = gx + g2 * (((RN_NAME(vload)(x + (k) + 32) - mh) - ml) * r);            \
            g = g + g2;                                                                 \
        }                                                                               \
        RN_NAME(widen_vec)(g, tg);                                                      \
        RN_NAME(widen_vec)(gx, tq);                                                     \
    }
    for (; i + 64 <= n; i += 64) {
        RN_PF_DY_X(i);
        RN_PF_DY_X(i + 32);
        for (int c = 0; c < 32 / RN_W; c++) {
            TERMS_(i + c * RN_W, 1)
            for (int h = 0; h < RN_NHALF; h++) {
                ag[c * RN_NHALF + h] += tg[h];
                aq[c * RN_NHALF + h] += tq[h];
            }
        }
    }
    if (i + 32 <= n) {
        RN_PF_DY_X(i);
        for (int c = 0; c < 32 / RN_W; c++) {
            TERMS_(i + c * RN_W, 0)
            for (int h = 0; h < RN_NHALF; h++) {
                ag[c * RN_NHALF + h] += tg[h];
                aq[c * RN_NHALF + h] += tq[h];
            }
        }
        i += 32;
    }
#undef TERMS_
    memcpy(lg, ag, sizeof lg);
    memcpy(lq, aq, sizeof lq);
    for (Py_ssize_t j = 0; i + j < n; j++) {
        RN_T g = dy[i + j];
        if (w) g *= w[i + j];
        RN_T xhat = ((x[i + j] - mh) - ml) * r;
        lg[j] += (double)g;
        lq[j] += (double)(g * xhat);
    }
    *sum_g = RN_NAME(fold32)(lg);
    *sum_gxhat = RN_NAME(fold32)(lq);
}

/* ---------------------------------------------------------------- elementwise passes */

/* Whether out and out2 can both take streaming stores from the same loop: they must sit at
 * the same offset from a vector boundary (NULL out2: no second output). */
static inline int RN_NAME(same_phase)(const RN_T *out, const RN_T *out2)
{
    return out2 == NULL || ((uintptr_t)out - (uintptr_t)out2) % RN_VBYTES == 0;
}

/* Runs SCALAR(k) or VECTOR(k, STORE) over k in [0, n): scalar code for the unaligned head
 * and the tail, native vectors in between, stored with STORE (streamed when `stream` is
 * set).  PF(k) prefetches the next row's span of the vector at k.  Streamed stores are
 * followed by a store fence, unless stream is RN_STREAM_UNFENCED: a caller that writes a
 * row in many short slices fences once at the end (rn_sfence), because a fence waits for
 * the write-combining buffers to drain and would stall every slice. */
#define RN_ELEMENTWISE(n, out, stream, PF, SCALAR, VECTOR)                              \
    do {                                                                                \
        Py_ssize_t k_ = 0, head_ = (stream) ? RN_NAME(stream_head)((out), (n)) : 0;     \
        int nt_ = (stream) && head_ < (n);                                              \
        for (; k_ < head_; k_++) { SCALAR(k_) }                                         \
        if (nt_) {                                                                      \
            for (; k_ + RN_W <= (n); k_ += RN_W) {                                      \
                PF(k_);                                                                 \
                VECTOR(k_, RN_NAME(vstream))                                            \
            }                                                                           \
        } else {                                                                        \
            for (; k_ + RN_W <= (n); k_ += RN_W) {                                      \
                PF(k_);                                                                 \
                VECTOR(k_, RN_NAME(vstore))                                             \
            }                                                                           \
        }                                                                               \
        for (; k_ < (n); k_++) { SCALAR(k_) }                                           \
        if (nt_ && (stream) != RN_STREAM_UNFENCED) rn_sfence();                         \
    } while (0)

#define RN_PFV_X(k) RN_NAME(prefetch_next)(x, n, (k), RN_W)
#define RN_PFV_DY_X(k) (RN_NAME(prefetch_next)(dy, n, (k), RN_W), RN_NAME(prefetch_next)(x, n, (k), RN_W))

/* y_i = x_i * rstd * w_i   (w == NULL: w_i = 1) */
static void RN_NAME(rms_apply)(RN_T *y, const RN_T *x, const RN_T *w, double rstd,
                               Py_ssize_t n, int stream)
{
    const RN_T r = (RN_T)rstd;
#define S_(k) { RN_T v = x[k] * r; if (w) { v *= w[k]; } y[k] = v; }
#define V_(k, ST) { RN_VEC v = RN_NAME(vload)(x + k) * r;                                 \
                    if (w) { v *= RN_NAME(vload)(w + k); } ST(y + k, v); }
    /* One expansion per case so the compiler drops the dead branch from the loop. */
    if (w) RN_ELEMENTWISE(n, y, stream, RN_PFV_X, S_, V_);
    else { const RN_T *w = NULL; RN_ELEMENTWISE(n, y, stream, RN_PFV_X, S_, V_); }
#undef S_
#undef V_
}

/* y_i = ((x_i - mean) * rstd) * w_i + b_i   (w, b may be NULL) */
static void RN_NAME(ln_apply)(RN_T *y, const RN_T *x, const RN_T *w, const RN_T *b,
                              double mean, double rstd, Py_ssize_t n, int stream)
{
    RN_T mh, ml;
    RN_NAME(split_mean)(mean, &mh, &ml);
    const RN_T r = (RN_T)rstd;
#define S_(k) { RN_T v = ((x[k] - mh) - ml) * r;                                          \
                if (w) { v *= w[k]; } if (b) { v += b[k]; } y[k] = v; }
#define V_(k, ST) { RN_VEC v = ((RN_NAME(vload)(x + k) - mh) - ml) * r;                   \
                    if (w) { v *= RN_NAME(vload)(w + k); }                                \
                    if (b) { v += RN_NAME(vload)(b + k); } ST(y + k, v); }
    if (w && b) RN_ELEMENTWISE(n, y, stream, RN_PFV_X, S_, V_);
    else if (w) { const RN_T *b = NULL; RN_ELEMENTWISE(n, y, stream, RN_PFV_X, S_, V_); }
    else if (b) { const RN_T *w = NULL; RN_ELEMENTWISE(n, y, stream, RN_PFV_X, S_, V_); }
    else { const RN_T *w = NULL, *b = NULL; RN_ELEMENTWISE(n, y, stream, RN_PFV_X, S_, V_); }
#undef S_
#undef V_
}

/* The norm applied to the residual sum, recomputed from the cached row (residual_reduce
 * read it just before):  h_k = r_k + a_k * (x_k * m_k),  m_k = RN_KEEP(k) ? scale : 0,
 *   y_k = ((h_k - mean) * rstd) * w_k + b_k      (RMSNorm: mean = 0, b = NULL: h_k * rstd * w_k)
 *   hout_k = h_k                                 (hout NULL: Post-Norm, h is not kept)
 * The same operations as residual_add then ln_apply / rms_apply (x - 0 is x), so y is bitwise
 * the norm of hout.  a, keep, w, b may be NULL. */
static void RN_NAME(residual_norm_apply)(RN_T *y, RN_T *hout, const RN_T *r, const RN_T *x,
                                         const RN_T *a, const uint8_t *keep, Py_ssize_t kpos,
                                         double scale, const RN_T *w, const RN_T *b,
                                         double mean, double rstd, Py_ssize_t n, int stream)
{
    RN_T mh, ml;
    RN_NAME(split_mean)(mean, &mh, &ml);
    const RN_T rs = (RN_T)rstd, sc = (RN_T)scale;
    if (!RN_NAME(same_phase)(y, hout)) stream = 0;
#define PF_(k)
#define S_(k) { RN_T h_ = x[k]; if (keep) { h_ *= RN_KEEP(k) ? sc : (RN_T)0; }          \
                if (a) { h_ *= a[k]; } h_ = r[k] + h_;                                  \
                RN_T v_ = ((h_ - mh) - ml) * rs; if (w) { v_ *= w[k]; } if (b) { v_ += b[k]; } \
                y[k] = v_; if (hout) { hout[k] = h_; } }
#define V_(k, ST) { RN_VEC h_ = RN_NAME(vload)(x + k);                                  \
                    if (keep) { h_ *= RN_NAME(vmult)(keep, kpos + k, sc); }             \
                    if (a) { h_ *= RN_NAME(vload)(a + k); }                             \
                    h_ = RN_NAME(vload)(r + k) + h_;                                    \
                    RN_VEC v_ = ((h_ - mh) - ml) * rs;                                  \
                    if (w) { v_ *= RN_NAME(vload)(w + k); }                             \
                    if (b) { v_ += RN_NAME(vload)(b + k); }                             \
                    ST(y + k, v_); if (hout) { ST(hout + k, h_); } }
#define RUN_ RN_ELEMENTWISE(n, y, stream, PF_, S_, V_)
    /* The fused forward's cases (weight, no alpha, no bias; with or without dropout and h)
     * get their own expansions: with the branches left in, the compiler unswitches only
     * some of them. */
    if (w && !a && !b) {
        const RN_T *a = NULL, *b = NULL;
        if (keep && hout) RUN_;
        else if (keep) { RN_T *hout = NULL; RUN_; }
        else if (hout) { const uint8_t *keep = NULL; RUN_; }
        else { const uint8_t *keep = NULL; RN_T *hout = NULL; RUN_; }
    } else RUN_;
#undef RUN_
#undef PF_
#undef S_
#undef V_
}

/* RMSNorm backward, elementwise part, given m = mean(g * xn) (the row reduction):
 *   xn_i = x_i * rstd,  g_i = dy_i * w_i
 *   dx_i = rstd * (g_i - xn_i * m)
 *   dw_part_i += dy_i * xn_i          (double partial of this row block; NULL when there
 *                                      is no weight or its gradient is not wanted) */
static void RN_NAME(rms_bwd_apply)(RN_T *dx, double *dw_part, const RN_T *dy, const RN_T *x,
                                   const RN_T *w, double rstd, double m, Py_ssize_t n,
                                   int stream)
{
    const RN_T r = (RN_T)rstd, mt = (RN_T)m;
#define S_(i) { RN_T xn = x[i] * r, g = dy[i]; if (w) { g *= w[i]; }                       \
                if (dw_part) { dw_part[i] += (double)(dy[i] * xn); }                      \
                dx[i] = r * (g - xn * mt); }
#define V_(i, ST) { RN_VEC xn = RN_NAME(vload)(x + i) * r, d = RN_NAME(vload)(dy + i), g = d; \
                    if (w) { g *= RN_NAME(vload)(w + i); }                                \
                    if (dw_part) { RN_NAME(add_widened)(dw_part + i, d * xn); }           \
                    ST(dx + i, r * (g - xn * mt)); }
    if (w && dw_part) RN_ELEMENTWISE(n, dx, stream, RN_PFV_DY_X, S_, V_);
    else if (w) { double *dw_part = NULL; RN_ELEMENTWISE(n, dx, stream, RN_PFV_DY_X, S_, V_); }
    else { const RN_T *w = NULL; double *dw_part = NULL;
           RN_ELEMENTWISE(n, dx, stream, RN_PFV_DY_X, S_, V_); }
#undef S_
#undef V_
}

/* LayerNorm backward, elementwise part, given the two row reductions
 * mg = mean(g) and mgx = mean(g*xhat), with g = dy*w, xhat = (x - mean)*rstd:
 *   dx_i = rstd * ((g_i - mg) - xhat_i * mgx)
 *   dw_part_i += dy_i * xhat_i,  db_part_i += dy_i     (double partials; may be NULL) */
static void RN_NAME(ln_bwd_apply)(RN_T *dx, double *dw_part, double *db_part, const RN_T *dy,
                                  const RN_T *x, const RN_T *w, double mean, double rstd,
                                  double mg, double mgx, Py_ssize_t n, int stream)
{
    RN_T mh, ml;
    RN_NAME(split_mean)(mean, &mh, &ml);
    const RN_T r = (RN_T)rstd, a = (RN_T)mg, q = (RN_T)mgx;
#define S_(i) { RN_T xhat = ((x[i] - mh) - ml) * r, g = dy[i]; if (w) { g *= w[i]; }      \
                if (dw_part) { dw_part[i] += (double)(dy[i] * xhat); }                    \
                if (db_part) { db_part[i] += (double)dy[i]; }                             \
                dx[i] = r * ((g - a) - xhat * q); }
#define V_(i, ST) { RN_VEC xhat = ((RN_NAME(vload)(x + i) - mh) - ml) * r;                \
                    RN_VEC d = RN_NAME(vload)(dy + i), g = d;                             \
                    if (w) { g *= RN_NAME(vload)(w + i); }                                \
                    if (dw_part) { RN_NAME(add_widened)(dw_part + i, d * xhat); }         \
                    if (db_part) { RN_NAME(add_widened)(db_part + i, d); }                \
                    ST(dx + i, r * ((g - a) - xhat * q)); }
    if (w && dw_part && db_part) RN_ELEMENTWISE(n, dx, stream, RN_PFV_DY_X, S_, V_);
    else if (w && dw_part) { double *db_part = NULL;
                             RN_ELEMENTWISE(n, dx, stream, RN_PFV_DY_X, S_, V_); }
    else if (w) RN_ELEMENTWISE(n, dx, stream, RN_PFV_DY_X, S_, V_);
    else { const RN_T *w = NULL; RN_ELEMENTWISE(n, dx, stream, RN_PFV_DY_X, S_, V_); }
#undef S_
#undef V_
}

/* ---------------------------------------------------------------- backward, several rows
 *
 * The elementwise backward passes for up to RN_GROUP consecutive rows of one row block
 * (row stride n), column by column.  A column's terms for dweight (and dbias) are first
 * summed over the group's rows in the input precision, in row order, and only that group
 * sum is widened and added to the float64 partial.  Widening float to double is a
 * lane-crossing conversion that limited this pass when done once per term; once per group
 * it costs a quarter.  The group sum adds at most three roundings of the input precision
 * to each group's contribution; the groups are fixed (RN_GROUP rows from the start of a
 * row block, and row blocks depend on N only), so the result is still bitwise identical
 * for any thread count.  Rows are streamed only when they share their alignment.
 */
static inline int RN_NAME(rows_share_phase)(Py_ssize_t n)
{
    return (n * (Py_ssize_t)sizeof(RN_T)) % RN_VBYTES == 0;
}

/* Prefetch of the next group's rows at column k: what the next group's reduction passes
 * read.  The apply pass over a whole group is long enough to bring them in; the reduction
 * passes alone (each also prefetching one row ahead) are too short to hide memory. */
#define RN_PF_GROUP(k)                                                                  \
    for (int p_ = 0; p_ < rows; p_++) {                                                 \
        RN_NAME(prefetch_next)(dy + p_ * n, rows * n, (k), RN_W);                       \
        RN_NAME(prefetch_next)(x + p_ * n, rows * n, (k), RN_W);                        \
    }

/* part[0 .. RN_W) += v widened, for a partial that may be NULL. */
#define RN_ADD_GROUP(part, k, v)                                                        \
    do { if (part) RN_NAME(add_widened)((part) + (k), (v)); } while (0)

static inline __attribute__((always_inline)) void RN_NAME(rms_bwd_rows_body)(
    RN_T *dx, double *dw_part, const RN_T *dy, const RN_T *x, const RN_T *w,
    const RN_T *rs, const RN_T *mt, int rows, Py_ssize_t n, int stream)
{
    int phase = rows == 1 || RN_NAME(rows_share_phase)(n);
    Py_ssize_t k = 0, head = stream && phase ? RN_NAME(stream_head)(dx, n) : 0;
    int nt = stream && phase && head < n;
#define COLUMN_(k)                                                                      \
    {                                                                                   \
        RN_T tw = 0;                                                                    \
        for (int r = 0; r < rows; r++) {                                                \
            const RN_T *dyr = dy + r * n, *xr = x + r * n;                              \
            RN_T xn = xr[k] * rs[r], g = dyr[k];                                        \
            if (w) { g *= w[k]; }                                                       \
            tw = r ? tw + dyr[k] * xn : dyr[k] * xn;                                    \
            dx[r * n + k] = rs[r] * (g - xn * mt[r]);                                   \
        }                                                                               \
        if (dw_part) { dw_part[k] += (double)tw; }                                      \
    }
    for (; k < head; k++) COLUMN_(k)
    for (; k + RN_W <= n; k += RN_W) {
        RN_VEC tw = {0};
        RN_PF_GROUP(k)
        for (int r = 0; r < rows; r++) {
            RN_VEC xn = RN_NAME(vload)(x + r * n + k) * rs[r];
            RN_VEC d = RN_NAME(vload)(dy + r * n + k), g = d;
            if (w) g *= RN_NAME(vload)(w + k);
            RN_VEC v = rs[r] * (g - xn * mt[r]);
            if (nt) RN_NAME(vstream)(dx + r * n + k, v);
            else RN_NAME(vstore)(dx + r * n + k, v);
            tw = r ? tw + d * xn : d * xn;
        }
        RN_ADD_GROUP(dw_part, k, tw);
    }
    for (; k < n; k++) COLUMN_(k)
#undef COLUMN_
    if (nt && stream != RN_STREAM_UNFENCED) rn_sfence();
}

/* RMSNorm backward, elementwise part, for `rows` (<= RN_GROUP) consecutive rows, given
 * each row's reduction m[r] = mean(g * xn):
 *   dx = rstd * (g - xn * m),   dw_part += sum over the rows of dy * xn
 * (xn = x * rstd, g = dy * w; dw_part NULL when no weight gradient is wanted). */
static void RN_NAME(rms_bwd_apply_rows)(RN_T *dx, double *dw_part, const RN_T *dy,
                                        const RN_T *x, const RN_T *w, const double *rstd,
                                        const double *m, int rows, Py_ssize_t n, int stream)
{
    RN_T rs[RN_GROUP], mt[RN_GROUP];
    for (int r = 0; r < rows; r++) {
        rs[r] = (RN_T)rstd[r];
        mt[r] = (RN_T)m[r];
    }
    /* One inlined copy per case so the dead branches leave the loops. */
    if (w && dw_part) RN_NAME(rms_bwd_rows_body)(dx, dw_part, dy, x, w, rs, mt, rows, n, stream);
    else if (w) RN_NAME(rms_bwd_rows_body)(dx, NULL, dy, x, w, rs, mt, rows, n, stream);
    else RN_NAME(rms_bwd_rows_body)(dx, NULL, dy, x, NULL, rs, mt, rows, n, stream);
}

static inline __attribute__((always_inline)) void RN_NAME(ln_bwd_rows_body)(
    RN_T *dx, double *dw_part, double *db_part, const RN_T *dy, const RN_T *x, const RN_T *w,
    const RN_T *mh, const RN_T *ml, const RN_T *rs, const RN_T *a, const RN_T *q, int rows,
    Py_ssize_t n, int stream)
{
    int phase = rows == 1 || RN_NAME(rows_share_phase)(n);
    Py_ssize_t k = 0, head = stream && phase ? RN_NAME(stream_head)(dx, n) : 0;
    int nt = stream && phase && head < n;
#define COLUMN_(k)                                                                      \
    {                                                                                   \
        RN_T tw = 0, tb = 0;                                                            \
        for (int r = 0; r < rows; r++) {                                                \
            const RN_T *dyr = dy + r * n, *xr = x + r * n;                              \
            RN_T xhat = ((xr[k] - mh[r]) - ml[r]) * rs[r], g = dyr[k];                  \
            if (w) { g *= w[k]; }                                                       \
            tw = r ? tw + dyr[k] * xhat : dyr[k] * xhat;                                \
            tb = r ? tb + dyr[k] : dyr[k];                                              \
            dx[r * n + k] = rs[r] * ((g - a[r]) - xhat * q[r]);                         \
        }                                                                               \
        if (dw_part) { dw_part[k] += (double)tw; }                                      \
        if (db_part) { db_part[k] += (double)tb; }                                      \
    }
    for (; k < head; k++) COLUMN_(k)
    for (; k + RN_W <= n; k += RN_W) {
        RN_VEC tw = {0}, tb = {0};
        RN_PF_GROUP(k)
        for (int r = 0; r < rows; r++) {
            RN_VEC xhat = ((RN_NAME(vload)(x + r * n + k) - mh[r]) - ml[r]) * rs[r];
            RN_VEC d = RN_NAME(vload)(dy + r * n + k), g = d;
            if (w) g *= RN_NAME(vload)(w + k);
            RN_VEC v = rs[r] * ((g - a[r]) - xhat * q[r]);
            if (nt) RN_NAME(vstream)(dx + r * n + k, v);
            else RN_NAME(vstore)(dx + r * n + k, v);
            tw = r ? tw + d * xhat : d * xhat;
            tb = r ? tb + d : d;
        }
        RN_ADD_GROUP(dw_part, k, tw);
        RN_ADD_GROUP(db_part, k, tb);
    }
    for (; k < n; k++) COLUMN_(k)
#undef COLUMN_
    if (nt && stream != RN_STREAM_UNFENCED) rn_sfence();
}

/* LayerNorm backward, elementwise part, for `rows` (<= RN_GROUP) consecutive rows, given
 * each row's two reductions mg[r] = mean(g) and mgx[r] = mean(g * xhat):
 *   dx = rstd * ((g - mg) - xhat * mgx),
 *   dw_part += sum over the rows of dy * xhat,   db_part += sum over the rows of dy
 * (xhat = (x - mean) * rstd, g = dy * w; the partials may be NULL). */
static void RN_NAME(ln_bwd_apply_rows)(RN_T *dx, double *dw_part, double *db_part,
                                       const RN_T *dy, const RN_T *x, const RN_T *w,
                                       const double *mean, const double *rstd,
                                       const double *mg, const double *mgx, int rows,
                                       Py_ssize_t n, int stream)
{
    RN_T mh[RN_GROUP], ml[RN_GROUP], rs[RN_GROUP], a[RN_GROUP], q[RN_GROUP];
    for (int r = 0; r < rows; r++) {
        RN_NAME(split_mean)(mean[r], &mh[r], &ml[r]);
        rs[r] = (RN_T)rstd[r];
        a[r] = (RN_T)mg[r];
        q[r] = (RN_T)mgx[r];
    }
    if (w && dw_part && db_part)
        RN_NAME(ln_bwd_rows_body)(dx, dw_part, db_part, dy, x, w, mh, ml, rs, a, q, rows, n, stream);
    else if (w && dw_part)
        RN_NAME(ln_bwd_rows_body)(dx, dw_part, NULL, dy, x, w, mh, ml, rs, a, q, rows, n, stream);
    else if (w)
        RN_NAME(ln_bwd_rows_body)(dx, NULL, db_part, dy, x, w, mh, ml, rs, a, q, rows, n, stream);
    else
        RN_NAME(ln_bwd_rows_body)(dx, NULL, db_part, dy, x, NULL, mh, ml, rs, a, q, rows, n, stream);
}

/* ---------------------------------------------------------------- residual connections */

/* h_k = r_k + a_k * (x_k * m_k): branch x, dropout multipliers m_k = RN_KEEP(k) ? scale : 0
 * and scale a, added onto the residual stream r.  r may be NULL (0), a and keep NULL (1).  The
 * product x*m is formed first, as dropout forms it, so h equals r + a * dropout(x) bitwise.
 * x and r are prefetched one row ahead; a and keep are short rows that stay in cache. */
static void RN_NAME(residual_add)(RN_T *h, const RN_T *r, const RN_T *x, const RN_T *a,
                                  const uint8_t *keep, Py_ssize_t kpos, double scale,
                                  Py_ssize_t n, int stream)
{
    const RN_T sc = (RN_T)scale;
#define PF_(k) { RN_NAME(prefetch_next)(x, n, (k), RN_W);                               \
                 if (r) { RN_NAME(prefetch_next)(r, n, (k), RN_W); } }
#define S_(k) { RN_T v = x[k]; if (keep) { v *= RN_KEEP(k) ? sc : (RN_T)0; }            \
                if (a) { v *= a[k]; } if (r) { v = r[k] + v; } h[k] = v; }
#define V_(k, ST) { RN_VEC v = RN_NAME(vload)(x + k);                                   \
                    if (keep) { v *= RN_NAME(vmult)(keep, kpos + k, sc); }              \
                    if (a) { v *= RN_NAME(vload)(a + k); }                              \
                    if (r) { v = RN_NAME(vload)(r + k) + v; } ST(h + k, v); }
    /* The hot cases get their own expansion: dropout alone, and the plain add. */
    if (!r && !a && keep) {
        const RN_T *r = NULL, *a = NULL;
        RN_ELEMENTWISE(n, h, stream, PF_, S_, V_);
    } else if (r && !a && !keep) {
        const RN_T *a = NULL;
        const uint8_t *keep = NULL;
        RN_ELEMENTWISE(n, h, stream, PF_, S_, V_);
    }
    else RN_ELEMENTWISE(n, h, stream, PF_, S_, V_);
#undef PF_
#undef S_
#undef V_
}

/* Backward of h = r + a*(x*m), m_k = RN_KEEP(k) ? scale : 0.  With g = gh + dh (dh, a
 * gradient arriving along the residual stream, may be NULL):
 *   dr_k = g_k                        (dr NULL: not written)
 *   dx_k = (g_k * a_k) * m_k          (a, keep NULL: 1)
 *   da_part_k += g_k * (x_k * m_k)    (double partial of a row block; NULL: not wanted)
 * gh, dh and (when da_part is wanted) x are prefetched one row ahead. */
static void RN_NAME(residual_bwd)(RN_T *dx, RN_T *dr, double *da_part, const RN_T *gh,
                                  const RN_T *dh, const RN_T *x, const RN_T *a,
                                  const uint8_t *keep, Py_ssize_t kpos, double scale,
                                  Py_ssize_t n, int stream)
{
    const RN_T sc = (RN_T)scale;
    if (!RN_NAME(same_phase)(dx, dr)) stream = 0;
#define PF_(k) { RN_NAME(prefetch_next)(gh, n, (k), RN_W);                              \
                 if (dh) { RN_NAME(prefetch_next)(dh, n, (k), RN_W); }                  \
                 if (da_part) { RN_NAME(prefetch_next)(x, n, (k), RN_W); } }
#define S_(k) { RN_T g = gh[k], mk = keep ? (RN_KEEP(k) ? sc : (RN_T)0) : (RN_T)1;      \
                if (dh) { g += dh[k]; } if (dr) { dr[k] = g; }                          \
                if (da_part) { RN_T d = x[k]; if (keep) { d *= mk; }                    \
                               da_part[k] += (double)(g * d); }                         \
                RN_T v = g; if (a) { v *= a[k]; } if (keep) { v *= mk; } dx[k] = v; }
#define V_(k, ST) { RN_VEC g = RN_NAME(vload)(gh + k), mk = {0};                        \
                    if (keep) { mk = RN_NAME(vmult)(keep, kpos + k, sc); }              \
                    if (dh) { g += RN_NAME(vload)(dh + k); }                            \
                    if (dr) { ST(dr + k, g); }                                          \
                    if (da_part) { RN_VEC d = RN_NAME(vload)(x + k);                    \
                                   if (keep) { d *= mk; }                               \
                                   RN_NAME(add_widened)(da_part + k, g * d); }          \
                    RN_VEC v = g; if (a) { v *= RN_NAME(vload)(a + k); }                \
                    if (keep) { v *= mk; } ST(dx + k, v); }
    RN_ELEMENTWISE(n, dx, stream, PF_, S_, V_);
#undef PF_
#undef S_
#undef V_
}

/* s_k = sigmoid(g_k) = 1/(1 + exp(-g_k)) and ds_k = s_k * (1 - s_k), both from
 * e = exp(-|g_k|) in double: nothing overflows, and ds keeps its precision where s rounds
 * to 1 (ds = e / (1 + e)^2, not 1 - s).  ds may be NULL.  Scalar: exp has no vector form
 * here that would give the same bits on every level. */
static void RN_NAME(sigmoid)(RN_T *s, RN_T *ds, const RN_T *g, Py_ssize_t n)
{
    for (Py_ssize_t k = 0; k < n; k++) {
        double v = (double)g[k], e = exp(-fabs(v)), q = 1.0 / (1.0 + e);
        s[k] = (RN_T)(v >= 0 ? q : e * q);
        if (ds) ds[k] = (RN_T)(e * q * q);
    }
}

/* ---------------------------------------------------------------- partial sums */

/* acc_i += part_i: folds one block's partial row into the running total (fixed order). */
static void RN_NAME(accumulate)(double *acc, const double *part, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        acc[i] += part[i];
}

/* out_i = (T) acc_i */
static void RN_NAME(narrow)(RN_T *out, const double *acc, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = (RN_T)acc[i];
}

#undef RN_KEEP
#undef RN_ITYPE
#undef RN_PF_X
#undef RN_PF_DY_X
#undef RN_PFV_X
#undef RN_PFV_DY_X
#undef RN_REDUCE
#undef RN_REDUCE_NATIVE
#undef RN_ELEMENTWISE
#undef RN_PF_GROUP
#undef RN_ADD_GROUP
#undef RN_NHALF
#undef RN_HVEC
#undef RN_DVEC
#undef RN_VEC
#undef RN_NACC
#undef RN_DW
#undef RN_W
#undef RN_NAME
