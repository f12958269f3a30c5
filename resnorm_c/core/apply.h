/* Forward elementwise passes: one row's output from the row and its statistics (typed
 * template; element.h includes it after vec.h).  Large outputs are written with
 * non-temporal ("streaming") stores when the caller asks (stream), which skip the
 * read-for-ownership of each output line.  The norm kernels call these after the
 * reductions over the row, which prefetched the next row of the input: these prefetch the
 * next row of the output (ahead: the rows that follow in the array; none past its end). */

/* y_i = x_i * rstd * w_i   (w == NULL: w_i = 1); w of the element type, or float32 (pf) */
static inline __attribute__((always_inline)) void RN_NAME(rms_apply_p)(
    RN_T *y, const RN_T *x, const void *w, int pf, double rstd, Py_ssize_t d, int stream,
    Py_ssize_t ahead)
{
    const RN_C r = (RN_C)rstd;
    (void)pf;
#define PF_(k) RN_PFV_OUT(y, k)
#define B_(k) { RN_VEC v = RN_GET(x + (k)) * r;                                          \
                if (w) { v *= RN_GETP(w, k); } RN_PUT(y + (k), v); }
    /* One expansion per case so the compiler drops the dead branch from the loop. */
    if (w) RN_ELEMENTWISE(d, y, stream, PF_, B_);
    else { const void *w = NULL; RN_ELEMENTWISE(d, y, stream, PF_, B_); }
#undef PF_
#undef B_
}

/* y_i = ((x_i - mean) * rstd) * w_i + b_i   (w, b may be NULL); w, b as rms_apply_p's */
static inline __attribute__((always_inline)) void RN_NAME(ln_apply_p)(
    RN_T *y, const RN_T *x, const void *w, const void *b, int pf, double mean, double rstd,
    Py_ssize_t d, int stream, Py_ssize_t ahead)
{
    RN_C mh, ml;
    RN_NAME(split_mean)(mean, &mh, &ml);
    const RN_C r = (RN_C)rstd;
    (void)pf;
#define B_(k) { RN_VEC v = ((RN_GET(x + (k)) - mh) - ml) * r;                            \
                if (w) { v *= RN_GETP(w, k); }                                            \
                if (b) { v += RN_GETP(b, k); } RN_PUT(y + (k), v); }
#define PF_(k) RN_PFV_OUT(y, k)
    if (w && b) RN_ELEMENTWISE(d, y, stream, PF_, B_);
    else if (w) { const void *b = NULL; RN_ELEMENTWISE(d, y, stream, PF_, B_); }
    else if (b) { const void *w = NULL; RN_ELEMENTWISE(d, y, stream, PF_, B_); }
    else { const void *w = NULL, *b = NULL; RN_ELEMENTWISE(d, y, stream, PF_, B_); }
#undef PF_
#undef B_
}

/* y_i = x_i * rstd * w_i   (w == NULL: w_i = 1) */
static void RN_NAME(rms_apply)(RN_T *y, const RN_T *x, const RN_T *w, double rstd,
                               Py_ssize_t d, int stream, Py_ssize_t ahead)
{
    RN_NAME(rms_apply_p)(y, x, w, 0, rstd, d, stream, ahead);
}

/* y_i = ((x_i - mean) * rstd) * w_i + b_i   (w, b may be NULL) */
static void RN_NAME(ln_apply)(RN_T *y, const RN_T *x, const RN_T *w, const RN_T *b,
                              double mean, double rstd, Py_ssize_t d, int stream,
                              Py_ssize_t ahead)
{
    RN_NAME(ln_apply_p)(y, x, w, b, 0, mean, rstd, d, stream, ahead);
}

#if RN_HALF
/* rms_apply and ln_apply of 16-bit rows with float32 parameters: the float32 passes'
 * arithmetic on the widened rows, each output rounded once (bitwise rms_apply / ln_apply of
 * float32 on the widened row, then the rounding). */
static void RN_NAME(rms_apply_mixed)(RN_T *y, const RN_T *x, const float *w, double rstd,
                                     Py_ssize_t d, int stream, Py_ssize_t ahead)
{
    RN_NAME(rms_apply_p)(y, x, w, 1, rstd, d, stream, ahead);
}

