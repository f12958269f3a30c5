# The gated RMSNorm of hybrid Mamba models, forward and backward, over N rows of D
# contiguous elements split into G = D / gs groups of gs consecutive elements, each
# normalised on its own with its slice of the weight (gs = D: one group per row).
#
# Two forms (docs/gated_rms_norm.md; NumPy reference: resnorm.reference.gated_rms_norm_*):
#   gate before the norm (norm_first 0):  u = x * silu(z),  y = u * rstd(u) * w
#   norm before the gate (norm_first 1):  y = x * rstd(x) * w * silu(z)
# with silu(z) = z * s, s = sigmoid(z), rstd(v) = 1/sqrt(mean(v^2) + eps) per group; z NULL
# means no gate (u = x), w NULL means w = 1 (forward; the backward takes ones).
#
# Each row goes through per-thread scratch rows of its compute type `real` (float for
# float32 and the 16-bit types, whose rows are widened on the way in and rounded once on the
# way out; double for float64), so the gate's product is formed once per element and the
# norm's row primitives (sum of squares, apply, backward dot) read it from L1.  Sums over
# rows (dweight) go through the fixed row blocks of common.pxd, so every thread count gives
# the same bits.
#
# Gate first, a float product u = x * a (a = silu(z)) under 2**-126 keeps only the
# subnormals' absolute precision, which the norm then scales up (subnormal x: hundreds of
# ulps in y, as in torch).  A group whose every |u| is under 2**-63 (tiny_group) is
# normalised from the exact products x * a in double instead (tiny_group_forward and
# tiny_group_backward); both passes decide on the same u, so they agree.
from cython.parallel cimport prange, threadid
from libc.math cimport sqrt
from libc.stdint cimport uint32_t

from common cimport at, first_row, row_blocks, sum_partials, zero_partials
from norm_kernels cimport rms_rstd
from primitives cimport (element, real, rn_from_float32, rn_rms_apply, rn_rms_bwd_dot,
                         rn_sigmoid, rn_sumsq, rn_to_float32)


cdef inline Py_ssize_t gated_norm_forward_floats(Py_ssize_t d) noexcept nogil:
    """Scratch elements of the compute type per thread, forward: the gate's s and the gated
    rows u (or the normalised rows, norm first), plus the widened x, gate and y rows of the
    16-bit types."""
    return 5 * d


cdef inline Py_ssize_t gated_norm_backward_floats(Py_ssize_t d) noexcept nogil:
    """Scratch elements per thread, backward: s, ds, u (or da) and du, plus the widened dy,
    x, gate, dx and dgate rows of the 16-bit types."""
    return 9 * d


# --------------------------------------------------------------------------- tiny groups

cdef inline bint tiny_bits(uint32_t e) noexcept nogil:
    """Whether floats whose words OR to e are all under 2**-63 in magnitude: their exponent
    fields are all under 64 exactly when their OR is (an OR of words, which the compiler
    vectorises, where a maximum of floats it would not)."""
    return (e & 0x7f800000u) < (64u << 23)


cdef inline bint tiny_group(const real *u, Py_ssize_t n) noexcept nogil:
    """Whether every |u_i| of a float group is under 2**-63; double groups: never."""
    cdef const uint32_t *bits = <const uint32_t *>u
    cdef uint32_t e = 0
    cdef Py_ssize_t i
    if real is double:
        return False
    for i in range(n):
        e |= bits[i]
    return tiny_bits(e)


cdef inline bint gated_products(real *u, const real *x, const real *z, const real *s,
                                Py_ssize_t n) noexcept nogil:
    """u := x * (z * s) (gate first: the gated rows, s = sigmoid(z)); returns
    tiny_group(u), from the same loop."""
    cdef const uint32_t *bits = <const uint32_t *>u
    cdef uint32_t e = 0
    cdef Py_ssize_t i
    if real is double:
        for i in range(n):
            u[i] = x[i] * (z[i] * s[i])
        return False
    for i in range(n):
        u[i] = x[i] * (z[i] * s[i])
        e |= bits[i]
    return tiny_bits(e)


