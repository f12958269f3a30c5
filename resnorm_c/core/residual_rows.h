/* Rows of the residual connections and of dropout (typed template; element.h includes it
 * after vec.h; the gated residual's rows, which need exp, are in vmath.h).  m_k is element
 * k's dropout multiplier, scale or 0 (keep_mult in vec.h). */

/* h_k = residual_k + alpha_k * (x_k * m_k): branch x, dropout multipliers m and scale alpha,
 * added onto the residual stream.  residual may be NULL (0), alpha and keep NULL (1).  The
 * product x*m is formed first, as dropout forms it, so h equals residual + alpha *
 * dropout(x) bitwise.  x and residual are prefetched one row ahead; alpha and keep are
 * short rows that stay in cache. */
static void RN_NAME(residual_add)(RN_T *h, const RN_T *residual, const RN_T *x,
                                  const RN_T *alpha, const uint8_t *keep, Py_ssize_t kpos,
                                  double scale, Py_ssize_t d, int stream, Py_ssize_t ahead)
{
    const RN_C sc = (RN_C)scale;
#define PF_(k) if (ahead) { RN_NAME(prefetch_next)(x, d, (k), RN_W);                    \
                            if (residual) { RN_NAME(prefetch_next)(residual, d, (k), RN_W); } }
#define B_(k) { RN_PUT(h + (k), residual ? RN_RESIDUAL_SUM(RN_GET, RN_NAME(vmult), k)      \
                                         : RN_RESIDUAL_BRANCH(RN_GET, RN_NAME(vmult), k)); }
    /* The hot cases get their own expansion: dropout alone, the plain add, and the scaled
     * add (a fixed, learnable or per-channel alpha).  With the branches left in, the
     * compiler tests them at every vector. */
    if (!residual && !alpha && keep) {
        const RN_T *residual = NULL, *alpha = NULL;
        RN_ELEMENTWISE(d, h, stream, PF_, B_);
    } else if (residual && !keep) {
        const uint8_t *keep = NULL;
        if (alpha) RN_ELEMENTWISE(d, h, stream, PF_, B_);
        else { const RN_T *alpha = NULL; RN_ELEMENTWISE(d, h, stream, PF_, B_); }
    }
    else RN_ELEMENTWISE(d, h, stream, PF_, B_);
#undef PF_
#undef B_
}

/* Backward of h = residual + alpha*(x*m).  With g = gh + dh (dh, a gradient arriving along
 * the residual stream, may be NULL):
 *   dresidual_k = g_k                        (dresidual NULL: not written)
 *   dx_k = (g_k * alpha_k) * m_k             (alpha, keep NULL: 1)
 *   dalpha_part_k += g_k * (x_k * m_k)       (double partial of a row block; NULL: not wanted)
 * gh, dh and (when dalpha_part is wanted) x are prefetched one row ahead.  A loop stores
 * aligned vectors into one output: when dresidual sits at another offset from a vector
 * boundary than dx, it gets a loop of its own first (each store of the second output
 * would straddle two cache lines, which costs more than a second pass over a row in L1),
 * and dx's loop reads g back from it (it may be dh itself, in place).  The 16-bit types
 * keep one loop, unstreamed: their g would come back rounded. */
static void RN_NAME(residual_bwd)(RN_T *dx, RN_T *dresidual, double *dalpha_part,
                                  const RN_T *gh, const RN_T *dh, const RN_T *x,
                                  const RN_T *alpha, const uint8_t *keep, Py_ssize_t kpos,
                                  double scale, Py_ssize_t d, int stream, Py_ssize_t ahead)
{
    const RN_C sc = (RN_C)scale;
#define PF_(k) if (ahead) { RN_NAME(prefetch_next)(gh, d, (k), RN_W);                   \
                            if (dh) { RN_NAME(prefetch_next)(dh, d, (k), RN_W); }       \
                            if (dalpha_part) { RN_NAME(prefetch_next)(x, d, (k), RN_W); } }
#define NO_PF_(k)
#define G_(k) RN_VEC g = RN_GET(gh + (k)); if (dh) { g += RN_GET(dh + (k)); }
#define DRES_(k) { G_(k) RN_PUT(dresidual + (k), g); }
#define B_(k) { G_(k) RN_VEC mk = {0};                                                  \
                if (keep) { mk = RN_NAME(vmult)(keep, kpos + (k), sc); }                \
                if (dresidual) { RN_PUT(dresidual + (k), g); }                          \
                if (dalpha_part) { RN_VEC t = RN_GET(x + (k));                          \
                                   if (keep) { t *= mk; }                               \
                                   RN_ADD_WIDENED(dalpha_part + (k), g * t); }          \
                RN_VEC v = g; if (alpha) { v *= RN_GET(alpha + (k)); }                  \
                if (keep) { v *= mk; } RN_PUT(dx + (k), v); }
    const int dres_loop = dresidual && !RN_NAME(same_phase)(dx, dresidual)
                          && sizeof(RN_T) == sizeof(RN_C);
    if (dresidual && !RN_NAME(same_phase)(dx, dresidual) && !dres_loop) stream = 0;
    if (dres_loop) {
        if (dh) RN_ELEMENTWISE(d, dresidual, stream, PF_, DRES_);
        else { const RN_T *dh = NULL; RN_ELEMENTWISE(d, dresidual, stream, PF_, DRES_); }
        /* from here g is dresidual's */
        gh = dresidual;
        dh = NULL;
    }
    /* The hot cases get their own expansion: the plain Pre-Norm add (with or without a
     * gradient along the stream, dresidual written in the same loop or before), and
     * Post-Norm's. */
    if (!keep && !alpha && !dalpha_part && dresidual && !dres_loop) {
        const uint8_t *keep = NULL;
        const RN_T *alpha = NULL;
        double *dalpha_part = NULL;
        if (dh) RN_ELEMENTWISE(d, dx, stream, PF_, B_);
        else { const RN_T *dh = NULL; RN_ELEMENTWISE(d, dx, stream, PF_, B_); }
    } else if (!keep && !alpha && !dalpha_part && dres_loop) {
        const uint8_t *keep = NULL;
        const RN_T *alpha = NULL, *dh = NULL;
        double *dalpha_part = NULL;
        RN_T *dresidual = NULL;
        RN_ELEMENTWISE(d, dx, stream, NO_PF_, B_);
    } else if (dres_loop) {
        const RN_T *dh = NULL;
        RN_T *dresidual = NULL;
        RN_ELEMENTWISE(d, dx, stream, NO_PF_, B_);
    }
    else RN_ELEMENTWISE(d, dx, stream, PF_, B_);
#undef PF_
#undef NO_PF_
#undef G_
#undef DRES_
#undef B_
}