static void RN_NAME(ln_apply_mixed)(RN_T *y, const RN_T *x, const float *w, const float *b,
                                    double mean, double rstd, Py_ssize_t d, int stream,
                                    Py_ssize_t ahead)
{
    RN_NAME(ln_apply_p)(y, x, w, b, 1, mean, rstd, d, stream, ahead);
}
#endif

/* Whether the d elements at a and at p (NULL: none) share memory. */
static inline int RN_NAME(meets)(const RN_T *a, const RN_T *p, Py_ssize_t d)
{
    return p != NULL && (uintptr_t)a < (uintptr_t)(p + d) && (uintptr_t)p < (uintptr_t)(a + d);
}

#if !RN_HALF
/* The norm applied to the residual sum, recomputed from the cached row (residual_reduce
 * read it just before):  h_k = residual_k + alpha_k * (x_k * m_k) (RN_RESIDUAL_SUM, m_k
 * scale or 0),
 *   y_k = ((h_k - mean) * rstd) * w_k + b_k      (RMSNorm: mean = 0, b = NULL: h_k * rstd * w_k)
 *   h_k is stored too                            (h NULL: Post-Norm, h is not kept)
 * The same operations as residual_add then ln_apply / rms_apply (x - 0 is x), so y is
 * bitwise the norm of h.  alpha, keep, w, b may be NULL.  (float and double: the fused
 * forward of the 16-bit types stores h rounded, then normalises it.) */
static void RN_NAME(residual_norm_apply)(RN_T *y, RN_T *h, const RN_T *residual,
                                         const RN_T *x, const RN_T *alpha, const uint8_t *keep,
                                         Py_ssize_t kpos, double scale, const RN_T *w,
                                         const RN_T *b, double mean, double rstd, Py_ssize_t d,
                                         int stream)
{
    RN_C mh, ml;
    RN_NAME(split_mean)(mean, &mh, &ml);
    const RN_C rs = (RN_C)rstd, sc = (RN_C)scale;
    if (!RN_NAME(same_phase)(y, h)) {
        /* One loop cannot align the stores of both y and h, and a store that crosses a
         * cache line costs two: h gets its own loop, then y's loop forms h again from
         * the cached rows (unless h is written over an input that loop reads: any of
         * them may be the output buffer, e.g. residual_out=alpha for a single row). */
        if (RN_NAME(meets)(h, x, d) || RN_NAME(meets)(h, residual, d)
            || RN_NAME(meets)(h, alpha, d) || RN_NAME(meets)(h, w, d)
            || RN_NAME(meets)(h, b, d)) stream = 0;
        else {
            /* (no prefetch: residual_reduce prefetched the next row) */
            RN_NAME(residual_add)(h, residual, x, alpha, keep, kpos, scale, d, stream, 0);
            h = NULL;
        }
    }
#define PF_(k)
#define B_(k) { RN_VEC h_ = RN_RESIDUAL_SUM(RN_GET, RN_NAME(vmult), k);                 \
                RN_VEC v_ = ((h_ - mh) - ml) * rs;                                      \
                if (w) { v_ *= RN_GET(w + (k)); }                                       \
                if (b) { v_ += RN_GET(b + (k)); }                                       \
                RN_PUT(y + (k), v_); if (h) { RN_PUT(h + (k), h_); } }
#define RUN_ RN_ELEMENTWISE(d, y, stream, PF_, B_)
    /* The fused forward's cases (weight, no alpha, no bias; with or without dropout and h)
     * get their own expansions: with the branches left in, the compiler unswitches only
     * some of them. */
    if (w && !alpha && !b) {
        const RN_T *alpha = NULL, *b = NULL;
        if (keep && h) RUN_;
        else if (keep) { RN_T *h = NULL; RUN_; }
        else if (h) { const uint8_t *keep = NULL; RUN_; }
        else { const uint8_t *keep = NULL; RN_T *h = NULL; RUN_; }
    } else RUN_;
#undef RUN_
#undef PF_
#undef B_
}
#endif
