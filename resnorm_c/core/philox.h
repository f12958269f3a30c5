/* Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2,
 * 3", SC11): the counter-based generator behind dropout masks.  A pure function of a
 * 128-bit counter and a 64-bit key, so the uniform of an element is a function of
 * (seed, element index) alone: no state, nothing to advance, the same on every thread
 * count, ISA level and machine.  Backward regenerates a mask instead of storing it.
 *
 * An untyped template: level.h includes it once per level (RN_LEVEL, RN_ISA, RN_VBYTES
 * defined).  RN_PNAME(base) is rn_<base>_<level>, e.g. rn_dropout_bits_avx2.
 *
 * Element -> uniform map.  Flat element index i (C order) belongs to group G = i / 64.  A
 * group is sixteen Philox blocks with counters 16G + l (l = 0..15) and key (seed low 32
 * bits, seed high 32 bits); counter words are (c0, c1, c2, c3) = (low 32 bits of 16G + l,
 * high 32 bits, 0, 0).  Element i takes output word w = (i % 64) / 16 of block
 * l = i % 16.  Putting the lane index in the low bits means that one vector of blocks
 * yields sixteen consecutive elements per output word, with no transpose.
 *
 * A round, per block:  (hi0, lo0) = M0 * c0,  (hi1, lo1) = M1 * c2   (32x32 -> 64 bits)
 *                      c = (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
 * and the key is bumped by the Weyl constants between rounds.  The blocks of a group are
 * held one per 64-bit lane; each word sits in the low half of its lane, the high half is
 * don't-care (the multiply instruction reads only the low halves), so a round costs two
 * multiplies, two shifts and four xors per vector of blocks.
 */

#ifndef RN_PHILOX_CONSTANTS
#define RN_PHILOX_CONSTANTS
/* level-suffixed name (no element type): rn_<base>_<isa> */
#define RN_PNAME(base) RN_CAT(RN_CAT(rn_, base), RN_CAT(_, RN_ISA))
#define RN_PHILOX_M0 0xD2511F53u
#define RN_PHILOX_M1 0xCD9E8D57u
#define RN_PHILOX_W0 0x9E3779B9u
#define RN_PHILOX_W1 0xBB67AE85u
#define RN_PHILOX_ROUNDS 10
#define RN_PHILOX_GROUP 64 /* uniforms per group: 16 blocks x 4 words */

/* Runs STORE(k, u) for k in [0, n) with u the uniform of element start + k, RN_PGROUPS
 * groups at a time (a span may begin and end inside a group).  Needs RN_PGROUPS, which
 * each level defines. */
#define RN_PHILOX_SPAN(seed, start, n, STORE)                                           \
    do {                                                                                \
        uint32_t buf_[RN_PHILOX_GROUP * RN_PGROUPS];                                    \
        uint64_t g_ = (start) / RN_PHILOX_GROUP;                                        \
        Py_ssize_t off_ = (Py_ssize_t)((start) % RN_PHILOX_GROUP), k_ = 0;              \
        while (k_ < (n)) {                                                              \
            RN_PNAME(philox_groups)(buf_, (seed), g_);                                  \
            g_ += RN_PGROUPS;                                                           \
            Py_ssize_t c_ = RN_PHILOX_GROUP * RN_PGROUPS - off_;                        \
            if (c_ > (n) - k_) c_ = (n) - k_;                                           \
            const uint32_t *src_ = buf_ + off_;                                         \
            for (Py_ssize_t j_ = 0; j_ < c_; j_++) { STORE(k_ + j_, src_[j_]); }        \
            k_ += c_;                                                                   \
            off_ = 0;                                                                   \
        }                                                                               \
    } while (0)
#endif

#define RN_QL ((int)(RN_VBYTES / 8)) /* blocks per vector */
/* Groups per call: enough that a round has four independent vector chains to interleave
 * (a round is a chain of multiply -> shift -> xor; with only two vectors per round the
 * multiplier latency, not its throughput, would set the pace on avx512). */
