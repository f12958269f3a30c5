# The fused add + norm functions (included by api.pyx): h = residual + alpha * dropout(x),
# then y = norm(h); Pre-Norm returns (y, h), Post-Norm only y.

cdef tuple ADD_NORM_INPUTS = ("x", "residual", "weight", "bias", "alpha")
cdef tuple ADD_NORM_KEPT = ("x", "residual", "weight", "alpha")
cdef tuple GRADIENT_INPUTS = ("dy", "dh")
cdef tuple ADD_NORM_CACHE_FIELDS = ("h", "x", "residual", "weight", "alpha", "mean", "rstd")
cdef str KEPT_OUT = "{out} must not overlap {name} in the training form: backward reads {name}"
cdef str CACHE_GRADIENT = "{out} must not share memory with the cache's {name}: pass a separate buffer"

# the forward functions, at 2 * layer + prenorm (a tuple: indexed in C): the name a cache
# records
cdef tuple ADD_NORM_OPS = ("add_rms_norm_post_forward", "add_rms_norm_forward",
                           "add_layer_norm_post_forward", "add_layer_norm_forward")


cdef inline cnp.ndarray apart_from(cnp.ndarray buffer, w, b, cnp.ndarray like):
    """buffer, or a fresh one when it shares memory with the weight or the bias: a rare row
    is stored in it first, then normalised with them (rank-1 input, in place)."""
    if (w is not None and overlap(buffer, w)) or (b is not None and overlap(buffer, b)):
        return new_like(like)
    return buffer


cdef inline cnp.ndarray buffer_for(out, cnp.ndarray like, tuple inputs, str name):
    """Where the kernel writes the output `name`: a new array (out None), out itself, or a
    fresh array copied into out afterwards (finish)."""
    if out is None:
        return new_like(like)
    check_out(out, like, ADD_NORM_INPUTS, inputs, name)
    return <cnp.ndarray>out if kernel_layout(<cnp.ndarray>out) else new_like(like)


cdef inline void add_norm_forward_rows(element *y, element *h, double *mean, double *rstd,
                                       const void *x, const void *r, const void *w,
                                       const void *b, const void *alpha, bint mixed, bint widen,
                                       double eps, const rn_dropout *site, uint64_t *masks,
                                       float *buf, Py_ssize_t n, Py_ssize_t d, int nt,
                                       bint stream) noexcept nogil:
    """add_norm_forward for y's element type (the inputs are of that type; w and b float32
    when mixed).  widen: the 16-bit w and b are widened here into buf (2 d floats) once for
    all rows, which the fused pass reads in their place."""
    cdef float *wf = NULL
    cdef float *bf = NULL
    if mixed:
        add_norm_forward(y, h, mean, rstd, <const element *>x, <const element *>r, NULL, NULL,
                         <const element *>alpha, <const float *>w, <const float *>b, eps, site,
                         masks, buf, n, d, nt, stream)
        return
    if widen:
        if w != NULL:
            wf = buf
            rn_to_float32(wf, <const element *>w, d)
        if b != NULL:
            bf = buf + d
            rn_to_float32(bf, <const element *>b, d)
    add_norm_forward(y, h, mean, rstd, <const element *>x, <const element *>r,
                     <const element *>w, <const element *>b, <const element *>alpha, wf, bf,
                     eps, site, masks, NULL, n, d, nt, stream)


