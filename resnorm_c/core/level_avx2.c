/* The core compiled for AVX2 with FMA and F16C (chosen at import when the CPU has all three:
 * dispatch.c; F16C converts float16).
 * FMA serves only sums of exact squares, where it gives the bits of a multiply and an add
 * (reduce.h); -ffp-contract=off keeps the compiler from fusing anything else. */
#include "rn_base.h"
#if RN_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#define RN_LEVEL 2
#define RN_ISA avx2
#define RN_VBYTES 32
#include "level.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
