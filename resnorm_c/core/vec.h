/* Vector helpers of the typed templates: types, element loads and stores (whole, partial
 * and streamed vectors, single elements), widening to double, prefetch, dropout
 * multipliers, and the elementwise loop.  element.h includes this first, once per (level,
 * element type), with
 *
 *   RN_T       the element type as stored (float or double)
 *   RN_C       the type it is computed in (RN_T for float and double)
 *   RN_TS      f32 or f64 (name suffix)
 *   RN_TFLOAT  1 when RN_C is float, 0 when it is double
 *   RN_ISA     level name suffix
 *   RN_LEVEL   3 avx512 | 2 avx2 | 1 sse2 | 0 portable
 *   RN_VBYTES  native vector width in bytes
 *
 * RN_NAME(sum) is rn_sum_<RN_TS>_<RN_ISA>, e.g. rn_sum_f32_avx2: the instance of a typed
 * primitive that primitives.h's tables point to.
 *
 * Element access goes through the helpers of the next section only (vload, vload_n,
 * vstore, vstore_n, vstream, hload, ld, st): an element type stored in another format
 * than it is computed in needs only these written for it.
 *
 * Every lane of a vector computes exactly what the scalar code computes for its element,
 * so an element's value never depends on whether, or at which width, it was vectorised.
 * Every pass prefetches the same offset one row ahead (p + d): the kernels walk
 * C-contiguous rows, so that is the row they read next.  A prefetch past the end of an
 * array is a hint, never a fault.
 */

#define RN_NAME(base) RN_CAT3(base, RN_TS, RN_ISA)

/* native vector of RN_C (RN_W lanes); vector of RN_DW doubles; vector of RN_DW RN_C
 * (widens into a dvec) */
#define RN_W ((Py_ssize_t)(RN_VBYTES / sizeof(RN_C)))
#define RN_DW ((Py_ssize_t)(RN_VBYTES / sizeof(double)))
#define RN_NACC (32 / RN_DW)
typedef RN_C RN_NAME(vec) __attribute__((vector_size(RN_VBYTES)));
typedef double RN_NAME(dvec) __attribute__((vector_size(RN_VBYTES)));
typedef RN_C RN_NAME(hvec) __attribute__((vector_size(RN_DW * sizeof(RN_C))));
#define RN_VEC RN_NAME(vec)
#define RN_DVEC RN_NAME(dvec)
#define RN_HVEC RN_NAME(hvec)

/* ---------------------------------------------------------------- element access */

/* one element */
static inline RN_C RN_NAME(ld)(const RN_T *p) { return *p; }
static inline void RN_NAME(st)(RN_T *p, RN_C v) { *p = v; }
#define RN_LD(p) RN_NAME(ld)(p)
#define RN_ST(p, v) RN_NAME(st)((p), (v))

