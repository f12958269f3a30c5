/* Reductions: one row in, a float64 sum out (typed template; element.h includes it after
 * vec.h).
 *
 * Element i of a row goes into lane i % 32 of thirty-two double accumulators, held as
 * native vectors (4 x 8 doubles on avx512, 8 x 4 on avx2, 16 x 2 on sse2), and the lanes
 * are folded in one fixed pairwise order.  Many independent add chains keep the adders
 * busy, and because the lane structure is the same on every level, results are bitwise
 * identical on every level, thread count and machine, not merely close.
 *
 * RMSNorm's forward statistic (the cached rstd) widens every element to double, which is
 * exact, and squares in double (x^2 of a float near 1e30 would overflow float): it is as
 * good as a float64 reference.  LayerNorm's (RN_SHIFTED_SUMS) sum float rows in float
 * lanes added into double ones every 16 elements per lane (docs/accuracy.md's contract);
 * the rows float lanes cannot carry take the two-pass sums below, in double.  The square
 * of a widened float is exact in double (24 significant bits squared fit in 53), so where
 * the level has FMA, adding it with one fused multiply-add gives bitwise the sum that
 * multiplying, then adding, gives on the levels without (add_exact_square).
 *
 * The backward terms are products of normalised values (dy*w * x*rstd), formed in the
 * input precision; each lane first sums the terms of up to RN_BLOCK consecutive elements
 * of its own (i, i+32, i+64, ...) in the input precision, and only that block sum is
 * widened and added in double (RN_REDUCE_BLOCKED): widening float to double is a
 * lane-crossing conversion that limited these passes when done per term.
 */

/* The lanes of acc (lane l in acc[l / RN_DW][l % RN_DW]) summed pairwise: lane j + lane
 * j+16, then j + j+8, ...: whole vectors while the distance spans them, then within one,
 * by halves of the vector in registers (through memory, the scalar loads of the lanes
 * waited on the vector's store: a fifth of the LayerNorm forward's time at D = 256). */
static inline double RN_NAME(fold_acc)(RN_DVEC *acc)
{
    for (Py_ssize_t s = 16; s >= RN_DW; s /= 2)
        for (Py_ssize_t q = 0; q < s / RN_DW; q++)
            acc[q] += acc[q + s / RN_DW];
#if RN_LEVEL == 3
    const __m256d a4 = _mm256_add_pd(_mm512_castpd512_pd256((__m512d)acc[0]),
                                     _mm512_extractf64x4_pd((__m512d)acc[0], 1));
    const __m128d a2 = _mm_add_pd(_mm256_castpd256_pd128(a4), _mm256_extractf128_pd(a4, 1));
#elif RN_LEVEL == 2
    const __m128d a2 = _mm_add_pd(_mm256_castpd256_pd128((__m256d)acc[0]),
                                  _mm256_extractf128_pd((__m256d)acc[0], 1));
#elif RN_LEVEL == 1
    const __m128d a2 = (__m128d)acc[0];
#endif
#if RN_LEVEL >= 1
    return _mm_cvtsd_f64(_mm_add_sd(a2, _mm_unpackhi_pd(a2, a2)));
#else
    double lanes[RN_DW];
    memcpy(lanes, acc, sizeof lanes);
    for (Py_ssize_t s = RN_DW / 2; s >= 1; s /= 2)
        for (Py_ssize_t j = 0; j < s; j++)
            lanes[j] += lanes[j + s];
    return lanes[0];
#endif
}

/* acc + v*v where v*v is exact (v holds widened floats): one FMA where the level has it,
 * the same bits as the multiply and add of the other levels. */
static inline RN_DVEC RN_NAME(add_exact_square)(RN_DVEC acc, RN_DVEC v)
{
#if RN_TFLOAT && RN_LEVEL == 3
    return (RN_DVEC)_mm512_fmadd_pd((__m512d)v, (__m512d)v, (__m512d)acc);
#elif RN_TFLOAT && RN_LEVEL == 2
    return (RN_DVEC)_mm256_fmadd_pd((__m256d)v, (__m256d)v, (__m256d)acc);
#else
    return acc + v * v;
#endif
}

/* Adds a term of every element into the 32 lanes and folds them into `result`.
 * ADD(a, i): a plus the terms of elements i .. i+RN_DW-1 (a an RN_DVEC of lanes);
 * STERM(i): one term, as a double, computed exactly as its lane of ADD is.  PF(i):
 * prefetch for chunk i.  The first chunk sets the lanes (+0 plus its terms) rather than
 * adding to lanes zeroed before: the compiler zeroed the array of lanes in memory with a
 * string store at every row, which stalled the stores of the lanes after the loop. */