cdef inline double tiny_group_forward(real *y, const real *x, const real *z, const real *s,
                                      const real *w, Py_ssize_t gs, double eps) noexcept nogil:
    """y of a tiny group (gate first) from v = x * a formed exactly in double, a = z * s
    rounded as the float path rounds it (s = sigmoid(z)); returns its rstd.  y may be x or
    z (each element is read before it is written)."""
    cdef double ss = 0.0, v, r
    cdef Py_ssize_t i
    for i in range(gs):
        v = <double>x[i] * <double>(z[i] * s[i])
        ss += v * v
    r = 1.0 / sqrt(ss / gs + eps)
    for i in range(gs):
        v = <double>x[i] * <double>(z[i] * s[i]) * r
        y[i] = <real>(v if w == NULL else v * <double>w[i])
    return r


cdef inline void tiny_group_backward(real *du, double *dw_part, const real *dy,
                                     const real *x, const real *z, const real *s,
                                     const real *w, double r, Py_ssize_t gs) noexcept nogil:
    """du = rstd * (g - vn * m) of a tiny group (gate first; g = dy * w), from vn = x * a *
    rstd in double (a = z * s as tiny_group_forward forms it), rounded once; its dweight
    terms dy * vn into dw_part."""
    cdef double m = 0.0, vn
    cdef Py_ssize_t i
    for i in range(gs):
        m += <double>dy[i] * <double>w[i] * (<double>x[i] * <double>(z[i] * s[i]) * r)
    m /= gs
    for i in range(gs):
        vn = <double>x[i] * <double>(z[i] * s[i]) * r
        du[i] = <real>(r * (<double>dy[i] * <double>w[i] - vn * m))
        dw_part[i] += <double>dy[i] * vn


# --------------------------------------------------------------------------- forward

