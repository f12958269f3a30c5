/* Reductions: one row in, a float64 sum out (typed template; element.h includes it after
 * vec.h).
 *
 * Element i of a row goes into lane i % 32 of thirty-two double accumulators, held as
 * native vectors (4 x 8 doubles on avx512, 8 x 4 on avx2, 16 x 2 on sse2), and the lanes
 * are folded in one fixed pairwise order.  Many independent add chains keep the adders
 * busy, and because the lane structure is the same on every level, results are bitwise
 * identical on every level, thread count and machine, not merely close.  A term is widened
 * to double before it is added: the forward statistics square in double (x^2 of a float
 * near 1e30 would overflow float); the backward terms are products of normalised values
 * (dy*w * x*rstd), formed in the input precision and widened once per pair of elements
 * (RN_REDUCE_PAIRED).
 */

/* The 32 lanes summed pairwise: lane j + lane j+16, then j + j+8, ... */
static inline double RN_NAME(fold32)(double *lanes)
{
    for (int s = 16; s >= 1; s /= 2)
        for (int j = 0; j < s; j++)
            lanes[j] += lanes[j + s];
    return lanes[0];
}

/* Adds a term of every element into the 32 lanes and folds them into `result`.
 * VTERM(i): the terms of elements i .. i+RN_DW-1 as an RN_DVEC; STERM(i): one term, as a
 * double, computed exactly as its lane of VTERM is.  PF(i): prefetch for chunk i. */
#define RN_REDUCE(d, PF, VTERM, STERM, result)                                          \
    do {                                                                                \
        RN_DVEC acc_[RN_NACC] = {{0}};                                                  \
        double lanes_[32];                                                              \
        Py_ssize_t i_ = 0;                                                              \
        for (; i_ + 32 <= (d); i_ += 32) {                                              \
            PF(i_);                                                                     \
            for (int q_ = 0; q_ < RN_NACC; q_++)                                        \
                acc_[q_] += VTERM(i_ + q_ * RN_DW);                                     \
        }                                                                               \
        memcpy(lanes_, acc_, sizeof lanes_);                                            \
        for (Py_ssize_t j_ = 0; i_ + j_ < (d); j_++)                                    \
            lanes_[j_] += STERM(i_ + j_);                                               \
        (result) = RN_NAME(fold32)(lanes_);                                             \
    } while (0)

/* K sums at once of terms formed in the input precision (the backward products).
 * TERMS(i, t) sets t[0 .. K) to the K terms of elements i .. i+RN_W-1 as native vectors;
 * STERMS(i, s) sets s[0 .. K) to the K terms of element i, as doubles, computed exactly as
 * their lanes in TERMS.  In each block of 64 elements, lane j first adds the terms of
 * elements j and 32+j in the input precision, then widens that pair sum once: widening
 * float to double is a lane-crossing conversion and was the limit of these passes.  The
 * pairing is defined on the 32 lanes, not on the vector width, so every level still
 * computes the same bits.  A last block of 32 and the scalar tail add their terms
 * unpaired.  results[0 .. K) receive the K sums. */
