/* The core compiled for AVX-512 (F, BW and VL: every AVX-512 CPU but the Xeon Phi has them)
 * and F16C, chosen at import when the CPU has them all (dispatch.c).  F16C converts float16,
 * BW's word permute widens bfloat16 (vec.h). */
#include "rn_base.h"
#if RN_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,f16c")
#endif
#define RN_LEVEL 3
#define RN_ISA avx512
#define RN_VBYTES 64
#include "level.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