#define RN_REDUCE(d, PF, ADD, STERM, result)                                            \
    do {                                                                                \
        const RN_DVEC zero_ = {0};                                                      \
        RN_DVEC acc_[RN_NACC];                                                          \
        Py_ssize_t i_ = 0;                                                              \
        if ((d) >= 32) {                                                                \
            PF(0);                                                                      \
            for (int q_ = 0; q_ < RN_NACC; q_++)                                        \
                acc_[q_] = ADD(zero_, q_ * RN_DW);                                      \
            i_ = 32;                                                                    \
        } else {                                                                        \
            for (int q_ = 0; q_ < RN_NACC; q_++)                                        \
                acc_[q_] = zero_;                                                       \
        }                                                                               \
        for (; i_ + 32 <= (d); i_ += 32) {                                              \
            PF(i_);                                                                     \
            for (int q_ = 0; q_ < RN_NACC; q_++)                                        \
                acc_[q_] = ADD(acc_[q_], i_ + q_ * RN_DW);                              \
        }                                                                               \
        if (i_ < (d)) {                                                                 \
            double lanes_[32];                                                          \
            memcpy(lanes_, acc_, sizeof lanes_);                                        \
            for (Py_ssize_t j_ = 0; i_ + j_ < (d); j_++)                                \
                lanes_[j_] += STERM(i_ + j_);                                           \
            memcpy(acc_, lanes_, sizeof lanes_);                                        \
        }                                                                               \
        (result) = RN_NAME(fold_acc)(acc_);                                             \
    } while (0)

/* Elements per lane summed in the input precision before widening (RN_REDUCE_BLOCKED).
 * A block sum of float terms carries at most RN_BLOCK - 1 float roundings of the block's
 * terms: with 8, at most 7 * 2^-24 of the sum of their magnitudes.  double needs no
 * first stage. */
#define RN_BLOCK (RN_TFLOAT ? 8 : 1)

/* K sums at once of terms formed in the input precision (the backward products).
 * TERMS(i, t) sets t[0 .. K) to the K terms of elements i .. i+RN_W-1 as native vectors;
 * STERMS(i, s) sets s[0 .. K) to the K terms of element i, as doubles, computed exactly as
 * their lanes in TERMS.  The row goes in groups of 32 elements, and blocks of RN_BLOCK
 * groups (from the row's start; the last block may be shorter): lane j sums the terms of
 * its elements of a block in the input precision, in index order, then widens that sum
 * once into its double accumulator.  The blocks are defined on the 32 lanes, not on the
 * vector width, so every level computes the same bits.  The scalar tail (fewer than 32
 * elements) adds its terms unblocked.  results[0 .. K) receive the K sums. */
#define RN_REDUCE_BLOCKED(K, d, PF, TERMS, STERMS, results)                             \
    do {                                                                                \
        const RN_DVEC zero_ = {0};                                                      \
        RN_DVEC acc_[K][RN_NACC], w_[RN_NHALF];                                         \
        RN_VEC f_[K][32 / RN_W], t_[K];                                                 \
        double lanes_[32], s_[K];                                                       \
        Py_ssize_t i_ = 0;                                                              \
        while (i_ + 32 <= (d)) {                                                        \
            /* a block's sums start at its first terms (+0 + t would give t but         \
             * for t = -0, whose sign the lanes, starting at +0, drop anyway) */        \
            PF(i_);                                                                     \
            for (int c_ = 0; c_ < 32 / RN_W; c_++) {                                    \
                TERMS(i_ + c_ * RN_W, t_);                                              \
                for (int q_ = 0; q_ < (K); q_++)                                        \
                    f_[q_][c_] = t_[q_];                                                \
            }                                                                           \
            i_ += 32;                                                                   \
            for (int b_ = 1; b_ < RN_BLOCK && i_ + 32 <= (d); b_++, i_ += 32) {         \
                PF(i_);                                                                 \
                for (int c_ = 0; c_ < 32 / RN_W; c_++) {                                \
                    TERMS(i_ + c_ * RN_W, t_);                                          \
                    for (int q_ = 0; q_ < (K); q_++)                                    \
                        f_[q_][c_] += t_[q_];                                           \
                }                                                                       \
            }                                                                           \
            /* the lanes start at +0, with the first block (i_ is past it) */           \
            for (int q_ = 0; q_ < (K); q_++)                                            \
                for (int c_ = 0; c_ < 32 / RN_W; c_++) {                                \
                    RN_NAME(widen_vec)(f_[q_][c_], w_);                                 \
                    for (int h_ = 0; h_ < RN_NHALF; h_++) {                             \
                        RN_DVEC *a_ = &acc_[q_][c_ * RN_NHALF + h_];                    \
                        *a_ = (i_ <= RN_BLOCK * 32 ? zero_ : *a_) + w_[h_];             \
                    }                                                                   \
                }                                                                       \
        }                                                                               \
        if (i_ == 0)                                                                    \
            for (int q_ = 0; q_ < (K); q_++)                                            \
                for (int l_ = 0; l_ < RN_NACC; l_++)                                    \
                    acc_[q_][l_] = zero_;                                               \
        for (int q_ = 0; q_ < (K); q_++) {                                              \
            if (i_ < (d)) {                                                             \
                memcpy(lanes_, acc_[q_], sizeof lanes_);                                \
                for (Py_ssize_t j_ = 0; i_ + j_ < (d); j_++) {                          \
                    STERMS(i_ + j_, s_);                                                \
                    lanes_[j_] += s_[q_];                                               \
                }                                                                       \
                memcpy(acc_[q_], lanes_, sizeof lanes_);                                \
            }                                                                           \
            (results)[q_] = RN_NAME(fold_acc)(acc_[q_]);                                \
        }                                                                               \
    } while (0)

