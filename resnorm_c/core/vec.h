/* Vector helpers of the typed templates: types, element loads and stores (whole, partial
 * and streamed vectors, single elements), widening to double, prefetch, dropout
 * multipliers, and the elementwise loop.  element.h includes this first, once per (level,
 * element type), with
 *
 *   RN_T       the element type as stored (float, double, rn_bf16 or rn_f16)
 *   RN_C       the type it is computed in (RN_T for float and double, float for the
 *              16-bit types)
 *   RN_TS      f32, f64, bf16 or f16 (name suffix)
 *   RN_TFLOAT  1 when RN_C is float, 0 when it is double
 *   RN_HALF    0, or RN_BF16 / RN_F16 for a 16-bit type (rn_half.h): stored as 16 bits,
 *              converted on every load and store
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

#if RN_HALF
/* ---- the 16-bit types: RN_W (or RN_DW) elements are RN_W 16-bit words, converted to and
 * from RN_W floats with the same bits as rn_half.h's scalar conversions (see there). */
typedef uint16_t RN_NAME(w16) __attribute__((vector_size(RN_VBYTES / 2)));
typedef uint32_t RN_NAME(w32) __attribute__((vector_size(RN_VBYTES)));
typedef uint16_t RN_NAME(hw16) __attribute__((vector_size(RN_DW * 2)));
typedef uint32_t RN_NAME(hw32) __attribute__((vector_size(RN_DW * 4)));
#if RN_HALF == RN_BF16
#define RN_TO_F32_ rn_bf16_to_f32
#define RN_FROM_F32_ rn_f32_to_bf16
#define RN_FROM_F64_ rn_f64_to_bf16
#else
#define RN_TO_F32_ rn_f16_to_f32
#define RN_FROM_F32_ rn_f32_to_f16
#define RN_FROM_F64_ rn_f64_to_f16
#endif

/* one element */
static inline RN_C RN_NAME(ld)(const RN_T *p) { return RN_TO_F32_(*p); }
static inline void RN_NAME(st)(RN_T *p, RN_C v) { *p = RN_FROM_F32_(v); }
/* a double rounded once (the sums over rows) */
static inline void RN_NAME(st_double)(RN_T *p, double v) { *p = RN_FROM_F64_(v); }

/* lane by lane with the scalar conversions (float16 without F16C) */
#define RN_LANES_IN_(VT, NL)                                                            \
    { VT v; for (int j_ = 0; j_ < (NL); j_++) v[j_] = RN_TO_F32_(p[j_]); return v; }
#define RN_LANES_OUT_(NL)                                                               \
    { for (int j_ = 0; j_ < (NL); j_++) p[j_] = RN_FROM_F32_(v[j_]); }

#if RN_HALF == RN_BF16 && RN_LEVEL == 3
/* bfloat16 in: each word on top of 16 zero bits.  Out: rn_bf16_round_bits, the same
 * integer operations lane by lane (a NaN lane selected by mask).  The widenings and the
 * narrowing are spelled out: GCC lowers the vector-extension forms below into several
 * half-width steps here. */
