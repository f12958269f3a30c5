"""Kernels of the Transformer layers: Linear, GELU, row softmax and multi-head attention,
forward and backward.

Outputs come first, then inputs, then sizes and options.  The kernels do not validate
(resnorm.nn does that).  Matrix products go to scipy's BLAS (sgemm/dgemm, row-major by
swapping operands: resnorm_c/blas.pxd), called without the GIL.

Threads.  A matrix product is cut into tasks that depend on the shapes only: blocks of
about BLOCK rows (and tiles of the weight gradient) for a Linear layer, one (batch, head)
pair for attention.  With
parallel_gemm=True the tasks run in one OpenMP loop, each calling a single-threaded gemm;
the caller must then hold BLAS at one thread (resnorm.nn._blas does): a BLAS that threads
each call itself, entered from several threads at once, runs hundreds of times slower
(measured with scipy's OpenBLAS) -- two thread pools on the same cores fight.  Because the
tasks do not depend on the thread count, results are bitwise identical for any number of
threads.  With parallel_gemm=False each product is one gemm call made from one thread
(BLAS may thread it itself), and the elementwise work runs on OpenMP as usual.

Sums over rows that we do ourselves (the bias gradient) run in a fixed order, per column
block, in float64: bitwise identical for any thread count too.
"""
from cython.parallel cimport prange
from libc.math cimport sqrt
from libc.string cimport memcpy

from blas cimport gemm
from primitives cimport (element, rn_import_core, rn_gelu, rn_gelu_backward, rn_gelu_tanh,
                         rn_gelu_tanh_backward, rn_exp_shifted)

rn_import_core()

cdef extern from "blas_timer.h" nogil:
    int rn_blas_timing
    double rn_blas_seconds

cdef enum:
    # Rows (and columns of the weight gradient) per gemm task.  Every task packs its own
    # copy of the operand it shares with the others: 64-row tasks ran 25% slower than one
    # call on one thread, 256-row tasks 5-8% (benchmarks/bench_blocks.py shapes).
    BLOCK = 256


cdef inline Py_ssize_t n_tasks(Py_ssize_t n, bint parallel_gemm) noexcept nogil:
    """Tasks for n rows: blocks of at most BLOCK rows when parallel, else one task."""
    if not parallel_gemm or n <= BLOCK:
        return 1
    return (n + BLOCK - 1) // BLOCK


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

cdef void _linear_forward_rows(element *out, const element *x, const element *w,
                               const element *b, Py_ssize_t i0, Py_ssize_t i1,
                               Py_ssize_t d_in, Py_ssize_t d_out) noexcept nogil:
    """Rows i0..i1 of out := x @ w^T + b."""
    cdef Py_ssize_t i
    cdef element beta = 0
    if b != NULL:
        # start from the bias and let gemm add the product (beta = 1): BLAS would otherwise
        # spend the same pass zeroing out
        for i in range(i0, i1):
            memcpy(out + i * d_out, b, d_out * sizeof(element))
        beta = 1
    gemm(False, True, <int>(i1 - i0), <int>d_out, <int>d_in, <element>1, x + i0 * d_in,
         <int>d_in, w, <int>d_in, beta, out + i0 * d_out, <int>d_out)