#define RN_PGROUPS (RN_QL >= 8 ? 2 : 1)
#define RN_QN (16 * RN_PGROUPS / RN_QL) /* vectors per call */
typedef uint64_t RN_PNAME(qvec) __attribute__((vector_size(RN_VBYTES)));
typedef uint64_t RN_PNAME(qpair) __attribute__((vector_size(2 * RN_VBYTES)));
typedef uint32_t RN_PNAME(wpair) __attribute__((vector_size(RN_VBYTES)));
#define RN_QVEC RN_PNAME(qvec)
#define RN_QPAIR RN_PNAME(qpair)
#define RN_WPAIR RN_PNAME(wpair)

/* Low 32 bits of a times low 32 bits of b, as 64-bit products (vpmuludq / pmuludq; GCC
 * does not find it in the masked vector-extension spelling, which costs three multiplies). */
static inline RN_QVEC RN_PNAME(mul32)(RN_QVEC a, RN_QVEC b)
{
#if RN_LEVEL == 3
    return (RN_QVEC)_mm512_mul_epu32((__m512i)a, (__m512i)b);
#elif RN_LEVEL == 2
    return (RN_QVEC)_mm256_mul_epu32((__m256i)a, (__m256i)b);
#elif RN_LEVEL == 1
    return (RN_QVEC)_mm_mul_epu32((__m128i)a, (__m128i)b);
#else
    return (a & 0xffffffffu) * (b & 0xffffffffu);
#endif
}

/* The ten rounds for the blocks of groups g, g+1, .. (RN_PGROUPS of them), whose counters
 * are the consecutive 16g, 16g + 1, ...  On return c[w][v] holds output word w of the
 * blocks of vector v, each in the low half of its 64-bit lane. */
static inline __attribute__((always_inline)) void RN_PNAME(philox_rounds)(
    RN_QVEC c[4][RN_QN], uint64_t seed, uint64_t g)
{
    RN_QVEC lane;
    for (int l = 0; l < RN_QL; l++)
        lane[l] = (uint64_t)l;
    for (int v = 0; v < RN_QN; v++) {
        /* a multiple of RN_QL: the lanes of one vector never straddle a 2^32 boundary */
        const uint64_t first = g * 16 + (uint64_t)(v * RN_QL);
        c[0][v] = lane + (uint64_t)(uint32_t)first;
        c[1][v] = (RN_QVEC){0} + (first >> 32);
        c[2][v] = (RN_QVEC){0};
        c[3][v] = (RN_QVEC){0};
    }
    const RN_QVEC m0 = (RN_QVEC){0} + RN_PHILOX_M0, m1 = (RN_QVEC){0} + RN_PHILOX_M1;
    uint64_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma GCC unroll 10
    for (int r = 0; r < RN_PHILOX_ROUNDS; r++) {
        for (int v = 0; v < RN_QN; v++) {
            RN_QVEC p0 = RN_PNAME(mul32)(c[0][v], m0), p1 = RN_PNAME(mul32)(c[2][v], m1);
            RN_QVEC n0 = (p1 >> 32) ^ c[1][v] ^ k0, n2 = (p0 >> 32) ^ c[3][v] ^ k1;
            c[0][v] = n0;
            c[1][v] = p1; /* lo1 in the low half */
            c[2][v] = n2;
            c[3][v] = p0; /* lo0 */
        }
        k0 = (uint32_t)(k0 + RN_PHILOX_W0);
        k1 = (uint32_t)(k1 + RN_PHILOX_W1);
    }
}

/* u[0 .. 64 * RN_PGROUPS) := the uniforms of groups g, g+1, ..: elements 64g .. (see the
 * map above). */