/* RN_W elements */
static inline RN_VEC RN_NAME(vload)(const RN_T *p)
{
    RN_VEC v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void RN_NAME(vstore)(RN_T *p, RN_VEC v) { memcpy(p, &v, sizeof v); }

/* RN_DW elements */
static inline RN_HVEC RN_NAME(hload)(const RN_T *p)
{
    RN_HVEC v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The first n elements (0 < n < RN_W) into lanes 0 .. n-1, the other lanes 0; nothing at
 * or past p + n is read. */
static inline RN_VEC RN_NAME(vload_n)(const RN_T *p, Py_ssize_t n)
{
#if RN_TFLOAT && RN_LEVEL == 3
    return (RN_VEC)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
#elif RN_LEVEL == 3
    return (RN_VEC)_mm512_maskz_loadu_pd((__mmask8)((1u << n) - 1), p);
#elif RN_TFLOAT && RN_LEVEL == 2
    __m256i on = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return (RN_VEC)_mm256_maskload_ps(p, on);
#elif RN_LEVEL == 2
    __m256i on = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
    return (RN_VEC)_mm256_maskload_pd(p, on);
#else
    RN_T t[RN_W];
    memset(t, 0, sizeof t);
    memcpy(t, p, (size_t)n * sizeof(RN_T));
    return RN_NAME(vload)(t);
#endif
}

/* Lanes 0 .. n-1 of v into p[0 .. n) (0 < n < RN_W); nothing at or past p + n is written. */
static inline void RN_NAME(vstore_n)(RN_T *p, RN_VEC v, Py_ssize_t n)
{
#if RN_TFLOAT && RN_LEVEL == 3
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
#elif RN_LEVEL == 3
    _mm512_mask_storeu_pd(p, (__mmask8)((1u << n) - 1), (__m512d)v);
#elif RN_TFLOAT && RN_LEVEL == 2
    __m256i on = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(p, on, (__m256)v);
#elif RN_LEVEL == 2
    __m256i on = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
    _mm256_maskstore_pd(p, on, (__m256d)v);
#else
    RN_T t[RN_W];
    RN_NAME(vstore)(t, v);
    memcpy(p, t, (size_t)n * sizeof(RN_T));
#endif
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

/* ---------------------------------------------------------------- widening to double */

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

/* The RN_NHALF double vectors of one native vector, widened in registers (a float vector
 * has two halves; a double vector is already one).  Going through memory instead (store,
 * then two half loads) stalls on store forwarding in every partial-sum update. */
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
    RN_C t[RN_W];
    memcpy(t, &v, sizeof t);
    for (Py_ssize_t h = 0; h < RN_NHALF; h++) {
        RN_HVEC half;
        memcpy(&half, t + h * RN_DW, sizeof half);
        out[h] = RN_NAME(widen)(half);
    }
#endif
}

/* part[0 .. n) += lanes 0 .. n-1 of v, widened to double (n <= RN_W): the per-block
 * dweight/dbias/dalpha partial sums.  A partial vector adds its lanes one by one. */
static inline __attribute__((always_inline)) void RN_NAME(add_widened)(double *part, RN_VEC v,
                                                                        Py_ssize_t n)
{
    if (n < RN_W) {
        RN_C t[RN_W];
        memcpy(t, &v, sizeof t);
        for (Py_ssize_t j = 0; j < n; j++)
            part[j] += (double)t[j];
        return;
    }
    RN_DVEC w[RN_NHALF];
    RN_NAME(widen_vec)(v, w);
    for (Py_ssize_t h = 0; h < RN_NHALF; h++) {
        RN_DVEC p;
        memcpy(&p, part + h * RN_DW, sizeof p);
        p += w[h];
        memcpy(part + h * RN_DW, &p, sizeof p);
    }
}

/* ---------------------------------------------------------------- placement, prefetch */

/* Leading elements before out + k is vector-aligned (at most d; 0 when out is not even
 * aligned to its element size, and no element will ever be aligned). */
static inline Py_ssize_t RN_NAME(align_head)(const RN_T *out, Py_ssize_t d)
{
    uintptr_t addr = (uintptr_t)out;
    if (addr % sizeof(RN_T) != 0)
        return 0;
    Py_ssize_t k = (Py_ssize_t)(((RN_VBYTES - addr % RN_VBYTES) % RN_VBYTES) / sizeof(RN_T));
    return k < d ? k : d;
}

/* Whether out and out2 sit at the same offset from a vector boundary, so that the vectors
 * of one loop are aligned in both (NULL out2: no second output). */
static inline int RN_NAME(same_phase)(const RN_T *out, const RN_T *out2)
{
    return out2 == NULL || ((uintptr_t)out - (uintptr_t)out2) % RN_VBYTES == 0;
}

/* Prefetch the cache lines of p[d + i .. d + i + count): the same span, one row ahead. */
static inline void RN_NAME(prefetch_next)(const RN_T *p, Py_ssize_t d, Py_ssize_t i,
                                          Py_ssize_t count)
{
    const char *a = (const char *)(p + d + i);
    for (Py_ssize_t b = 0; b < count * (Py_ssize_t)sizeof(RN_T); b += 64)
        __builtin_prefetch(a + b, 0, RN_PF_LOCALITY);
}

/* The mean is cached in double.  For float rows it enters the float arithmetic as
 * hi + lo (two floats), so x - mean keeps its precision when |mean| >> std
 * (x = 1e4 + N(0,1)): x - hi is exact for x near hi (Sterbenz), then lo is removed. */
static inline void RN_NAME(split_mean)(double mean, RN_C *hi, RN_C *lo)
{
    *hi = (RN_C)mean;
    *lo = (RN_C)(mean - (double)*hi);
}

/* ---------------------------------------------------------------- dropout multipliers
 *
 * From keep bits (philox.h's dropout_bits): element k of a span uses bit kpos + k of
 * `keep`, and its multiplier m_k is scale when the bit is set, 0 when not: selected, never
 * computed, so a vector lane equals the scalar RN_KEEP(k) ? scale : 0.  A vector's bits are
 * read as one (unaligned) 64-bit word, broadcast, and tested against the lane bits 1, 2,
 * 4, ...: plain vector code on every level.  One bit per element keeps a row's mask in a
 * few hundred bytes, in L1 beside the row; readers may read up to 8 bytes past the last
 * bit used. */
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
static inline RN_VEC RN_NAME(vmult)(const uint8_t *keep, Py_ssize_t pos, RN_C scale)
    RN_MULT_BODY(RN_VEC, RN_NAME(ivec), RN_W)
static inline RN_HVEC RN_NAME(hmult)(const uint8_t *keep, Py_ssize_t pos, RN_C scale)
    RN_MULT_BODY(RN_HVEC, RN_NAME(hivec), RN_DW)
#undef RN_MULT_BODY

/* ---------------------------------------------------------------- the elementwise loop
 *
 * Runs BODY(k) for the vectors of a row of d elements: k is the vector's first element,
 * and inside BODY the macros RN_GET(p) and RN_PUT(p, v) load and store the vector's
 * elements of a row p (and RN_ADD_WIDENED(part, v) adds it to a double partial).  The
 * vectors are placed so that the stores into `out` are aligned: a partial vector first
 * (lanes up to the first vector boundary of out), whole vectors, a partial vector last.
 * A store that crosses a cache line costs as much as two, and NumPy's large arrays start
 * 16 bytes into a page.  Whole vectors are streamed when `stream` is set (when out is
 * element-aligned); PF(k) prefetches the next row's span of the vector at k.  Streamed
 * stores are followed by a store fence, unless stream is RN_STREAM_UNFENCED: a caller
 * that writes a row in many short slices fences once at the end (rn_sfence), because a
 * fence waits for the write-combining buffers to drain and would stall every slice.
 *
 * Each expansion of BODY sees its vector's kind as the constants n_ (lanes in use) and
 * s_ (RN_PART, RN_WHOLE or RN_STREAMED), so the compiler keeps one kind of load and store
 * in each loop. */
#ifndef RN_WHOLE
#define RN_WHOLE 0
#define RN_STREAMED 1
#define RN_PART 2
#endif

static inline __attribute__((always_inline)) RN_VEC RN_NAME(vget)(const RN_T *p, Py_ssize_t n,
                                                                   int s)
{
    return s == RN_PART ? RN_NAME(vload_n)(p, n) : RN_NAME(vload)(p);
}

static inline __attribute__((always_inline)) void RN_NAME(vput)(RN_T *p, RN_VEC v, Py_ssize_t n,
                                                                 int s)
{
    if (s == RN_PART) RN_NAME(vstore_n)(p, v, n);
    else if (s == RN_STREAMED) RN_NAME(vstream)(p, v);
    else RN_NAME(vstore)(p, v);
}

#define RN_GET(p) RN_NAME(vget)((p), n_, s_)
#define RN_PUT(p, v) RN_NAME(vput)((p), (v), n_, s_)
#define RN_ADD_WIDENED(part, v) RN_NAME(add_widened)((part), (v), n_)

#define RN_ELEMENTWISE(d, out, stream, PF, BODY)                                        \
    do {                                                                                \
        const Py_ssize_t d_ = (d);                                                      \
        Py_ssize_t k_ = RN_NAME(align_head)((out), d_);                                 \
        const int streamed_ = (stream) && (uintptr_t)(out) % sizeof(RN_T) == 0;         \
        if (k_ > 0) {                                                                   \
            const Py_ssize_t n_ = k_; const int s_ = RN_PART;                           \
            (void)n_; (void)s_; BODY(0)                                                 \
        }                                                                               \
        if (streamed_) {                                                                \
            for (; k_ + RN_W <= d_; k_ += RN_W) {                                       \
                const Py_ssize_t n_ = RN_W; const int s_ = RN_STREAMED;                 \
                (void)n_; (void)s_; PF(k_); BODY(k_)                                    \
            }                                                                           \
        } else {                                                                        \
            for (; k_ + RN_W <= d_; k_ += RN_W) {                                       \
                const Py_ssize_t n_ = RN_W; const int s_ = RN_WHOLE;                    \
                (void)n_; (void)s_; PF(k_); BODY(k_)                                    \
            }                                                                           \
        }                                                                               \
        if (k_ < d_) {                                                                  \
            const Py_ssize_t n_ = d_ - k_; const int s_ = RN_PART;                      \
            (void)n_; (void)s_; BODY(k_)                                                \
        }                                                                               \
        if (streamed_ && (stream) != RN_STREAM_UNFENCED) rn_sfence();                   \
    } while (0)

/* Prefetches of the vector at k, one row ahead, for passes over x or over dy and x, and
 * for the output of a pass whose inputs a reduction pass has prefetched already (a line
 * read ahead is owned when the store comes; streamed stores need none). */
#define RN_PFV_X(k) RN_NAME(prefetch_next)(x, d, (k), RN_W)
#define RN_PFV_OUT(out, k) do { if (s_ == RN_WHOLE) RN_NAME(prefetch_next)((out), d, (k), RN_W); } while (0)
#define RN_PFV_DY_X(k) (RN_NAME(prefetch_next)(dy, d, (k), RN_W), RN_NAME(prefetch_next)(x, d, (k), RN_W))
