# The elementwise functions (included by api.pyx): scaled residual, gated residual and
# inverted dropout, with their training and backward forms.

cdef tuple SCALED_INPUTS = ("x", "F", "alpha")
cdef tuple SCALED_KEPT = ("F", "alpha")
cdef tuple GATED_INPUTS = ("x", "F", "g")
cdef tuple GATED_KEPT = ("F", "g")


cdef inline tuple branch_inputs(x, F, bint halves=False):
    """x and F (the branch), checked: F must match x (halves: float16 and bfloat16 too)."""
    cdef cnp.ndarray xa = float_array(x, "x", halves)
    return xa, partner_of(F, xa, "F")


cdef inline elementwise_cache_type(cache, type kind, str forward_name):
    if type(cache) is not kind and not isinstance(cache, kind):
        raise TypeError(f"cache must be the {kind.__name__} returned by {forward_name}, "
                        f"got {type(cache).__name__}")


cdef inline cnp.ndarray gradient_like(g, str name, dtype, shape):
    """The incoming gradient g (called name) checked against a cache's shape and dtype."""
    if (type(g) is cnp.ndarray and cnp.PyArray_DescrCheck(dtype)
            and cnp.PyArray_TYPE(<cnp.ndarray>g) == (<cnp.dtype>dtype).type_num
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>g) and shape_is(<cnp.ndarray>g, shape)):
        return <cnp.ndarray>g
    return like_array(g, name, shape, dtype)


# --------------------------------------------------------------------------- scaled residual

cdef object scaled_residual_call(x, F, alpha, out, n_threads, bint keep_cache):
    """h = x + alpha * F; returns h, or (h, cache) when keep_cache."""
    cdef cnp.ndarray xa, fa
    xa, fa = branch_inputs(x, F, True)
    cdef ResidualScale scale = residual_scale_of(alpha, xa)
    cdef int nt = threads_of(n_threads)
    cdef bint learnable = scale.learns()
    if keep_cache and learnable:
        not_shared(out, "out", SCALED_KEPT, (fa, scale.vector), KEPT_OUT)
    cdef cnp.ndarray rows_x = contiguous(xa), rows_f = contiguous(fa)
    cdef tuple inputs = (xa, fa, scale.vector)
    cdef cnp.ndarray h = new_like(xa) if out is None else None
    if h is None:
        check_out(out, xa, SCALED_INPUTS, inputs, "out")
        h = <cnp.ndarray>out if kernel_layout(<cnp.ndarray>out) else new_like(xa)
    cdef Py_ssize_t size = cnp.PyArray_SIZE(rows_x), d = row_length(rows_x), n = size // d
    nt = team(nt, size)
    cdef bint stream = streams_over(h, None, rows_x, rows_f)
    cdef void *ph = cnp.PyArray_DATA(h)
    cdef void *px = cnp.PyArray_DATA(rows_x)
    cdef void *pf = cnp.PyArray_DATA(rows_f)
    cdef void *pa = data_of(scale.vector)
    cdef Kind ek = kind_of(rows_x)
    saved = release_gil(size)
    if ek == KIND_F32:
        scaled_forward(<float *>ph, <const float *>px, <const float *>pf,
                       <const float *>pa, n, d, nt, stream)
    elif ek == KIND_F64:
        scaled_forward(<double *>ph, <const double *>px, <const double *>pf,
                       <const double *>pa, n, d, nt, stream)
    elif ek == KIND_BF16:
        scaled_forward(<rn_bf16 *>ph, <const rn_bf16 *>px, <const rn_bf16 *>pf,
                       <const rn_bf16 *>pa, n, d, nt, stream)
    else:
        scaled_forward(<rn_f16 *>ph, <const rn_f16 *>px, <const rn_f16 *>pf,
                       <const rn_f16 *>pa, n, d, nt, stream)
    take_gil_back(saved)
    result = finish(out, h)
    if not keep_cache:
        return result
    return result, scaled_residual_cache(as_rows(rows_f) if learnable else None, scale,
                                         shape_of(xa), xa.descr)


