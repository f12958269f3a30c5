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
 * thread count.  A call whose rows are all one group writes its sums as the totals
 * instead, with the same bits (put_total).  Rows are streamed only when they share their
 * alignment.
 *
 * A streamed group does not interleave its rows' stores column by column: RN_GROUP streams
 * of non-temporal stores at once drain slowly on some CPUs (on an AMD EPYC, the norms'
 * backward at (2048, 4096) took 1.5x (float32) to 1.9x (bfloat16) the time of ordinary
 * stores).  It goes through the columns in chunks of RN_CHUNK elements instead, row by row
 * within a chunk, carrying each column's group sums from row to row in a small array:
 * each store stream fills whole lines before the next row's begins, and every sum is
 * formed in the same order as in the column loop, so the bits are the same.
 */

static inline int RN_NAME(rows_share_phase)(Py_ssize_t d)
{
    return (d * (Py_ssize_t)sizeof(RN_T)) % RN_VBYTES == 0;
}

/* Prefetch of the next group's rows at column k: what the next group's passes read (dh
 * too, when given), and (prefetch_dx) the lines its apply pass will store to, unless it
 * streams them.  The apply pass over a whole group is long enough to bring them in; the
 * reduction passes alone (each also prefetching one row ahead) are too short to hide
 * memory.  Only rows that exist: ahead is the number of rows after this group in the
 * arrays. */
#define RN_PF_GROUP(k)                                                                  \
    do {                                                                                \
        for (int p_ = 0; p_ < rows && p_ < ahead; p_++) {                               \
            RN_NAME(prefetch_next)(dy + p_ * d, rows * d, (k), RN_W);                   \
            RN_NAME(prefetch_next)(x + p_ * d, rows * d, (k), RN_W);                    \
            if (dh) RN_NAME(prefetch_next)(dh + p_ * d, rows * d, (k), RN_W);           \
        }                                                                               \
        if (s_ == RN_WHOLE || s_ == RN_PART)                                            \
            for (int p_ = 0; p_ < pf_dx_; p_++) {                                       \
                RN_NAME(prefetch_next)(dx + p_ * d, rows * d, (k), RN_W);               \
                if (dx2) RN_NAME(prefetch_next)(dx2 + p_ * d, rows * d, (k), RN_W);     \
            }                                                                           \
    } while (0)
/* The rows of dx (and dx2) that RN_PF_GROUP prefetches, set once before the column loop. */
#define RN_PF_DX_ROWS const int pf_dx_ = prefetch_dx ? (int)(ahead < rows ? ahead : rows) : 0

/* out[k .. k + n) := the lanes of v, a column's sums over all the rows of a call that is
 * one group (the kernels' small calls), rounded once to the parameters' type (the element
 * type, or float32: pf, see RN_GETP in vec.h): v + 0, which has
 * the bits the float64 partial row would give (zeroed, v widened and added, narrowed: a
 * -0 sum becomes +0 there too), without zeroing that row and narrowing it afterwards
 * (norm_kernels.pxd, one_group).  Plain stores: out is a small parameter gradient. */
static inline __attribute__((always_inline)) void RN_NAME(put_total)(void *out, Py_ssize_t k,
                                                                      int pf, RN_VEC v,
                                                                      Py_ssize_t n, int s)
{
    const RN_VEC zero = {0};
    const int plain = s == RN_PART || s == RN_PART_STREAMED ? RN_PART : RN_WHOLE;
    (void)pf;
    RN_PUTP(out, k, v + zero, n, plain);
}

/* The group's column sums v at k: the totals (total given), or added widened to the
 * partial part; either may be NULL. */
#define RN_SUM_GROUP(total, part, k, v)                                                 \
    do {                                                                                \
        if (total) RN_NAME(put_total)((total), (k), pf, (v), n_, s_);                  \
        else if (part) RN_ADD_WIDENED((part) + (k), (v));                               \
    } while (0)

/* The column loop of the multi-row passes: RN_ELEMENTWISE's placement and constants n_,
 * s_ for BODY(k).  Its stores are aligned in the first row of dx, and in every row when
 * the rows share their phase (d * sizeof(T) a multiple of the vector width). */
#define RN_COLUMNS(BODY)                                                                \
    RN_PF_DX_ROWS;                                                                      \
    RN_ELEMENTWISE(d, dx, rows == 1 || RN_NAME(rows_share_phase)(d) ? stream : 0,         \
                   RN_PF_GROUP, BODY)

/* Stores the group's dx vectors o[r] at column k, after every row's loads at k.  Stored
 * row by row as each was computed, a load of a later row's x or dy waited for an earlier
 * row's store whenever the two addresses agree in their low 12 bits (4K aliasing): for
 * every vector when a row is a multiple of 4 KiB long and dx starts where x does modulo
 * 4 KiB, as NumPy places large arrays (at (128, 4096) float32, one thread, the RMSNorm
 * backward took 1.4x the time, the LayerNorm backward 1.25x). */