/* The next row's chunk at i of x (and of a second row p), when there is a next row: ahead,
 * the rows that follow this one in the array, is a parameter of every prefetching
 * primitive. */
#define RN_PF_X(i) do { if (ahead) RN_NAME(prefetch_next)(x, d, (i), 32); } while (0)
#define RN_PF_PX(p, i)                                                                  \
    do {                                                                                \
        if (ahead) {                                                                    \
            RN_NAME(prefetch_next)((p), d, (i), 32);                                    \
            RN_NAME(prefetch_next)(x, d, (i), 32);                                      \
        }                                                                               \
    } while (0)
#define RN_PF_DY_X(i) RN_PF_PX(dy, i)

static inline RN_DVEC RN_NAME(square)(RN_DVEC v) { return v * v; }

/* sum_i x_i */
static double RN_NAME(sum)(const RN_T *x, Py_ssize_t d, Py_ssize_t ahead)
{
    double r;
#define A_(a, i) ((a) + RN_NAME(dload)(x + (i)))
#define S_(i) ((double)RN_LD(x + (i)))
    RN_REDUCE(d, RN_PF_X, A_, S_, r);
#undef A_
#undef S_
    return r;
}

/* sum_i x_i^2 */
static double RN_NAME(sumsq)(const RN_T *x, Py_ssize_t d, Py_ssize_t ahead)
{
    double r;
#if RN_TFLOAT
#define A_(a, i) RN_NAME(add_exact_square)((a), RN_NAME(dload)(x + (i)))
#else
#define A_(a, i) ((a) + RN_NAME(square)(RN_NAME(dload)(x + (i))))
#endif
#define S_(i) ((double)RN_LD(x + (i)) * (double)RN_LD(x + (i)))
    RN_REDUCE(d, RN_PF_X, A_, S_, r);
#undef A_
#undef S_
    return r;
}

/* sum_i (x_i - mean)^2: the second pass of a two-pass variance, never E[x^2] - E[x]^2.
 * The first pass (sum) prefetched the next row already. */
static double RN_NAME(sumsqdev)(const RN_T *x, Py_ssize_t d, double mean)
{
    double r;
#define PF_(i)
#define A_(a, i) ((a) + RN_NAME(square)(RN_NAME(dload)(x + (i)) - mean))
#define S_(i) (((double)RN_LD(x + (i)) - mean) * ((double)RN_LD(x + (i)) - mean))
    RN_REDUCE(d, PF_, A_, S_, r);
#undef PF_
#undef A_
#undef S_
    return r;
}

/* a + b * 1 with one rounding, on native vectors of the compute type: bitwise a + b, but
 * on the multiply-add units where the level has them, beside the adders that the sums
 * keep busy. */
static inline RN_VEC RN_NAME(add_on_fma)(RN_VEC a, RN_VEC b)
{
#if RN_LEVEL == 3 && RN_TFLOAT
    return (RN_VEC)_mm512_fmadd_ps((__m512)b, _mm512_set1_ps(1.0f), (__m512)a);
#elif RN_LEVEL == 3
    return (RN_VEC)_mm512_fmadd_pd((__m512d)b, _mm512_set1_pd(1.0), (__m512d)a);
#elif RN_LEVEL == 2 && RN_TFLOAT
    return (RN_VEC)_mm256_fmadd_ps((__m256)b, _mm256_set1_ps(1.0f), (__m256)a);
#elif RN_LEVEL == 2
    return (RN_VEC)_mm256_fmadd_pd((__m256d)b, _mm256_set1_pd(1.0), (__m256d)a);
#else
    return a + b;
#endif
}

/* The shift c (RN_SHIFTED_SUMS) rounded to a multiple of a power of two G about 2^-12 of
 * the spread of the row's first 32 elements (ss: their sum of squares about c): in float
 * lanes x - c is then exact, or rounds away only bits of x.  With c's own low bits (a mean
 * of 32 elements, finer than the elements near it) every x - c of one binade rounded the
 * same way: a bias of up to half an ulp in the mean.  c stays within G/2 of where it was,
 * far closer to the mean than the statistics need (shifted_moments).  Rows whose first
 * chunk is constant or not finite keep c. */
