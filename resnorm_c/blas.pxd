# Row-major matrix products through scipy's BLAS (scipy.linalg.cython_blas), without the GIL.
#
# BLAS is column-major.  A row-major (m, n) matrix with row stride ld is, read column-major,
# its transpose with the same leading dimension.  So the row-major product
#     C = op(A) @ op(B)            (C: m x n, op(A): m x k, op(B): k x n)
# is the column-major product C^T = op(B)^T @ op(A)^T, i.e. the same gemm call with the
# operands swapped and m, n swapped, and each operand keeping its own transpose flag.
from cython cimport floating
from scipy.linalg.cython_blas cimport sgemm, dgemm

cdef extern from "blas_timer.h" nogil:
    double rn_blas_clock()
    void rn_blas_charge(double t0)


cdef inline void gemm(bint trans_a, bint trans_b, int m, int n, int k, floating alpha,
                      const floating *a, int lda, const floating *b, int ldb, floating beta,
                      floating *c, int ldc) noexcept nogil:
    """Row-major C (m, n) := alpha * op(A) @ op(B) + beta * C.

    op(X) is X or X^T; lda, ldb, ldc are the row strides (in elements) of the arrays as stored.
    With k == 0 the product is empty and C := beta * C is left to the caller (never needed here).
    """
    cdef char ta = b'T' if trans_a else b'N'
    cdef char tb = b'T' if trans_b else b'N'
    if m == 0 or n == 0 or k == 0:
        return
    cdef double t0 = rn_blas_clock()
    if floating is float:
        sgemm(&tb, &ta, &n, &m, &k, &alpha, <float *>b, &ldb, <float *>a, &lda, &beta, c, &ldc)
    else:
        dgemm(&tb, &ta, &n, &m, &k, &alpha, <double *>b, &ldb, <double *>a, &lda, &beta, c, &ldc)
    rn_blas_charge(t0)
