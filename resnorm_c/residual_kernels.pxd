# Elementwise residual kernels: inverted dropout, scaled residual (fixed, learnable scalar,
# LayerScale) and gated residual, forward and backward, over N rows of D contiguous
# elements (dropout: over the flat array).  Outputs first, then inputs, then sizes; scratch
# is the caller's.  Every result but the dalpha partial sums is computed element by element
# or row by row, so no result depends on the thread count.
from cython.parallel cimport prange, threadid
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memset

from common cimport RN_STREAM_UNFENCED, first_row, rn_sfence, row_blocks, sum_partials
from dropout_masks cimport SEGMENT, extend_bits, mask_words, rn_dropout
from primitives cimport (element, real, rn_dropout_keep, rn_gated_add, rn_gated_bwd, rn_residual_add,
                        rn_residual_bwd, rn_sigmoid)

cdef enum:
    DROPOUT_CHUNK = 8192  # elements per task of the flat dropout kernels


# --------------------------------------------------------------------------- dropout

cdef inline void dropout_chunk(element *y, const element *x, const rn_dropout *dp,
                               uint64_t *words, Py_ssize_t lo, Py_ssize_t hi,
                               int stream) noexcept nogil:
    """Elements lo .. hi of dropout_apply, slice by slice (slices start on a group), so that
    Philox and memory traffic interleave finely; words: mask_words(SEGMENT) of scratch.  A
    slice prefetches the span one slice ahead, when it lies within lo .. hi."""
    cdef Py_ssize_t k = lo, length
    while k < hi:
        length = min(<Py_ssize_t>SEGMENT, hi - k)
        extend_bits(words, dp, k // 64, k // 64, k + length)
        rn_residual_add(y + k, NULL, x + k, NULL, <uint8_t *>words, 0, dp.scale, length, stream,
                        k + 2 * length <= hi)
        k = k + length


cdef inline void dropout_apply(element *y, const element *x, const rn_dropout *dp,
                               uint64_t *masks, Py_ssize_t n, int n_threads,
                               bint stream) noexcept nogil:
    """y := x * m,  m_k = scale if uniform(seed, k) >= threshold else 0  (flat index k < n).

    Backward is the same call on dy (dx = dy * m, the mask regenerated from the seed).
    masks: mask_words(SEGMENT) words of scratch per thread.  y may be x.
    NumPy reference: resnorm.reference.dropout_forward.
    """
    cdef Py_ssize_t n_chunks = (n + DROPOUT_CHUNK - 1) // DROPOUT_CHUNK, c
    cdef Py_ssize_t nw = mask_words(SEGMENT)
    cdef int unfenced = RN_STREAM_UNFENCED if stream else 0
    if n_threads == 1:
        dropout_chunk(y, x, dp, masks, 0, n, unfenced)
    else:
        for c in prange(n_chunks, schedule="static", num_threads=n_threads):
            dropout_chunk(y, x, dp, masks + threadid() * nw, c * DROPOUT_CHUNK,
                          min(n, (c + 1) * DROPOUT_CHUNK), unfenced)
            if stream:
                rn_sfence()
    if stream:
        rn_sfence()


cdef inline void dropout_mask(uint8_t *keep, const rn_dropout *dp, Py_ssize_t n,
                              int n_threads) noexcept nogil:
    """keep[k] := uniform(seed, k) >= threshold: the keep-mask dropout applies (bool bytes)."""
    cdef Py_ssize_t n_chunks = (n + DROPOUT_CHUNK - 1) // DROPOUT_CHUNK, c, k0
    for c in prange(n_chunks, schedule="static", num_threads=n_threads):
        k0 = c * DROPOUT_CHUNK
        rn_dropout_keep(keep + k0, dp.seed, k0, min(<Py_ssize_t>DROPOUT_CHUNK, n - k0),
                        dp.threshold)


# --------------------------------------------------------------------------- scaled residual

cdef inline void scaled_forward(element *h, const element *x, const element *F,
                                         const element *alpha, Py_ssize_t n, Py_ssize_t d,
                                         int n_threads, bint stream) noexcept nogil:
    """h := x + alpha * F  (alpha (D,), or NULL: 1).  The gated residual with a per-channel
    gate is this kernel with alpha = sigmoid(g).  h may be x or F.
    NumPy reference: resnorm.reference.scaled_residual_forward."""
    cdef Py_ssize_t t
    if n_threads == 1:
        scaled_forward_rows(h, x, F, alpha, 0, n, n, d, stream)
    else:
        for t in prange(n_threads, schedule="static", num_threads=n_threads):
            scaled_forward_rows(h, x, F, alpha, first_row(t, n, n_threads),
                                first_row(t + 1, n, n_threads), n, d, stream)


cdef inline void scaled_forward_rows(element *h, const element *x, const element *F,
                                     const element *alpha, Py_ssize_t lo, Py_ssize_t hi,
                                     Py_ssize_t n, Py_ssize_t d, bint stream) noexcept nogil:
    """Rows lo .. hi (of n) of scaled_forward on one thread.  Streamed rows are fenced once,
    after the last: a fence after each row waited for its lines to reach memory, and
    scaled_residual (65536, 256) float32 took 1.75x the time on one thread (its backward
    2.0x, gated_residual_backward 1.2x; (32768, 512) 1.4-1.5x, (16384, 1024) 1.06-1.19x)."""
    cdef Py_ssize_t i
    cdef int s = RN_STREAM_UNFENCED if stream else 0
    for i in range(lo, hi):
        rn_residual_add(h + i * d, x + i * d, F + i * d, alpha, NULL, 0, 1.0, d, s, n - 1 - i)
    if stream:
        rn_sfence()


cdef inline void scaled_backward_block(element *dx, element *dF, double *dalpha_part,
                                                const element *dh, const element *F,
                                                const element *alpha, Py_ssize_t lo,
                                                Py_ssize_t hi, Py_ssize_t d,
                                                bint stream) noexcept nogil:
    """Rows lo .. hi of scaled_backward (dalpha_part NULL: not wanted), fenced once after
    the last, as in scaled_forward_rows."""
    cdef Py_ssize_t i
    cdef int s = RN_STREAM_UNFENCED if stream else 0
    if dalpha_part != NULL:
        memset(dalpha_part, 0, d * sizeof(double))
    for i in range(lo, hi):
        rn_residual_bwd(dF + i * d, dx + i * d, dalpha_part, dh + i * d, NULL,
                        F + i * d if dalpha_part != NULL else NULL, alpha, NULL, 0, 1.0, d,
                        s, hi - 1 - i)
    if stream:
        rn_sfence()


cdef inline void scaled_backward(element *dx, element *dF, double *dalpha,
                                          double *partials, const element *dh,
                                          const element *F, const element *alpha, Py_ssize_t n,
                                          Py_ssize_t d, int n_threads, bint stream) noexcept nogil:
    """dx := dh;  dF := dh * alpha;  dalpha (float64, per channel) := sum_rows dh * F.

    dalpha NULL: not wanted (F may then be NULL); else partials is (row_blocks(n), d)
    scratch.  NumPy reference: resnorm.reference.scaled_residual_backward.
    """
    cdef Py_ssize_t nb = row_blocks(n), blk
    cdef double *part
    if n_threads == 1:
        for blk in range(nb):
            scaled_backward_block(dx, dF, partials + blk * d if dalpha != NULL else NULL,
                                           dh, F, alpha, blk * n // nb, (blk + 1) * n // nb, d,
                                           stream)
    else:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            part = partials + blk * d if dalpha != NULL else NULL
            scaled_backward_block(dx, dF, part, dh, F, alpha, blk * n // nb,
                                           (blk + 1) * n // nb, d, stream)
    if dalpha != NULL:
        sum_partials(dalpha, partials, nb, d, n_threads)


# --------------------------------------------------------------------------- gated residual

cdef inline void sigmoid(real *s, real *ds, const real *g, Py_ssize_t n, Py_ssize_t d,
                         int n_threads) noexcept nogil:
    """s := 1/(1 + exp(-g));  ds := s*(1-s) in the element type (ds may be NULL)."""
    cdef Py_ssize_t i
    for i in prange(n, schedule="static", num_threads=n_threads):
        rn_sigmoid(s + i * d, ds + i * d if ds != NULL else NULL, g + i * d, d)


cdef inline void gated_forward(element *h, const element *x, const element *F,
                               const element *g, Py_ssize_t g_step, Py_ssize_t n,
                               Py_ssize_t d, int n_threads, bint stream) noexcept nogil:
    """h := x + sigmoid(g) * F, the sigmoid formed in registers.  g_step: d for a g of F's
    shape, 0 for a per-channel (D,) g used by every row (the 16-bit types: float and double
    take scaled_forward with s = sigmoid(g) formed once; no prefetch then, g being one
    row).  h may be x, F or g.
    NumPy reference: resnorm.reference.gated_residual_forward."""
    cdef Py_ssize_t t
    if n_threads == 1:
        gated_forward_rows(h, x, F, g, g_step, 0, n, n, d, stream)
    else:
        for t in prange(n_threads, schedule="static", num_threads=n_threads):
            gated_forward_rows(h, x, F, g, g_step, first_row(t, n, n_threads),
                               first_row(t + 1, n, n_threads), n, d, stream)


cdef inline void gated_forward_rows(element *h, const element *x, const element *F,
                                    const element *g, Py_ssize_t g_step, Py_ssize_t lo,
                                    Py_ssize_t hi, Py_ssize_t n, Py_ssize_t d,
                                    bint stream) noexcept nogil:
    """Rows lo .. hi (of n) of gated_forward on one thread, fenced as in
    scaled_forward_rows."""
    cdef Py_ssize_t i
    cdef int s = RN_STREAM_UNFENCED if stream else 0
    for i in range(lo, hi):
        rn_gated_add(h + i * d, x + i * d, F + i * d, g + i * g_step, d, s,
                     n - 1 - i if g_step else 0)
    if stream:
        rn_sfence()


cdef inline void gated_backward(element *dx, element *dF, element *dg, const element *dh,
                                const element *F, const element *g, Py_ssize_t n,
                                Py_ssize_t d, int n_threads, bint stream) noexcept nogil:
    """dx := dh;  dF := dh * s;  dg := F * (dh * s*(1-s)),  s = sigmoid(g) recomputed, g of
    F's shape.  Each output may be dh itself, none F or g.
    NumPy reference: resnorm.reference.gated_residual_backward."""
    cdef Py_ssize_t t
    if n_threads == 1:
        gated_backward_rows(dx, dF, dg, dh, F, g, 0, n, n, d, stream)
    else:
        for t in prange(n_threads, schedule="static", num_threads=n_threads):
            gated_backward_rows(dx, dF, dg, dh, F, g, first_row(t, n, n_threads),
                                first_row(t + 1, n, n_threads), n, d, stream)


cdef inline void gated_backward_rows(element *dx, element *dF, element *dg,
                                     const element *dh, const element *F, const element *g,
                                     Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n, Py_ssize_t d,
                                     bint stream) noexcept nogil:
    """Rows lo .. hi (of n) of gated_backward on one thread, fenced as in
    scaled_forward_rows."""
    cdef Py_ssize_t i
    cdef int s = RN_STREAM_UNFENCED if stream else 0
    for i in range(lo, hi):
        rn_gated_bwd(dx + i * d, dF + i * d, dg + i * d, NULL, dh + i * d, F + i * d,
                     g + i * d, d, s, n - 1 - i)
    if stream:
        rn_sfence()


cdef inline void gated_channel_backward_block(element *dx, element *dF, double *dg_part,
                                              const element *dh, const element *F,
                                              const element *g, Py_ssize_t lo, Py_ssize_t hi,
                                              Py_ssize_t d, bint stream) noexcept nogil:
    """Rows lo .. hi of gated_channel_backward, their dg summed into dg_part, fenced as in
    scaled_forward_rows."""
    cdef Py_ssize_t i
    cdef int s = RN_STREAM_UNFENCED if stream else 0
    memset(dg_part, 0, d * sizeof(double))
    for i in range(lo, hi):
        # (no prefetch: g is one row; the rows of dh and F stream in order)
        rn_gated_bwd(dx + i * d, dF + i * d, NULL, dg_part, dh + i * d, F + i * d, g, d, s, 0)
    if stream:
        rn_sfence()


cdef inline void gated_channel_backward(element *dx, element *dF, element *dg,
                                        double *partials, const element *dh,
                                        const element *F, const element *g, Py_ssize_t n,
                                        Py_ssize_t d, int n_threads, bint stream) noexcept nogil:
    """gated_backward for a per-channel (D,) g (the 16-bit types): dx and dF as there, and
    dg := sum over rows of F * (dh * s*(1-s)), the float terms summed in double per row
    block, the blocks in order, rounded once.  partials: (row_blocks(n), d) scratch.
    NumPy reference: resnorm.reference.gated_residual_backward."""
    cdef Py_ssize_t nb = row_blocks(n), blk
    if n_threads == 1:
        for blk in range(nb):
            gated_channel_backward_block(dx, dF, partials + blk * d, dh, F, g, blk * n // nb,
                                         (blk + 1) * n // nb, d, stream)
    else:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            gated_channel_backward_block(dx, dF, partials + blk * d, dh, F, g, blk * n // nb,
                                         (blk + 1) * n // nb, d, stream)
    sum_partials(dg, partials, nb, d, n_threads)