static inline double RN_NAME(coarse_shift)(double c, double ss)
{
    if (!(ss > 0.0 && ss <= DBL_MAX))
        return c;
    uint64_t bits;
    memcpy(&bits, &ss, sizeof bits);
    /* the exponent of sqrt(ss / 32), less 12 (>> of a negative int: floor, as GCC does) */
    int eg = ((((int)(bits >> 52) & 0x7ff) - 1023 - 5) >> 1) - 12;
    if (eg < -1022)
        eg = -1022;
    bits = (uint64_t)(eg + 1023) << 52;
    double g;
    memcpy(&g, &bits, sizeof g);
    const double t = c / g;
    if (fabs(t) >= 0x1p51)
        return c;   /* c's own grid is already coarser than g */
    return ((t + 0x1.8p52) - 0x1.8p52) * g;   /* t rounded to the nearest integer */
}

/* Chunks of 32 elements whose terms a lane sums in the compute type before they are added
 * into its double accumulator (RN_SHIFTED_SUMS): 16 for float, as the accuracy contract's
 * float32 lanes (docs/accuracy.md); double lanes are never flushed, so they keep one sum
 * per lane. */
#define RN_FLUSH (RN_TFLOAT ? 16 : PY_SSIZE_T_MAX / 32)

/* The moments of a row about a shift c near its mean, in one pass (the LayerNorm forward's
 * statistics; shifted_moments in norm_kernels.pxd says when they stand):
 *   c = the mean of the row's first min(d, 32) elements, rounded to the compute type,
 *   sums[0] = c,  sums[1] = sum_i (v_i - c),  sums[2] = sum_i (v_i - c)^2.
 * Element i goes to lane i % 32.  A lane forms v - c, (v - c)^2 and their sums in the
 * compute type (float lanes: twice as many per vector as double's, and no conversion per
 * element) for RN_FLUSH chunks, then adds the two sums into its double accumulators; the
 * 32 double lanes are folded as RN_REDUCE's.  The lane structure and the operations (no
 * FMA) are the same on every level, so every level gives the same bits.
 * VLOAD(i): elements i .. i+RN_W-1 as a native vector of the compute type; VFIRST(i): the
 * same for i < 32, the first chunk, which is read twice (for c, then for the sums);
 * SLOAD(i): element i as a double, for rows under 32 and the last partial chunk, whose
 * terms are formed in double (v - c is exact there).  PF(i): prefetch for chunk i.  Every
 * accumulator starts from its first terms (+0 plus them), not from lanes zeroed in memory.
 * c is a fold of fixed lanes, rounded to the compute type and, for float lanes, to a
 * coarser grid (coarse_shift): v - c is then exact, or rounds only bits of v.  The subtractions, and
 * every other accumulator of the first sum, go to the multiply-add units (add_on_fma),
 * beside the adders that the squares' sums keep busy. */