cdef inline object backward_rows(cnp.ndarray dha, n_threads, int *nt, Py_ssize_t *n,
                                 Py_ssize_t *d):
    """dh's rows for a backward kernel; the team, rows and row length through the pointers."""
    cdef int requested = threads_of(n_threads)
    cdef cnp.ndarray rows = contiguous(dha)
    cdef Py_ssize_t size = cnp.PyArray_SIZE(rows)
    d[0] = row_length(rows)
    n[0] = size // d[0]
    nt[0] = team(requested, size)
    return rows


cdef inline cnp.ndarray elementwise_gradient(buffer, str name, cnp.ndarray like,
                                             cnp.ndarray dha, tuple kept_names, tuple kept):
    """Where an elementwise backward writes one gradient of like's shape: a new array (buffer
    None), buffer itself, or a fresh array that finish copies into it.  buffer may be dh
    itself (the kernels read each element of dh before they write it), never an array the
    cache holds."""
    if buffer is None:
        return new_like(like)
    check_out(buffer, like, ("dh",), (dha,), name)
    not_shared(buffer, name, kept_names, kept, CACHE_GRADIENT)
    return <cnp.ndarray>buffer if kernel_layout(<cnp.ndarray>buffer) else new_like(like)


cdef inline apart(tuple buffers, tuple names):
    """The output buffers given (None: not given) must not share memory with each other."""
    cdef Py_ssize_t i, j
    for i in range(len(buffers)):
        for j in range(i + 1, len(buffers)):
            if (buffers[i] is not None and buffers[j] is not None
                    and overlap(buffers[i], buffers[j])):
                raise ValueError(f"{names[i]} and {names[j]} must not share memory: they "
                                 f"receive different gradients")


cdef tuple SCALED_CACHE_FIELDS = ("F", "alpha")
cdef tuple GATED_CACHE_FIELDS = ("F", "g", "s", "ds")
cdef tuple SCALED_BUFFERS = ("out", "dbranch_out")
cdef tuple GATED_BUFFERS = ("out", "dbranch_out", "dgate_out")


def scaled_residual(x, F, alpha, *, out=None, n_threads=None):
    return scaled_residual_call(x, F, alpha, out, n_threads, False)


def scaled_residual_forward(x, F, alpha, *, out=None, n_threads=None):
    return scaled_residual_call(x, F, alpha, out, n_threads, True)


