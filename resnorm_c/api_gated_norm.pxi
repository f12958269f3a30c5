# The gated RMSNorm (included by api.pyx after api_elementwise.pxi, whose gradient buffers
# it shares): y = rms_norm(x * silu(gate)) * w, or rms_norm(x) * w * silu(gate), per group of
# group_size elements of the last axis (gated_norm_kernels.pxd).

cdef tuple GATED_NORM_INPUTS = ("x", "gate", "weight")
cdef tuple GATED_NORM_BUFFERS = ("out", "dgate_out")
cdef tuple GATED_NORM_KEPT = ("x", "gate", "weight", "rstd")


cdef inline Py_ssize_t group_size_of(group_size, Py_ssize_t d) except -1:
    """The elements per group: d for None, else a positive int that divides d."""
    if group_size is None:
        return d
    if isinstance(group_size, (bool, np.bool_)) or not isinstance(group_size, numbers.Integral):
        raise TypeError(f"group_size must be None or an int, got {type(group_size).__name__}")
    if not 1 <= group_size <= d or d % group_size:
        raise ValueError(f"group_size must be a positive divisor of x's last axis ({d}), got "
                         f"{int(group_size)}")
    return group_size


cdef inline Py_ssize_t lined(Py_ssize_t nbytes) noexcept:
    """nbytes rounded up to a cache line: each scratch region starts aligned (the double
    rows after the float weight too)."""
    return (nbytes + 63) & ~(<Py_ssize_t>63)


cdef inline Py_ssize_t compute_bytes(Kind ek) noexcept:
    """The size of the type the gated norm computes rows of kind ek in."""
    return sizeof(double) if ek == KIND_F64 else sizeof(float)


cdef inline const void *compute_weight(Kind ek, w, bint mixed, void *buf,
                                       Py_ssize_t d) noexcept:
    """The weight as the kernels read it: w's data, or in buf (d elements of the compute
    type) a 16-bit w widened, or ones for no weight (the backward's loops take a weight
    always: one form of each, which the compiler vectorises)."""
    cdef const void *pw = data_of(w)
    cdef Py_ssize_t i
    if pw == NULL:
        for i in range(d):
            if ek == KIND_F64:
                (<double *>buf)[i] = 1.0
            else:
                (<float *>buf)[i] = 1.0
        return buf
    if mixed or ek == KIND_F32 or ek == KIND_F64:
        return pw
    if ek == KIND_BF16:
        rn_to_float32(<float *>buf, <const rn_bf16 *>pw, d)
    else:
        rn_to_float32(<float *>buf, <const rn_f16 *>pw, d)
    return buf