static inline RN_VEC RN_NAME(from_words)(__m256i w)
{
    /* word j to the top half of lane j, the bottom halves zeroed: one word permute (a
     * zero-extension and a shift took two of the shuffle and shift units' slots) */
    const __m512i idx = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0,
                                         7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    return (RN_VEC)_mm512_castsi512_ps(
        _mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, _mm512_castsi256_si512(w)));
}
static inline RN_VEC RN_NAME(vload)(const RN_T *p)
{
    return RN_NAME(from_words)(_mm256_loadu_si256((const __m256i *)p));
}
static inline RN_HVEC RN_NAME(hload)(const RN_T *p)
{
    const __m256i idx = _mm256_set_epi16(7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    return (RN_HVEC)_mm256_castsi256_ps(_mm256_maskz_permutexvar_epi16(
        0xAAAAu, idx, _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p))));
}
static inline __m256i RN_NAME(round_words)(__m512i u)
{
    const __m512i top = _mm512_srli_epi32(u, 16);
    const __m512i odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(top, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}
static inline __m256i RN_NAME(to_words)(RN_VEC v)
{
    const __m512i u = _mm512_castps_si512((__m512)v);
#if RN_BF16_CVT
    /* vcvtneps2bf16 rounds to nearest even and quiets a NaN (top | 0x40) as round_words
     * does, but takes a denormal float for zero: a vector holding one is rounded by
     * round_words instead (vfpclassps class 0x20: denormal, either sign; one instruction
     * where testing exponent and fraction took two) */
    const __mmask16 denormal = _mm512_fpclass_ps_mask((__m512)v, 0x20);
    if (__builtin_expect(denormal == 0, 1))
        return (__m256i)_mm512_cvtneps_pbh((__m512)v);
#endif
    return RN_NAME(round_words)(u);
}
static inline void RN_NAME(vstore)(RN_T *p, RN_VEC v)
{
    _mm256_storeu_si256((__m256i *)p, RN_NAME(to_words)(v));
}
#elif RN_HALF == RN_BF16 && RN_LEVEL == 2
/* bfloat16 in: each word to the top half of its lane, the bottom half zeroed, in one byte
 * shuffle (the 8-word load broadcast to both 128-bit halves is a load, not a shuffle) */
static inline RN_VEC RN_NAME(vload)(const RN_T *p)
{
    const __m256i top = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                         -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1,
                                         14, 15);
    const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return (RN_VEC)_mm256_castsi256_ps(_mm256_shuffle_epi8(w, top));
}
static inline RN_HVEC RN_NAME(hload)(const RN_T *p)
{
    const __m128i top = _mm_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7);
    return (RN_HVEC)_mm_castsi128_ps(
        _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)p), top));
}
static inline void RN_NAME(vstore)(RN_T *p, RN_VEC v)
{
    /* rn_bf16_round_bits with the result in the top half of each lane: u + 0x7fff + odd,
     * or for a NaN lane (rare: tested once per vector) u | 0x400000; then one byte shuffle
     * gathers the top halves of each 128-bit half, and a 64-bit permute joins them (where
     * a shift, an absolute value, a compare, a blend and a pack of the halves took more) */
    const __m256i u = _mm256_castps_si256((__m256)v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
    const __m256 nan = _mm256_cmp_ps((__m256)v, (__m256)v, _CMP_UNORD_Q);
    if (__builtin_expect(!_mm256_testz_ps(nan, nan), 0))
        r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)),
                               _mm256_castps_si256(nan));
    const __m256i tops = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1,
                                          -1, -1, 2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1,
                                          -1, -1, -1, -1);
    const __m256i w = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(r, tops), 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(w));
}
#elif RN_HALF == RN_BF16
/* bfloat16 in: a shift.  Out: rn_bf16_round_bits in vector code, lane selects for NaN. */
#define RN_BF16_IN_(VT, W16, W32)                                                       \
    { W16 b; memcpy(&b, p, sizeof b);                                                   \
      return (VT)(__builtin_convertvector(b, W32) << 16); }
#define RN_BF16_OUT_(W16, W32)                                                          \
    { const W32 u = (W32)v;                                                             \
      const W32 nan = (W32)((u & 0x7fffffffu) > 0x7f800000u);                           \
      const W32 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;                             \
      const W16 b = __builtin_convertvector((nan & ((u >> 16) | 0x40u)) | (~nan & r), W16); \
      memcpy(p, &b, sizeof b); }
static inline RN_VEC RN_NAME(vload)(const RN_T *p) RN_BF16_IN_(RN_VEC, RN_NAME(w16), RN_NAME(w32))
static inline RN_HVEC RN_NAME(hload)(const RN_T *p) RN_BF16_IN_(RN_HVEC, RN_NAME(hw16), RN_NAME(hw32))
static inline void RN_NAME(vstore)(RN_T *p, RN_VEC v) RN_BF16_OUT_(RN_NAME(w16), RN_NAME(w32))
#undef RN_BF16_IN_
#undef RN_BF16_OUT_
#elif RN_LEVEL == 3
/* float16 with F16C: vcvtph2ps, and vcvtps2ph with round-to-nearest-even in the
 * instruction (not taken from MXCSR) */