def scaled_residual_backward(dh, cache, *, out=None, dbranch_out=None, n_threads=None):
    elementwise_cache_type(cache, ScaledResidualCache, "scaled_residual_forward")
    cdef ScaledResidualCache c = <ScaledResidualCache>cache
    cdef Py_ssize_t n = 0, d = 0
    cdef int t = 0
    cdef bint learnable
    if not (valid_scale(c.alpha) and cache_rows(c.shape, c.dtype, 1, &n, &d, &t)):
        raise edited_cache(c)
    learnable = (<ResidualScale>c.alpha).learns()
    if not (cache_field(c.branch, ROWS, learnable, n, d, t)
            and cache_field((<ResidualScale>c.alpha).vector, VECTOR, learnable, n, d, t)):
        raise edited_cache(c)
    cdef cnp.ndarray dha = gradient_like(dh, "dh", c.dtype, c.shape)
    cdef int nt = 1
    cdef cnp.ndarray rows = backward_rows(dha, n_threads, &nt, &n, &d)
    cdef ResidualScale scale = <ResidualScale>c.alpha
    cdef tuple kept = (c.branch, scale.vector)
    cdef cnp.ndarray dx = elementwise_gradient(out, "out", dha, dha, SCALED_CACHE_FIELDS, kept)
    cdef cnp.ndarray dF = elementwise_gradient(dbranch_out, "dbranch_out", dha, dha,
                                               SCALED_CACHE_FIELDS, kept)
    apart((out, dbranch_out), SCALED_BUFFERS)
    cdef bint stream = streams(cnp.PyArray_NBYTES(rows))
    dalpha = new_vector(d, cnp.NPY_DOUBLE) if learnable else None
    cdef Py_ssize_t nb = row_blocks(n)
    cdef Scratch scratch = lend(nb * d * sizeof(double) if dalpha is not None else 0)
    cdef void *pdx = cnp.PyArray_DATA(dx)
    cdef void *pdf = cnp.PyArray_DATA(dF)
    cdef double *pda = <double *>data_of(dalpha)
    cdef void *pdh = cnp.PyArray_DATA(rows)
    cdef void *pf = data_of(c.branch)
    cdef void *pa = data_of(scale.vector)
    cdef double *parts = <double *>scratch.data
    cdef Kind ek = kind_of(rows)
    saved = release_gil(n * d)
    if ek == KIND_F32:
        scaled_backward(<float *>pdx, <float *>pdf, pda, parts, <const float *>pdh,
                        <const float *>pf, <const float *>pa, n, d, nt, stream)
    elif ek == KIND_F64:
        scaled_backward(<double *>pdx, <double *>pdf, pda, parts, <const double *>pdh,
                        <const double *>pf, <const double *>pa, n, d, nt, stream)
    elif ek == KIND_BF16:
        scaled_backward(<rn_bf16 *>pdx, <rn_bf16 *>pdf, pda, parts, <const rn_bf16 *>pdh,
                        <const rn_bf16 *>pf, <const rn_bf16 *>pa, n, d, nt, stream)
    else:
        scaled_backward(<rn_f16 *>pdx, <rn_f16 *>pdf, pda, parts, <const rn_f16 *>pdh,
                        <const rn_f16 *>pf, <const rn_f16 *>pa, n, d, nt, stream)
    take_gil_back(saved)
    scratch.give_back()
    return finish(out, dx), finish(dbranch_out, dF), scale.grad(dalpha, c.dtype)


# --------------------------------------------------------------------------- gated residual

