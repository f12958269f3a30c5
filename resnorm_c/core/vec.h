/* Vector helpers of the typed templates: types, loads and stores, widening to double,
 * streaming stores, prefetch, dropout multipliers, and the elementwise loop.  element.h
 * includes this first, once per (level, element type), with
 *
 *   RN_T       float or double             RN_TS      f32 or f64 (name suffix)
 *   RN_TFLOAT  1 for float, 0 for double   RN_ISA     level name suffix
 *   RN_LEVEL   3 avx512 | 2 avx2 | 1 sse2 | 0 portable
 *   RN_VBYTES  native vector width in bytes
 *
 * RN_NAME(sum) is rn_sum_<RN_TS>_<RN_ISA>, e.g. rn_sum_f32_avx2: the instance of a typed
 * primitive that primitives.h's tables point to.
 *
 * Scalar head and tail code performs the same operations in the same order as the vector
 * code, so an element's value never depends on whether it was vectorised.  Every pass
 * prefetches the same offset one row ahead (p + d): the kernels walk C-contiguous rows, so
 * that is the row they read next.  A prefetch past the end of an array is a hint, never a
 * fault.
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

/* Leading elements to write with scalar stores before out + k is vector-aligned (d when
 * streaming is impossible: the pointer is not even aligned to its element size). */
static inline Py_ssize_t RN_NAME(stream_head)(const RN_T *out, Py_ssize_t d)
{
    uintptr_t addr = (uintptr_t)out;
    if (addr % sizeof(RN_T) != 0)
        return d;
    Py_ssize_t k = (Py_ssize_t)(((RN_VBYTES - addr % RN_VBYTES) % RN_VBYTES) / sizeof(RN_T));
    return k < d ? k : d;
}

/* Whether out and out2 can both take streaming stores from the same loop: they must sit at
 * the same offset from a vector boundary (NULL out2: no second output). */
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
static inline void RN_NAME(split_mean)(double mean, RN_T *hi, RN_T *lo)
{
    *hi = (RN_T)mean;
    *lo = (RN_T)(mean - (double)*hi);
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
static inline RN_VEC RN_NAME(vmult)(const uint8_t *keep, Py_ssize_t pos, RN_T scale)
    RN_MULT_BODY(RN_VEC, RN_NAME(ivec), RN_W)
static inline RN_HVEC RN_NAME(hmult)(const uint8_t *keep, Py_ssize_t pos, RN_T scale)
    RN_MULT_BODY(RN_HVEC, RN_NAME(hivec), RN_DW)
#undef RN_MULT_BODY

/* ---------------------------------------------------------------- the elementwise loop
 *
 * Runs SCALAR(k) or VECTOR(k, STORE) over k in [0, d): scalar code for the unaligned head
 * and the tail, native vectors in between, stored with STORE (streamed when `stream` is
 * set).  PF(k) prefetches the next row's span of the vector at k.  Streamed stores are
 * followed by a store fence, unless stream is RN_STREAM_UNFENCED: a caller that writes a
 * row in many short slices fences once at the end (rn_sfence), because a fence waits for
 * the write-combining buffers to drain and would stall every slice. */
#define RN_ELEMENTWISE(d, out, stream, PF, SCALAR, VECTOR)                              \
    do {                                                                                \
        Py_ssize_t k_ = 0, head_ = (stream) ? RN_NAME(stream_head)((out), (d)) : 0;     \
        int streamed_ = (stream) && head_ < (d);                                        \
        for (; k_ < head_; k_++) { SCALAR(k_) }                                         \
        if (streamed_) {                                                                \
            for (; k_ + RN_W <= (d); k_ += RN_W) {                                      \
                PF(k_);                                                                 \
                VECTOR(k_, RN_NAME(vstream))                                            \
            }                                                                           \
        } else {                                                                        \
            for (; k_ + RN_W <= (d); k_ += RN_W) {                                      \
                PF(k_);                                                                 \
                VECTOR(k_, RN_NAME(vstore))                                             \
            }                                                                           \
        }                                                                               \
        for (; k_ < (d); k_++) { SCALAR(k_) }                                           \
        if (streamed_ && (stream) != RN_STREAM_UNFENCED) rn_sfence();                   \
    } while (0)

/* Prefetches of the vector at k, one row ahead, for passes over x or over dy and x. */
#define RN_PFV_X(k) RN_NAME(prefetch_next)(x, d, (k), RN_W)
#define RN_PFV_DY_X(k) (RN_NAME(prefetch_next)(dy, d, (k), RN_W), RN_NAME(prefetch_next)(x, d, (k), RN_W))