static void RN_PNAME(philox_groups)(uint32_t *u, uint64_t seed, uint64_t g)
{
    RN_QVEC c[4][RN_QN];
    RN_PNAME(philox_rounds)(c, seed, g);
    for (int v = 0; v < RN_QN; v += 2) {
        /* the low halves, narrowed: word w of block b of group j goes to u[64j + 16w + b].
         * Two neighbouring vectors are narrowed together into one native-width store: the
         * readers load native vectors, and a load that spans two narrower stores cannot be
         * forwarded from the store buffer (it waits for both to reach the cache). */
        uint32_t *dst = u + 64 * (v * RN_QL / 16) + (v * RN_QL) % 16;
        for (int w = 0; w < 4; w++) {
            RN_QPAIR q;
            memcpy(&q, &c[w][v], sizeof c[w][v]);
            memcpy((char *)&q + sizeof c[w][v], &c[w][v + 1], sizeof c[w][v]);
            RN_WPAIR narrow = __builtin_convertvector(q, RN_WPAIR);
            memcpy(dst + 16 * w, &narrow, sizeof narrow);
        }
    }
}

/* Bit l set when the low half of lane l of c is >= t: an unsigned compare of the 32-bit
 * words straight into a bit mask (a mask register on avx512, movemask on avx2). */
static inline unsigned RN_PNAME(lanes_at_least)(RN_QVEC c, uint64_t t)
{
    const RN_QVEC low = c & 0xffffffffu;
#if RN_LEVEL == 3
    return _mm512_cmp_epu64_mask((__m512i)low, _mm512_set1_epi64((long long)t), _MM_CMPINT_NLT);
#elif RN_LEVEL == 2
    /* both sides are below 2^32, so the signed 64-bit compare is exact: below = t > low */
    __m256i below = _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)t), (__m256i)low);
    return ~(unsigned)_mm256_movemask_pd(_mm256_castsi256_pd(below)) & 0xFu;
#else
    unsigned bits = 0;
    for (int l = 0; l < RN_QL; l++)
        bits |= (unsigned)(low[l] >= t) << l;
    return bits;
#endif
}

/* words[j] := the keep bits of group g + j, j < count: bit b of word j is set when element
 * 64(g + j) + b is kept (its uniform >= threshold).  The dropout mask as the kernels hold
 * it, 1 bit per element.  The uniforms never leave the registers: one store per 64
 * elements, so the generator can run while streamed stores drain without queueing its own
 * stores behind them. */
static void RN_PNAME(dropout_bits)(uint64_t *words, uint64_t seed, uint64_t g, Py_ssize_t count,
                                   uint32_t threshold)
{
    const int per_group = 16 / RN_QL; /* vectors per group */
    RN_QVEC c[4][RN_QN];
    for (Py_ssize_t j = 0; j < count; j += RN_PGROUPS) {
        RN_PNAME(philox_rounds)(c, seed, g + (uint64_t)j);
        for (int q = 0; q < RN_PGROUPS && j + q < count; q++) {
            /* element 16w + b of the group is word w of block b = RN_QL * vv + lane */
            uint64_t bits = 0;
            for (int w = 0; w < 4; w++)
                for (int vv = 0; vv < per_group; vv++)
                    bits |= (uint64_t)RN_PNAME(lanes_at_least)(c[w][q * per_group + vv], threshold)
                            << (16 * w + RN_QL * vv);
            words[j + q] = bits;
        }
    }
}

/* u[k] := the uniform of element start + k, k in [0, n): for tests and teaching. */
static void RN_PNAME(philox_uniforms)(uint32_t *u, uint64_t seed, uint64_t start, Py_ssize_t n)
{
#define ST_(k, v) u[k] = (v)
    RN_PHILOX_SPAN(seed, start, n, ST_);
#undef ST_
}

/* keep[k] := 1 if the uniform of element start + k is >= threshold, else 0: the mask that
 * dropout applies, one byte per element, for return_mask and teaching (the kernels use
 * dropout_bits' words, which vec.h's vmult turns into multipliers). */
static void RN_PNAME(dropout_keep)(uint8_t *keep, uint64_t seed, uint64_t start, Py_ssize_t n,
                                   uint32_t threshold)
{
#define ST_(k, v) keep[k] = (uint8_t)((v) >= threshold)
    RN_PHILOX_SPAN(seed, start, n, ST_);
#undef ST_
}

#undef RN_WPAIR
#undef RN_QPAIR
#undef RN_QVEC
#undef RN_QN
#undef RN_PGROUPS
#undef RN_QL
