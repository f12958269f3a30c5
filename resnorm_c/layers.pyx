"""Kernels of the Transformer layers: Linear, GELU, row softmax and multi-head attention,
forward and backward.

Outputs come first, then inputs, then sizes and options.  The kernels do not validate
(resnorm.nn does that).  Matrix products go to scipy's BLAS (sgemm/dgemm, row-major by
swapping operands: resnorm_c/blas.pxd), called without the GIL; BLAS threads them itself.
Everything else (bias, GELU, softmax) runs as OpenMP loops over rows or elements.

Sums over rows that we do ourselves (the bias gradient) go through fixed-shape partial sums,
as in norms.pyx: row blocks chosen by N only, one float64 partial row per block, added in
block order, so they are bitwise identical for any thread count.
"""
import numpy as np

from cython.parallel cimport prange
from libc.math cimport sqrt
from libc.string cimport memcpy, memset

from blas cimport gemm
from common cimport floating

from resnorm._norms import n_row_blocks

cdef extern from "blas_timer.h" nogil:
    int rn_blas_timing
    double rn_blas_seconds


# --------------------------------------------------------------------------- BLAS timer

def blas_timer(bint enabled):
    """Start (True) or stop (False) adding up the wall time spent inside gemm calls."""
    global rn_blas_timing
    rn_blas_timing = enabled


def blas_seconds(bint reset=False):
    """Seconds spent inside gemm since the last reset (while the timer was on)."""
    global rn_blas_seconds
    cdef double s = rn_blas_seconds
    if reset:
        rn_blas_seconds = 0.0
    return s


# --------------------------------------------------------------------------- Linear

def linear_forward(floating[:, ::1] out, const floating[:, ::1] x,
                   const floating[:, ::1] weight, const floating[::1] bias, int n_threads):
    """out (N, out_f) := x (N, in_f) @ weight^T + bias;  weight is (out_f, in_f), as in torch.

    Backward (linear_backward): dx = dy @ weight, dweight = dy^T @ x, dbias = sum_rows dy.
    NumPy reference: resnorm.nn.reference.linear_forward.  bias may be None.
    """
    cdef Py_ssize_t i, n = x.shape[0], d_in = x.shape[1], d_out = weight.shape[0]
    cdef floating beta = 0
    if bias is not None:
        # Start from the bias and let gemm add the product (beta = 1): BLAS would otherwise
        # spend the same pass zeroing out.
        beta = 1
        with nogil:
            for i in prange(n, schedule="static", num_threads=n_threads):
                memcpy(&out[i, 0], &bias[0], d_out * sizeof(floating))
    with nogil:
        gemm(False, True, <int>n, <int>d_out, <int>d_in, <floating>1, &x[0, 0], <int>d_in,
             &weight[0, 0], <int>d_in, beta, &out[0, 0], <int>d_out)


def linear_backward(floating[:, ::1] dx, floating[:, ::1] dweight, floating[::1] dbias,
                    const floating[:, ::1] dy, const floating[:, ::1] x,
                    const floating[:, ::1] weight, int n_threads):
    """dx := dy @ weight;  dweight += dy^T @ x;  dbias += sum_rows dy  (gradients accumulate).

    Forward: y = x @ weight^T + bias.  NumPy reference: resnorm.nn.reference.linear_backward.
    dx may be None (input gradient not wanted); dbias may be None (no bias).
    """
    cdef Py_ssize_t n = x.shape[0], d_in = x.shape[1], d_out = weight.shape[0]
    with nogil:
        if dx is not None:
            gemm(False, False, <int>n, <int>d_in, <int>d_out, <floating>1, &dy[0, 0],
                 <int>d_out, &weight[0, 0], <int>d_in, <floating>0, &dx[0, 0], <int>d_in)
        gemm(True, False, <int>d_out, <int>d_in, <int>n, <floating>1, &dy[0, 0], <int>d_out,
             &x[0, 0], <int>d_in, <floating>1, &dweight[0, 0], <int>d_in)
    if dbias is not None:
        add_column_sums(dbias, dy, n_threads)


