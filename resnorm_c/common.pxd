# Shared Cython declarations: the OpenMP stub, the fused row primitives of cpu.h, and the
# fixed row blocks through which every reduction over rows goes.
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport uint8_t, uint32_t, uint64_t

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define RN_HAVE_OPENMP 1
    #else
    #define RN_HAVE_OPENMP 0
    static int omp_get_max_threads(void) { return 1; }
    #endif
    """
    bint RN_HAVE_OPENMP
    int omp_get_max_threads() noexcept nogil

cdef extern from "cpu.h" nogil:
    ctypedef struct rn_ops_f32:
        double (*sum)(const float *, Py_ssize_t) noexcept nogil
        double (*sumsq)(const float *, Py_ssize_t) noexcept nogil
        double (*sumsqdev)(const float *, Py_ssize_t, double) noexcept nogil
        double (*rms_bwd_dot)(const float *, const float *, const float *, double,
                              Py_ssize_t) noexcept nogil
        void (*ln_bwd_sums)(double *, double *, const float *, const float *, const float *,
                            double, double, Py_ssize_t) noexcept nogil
        void (*rms_apply)(float *, const float *, const float *, double, Py_ssize_t,
                          int) noexcept nogil
        void (*ln_apply)(float *, const float *, const float *, const float *, double, double,
                         Py_ssize_t, int) noexcept nogil
        void (*rms_bwd_apply)(float *, double *, const float *, const float *, const float *,
                              double, double, Py_ssize_t, int) noexcept nogil
        void (*ln_bwd_apply)(float *, double *, double *, const float *, const float *,
                             const float *, double, double, double, double, Py_ssize_t,
                             int) noexcept nogil
        void (*accumulate)(double *, const double *, Py_ssize_t) noexcept nogil
        void (*narrow)(float *, const double *, Py_ssize_t) noexcept nogil
        void (*residual_add)(float *, const float *, const float *, const float *,
                             const uint8_t *, Py_ssize_t, double, Py_ssize_t,
                             int) noexcept nogil
        void (*residual_bwd)(float *, float *, double *, const float *, const float *,
                             const float *, const float *, const uint8_t *, Py_ssize_t, double,
                             Py_ssize_t, int) noexcept nogil
        double (*residual_reduce)(const float *, const float *, const float *, const uint8_t *,
                                  Py_ssize_t, double, Py_ssize_t, int, double) noexcept nogil
        void (*residual_norm_apply)(float *, float *, const float *, const float *,
                                    const float *, const uint8_t *, Py_ssize_t, double,
                                    const float *, const float *, double, double, Py_ssize_t,
                                    int) noexcept nogil
        void (*sigmoid)(float *, float *, const float *, Py_ssize_t) noexcept nogil
        void (*philox_uniforms)(uint32_t *, uint64_t, uint64_t, Py_ssize_t) noexcept nogil
        void (*dropout_keep)(uint8_t *, uint64_t, uint64_t, Py_ssize_t, uint32_t) noexcept nogil
        void (*dropout_bits)(uint64_t *, uint64_t, uint64_t, Py_ssize_t, uint32_t) noexcept nogil

    ctypedef struct rn_ops_f64:
        double (*sum)(const double *, Py_ssize_t) noexcept nogil
        double (*sumsq)(const double *, Py_ssize_t) noexcept nogil
        double (*sumsqdev)(const double *, Py_ssize_t, double) noexcept nogil
        double (*rms_bwd_dot)(const double *, const double *, const double *, double,
                              Py_ssize_t) noexcept nogil
        void (*ln_bwd_sums)(double *, double *, const double *, const double *, const double *,
                            double, double, Py_ssize_t) noexcept nogil
        void (*rms_apply)(double *, const double *, const double *, double, Py_ssize_t,
                          int) noexcept nogil
        void (*ln_apply)(double *, const double *, const double *, const double *, double, double,
                         Py_ssize_t, int) noexcept nogil
        void (*rms_bwd_apply)(double *, double *, const double *, const double *, const double *,
                              double, double, Py_ssize_t, int) noexcept nogil
        void (*ln_bwd_apply)(double *, double *, double *, const double *, const double *,
                             const double *, double, double, double, double, Py_ssize_t,
                             int) noexcept nogil
        void (*accumulate)(double *, const double *, Py_ssize_t) noexcept nogil
        void (*narrow)(double *, const double *, Py_ssize_t) noexcept nogil
        void (*residual_add)(double *, const double *, const double *, const double *,
                             const uint8_t *, Py_ssize_t, double, Py_ssize_t,
                             int) noexcept nogil
        void (*residual_bwd)(double *, double *, double *, const double *, const double *,
                             const double *, const double *, const uint8_t *, Py_ssize_t, double,
                             Py_ssize_t, int) noexcept nogil
        double (*residual_reduce)(const double *, const double *, const double *, const uint8_t *,
                                  Py_ssize_t, double, Py_ssize_t, int, double) noexcept nogil
        void (*residual_norm_apply)(double *, double *, const double *, const double *,
                                    const double *, const uint8_t *, Py_ssize_t, double,
                                    const double *, const double *, double, double, Py_ssize_t,
                                    int) noexcept nogil
        void (*sigmoid)(double *, double *, const double *, Py_ssize_t) noexcept nogil
        void (*philox_uniforms)(uint32_t *, uint64_t, uint64_t, Py_ssize_t) noexcept nogil
        void (*dropout_keep)(uint8_t *, uint64_t, uint64_t, Py_ssize_t, uint32_t) noexcept nogil
        void (*dropout_bits)(uint64_t *, uint64_t, uint64_t, Py_ssize_t, uint32_t) noexcept nogil

    rn_ops_f32 RN_F32
    rn_ops_f64 RN_F64
    int RN_STREAM_UNFENCED
    void rn_sfence()
    int rn_cpu_init()
    const char *rn_level_name()
    const char *rn_build_flags()


# ---- fused front-ends: one name per primitive, the element type picks the table ----

cdef inline double row_sum(const floating *x, Py_ssize_t n) noexcept nogil:
    if floating is float:
        return RN_F32.sum(x, n)
    else:
        return RN_F64.sum(x, n)

cdef inline double row_sumsq(const floating *x, Py_ssize_t n) noexcept nogil:
    if floating is float:
        return RN_F32.sumsq(x, n)
    else:
        return RN_F64.sumsq(x, n)

cdef inline double row_sumsqdev(const floating *x, Py_ssize_t n, double mean) noexcept nogil:
    if floating is float:
        return RN_F32.sumsqdev(x, n, mean)
    else:
        return RN_F64.sumsqdev(x, n, mean)

cdef inline double row_rms_bwd_dot(const floating *dy, const floating *x, const floating *w,
                                   double rstd, Py_ssize_t n) noexcept nogil:
    if floating is float:
        return RN_F32.rms_bwd_dot(dy, x, w, rstd, n)
    else:
        return RN_F64.rms_bwd_dot(dy, x, w, rstd, n)

cdef inline void row_ln_bwd_sums(double *sum_g, double *sum_gxhat, const floating *dy,
                                 const floating *x, const floating *w, double mean,
                                 double rstd, Py_ssize_t n) noexcept nogil:
    if floating is float:
        RN_F32.ln_bwd_sums(sum_g, sum_gxhat, dy, x, w, mean, rstd, n)
    else:
        RN_F64.ln_bwd_sums(sum_g, sum_gxhat, dy, x, w, mean, rstd, n)

cdef inline void row_rms_apply(floating *y, const floating *x, const floating *w, double rstd,
                               Py_ssize_t n, bint stream) noexcept nogil:
    if floating is float:
        RN_F32.rms_apply(y, x, w, rstd, n, stream)
    else:
        RN_F64.rms_apply(y, x, w, rstd, n, stream)

cdef inline void row_ln_apply(floating *y, const floating *x, const floating *w,
                              const floating *b, double mean, double rstd, Py_ssize_t n,
                              bint stream) noexcept nogil:
    if floating is float:
        RN_F32.ln_apply(y, x, w, b, mean, rstd, n, stream)
    else:
        RN_F64.ln_apply(y, x, w, b, mean, rstd, n, stream)

cdef inline void row_rms_bwd_apply(floating *dx, double *dw_part, const floating *dy,
                                   const floating *x, const floating *w, double rstd, double m,
                                   Py_ssize_t n, bint stream) noexcept nogil:
    if floating is float:
        RN_F32.rms_bwd_apply(dx, dw_part, dy, x, w, rstd, m, n, stream)
    else:
        RN_F64.rms_bwd_apply(dx, dw_part, dy, x, w, rstd, m, n, stream)

cdef inline void row_ln_bwd_apply(floating *dx, double *dw_part, double *db_part,
                                  const floating *dy, const floating *x, const floating *w,
                                  double mean, double rstd, double mg, double mgx,
                                  Py_ssize_t n, bint stream) noexcept nogil:
    if floating is float:
        RN_F32.ln_bwd_apply(dx, dw_part, db_part, dy, x, w, mean, rstd, mg, mgx, n, stream)
    else:
        RN_F64.ln_bwd_apply(dx, dw_part, db_part, dy, x, w, mean, rstd, mg, mgx, n, stream)

cdef inline void row_narrow(floating *out, const double *acc, Py_ssize_t n) noexcept nogil:
    if floating is float:
        RN_F32.narrow(out, acc, n)
    else:
        RN_F64.narrow(out, acc, n)

cdef inline const floating *opt_ptr(const floating[::1] v) noexcept:
    """The data of an optional vector (weight, bias, alpha), NULL for None."""
    if v is None:
        return NULL
    return &v[0]

cdef inline void add_partial(double *acc, const double *part, Py_ssize_t n) noexcept nogil:
    """acc += part, elementwise (the same code for either element type)."""
    RN_F64.accumulate(acc, part, n)


# ---- residual connections.  The dropout mask is a bit string (1 bit per element, from
# span_bits); element k of a span uses bit kpos + k of keep (keep NULL: no dropout), and
# its multiplier is scale if the bit is set, 0 if not. ----

cdef inline void row_residual_add(floating *h, const floating *r, const floating *x,
                                  const floating *a, const uint8_t *keep, Py_ssize_t kpos,
                                  double scale, Py_ssize_t n, int stream) noexcept nogil:
    if floating is float:
        RN_F32.residual_add(h, r, x, a, keep, kpos, scale, n, stream)
    else:
        RN_F64.residual_add(h, r, x, a, keep, kpos, scale, n, stream)

cdef inline void row_residual_bwd(floating *dx, floating *dr, double *da_part,
                                  const floating *gh, const floating *dh, const floating *x,
                                  const floating *a, const uint8_t *keep, Py_ssize_t kpos,
                                  double scale, Py_ssize_t n, int stream) noexcept nogil:
    if floating is float:
        RN_F32.residual_bwd(dx, dr, da_part, gh, dh, x, a, keep, kpos, scale, n, stream)
    else:
        RN_F64.residual_bwd(dx, dr, da_part, gh, dh, x, a, keep, kpos, scale, n, stream)

cdef inline double row_residual_reduce(const floating *r, const floating *x,
                                       const floating *a, const uint8_t *keep, Py_ssize_t kpos,
                                       double scale, Py_ssize_t n, bint squares,
                                       double shift) noexcept nogil:
    if floating is float:
        return RN_F32.residual_reduce(r, x, a, keep, kpos, scale, n, squares, shift)
    else:
        return RN_F64.residual_reduce(r, x, a, keep, kpos, scale, n, squares, shift)

cdef inline void row_residual_norm_apply(floating *y, floating *hout, const floating *r,
                                         const floating *x, const floating *a,
                                         const uint8_t *keep, Py_ssize_t kpos, double scale,
                                         const floating *w, const floating *b, double mean,
                                         double rstd, Py_ssize_t n, int stream) noexcept nogil:
    if floating is float:
        RN_F32.residual_norm_apply(y, hout, r, x, a, keep, kpos, scale, w, b, mean, rstd, n,
                                   stream)
    else:
        RN_F64.residual_norm_apply(y, hout, r, x, a, keep, kpos, scale, w, b, mean, rstd, n,
                                   stream)

cdef inline void row_sigmoid(floating *s, floating *ds, const floating *g,
                             Py_ssize_t n) noexcept nogil:
    if floating is float:
        RN_F32.sigmoid(s, ds, g, n)
    else:
        RN_F64.sigmoid(s, ds, g, n)

cdef inline void span_uniforms(uint32_t *u, uint64_t seed, uint64_t start,
                               Py_ssize_t n) noexcept nogil:
    """u[k] := the Philox uniform of flat element start + k (any element type)."""
    RN_F64.philox_uniforms(u, seed, start, n)

cdef inline void span_keep(uint8_t *keep, uint64_t seed, uint64_t start, Py_ssize_t n,
                           uint32_t threshold) noexcept nogil:
    """keep[k] := uniform(start + k) >= threshold, one byte each (any element type)."""
    RN_F64.dropout_keep(keep, seed, start, n, threshold)

cdef inline void span_bits(uint64_t *words, uint64_t seed, uint64_t group, Py_ssize_t count,
                           uint32_t threshold) noexcept nogil:
    """words[j] := the keep bits of elements 64 (group + j) .. + 63 (any element type)."""
    RN_F64.dropout_bits(words, seed, group, count, threshold)


# ---- reductions over rows: fixed row blocks, one float64 partial row per block ----

# At most MAX_ROW_BLOCKS blocks of at least MIN_BLOCK_ROWS rows each (fewer rows than that
# make one block).  A function of N alone, for reproducibility across thread counts.
cdef enum:
    MAX_ROW_BLOCKS = 64
    MIN_BLOCK_ROWS = 8
    REDUCE_COLUMNS = 512  # columns per task when the partial rows are summed


cdef inline Py_ssize_t row_blocks(Py_ssize_t n_rows) noexcept nogil:
    """Number of row blocks a reduction over N rows uses (depends on N only)."""
    cdef Py_ssize_t nb = (n_rows + MIN_BLOCK_ROWS - 1) // MIN_BLOCK_ROWS
    return max(1, min(MAX_ROW_BLOCKS, nb))


cdef inline void sum_partials(floating[::1] out, double[:, ::1] part, int n_threads) noexcept:
    """out[j] := sum_b part[b, j], added in block order b = 0, 1, ... for every j.
    (part is overwritten: row 0 accumulates the total.)"""
    cdef Py_ssize_t nb = part.shape[0], d = part.shape[1]
    cdef Py_ssize_t n_tasks = (d + REDUCE_COLUMNS - 1) // REDUCE_COLUMNS, t, j0, m, b
    with nogil:
        for t in prange(n_tasks, schedule="static", num_threads=n_threads):
            j0 = t * REDUCE_COLUMNS
            m = min(REDUCE_COLUMNS, d - j0)
            for b in range(1, nb):
                add_partial(&part[0, j0], &part[b, j0], m)
            row_narrow(&out[j0], &part[0, j0], m)