cdef inline void gated_norm_forward_row(real *y, double *rstd, const real *x, const real *z,
                                        const real *w, real *work, Py_ssize_t d, Py_ssize_t gs,
                                        double eps, bint norm_first, int stream) noexcept nogil:
    """One row (rstd: its G statistics).  work: 2 d of scratch (s, then u).  y may be x or
    z."""
    cdef real *s = work
    cdef real *u = work + d
    cdef const real *v = x   # the rows the statistics are taken of
    cdef Py_ssize_t i, k, q
    cdef double ss
    if z != NULL:
        rn_sigmoid(s, NULL, z, d)
        if not norm_first:
            for i in range(d):
                u[i] = x[i] * (z[i] * s[i])   # u = x * silu(z)
            v = u
        else:
            for i in range(d):
                s[i] = z[i] * s[i]   # silu(z), before y is written: y may be z
    # norm first with a gate: y is read back to be gated, so it is not streamed yet
    cdef int st = 0 if (norm_first and z != NULL) else stream
    for q in range(d // gs):
        k = q * gs
        ss = rn_sumsq(v + k, gs, 0)
        # a tiny group's squares are each under 2**-126 (so only a small sum is tested)
        if v == u and ss < gs * 2.350988701644575e-38 and tiny_group(u + k, gs):   # 2**-125
            rstd[q] = tiny_group_forward(y + k, x + k, z + k, s + k, at(w, k), gs, eps)
            continue
        rstd[q] = rms_rstd(v + k, gs, eps, ss)
        rn_rms_apply(y + k, v + k, at(w, k), rstd[q], gs, st, 0)
    if norm_first and z != NULL:
        for i in range(d):
            y[i] = y[i] * s[i]   # y = (xn * w) * silu(z)


cdef inline void gated_norm_forward_rows(element *y, double *rstd, const element *x,
                                         const element *z, const void *w, void *scratch,
                                         Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t d, Py_ssize_t gs,
                                         double eps, bint norm_first, bint stream) noexcept nogil:
    """Rows lo .. hi.  w: of x's type, float for the 16-bit types (widened by the caller);
    scratch: gated_norm_forward_floats(d) of the compute type."""
    cdef Py_ssize_t r, g = d // gs
    cdef float *f = <float *>scratch
    for r in range(lo, hi):
        if element is float or element is double:
            gated_norm_forward_row(y + r * d, rstd + r * g, x + r * d, at(z, r * d),
                                   <const element *>w, <element *>scratch, d, gs, eps,
                                   norm_first, stream)
        else:
            # widened rows: x at f, z at f + d, y at f + 2 d, the row's scratch after them
            rn_to_float32(f, x + r * d, d)
            if z != NULL:
                rn_to_float32(f + d, z + r * d, d)
            gated_norm_forward_row(f + 2 * d, rstd + r * g, f, f + d if z != NULL else NULL,
                                   <const float *>w, f + 3 * d, d, gs, eps, norm_first, 0)
            rn_from_float32(y + r * d, f + 2 * d, d, stream)


cdef inline void gated_norm_forward(element *y, double *rstd, const element *x, const element *z,
                                    const void *w, void *scratch, Py_ssize_t n, Py_ssize_t d,
                                    Py_ssize_t gs, double eps, bint norm_first, int n_threads,
                                    bint stream) noexcept nogil:
    """y := the gated RMSNorm of x (see the top of this file); rstd: n * (d / gs) doubles.
    scratch: n_threads * gated_norm_forward_floats(d) elements of the compute type (float, or
    double for double rows)."""
    cdef Py_ssize_t t, per = gated_norm_forward_floats(d) * (
        sizeof(double) if element is double else sizeof(float))
    if n_threads == 1:
        gated_norm_forward_rows(y, rstd, x, z, w, scratch, 0, n, d, gs, eps, norm_first, stream)
    else:
        for t in prange(n_threads, schedule="static", num_threads=n_threads):
            gated_norm_forward_rows(y, rstd, x, z, w, <char *>scratch + t * per,
                                    first_row(t, n, n_threads), first_row(t + 1, n, n_threads),
                                    d, gs, eps, norm_first, stream)


# --------------------------------------------------------------------------- backward

cdef inline void gated_norm_backward_row(real *dx, real *dz, double *dw_part, const real *dy,
                                         const real *x, const real *z, const real *w,
                                         const double *rstd, real *work, Py_ssize_t d,
                                         Py_ssize_t gs, bint norm_first) noexcept nogil:
    """One row's dx and dz (z NULL: no gate, dz unused), adding its dweight terms into
    dw_part.  w is never NULL here (the caller passes ones for no weight), so that every
    loop is one vectorisable form.  work: 4 d of scratch (s, ds, u or da, du).

    Gate first: g = dy*w, un = u*rstd, m = mean(g*un) per group;
                du = rstd*(g - un*m),  dx = du*silu(z),  dz = du*x*silu'(z),  dw += dy*un.
    Norm first: a = xn*w (xn = x*rstd);  dz = dy*a*silu'(z),  da = dy*silu(z), then the
                plain RMSNorm backward with da for dy:  dx = rstd*(da*w - xn*m),
                m = mean(da*w*xn),  dw += da*xn.
    silu'(z) = s + z*ds, ds = s*(1 - s)."""
    cdef real *s = work
    cdef real *ds = work + d
    cdef real *t = work + 2 * d   # u (gate first) or da (norm first)
    cdef real *du = work + 3 * d
    cdef const real *v = x        # the rows the statistics were taken of
    cdef const real *gin = dy     # the gradient entering the norm
    cdef bint gate_first = z != NULL and not norm_first
    cdef real *dv = du if gate_first else dx   # the norm's input gradient
    cdef Py_ssize_t i, k, q, g = d // gs
    cdef real r, m
    if z != NULL:
        rn_sigmoid(s, ds, z, d)
        if gate_first:
            v = t   # u, formed group by group below as the forward formed it
        else:
            # da first: dz may be dy (da reads every element of dy before dz is written)
            for i in range(d):
                t[i] = dy[i] * (z[i] * s[i])
            for q in range(g):
                r = <real>rstd[q]
                for i in range(q * gs, (q + 1) * gs):
                    dz[i] = dy[i] * ((x[i] * r) * w[i]) * (s[i] + z[i] * ds[i])
            gin = t
    for q in range(g):
        k = q * gs
        if gate_first and gated_products(t + k, x + k, z + k, s + k, gs):
            tiny_group_backward(du + k, dw_part + k, dy + k, x + k, z + k, s + k, w + k,
                                rstd[q], gs)
            continue
        m = <real>(rn_rms_bwd_dot(gin + k, v + k, w + k, rstd[q], gs, 0) / gs)
        r = <real>rstd[q]
        for i in range(k, k + gs):
            dv[i] = r * (gin[i] * w[i] - (v[i] * r) * m)
            dw_part[i] += <double>gin[i] * <double>(v[i] * r)
    if gate_first:
        for i in range(d):
            dx[i] = du[i] * (z[i] * s[i])
        for i in range(d):
            dz[i] = du[i] * x[i] * (s[i] + z[i] * ds[i])


cdef inline void gated_norm_backward_block(element *dx, element *dz, double *dw_part,
                                           const element *dy, const element *x, const element *z,
                                           const void *w, const double *rstd, void *scratch,
                                           Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t d,
                                           Py_ssize_t gs, bint norm_first) noexcept nogil:
    """Rows lo .. hi, their dweight terms added into this block's partial row (zeroed
    here).  scratch: gated_norm_backward_floats(d) of the compute type."""
    cdef Py_ssize_t r, g = d // gs
    cdef float *f = <float *>scratch
    zero_partials(dw_part, NULL, d)
    for r in range(lo, hi):
        if element is float or element is double:
            gated_norm_backward_row(dx + r * d, dz + r * d if dz != NULL else NULL, dw_part,
                                    dy + r * d, x + r * d, at(z, r * d),
                                    <const element *>w, rstd + r * g, <element *>scratch, d,
                                    gs, norm_first)
        else:
            # widened rows: dy, x, z at f, f + d, f + 2 d; dx, dz at f + 3 d, f + 4 d
            rn_to_float32(f, dy + r * d, d)
            rn_to_float32(f + d, x + r * d, d)
            if z != NULL:
                rn_to_float32(f + 2 * d, z + r * d, d)
            gated_norm_backward_row(f + 3 * d, f + 4 * d, dw_part, f, f + d,
                                    f + 2 * d if z != NULL else NULL, <const float *>w,
                                    rstd + r * g, f + 5 * d, d, gs, norm_first)
            rn_from_float32(dx + r * d, f + 3 * d, d, 0)
            if z != NULL:
                rn_from_float32(dz + r * d, f + 4 * d, d, 0)


cdef inline void gated_norm_backward(element *dx, element *dz, double *dw_part, const element *dy,
                                     const element *x, const element *z, const void *w,
                                     const double *rstd, void *scratch, Py_ssize_t n, Py_ssize_t d,
                                     Py_ssize_t gs, bint norm_first, int n_threads) noexcept nogil:
    """dx, dz of the gated RMSNorm (see gated_norm_backward_row), and the dweight sums over
    rows into dw_part: row_blocks(n) partial rows of d doubles (the caller sums them with
    gated_norm_dweight, or ignores them when there is no weight).  w: never NULL (ones for
    no weight).  dz may be NULL when z is.  scratch: n_threads *
    gated_norm_backward_floats(d) elements of the compute type."""
    cdef Py_ssize_t nb = row_blocks(n), blk
    cdef Py_ssize_t per = gated_norm_backward_floats(d) * (
        sizeof(double) if element is double else sizeof(float))
    if n_threads == 1:
        for blk in range(nb):
            gated_norm_backward_block(dx, dz, dw_part + blk * d, dy, x, z, w, rstd, scratch,
                                      blk * n // nb, (blk + 1) * n // nb, d, gs, norm_first)
    else:
        for blk in prange(nb, schedule="static", num_threads=n_threads):
            gated_norm_backward_block(dx, dz, dw_part + blk * d, dy, x, z, w, rstd,
                                      <char *>scratch + threadid() * per, blk * n // nb,
                                      (blk + 1) * n // nb, d, gs, norm_first)


cdef inline void gated_norm_dweight(element *dw, double *dw_part, Py_ssize_t n, Py_ssize_t d,
                                    int n_threads) noexcept nogil:
    """dw := the sum of gated_norm_backward's partial rows, in block order, rounded once."""
    sum_partials(dw, dw_part, row_blocks(n), d, n_threads)