#define RN_REDUCE_PAIRED(K, d, PF, TERMS, STERMS, results)                              \
    do {                                                                                \
        RN_DVEC acc_[K][RN_NACC] = {{{0}}}, w_[RN_NHALF];                               \
        RN_VEC a_[K], b_[K];                                                            \
        double lanes_[K][32], s_[K];                                                    \
        Py_ssize_t i_ = 0;                                                              \
        for (; i_ + 64 <= (d); i_ += 64) {                                              \
            PF(i_);                                                                     \
            PF(i_ + 32);                                                                \
            for (int c_ = 0; c_ < 32 / RN_W; c_++) {                                    \
                TERMS(i_ + c_ * RN_W, a_);                                              \
                TERMS(i_ + 32 + c_ * RN_W, b_);                                         \
                for (int q_ = 0; q_ < (K); q_++) {                                      \
                    RN_NAME(widen_vec)(a_[q_] + b_[q_], w_);                            \
                    for (int h_ = 0; h_ < RN_NHALF; h_++)                               \
                        acc_[q_][c_ * RN_NHALF + h_] += w_[h_];                         \
                }                                                                       \
            }                                                                           \
        }                                                                               \
        if (i_ + 32 <= (d)) {                                                           \
            PF(i_);                                                                     \
            for (int c_ = 0; c_ < 32 / RN_W; c_++) {                                    \
                TERMS(i_ + c_ * RN_W, a_);                                              \
                for (int q_ = 0; q_ < (K); q_++) {                                      \
                    RN_NAME(widen_vec)(a_[q_], w_);                                     \
                    for (int h_ = 0; h_ < RN_NHALF; h_++)                               \
                        acc_[q_][c_ * RN_NHALF + h_] += w_[h_];                         \
                }                                                                       \
            }                                                                           \
            i_ += 32;                                                                   \
        }                                                                               \
        for (int q_ = 0; q_ < (K); q_++)                                                \
            memcpy(lanes_[q_], acc_[q_], sizeof lanes_[q_]);                            \
        for (Py_ssize_t j_ = 0; i_ + j_ < (d); j_++) {                                  \
            STERMS(i_ + j_, s_);                                                        \
            for (int q_ = 0; q_ < (K); q_++)                                            \
                lanes_[q_][j_] += s_[q_];                                               \
        }                                                                               \
        for (int q_ = 0; q_ < (K); q_++)                                                \
            (results)[q_] = RN_NAME(fold32)(lanes_[q_]);                                \
    } while (0)

#define RN_PF_X(i) RN_NAME(prefetch_next)(x, d, (i), 32)
#define RN_PF_DY_X(i) (RN_NAME(prefetch_next)(dy, d, (i), 32), RN_NAME(prefetch_next)(x, d, (i), 32))

static inline RN_DVEC RN_NAME(square)(RN_DVEC v) { return v * v; }

/* sum_i x_i */
static double RN_NAME(sum)(const RN_T *x, Py_ssize_t d)
{
    double r;
#define V_(i) RN_NAME(dload)(x + (i))
#define S_(i) ((double)x[i])
    RN_REDUCE(d, RN_PF_X, V_, S_, r);
#undef V_
#undef S_
    return r;
}

/* sum_i x_i^2 */
static double RN_NAME(sumsq)(const RN_T *x, Py_ssize_t d)
{
    double r;
#define V_(i) RN_NAME(square)(RN_NAME(dload)(x + (i)))
#define S_(i) ((double)x[i] * (double)x[i])
    RN_REDUCE(d, RN_PF_X, V_, S_, r);
#undef V_
#undef S_
    return r;
}

/* sum_i (x_i - mean)^2: the second pass of a two-pass variance, never E[x^2] - E[x]^2. */
static double RN_NAME(sumsqdev)(const RN_T *x, Py_ssize_t d, double mean)
{
    double r;
#define V_(i) RN_NAME(square)(RN_NAME(dload)(x + (i)) - mean)
#define S_(i) (((double)x[i] - mean) * ((double)x[i] - mean))
    RN_REDUCE(d, RN_PF_X, V_, S_, r);
#undef V_
#undef S_
    return r;
}

/* RMSNorm backward reduction: sum_i g_i * xn_i with g = dy*w, xn = x*rstd (w NULL: 1). */
static double RN_NAME(rms_bwd_dot)(const RN_T *dy, const RN_T *x, const RN_T *w, double rstd,
                                   Py_ssize_t d)
{
    const RN_T r = (RN_T)rstd;
    double s[1];
#define T_(i, t) { t[0] = RN_NAME(vload)(dy + (i)) * RN_NAME(vload)(w + (i)) *            \
                          (RN_NAME(vload)(x + (i)) * r); }
#define S_(i, s) { s[0] = (double)(dy[i] * w[i] * (x[i] * r)); }
    if (w) RN_REDUCE_PAIRED(1, d, RN_PF_DY_X, T_, S_, s);
#undef T_
#undef S_
#define T_(i, t) { t[0] = RN_NAME(vload)(dy + (i)) * (RN_NAME(vload)(x + (i)) * r); }
#define S_(i, s) { s[0] = (double)(dy[i] * (x[i] * r)); }
    else RN_REDUCE_PAIRED(1, d, RN_PF_DY_X, T_, S_, s);
