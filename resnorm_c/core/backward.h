/* Backward elementwise passes of the norms, over up to RN_GROUP consecutive rows of one
 * row block at once (typed template; element.h includes it after vec.h).  The kernels
 * call them with rows = 1 too: one implementation serves both.
 *
 * Column by column: a column's terms for dweight (and dbias) are first summed over the
 * group's rows in the input precision, in row order, and only that group sum is widened
 * and added to the float64 partial.  Widening float to double is a lane-crossing
 * conversion that limited this pass when done once per term; once per group it costs a
 * quarter.  The group sum adds at most three roundings of the input precision to each
 * group's contribution; the groups are fixed (RN_GROUP rows from the start of a row block,
 * and row blocks depend on N only), so the result is still bitwise identical for any
 * thread count.  Rows are streamed only when they share their alignment.
 */

static inline int RN_NAME(rows_share_phase)(Py_ssize_t d)
{
    return (d * (Py_ssize_t)sizeof(RN_T)) % RN_VBYTES == 0;
}

/* Prefetch of the next group's rows at column k: what the next group's reduction passes
 * read.  The apply pass over a whole group is long enough to bring them in; the reduction
 * passes alone (each also prefetching one row ahead) are too short to hide memory. */
#define RN_PF_GROUP(k)                                                                  \
    for (int p_ = 0; p_ < rows; p_++) {                                                 \
        RN_NAME(prefetch_next)(dy + p_ * d, rows * d, (k), RN_W);                       \
        RN_NAME(prefetch_next)(x + p_ * d, rows * d, (k), RN_W);                        \
    }

/* part[0 .. RN_W) += v widened, for a partial that may be NULL. */
#define RN_ADD_GROUP(part, k, v)                                                        \
    do { if (part) RN_NAME(add_widened)((part) + (k), (v)); } while (0)

static inline __attribute__((always_inline)) void RN_NAME(rms_bwd_rows_body)(
    RN_T *dx, double *dw_part, const RN_T *dy, const RN_T *x, const RN_T *w,
    const RN_T *rs, const RN_T *mt, int rows, Py_ssize_t d, int stream)
{
    int phase = rows == 1 || RN_NAME(rows_share_phase)(d);
    Py_ssize_t k = 0, head = stream && phase ? RN_NAME(stream_head)(dx, d) : 0;
    int streamed = stream && phase && head < d;
#define COLUMN_(k)                                                                      \
    {                                                                                   \
        RN_T tw = 0;                                                                    \
        for (int r = 0; r < rows; r++) {                                                \
            const RN_T *dyr = dy + r * d, *xr = x + r * d;                              \
            RN_T xn = xr[k] * rs[r], g = dyr[k];                                        \
            if (w) { g *= w[k]; }                                                       \
            tw = r ? tw + dyr[k] * xn : dyr[k] * xn;                                    \
            dx[r * d + k] = rs[r] * (g - xn * mt[r]);                                   \
        }                                                                               \
        if (dw_part) { dw_part[k] += (double)tw; }                                      \
    }
    for (; k < head; k++) COLUMN_(k)
    for (; k + RN_W <= d; k += RN_W) {
        RN_VEC tw = {0};
        RN_PF_GROUP(k)
        for (int r = 0; r < rows; r++) {
            RN_VEC xn = RN_NAME(vload)(x + r * d + k) * rs[r];
            RN_VEC dyv = RN_NAME(vload)(dy + r * d + k), g = dyv;
            if (w) g *= RN_NAME(vload)(w + k);
            RN_VEC v = rs[r] * (g - xn * mt[r]);
            if (streamed) RN_NAME(vstream)(dx + r * d + k, v);
            else RN_NAME(vstore)(dx + r * d + k, v);
            tw = r ? tw + dyv * xn : dyv * xn;
        }
        RN_ADD_GROUP(dw_part, k, tw);
    }
    for (; k < d; k++) COLUMN_(k)
#undef COLUMN_
    if (streamed && stream != RN_STREAM_UNFENCED) rn_sfence();
}

/* RMSNorm backward, elementwise part, for `rows` (<= RN_GROUP) consecutive rows, given
 * each row's reduction m[r] = mean(g * xn):
 *   dx = rstd * (g - xn * m),   dw_part += sum over the rows of dy * xn
 * (xn = x * rstd, g = dy * w; dw_part NULL when no weight gradient is wanted). */
static void RN_NAME(rms_bwd_apply_rows)(RN_T *dx, double *dw_part, const RN_T *dy,
                                        const RN_T *x, const RN_T *w, const double *rstd,
                                        const double *m, int rows, Py_ssize_t d, int stream)
{
    RN_T rs[RN_GROUP], mt[RN_GROUP]; /* rstd and m in the element type */
    for (int r = 0; r < rows; r++) {
        rs[r] = (RN_T)rstd[r];
        mt[r] = (RN_T)m[r];
    }
    /* One inlined copy per case so the dead branches leave the loops. */
    if (w && dw_part) RN_NAME(rms_bwd_rows_body)(dx, dw_part, dy, x, w, rs, mt, rows, d, stream);
    else if (w) RN_NAME(rms_bwd_rows_body)(dx, NULL, dy, x, w, rs, mt, rows, d, stream);
    else RN_NAME(rms_bwd_rows_body)(dx, NULL, dy, x, NULL, rs, mt, rows, d, stream);
}