cdef inline void add_norm_backward_rows(element *dx, element *dres, void *dw, void *db,
                                        double *dalpha, double *partials, char *rows_scratch,
                                        const void *dy, const void *dh, const void *h,
                                        const void *x, const void *r, const void *w,
                                        const void *alpha, bint mixed, bint widen,
                                        const double *mean, const double *rstd,
                                        const rn_dropout *site, float *buf, Py_ssize_t n,
                                        Py_ssize_t d, int nt, bint stream) noexcept nogil:
    """add_norm_backward for dx's element type (the other arrays are of that type; w, dw
    and db float32 when mixed; buf: the widened rows, when mixed).  widen: the 16-bit
    weight w is widened here into buf (d floats) once for all rows, for the mixed norm (dw
    and db stay 16-bit)."""
    if widen:
        rn_to_float32(buf, <const element *>w, d)
        add_norm_backward(dx, dres, dw, db, dalpha, partials, rows_scratch,
                          <const element *>dy, <const element *>dh, <const element *>h,
                          <const element *>x, <const element *>r, <const element *>w,
                          <const element *>alpha, buf, mean, rstd, site, NULL, n, d, nt,
                          stream)
    elif mixed:
        add_norm_backward(dx, dres, dw, db, dalpha, partials, rows_scratch,
                          <const element *>dy, <const element *>dh, <const element *>h,
                          <const element *>x, <const element *>r, NULL,
                          <const element *>alpha, <const float *>w, mean, rstd, site, buf, n,
                          d, nt, stream)
    else:
        add_norm_backward(dx, dres, dw, db, dalpha, partials, rows_scratch,
                          <const element *>dy, <const element *>dh, <const element *>h,
                          <const element *>x, <const element *>r, <const element *>w,
                          <const element *>alpha, NULL, mean, rstd, site, NULL, n, d, nt,
                          stream)