static inline RN_VEC RN_NAME(from_words)(__m256i w) { return (RN_VEC)_mm512_cvtph_ps(w); }
static inline RN_VEC RN_NAME(vload)(const RN_T *p)
{
    return RN_NAME(from_words)(_mm256_loadu_si256((const __m256i *)p));
}
static inline RN_HVEC RN_NAME(hload)(const RN_T *p)
{
    return (RN_HVEC)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline __m256i RN_NAME(to_words)(RN_VEC v)
{
    return _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT);
}
static inline void RN_NAME(vstore)(RN_T *p, RN_VEC v)
{
    _mm256_storeu_si256((__m256i *)p, RN_NAME(to_words)(v));
}
#elif RN_LEVEL == 2
static inline RN_VEC RN_NAME(vload)(const RN_T *p)
{
    return (RN_VEC)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline RN_HVEC RN_NAME(hload)(const RN_T *p)
{
    return (RN_HVEC)_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p));
}
static inline void RN_NAME(vstore)(RN_T *p, RN_VEC v)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT));
}
#else
static inline RN_VEC RN_NAME(vload)(const RN_T *p) RN_LANES_IN_(RN_VEC, RN_W)
static inline RN_HVEC RN_NAME(hload)(const RN_T *p) RN_LANES_IN_(RN_HVEC, RN_DW)
static inline void RN_NAME(vstore)(RN_T *p, RN_VEC v) RN_LANES_OUT_(RN_W)
#endif
#undef RN_LANES_IN_
#undef RN_LANES_OUT_
#undef RN_TO_F32_
#undef RN_FROM_F32_
#undef RN_FROM_F64_

#if RN_LEVEL == 3
/* Partial vectors (0 < n < RN_W): the first n elements, as pairs of elements in masked
 * 32-bit lanes and an odd last one on its own; the other lanes 0.  Nothing at or past
 * p + n is touched.  Through a buffer and memcpy, as below, they took a quarter of the
 * time of rms_norm over rows of 256 bfloat16 ((65536, 256), streamed: each row, 16 bytes
 * into a cache line, has two); AVX512BW's 16-bit masks, one masked load or store each,
 * made add_layer_norm there 1.15x slower. */
static inline RN_VEC RN_NAME(vload_n)(const RN_T *p, Py_ssize_t n)
{
    __m512i w = _mm512_maskz_loadu_epi32((__mmask16)((1u << (n >> 1)) - 1), p);
    if (n & 1)
        w = _mm512_mask_set1_epi32(w, (__mmask16)(1u << (n >> 1)),
                                   (int)p[n - 1].bits);
    return RN_NAME(from_words)(_mm512_castsi512_si256(w));
}

static inline void RN_NAME(vstore_n)(RN_T *p, RN_VEC v, Py_ssize_t n)
{
    const __m256i w = RN_NAME(to_words)(v);
    _mm512_mask_storeu_epi32(p, (__mmask16)((1u << (n >> 1)) - 1), _mm512_castsi256_si512(w));
    if (n & 1) {
        uint16_t t[RN_W];
        _mm256_storeu_si256((__m256i *)t, w);
        p[n - 1].bits = t[n - 1];
    }
}
#else
/* partial vectors through a buffer of RN_W elements: nothing at or past p + n is touched */
static inline RN_VEC RN_NAME(vload_n)(const RN_T *p, Py_ssize_t n)
{
    RN_T t[RN_W];
    memset(t, 0, sizeof t);
    memcpy(t, p, (size_t)n * sizeof(RN_T));
    return RN_NAME(vload)(t);
}

static inline void RN_NAME(vstore_n)(RN_T *p, RN_VEC v, Py_ssize_t n)
{
    RN_T t[RN_W];
    RN_NAME(vstore)(t, v);
    memcpy(p, t, (size_t)n * sizeof(RN_T));
}
#endif

