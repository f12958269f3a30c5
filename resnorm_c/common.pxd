# Shared Cython declarations: the OpenMP stub and the fused row primitives of cpu.h.
from cython cimport floating

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

    rn_ops_f32 RN_F32
    rn_ops_f64 RN_F64
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

cdef inline void add_partial(double *acc, const double *part, Py_ssize_t n) noexcept nogil:
    """acc += part, elementwise (the same code for either element type)."""
    RN_F64.accumulate(acc, part, n)