#undef T_
#undef S_
    return s[0];
}

/* The two LayerNorm-backward reductions in one pass, with g = dy*w (w NULL: 1) and
 * xhat = (x - mean)*rstd:  *sum_g = sum g,  *sum_gxhat = sum g*xhat. */
static void RN_NAME(ln_bwd_sums)(double *sum_g, double *sum_gxhat, const RN_T *dy,
                                 const RN_T *x, const RN_T *w, double mean, double rstd,
                                 Py_ssize_t d)
{
    RN_T mh, ml;
    RN_NAME(split_mean)(mean, &mh, &ml);
    const RN_T r = (RN_T)rstd;
    double s[2];
#define T_(i, t) { RN_VEC g_ = RN_NAME(vload)(dy + (i));                                  \
                   if (w) { g_ *= RN_NAME(vload)(w + (i)); }                              \
                   t[0] = g_;                                                             \
                   t[1] = g_ * (((RN_NAME(vload)(x + (i)) - mh) - ml) * r); }
#define S_(i, s) { RN_T g_ = dy[i]; if (w) { g_ *= w[i]; }                                \
                   s[0] = (double)g_; s[1] = (double)(g_ * (((x[i] - mh) - ml) * r)); }
    RN_REDUCE_PAIRED(2, d, RN_PF_DY_X, T_, S_, s);
#undef T_
#undef S_
    *sum_g = s[0];
    *sum_gxhat = s[1];
}

/* The residual sum of a row, h_k = residual_k + alpha_k * (x_k * m_k) (m_k = RN_KEEP(k) ?
 * scale : 0; alpha, keep NULL: 1), formed in the input precision exactly as residual_add
 * forms it, then reduced without being stored:
 *   sum_k (h_k - shift)     (squares = 0, shift = 0: the LayerNorm mean pass)
 *   sum_k (h_k - shift)^2   (squares = 1: shift = 0 for RMSNorm, = mean for LayerNorm)
 * with RN_REDUCE's lanes, so the result is bitwise sum / sumsq / sumsqdev of the stored h.
 * A pass that only loads: nothing waits behind streamed stores still draining (a plain
 * store would, as stores leave the core in program order).  x and residual are prefetched
 * one row ahead; the apply pass (residual_norm_apply) finds the row in cache. */
static double RN_NAME(residual_reduce)(const RN_T *residual, const RN_T *x, const RN_T *alpha,
                                       const uint8_t *keep, Py_ssize_t kpos, double scale,
                                       Py_ssize_t d, int squares, double shift)
{
    const RN_T sc = (RN_T)scale;
    double s;
#define PF_(i) (RN_NAME(prefetch_next)(x, d, (i), 32), RN_NAME(prefetch_next)(residual, d, (i), 32))
#define H_(i) ({ RN_HVEC v_ = RN_NAME(hload)(x + (i));                                  \
                 if (keep) { v_ *= RN_NAME(hmult)(keep, kpos + (i), sc); }              \
                 if (alpha) { v_ *= RN_NAME(hload)(alpha + (i)); }                      \
                 RN_NAME(widen)(RN_NAME(hload)(residual + (i)) + v_) - shift; })
#define HS_(i) ({ RN_T v_ = x[i]; if (keep) { v_ *= RN_KEEP(i) ? sc : (RN_T)0; }        \
                  if (alpha) { v_ *= alpha[i]; } (double)(residual[i] + v_) - shift; })
#define V1_(i) RN_NAME(square)(H_(i))
#define S1_(i) ({ double t_ = HS_(i); t_ * t_; })
    if (squares) RN_REDUCE(d, PF_, V1_, S1_, s);
    else RN_REDUCE(d, PF_, H_, HS_, s);
#undef PF_
#undef H_
#undef HS_
#undef V1_
#undef S1_
    return s;
}

#undef RN_REDUCE
#undef RN_REDUCE_PAIRED
#undef RN_PF_X
#undef RN_PF_DY_X