/* Non-temporal store of RN_W elements (half a native vector of bytes, aligned to that) */
static inline void RN_NAME(vstream)(RN_T *p, RN_VEC v)
{
    RN_T t[RN_W];
    RN_NAME(vstore)(t, v);
#if RN_LEVEL == 3
    _mm256_stream_si256((__m256i *)p, _mm256_loadu_si256((const __m256i *)t));
#elif RN_LEVEL == 2
    _mm_stream_si128((__m128i *)p, _mm_loadu_si128((const __m128i *)t));
#else
    memcpy(p, t, sizeof t);
#endif
}
#else /* float and double */
/* one element */
static inline RN_C RN_NAME(ld)(const RN_T *p) { return *p; }
static inline void RN_NAME(st)(RN_T *p, RN_C v) { *p = v; }
static inline void RN_NAME(st_double)(RN_T *p, double v) { *p = (RN_T)v; }

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

/* Non-temporal store of one native vector; p must be RN_VBYTES-aligned (RN_SBYTES). */
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

#endif /* RN_HALF */

/* Lanes 0 .. n-1 of v into p[0 .. n) (0 < n < RN_W) with non-temporal stores, for the
 * partial vectors at the ends of a streamed row (rn_stream_bytes; the portable level
 * streams nothing). */
static inline void RN_NAME(vstream_n)(RN_T *p, RN_VEC v, Py_ssize_t n)
{
#if RN_LEVEL >= 1
    RN_T t[RN_W];
    RN_NAME(vstore)(t, v);
    rn_stream_bytes(p, t, (size_t)n * sizeof(RN_T));
#else
    RN_NAME(vstore_n)(p, v, n);
#endif
}

#define RN_LD(p) RN_NAME(ld)(p)
#define RN_ST(p, v) RN_NAME(st)((p), (v))

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

/* The native vector whose halves (of RN_DW lanes each) are h[0 .. RN_NHALF), joined in
 * registers: through memory (two half stores, one whole load) the load waited on store
 * forwarding. */
static inline RN_VEC RN_NAME(join_halves)(const RN_HVEC h[RN_NHALF])
{
#if RN_TFLOAT && RN_LEVEL == 3
    return (RN_VEC)_mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd((__m256)h[0])), _mm256_castps_pd((__m256)h[1]),
        1));
#elif RN_TFLOAT && RN_LEVEL == 2
    return (RN_VEC)_mm256_insertf128_ps(_mm256_castps128_ps256((__m128)h[0]), (__m128)h[1], 1);
#else
    RN_VEC v;
    memcpy(&v, h, sizeof v);
    return v;
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

/* The bytes of RN_W stored elements: RN_VBYTES, or half of it for the 16-bit types. */
#define RN_SBYTES ((uintptr_t)(RN_W * sizeof(RN_T)))

/* Leading elements before out + k is aligned to RN_SBYTES (at most d, and fewer than RN_W;
 * 0 when out is not even aligned to its element size, and no element will ever be
 * aligned). */
static inline Py_ssize_t RN_NAME(align_head)(const RN_T *out, Py_ssize_t d)
{
    uintptr_t addr = (uintptr_t)out;
    if (addr % sizeof(RN_T) != 0)
        return 0;
    Py_ssize_t k = (Py_ssize_t)(((RN_SBYTES - addr % RN_SBYTES) % RN_SBYTES) / sizeof(RN_T));
    return k < d ? k : d;
}

/* Whether out and out2 sit at the same offset from a vector boundary, so that the vectors
 * of one loop are aligned in both (NULL out2: no second output). */
static inline int RN_NAME(same_phase)(const RN_T *out, const RN_T *out2)
{
    return out2 == NULL || ((uintptr_t)out - (uintptr_t)out2) % RN_VBYTES == 0;
}

/* Prefetch the cache lines of p[d + i .. d + i + count): the same span, one row ahead.
 * Callers prefetch only rows that exist (the primitives' `ahead`: rows that follow in the
 * array).  A prefetch past an array's end is no error, but where the next page is not
 * mapped each line costs a page walk that fails and is not remembered: a call on the last
 * rows of an array at the end of the heap took 8-12x its time.  Built with
 * RN_CHECKED_PREFETCH (the sanitizer build, tools/sanitize.sh), each line is read instead,
 * so AddressSanitizer reports a prefetch outside its array. */