#define RN_PUT_ROWS(o, k)                                                               \
    do {                                                                                \
        for (int r = 0; r < rows; r++) RN_PUT(dx + r * d + (k), (o)[r]);                \
        if (dx2) for (int r = 0; r < rows; r++) RN_PUT(dx2 + r * d + (k), (o)[r]);      \
    } while (0)

/* O += dh at element offset OFF of the group: the gradient along the residual stream,
 * which the fused backward adds (float and double only: see rms_bwd_apply_rows_p). */
#define RN_PLUS_DH(O, OFF)                                                              \
    do { if (!RN_HALF && dh) (O) += RN_GET(dh + (OFF)); } while (0)

/* CASES(R) with R a constant for a whole group and for a single row (the kernels' two
 * common cases: the loop over the rows then unrolls, or vanishes), else the row count. */
#define RN_BY_ROWS(CASES)                                                               \
    do {                                                                                \
        if (rows == RN_GROUP) { CASES(RN_GROUP); }                                      \
        else if (rows == 1) { CASES(1); }                                               \
        else { CASES(rows); }                                                           \
    } while (0)

/* BODY with pf a constant, for a noinline pass that takes either kind of parameters (the
 * 16-bit types' own, or float32's): one expansion of each. */
#if RN_HALF
#define RN_BY_PF(BODY)                                                                  \
    do {                                                                                \
        if (pf) { const int pf = 1; BODY; }                                             \
        else { const int pf = 0; BODY; }                                                \
    } while (0)
#else
#define RN_BY_PF(BODY) do { BODY; } while (0)
#endif

/* Columns per chunk of a streamed group: whole cache lines of every element type. */
#define RN_CHUNK 512

/* Whether a group takes the chunked streamed pass: several rows, streamed, sharing their
 * phase (the column loop streams only such rows, or a single one). */
#define RN_CHUNKED(stream, rows, d) ((stream) && (rows) > 1 && RN_NAME(rows_share_phase)(d))