#define RN_SHIFTED_SUMS(d, PF, VFIRST, VLOAD, SLOAD, sums)                              \
    do {                                                                                \
        const RN_DVEC dzero_ = {0};                                                     \
        const RN_VEC zero_ = {0};                                                       \
        RN_DVEC s1_[RN_NACC], s2_[RN_NACC], w1_[RN_NHALF], w2_[RN_NHALF];               \
        RN_VEC f1_[32 / RN_W], f2_[32 / RN_W];                                          \
        double c_ = 0.0;                                                                \
        Py_ssize_t i_ = 0;                                                              \
        if ((d) >= 32) {                                                                \
            for (int q_ = 0; q_ < 32 / RN_W; q_++) {                                    \
                RN_NAME(widen_vec)(VFIRST(q_ * RN_W), w1_);                             \
                for (int h_ = 0; h_ < RN_NHALF; h_++)                                   \
                    s1_[q_ * RN_NHALF + h_] = dzero_ + w1_[h_];                         \
            }                                                                           \
            c_ = RN_NAME(fold_acc)(s1_) / 32;                                           \
        } else {                                                                        \
            for (Py_ssize_t j_ = 0; j_ < (d); j_++)                                     \
                c_ += SLOAD(j_);                                                        \
            c_ = (d) > 0 ? c_ / (d) : 0.0;                                              \
        }                                                                               \
        c_ = (double)(RN_C)c_;                                                          \
        if (RN_TFLOAT && (d) >= 32) {                                                   \
            for (int q_ = 0; q_ < 32 / RN_W; q_++) {                                    \
                RN_NAME(widen_vec)(VFIRST(q_ * RN_W), w1_);                             \
                for (int h_ = 0; h_ < RN_NHALF; h_++) {                                 \
                    const RN_DVEC e_ = w1_[h_] - c_;                                    \
                    s1_[q_ * RN_NHALF + h_] = dzero_ + e_ * e_;                         \
                }                                                                       \
            }                                                                           \
            c_ = (double)(RN_C)RN_NAME(coarse_shift)(c_, RN_NAME(fold_acc)(s1_));       \
        }                                                                               \
        const RN_VEC minus_c_ = zero_ - (RN_C)c_;                                       \
        const Py_ssize_t whole_ = (d) - (d) % 32;                                       \
        for (; i_ < whole_; ) {                                                         \
            const Py_ssize_t end_ = whole_ - i_ > 32 * RN_FLUSH ? i_ + 32 * RN_FLUSH    \
                                                                : whole_;               \
            PF(i_);                                                                     \
            for (int q_ = 0; q_ < 32 / RN_W; q_++) {                                    \
                const RN_VEC v_ = RN_NAME(add_on_fma)(                                  \
                    i_ ? VLOAD(i_ + q_ * RN_W) : VFIRST(q_ * RN_W), minus_c_);          \
                f1_[q_] = zero_ + v_;                                                   \
                f2_[q_] = zero_ + v_ * v_;                                              \
            }                                                                           \
            for (i_ += 32; i_ < end_; i_ += 32) {                                       \
                PF(i_);                                                                 \
                for (int q_ = 0; q_ < 32 / RN_W; q_++) {                                \
                    const RN_VEC v_ = RN_NAME(add_on_fma)(VLOAD(i_ + q_ * RN_W),        \
                                                           minus_c_);                   \
                    f1_[q_] = q_ % 2 ? f1_[q_] + v_ : RN_NAME(add_on_fma)(f1_[q_], v_); \
                    f2_[q_] += v_ * v_;                                                 \
                }                                                                       \
            }                                                                           \
            for (int q_ = 0; q_ < 32 / RN_W; q_++) {                                    \
                RN_NAME(widen_vec)(f1_[q_], w1_);                                       \
                RN_NAME(widen_vec)(f2_[q_], w2_);                                       \
                for (int h_ = 0; h_ < RN_NHALF; h_++) {                                 \
                    const int l_ = q_ * RN_NHALF + h_;                                  \
                    s1_[l_] = (i_ <= 32 * RN_FLUSH ? dzero_ : s1_[l_]) + w1_[h_];       \
                    s2_[l_] = (i_ <= 32 * RN_FLUSH ? dzero_ : s2_[l_]) + w2_[h_];       \
                }                                                                       \
            }                                                                           \
        }                                                                               \
        if (whole_ == 0)                                                                \
            for (int q_ = 0; q_ < RN_NACC; q_++)                                        \
                s1_[q_] = s2_[q_] = dzero_;                                             \
        if (i_ < (d)) {                                                                 \
            double l1_[32], l2_[32];                                                    \
            memcpy(l1_, s1_, sizeof l1_);                                               \
            memcpy(l2_, s2_, sizeof l2_);                                               \
            for (Py_ssize_t j_ = 0; i_ + j_ < (d); j_++) {                              \
                const double v_ = SLOAD(i_ + j_) - c_;                                  \
                l1_[j_] += v_;                                                          \
                l2_[j_] += v_ * v_;                                                     \
            }                                                                           \
            memcpy(s1_, l1_, sizeof l1_);                                               \
            memcpy(s2_, l2_, sizeof l2_);                                               \
        }                                                                               \
        (sums)[0] = c_;                                                                 \
        (sums)[1] = RN_NAME(fold_acc)(s1_);                                             \
        (sums)[2] = RN_NAME(fold_acc)(s2_);                                             \
    } while (0)

/* sums = (c, sum_i (x_i - c), sum_i (x_i - c)^2) of RN_SHIFTED_SUMS */
static void RN_NAME(shifted_sums)(double *sums, const RN_T *x, Py_ssize_t d, Py_ssize_t ahead)
{
#define L_(i) RN_NAME(vload)(x + (i))
#define S_(i) ((double)RN_LD(x + (i)))
    RN_SHIFTED_SUMS(d, RN_PF_X, L_, L_, S_, sums);
#undef L_
#undef S_
}

/* RMSNorm backward reduction: sum_i g_i * xn_i with g = dy*w, xn = x*rstd (w NULL: 1); w of
 * the element type, or float32 (pf: see RN_GETP in vec.h). */
static inline __attribute__((always_inline)) double RN_NAME(rms_bwd_dot_p)(
    const RN_T *dy, const RN_T *x, const void *w, int pf, double rstd, Py_ssize_t d,
    Py_ssize_t ahead)
{
    const RN_C r = (RN_C)rstd;
    double s[1];
    (void)pf;
#define T_(i, t) { t[0] = RN_NAME(vload)(dy + (i)) * RN_VLOADP(w, i) *                      \
                          (RN_NAME(vload)(x + (i)) * r); }