def add_column_sums(floating[::1] out, const floating[:, ::1] a, int n_threads):
    """out[j] += sum_i a[i, j], through float64 partial sums of fixed row blocks."""
    cdef Py_ssize_t n = a.shape[0], d = a.shape[1]
    cdef Py_ssize_t nb = n_row_blocks(n), b, i, j
    cdef double[:, ::1] part = np.zeros((nb, d))
    cdef double *p
    cdef double s
    with nogil:
        for b in prange(nb, schedule="static", num_threads=n_threads):
            p = &part[b, 0]
            for i in range(b * n // nb, (b + 1) * n // nb):
                for j in range(d):
                    p[j] += a[i, j]
        for j in range(d):
            s = 0.0
            for b in range(nb):          # block order: the same sum for any thread count
                s += part[b, j]
            out[j] += <floating>s


# --------------------------------------------------------------------------- GELU

cdef extern from "vmath.h" nogil:
    void rn_gelu_f32(float *y, const float *x, Py_ssize_t n)
    void rn_gelu_f64(double *y, const double *x, Py_ssize_t n)
    void rn_gelu_backward_f32(float *dx, const float *dy, const float *x, Py_ssize_t n)
    void rn_gelu_backward_f64(double *dx, const double *dy, const double *x, Py_ssize_t n)
    void rn_gelu_tanh_f32(float *y, const float *x, Py_ssize_t n)
    void rn_gelu_tanh_f64(double *y, const double *x, Py_ssize_t n)
    void rn_gelu_tanh_backward_f32(float *dx, const float *dy, const float *x, Py_ssize_t n)
    void rn_gelu_tanh_backward_f64(double *dx, const double *dy, const double *x,
                                   Py_ssize_t n)
    void rn_exp_shifted_f32(float *p, const float *s, float m, float scale, Py_ssize_t n)
    void rn_exp_shifted_f64(double *p, const double *s, double m, double scale, Py_ssize_t n)

cdef enum:
    CHUNK = 4096  # elements per task of the elementwise loops


cdef inline void _gelu(floating *y, const floating *x, Py_ssize_t n,
                       bint approximate) noexcept nogil:
    if floating is float:
        if approximate:
            rn_gelu_tanh_f32(y, x, n)
        else:
            rn_gelu_f32(y, x, n)
    else:
        if approximate:
            rn_gelu_tanh_f64(y, x, n)
        else:
            rn_gelu_f64(y, x, n)


cdef inline void _gelu_backward(floating *dx, const floating *dy, const floating *x,
                                Py_ssize_t n, bint approximate) noexcept nogil:
    if floating is float:
        if approximate:
            rn_gelu_tanh_backward_f32(dx, dy, x, n)
        else:
            rn_gelu_backward_f32(dx, dy, x, n)
    else:
        if approximate:
            rn_gelu_tanh_backward_f64(dx, dy, x, n)
        else:
            rn_gelu_backward_f64(dx, dy, x, n)


def gelu_forward(floating[::1] out, const floating[::1] x, bint approximate, int n_threads):
    """out := x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))            (exact, torch default)
    or      0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))      (approximate="tanh").

    Elementwise over flat arrays (resnorm_c/vmath.h); out may be x.
    NumPy reference: resnorm.nn.reference.gelu.
    """
    cdef Py_ssize_t c, lo, n = x.shape[0]
    with nogil:
        for c in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=n_threads):
            lo = c * CHUNK
            _gelu(&out[lo], &x[lo], min(<Py_ssize_t>CHUNK, n - lo), approximate)


def gelu_backward(floating[::1] dx, const floating[::1] dy, const floating[::1] x,
                  bint approximate, int n_threads):
    """dx := dy * gelu'(x).   Exact: gelu'(x) = Phi(x) + x * phi(x), phi(x) = exp(-x^2/2)/sqrt(2 pi).
    tanh form, s = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3):
    gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2).

    dx may be dy (in place).  NumPy reference: resnorm.nn.reference.gelu_backward.
    """
    cdef Py_ssize_t c, lo, n = x.shape[0]
    with nogil:
        for c in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=n_threads):
            lo = c * CHUNK
            _gelu_backward(&dx[lo], &dy[lo], &x[lo], min(<Py_ssize_t>CHUNK, n - lo),
                           approximate)