cdef object gated_residual_call(x, F, g, out, n_threads, bint keep_cache):
    """h = x + sigmoid(g) * F; returns h, or (h, cache) when keep_cache."""
    cdef cnp.ndarray xa, fa
    xa, fa = branch_inputs(x, F, True)
    cdef cnp.ndarray ga = gate_array(g, shape_of(xa), xa.descr)
    cdef int nt = threads_of(n_threads)
    if keep_cache:
        not_shared(out, "out", GATED_KEPT, (fa, ga), KEPT_OUT)
    cdef cnp.ndarray rows_x = contiguous(xa), rows_f = contiguous(fa)
    cdef tuple inputs = (xa, fa, ga)
    cdef cnp.ndarray h = new_like(xa) if out is None else None
    if h is None:
        check_out(out, xa, GATED_INPUTS, inputs, "out")
        h = <cnp.ndarray>out if kernel_layout(<cnp.ndarray>out) else new_like(xa)
    cdef Py_ssize_t size = cnp.PyArray_SIZE(rows_x), d = row_length(rows_x), n = size // d
    nt = team(nt, size)
    cdef bint stream = streams_over(h, None, rows_x, rows_f)
    cdef cnp.ndarray gate = None, s = None, ds = None, g64
    cdef void *ph = cnp.PyArray_DATA(h)
    cdef void *px = cnp.PyArray_DATA(rows_x)
    cdef void *pf = cnp.PyArray_DATA(rows_f)
    cdef void *pg
    cdef Kind ek = kind_of(rows_x)
    cdef bint full = same_shape(ga, xa)
    # the gate's logits, read by the kernels (a per-channel g of the 16-bit types too:
    # sigmoid(g) stays in float32 registers, as for a full gate, rather than being rounded
    # to 16 bits before it scales F)
    cdef Py_ssize_t g_step = d if full else 0
    if full or ek == KIND_BF16 or ek == KIND_F16:
        gate = contiguous(ga)
        pg = cnp.PyArray_DATA(gate)
        saved = release_gil(n * d)
        if ek == KIND_F32:
            gated_forward(<float *>ph, <const float *>px, <const float *>pf,
                          <const float *>pg, g_step, n, d, nt, stream)
        elif ek == KIND_F64:
            gated_forward(<double *>ph, <const double *>px, <const double *>pf,
                          <const double *>pg, g_step, n, d, nt, stream)
        elif ek == KIND_BF16:
            gated_forward(<rn_bf16 *>ph, <const rn_bf16 *>px, <const rn_bf16 *>pf,
                          <const rn_bf16 *>pg, g_step, n, d, nt, stream)
        else:
            gated_forward(<rn_f16 *>ph, <const rn_f16 *>px, <const rn_f16 *>pf,
                          <const rn_f16 *>pg, g_step, n, d, nt, stream)
        take_gil_back(saved)
    else:
        # per channel, float and double: the gate is a LayerScale vector s = sigmoid(g),
        # formed once by the sigmoid of the full gate (the same bits); ds in double, for
        # dg = ds * sum_rows dh F
        s = cnp.PyArray_NewCopy(ga, cnp.NPY_CORDER)
        g64 = contiguous(np.asarray(ga, dtype=np.float64))   # aligned, as the kernels read it
        ds = new_like(g64)
        s64 = new_like(g64)   # (the double sigmoid's s, not kept)
        pg = cnp.PyArray_DATA(s)
        saved = release_gil(d)
        if ek == KIND_F32:
            sigmoid(<float *>pg, <float *>NULL, <const float *>pg, 1, d, 1)
        else:
            sigmoid(<double *>pg, <double *>NULL, <const double *>pg, 1, d, 1)
        sigmoid(<double *>cnp.PyArray_DATA(s64), <double *>cnp.PyArray_DATA(ds),
                <const double *>cnp.PyArray_DATA(g64), 1, d, 1)
        if ek == KIND_F32:
            scaled_forward(<float *>ph, <const float *>px, <const float *>pf,
                           <const float *>pg, n, d, nt, stream)
        else:
            scaled_forward(<double *>ph, <const double *>px, <const double *>pf,
                           <const double *>pg, n, d, nt, stream)
        take_gil_back(saved)
    result = finish(out, h)
    if not keep_cache:
        return result
    # a full gate as the (N, D) rows, a per-channel one as its (D,) vector
    return result, gated_residual_cache(as_rows(rows_f),
                                        as_rows(gate, d) if full else gate, s, ds,
                                        shape_of(xa), xa.descr)


def gated_residual(x, F, g, *, out=None, n_threads=None):
    return gated_residual_call(x, F, g, out, n_threads, False)


def gated_residual_forward(x, F, g, *, out=None, n_threads=None):
    return gated_residual_call(x, F, g, out, n_threads, True)


