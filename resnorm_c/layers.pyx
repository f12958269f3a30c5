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
import numpy as np

from cython.parallel cimport prange, threadid
from libc.math cimport sqrt
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from blas cimport gemm
from dropout_masks cimport rn_dropout
from primitives cimport (real as element, rn_import_core, rn_dropout_bits, rn_exp_shifted, rn_gelu,
                         rn_gelu_backward, rn_gelu_tanh, rn_gelu_tanh_backward,
                         rn_residual_add)

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
# (batch, head): its T x T scores stay in cache between the products.
#
# Causal heads skip the masked half.  The queries are taken in blocks of `block` rows:
# block [i0, i1) sees keys 0 .. i1 only, so its scores, its P @ v and its dP and dq are
# products over i1 keys instead of T.  dv and dk, sums over the queries i >= j that see key
# j, are taken in the same blocks of keys: block [j0, j1) sums over queries j0 .. T.  The
# products shrink to about (1 + block/T) / 2 of the full ones.  block = T is the full
# computation (what a non-causal head does).  Blocks depend on T alone: the same bits for
# any thread count.
#
# Dropout on the probabilities (rn_dropout on): element (b, h, i, j) of the (B, H, T, T)
# probabilities is kept by the Philox uniform of its flat index, exactly the mask
# resnorm.dropout gives an array of that shape and seed.  att keeps P itself (softmax
# backward needs it); the dropped rows of a block go to a scratch row block, and backward
# regenerates the mask of each row once, for dP and for the dropped P that dv needs.