# --------------------------------------------------------------------------- softmax

cdef inline void _softmax_row(floating *p, const floating *s, Py_ssize_t n_valid,
                              Py_ssize_t n, floating scale) noexcept nogil:
    """p[:n_valid] := softmax(scale * s[:n_valid]);  p[n_valid:n] := 0 (masked positions).

    Stable: the row maximum is subtracted before exp, so no exp overflows; the sum is in
    double.  p may be s.
    """
    cdef Py_ssize_t j
    cdef floating m = s[0], e
    cdef double total = 0.0
    for j in range(1, n_valid):
        if s[j] > m:
            m = s[j]
    if floating is float:
        rn_exp_shifted_f32(p, s, m, scale, n_valid)
    else:
        rn_exp_shifted_f64(p, s, m, scale, n_valid)
    for j in range(n_valid):
        total += p[j]
    e = <floating>(1.0 / total)
    for j in range(n_valid):
        p[j] = p[j] * e
    for j in range(n_valid, n):
        p[j] = 0


cdef inline void _softmax_backward_row(floating *ds, const floating *dp, const floating *p,
                                       Py_ssize_t n_valid, Py_ssize_t n,
                                       floating scale) noexcept nogil:
    """ds := scale * p * (dp - sum_j p_j dp_j), the gradient of s for p = softmax(scale * s).

    Masked positions (p = 0) get 0.  ds may be dp.
    """
    cdef Py_ssize_t j
    cdef double dot = 0.0
    cdef floating c
    for j in range(n_valid):
        dot += p[j] * dp[j]
    c = <floating>dot
    for j in range(n_valid):
        ds[j] = scale * p[j] * (dp[j] - c)
    for j in range(n_valid, n):
        ds[j] = 0


def softmax_forward(floating[:, ::1] out, const floating[:, ::1] s, double scale, bint causal,
                    int n_threads):
    """out[r] := softmax(scale * s[r]) for each row r.  causal: row r sees only columns
    j <= r % T (T = row length, rows taken as (..., T, T) matrices); the rest get 0.

    Backward (softmax_backward): ds = scale * p * (dp - sum(p * dp)).  out may be s.
    NumPy reference: resnorm.nn.reference.softmax.
    """
    cdef Py_ssize_t r, n = s.shape[0], t = s.shape[1]
    with nogil:
        for r in prange(n, schedule="static", num_threads=n_threads):
            _softmax_row(&out[r, 0], &s[r, 0], r % t + 1 if causal else t, t, <floating>scale)


def softmax_backward(floating[:, ::1] ds, const floating[:, ::1] dp, const floating[:, ::1] p,
                     double scale, bint causal, int n_threads):
    """ds[r] := scale * p[r] * (dp[r] - sum_j p[r, j] dp[r, j]).  ds may be dp.

    NumPy reference: resnorm.nn.reference.softmax_backward.
    """
    cdef Py_ssize_t r, n = p.shape[0], t = p.shape[1]
    with nogil:
        for r in prange(n, schedule="static", num_threads=n_threads):
            _softmax_backward_row(&ds[r, 0], &dp[r, 0], &p[r, 0], r % t + 1 if causal else t,
                                  t, <floating>scale)


# --------------------------------------------------------------------------- attention
#
# qkv (B, T, 3D) holds q | k | v along the last axis (torch's in_proj layout); head h uses
# columns h*dh .. (h+1)*dh of each, dh = D / H.  The per-head matrices are strided views of
# qkv (row stride 3D), which gemm reads directly: no reshapes, no copies.