#define S_(i, s) { s[0] = (double)(RN_LD(dy + (i)) * RN_LDP(w, i) * (RN_LD(x + (i)) * r)); }
    if (w) RN_REDUCE_BLOCKED(1, d, RN_PF_DY_X, T_, S_, s);
#undef T_
#undef S_
#define T_(i, t) { t[0] = RN_NAME(vload)(dy + (i)) * (RN_NAME(vload)(x + (i)) * r); }
#define S_(i, s) { s[0] = (double)(RN_LD(dy + (i)) * (RN_LD(x + (i)) * r)); }
    else RN_REDUCE_BLOCKED(1, d, RN_PF_DY_X, T_, S_, s);
#undef T_
#undef S_
    return s[0];
}

/* The two LayerNorm-backward reductions in one pass, with g = dy*w (w NULL: 1) and
 * xhat = (x - mean)*rstd:  *sum_g = sum g,  *sum_gxhat = sum g*xhat; w as in
 * rms_bwd_dot_p. */
static inline __attribute__((always_inline)) void RN_NAME(ln_bwd_sums_p)(
    double *sum_g, double *sum_gxhat, const RN_T *dy, const RN_T *x, const void *w, int pf,
    double mean, double rstd, Py_ssize_t d, Py_ssize_t ahead)
{
    RN_C mh, ml;
    RN_NAME(split_mean)(mean, &mh, &ml);
    const RN_C r = (RN_C)rstd;
    double s[2];
    (void)pf;
#define T_(i, t) { RN_VEC g_ = RN_NAME(vload)(dy + (i));                                  \
                   if (w) { g_ *= RN_VLOADP(w, i); }                                      \
                   t[0] = g_;                                                             \
                   t[1] = g_ * (((RN_NAME(vload)(x + (i)) - mh) - ml) * r); }
#define S_(i, s) { RN_C g_ = RN_LD(dy + (i)); if (w) { g_ *= RN_LDP(w, i); }              \
                   s[0] = (double)g_;                                                     \
                   s[1] = (double)(g_ * (((RN_LD(x + (i)) - mh) - ml) * r)); }
    RN_REDUCE_BLOCKED(2, d, RN_PF_DY_X, T_, S_, s);
#undef T_
#undef S_
    *sum_g = s[0];
    *sum_gxhat = s[1];
}

static double RN_NAME(rms_bwd_dot)(const RN_T *dy, const RN_T *x, const RN_T *w, double rstd,
                                   Py_ssize_t d, Py_ssize_t ahead)
{
    return RN_NAME(rms_bwd_dot_p)(dy, x, w, 0, rstd, d, ahead);
}

static void RN_NAME(ln_bwd_sums)(double *sum_g, double *sum_gxhat, const RN_T *dy,
                                 const RN_T *x, const RN_T *w, double mean, double rstd,
                                 Py_ssize_t d, Py_ssize_t ahead)
{
    RN_NAME(ln_bwd_sums_p)(sum_g, sum_gxhat, dy, x, w, 0, mean, rstd, d, ahead);
}

#if RN_HALF
/* rms_bwd_dot and ln_bwd_sums of 16-bit rows with float32 parameters: bitwise float32's on
 * the widened rows (the same terms in float, the same lanes). */
static double RN_NAME(rms_bwd_dot_mixed)(const RN_T *dy, const RN_T *x, const float *w,
                                         double rstd, Py_ssize_t d, Py_ssize_t ahead)
{
    return RN_NAME(rms_bwd_dot_p)(dy, x, w, 1, rstd, d, ahead);
}

static void RN_NAME(ln_bwd_sums_mixed)(double *sum_g, double *sum_gxhat, const RN_T *dy,
                                       const RN_T *x, const float *w, double mean, double rstd,
                                       Py_ssize_t d, Py_ssize_t ahead)
{
    RN_NAME(ln_bwd_sums_p)(sum_g, sum_gxhat, dy, x, w, 1, mean, rstd, d, ahead);
}
#endif

#if !RN_HALF
/* The residual passes below are float's and double's: the fused forward of the 16-bit types
 * stores h rounded, then normalises it with the norms' own reductions. */

/* The residual sum of a row, h_k = residual_k + alpha_k * (x_k * m_k) (RN_RESIDUAL_SUM: m_k
 * scale or 0; alpha, keep NULL: 1), formed in the input precision exactly as residual_add
 * forms it, then reduced without being stored:
 *   sum_k (h_k - shift)     (squares = 0, shift = 0: the LayerNorm mean pass)
 *   sum_k (h_k - shift)^2   (squares = 1: shift = 0 for RMSNorm, = mean for LayerNorm)
 * with RN_REDUCE's lanes, so the result is bitwise sum / sumsq / sumsqdev of the stored h.
 * A pass that only loads: nothing waits behind streamed stores still draining (a plain
 * store would, as stores leave the core in program order).  x and residual are prefetched
 * one row ahead; the apply pass (residual_norm_apply) finds the row in cache. */