static inline __attribute__((always_inline)) void RN_NAME(ln_bwd_rows_body)(
    RN_T *dx, double *dw_part, double *db_part, const RN_T *dy, const RN_T *x, const RN_T *w,
    const RN_T *mh, const RN_T *ml, const RN_T *rs, const RN_T *mg, const RN_T *mgx, int rows,
    Py_ssize_t d, int stream)
{
    int phase = rows == 1 || RN_NAME(rows_share_phase)(d);
    Py_ssize_t k = 0, head = stream && phase ? RN_NAME(stream_head)(dx, d) : 0;
    int streamed = stream && phase && head < d;
#define COLUMN_(k)                                                                      \
    {                                                                                   \
        RN_T tw = 0, tb = 0;                                                            \
        for (int r = 0; r < rows; r++) {                                                \
            const RN_T *dyr = dy + r * d, *xr = x + r * d;                              \
            RN_T xhat = ((xr[k] - mh[r]) - ml[r]) * rs[r], g = dyr[k];                  \
            if (w) { g *= w[k]; }                                                       \
            tw = r ? tw + dyr[k] * xhat : dyr[k] * xhat;                                \
            tb = r ? tb + dyr[k] : dyr[k];                                              \
            dx[r * d + k] = rs[r] * ((g - mg[r]) - xhat * mgx[r]);                      \
        }                                                                               \
        if (dw_part) { dw_part[k] += (double)tw; }                                      \
        if (db_part) { db_part[k] += (double)tb; }                                      \
    }
    for (; k < head; k++) COLUMN_(k)
    for (; k + RN_W <= d; k += RN_W) {
        RN_VEC tw = {0}, tb = {0};
        RN_PF_GROUP(k)
        for (int r = 0; r < rows; r++) {
            RN_VEC xhat = ((RN_NAME(vload)(x + r * d + k) - mh[r]) - ml[r]) * rs[r];
            RN_VEC dyv = RN_NAME(vload)(dy + r * d + k), g = dyv;
            if (w) g *= RN_NAME(vload)(w + k);
            RN_VEC v = rs[r] * ((g - mg[r]) - xhat * mgx[r]);
            if (streamed) RN_NAME(vstream)(dx + r * d + k, v);
            else RN_NAME(vstore)(dx + r * d + k, v);
            tw = r ? tw + dyv * xhat : dyv * xhat;
            tb = r ? tb + dyv : dyv;
        }
        RN_ADD_GROUP(dw_part, k, tw);
        RN_ADD_GROUP(db_part, k, tb);
    }
    for (; k < d; k++) COLUMN_(k)
#undef COLUMN_
    if (streamed && stream != RN_STREAM_UNFENCED) rn_sfence();
}

/* LayerNorm backward, elementwise part, for `rows` (<= RN_GROUP) consecutive rows, given
 * each row's two reductions mean_g[r] = mean(g) and mean_gxhat[r] = mean(g * xhat):
 *   dx = rstd * ((g - mean_g) - xhat * mean_gxhat),
 *   dw_part += sum over the rows of dy * xhat,   db_part += sum over the rows of dy
 * (xhat = (x - mean) * rstd, g = dy * w; the partials may be NULL). */
static void RN_NAME(ln_bwd_apply_rows)(RN_T *dx, double *dw_part, double *db_part,
                                       const RN_T *dy, const RN_T *x, const RN_T *w,
                                       const double *mean, const double *rstd,
                                       const double *mean_g, const double *mean_gxhat, int rows,
                                       Py_ssize_t d, int stream)
{
    /* in the element type: mean as hi + lo, rstd, mean_g, mean_gxhat */
    RN_T mh[RN_GROUP], ml[RN_GROUP], rs[RN_GROUP], mg[RN_GROUP], mgx[RN_GROUP];
    for (int r = 0; r < rows; r++) {
        RN_NAME(split_mean)(mean[r], &mh[r], &ml[r]);
        rs[r] = (RN_T)rstd[r];
        mg[r] = (RN_T)mean_g[r];
        mgx[r] = (RN_T)mean_gxhat[r];
    }
    if (w && dw_part && db_part)
        RN_NAME(ln_bwd_rows_body)(dx, dw_part, db_part, dy, x, w, mh, ml, rs, mg, mgx, rows, d, stream);
    else if (w && dw_part)
        RN_NAME(ln_bwd_rows_body)(dx, dw_part, NULL, dy, x, w, mh, ml, rs, mg, mgx, rows, d, stream);
    else if (w)
        RN_NAME(ln_bwd_rows_body)(dx, NULL, db_part, dy, x, w, mh, ml, rs, mg, mgx, rows, d, stream);
    else
        RN_NAME(ln_bwd_rows_body)(dx, NULL, db_part, dy, x, NULL, mh, ml, rs, mg, mgx, rows, d, stream);
}

#undef RN_PF_GROUP
#undef RN_ADD_GROUP
