/* Sums over rows: the float64 partial rows of the row blocks, added in block order, and
 * the total narrowed to the element type.  narrow is typed (element.h includes this file
 * once per element type); accumulate is untyped and defined once per level (level.h). */

#ifdef RN_UNTYPED
/* acc_i += part_i: folds one block's partial row into the running total (fixed order). */
static void RN_CAT(rn_accumulate_, RN_ISA)(double *acc, const double *part, Py_ssize_t d)
{
    for (Py_ssize_t i = 0; i < d; i++)
        acc[i] += part[i];
}
#else
#if RN_HALF
/* RN_DW doubles rounded to float by rn_half.h's rn_f64_to_f32_odd, in vector code (NaN
 * lanes as converted).  On avx512: converted toward zero, and where that was inexact, the
 * lowest bit set: the same float (of the two around d, the one whose last bit is odd),
 * in a third of the instructions of the portable form below. */
static inline RN_HVEC RN_NAME(f64_to_f32_odd)(RN_DVEC d)
{
#if RN_LEVEL == 3
    const __m256 t = _mm512_cvt_roundpd_ps((__m512d)d, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask8 inexact = _mm512_cmp_pd_mask(_mm512_cvtps_pd(t), (__m512d)d, _CMP_NEQ_OQ);
    const __m256i jam = _mm512_cvtepi64_epi32(_mm512_maskz_set1_epi64(inexact, 1));
    return (RN_HVEC)_mm256_or_ps(t, _mm256_castsi256_ps(jam));
#else
    /* rounded to nearest, and where that was inexact and came out even, the odd
     * neighbour on the side of d */
    typedef int64_t dmask __attribute__((vector_size(RN_DW * 8)));
    typedef int32_t hmask __attribute__((vector_size(RN_DW * 4)));
    const RN_HVEC f = __builtin_convertvector(d, RN_HVEC);
    const RN_DVEC back = __builtin_convertvector(f, RN_DVEC);
    const dmask inexact = (back != d) & (d == d);
    dmask ab, ad;   /* |back| and |d|: without their sign bits, ordered as integers */
    memcpy(&ab, &back, sizeof ab);
    memcpy(&ad, &d, sizeof ad);
    ab &= INT64_MAX;
    ad &= INT64_MAX;
    const hmask step = __builtin_convertvector(ab > ad, hmask) | 1;   /* -1 or +1 */
    RN_NAME(hw32) u;
    memcpy(&u, &f, sizeof u);
    const hmask even = (u & 1u) == 0;
    u += (RN_NAME(hw32))(__builtin_convertvector(inexact, hmask) & even & step);
    RN_HVEC r;
    memcpy(&r, &u, sizeof r);
    return r;
#endif
}
#endif

/* out_i = (T) acc_i, rounded once (for the 16-bit types through float rounded to odd, a
 * native vector at a time: with the conversions one by one, the LayerNorm backward of
 * (8, 4096) bfloat16 rows, whose dweight and dbias they round, took 26.8 us; in vectors
 * 20.5, and 18.4 with avx512's rounding toward zero in f64_to_f32_odd) */
static void RN_NAME(narrow)(RN_T *out, const double *acc, Py_ssize_t d)
{
    Py_ssize_t i = 0;
#if RN_HALF
    for (; i + RN_W <= d; i += RN_W) {
        RN_HVEC f[RN_NHALF];
        for (Py_ssize_t h = 0; h < RN_NHALF; h++) {
            RN_DVEC v;
            memcpy(&v, acc + i + h * RN_DW, sizeof v);
            f[h] = RN_NAME(f64_to_f32_odd)(v);
        }
        RN_NAME(vstore)(out + i, RN_NAME(join_halves)(f));
    }
#endif
    for (; i < d; i++)
        RN_NAME(st_double)(out + i, acc[i]);
}
#endif