cdef object add_norm_call(bint layer, bint prenorm, x, residual, weight, bias, eps,
                          normalized_shape, zero_centered, alpha, p, seed, training, out,
                          residual_out, n_threads, bint keep_cache):
    """Every fused forward: checks, the kernel, and (keep_cache) the cache.  Returns
    (y, h) (Pre-Norm) or y (Post-Norm), with the cache when keep_cache."""
    cdef cnp.ndarray xa = float_array(x, "x", True)
    cdef cnp.ndarray ra = partner_of(residual, xa, "residual")
    cdef int k = axes_of(normalized_shape, xa)
    # float32 for float32 parameters beside 16-bit x, else None (x's dtype)
    pdt = mixed_params(xa, weight, bias if layer else None)
    wp = param_of(weight, xa, "weight", k, pdt)
    bp = param_of(bias, xa, "bias", k, pdt) if layer else None
    cdef double e = eps_of(eps, xa)
    cdef bint zc = zero_centered_of(zero_centered)
    cdef ResidualScale scale = residual_scale_of(alpha, xa, k)
    cdef DropoutSpec spec = None
    cdef rn_dropout site
    if keep_cache:
        spec = dropout_spec(p, seed, training)
        site = kernel_dropout(spec)
    else:
        site = dropout_site(p, seed, training)
    cdef int nt = threads_of(n_threads)
    cdef bint learnable = scale.learns()
    cdef bint keeps_x = not prenorm or learnable
    cdef cnp.ndarray rows_x = contiguous(xa)
    cdef cnp.ndarray rows_r = contiguous(ra)
    # the arguments as given, for the overlap rules; the kernel reads w, b, scale.vector
    alpha_arg = alpha if scale.kind == "channel" else scale.vector
    cdef tuple inputs = (xa, ra, wp, bp, alpha_arg)
    w = gain_of(vector_of(wp), zc)
    b = vector_of(bp)
    if keep_cache:
        kept = (xa if keeps_x else None, None if prenorm else ra, wp,
                alpha_arg if learnable else None)
        not_shared(out, "out", ADD_NORM_KEPT, kept, KEPT_OUT)
        not_shared(residual_out, "residual_out", ADD_NORM_KEPT, kept, KEPT_OUT)
    if out is not None and residual_out is not None and overlap(out, residual_out):
        raise ValueError("out and residual_out must be different, non-overlapping arrays")
    cdef cnp.ndarray y = buffer_for(out, xa, inputs, "out")
    cdef cnp.ndarray h = buffer_for(residual_out, xa, inputs, "residual_out") if prenorm else None
    if prenorm:
        h = apart_from(h, w, b, xa)
    else:
        y = apart_from(y, w, b, xa)
    cdef Py_ssize_t size = cnp.PyArray_SIZE(rows_x), d = row_size(rows_x, k), n = size // d
    nt = team(nt, size)
    cdef bint stream = streams_over(y, h, rows_x, rows_r)
    cdef cnp.ndarray mean = None, rstd = None
    cdef Py_ssize_t stats_bytes = 0 if keep_cache else 2 * n * sizeof(double)
    cdef Py_ssize_t masks_bytes = max(1, nt) * add_norm_mask_words(d, &site) * 8
    cdef Kind ek = kind_of(rows_x)
    # LayerNorm's 16-bit parameters of many rows: widened to float32 once, for the fused
    # pass.  Not RMSNorm's: a float32 weight row beside the two 16-bit rows read fills more
    # of L1 than the one conversion saves (measurements: benchmarks/TUNING.md).
    cdef bint widen = layer and widens(ek, pdt is not None, n, w is not None or b is not None)
    # the widened rows (mixed, one per thread), or the widened parameters
    cdef Py_ssize_t buf_bytes = (max(1, nt) * forward_floats(d) * 4 if pdt is not None
                                 else 2 * d * 4 if widen else 0)
    cdef Scratch scratch = lend(stats_bytes + masks_bytes + buf_bytes)
    cdef double *pmean = <double *>scratch.data
    cdef double *prstd = pmean + n
    cdef uint64_t *masks = <uint64_t *>(scratch.data + stats_bytes)
    cdef float *buf = <float *>(scratch.data + stats_bytes + masks_bytes)
    cdef bint mixed = pdt is not None
    memset(masks, 0, masks_bytes)
    if keep_cache:
        rstd = new_stats(n)
        prstd = <double *>cnp.PyArray_DATA(rstd)
        pmean = NULL
        if layer:
            mean = new_stats(n)
            pmean = <double *>cnp.PyArray_DATA(mean)
    elif not layer:
        pmean = NULL
    cdef void *py = cnp.PyArray_DATA(y)
    cdef void *ph = data_of(h)
    cdef void *px = cnp.PyArray_DATA(rows_x)
    cdef void *pr = cnp.PyArray_DATA(rows_r)
    cdef void *pw = data_of(w)
    cdef void *pb = data_of(b)
    cdef void *pa = data_of(scale.vector)
    saved = release_gil(size)
    if ek == KIND_F32:
        add_norm_forward_rows(<float *>py, <float *>ph, pmean, prstd, px, pr, pw, pb, pa,
                              mixed, widen, e, &site, masks, buf, n, d, nt, stream)
    elif ek == KIND_F64:
        add_norm_forward_rows(<double *>py, <double *>ph, pmean, prstd, px, pr, pw, pb, pa,
                              mixed, widen, e, &site, masks, buf, n, d, nt, stream)
    elif ek == KIND_BF16:
        add_norm_forward_rows(<rn_bf16 *>py, <rn_bf16 *>ph, pmean, prstd, px, pr, pw, pb,
                              pa, mixed, widen, e, &site, masks, buf, n, d, nt, stream)
    else:
        add_norm_forward_rows(<rn_f16 *>py, <rn_f16 *>ph, pmean, prstd, px, pr, pw, pb, pa,
                              mixed, widen, e, &site, masks, buf, n, d, nt, stream)
    take_gil_back(saved)
    scratch.give_back()
    y_result = finish(out, y)
    result = (y_result, finish(residual_out, h)) if prenorm else y_result
    if not keep_cache:
        return result
    cache = add_norm_cache(
        ADD_NORM_OPS[2 * layer + prenorm], as_rows(h, d) if prenorm else None,
        as_rows(rows_x, d) if keeps_x else None, None if prenorm else as_rows(rows_r, d), w,
        b is not None, scale, spec, mean, rstd, shape_of(xa), xa.descr, k, pdt)
    return result, cache