def gated_residual_backward(dh, cache, *, out=None, dbranch_out=None, dgate_out=None,
                            n_threads=None):
    elementwise_cache_type(cache, GatedResidualCache, "gated_residual_forward")
    cdef GatedResidualCache c = <GatedResidualCache>cache
    # the kernels recompute sigmoid from the logits (a full gate, or a 16-bit per-channel
    # one), or read s and ds (a per-channel gate of float and double)
    cdef bint logits = c.s is None
    cdef bint full = (logits and type(c.gate) is cnp.ndarray
                      and cnp.PyArray_NDIM(<cnp.ndarray>c.gate) == 2)
    cdef Py_ssize_t n = 0, d = 0
    cdef int t = 0
    if not (cache_rows(c.shape, c.dtype, 1, &n, &d, &t)
            and cache_field(c.branch, ROWS, True, n, d, t)
            and cache_field(c.gate, ROWS if full else VECTOR, logits, n, d, t)
            and cache_field(c.s, VECTOR, not logits, n, d, t)
            and cache_field(c.ds, VECTOR64, not logits, n, d, t)):
        raise edited_cache(c)
    cdef cnp.ndarray dha = gradient_like(dh, "dh", c.dtype, c.shape)
    cdef int nt = 1
    cdef cnp.ndarray rows = backward_rows(dha, n_threads, &nt, &n, &d)
    cdef tuple kept = (c.branch, c.gate, c.s, c.ds)
    cdef cnp.ndarray dx = elementwise_gradient(out, "out", dha, dha, GATED_CACHE_FIELDS, kept)
    cdef cnp.ndarray dF = elementwise_gradient(dbranch_out, "dbranch_out", dha, dha,
                                               GATED_CACHE_FIELDS, kept)
    # dg has g's shape: F's, or (D,) per channel (then summed over rows)
    cdef cnp.ndarray dg = elementwise_gradient(
        dgate_out, "dgate_out",
        dha if full else <cnp.ndarray>(c.gate if logits else c.s),
        dha, GATED_CACHE_FIELDS, kept)
    apart((out, dbranch_out, dgate_out), GATED_BUFFERS)
    cdef bint stream = streams(cnp.PyArray_NBYTES(rows))
    cdef void *pdx = cnp.PyArray_DATA(dx)
    cdef void *pdf = cnp.PyArray_DATA(dF)
    cdef void *pdh = cnp.PyArray_DATA(rows)
    cdef void *pf = cnp.PyArray_DATA(<cnp.ndarray>c.branch)
    cdef void *pg
    cdef void *pdg = cnp.PyArray_DATA(dg)
    cdef Scratch scratch
    cdef double *work
    cdef Kind ek = kind_of(rows)
    if full:
        pg = cnp.PyArray_DATA(<cnp.ndarray>c.gate)
        saved = release_gil(n * d)
        if ek == KIND_F32:
            gated_backward(<float *>pdx, <float *>pdf, <float *>pdg, <const float *>pdh,
                           <const float *>pf, <const float *>pg, n, d, nt, stream)
        elif ek == KIND_F64:
            gated_backward(<double *>pdx, <double *>pdf, <double *>pdg,
                           <const double *>pdh, <const double *>pf, <const double *>pg,
                           n, d, nt, stream)
        elif ek == KIND_BF16:
            gated_backward(<rn_bf16 *>pdx, <rn_bf16 *>pdf, <rn_bf16 *>pdg,
                           <const rn_bf16 *>pdh, <const rn_bf16 *>pf, <const rn_bf16 *>pg,
                           n, d, nt, stream)
        else:
            gated_backward(<rn_f16 *>pdx, <rn_f16 *>pdf, <rn_f16 *>pdg,
                           <const rn_f16 *>pdh, <const rn_f16 *>pf, <const rn_f16 *>pg,
                           n, d, nt, stream)
        take_gil_back(saved)
        return finish(out, dx), finish(dbranch_out, dF), finish(dgate_out, dg)
    scratch = lend(row_blocks(n) * d * sizeof(double))
    work = <double *>scratch.data
    if logits:
        # per channel, 16-bit: dg summed over rows in double, rounded once
        pg = cnp.PyArray_DATA(<cnp.ndarray>c.gate)
        saved = release_gil(n * d)
        if ek == KIND_BF16:
            gated_channel_backward(<rn_bf16 *>pdx, <rn_bf16 *>pdf, <rn_bf16 *>pdg, work,
                                   <const rn_bf16 *>pdh, <const rn_bf16 *>pf,
                                   <const rn_bf16 *>pg, n, d, nt, stream)
        else:
            gated_channel_backward(<rn_f16 *>pdx, <rn_f16 *>pdf, <rn_f16 *>pdg, work,
                                   <const rn_f16 *>pdh, <const rn_f16 *>pf,
                                   <const rn_f16 *>pg, n, d, nt, stream)
        take_gil_back(saved)
        scratch.give_back()
        return finish(out, dx), finish(dbranch_out, dF), finish(dgate_out, dg)
    # per channel, float and double: the scaled residual's backward with alpha = s, then
    # dg = dalpha * ds
    dsum = new_vector(d, cnp.NPY_DOUBLE)
    cdef double *pdsum = <double *>cnp.PyArray_DATA(dsum)
    pg = cnp.PyArray_DATA(<cnp.ndarray>c.s)
    saved = release_gil(n * d)
    if ek == KIND_F32:
        scaled_backward(<float *>pdx, <float *>pdf, pdsum, work, <const float *>pdh,
                        <const float *>pf, <const float *>pg, n, d, nt, stream)
    else:
        scaled_backward(<double *>pdx, <double *>pdf, pdsum, work, <const double *>pdh,
                        <const double *>pf, <const double *>pg, n, d, nt, stream)
    take_gil_back(saved)
    scratch.give_back()
    np.multiply(dsum, c.ds, out=dsum)
    dg[...] = dsum
    return finish(out, dx), finish(dbranch_out, dF), finish(dgate_out, dg)


