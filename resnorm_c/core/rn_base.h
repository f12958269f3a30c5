/* What every part of the compiled core shares: the architecture test, the streaming-store
 * flags and fence, the rows of a backward group, and the name-pasting helpers.
 *
 * The core needs GCC or Clang (vector extensions and __attribute__((target))).
 */
#ifndef RESNORM_RN_BASE_H
#define RESNORM_RN_BASE_H

#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#define RN_X86 1
#include <immintrin.h>
#define rn_sfence() _mm_sfence()
#else
#define RN_X86 0
#define rn_sfence() ((void)0)
#endif

/* `stream` argument of the elementwise primitives: 0 = ordinary stores, 1 = non-temporal
 * stores then a store fence, RN_STREAM_UNFENCED = non-temporal stores, the caller fences. */
#define RN_STREAM_UNFENCED 2

/* Rows per call of the multi-row backward passes (backward.h). */
#define RN_GROUP 4

/* Prefetch hint for the next row: 2 = into L2 (measured best here), 3 = into L1. */
#ifndef RN_PF_LOCALITY
#define RN_PF_LOCALITY 2
#endif

#define RN_CAT_(a, b) a##b
#define RN_CAT(a, b) RN_CAT_(a, b)
/* rn_<base>_<type>_<level>, the name of a typed primitive's instance (e.g. rn_sum_f32_avx2) */
#define RN_CAT3(a, b, c) RN_CAT(RN_CAT(RN_CAT(rn_, a), RN_CAT(_, b)), RN_CAT(_, c))

#endif /* RESNORM_RN_BASE_H */