/* One vector slot of a chunk's carried sums (RN_C, vector-aligned), and back. */
static inline __attribute__((always_inline)) RN_VEC RN_NAME(cget)(const RN_C *p)
{
    RN_VEC v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void RN_NAME(cput)(RN_C *p, RN_VEC v)
{
    memcpy(p, &v, sizeof v);
}

/* The group sum t of this row's terms and the earlier rows' (carried in c): t itself for
 * the first row, c + t after it (the column loop's order); stored back in c for the next
 * row, or, for the last row, widened into part (NULL: no sum wanted; a partial vector
 * adds its n_ lanes only).  Each vector of the chunk, partial ones too, is carried whole
 * in its own aligned slot of RN_W lanes, slot (k + cs_) / RN_W (cs_ puts the whole
 * vectors on slot boundaries); the lanes past a partial vector's n_ are never added.
 * Carried lane by lane instead (memcpy of n_ lanes for a partial vector, whole vectors at
 * any alignment), a store that crossed a cache line, or a vector loaded from narrower
 * stores, stalled this pass one row later (the RMSNorm backward at (65536, 256) float32,
 * avx2, rows 16 bytes into a line: 1.2-1.5x the time). */
#define RN_CARRY(c, part, k, t)                                                         \
    do {                                                                                \
        RN_C *slot_ = (c) + (((k) + cs_) & -RN_W);                                      \
        RN_VEC s_sum_ = r ? RN_NAME(cget)(slot_) + (t) : (t);                           \
        if (r + 1 < rows) RN_NAME(cput)(slot_, s_sum_);                                 \
        else if (part) RN_ADD_WIDENED((part) + (k), s_sum_);                            \
    } while (0)

/* The chunked streamed pass: for each chunk [c0, c1) of columns (the chunks after the
 * first start where dx's vectors do; cs_: see RN_CARRY), each row r of the group runs ROW
 * (the row's coefficients as local scalars: read from the caller's arrays inside the
 * column loop, they were reloaded and broadcast on every vector, as stores to dx might
 * change them), then BODY(k) over the chunk's vectors, with dyr, xr, dxr its row from
 * column c0 (dx2r too, when dx2 is given), and the next group's span of the row
 * prefetched; the stores are fenced once, at the end. */
#define RN_CHUNKS(ROW, BODY)                                                            \
    do {                                                                                \
        const Py_ssize_t head_ = RN_NAME(align_head)(dx, d);                            \
        for (Py_ssize_t c0 = 0, c1; c0 < d; c0 = c1) {                                  \
            c1 = (c0 == 0 ? head_ : c0) + RN_CHUNK;                                     \
            if (c1 > d) c1 = d;                                                         \
            const Py_ssize_t cs_ = c0 == 0 ? (RN_W - head_ % RN_W) % RN_W : 0;         \
            for (int r = 0; r < rows; r++) {                                            \
                const RN_T *dyr = dy + r * d + c0, *xr = x + r * d + c0;                \
                RN_T *dxr = dx + r * d + c0, *dx2r = dx2 ? dx2 + r * d + c0 : NULL;     \
                (void)dx2r;                                                             \
                ROW                                                                     \
                RN_ELEMENTWISE(c1 - c0, dxr, RN_STREAM_UNFENCED, RN_PF_ROW, BODY);      \
            }                                                                           \
        }                                                                               \
        rn_sfence();                                                                    \
    } while (0)
#define RN_PF_ROW(k)                                                                    \
    do {                                                                                \
        if (r < ahead) {                                                                \
            RN_NAME(prefetch_next)(dyr, rows * d, (k), RN_W);                           \
            RN_NAME(prefetch_next)(xr, rows * d, (k), RN_W);                            \
            if (dh) RN_NAME(prefetch_next)(dh + r * d + c0, rows * d, (k), RN_W);       \
        }                                                                               \
    } while (0)

/* One row's vector at k of the RMSNorm backward, written once for the column loop and
 * the chunked pass: declares O, the row's dx = rstd * (g - xn * m) (xn = X * rstd,
 * g = DY * WV, WV evaluated only when there is a weight; RS, MT the row's rstd and m), and
 * T, the row's dweight term dy*xn; the caller stores O.  Reads the caller's w. */
#define RN_RMS_ROW(O, DY, X, WV, RS, MT, k, T)                                          \
    RN_VEC O, T;                                                                        \
    {                                                                                   \
        RN_VEC xn_ = RN_GET((X) + (k)) * (RS);                                          \
        RN_VEC dyv_ = RN_GET((DY) + (k)), g_ = dyv_;                                    \
        if (w) g_ *= (WV);                                                              \
        O = (RS) * (g_ - xn_ * (MT));                                                   \
        T = dyv_ * xn_;                                                                 \
    }

/* The same for LayerNorm: O = dx = rstd * ((g - mean_g) - xhat * mean_gxhat), xhat =
 * ((X - hi) - lo) * rstd (the mean as hi + lo: MH, ML; RS, MG, MGX the row's rstd, mean_g
 * and mean_gxhat); TW = dy*xhat and TB = dy, the row's dweight and dbias terms.  Reads the
 * caller's w. */
#define RN_LN_ROW(O, DY, X, WV, MH, ML, RS, MG, MGX, k, TW, TB)                         \
    RN_VEC O, TW, TB;                                                                   \
    {                                                                                   \
        RN_VEC xhat_ = ((RN_GET((X) + (k)) - (MH)) - (ML)) * (RS);                      \
        RN_VEC dyv_ = RN_GET((DY) + (k)), g_ = dyv_;                                    \
        if (w) g_ *= (WV);                                                              \
        O = (RS) * ((g_ - (MG)) - xhat_ * (MGX));                                       \
        TW = dyv_ * xhat_;                                                              \
        TB = dyv_;                                                                      \
    }

/* The passes' w and totals dw, db: of the element type, or float32 (pf, a constant of each
 * caller: see RN_GETP in vec.h). */
static inline __attribute__((always_inline)) void RN_NAME(rms_bwd_rows_body)(
    RN_T *dx, RN_T *dx2, void *dw, double *dw_part, const RN_T *dy, const RN_T *dh,
    const RN_T *x, const void *w, int pf, const RN_C *rs, const RN_C *mt, int rows,
    Py_ssize_t d, int stream, Py_ssize_t ahead, int prefetch_dx)
{
#define B_(k)                                                                           \
    {                                                                                   \
        RN_VEC tw = {0}, wv = {0}, o[RN_GROUP];                                         \
        if (w) wv = RN_GETP(w, k);                                                      \
        for (int r = 0; r < rows; r++) {                                                \
            RN_RMS_ROW(o_, dy + r * d, x + r * d, wv, rs[r], mt[r], k, t_);             \
            RN_PLUS_DH(o_, r * d + (k));                                                \
            o[r] = o_;                                                                  \
            tw = r ? tw + t_ : t_;                                                      \
        }                                                                               \
        RN_PUT_ROWS(o, k);                                                              \
        RN_SUM_GROUP(dw, dw_part, k, tw);                                               \
    }
    RN_COLUMNS(B_);
#undef B_
}

/* rms_bwd_rows_body for a streamed group, chunk by chunk (the same bits). */
static inline __attribute__((always_inline)) void RN_NAME(rms_bwd_rows_chunked)(
    RN_T *dx, RN_T *dx2, double *dw_part, const RN_T *dy, const RN_T *dh, const RN_T *x,
    const void *w, int pf, const RN_C *rs, const RN_C *mt, int rows, Py_ssize_t d,
    Py_ssize_t ahead)
{
    RN_C tw[RN_CHUNK + 2 * RN_W] __attribute__((aligned(RN_VBYTES)));
#define ROW_ const RN_C rs_r = rs[r], mt_r = mt[r];
#define B_(k)                                                                           \
    {                                                                                   \
        RN_RMS_ROW(o_, dyr, xr, RN_GETP(w, c0 + (k)), rs_r, mt_r, k, t_);               \
        RN_PLUS_DH(o_, r * d + c0 + (k));                                               \
        RN_PUT(dxr + (k), o_);                                                          \
        if (dx2) RN_PUT(dx2r + (k), o_);                                                \
        RN_CARRY(tw, dw_part ? dw_part + c0 : NULL, k, t_);                             \
    }
    RN_CHUNKS(ROW_, B_);
#undef B_
#undef ROW_
}

#define RMS_BODY_(DX2, DH, DW, DW_PART, W, R)                                           \
    RN_NAME(rms_bwd_rows_body)(dx, DX2, DW, DW_PART, dy, DH, x, W, pf, rs, mt, R, d,      \
                               stream, ahead, prefetch_dx)

#if !RN_HALF
/* The column loop of rms_bwd_apply_rows_p with dx2 given (the fused backward; float and
 * double rows only), one inlined copy for each of its two common cases (Pre-Norm with dh,
 * Post-Norm without), the other forms with their branches.  A function of its own:
 * expanded beside the norm's cases, in one function, they left the compiler short of
 * registers in those (the LayerNorm one reloaded its row constants from the stack). */
static __attribute__((noinline)) void RN_NAME(rms_bwd_rows_both)(
    RN_T *dx, RN_T *dx2, double *dw_part, const RN_T *dy, const RN_T *dh, const RN_T *x,
    const RN_T *w, const RN_C *rs, const RN_C *mt, int rows, Py_ssize_t d, int stream,
    Py_ssize_t ahead, int prefetch_dx)
{
    const int pf = 0;
#define CASES_(R)                                                                       \
    if (dh && w && dw_part) RMS_BODY_(dx2, dh, NULL, dw_part, w, R);                    \
    else if (w && dw_part) RMS_BODY_(dx2, NULL, NULL, dw_part, w, R);                   \
    else RMS_BODY_(dx2, dh, NULL, dw_part, w, R)
    RN_BY_ROWS(CASES_);
#undef CASES_
}
#endif

/* The column loop of rms_bwd_apply_rows_p with the totals dw given (the call's rows are
 * this one group: a small call, always with a weight), one inlined copy for each of the
 * norm's backward and the fused one's two (dh given with dx2 only, as the kernels call
 * it); as rms_bwd_rows_both, the fused copies only where the fused pass exists. */
static __attribute__((noinline)) void RN_NAME(rms_bwd_rows_total)(
    RN_T *dx, RN_T *dx2, void *dw, const RN_T *dy, const RN_T *dh, const RN_T *x,
    const void *w, int pf, const RN_C *rs, const RN_C *mt, int rows, Py_ssize_t d,
    int stream, Py_ssize_t ahead, int prefetch_dx)
{
#if RN_HALF
#define CASES_(R) RN_BY_PF(RMS_BODY_(NULL, NULL, dw, NULL, w, R))
#else
#define CASES_(R)                                                                       \
    if (!dx2) RMS_BODY_(NULL, NULL, dw, NULL, w, R);                                    \
    else if (dh) RMS_BODY_(dx2, dh, dw, NULL, w, R);                                    \
    else RMS_BODY_(dx2, NULL, dw, NULL, w, R)
#endif
    RN_BY_ROWS(CASES_);
#undef CASES_
}

/* RMSNorm backward, elementwise part, for `rows` (<= RN_GROUP) consecutive rows, given
 * each row's reduction m[r] = mean(g * xn):
 *   dx = rstd * (g - xn * m) + dh,   dw_part += sum over the rows of dy * xn
 * (xn = x * rstd, g = dy * w; dw_part NULL when no weight gradient is wanted; dh NULL: 0).
 * dw (NULL: none) takes the place of dw_part when the group is all the rows of the call:
 * dw = that sum, rounded once (see put_total).
 * dx2 (NULL: none) receives dx's values too: the fused add + norm backward writes the
 * gradients of both inputs of a plain residual add, dh added, in this one pass.  dx2 and
 * dh are for float and double rows only (NULL for the 16-bit types, whose unfused passes
 * round dx before dh is added, which this pass would not do).
 * prefetch_dx: dx (and dx2) are arrays whose rows go on past the group as dy's and x's
 * do (not a scratch group), and their next rows are to be prefetched (norm_kernels.pxd
 * decides).  w and dw: of the element type, or float32 (pf). */
static inline __attribute__((always_inline)) void RN_NAME(rms_bwd_apply_rows_p)(
    RN_T *dx, RN_T *dx2, void *dw, double *dw_part, const RN_T *dy, const RN_T *dh,
    const RN_T *x, const void *w, int pf, const double *rstd, const double *m, int rows,
    Py_ssize_t d, int stream, Py_ssize_t ahead, int prefetch_dx)
{
    RN_C rs[RN_GROUP], mt[RN_GROUP]; /* rstd and m in the compute type */
    for (int r = 0; r < rows; r++) {
        rs[r] = (RN_C)rstd[r];
        mt[r] = (RN_C)m[r];
    }
    /* the stores to dx2 take dx's alignment: streamed only when it is theirs too */
    if (!RN_NAME(same_phase)(dx, dx2)) stream = 0;
    if (dw) {
        RN_NAME(rms_bwd_rows_total)(dx, dx2, dw, dy, dh, x, w, pf, rs, mt, rows, d, stream,
                                    ahead, prefetch_dx);
        return;
    }
    if (RN_CHUNKED(stream, rows, d)) {
        if (w) RN_NAME(rms_bwd_rows_chunked)(dx, dx2, dw_part, dy, dh, x, w, pf, rs, mt, rows,
                                             d, ahead);
        else RN_NAME(rms_bwd_rows_chunked)(dx, dx2, NULL, dy, dh, x, NULL, pf, rs, mt, rows, d,
                                           ahead);
        return;
    }
#if !RN_HALF
    if (dx2) {
        RN_NAME(rms_bwd_rows_both)(dx, dx2, dw_part, dy, dh, x, w, rs, mt, rows, d, stream,
                                   ahead, prefetch_dx);
        return;
    }
#endif
    /* One inlined copy per case so the dead branches leave the loops. */
#define CASES_(R)                                                                       \
    if (w && dw_part) RMS_BODY_(NULL, NULL, NULL, dw_part, w, R);                       \
    else if (w) RMS_BODY_(NULL, NULL, NULL, NULL, w, R);                                \
    else RMS_BODY_(NULL, NULL, NULL, NULL, NULL, R)
    RN_BY_ROWS(CASES_);
#undef CASES_
}

static void RN_NAME(rms_bwd_apply_rows)(RN_T *dx, RN_T *dx2, RN_T *dw, double *dw_part,
                                        const RN_T *dy, const RN_T *dh, const RN_T *x,
                                        const RN_T *w, const double *rstd, const double *m,
                                        int rows, Py_ssize_t d, int stream, Py_ssize_t ahead,
                                        int prefetch_dx)
{
    RN_NAME(rms_bwd_apply_rows_p)(dx, dx2, dw, dw_part, dy, dh, x, w, 0, rstd, m, rows, d,
                                  stream, ahead, prefetch_dx);
}

static inline __attribute__((always_inline)) void RN_NAME(ln_bwd_rows_body)(
    RN_T *dx, RN_T *dx2, void *dw, void *db, double *dw_part, double *db_part, const RN_T *dy,
    const RN_T *dh, const RN_T *x, const void *w, int pf, const RN_C *mh, const RN_C *ml,
    const RN_C *rs, const RN_C *mg, const RN_C *mgx, int rows, Py_ssize_t d, int stream,
    Py_ssize_t ahead, int prefetch_dx)
{
#define B_(k)                                                                           \
    {                                                                                   \
        RN_VEC tw = {0}, tb = {0}, wv = {0}, o[RN_GROUP];                               \
        if (w) wv = RN_GETP(w, k);                                                      \
        for (int r = 0; r < rows; r++) {                                                \
            RN_LN_ROW(o_, dy + r * d, x + r * d, wv, mh[r], ml[r], rs[r], mg[r], mgx[r], \
                      k, tw_, tb_);                                                     \
            RN_PLUS_DH(o_, r * d + (k));                                                \
            o[r] = o_;                                                                  \
            tw = r ? tw + tw_ : tw_;                                                    \
            tb = r ? tb + tb_ : tb_;                                                    \
        }                                                                               \
        RN_PUT_ROWS(o, k);                                                              \
        RN_SUM_GROUP(dw, dw_part, k, tw);                                               \
        RN_SUM_GROUP(db, db_part, k, tb);                                               \
    }
    RN_COLUMNS(B_);
#undef B_
}

/* ln_bwd_rows_body for a streamed group, chunk by chunk (the same bits). */
static inline __attribute__((always_inline)) void RN_NAME(ln_bwd_rows_chunked)(
    RN_T *dx, RN_T *dx2, double *dw_part, double *db_part, const RN_T *dy, const RN_T *dh,
    const RN_T *x, const void *w, int pf, const RN_C *mh, const RN_C *ml, const RN_C *rs,
    const RN_C *mg, const RN_C *mgx, int rows, Py_ssize_t d, Py_ssize_t ahead)
{
    RN_C tw[RN_CHUNK + 2 * RN_W] __attribute__((aligned(RN_VBYTES)));
    RN_C tb[RN_CHUNK + 2 * RN_W] __attribute__((aligned(RN_VBYTES)));
#define ROW_ const RN_C mh_r = mh[r], ml_r = ml[r], rs_r = rs[r], mg_r = mg[r], mgx_r = mgx[r];
#define B_(k)                                                                           \
    {                                                                                   \
        RN_LN_ROW(o_, dyr, xr, RN_GETP(w, c0 + (k)), mh_r, ml_r, rs_r, mg_r, mgx_r, k, tw_,   \
                  tb_);                                                                 \
        RN_PLUS_DH(o_, r * d + c0 + (k));                                               \
        RN_PUT(dxr + (k), o_);                                                          \
        if (dx2) RN_PUT(dx2r + (k), o_);                                                \
        RN_CARRY(tw, dw_part ? dw_part + c0 : NULL, k, tw_);                            \
        RN_CARRY(tb, db_part ? db_part + c0 : NULL, k, tb_);                            \
    }
    RN_CHUNKS(ROW_, B_);
#undef B_
#undef ROW_
}

#define LN_BODY_(DX2, DH, DW, DB, DW_PART, DB_PART, W, R)                               \
    RN_NAME(ln_bwd_rows_body)(dx, DX2, DW, DB, DW_PART, DB_PART, dy, DH, x, W, pf, mh, ml, \
                              rs, mg, mgx, R, d, stream, ahead, prefetch_dx)

#if !RN_HALF
/* The column loop of ln_bwd_apply_rows_p with dx2 given, as rms_bwd_rows_both. */
static __attribute__((noinline)) void RN_NAME(ln_bwd_rows_both)(
    RN_T *dx, RN_T *dx2, double *dw_part, double *db_part, const RN_T *dy, const RN_T *dh,
    const RN_T *x, const RN_T *w, const RN_C *mh, const RN_C *ml, const RN_C *rs,
    const RN_C *mg, const RN_C *mgx, int rows, Py_ssize_t d, int stream, Py_ssize_t ahead,
    int prefetch_dx)
{
    const int pf = 0;
#define CASES_(R)                                                                       \
    if (dh && w && dw_part && db_part)                                                  \
        LN_BODY_(dx2, dh, NULL, NULL, dw_part, db_part, w, R);                          \
    else if (w && dw_part && db_part)                                                   \
        LN_BODY_(dx2, NULL, NULL, NULL, dw_part, db_part, w, R);                        \
    else LN_BODY_(dx2, dh, NULL, NULL, dw_part, db_part, w, R)
    RN_BY_ROWS(CASES_);
#undef CASES_
}
#endif

/* The column loop of ln_bwd_apply_rows_p with the totals dw or db given, as
 * rms_bwd_rows_total, and one copy for the other forms (no weight, or a sum not wanted). */
static __attribute__((noinline)) void RN_NAME(ln_bwd_rows_total)(
    RN_T *dx, RN_T *dx2, void *dw, void *db, const RN_T *dy, const RN_T *dh, const RN_T *x,
    const void *w, int pf, const RN_C *mh, const RN_C *ml, const RN_C *rs, const RN_C *mg,
    const RN_C *mgx, int rows, Py_ssize_t d, int stream, Py_ssize_t ahead, int prefetch_dx)
{
/* (a copy under `if (w && dw && db)` knows them given: their tests leave its loop) */
#if RN_HALF
#define CASES_(R)                                                                       \
    RN_BY_PF(if (w && dw && db) LN_BODY_(NULL, NULL, dw, db, NULL, NULL, w, R);         \
             else LN_BODY_(NULL, NULL, dw, db, NULL, NULL, w, R))
#else
#define CASES_(R)                                                                       \
    if (!w || !dw || !db) LN_BODY_(dx2, dh, dw, db, NULL, NULL, w, R);                  \
    else if (!dx2) LN_BODY_(NULL, NULL, dw, db, NULL, NULL, w, R);                      \
    else if (dh) LN_BODY_(dx2, dh, dw, db, NULL, NULL, w, R);                           \
    else LN_BODY_(dx2, NULL, dw, db, NULL, NULL, w, R)
#endif
    RN_BY_ROWS(CASES_);
#undef CASES_
}

/* LayerNorm backward, elementwise part, for `rows` (<= RN_GROUP) consecutive rows, given
 * each row's two reductions mean_g[r] = mean(g) and mean_gxhat[r] = mean(g * xhat):
 *   dx = rstd * ((g - mean_g) - xhat * mean_gxhat) + dh,
 *   dw_part += sum over the rows of dy * xhat,   db_part += sum over the rows of dy
 * (xhat = (x - mean) * rstd, g = dy * w; the partials may be NULL; dx2, dh, the totals dw
 * and db, prefetch_dx and pf as in rms_bwd_apply_rows_p). */
static inline __attribute__((always_inline)) void RN_NAME(ln_bwd_apply_rows_p)(
    RN_T *dx, RN_T *dx2, void *dw, void *db, double *dw_part, double *db_part,
    const RN_T *dy, const RN_T *dh, const RN_T *x, const void *w, int pf, const double *mean,
    const double *rstd, const double *mean_g, const double *mean_gxhat, int rows,
    Py_ssize_t d, int stream, Py_ssize_t ahead, int prefetch_dx)
{
    /* in the compute type: mean as hi + lo, rstd, mean_g, mean_gxhat */
    RN_C mh[RN_GROUP], ml[RN_GROUP], rs[RN_GROUP], mg[RN_GROUP], mgx[RN_GROUP];
    for (int r = 0; r < rows; r++) {
        RN_NAME(split_mean)(mean[r], &mh[r], &ml[r]);
        rs[r] = (RN_C)rstd[r];
        mg[r] = (RN_C)mean_g[r];
        mgx[r] = (RN_C)mean_gxhat[r];
    }
    if (!RN_NAME(same_phase)(dx, dx2)) stream = 0;   /* as in rms_bwd_apply_rows_p */
    if (dw || db) {
        RN_NAME(ln_bwd_rows_total)(dx, dx2, dw, db, dy, dh, x, w, pf, mh, ml, rs, mg, mgx, rows,
                                   d, stream, ahead, prefetch_dx);
        return;
    }
    if (RN_CHUNKED(stream, rows, d)) {
        if (w) RN_NAME(ln_bwd_rows_chunked)(dx, dx2, dw_part, db_part, dy, dh, x, w, pf, mh,
                                            ml, rs, mg, mgx, rows, d, ahead);
        else RN_NAME(ln_bwd_rows_chunked)(dx, dx2, NULL, db_part, dy, dh, x, NULL, pf, mh, ml,
                                          rs, mg, mgx, rows, d, ahead);
        return;
    }
#if !RN_HALF
    if (dx2) {
        RN_NAME(ln_bwd_rows_both)(dx, dx2, dw_part, db_part, dy, dh, x, w, mh, ml, rs, mg, mgx,
                                  rows, d, stream, ahead, prefetch_dx);
        return;
    }
#endif
#define CASES_(R)                                                                       \
    if (w && dw_part && db_part) LN_BODY_(NULL, NULL, NULL, NULL, dw_part, db_part, w, R); \
    else if (w && dw_part) LN_BODY_(NULL, NULL, NULL, NULL, dw_part, NULL, w, R);       \
    else if (w) LN_BODY_(NULL, NULL, NULL, NULL, NULL, db_part, w, R);                  \
    else LN_BODY_(NULL, NULL, NULL, NULL, NULL, db_part, NULL, R)
    RN_BY_ROWS(CASES_);
#undef CASES_
}

static void RN_NAME(ln_bwd_apply_rows)(RN_T *dx, RN_T *dx2, RN_T *dw, RN_T *db,
                                       double *dw_part, double *db_part,
                                       const RN_T *dy, const RN_T *dh, const RN_T *x,
                                       const RN_T *w, const double *mean, const double *rstd,
                                       const double *mean_g, const double *mean_gxhat, int rows,
                                       Py_ssize_t d, int stream, Py_ssize_t ahead,
                                       int prefetch_dx)
{
    RN_NAME(ln_bwd_apply_rows_p)(dx, dx2, dw, db, dw_part, db_part, dy, dh, x, w, 0, mean,
                                 rstd, mean_g, mean_gxhat, rows, d, stream, ahead,
                                 prefetch_dx);
}

#if !RN_HALF
/* One row of a run of rows whose column sums (dweight, dbias) are carried in the row's
 * compute type from row to row (norm_kernels.pxd, carried: runs of RN_GROUP rows, whose
 * sums are formed as a group's are); carry_flush then adds them, widened, into the float64
 * partial row.  Each row's apply pass goes alone, dx (dx2) stored plainly: a group's
 * column-by-column pass moves RN_GROUP rows of every array at once, and at (2048, 4096)
 * float32, one thread, the fused LayerNorm backward took up to twice the time that way
 * (benchmarks/TUNING.md).  RN_CARRY_ADD: c[k ..] += t, whole or partial vectors, plain
 * stores. */
#define RN_CARRY_ADD(c, k, t)                                                           \
    do {                                                                                \
        const int cs_ = s_ == RN_PART || s_ == RN_PART_STREAMED ? RN_PART : RN_WHOLE;   \
        RN_NAME(vput)((c) + (k), RN_NAME(vget)((c) + (k), n_, cs_) + (t), n_, cs_);     \
    } while (0)

static inline __attribute__((always_inline)) void RN_NAME(rms_bwd_row_carry_body)(
    RN_T *dx, RN_T *dx2, RN_T *cw, const RN_T *dy, const RN_T *dh, const RN_T *x,
    const RN_T *w, RN_C rs, RN_C mt, Py_ssize_t d)
{
#define NO_PF_(k)
#define B_(k)                                                                           \
    {                                                                                   \
        RN_RMS_ROW(o_, dy, x, RN_GET(w + (k)), rs, mt, k, t_);                          \
        RN_PLUS_DH(o_, k);                                                              \
        RN_PUT(dx + (k), o_);                                                           \
        if (dx2) RN_PUT(dx2 + (k), o_);                                                 \
        if (cw) RN_CARRY_ADD(cw, k, t_);                                                \
    }
    RN_ELEMENTWISE(d, dx, 0, NO_PF_, B_);
#undef B_
}

/* RMSNorm backward of one row, its dweight term carried:
 *   dx = rstd * (g - xn * m) + dh,  dx2 = dx,  cw += dy*xn
 * (dx2, dh, cw NULL: none; w NULL: 1).  See RN_CARRY_ADD. */
static void RN_NAME(rms_bwd_row_carry)(RN_T *dx, RN_T *dx2, RN_T *cw, const RN_T *dy,
                                       const RN_T *dh, const RN_T *x, const RN_T *w,
                                       double rstd, double m, Py_ssize_t d)
{
    const RN_C rs = (RN_C)rstd, mt = (RN_C)m;
    /* one inlined copy per common case, so the dead branches leave the loop */
    if (w && cw && dx2 && dh) RN_NAME(rms_bwd_row_carry_body)(dx, dx2, cw, dy, dh, x, w, rs, mt, d);
    else if (w && cw && !dx2 && !dh) RN_NAME(rms_bwd_row_carry_body)(dx, NULL, cw, dy, NULL, x, w, rs, mt, d);
    else RN_NAME(rms_bwd_row_carry_body)(dx, dx2, cw, dy, dh, x, w, rs, mt, d);
}

static inline __attribute__((always_inline)) void RN_NAME(ln_bwd_row_carry_body)(
    RN_T *dx, RN_T *dx2, RN_T *cw, RN_T *cb, const RN_T *dy, const RN_T *dh, const RN_T *x,
    const RN_T *w, RN_C mh, RN_C ml, RN_C rs, RN_C mg, RN_C mgx, Py_ssize_t d)
{
#define B_(k)                                                                           \
    {                                                                                   \
        RN_LN_ROW(o_, dy, x, RN_GET(w + (k)), mh, ml, rs, mg, mgx, k, tw_, tb_);        \
        RN_PLUS_DH(o_, k);                                                              \
        RN_PUT(dx + (k), o_);                                                           \
        if (dx2) RN_PUT(dx2 + (k), o_);                                                 \
        if (cw) RN_CARRY_ADD(cw, k, tw_);                                               \
        if (cb) RN_CARRY_ADD(cb, k, tb_);                                               \
    }
    RN_ELEMENTWISE(d, dx, 0, NO_PF_, B_);
#undef B_
#undef NO_PF_
}

/* LayerNorm backward of one row, its dweight and dbias terms carried:
 *   dx = rstd * ((g - mean_g) - xhat * mean_gxhat) + dh,  dx2 = dx,
 *   cw += dy*xhat,  cb += dy
 * (NULL: none, as in rms_bwd_row_carry). */
static void RN_NAME(ln_bwd_row_carry)(RN_T *dx, RN_T *dx2, RN_T *cw, RN_T *cb, const RN_T *dy,
                                      const RN_T *dh, const RN_T *x, const RN_T *w,
                                      double mean, double rstd, double mean_g,
                                      double mean_gxhat, Py_ssize_t d)
{
    RN_C mh, ml;
    RN_NAME(split_mean)(mean, &mh, &ml);
    const RN_C rs = (RN_C)rstd, mg = (RN_C)mean_g, mgx = (RN_C)mean_gxhat;
    if (w && cw && cb && dx2 && dh)
        RN_NAME(ln_bwd_row_carry_body)(dx, dx2, cw, cb, dy, dh, x, w, mh, ml, rs, mg, mgx, d);
    else if (w && cw && cb && !dx2 && !dh)
        RN_NAME(ln_bwd_row_carry_body)(dx, NULL, cw, cb, dy, NULL, x, w, mh, ml, rs, mg, mgx, d);
    else
        RN_NAME(ln_bwd_row_carry_body)(dx, dx2, cw, cb, dy, dh, x, w, mh, ml, rs, mg, mgx, d);
}

/* part += c, widened; then c = 0 for the block's next rows (c NULL: nothing). */
static void RN_NAME(carry_flush)(double *part, RN_T *c, Py_ssize_t d)
{
    if (!c) return;
    for (Py_ssize_t k = 0; k < d; k++) {
        part[k] += (double)c[k];
        c[k] = 0;
    }
}
#undef RN_CARRY_ADD
#endif

#if RN_HALF
/* rms_bwd_apply_rows and ln_bwd_apply_rows of 16-bit rows with float32 parameters (w, and
 * the totals dw, db; no dx2, dh): float32's arithmetic on the widened rows, each dx rounded
 * once (bitwise float32's passes on the widened rows, then the rounding; the same column
 * sums). */
static void RN_NAME(rms_bwd_apply_rows_mixed)(RN_T *dx, float *dw, double *dw_part,
                                              const RN_T *dy, const RN_T *x, const float *w,
                                              const double *rstd, const double *m, int rows,
                                              Py_ssize_t d, int stream, Py_ssize_t ahead,
                                              int prefetch_dx)
{
    RN_NAME(rms_bwd_apply_rows_p)(dx, NULL, dw, dw_part, dy, NULL, x, w, 1, rstd, m, rows, d,
                                  stream, ahead, prefetch_dx);
}

static void RN_NAME(ln_bwd_apply_rows_mixed)(RN_T *dx, float *dw, float *db, double *dw_part,
                                             double *db_part, const RN_T *dy, const RN_T *x,
                                             const float *w, const double *mean,
                                             const double *rstd, const double *mean_g,
                                             const double *mean_gxhat, int rows, Py_ssize_t d,
                                             int stream, Py_ssize_t ahead, int prefetch_dx)
{
    RN_NAME(ln_bwd_apply_rows_p)(dx, NULL, dw, db, dw_part, db_part, dy, NULL, x, w, 1, mean,
                                 rstd, mean_g, mean_gxhat, rows, d, stream, ahead,
                                 prefetch_dx);
}
#endif

#undef RN_PF_GROUP
#undef RN_PF_DX_ROWS
#undef RN_PF_ROW
#undef RN_RMS_ROW
#undef RN_LN_ROW
#undef RN_CHUNKS
#undef RN_CARRY
#undef RN_CHUNKED
#undef RN_CHUNK
#undef RN_BY_ROWS
#undef RN_BY_PF
#undef RN_SUM_GROUP
#undef RN_COLUMNS
#undef RN_PUT_ROWS
#undef RN_PLUS_DH
#undef RMS_BODY_
#undef LN_BODY_
