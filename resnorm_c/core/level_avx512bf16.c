/* The avx512 level with the CPU's bfloat16 conversion (AVX512-BF16: vcvtneps2bf16, chosen at
 * import when the CPU has it: dispatch.c).  Everything else is the avx512 level's code; the
 * conversion gives the bits of the integer rounding of the other levels (vec.h, to_words),
 * with AVX512DQ's vfpclassps finding the subnormals it would flush. */
#include "rn_base.h"
#if RN_X86
#if defined(__clang__)
#pragma clang attribute push(                                                               \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,avx512bf16"))),         \
    apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,avx512bf16")
#endif
#define RN_LEVEL 3
#define RN_BF16_CVT 1
#define RN_ISA avx512bf16
#define RN_VBYTES 64
#include "level.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