def linear_forward(element[:, ::1] out, const element[:, ::1] x,
                   const element[:, ::1] weight, const element[::1] bias, int n_threads,
                   bint parallel_gemm):
    """out (N, out_f) := x (N, in_f) @ weight^T + bias;  weight is (out_f, in_f), as in torch.

    Backward (linear_backward): dx = dy @ weight, dweight = dy^T @ x, dbias = sum_rows dy.
    NumPy reference: resnorm.nn.reference.linear_forward.  bias may be None.
    parallel_gemm: see the module docstring (BLAS must be single-threaded when True).
    """
    cdef Py_ssize_t n = x.shape[0], d_in = x.shape[1], d_out = weight.shape[0]
    cdef Py_ssize_t t, nt = n_tasks(n, parallel_gemm)
    cdef const element *b = NULL
    if n == 0:
        return
    if bias is not None:
        b = &bias[0]
    with nogil:
        for t in prange(nt, schedule="static", num_threads=n_threads if nt > 1 else 1):
            _linear_forward_rows(&out[0, 0], &x[0, 0], &weight[0, 0], b, t * n // nt,
                                 (t + 1) * n // nt, d_in, d_out)


cdef void _linear_backward_weight(element *dw, element *db, const element *dy,
                                  const element *x, Py_ssize_t j0, Py_ssize_t j1,
                                  Py_ssize_t k0, Py_ssize_t k1, Py_ssize_t n,
                                  Py_ssize_t d_in, Py_ssize_t d_out) noexcept nogil:
    """dweight[j0:j1, k0:k1] += dy[:, j0:j1]^T @ x[:, k0:k1]; with db, also
    dbias[j0:j1] += sum_rows dy[:, j0:j1], rows added in order (a fixed summation order)."""
    cdef Py_ssize_t i, j, m
    cdef double acc[BLOCK]
    gemm(True, False, <int>(j1 - j0), <int>(k1 - k0), <int>n, <element>1, dy + j0,
         <int>d_out, x + k0, <int>d_in, <element>1, dw + j0 * d_in + k0, <int>d_in)
    if db == NULL:
        return
    while j0 < j1:          # BLOCK columns at a time (one task spans all of them when serial)
        m = min(<Py_ssize_t>BLOCK, j1 - j0)
        for j in range(m):
            acc[j] = 0.0
        for i in range(n):
            for j in range(m):
                acc[j] += dy[i * d_out + j0 + j]
        for j in range(m):
            db[j0 + j] += <element>acc[j]
        j0 += m


def linear_backward(element[:, ::1] dx, element[:, ::1] dweight, element[::1] dbias,
                    const element[:, ::1] dy, const element[:, ::1] x,
                    const element[:, ::1] weight, int n_threads, bint parallel_gemm):
    """dx := dy @ weight;  dweight += dy^T @ x;  dbias += sum_rows dy  (gradients accumulate).

    Forward: y = x @ weight^T + bias.  NumPy reference: resnorm.nn.reference.linear_backward.
    dbias may be None (no bias).
    Tasks: row blocks of dx, then tiles (output block, input block) of dweight; the tiles of
    the first input block also sum their slice of dbias over all rows, in order.
    """
    cdef Py_ssize_t n = x.shape[0], d_in = x.shape[1], d_out = weight.shape[0]
    cdef Py_ssize_t t, u, v, nx = n_tasks(n, parallel_gemm)
    cdef Py_ssize_t nu = n_tasks(d_out, parallel_gemm), nv = n_tasks(d_in, parallel_gemm)
    cdef element *db = NULL
    if n == 0:
        return
    if dbias is not None:
        db = &dbias[0]
    with nogil:
        for t in prange(nx + nu * nv, schedule="dynamic", num_threads=n_threads
                        if nx + nu * nv > 1 else 1):
            if t < nx:
                gemm(False, False, <int>((t + 1) * n // nx - t * n // nx), <int>d_in,
                     <int>d_out, <element>1, &dy[0, 0] + (t * n // nx) * d_out, <int>d_out,
                     &weight[0, 0], <int>d_in, <element>0, &dx[0, 0] + (t * n // nx) * d_in,
                     <int>d_in)
            else:
                u = (t - nx) // nv
                v = (t - nx) % nv
                _linear_backward_weight(&dweight[0, 0], db if v == 0 else NULL, &dy[0, 0],
                                        &x[0, 0], u * d_out // nu, (u + 1) * d_out // nu,
                                        v * d_in // nv, (v + 1) * d_in // nv, n, d_in, d_out)


# --------------------------------------------------------------------------- GELU

cdef enum:
    CHUNK = 4096  # elements per task of the elementwise loops


def gelu_forward(element[::1] out, const element[::1] x, bint approximate, int n_threads):
    """out := x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))            (exact, torch default)
    or      0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))      (approximate="tanh").

    Elementwise over flat arrays (resnorm_c/core/vmath.h); out may be x.
    NumPy reference: resnorm.nn.reference.gelu.
    """
    cdef Py_ssize_t c, lo, n = x.shape[0]
    with nogil:
        for c in prange((n + CHUNK - 1) // CHUNK, schedule="static", num_threads=n_threads):
            lo = c * CHUNK
            if approximate:
                rn_gelu_tanh(&out[lo], &x[lo], min(<Py_ssize_t>CHUNK, n - lo))
            else:
                rn_gelu(&out[lo], &x[lo], min(<Py_ssize_t>CHUNK, n - lo))


def gelu_backward(element[::1] dx, const element[::1] dy, const element[::1] x,
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
            if approximate:
                rn_gelu_tanh_backward(&dx[lo], &dy[lo], &x[lo], min(<Py_ssize_t>CHUNK, n - lo))
            else:
                rn_gelu_backward(&dx[lo], &dy[lo], &x[lo], min(<Py_ssize_t>CHUNK, n - lo))


# --------------------------------------------------------------------------- softmax

cdef inline void _softmax_row(element *p, const element *s, Py_ssize_t n_valid,
                              Py_ssize_t n, element scale) noexcept nogil:
    """p[:n_valid] := softmax(scale * s[:n_valid]);  p[n_valid:n] := 0 (masked positions).

    Stable: the row maximum is subtracted before exp, so no exp overflows; the sum is in
    double.  p may be s.
    """
    cdef Py_ssize_t j
    cdef element m = s[0], e
    cdef double total = 0.0
    for j in range(1, n_valid):
        if s[j] > m:
            m = s[j]
    rn_exp_shifted(p, s, m, scale, n_valid)
    for j in range(n_valid):
        total += p[j]
    e = <element>(1.0 / total)
    for j in range(n_valid):
        p[j] = p[j] * e
    for j in range(n_valid, n):
        p[j] = 0


cdef inline void _softmax_backward_row(element *ds, const element *dp, const element *p,
                                       Py_ssize_t n_valid, Py_ssize_t n,
                                       element scale) noexcept nogil:
    """ds := scale * p * (dp - sum_j p_j dp_j), the gradient of s for p = softmax(scale * s).

    Masked positions (p = 0) get 0.  ds may be dp.
    """
    cdef Py_ssize_t j
    cdef double dot = 0.0
    cdef element c
    for j in range(n_valid):
        dot += p[j] * dp[j]
    c = <element>dot
    for j in range(n_valid):
        ds[j] = scale * p[j] * (dp[j] - c)
    for j in range(n_valid, n):
        ds[j] = 0


def softmax_forward(element[:, ::1] out, const element[:, ::1] s, double scale, bint causal,
                    int n_threads):
    """out[r] := softmax(scale * s[r]) for each row r.  causal: row r sees only columns
    j <= r % T (T = row length, rows taken as (..., T, T) matrices); the rest get 0.

    Backward (softmax_backward): ds = scale * p * (dp - sum(p * dp)).  out may be s.
    NumPy reference: resnorm.nn.reference.softmax.
    """
    cdef Py_ssize_t r, n = s.shape[0], t = s.shape[1]
    with nogil:
        for r in prange(n, schedule="static", num_threads=n_threads):
            _softmax_row(&out[r, 0], &s[r, 0], r % t + 1 if causal else t, t, <element>scale)


def softmax_backward(element[:, ::1] ds, const element[:, ::1] dp, const element[:, ::1] p,
                     double scale, bint causal, int n_threads):
    """ds[r] := scale * p[r] * (dp[r] - sum_j p[r, j] dp[r, j]).  ds may be dp.

    NumPy reference: resnorm.nn.reference.softmax_backward.
    """
    cdef Py_ssize_t r, n = p.shape[0], t = p.shape[1]
    with nogil:
        for r in prange(n, schedule="static", num_threads=n_threads):
            _softmax_backward_row(&ds[r, 0], &dp[r, 0], &p[r, 0], r % t + 1 if causal else t,
                                  t, <element>scale)


# --------------------------------------------------------------------------- attention
#
# qkv (B, T, 3D) holds q | k | v along the last axis (torch's in_proj layout); head h uses
# columns h*dh .. (h+1)*dh of each, dh = D / H.  The per-head matrices are strided views of
# qkv (row stride 3D), which gemm reads directly: no reshapes, no copies.  One task per
# (batch, head): its T x T scores stay in cache between the two products.

cdef void _attention_forward_head(element *out, element *att, const element *qkv, int t,
                                  int d, int dh, bint causal, element scale) noexcept nogil:
    """One (batch, head): att := softmax(q k^T * scale) (causal mask), out := att @ v.
    Pointers are offset to this batch and head; rows of qkv have stride 3d, of out d."""
    cdef int i
    gemm(False, True, t, t, dh, <element>1, qkv, 3 * d, qkv + d, 3 * d, <element>0, att, t)
    for i in range(t):
        _softmax_row(att + i * t, att + i * t, i + 1 if causal else t, t, scale)
    gemm(False, False, t, dh, t, <element>1, att, t, qkv + 2 * d, 3 * d, <element>0, out, d)


def attention_forward(element[:, :, ::1] out, element[:, :, :, ::1] att,
                      const element[:, :, ::1] qkv, bint causal, int n_threads,
                      bint parallel_gemm):
    """For each batch b and head h:  att[b, h] := softmax(q k^T / sqrt(dh)) (causal: mask
    j > i), out[b, :, h*dh:(h+1)*dh] := att[b, h] @ v.

    out (B, T, D); att (B, H, T, T) keeps the probabilities for backward.
    Backward: attention_backward.  NumPy reference: resnorm.nn.reference.attention_forward.
    """
    cdef int nb = <int>qkv.shape[0], t = <int>qkv.shape[1], d = <int>out.shape[2]
    cdef int nh = <int>att.shape[1], dh = d // nh, task, b, h
    cdef element scale = <element>(1.0 / sqrt(dh))
    if nb == 0 or t == 0:
        return
    with nogil:
        for task in prange(nb * nh, schedule="static",
                           num_threads=n_threads if parallel_gemm else 1):
            b = task // nh
            h = task % nh
            _attention_forward_head(&out[b, 0, h * dh], &att[b, h, 0, 0], &qkv[b, 0, h * dh],
                                    t, d, dh, causal, scale)


cdef void _attention_backward_head(element *dqkv, element *ds, const element *dout,
                                   const element *qkv, const element *att, int t, int d,
                                   int dh, bint causal, element scale) noexcept nogil:
    """One (batch, head) of attention_backward; ds is this head's T x T scratch."""
    cdef int i
    cdef int ld = 3 * d
    gemm(False, True, t, t, dh, <element>1, dout, d, qkv + 2 * d, ld, <element>0, ds, t)
    gemm(True, False, t, dh, t, <element>1, att, t, dout, d, <element>0, dqkv + 2 * d, ld)
    for i in range(t):
        _softmax_backward_row(ds + i * t, ds + i * t, att + i * t, i + 1 if causal else t, t,
                              scale)
    gemm(False, False, t, dh, t, <element>1, ds, t, qkv + d, ld, <element>0, dqkv, ld)
    gemm(True, False, t, dh, t, <element>1, ds, t, qkv, ld, <element>0, dqkv + d, ld)


def attention_backward(element[:, :, ::1] dqkv, element[:, :, :, ::1] datt,
                       const element[:, :, ::1] dout, const element[:, :, ::1] qkv,
                       const element[:, :, :, ::1] att, bint causal, int n_threads,
                       bint parallel_gemm):
    """Gradients of attention_forward.  Per (b, h), with P = att[b, h], dO = dout[b, :, head]:
        dP = dO v^T,   dv = P^T dO,
        dS = P * (dP - rowsum(P * dP)) / sqrt(dh)     (softmax backward, scale folded in)
        dq = dS k,     dk = dS^T q.
    dqkv (B, T, 3D) is overwritten; datt (B, H, T, T) is scratch for dP / dS.
    NumPy reference: resnorm.nn.reference.attention_backward.
    """
    cdef int nb = <int>qkv.shape[0], t = <int>qkv.shape[1], d = <int>dout.shape[2]
    cdef int nh = <int>att.shape[1], dh = d // nh, task, b, h
    cdef element scale = <element>(1.0 / sqrt(dh))
    if nb == 0 or t == 0:
        return
    with nogil:
        for task in prange(nb * nh, schedule="static",
                           num_threads=n_threads if parallel_gemm else 1):
            b = task // nh
            h = task % nh
            _attention_backward_head(&dqkv[b, 0, h * dh], &datt[b, h, 0, 0],
                                     &dout[b, 0, h * dh], &qkv[b, 0, h * dh],
                                     &att[b, h, 0, 0], t, d, dh, causal, scale)
