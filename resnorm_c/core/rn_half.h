/* The 16-bit element types, bfloat16 and float16: stored as 16 bits, computed in float32.
 * One-member structs, so that C and Cython's fused types tell them apart from each other
 * and from integers (a bare uint16_t would take integer arithmetic without a word).
 *
 * The scalar conversions below are exact IEEE conversions with round-to-nearest-even, in
 * integer arithmetic: float32 -> 16 bits rounds once; NaN stays a quiet NaN (sign and the
 * top payload bits kept); a value past the largest finite one rounds to inf exactly as
 * round-to-nearest-even says; subnormals are kept (never flushed).  vec.h's vector
 * loads and stores compute the same bits (bfloat16: the same integer formula in vector
 * code; float16: the F16C instructions on avx2/avx512, which are the same exact IEEE
 * conversions, and these scalar functions lane by lane elsewhere).
 */
#ifndef RESNORM_RN_HALF_H
#define RESNORM_RN_HALF_H

#include <stdint.h>
#include <string.h>
#include <math.h>

/* RN_HALF of the typed templates (vec.h) */
#define RN_BF16 1
#define RN_F16 2

typedef struct { uint16_t bits; } rn_bf16;
typedef struct { uint16_t bits; } rn_f16;

static inline uint32_t rn_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float rn_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- bfloat16: the top half of a float32 */

static inline float rn_bf16_to_f32(rn_bf16 h) { return rn_bits_f32((uint32_t)h.bits << 16); }

/* round-to-nearest-even on the low 16 bits; a NaN keeps its top bits and is made quiet */
static inline uint16_t rn_bf16_round_bits(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline rn_bf16 rn_f32_to_bf16(float f)
{
    rn_bf16 h = {rn_bf16_round_bits(rn_f32_bits(f))};
    return h;
}

/* ---- float16: 1 sign, 5 exponent, 10 fraction bits */

static inline float rn_f16_to_f32(rn_f16 h)
{
    const uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
    const uint32_t e = (h.bits >> 10) & 0x1fu, m = h.bits & 0x3ffu;
    if (e == 0x1f) /* inf, or a NaN made quiet */
        return rn_bits_f32(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u));
    if (e == 0) /* zero or subnormal: m * 2^-24, exact in float */
        return rn_bits_f32(sign | rn_f32_bits((float)m * 0x1p-24f));
    return rn_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t rn_f16_round_bits(uint32_t u)
{
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top payload bits kept (as vcvtps2ph does) */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* from 65520 (the tie between 65504 and 2^16) up: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* a normal float16: rebias the exponent, round 13 bits */
        const uint32_t r = a - 0x38000000u;
        return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    const uint32_t e = a >> 23;
    if (e < 102) /* below 2^-25 (half the smallest subnormal): to zero */
        return (uint16_t)sign;
    /* subnormal: the 24-bit significand in units of 2^-24, shifted right and rounded */
    const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    return (uint16_t)(sign | (q + (rem > half || (rem == half && (q & 1u)))));
}

static inline rn_f16 rn_f32_to_f16(float f)
{
    rn_f16 h = {rn_f16_round_bits(rn_f32_bits(f))};
    return h;
}

/* ---- from double, rounded once: double -> float rounded to odd, then to 16 bits with
 * round-to-nearest-even.  Rounding to odd keeps every bit that decides the second
 * rounding (float has 13 or more bits beyond either 16-bit format), so the result is the
 * double correctly rounded. */
static inline float rn_f64_to_f32_odd(double d)
{
    const float f = (float)d;
    if (isnan(d) || (double)f == d)
        return f;
    uint32_t u = rn_f32_bits(f);
    if (!(u & 1u)) /* f is the even neighbour: the odd one lies between f and d */
        u = fabs((double)f) > fabs(d) ? u - 1 : u + 1;
    return rn_bits_f32(u);
}

static inline rn_bf16 rn_f64_to_bf16(double d) { return rn_f32_to_bf16(rn_f64_to_f32_odd(d)); }
static inline rn_f16 rn_f64_to_f16(double d) { return rn_f32_to_f16(rn_f64_to_f32_odd(d)); }

#endif /* RESNORM_RN_HALF_H */