cdef check_add_norm_cache(AddNormCache cache, bint layer, bint prenorm):
    """The arrays add_norm_backward reads, as the forward function made them."""
    cdef Py_ssize_t n = 0, d = 0
    cdef int t = 0, tp = -1
    cdef bint learnable = False
    # the kernel tells Pre- from Post-Norm by h, and LayerNorm from RMSNorm by mean
    cdef bint ok = (valid_spec(cache.dropout) and valid_scale(cache.alpha)
                    and (cache.has_bias is True or cache.has_bias is False)
                    and (prenorm or cache.h is None) and (layer or cache.mean is None)
                    and cache_rows(cache.shape, cache.dtype, cache.axes, &n, &d, &t))
    if ok:
        tp = param_type(cache.param_dtype, t)
        learnable = (<ResidualScale>cache.alpha).learns()
        ok = (cache_field(cache.h, ROWS, prenorm, n, d, t)
              and cache_field(cache.x, ROWS, learnable or not prenorm, n, d, t)
              and cache_field(cache.residual, ROWS, not prenorm, n, d, t)
              and tp >= 0 and cache_field(cache.weight, VECTOR, False, n, d, tp)
              and cache_field((<ResidualScale>cache.alpha).vector, VECTOR, learnable, n, d, t)
              and cache_field(cache.mean, STATS, layer, n, d, t)
              and cache_field(cache.rstd, STATS, True, n, d, t))
    if not ok:
        raise edited_cache(cache)


cdef inline cnp.ndarray gradient_buffer(buffer, str name, cnp.ndarray like, tuple inputs,
                                        tuple kept):
    """Where the kernel writes one gradient: as buffer_for, but never memory of an input
    (the fused backward kernel reads dy and dh while it writes), so buffer may be dy or dh
    itself only through a fresh array that finish copies into it."""
    if buffer is None:
        return new_like(like)
    check_out(buffer, like, GRADIENT_INPUTS, inputs, name)
    not_shared(buffer, name, ADD_NORM_CACHE_FIELDS, kept, CACHE_GRADIENT)
    cdef Py_ssize_t k
    if kernel_layout(<cnp.ndarray>buffer):
        for k in range(len(inputs)):
            if inputs[k] is not None and overlap(buffer, inputs[k]):
                return new_like(like)
        return <cnp.ndarray>buffer
    return new_like(like)


