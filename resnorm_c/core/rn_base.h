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
#include <float.h>

#if defined(__x86_64__) || defined(__i386__)
#define RN_X86 1
#include <immintrin.h>
#define rn_sfence() _mm_sfence()
#else
#define RN_X86 0
#define rn_sfence() ((void)0)
#endif

#if RN_X86
/* n bytes from t to p with non-temporal stores: pieces of 16, 8 and 4 bytes, each aligned
 * to its size, lowest address first (p and n even; a 2-byte piece off a 4-byte boundary,
 * which no non-temporal store writes, is stored plainly).  The partial vectors at the two
 * ends of a streamed row go through here: stored plainly (a masked store into a line the
 * rest of the row streams), they made rms_norm over rows of 256 floats take 1.3x the time
 * when the output started 16 bytes past a vector boundary, as NumPy's large arrays do. */
static inline void rn_stream_bytes(void *p, const void *t, size_t n)
{
    char *q = (char *)p;
    const char *s = (const char *)t;
    while (n > 0) {
        uintptr_t a = (uintptr_t)q;
        size_t k;
        if (n >= 16 && a % 16 == 0) {
            _mm_stream_si128((__m128i *)q, _mm_loadu_si128((const __m128i *)s));
            k = 16;
#if defined(__x86_64__)
        } else if (n >= 8 && a % 8 == 0) {
            long long v;
            memcpy(&v, s, 8);
            _mm_stream_si64((long long *)q, v);
            k = 8;
#endif
        } else if (n >= 4 && a % 4 == 0) {
            int v;
            memcpy(&v, s, 4);
            _mm_stream_si32((int *)q, v);
            k = 4;
        } else {
            memcpy(q, s, 2);
            k = 2;
        }
        q += k;
        s += k;
        n -= k;
    }
}
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
