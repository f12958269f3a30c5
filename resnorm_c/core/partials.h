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
/* RN_DW doubles rounded to float by rn_half.h's rn_f64_to_f32_odd, in vector code (the
 * same operations lane by lane: float rounded to nearest, and where that was inexact and
 * came out even, the odd neighbour on the side of d; NaN lanes as converted). */
static inline RN_HVEC RN_NAME(f64_to_f32_odd)(RN_DVEC d)
{
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
}
#endif

/* out_i = (T) acc_i, rounded once (for the 16-bit types through float rounded to odd, a
 * native vector at a time: with the conversions one by one, the LayerNorm backward of
 * (8, 4096) bfloat16 rows, whose dweight and dbias they round, took 26.8 us, now 20.5) */
static void RN_NAME(narrow)(RN_T *out, const double *acc, Py_ssize_t d)
{
    Py_ssize_t i = 0;
#if RN_HALF
    for (; i + RN_W <= d; i += RN_W) {
        RN_C f[RN_W];
        for (Py_ssize_t h = 0; h < RN_NHALF; h++) {
            RN_DVEC v;
            memcpy(&v, acc + i + h * RN_DW, sizeof v);
            const RN_HVEC half = RN_NAME(f64_to_f32_odd)(v);
            memcpy(f + h * RN_DW, &half, sizeof half);
        }
        RN_VEC v;
        memcpy(&v, f, sizeof v);
        RN_NAME(vstore)(out + i, v);
    }
#endif
    for (; i < d; i++)
        RN_NAME(st_double)(out + i, acc[i]);
}
#endif