static inline void RN_NAME(prefetch_next)(const RN_T *p, Py_ssize_t d, Py_ssize_t i,
                                          Py_ssize_t count)
{
    const char *a = (const char *)(p + d + i);
    for (Py_ssize_t b = 0; b < count * (Py_ssize_t)sizeof(RN_T); b += 64)
#ifdef RN_CHECKED_PREFETCH
        (void)*(const volatile char *)(a + b);
#else
        __builtin_prefetch(a + b, 0, RN_PF_LOCALITY);
#endif
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
 * computed, so a vector lane equals the scalar keep_mult.  A vector's bits are
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
/* The multiplier of element pos: scale where its keep bit is set, else 0. */
static inline RN_C RN_NAME(keep_mult)(const uint8_t *keep, Py_ssize_t pos, RN_C scale)
{
    return ((keep[pos >> 3] >> (pos & 7)) & 1) ? scale : (RN_C)0;
}

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

/* The residual branch alpha * (x * m) and the residual sum h = residual + alpha * (x * m)
 * at element k (a vector of lanes from k), m = scale where the keep bit of element kpos + k
 * is set, else 0 (alpha, keep NULL: 1).  Written once, in the one order of operations every
 * kernel forms them in, so all of them compute the same bits of h.  LOAD and MULT are the
 * width's load and keep multipliers: RN_GET or vload and vmult (RN_W lanes), hload and hmult
 * (RN_DW lanes), RN_LD and keep_mult (one element).  They read the caller's x, residual,
 * alpha, keep, kpos and sc (the scale as RN_C). */
#define RN_RESIDUAL_BRANCH(LOAD, MULT, k)                                                  \
    ({ __typeof__(LOAD(x + (k))) rb_ = LOAD(x + (k));                                      \
       if (keep) { rb_ *= MULT(keep, kpos + (k), sc); }                                    \
       if (alpha) { rb_ *= LOAD(alpha + (k)); }                                            \
       rb_; })
#define RN_RESIDUAL_SUM(LOAD, MULT, k) (LOAD(residual + (k)) + RN_RESIDUAL_BRANCH(LOAD, MULT, k))

/* ---------------------------------------------------------------- the elementwise loop
 *
 * Runs BODY(k) for the vectors of a row of d elements: k is the vector's first element,
 * and inside BODY the macros RN_GET(p) and RN_PUT(p, v) load and store the vector's
 * elements of a row p (and RN_ADD_WIDENED(part, v) adds it to a double partial).  The
 * vectors are placed so that the stores into `out` are aligned: a partial vector first
 * (lanes up to the first vector boundary of out), whole vectors, a partial vector last.
 * A store that crosses a cache line costs as much as two, and NumPy's large arrays start
 * 16 bytes into a page.  The whole row is streamed, partial vectors too, when `stream` is
 * set (and out is element-aligned); PF(k) prefetches the next row's span of the vector at
 * k, partial vectors included: where the rows do not start on a cache line, the lines of
 * a row's first and last partial vectors hold no whole vector, and with 64-byte vectors
 * (avx512) they were never prefetched: a miss to memory on every row (the norms' backward
 * at (65536, 256) float32, avx512, rows 16 bytes into a line: 1.4-1.6x the time).
 * Streamed stores are followed by a store fence, unless stream is RN_STREAM_UNFENCED:
 * a caller that writes a row in many short slices fences once at the end (rn_sfence),
 * because a fence waits for the write-combining buffers to drain and would stall every
 * slice.
 *
 * Each expansion of BODY sees its vector's kind as n_ (lanes in use) and s_ (RN_WHOLE,
 * RN_STREAMED, RN_PART or RN_PART_STREAMED), constants in the loops over whole vectors, so
 * the compiler keeps one kind of load and store in each loop. */
#ifndef RN_WHOLE
#define RN_WHOLE 0
#define RN_STREAMED 1
#define RN_PART 2
#define RN_PART_STREAMED 3
#endif

static inline __attribute__((always_inline)) RN_VEC RN_NAME(vget)(const RN_T *p, Py_ssize_t n,
                                                                   int s)
{
    return s == RN_PART || s == RN_PART_STREAMED ? RN_NAME(vload_n)(p, n)
                                                 : RN_NAME(vload)(p);
}

static inline __attribute__((always_inline)) void RN_NAME(vput)(RN_T *p, RN_VEC v, Py_ssize_t n,
                                                                 int s)
{
    if (s == RN_PART) RN_NAME(vstore_n)(p, v, n);
    else if (s == RN_PART_STREAMED) RN_NAME(vstream_n)(p, v, n);
    else if (s == RN_STREAMED) RN_NAME(vstream)(p, v);
    else RN_NAME(vstore)(p, v);
}

#define RN_GET(p) RN_NAME(vget)((p), n_, s_)
#define RN_PUT(p, v) RN_NAME(vput)((p), (v), n_, s_)

/* The parameters (weight, bias) and their gradients' totals, at element k of p: of the
 * element type, or (pf set: the 16-bit types' mixed passes, float32 parameters beside
 * 16-bit rows) float32's, whose lanes enter the same arithmetic.  pf is a constant of each
 * caller (an always-inline pass with a constant argument), so each instance keeps one kind
 * of load and store.  RN_GETP and RN_PUTP inside RN_ELEMENTWISE, RN_VLOADP and RN_LDP (a
 * whole vector, one element) in the reductions. */
#if RN_HALF
#define RN_F32_(base) RN_CAT3(base, f32, RN_ISA)
#define RN_GETP(p, k) (pf ? RN_F32_(vget)((const float *)(p) + (k), n_, s_)                 \
                          : RN_GET((const RN_T *)(p) + (k)))
