/* Rows of the residual connections and of dropout (typed template; element.h includes it
 * after vec.h; the gated residual's rows, which need exp, are in vmath.h).  m_k is element
 * k's dropout multiplier, RN_KEEP(k) ? scale : 0 (vec.h). */

/* h_k = residual_k + alpha_k * (x_k * m_k): branch x, dropout multipliers m and scale alpha,
 * added onto the residual stream.  residual may be NULL (0), alpha and keep NULL (1).  The
 * product x*m is formed first, as dropout forms it, so h equals residual + alpha *
 * dropout(x) bitwise.  x and residual are prefetched one row ahead; alpha and keep are
 * short rows that stay in cache. */
static void RN_NAME(residual_add)(RN_T *h, const RN_T *residual, const RN_T *x,
                                  const RN_T *alpha, const uint8_t *keep, Py_ssize_t kpos,
                                  double scale, Py_ssize_t d, int stream)
{
    const RN_T sc = (RN_T)scale;
#define PF_(k) { RN_NAME(prefetch_next)(x, d, (k), RN_W);                               \
                 if (residual) { RN_NAME(prefetch_next)(residual, d, (k), RN_W); } }
#define S_(k) { RN_T v = x[k]; if (keep) { v *= RN_KEEP(k) ? sc : (RN_T)0; }            \
                if (alpha) { v *= alpha[k]; } if (residual) { v = residual[k] + v; } h[k] = v; }
#define V_(k, ST) { RN_VEC v = RN_NAME(vload)(x + k);                                   \
                    if (keep) { v *= RN_NAME(vmult)(keep, kpos + k, sc); }              \
                    if (alpha) { v *= RN_NAME(vload)(alpha + k); }                      \
                    if (residual) { v = RN_NAME(vload)(residual + k) + v; } ST(h + k, v); }
    /* The hot cases get their own expansion: dropout alone, and the plain add. */
    if (!residual && !alpha && keep) {
        const RN_T *residual = NULL, *alpha = NULL;
        RN_ELEMENTWISE(d, h, stream, PF_, S_, V_);
    } else if (residual && !alpha && !keep) {
        const RN_T *alpha = NULL;
        const uint8_t *keep = NULL;
        RN_ELEMENTWISE(d, h, stream, PF_, S_, V_);
    }
    else RN_ELEMENTWISE(d, h, stream, PF_, S_, V_);
#undef PF_
#undef S_
#undef V_
}

/* Backward of h = residual + alpha*(x*m).  With g = gh + dh (dh, a gradient arriving along
 * the residual stream, may be NULL):
 *   dresidual_k = g_k                        (dresidual NULL: not written)
 *   dx_k = (g_k * alpha_k) * m_k             (alpha, keep NULL: 1)
 *   dalpha_part_k += g_k * (x_k * m_k)       (double partial of a row block; NULL: not wanted)
 * gh, dh and (when dalpha_part is wanted) x are prefetched one row ahead. */
static void RN_NAME(residual_bwd)(RN_T *dx, RN_T *dresidual, double *dalpha_part,
                                  const RN_T *gh, const RN_T *dh, const RN_T *x,
                                  const RN_T *alpha, const uint8_t *keep, Py_ssize_t kpos,
                                  double scale, Py_ssize_t d, int stream)
{
    const RN_T sc = (RN_T)scale;
    if (!RN_NAME(same_phase)(dx, dresidual)) stream = 0;
#define PF_(k) { RN_NAME(prefetch_next)(gh, d, (k), RN_W);                              \
                 if (dh) { RN_NAME(prefetch_next)(dh, d, (k), RN_W); }                  \
                 if (dalpha_part) { RN_NAME(prefetch_next)(x, d, (k), RN_W); } }
#define S_(k) { RN_T g = gh[k], mk = keep ? (RN_KEEP(k) ? sc : (RN_T)0) : (RN_T)1;      \
                if (dh) { g += dh[k]; } if (dresidual) { dresidual[k] = g; }            \
                if (dalpha_part) { RN_T t = x[k]; if (keep) { t *= mk; }                \
                                   dalpha_part[k] += (double)(g * t); }                 \
                RN_T v = g; if (alpha) { v *= alpha[k]; } if (keep) { v *= mk; } dx[k] = v; }
#define V_(k, ST) { RN_VEC g = RN_NAME(vload)(gh + k), mk = {0};                        \
                    if (keep) { mk = RN_NAME(vmult)(keep, kpos + k, sc); }              \
                    if (dh) { g += RN_NAME(vload)(dh + k); }                            \
                    if (dresidual) { ST(dresidual + k, g); }                            \
                    if (dalpha_part) { RN_VEC t = RN_NAME(vload)(x + k);                \
                                       if (keep) { t *= mk; }                           \
                                       RN_NAME(add_widened)(dalpha_part + k, g * t); }  \
                    RN_VEC v = g; if (alpha) { v *= RN_NAME(vload)(alpha + k); }        \
                    if (keep) { v *= mk; } ST(dx + k, v); }
    RN_ELEMENTWISE(d, dx, stream, PF_, S_, V_);
#undef PF_
#undef S_
#undef V_
}