cdef object add_norm_backward_call(bint layer, bint prenorm, dy, dh, cache, out,
                                   dresidual_out, n_threads):
    """Every fused backward: returns (dx, dresidual, dweight, dbias, dalpha), without dbias
    for RMSNorm (the public functions' results)."""
    op = ADD_NORM_OPS[2 * layer + prenorm]
    if type(cache) is not AddNormCache or (<AddNormCache>cache).op != op:
        made_by = cache.op if isinstance(cache, AddNormCache) else type(cache).__name__
        raise TypeError(f"cache must be the AddNormCache returned by {op}, got {made_by}")
    cdef AddNormCache c = <AddNormCache>cache
    check_add_norm_cache(c, layer, prenorm)
    cdef cnp.dtype dtype = <cnp.dtype>c.dtype   # a dtype: check_add_norm_cache checked it
    shape = c.shape
    cdef cnp.ndarray dya
    if (type(dy) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>dy) == dtype.type_num
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>dy) and shape_is(<cnp.ndarray>dy, shape)):
        dya = <cnp.ndarray>dy
    else:
        dya = like_array(dy, "dy", shape, dtype)
    cdef cnp.ndarray dha = None
    if dh is not None:
        dha = partner_of(dh, dya, "dh")
    cdef int nt = threads_of(n_threads)
    cdef tuple inputs = (dya, dha)
    cdef ResidualScale alpha = <ResidualScale>c.alpha
    cdef tuple kept = (c.h, c.x, c.residual, c.weight, alpha.vector, c.mean, c.rstd)
    cdef cnp.ndarray rows = contiguous(dya)
    cdef cnp.ndarray dh_rows = None if dha is None else contiguous(dha)
    cdef cnp.ndarray dx = gradient_buffer(out, "out", dya, inputs, kept)
    cdef cnp.ndarray dres = gradient_buffer(dresidual_out, "dresidual_out", dya, inputs, kept)
    if out is not None and dresidual_out is not None and overlap(out, dresidual_out):
        raise ValueError("out and dresidual_out must not share memory: they receive "
                         "different gradients")
    cdef Py_ssize_t size = cnp.PyArray_SIZE(rows), d = row_size(rows, c.axes), n = size // d
    cdef Py_ssize_t nb = row_blocks(n)
    cdef bint mixed = c.param_dtype is not None
    cdef int typenum = cnp.NPY_FLOAT if mixed else cnp.PyArray_TYPE(rows)
    dweight = None if c.weight is None else new_vector(d, typenum)
    dbias = new_vector(d, typenum) if c.has_bias else None
    dalpha = new_vector(d, cnp.NPY_DOUBLE) if alpha.learns() else None
    nt = team(nt, size)
    cdef bint stream = streams(cnp.PyArray_NBYTES(dx))
    cdef rn_dropout site = kernel_dropout(c.dropout)
    cdef Kind ek = kind_of(rows)
    # a 16-bit weight of many rows: widened to float32 once, for the mixed norm
    cdef bint widen = widens(ek, mixed, n, c.weight is not None)
    cdef Py_ssize_t parts_bytes = 3 * nb * d * sizeof(double)
    cdef Py_ssize_t per_thread = add_norm_backward_scratch(d, &site)
    cdef Py_ssize_t rows_bytes = max(1, nt) * per_thread + 64
    # the widened rows (mixed, per thread), or the widened weight
    cdef Py_ssize_t buf_bytes = (max(1, nt) * backward_floats(d) * 4 if mixed
                                 else d * 4 if widen else 0)
    cdef Scratch scratch = lend(parts_bytes + rows_bytes + buf_bytes)
    cdef double *partials = <double *>scratch.data
    cdef char *rows_scratch = scratch.data + (parts_bytes + 63) // 64 * 64
    cdef float *buf = <float *>(scratch.data + parts_bytes + rows_bytes)
    cdef void *pdx = cnp.PyArray_DATA(dx)
    cdef void *pdres = cnp.PyArray_DATA(dres)
    cdef void *pdw = data_of(dweight)
    cdef void *pdb = data_of(dbias)
    cdef double *pda = <double *>data_of(dalpha)
    cdef void *pdy = cnp.PyArray_DATA(rows)
    cdef void *pdh = data_of(dh_rows)
    cdef void *ph = data_of(c.h)
    cdef void *px = data_of(c.x)
    cdef void *pr = data_of(c.residual)
    cdef void *pw = data_of(c.weight)
    cdef void *pa = data_of(alpha.vector)
    cdef const double *pmean = <const double *>data_of(c.mean)
    cdef const double *prstd = <const double *>data_of(c.rstd)
    saved = release_gil(size)
    if ek == KIND_F32:
        add_norm_backward_rows(<float *>pdx, <float *>pdres, pdw, pdb, pda, partials,
                               rows_scratch, pdy, pdh, ph, px, pr, pw, pa, mixed, widen, pmean,
                               prstd, &site, buf, n, d, nt, stream)
    elif ek == KIND_F64:
        add_norm_backward_rows(<double *>pdx, <double *>pdres, pdw, pdb, pda, partials,
                               rows_scratch, pdy, pdh, ph, px, pr, pw, pa, mixed, widen, pmean,
                               prstd, &site, buf, n, d, nt, stream)
    elif ek == KIND_BF16:
        add_norm_backward_rows(<rn_bf16 *>pdx, <rn_bf16 *>pdres, pdw, pdb, pda, partials,
                               rows_scratch, pdy, pdh, ph, px, pr, pw, pa, mixed, widen, pmean,
                               prstd, &site, buf, n, d, nt, stream)
    else:
        add_norm_backward_rows(<rn_f16 *>pdx, <rn_f16 *>pdres, pdw, pdb, pda, partials,
                               rows_scratch, pdy, pdh, ph, px, pr, pw, pa, mixed, widen, pmean,
                               prstd, &site, buf, n, d, nt, stream)
    take_gil_back(saved)
    scratch.give_back()
    row = None
    if c.axes != 1:   # the parameters' gradients in the normalised axes' shape
        row = c.normalized_shape
        dweight = None if dweight is None else dweight.reshape(row)
        dbias = None if dbias is None else dbias.reshape(row)
    dalpha = None if dalpha is None else alpha.grad(dalpha, dtype, row)
    if layer:
        return finish(out, dx), finish(dresidual_out, dres), dweight, dbias, dalpha
    return finish(out, dx), finish(dresidual_out, dres), dweight, dalpha