def attention_forward(floating[:, :, ::1] out, floating[:, :, :, ::1] att,
                      const floating[:, :, ::1] qkv, bint causal, int n_threads):
    """For each batch b and head h:  att[b, h] := softmax(q k^T / sqrt(dh)) (causal: mask
    j > i), out[b, :, h*dh:(h+1)*dh] := att[b, h] @ v.

    out (B, T, D); att (B, H, T, T) keeps the probabilities for backward.
    Backward: attention_backward.  NumPy reference: resnorm.nn.reference.attention_forward.
    """
    cdef int nb = <int>qkv.shape[0], t = <int>qkv.shape[1], d = <int>out.shape[2]
    cdef int nh = <int>att.shape[1], dh = d // nh, ld = 3 * d
    cdef int b, h
    cdef Py_ssize_t r
    cdef floating scale = <floating>(1.0 / sqrt(dh))
    cdef floating *rows
    if nb == 0 or t == 0:
        return
    rows = &att[0, 0, 0, 0]
    with nogil:
        for b in range(nb):
            for h in range(nh):
                # raw scores q k^T (the scale is applied inside the softmax)
                gemm(False, True, t, t, dh, <floating>1, &qkv[b, 0, h * dh], ld,
                     &qkv[b, 0, d + h * dh], ld, <floating>0, &att[b, h, 0, 0], t)
        for r in prange(nb * nh * t, schedule="static", num_threads=n_threads):
            _softmax_row(rows + r * t, rows + r * t, r % t + 1 if causal else t, t, scale)
        for b in range(nb):
            for h in range(nh):
                gemm(False, False, t, dh, t, <floating>1, &att[b, h, 0, 0], t,
                     &qkv[b, 0, 2 * d + h * dh], ld, <floating>0, &out[b, 0, h * dh], d)


def attention_backward(floating[:, :, ::1] dqkv, floating[:, :, :, ::1] datt,
                       const floating[:, :, ::1] dout, const floating[:, :, ::1] qkv,
                       const floating[:, :, :, ::1] att, bint causal, int n_threads):
    """Gradients of attention_forward.  Per (b, h), with P = att[b, h], dO = dout[b, :, head]:
        dP = dO v^T,   dv = P^T dO,
        dS = P * (dP - rowsum(P * dP)) / sqrt(dh)     (softmax backward, scale folded in)
        dq = dS k,     dk = dS^T q.
    dqkv (B, T, 3D) is overwritten; datt (B, H, T, T) is scratch for dP / dS.
    NumPy reference: resnorm.nn.reference.attention_backward.
    """
    cdef int nb = <int>qkv.shape[0], t = <int>qkv.shape[1], d = <int>dout.shape[2]
    cdef int nh = <int>att.shape[1], dh = d // nh, ld = 3 * d
    cdef int b, h
    cdef Py_ssize_t r
    cdef floating scale = <floating>(1.0 / sqrt(dh))
    cdef floating *drows
    cdef const floating *prows
    if nb == 0 or t == 0:
        return
    drows = &datt[0, 0, 0, 0]
    prows = &att[0, 0, 0, 0]
    with nogil:
        for b in range(nb):
            for h in range(nh):
                gemm(False, True, t, t, dh, <floating>1, &dout[b, 0, h * dh], d,
                     &qkv[b, 0, 2 * d + h * dh], ld, <floating>0, &datt[b, h, 0, 0], t)
                gemm(True, False, t, dh, t, <floating>1, &att[b, h, 0, 0], t,
                     &dout[b, 0, h * dh], d, <floating>0, &dqkv[b, 0, 2 * d + h * dh], ld)
        for r in prange(nb * nh * t, schedule="static", num_threads=n_threads):
            _softmax_backward_row(drows + r * t, drows + r * t, prows + r * t,
                                  r % t + 1 if causal else t, t, scale)
        for b in range(nb):
            for h in range(nh):
                gemm(False, False, t, dh, t, <floating>1, &datt[b, h, 0, 0], t,
                     &qkv[b, 0, d + h * dh], ld, <floating>0, &dqkv[b, 0, h * dh], ld)
                gemm(True, False, t, dh, t, <floating>1, &datt[b, h, 0, 0], t,
                     &qkv[b, 0, h * dh], ld, <floating>0, &dqkv[b, 0, d + h * dh], ld)
