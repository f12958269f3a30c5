/* The core compiled for AVX-512F, F16C and AVX512-BF16 (chosen at import when the CPU has
 * all three: dispatch.c).  The avx512 level with one difference: a whole vector of
 * float -> bfloat16 is rounded by vcvtneps2bf16 (vec.h, RN_BF16_NATIVE), in fewer
 * instructions than the integer rounding and with the same bits. */
#include "rn_base.h"
#if RN_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,f16c,avx512bf16"))), apply_to = function)
#else
#pragma GCC target("avx512f,f16c,avx512bf16")
#endif
#define RN_LEVEL 3
#define RN_ISA avx512bf16
#define RN_VBYTES 64
#define RN_BF16_NATIVE 1
#include "level.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