# --------------------------------------------------------------------------- dropout

cdef object apply_dropout(cnp.ndarray a, str name, rn_dropout site, out, int requested):
    """a * the multipliers of the site (a copy of a when it is off)."""
    cdef cnp.ndarray rows = contiguous(a)
    cdef cnp.ndarray y = new_like(a) if out is None else None
    if y is None:
        check_out(out, a, (name,), (a,), "out")
        y = <cnp.ndarray>out if kernel_layout(<cnp.ndarray>out) else new_like(a)
    cdef Py_ssize_t size = cnp.PyArray_SIZE(rows)
    cdef int nt = team(requested, size)
    cdef bint stream = streams_over(y, None, rows, None)
    cdef Scratch scratch
    cdef void *py = cnp.PyArray_DATA(y)
    cdef void *px = cnp.PyArray_DATA(rows)
    cdef uint64_t *masks
    cdef Kind ek = kind_of(rows)
    if not site.on:
        cnp.PyArray_CopyInto(y, rows)
    else:
        scratch = lend(max(1, nt) * mask_words(SEGMENT) * 8)
        masks = <uint64_t *>scratch.data
        memset(masks, 0, max(1, nt) * mask_words(SEGMENT) * 8)
        saved = release_gil(size)
        if ek == KIND_F32:
            dropout_apply(<float *>py, <const float *>px, &site, masks, size, nt, stream)
        elif ek == KIND_F64:
            dropout_apply(<double *>py, <const double *>px, &site, masks, size, nt, stream)
        elif ek == KIND_BF16:
            dropout_apply(<rn_bf16 *>py, <const rn_bf16 *>px, &site, masks, size, nt,
                          stream)
        else:
            dropout_apply(<rn_f16 *>py, <const rn_f16 *>px, &site, masks, size, nt, stream)
        take_gil_back(saved)
        scratch.give_back()
    return finish(out, y)


def dropout_forward(x, p, *, seed, training=True, out=None, n_threads=None, return_mask=False):
    cdef cnp.ndarray xa = float_array(x, "x", True)
    cdef DropoutSpec spec = dropout_spec(p, seed, training)
    cdef int nt = threads_of(n_threads)
    mask = spec.mask(shape_of(xa), n_threads) if flag(return_mask, "return_mask") else None
    y = apply_dropout(xa, "x", kernel_dropout(spec), out, nt)
    return y, dropout_cache(spec, shape_of(xa), xa.descr, mask)


def dropout(x, p, *, seed, training=True, out=None, n_threads=None):
    cdef cnp.ndarray xa = float_array(x, "x", True)
    cdef rn_dropout site = dropout_site(p, seed, training)
    return apply_dropout(xa, "x", site, out, threads_of(n_threads))


def dropout_backward(dy, cache, *, out=None, n_threads=None):
    if type(cache) is not DropoutCache and not isinstance(cache, DropoutCache):
        raise TypeError(f"cache must be the DropoutCache returned by dropout_forward, "
                        f"got {type(cache).__name__}")
    cdef DropoutCache c = <DropoutCache>cache
    cdef Py_ssize_t n = 0, d = 0
    cdef int t = 0
    if not (valid_spec(c.spec) and cache_rows(c.shape, c.dtype, 1, &n, &d, &t)):
        raise edited_cache(c)   # (the kernel reads no array of the cache)
    cdef cnp.ndarray dya = gradient_like(dy, "dy", c.dtype, c.shape)
    return apply_dropout(dya, "dy", kernel_dropout(c.spec), out, threads_of(n_threads))