#define RN_PUTP(p, k, v, n, s) (pf ? RN_F32_(vput)((float *)(p) + (k), (v), (n), (s))         \
                                   : RN_NAME(vput)((RN_T *)(p) + (k), (v), (n), (s)))
#define RN_VLOADP(p, k) (pf ? RN_F32_(vload)((const float *)(p) + (k))                       \
                            : RN_NAME(vload)((const RN_T *)(p) + (k)))
#define RN_LDP(p, k) (pf ? RN_F32_(ld)((const float *)(p) + (k))                           \
                         : RN_LD((const RN_T *)(p) + (k)))
#else
#define RN_GETP(p, k) RN_GET((const RN_T *)(p) + (k))
#define RN_PUTP(p, k, v, n, s) RN_NAME(vput)((RN_T *)(p) + (k), (v), (n), (s))
#define RN_VLOADP(p, k) RN_NAME(vload)((const RN_T *)(p) + (k))
#define RN_LDP(p, k) RN_LD((const RN_T *)(p) + (k))
#endif
#define RN_ADD_WIDENED(part, v) RN_NAME(add_widened)((part), (v), n_)

#define RN_ELEMENTWISE(d, out, stream, PF, BODY)                                        \
    do {                                                                                \
        const Py_ssize_t d_ = (d);                                                      \
        Py_ssize_t k_ = RN_NAME(align_head)((out), d_);                                 \
        const int streamed_ = (stream) && (uintptr_t)(out) % sizeof(RN_T) == 0;         \
        const int part_ = streamed_ ? RN_PART_STREAMED : RN_PART;                       \
        if (k_ > 0) {                                                                   \
            const Py_ssize_t n_ = k_; const int s_ = part_;                             \
            (void)n_; (void)s_; PF(0); BODY(0)                                          \
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
            const Py_ssize_t n_ = d_ - k_; const int s_ = part_;                        \
            (void)n_; (void)s_; PF(k_); BODY(k_)                                        \
        }                                                                               \
        if (streamed_ && (stream) != RN_STREAM_UNFENCED) rn_sfence();                   \
    } while (0)

/* Prefetch of the vector at k of the output's next row (when there is one: `ahead`), for
 * a pass whose inputs a reduction pass has prefetched already (a line read ahead is owned
 * when the store comes; streamed stores need none). */
#define RN_PFV_OUT(out, k)                                                              \
    do { if (ahead && s_ == RN_WHOLE) RN_NAME(prefetch_next)((out), d, (k), RN_W); } while (0)