static double RN_NAME(residual_reduce)(const RN_T *residual, const RN_T *x, const RN_T *alpha,
                                       const uint8_t *keep, Py_ssize_t kpos, double scale,
                                       Py_ssize_t d, int squares, double shift,
                                       Py_ssize_t ahead)
{
    const RN_C sc = (RN_C)scale;
    double s;
#define PF_(i) RN_PF_PX(residual, i)
#define H_(i) RN_NAME(widen)(RN_RESIDUAL_SUM(RN_NAME(hload), RN_NAME(hmult), i))
#define HS_(i) ((double)RN_RESIDUAL_SUM(RN_LD, RN_NAME(keep_mult), i) - shift)
#define S1_(i) ({ double t_ = HS_(i); t_ * t_; })
    /* one expansion per case: h - 0 is h itself (and, for float, its square is exact) */
#define A0_(a, i) ((a) + H_(i))
#define A1_(a, i) ((a) + (H_(i) - shift))
#if RN_TFLOAT
#define A2_(a, i) RN_NAME(add_exact_square)((a), H_(i))
#else
#define A2_(a, i) ((a) + RN_NAME(square)(H_(i)))
#endif
#define A3_(a, i) ((a) + RN_NAME(square)(H_(i) - shift))
    if (!squares && shift == 0.0) RN_REDUCE(d, PF_, A0_, HS_, s);
    else if (!squares) RN_REDUCE(d, PF_, A1_, HS_, s);
    else if (shift == 0.0) RN_REDUCE(d, PF_, A2_, S1_, s);
    else RN_REDUCE(d, PF_, A3_, S1_, s);
#undef PF_
#undef H_
#undef HS_
#undef S1_
#undef A0_
#undef A1_
#undef A2_
#undef A3_
    return s;
}


/* RN_SHIFTED_SUMS of the residual sum h of residual_reduce, not stored: (c, sum (h - c),
 * sum (h - c)^2), bitwise shifted_sums of the stored h (float, double).  x and residual
 * are prefetched one row ahead. */
static void RN_NAME(residual_shifted_sums)(double *sums, const RN_T *residual, const RN_T *x,
                                           const RN_T *alpha, const uint8_t *keep,
                                           Py_ssize_t kpos, double scale, Py_ssize_t d,
                                           Py_ssize_t ahead)
{
    const RN_C sc = (RN_C)scale;
#define PF_(i) RN_PF_PX(residual, i)
#define L_(i) RN_RESIDUAL_SUM(RN_NAME(vload), RN_NAME(vmult), i)
#define S_(i) ((double)RN_RESIDUAL_SUM(RN_LD, RN_NAME(keep_mult), i))
    /* The plain add (no alpha, no dropout) gets its own expansion: with the branches left
     * in, the compiler tests both at every vector. */
    if (!alpha && !keep) {
        const RN_T *alpha = NULL;
        const uint8_t *keep = NULL;
        RN_SHIFTED_SUMS(d, PF_, L_, L_, S_, sums);
    }
    else RN_SHIFTED_SUMS(d, PF_, L_, L_, S_, sums);
#undef PF_
#undef L_
#undef S_
}

/* h_k = residual_k + alpha_k * (x_k * m_k) stored, formed exactly as residual_add forms it,
 * and reduced as it goes: sum_k h_k^2, RMSNorm's sum of squares.  Each vector of h is
 * widened into the lanes RN_REDUCE gives its elements, so the result is bitwise sumsq of
 * the stored h: the first pass of the fused RMSNorm forward when h stays in cache for the
 * norm's next pass (one pass fewer than residual_add, then sumsq).  x and residual are
 * prefetched one row ahead. */
static double RN_NAME(residual_add_reduce)(RN_T *h, const RN_T *residual, const RN_T *x,
                                           const RN_T *alpha, const uint8_t *keep,
                                           Py_ssize_t kpos, double scale, Py_ssize_t d,
                                           Py_ssize_t ahead)
{
    const RN_C sc = (RN_C)scale;
    const RN_DVEC zero = {0};
    RN_DVEC acc[RN_NACC], wide[RN_NHALF];
    Py_ssize_t i = 0;
#define H_(k) ({ RN_VEC v_ = RN_RESIDUAL_SUM(RN_NAME(vload), RN_NAME(vmult), k);          \
                 RN_NAME(vstore)(h + (k), v_); v_; })
#if RN_TFLOAT
#define SQ_(a, v) RN_NAME(add_exact_square)((a), (v))
#else
#define SQ_(a, v) ((a) + RN_NAME(square)(v))
#endif
    /* One chunk of 32 elements; LANE(l): what lane l adds its square to (the first chunk
     * sets the lanes, +0 plus its squares, rather than adding to lanes zeroed in memory,
     * which the compiler did with a string store at every row). */