def add_rms_norm(x, residual, weight=None, eps=1e-6, *, normalized_shape=None,
                 zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True, out=None,
                 residual_out=None, n_threads=None):
    return add_norm_call(False, True, x, residual, weight, None, eps, normalized_shape,
                         zero_centered_weight, alpha, p, seed, training, out, residual_out,
                         n_threads, False)


def add_rms_norm_forward(x, residual, weight=None, eps=1e-6, *, normalized_shape=None,
                         zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True,
                         out=None, residual_out=None, n_threads=None):
    return add_norm_call(False, True, x, residual, weight, None, eps, normalized_shape,
                         zero_centered_weight, alpha, p, seed, training, out, residual_out,
                         n_threads, True)


def add_rms_norm_backward(dy, dh, cache, *, out=None, dresidual_out=None, n_threads=None):
    return add_norm_backward_call(False, True, dy, dh, cache, out, dresidual_out, n_threads)


def add_layer_norm(x, residual, weight=None, bias=None, eps=1e-5, *, normalized_shape=None,
                   zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True, out=None,
                   residual_out=None, n_threads=None):
    return add_norm_call(True, True, x, residual, weight, bias, eps, normalized_shape,
                         zero_centered_weight, alpha, p, seed, training, out, residual_out,
                         n_threads, False)


def add_layer_norm_forward(x, residual, weight=None, bias=None, eps=1e-5, *, normalized_shape=None,
                           zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True,
                           out=None, residual_out=None, n_threads=None):
    return add_norm_call(True, True, x, residual, weight, bias, eps, normalized_shape,
                         zero_centered_weight, alpha, p, seed, training, out, residual_out,
                         n_threads, True)


def add_layer_norm_backward(dy, dh, cache, *, out=None, dresidual_out=None, n_threads=None):
    return add_norm_backward_call(True, True, dy, dh, cache, out, dresidual_out, n_threads)


def add_rms_norm_post(x, residual, weight=None, eps=1e-6, *, normalized_shape=None,
                      zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True, out=None,
                      n_threads=None):
    return add_norm_call(False, False, x, residual, weight, None, eps, normalized_shape,
                         zero_centered_weight, alpha, p, seed, training, out, None, n_threads,
                         False)


def add_rms_norm_post_forward(x, residual, weight=None, eps=1e-6, *, normalized_shape=None,
                              zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True,
                              out=None, n_threads=None):
    return add_norm_call(False, False, x, residual, weight, None, eps, normalized_shape,
                         zero_centered_weight, alpha, p, seed, training, out, None, n_threads,
                         True)


def add_rms_norm_post_backward(dy, cache, *, out=None, dresidual_out=None, n_threads=None):
    return add_norm_backward_call(False, False, dy, None, cache, out, dresidual_out, n_threads)


def add_layer_norm_post(x, residual, weight=None, bias=None, eps=1e-5, *, normalized_shape=None,
                        zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True,
                        out=None, n_threads=None):
    return add_norm_call(True, False, x, residual, weight, bias, eps, normalized_shape,
                         zero_centered_weight, alpha, p, seed, training, out, None, n_threads,
                         False)


def add_layer_norm_post_forward(x, residual, weight=None, bias=None, eps=1e-5, *,
                                normalized_shape=None, zero_centered_weight=False, alpha=1.0, p=0.0,
                                seed=None, training=True, out=None, n_threads=None):
    return add_norm_call(True, False, x, residual, weight, bias, eps, normalized_shape,
                         zero_centered_weight, alpha, p, seed, training, out, None, n_threads,
                         True)


def add_layer_norm_post_backward(dy, cache, *, out=None, dresidual_out=None, n_threads=None):
    return add_norm_backward_call(True, False, dy, None, cache, out, dresidual_out, n_threads)