cdef inline Py_ssize_t _row_bits(uint64_t *words, uint64_t start, Py_ssize_t n,
                                 const rn_dropout *dp) noexcept nogil:
    """words := the keep bits of flat elements start .. start + n - 1, the first at bit
    start % 64 of words[0] (returned: the kpos of rn_residual_add)."""
    cdef uint64_t g0 = start // 64
    rn_dropout_bits(words, dp.seed, g0, <Py_ssize_t>((start + <uint64_t>n + 63) // 64 - g0),
              dp.threshold)
    return <Py_ssize_t>(start % 64)


cdef inline void _drop(element *y, const element *x, const uint64_t *words, Py_ssize_t kpos,
                       Py_ssize_t n, const rn_dropout *dp) noexcept nogil:
    """y[:n] := x[:n] * m, m = scale where the bit (from kpos on) is set, else 0.  y may be x."""
    rn_residual_add(y, NULL, x, NULL, <const uint8_t *>words, kpos, dp.scale, n, 0, 0)


cdef inline int _block_end(int i0, int t, int block, bint causal) noexcept nogil:
    """End of the block of query rows (or key columns) starting at i0."""
    return min(i0 + block, t) if causal else t


cdef void _attention_forward_head(element *out, element *att, element *dropped,
                                  uint64_t *words, const element *qkv, int t, int d, int dh,
                                  bint causal, int block, element scale,
                                  const rn_dropout *dp, uint64_t first) noexcept nogil:
    """One (batch, head): att := softmax(q k^T * scale) (causal mask), out := dropout(att) @ v.
    Pointers are offset to this batch and head; rows of qkv have stride 3d, of out d.
    dp NULL: no dropout; else `dropped` (block x t) receives a row block's dropped
    probabilities and `first` is the flat index of att[0, 0]."""
    cdef int i, i0 = 0, i1, n
    cdef const element *p
    while i0 < t:
        i1 = _block_end(i0, t, block, causal)
        n = i1 if causal else t            # the keys this row block sees
        gemm(False, True, i1 - i0, n, dh, <element>1, qkv + i0 * 3 * d, 3 * d, qkv + d,
             3 * d, <element>0, att + i0 * t, t)
        for i in range(i0, i1):
            _softmax_row(att + i * t, att + i * t, i + 1 if causal else t, t, scale)
            if dp != NULL:
                _drop(dropped + (i - i0) * t, att + i * t, words,
                      _row_bits(words, first + <uint64_t>i * t, n, dp), n, dp)
        p = att + i0 * t if dp == NULL else dropped
        gemm(False, False, i1 - i0, dh, n, <element>1, p, t, qkv + 2 * d, 3 * d,
             <element>0, out + i0 * d, d)
        i0 = i1


cdef object _thread_scratch(Py_ssize_t n_threads, Py_ssize_t width, object dtype):
    """One row of `width` elements per thread (at least one element)."""
    return np.empty((max(1, n_threads), max(1, width)), dtype)


cdef bint _dropout_on(object dropout, rn_dropout *dp) except -1:
    """Fills dp from the dropout argument (None or an rn_dropout dict); True if it drops."""
    if dropout is None:
        return False
    dp[0] = dropout
    return dp.on


cdef inline int _block_rows(int block, int t) noexcept nogil:
    """The row block in use: block, or the whole head for block <= 0 or > t (and for every
    non-causal head, which the callers pass as block 0)."""
    return t if block <= 0 or block > t else block


def attention_forward(element[:, :, ::1] out, element[:, :, :, ::1] att,
                      const element[:, :, ::1] qkv, bint causal, int n_threads,
                      bint parallel_gemm, int block=0, dropout=None):
    """For each batch b and head h:  att[b, h] := softmax(q k^T / sqrt(dh)) (causal: mask
    j > i), out[b, :, h*dh:(h+1)*dh] := dropout(att[b, h]) @ v.

    out (B, T, D); att (B, H, T, T) keeps the probabilities P (before dropout) for backward.
    block: query rows per block of a causal head (<= 0: T, the full products; see above).
    dropout: None or the rn_dropout dict {on, seed, threshold, scale} of resnorm's dropout
    (the mask of element (b, h, i, j) is that of flat index ((b H + h) T + i) T + j).
    Backward: attention_backward.  NumPy reference: resnorm.nn.reference.attention_forward.
    """
    cdef int nb = <int>qkv.shape[0], t = <int>qkv.shape[1], d = <int>out.shape[2]
    cdef int nh = <int>att.shape[1], dh = d // nh, task, b, h, tid
    cdef element scale = <element>(1.0 / sqrt(dh))
    cdef rn_dropout dp
    cdef const rn_dropout *dpp = NULL
    cdef int threads = n_threads if parallel_gemm else 1
    if nb == 0 or t == 0:
        return
    block = _block_rows(block if causal else 0, t)
    if _dropout_on(dropout, &dp):
        dpp = &dp
    cdef element[:, ::1] dropped = _thread_scratch(
        threads, block * t if dpp != NULL else 1,
        np.float32 if element is float else np.float64)
    cdef uint64_t[:, ::1] words = _thread_scratch(threads, (t + 63) // 64 + 2, np.uint64)
    with nogil:
        for task in prange(nb * nh, schedule="static", num_threads=threads):
            b = task // nh
            h = task % nh
            tid = threadid()
            _attention_forward_head(&out[b, 0, h * dh], &att[b, h, 0, 0], &dropped[tid, 0],
                                    &words[tid, 0], &qkv[b, 0, h * dh], t, d, dh, causal,
                                    block, scale, dpp, <uint64_t>task * t * t)


cdef void _attention_backward_head(element *dqkv, element *ds, element *dropped,
                                   uint64_t *words, const element *dout, const element *qkv,
                                   const element *att, int t, int d, int dh, bint causal,
                                   int block, element scale, const rn_dropout *dp,
                                   uint64_t first) noexcept nogil:
    """One (batch, head) of attention_backward; ds is this head's T x T scratch, dropped a
    T x T scratch for the dropped probabilities (dp not NULL)."""
    cdef int i, i0 = 0, i1, n, j0 = 0, j1
    cdef int ld = 3 * d
    cdef Py_ssize_t kpos
    cdef const element *p = att if dp == NULL else dropped
    # query blocks: dP = dO v^T (times the mask), dS = softmax'(dP), dq = dS k
    while i0 < t:
        i1 = _block_end(i0, t, block, causal)
        n = i1 if causal else t
        gemm(False, True, i1 - i0, n, dh, <element>1, dout + i0 * d, d, qkv + 2 * d, ld,
             <element>0, ds + i0 * t, t)
        for i in range(i0, i1):
            if dp != NULL:
                kpos = _row_bits(words, first + <uint64_t>i * t, n, dp)
                _drop(ds + i * t, ds + i * t, words, kpos, n, dp)
                _drop(dropped + i * t, att + i * t, words, kpos, n, dp)
            _softmax_backward_row(ds + i * t, ds + i * t, att + i * t, i + 1 if causal else t,
                                  t, scale)
        gemm(False, False, i1 - i0, dh, n, <element>1, ds + i0 * t, t, qkv + d, ld,
             <element>0, dqkv + i0 * ld, ld)
        i0 = i1
    # key blocks: dv = dropout(P)^T dO and dk = dS^T q, over the queries j0 .. T that see them
    while j0 < t:
        j1 = _block_end(j0, t, block, causal)
        gemm(True, False, j1 - j0, dh, t - j0, <element>1, p + j0 * t + j0, t, dout + j0 * d,
             d, <element>0, dqkv + 2 * d + j0 * ld, ld)
        gemm(True, False, j1 - j0, dh, t - j0, <element>1, ds + j0 * t + j0, t, qkv + j0 * ld,
             ld, <element>0, dqkv + d + j0 * ld, ld)
        j0 = j1


def attention_backward(element[:, :, ::1] dqkv, element[:, :, :, ::1] datt,
                       const element[:, :, ::1] dout, const element[:, :, ::1] qkv,
                       const element[:, :, :, ::1] att, bint causal, int n_threads,
                       bint parallel_gemm, int block=0, dropout=None):
    """Gradients of attention_forward.  Per (b, h), with P = att[b, h], dO = dout[b, :, head]
    and M the dropout multipliers (1 without dropout):
        dP = (dO v^T) * M,   dv = (P * M)^T dO,
        dS = P * (dP - rowsum(P * dP)) / sqrt(dh)     (softmax backward, scale folded in)
        dq = dS k,           dk = dS^T q.
    dqkv (B, T, 3D) is overwritten; datt (B, H, T, T) is scratch for dP / dS.  block and
    dropout must be the forward's (the mask is regenerated from the seed).
    NumPy reference: resnorm.nn.reference.attention_backward.
    """
    cdef int nb = <int>qkv.shape[0], t = <int>qkv.shape[1], d = <int>dout.shape[2]
    cdef int nh = <int>att.shape[1], dh = d // nh, task, b, h, tid
    cdef element scale = <element>(1.0 / sqrt(dh))
    cdef rn_dropout dp
    cdef const rn_dropout *dpp = NULL
    cdef int threads = n_threads if parallel_gemm else 1
    if nb == 0 or t == 0:
        return
    block = _block_rows(block if causal else 0, t)
    if _dropout_on(dropout, &dp):
        dpp = &dp
    cdef element[:, ::1] dropped = _thread_scratch(
        threads, t * t if dpp != NULL else 1, np.float32 if element is float else np.float64)
    cdef uint64_t[:, ::1] words = _thread_scratch(threads, (t + 63) // 64 + 2, np.uint64)
    with nogil:
        for task in prange(nb * nh, schedule="static", num_threads=threads):
            b = task // nh
            h = task % nh
            tid = threadid()
            _attention_backward_head(&dqkv[b, 0, h * dh], &datt[b, h, 0, 0], &dropped[tid, 0],
                                     &words[tid, 0], &dout[b, 0, h * dh], &qkv[b, 0, h * dh],
                                     &att[b, h, 0, 0], t, d, dh, causal, block, scale, dpp,
                                     <uint64_t>task * t * t)