#define CHUNK_(LANE)                                                                    \
    do {                                                                                \
        if (ahead) {                                                                    \
            RN_NAME(prefetch_next)(x, d, i, 32);                                        \
            RN_NAME(prefetch_next)(residual, d, i, 32);                                 \
        }                                                                               \
        for (int c = 0; c < 32 / RN_W; c++) {                                           \
            RN_NAME(widen_vec)(H_(i + c * RN_W), wide);                                 \
            for (int q = 0; q < RN_NHALF; q++)                                          \
                acc[c * RN_NHALF + q] = SQ_(LANE(c * RN_NHALF + q), wide[q]);           \
        }                                                                               \
    } while (0)
#define ZERO_(l) zero
#define ACC_(l) acc[l]
#define PASS_                                                                           \
    if (d >= 32) {                                                                      \
        CHUNK_(ZERO_);                                                                  \
        for (i = 32; i + 32 <= d; i += 32)                                              \
            CHUNK_(ACC_);                                                               \
    } else {                                                                            \
        for (int q = 0; q < RN_NACC; q++)                                               \
            acc[q] = zero;                                                              \
    }
    /* The plain add (no alpha, no dropout) gets its own expansion: with the branches left
     * in, the compiler tests both at every vector. */
    if (!alpha && !keep) { const RN_T *alpha = NULL; const uint8_t *keep = NULL; PASS_ }
    else PASS_
    if (i < d) {
        double lanes[32];
        memcpy(lanes, acc, sizeof lanes);
        for (Py_ssize_t j = 0; i + j < d; j++) {
            const Py_ssize_t k = i + j;
            const RN_C v = RN_RESIDUAL_SUM(RN_LD, RN_NAME(keep_mult), k);
            RN_ST(h + k, v);
            lanes[j] += (double)v * (double)v;
        }
        memcpy(acc, lanes, sizeof lanes);
    }
#undef H_
#undef SQ_
#undef CHUNK_
#undef ZERO_
#undef ACC_
#undef PASS_
    return RN_NAME(fold_acc)(acc);
}

/* RN_SHIFTED_SUMS of h_k = residual_k + alpha_k * (x_k * m_k), stored as it goes (formed
 * exactly as residual_add forms it): bitwise shifted_sums of the stored h, in the pass that
 * stores it (the fused LayerNorm forward when h stays in cache for the norm's next pass).
 * The first 32 elements of h are stored first and read back for c; every element of x and
 * residual is read before h's element is written, so h may be either. */
static void RN_NAME(residual_add_shifted_sums)(double *sums, RN_T *h, const RN_T *residual,
                                               const RN_T *x, const RN_T *alpha,
                                               const uint8_t *keep, Py_ssize_t kpos,
                                               double scale, Py_ssize_t d, Py_ssize_t ahead)
{
    const RN_C sc = (RN_C)scale;
    if (d >= 32)
        for (int k = 0; k < 32 / RN_W; k++)
            RN_NAME(vstore)(h + k * RN_W,
                            RN_RESIDUAL_SUM(RN_NAME(vload), RN_NAME(vmult), k * RN_W));
    else
        for (Py_ssize_t k = 0; k < d; k++)
            RN_ST(h + k, RN_RESIDUAL_SUM(RN_LD, RN_NAME(keep_mult), k));
#define PF_(i) RN_PF_PX(residual, i)
#define F_(i) RN_NAME(vload)(h + (i))
#define L_(i) ({ const RN_VEC v_ = RN_RESIDUAL_SUM(RN_NAME(vload), RN_NAME(vmult), i);    \
                 RN_NAME(vstore)(h + (i), v_);                                          \
                 v_; })
#define S_(i) ({ RN_C v_;                                                               \
                 if ((i) < 32) v_ = RN_LD(h + (i));                                     \
                 else {                                                                 \
                     v_ = RN_RESIDUAL_SUM(RN_LD, RN_NAME(keep_mult), i);                \
                     RN_ST(h + (i), v_);                                                \
                 }                                                                      \
                 (double)v_; })
    /* The first chunk (F_) is h read back, the others are formed and stored (L_): two
     * macros, where one that tested the index at every vector put a branch in the loop.
     * The plain add gets its own expansion, as in residual_shifted_sums. */
    if (!alpha && !keep) {
        const RN_T *alpha = NULL;
        const uint8_t *keep = NULL;
        RN_SHIFTED_SUMS(d, PF_, F_, L_, S_, sums);
    }
    else RN_SHIFTED_SUMS(d, PF_, F_, L_, S_, sums);
#undef PF_
#undef F_
#undef L_
#undef S_
}
#endif

#undef RN_REDUCE
#undef RN_SHIFTED_SUMS
#undef RN_FLUSH
#undef RN_REDUCE_BLOCKED
#undef RN_BLOCK
#undef RN_PF_X
#undef RN_PF_PX
#undef RN_PF_DY_X