cdef object gated_norm_call(x, gate, weight, eps, group_size, norm_before_gate, out, n_threads,
                            bint training):
    """gated_rms_norm, and with training gated_rms_norm_forward (returning a cache)."""
    cdef cnp.ndarray xa = float_array(x, "x", True)
    cdef cnp.ndarray za = None if gate is None else partner_of(gate, xa, "gate")
    pdt = mixed_params(xa, weight, None)
    wp = param_of(weight, xa, "weight", 1, pdt)
    cdef double e = eps_of(eps, xa)
    cdef Py_ssize_t d = row_length(xa)
    cdef Py_ssize_t gs = group_size_of(group_size, d)
    cdef bint norm_first = flag(norm_before_gate, "norm_before_gate")
    cdef int nt = threads_of(n_threads)
    cdef tuple inputs = (xa, za, wp)
    if training:
        not_shared(out, "out", GATED_NORM_INPUTS, inputs, TRAINING_OUT)
    w = vector_of(wp)
    cdef cnp.ndarray rows = contiguous(xa)
    cdef cnp.ndarray zrows = None if za is None else contiguous(za)
    cdef cnp.ndarray y = new_like(xa) if out is None else None
    if y is None:
        check_out(out, xa, GATED_NORM_INPUTS, inputs, "out")
        y = <cnp.ndarray>out if kernel_layout(<cnp.ndarray>out) else new_like(xa)
    cdef Py_ssize_t size = cnp.PyArray_SIZE(rows), n = size // d
    nt = team(nt, size)
    cdef bint stream = streams_over(y, None, rows, zrows)
    cdef Kind ek = kind_of(rows)
    cdef Py_ssize_t nstats = n * (d // gs)
    cdef cnp.ndarray rstd = new_stats(nstats) if training else None
    # scratch: the statistics (inference), the widened weight, the threads' rows
    cdef Py_ssize_t stats_bytes = 0 if training else lined(nstats * sizeof(double))
    cdef Py_ssize_t weight_bytes = lined(d * sizeof(float))
    cdef Py_ssize_t rows_bytes = nt * gated_norm_forward_floats(d) * compute_bytes(ek)
    cdef Scratch scratch = lend(stats_bytes + weight_bytes + rows_bytes)
    cdef double *prstd = (<double *>cnp.PyArray_DATA(rstd) if training
                          else <double *>scratch.data)
    cdef void *wbuf = scratch.data + stats_bytes
    cdef void *work = scratch.data + stats_bytes + weight_bytes
    cdef void *py = cnp.PyArray_DATA(y)
    cdef void *px = cnp.PyArray_DATA(rows)
    cdef void *pz = data_of(zrows)
    cdef const void *pw = NULL   # no weight: NULL, which the forward's apply pass takes as 1
    if w is not None:
        pw = compute_weight(ek, w, pdt is not None, wbuf, d)
    saved = release_gil(size)
    if ek == KIND_F32:
        gated_norm_forward(<float *>py, prstd, <const float *>px, <const float *>pz, pw, work,
                           n, d, gs, e, norm_first, nt, stream)
    elif ek == KIND_F64:
        gated_norm_forward(<double *>py, prstd, <const double *>px, <const double *>pz, pw,
                           work, n, d, gs, e, norm_first, nt, stream)
    elif ek == KIND_BF16:
        gated_norm_forward(<rn_bf16 *>py, prstd, <const rn_bf16 *>px, <const rn_bf16 *>pz, pw,
                           work, n, d, gs, e, norm_first, nt, stream)
    else:
        gated_norm_forward(<rn_f16 *>py, prstd, <const rn_f16 *>px, <const rn_f16 *>pz, pw,
                           work, n, d, gs, e, norm_first, nt, stream)
    take_gil_back(saved)
    scratch.give_back()
    result = finish(out, y)
    if not training:
        return result
    return result, gated_rms_norm_cache(as_rows(rows), None if zrows is None else as_rows(zrows),
                                        w, rstd, gs, norm_first, shape_of(xa), pdt)


def gated_rms_norm(x, gate=None, weight=None, eps=1e-6, *, group_size=None,
                   norm_before_gate=False, out=None, n_threads=None):
    return gated_norm_call(x, gate, weight, eps, group_size, norm_before_gate, out, n_threads,
                           False)


def gated_rms_norm_forward(x, gate=None, weight=None, eps=1e-6, *, group_size=None,
                           norm_before_gate=False, out=None, n_threads=None):
    return gated_norm_call(x, gate, weight, eps, group_size, norm_before_gate, out, n_threads,
                           True)


def gated_rms_norm_backward(dy, cache, *, out=None, dgate_out=None, n_threads=None):
    elementwise_cache_type(cache, GatedRMSNormCache, "gated_rms_norm_forward")
    cdef GatedRMSNormCache c = <GatedRMSNormCache>cache
    cdef Py_ssize_t n = 0, d = 0, gs = 0
    cdef int t = -1, pt = -1
    if type(c.x) is cnp.ndarray and is_element_type(cnp.PyArray_TYPE(<cnp.ndarray>c.x)):
        t = cnp.PyArray_TYPE(<cnp.ndarray>c.x)
        pt = param_type(c.param_dtype, t)
    if not (t != -1 and pt != -1 and shape_ok(c.shape, 1, &n, &d)
            and type(c.group_size) is int and 1 <= <object>c.group_size <= d
            and d % <Py_ssize_t>c.group_size == 0 and type(c.norm_before_gate) is bool
            and cache_field(c.x, ROWS, True, n, d, t)
            and cache_field(c.gate, ROWS, False, n, d, t)
            and cache_field(c.weight, VECTOR, False, n, d, pt)
            and is_vector(c.rstd, n * (d // <Py_ssize_t>c.group_size), cnp.NPY_DOUBLE)):
        raise edited_cache(c)
    gs = <Py_ssize_t>c.group_size
    cdef bint gated = c.gate is not None
    if dgate_out is not None and not gated:
        raise ValueError("dgate_out must be None: the forward call had no gate")
    cdef cnp.ndarray xa = <cnp.ndarray>c.x
    cdef cnp.ndarray dya = gradient_like(dy, "dy", xa.dtype, c.shape)
    cdef int nt = 1
    cdef cnp.ndarray rows = backward_rows(dya, n_threads, &nt, &n, &d)
    cdef tuple kept = (c.x, c.gate, c.weight, c.rstd)
    cdef cnp.ndarray dx = elementwise_gradient(out, "out", dya, dya, GATED_NORM_KEPT, kept)
    cdef cnp.ndarray dz = (elementwise_gradient(dgate_out, "dgate_out", dya, dya,
                                                GATED_NORM_KEPT, kept) if gated else None)
    apart((out, dgate_out), GATED_NORM_BUFFERS)
    dw = None if c.weight is None else new_vector(d, pt)
    cdef Kind ek = kind_of(rows)
    # the dweight partial rows (computed even without a weight: one form of the loops)
    cdef Py_ssize_t part_bytes = lined(row_blocks(n) * d * sizeof(double))
    cdef Py_ssize_t weight_bytes = lined(d * compute_bytes(ek))
    cdef Py_ssize_t rows_bytes = nt * gated_norm_backward_floats(d) * compute_bytes(ek)
    cdef Scratch scratch = lend(part_bytes + weight_bytes + rows_bytes)
    cdef double *parts = <double *>scratch.data
    cdef void *wbuf = scratch.data + part_bytes
    cdef void *work = scratch.data + part_bytes + weight_bytes
    cdef void *pdx = cnp.PyArray_DATA(dx)
    cdef void *pdz = data_of(dz)
    cdef void *pdy = cnp.PyArray_DATA(rows)
    cdef void *px = cnp.PyArray_DATA(xa)
    cdef void *pz = data_of(c.gate)
    cdef const double *prstd = <const double *>cnp.PyArray_DATA(<cnp.ndarray>c.rstd)
    cdef void *pdw = data_of(dw)
    cdef bint norm_first = c.norm_before_gate
    cdef const void *pw = compute_weight(ek, c.weight, pt == cnp.NPY_FLOAT and ek != KIND_F32,
                                         wbuf, d)
    saved = release_gil(n * d)
    if ek == KIND_F32:
        gated_norm_backward(<float *>pdx, <float *>pdz, parts, <const float *>pdy,
                            <const float *>px, <const float *>pz, pw, prstd, work, n, d, gs,
                            norm_first, nt)
    elif ek == KIND_F64:
        gated_norm_backward(<double *>pdx, <double *>pdz, parts, <const double *>pdy,
                            <const double *>px, <const double *>pz, pw, prstd, work, n, d, gs,
                            norm_first, nt)
    elif ek == KIND_BF16:
        gated_norm_backward(<rn_bf16 *>pdx, <rn_bf16 *>pdz, parts, <const rn_bf16 *>pdy,
                            <const rn_bf16 *>px, <const rn_bf16 *>pz, pw, prstd, work, n, d,
                            gs, norm_first, nt)
    else:
        gated_norm_backward(<rn_f16 *>pdx, <rn_f16 *>pdz, parts, <const rn_f16 *>pdy,
                            <const rn_f16 *>px, <const rn_f16 *>pz, pw, prstd, work, n, d, gs,
                            norm_first, nt)
    # dweight: the partial rows' sum, in the weight's dtype
    if pdw != NULL:
        if pt == cnp.NPY_FLOAT:
            gated_norm_dweight(<float *>pdw, parts, n, d, nt)
        elif pt == cnp.NPY_DOUBLE:
            gated_norm_dweight(<double *>pdw, parts, n, d, nt)
        elif ek == KIND_BF16:
            gated_norm_dweight(<rn_bf16 *>pdw, parts, n, d, nt)
        else:
            gated_norm_dweight(<rn_f16 *>pdw, parts, n, d, nt)
    take_gil_back(saved)
    scratch.give_back()
    return finish(out, dx), None if dz is None else finish(dgate_out, dz), dw
