# Every argument check of the public kernel functions, in one place and one error style
# (included by api.pyx).  Errors name the argument and say what was expected: TypeError for
# a wrong kind or dtype, ValueError for a wrong value or shape.  The table of checks is
# docs/input-checks.md.
#
# Each check starts with the case every real call takes (an exact ndarray of the right
# type and layout, a Python float, None), decided with a few C tests, and only then runs the
# general code that converts array-likes and raises.  resnorm._checks gives Python code
# (resnorm.nn, explain) the same functions.

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# The element dtypes of the kernels that also take the 16-bit types: these, np.float16 and
# ml_dtypes.bfloat16 (stored as 16 bits, computed in float32).  bfloat16 is a dtype
# ml_dtypes registers with NumPy; it is recognised by its name and size, so that ml_dtypes
# is never imported here, and its type number is remembered once one array was seen.
HALF_NAMES = "float32, float64, float16 or bfloat16"

# More threads than this is a mistake, and one OpenMP cannot start ends the process
# (libgomp: "Thread creation failed"), so it is refused up front.
MAX_THREADS = 1024

cdef int bf16_typenum = -1  # ml_dtypes.bfloat16's NumPy type number, once seen


cdef inline bint is_float_type(int typenum) noexcept:
    return typenum == cnp.NPY_FLOAT or typenum == cnp.NPY_DOUBLE


cdef inline bint is_half_type(int typenum) noexcept:
    return typenum == cnp.NPY_FLOAT16 or (typenum == bf16_typenum and typenum >= 0)


cdef inline bint is_element_type(int typenum) noexcept:
    return is_float_type(typenum) or is_half_type(typenum)


cpdef bint is_bfloat16(dtype):
    """dtype is ml_dtypes.bfloat16 (told by its name, size and module, without importing
    ml_dtypes)."""
    global bf16_typenum
    if not (isinstance(dtype, np.dtype) and dtype.name == "bfloat16" and dtype.itemsize == 2
            and getattr(dtype.type, "__module__", "").startswith("ml_dtypes")):
        return False
    bf16_typenum = dtype.num
    return True


cpdef bint is_element_dtype(dtype, bint halves=True):
    """dtype is an element dtype of the kernels: float32 or float64, and with halves also
    float16 or ml_dtypes.bfloat16."""
    if dtype in FLOAT_DTYPES:
        return True
    return halves and (dtype == np.dtype(np.float16) or is_bfloat16(dtype))


cdef inline bint native_float_array(object a, bint halves=False) noexcept:
    """a is exactly an ndarray (not a subclass: masked arrays take the general path) of
    float32 or float64 (with halves: also float16, bfloat16) in native byte order."""
    if type(a) is not cnp.ndarray or not cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a):
        return False
    cdef int t = cnp.PyArray_TYPE(<cnp.ndarray>a)
    return is_float_type(t) or (halves and is_half_type(t))


cdef str dtype_text(dt):
    """A dtype as every message spells it: its name (float64), and the byte order when
    that is not the machine's (float32, big-endian '>f4')."""
    if dt.isnative:
        return dt.name
    order = "big" if dt.byteorder == ">" else "little"
    return f"{dt.name}, {order}-endian {dt.str!r}"


cdef converted(a, str name, str wanted):
    """a (not an ndarray) converted by np.asarray, or a TypeError that names the argument and
    what was wanted.  A conversion can fail with any exception: a torch tensor that requires
    grad raises RuntimeError (its values are not to be read outside autograd)."""
    try:
        return np.asarray(a)
    except Exception as e:
        raise TypeError(f"{name} must be {wanted}, got {type(a).__name__} "
                        f"({type(e).__name__}: {e})") from e


cpdef not_masked(a, str name):
    """Masked arrays are refused: the kernels would read the masked values as data."""
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{name} must be a plain ndarray, got a masked array (its mask would "
                        f"be ignored); pass {name}.filled(...) or the unmasked rows")


cpdef cnp.ndarray float_array(x, str name, bint halves=False):
    """x as an ndarray of float32/float64 (with halves: also float16 or
    ml_dtypes.bfloat16) with native byte order and at least one axis.

    Array-likes (lists, tuples) are converted with np.asarray; nothing is cast: integer,
    bool, complex or object data (and without halves float16, bfloat16) is a TypeError.
    """
    cdef int ndim
    if native_float_array(x, halves):
        ndim = cnp.PyArray_NDIM(<cnp.ndarray>x)
        if ndim > 0 and cnp.PyArray_DIM(<cnp.ndarray>x, ndim - 1) > 0:
            return <cnp.ndarray>x
    accepted = HALF_NAMES if halves else "float32 or float64"
    if not isinstance(x, np.ndarray):
        x = converted(x, name, f"a {accepted} array")
    not_masked(x, name)
    if not is_element_dtype(x.dtype, halves):
        raise TypeError(f"{name} must have dtype {accepted}, got {dtype_text(x.dtype)}")
    if not x.dtype.isnative:
        raise TypeError(f"{name} must be in native byte order, got {dtype_text(x.dtype)}")
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (shape (..., D)), got a scalar")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last axis, got shape {x.shape}")
    return x


cdef inline bint same_shape(cnp.ndarray a, cnp.ndarray b) noexcept:
    cdef int k, ndim = cnp.PyArray_NDIM(a)
    if cnp.PyArray_NDIM(b) != ndim:
        return False
    for k in range(ndim):
        if cnp.PyArray_DIM(a, k) != cnp.PyArray_DIM(b, k):
            return False
    return True


cdef inline cnp.ndarray partner_of(a, cnp.ndarray like, str name):
    """a as an array of exactly like's shape and dtype: like_array with like's shape."""
    if (type(a) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.PyArray_TYPE(like)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a) and same_shape(<cnp.ndarray>a, like)):
        return <cnp.ndarray>a
    return like_array(a, name, shape_of(like), like.dtype)


cpdef cnp.ndarray like_array(a, str name, shape, dtype):
    """a as an ndarray with exactly this shape and dtype (the partner of another argument)."""
    if not isinstance(a, np.ndarray):
        a = converted(a, name, f"a {dtype} array of shape {shape}")
    not_masked(a, name)
    if a.dtype != dtype or not a.dtype.isnative:
        raise TypeError(f"{name} must have dtype {dtype} (native byte order), got "
                        f"{dtype_text(a.dtype)}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    return a


cpdef int norm_axes(normalized_shape, tuple shape) except -1:
    """How many trailing axes of an input of this shape a norm normalises together: 1 for
    None (the last axis), else len(normalized_shape), torch's argument: an int or a tuple
    or list of ints, which must be the input's trailing axes ((5, 64) for x of shape
    (..., 5, 64): each row is then the 320 elements of those axes)."""
    if normalized_shape is None:
        return 1
    sizes = normalized_shape
    if not isinstance(sizes, (tuple, list)):
        sizes = (sizes,)
    cdef list ns = []
    for s in sizes:
        if not isinstance(s, numbers.Integral) or isinstance(s, (bool, np.bool_)):
            raise TypeError(f"normalized_shape must be None, an int or a tuple of ints, got "
                            f"{normalized_shape!r}")
        ns.append(int(s))
    if not ns:
        raise ValueError("normalized_shape must name at least one axis, got ()")
    for s in ns:
        if s < 1:
            raise ValueError(f"normalized_shape must have sizes >= 1, got {tuple(ns)}")
    if len(ns) > len(shape) or tuple(shape[len(shape) - len(ns):]) != tuple(ns):
        raise ValueError(f"normalized_shape={tuple(ns)} must be the trailing axes of x, got x "
                         f"of shape {tuple(shape)}")
    return len(ns)


cdef inline object param_of(p, cnp.ndarray x, str name, int k=1, object dtype=None):
    """None, or a parameter (weight, bias) of `dtype` (None: x's) whose shape is x's last k
    axes (the normalised ones), as like_array checks it."""
    cdef int j, ndim = cnp.PyArray_NDIM(x)
    if p is None:
        return None
    cdef int t = cnp.PyArray_TYPE(x) if dtype is None else (<cnp.dtype>dtype).type_num
    cdef bint ok = (type(p) is cnp.ndarray
                    and cnp.PyArray_TYPE(<cnp.ndarray>p) == t
                    and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>p)
                    and cnp.PyArray_NDIM(<cnp.ndarray>p) == k)
    for j in range(k):
        ok = ok and cnp.PyArray_DIM(<cnp.ndarray>p, j) == cnp.PyArray_DIM(x, ndim - k + j)
    if ok:
        return p
    return like_array(p, name, shape_of(x)[ndim - k:], x.dtype if dtype is None else dtype)


cdef object F32 = np.dtype(np.float32)


cdef inline object mixed_params(cnp.ndarray x, weight, bias):
    """float32 when 16-bit x meets a float32 weight or bias (torch's mixed precision: a norm
    module keeps float32 parameters and receives half-precision activations), and then every
    parameter of the norm must be float32; else None (the parameters have x's dtype)."""
    if not is_half_type(cnp.PyArray_TYPE(x)):
        return None
    return F32 if is_f32_param(weight) or is_f32_param(bias) else None


cdef inline bint is_f32_param(p) except -1:
    """p is a float32 array (an ndarray, decided in C, or anything with a float32 dtype)."""
    if p is None:
        return False
    if type(p) is cnp.ndarray:
        return cnp.PyArray_TYPE(<cnp.ndarray>p) == cnp.NPY_FLOAT
    return getattr(p, "dtype", None) == F32


cpdef optional_param(p, str name, d, dtype):
    """None, or a (D,) vector of the input's dtype (weight, bias)."""
    if p is None:
        return None
    return like_array(p, name, (d,), dtype)


cpdef double eps_value(eps, dtype=None) except -1.0:
    """eps as a float: a real number, finite and > 0.  With the dtype of a norm's input, also
    at least that dtype's smallest normal number (float32: 1.2e-38), so that
    rstd <= 1/sqrt(eps) fits the dtype even for an all-zero row (the 16-bit types: float32's,
    the type they are computed in)."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    eps = float(eps)
    if not (math.isfinite(eps) and eps > 0.0):
        raise ValueError(f"eps must be finite and > 0, got {eps!r}")
    if dtype is None:
        return eps
    dtype = np.dtype(dtype)
    # the 16-bit types are computed in float32: rstd must fit float32
    computed = np.dtype(np.float32) if dtype.itemsize == 2 else dtype
    tiny = float(np.finfo(computed).tiny)
    if eps < tiny:
        raise ValueError(f"eps must be >= {tiny:.4g} (the smallest normal {computed}) "
                         f"for {dtype} input, got {eps!r}")
    return eps


cdef inline double eps_of(eps, cnp.ndarray x) except -1.0:
    """eps_value(eps, x.dtype), deciding a Python float at once."""
    cdef double e
    if type(eps) is float:
        e = <double>eps
        if isfinite(e) and e >= (DBL_MIN if cnp.PyArray_TYPE(x) == cnp.NPY_DOUBLE else FLT_MIN):
            return e
    return eps_value(eps, x.dtype)


cpdef n_threads_value(n_threads):
    """None (the OpenMP default), -1 (every core) or an int in [1, MAX_THREADS] (a count
    above OVERSUBSCRIBE per core runs on that many: launch.pxi's team)."""
    if n_threads is None:
        return None
    if isinstance(n_threads, (bool, np.bool_)) or not isinstance(n_threads, numbers.Integral):
        raise TypeError(f"n_threads must be None, -1 or an int >= 1, got "
                        f"{type(n_threads).__name__}")
    if not (n_threads == -1 or 1 <= n_threads <= MAX_THREADS):
        cores = rn_cores()
        raise ValueError(f"n_threads must be None (the default), -1 (all {cores} cores of "
                         f"this machine) or an int from 1 to {MAX_THREADS} (more than "
                         f"{OVERSUBSCRIBE * cores} run on {OVERSUBSCRIBE * cores} threads), "
                         f"got {n_threads}")
    return int(n_threads)


cdef inline int threads_of(n_threads) except -2:
    """n_threads_value(n_threads) as a C int: 0 for None (the OpenMP default), -1 for every
    core."""
    if n_threads is None:
        return 0
    # compared as Python ints: a C cast would overflow on 2**70
    if type(n_threads) is int and -1 <= n_threads <= MAX_THREADS and n_threads != 0:
        return <int>n_threads
    return <int>n_threads_value(n_threads)


cpdef bint same_memory(a, b):
    """True when a and b are views of exactly the same elements in the same layout."""
    return (a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


cpdef out_array(out, shape, dtype, dict inputs, str name="out"):
    """The caller's output buffer: a writeable ndarray of this shape and dtype.

    It may be exactly one of the inputs (same memory, same strides: an in-place call), but it
    must not otherwise overlap any of them, as a partial overlap would be read after written.
    """
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
    if isinstance(out, np.ma.MaskedArray):
        raise TypeError(f"{name} must be a plain ndarray, got a masked array (the kernels "
                        f"would write under its mask)")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {dtype_text(out.dtype)}")
    if out.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable, got a read-only array")
    for input_name, a in inputs.items():
        if a is not None and overlap(out, a) and not same_memory(out, a):
            # the rule compares memory bounds: interleaved views (x[:, ::2] and x[:, 1::2])
            # share no element, yet are refused as well
            raise ValueError(f"{name} may overlap {input_name} (their memory bounds meet) "
                             f"without being the same array; pass {name}={input_name} for an "
                             f"in-place call, or a separate buffer")
    return out


cdef inline bint same_view(cnp.ndarray a, cnp.ndarray b) noexcept:
    """same_memory for two ndarrays, decided in C."""
    cdef int k
    if cnp.PyArray_DATA(a) != cnp.PyArray_DATA(b) or not same_shape(a, b):
        return False
    for k in range(cnp.PyArray_NDIM(a)):
        if cnp.PyArray_STRIDE(a, k) != cnp.PyArray_STRIDE(b, k):
            return False
    return True


cdef inline check_out(out, cnp.ndarray like, tuple names, tuple inputs, str name):
    """out_array(out, shape_of(like), like.dtype, dict(zip(names, inputs)), name), decided in C
    for an ndarray that passes (the general code runs, and raises, for anything else)."""
    cdef Py_ssize_t k
    cdef char *olo = NULL   # (set when ok; NULL keeps GCC from warning it may not be)
    cdef char *ohi = NULL
    cdef char *alo
    cdef char *ahi
    cdef bint ok = (type(out) is cnp.ndarray
                    and cnp.PyArray_TYPE(<cnp.ndarray>out) == cnp.PyArray_TYPE(like)
                    and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>out)
                    and same_shape(<cnp.ndarray>out, like)
                    and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>out))
    if ok:   # out's bounds once, for every input
        extents(<cnp.ndarray>out, &olo, &ohi)
    for k in range(len(inputs)):
        if not ok:
            break
        a = inputs[k]
        if a is not None:
            ok = type(a) is cnp.ndarray
            if ok:
                extents(<cnp.ndarray>a, &alo, &ahi)
                ok = (not spans_meet(olo, ohi, alo, ahi)
                      or same_view(<cnp.ndarray>out, <cnp.ndarray>a))
    if not ok:
        out_array(out, shape_of(like), like.dtype, dict(zip(names, inputs)), name)


cdef inline bint is_rows(a, Py_ssize_t n, Py_ssize_t d, int typenum) noexcept:
    """a is exactly an (n, d) array of this type in the kernels' layout."""
    return (type(a) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>a) == typenum
            and cnp.PyArray_NDIM(<cnp.ndarray>a) == 2 and cnp.PyArray_DIM(<cnp.ndarray>a, 0) == n
            and cnp.PyArray_DIM(<cnp.ndarray>a, 1) == d and kernel_layout(<cnp.ndarray>a))


cdef inline bint is_vector(a, Py_ssize_t d, int typenum) noexcept:
    return (type(a) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>a) == typenum
            and cnp.PyArray_NDIM(<cnp.ndarray>a) == 1 and cnp.PyArray_DIM(<cnp.ndarray>a, 0) == d
            and kernel_layout(<cnp.ndarray>a))


cdef inline bint shape_ok(shape, axes, Py_ssize_t *n, Py_ssize_t *d) noexcept:
    """shape is a tuple of ints >= 0 with at least one axis, and axes an int in [1,
    len(shape)]; n, d: its rows and row length (a row spans the last `axes` axes)."""
    cdef Py_ssize_t prod = 1, row = 1, j = 0
    if type(shape) is not tuple or len(<tuple>shape) < 1:
        return False
    if type(axes) is not int or not 1 <= axes <= len(<tuple>shape):
        return False
    for s in <tuple>shape:
        if type(s) is not int or s < 0 or s > (1 << 40):
            return False
        prod *= <Py_ssize_t>s
        if j >= len(<tuple>shape) - <Py_ssize_t>axes:
            row *= <Py_ssize_t>s
        j += 1
    d[0] = row
    n[0] = prod // row if row > 0 else 0
    return True


cdef enum Layout:    # how an array a cache keeps is shaped (cache_field)
    ROWS        # (n, d) of the cache's dtype
    VECTOR      # (d,) of the cache's dtype
    STATS       # (n,) float64: row statistics
    VECTOR64    # (d,) float64


cdef inline bint cache_rows(shape, dtype, axes, Py_ssize_t *n, Py_ssize_t *d,
                            int *typenum) noexcept:
    """The shape (a tuple of ints), dtype (an element dtype) and axes a residual or dropout
    cache keeps of its forward input; its n rows of d and its type number through the
    pointers (a row spans the last `axes` axes of shape)."""
    if not (shape_ok(shape, axes, n, d) and cnp.PyArray_DescrCheck(dtype)
            and is_element_type((<cnp.dtype>dtype).type_num)):
        return False
    typenum[0] = (<cnp.dtype>dtype).type_num
    return True


cdef inline int param_type(param_dtype, int typenum) noexcept:
    """The type number of a cache's parameters beside rows of typenum: typenum (param_dtype
    None), float32 (param_dtype float32 beside 16-bit rows), else -1 (an edited cache)."""
    if param_dtype is None:
        return typenum
    if (is_half_type(typenum) and cnp.PyArray_DescrCheck(param_dtype)
            and (<cnp.dtype>param_dtype).type_num == cnp.NPY_FLOAT):
        return cnp.NPY_FLOAT
    return -1


cdef inline bint cache_field(a, Layout layout, bint required, Py_ssize_t n, Py_ssize_t d,
                             int typenum) noexcept:
    """An array a cache keeps, for a kernel that trusts its shape: None where not required,
    else exactly an ndarray of this layout in the kernels' memory layout."""
    if a is None:
        return not required
    if layout == ROWS:
        return is_rows(a, n, d, typenum)
    if layout == VECTOR:
        return is_vector(a, d, typenum)
    return is_vector(a, n if layout == STATS else d, cnp.NPY_DOUBLE)


cdef ValueError edited_cache(cache):
    """What a backward raises for a cache whose fields fail shape_ok / cache_rows /
    cache_field: the kernels trust them, so an edited cache could read out of bounds."""
    return ValueError(f"cache is not as the forward function returned it: its fields "
                      f"have inconsistent shapes, dtypes, layouts or values "
                      f"({type(cache).__name__} must not be built or edited by hand)")


# --------------------------------------------------------------------------- residual, dropout

cpdef bint flag(value, str name) except -1:
    """A bool (Python or NumPy)."""
    if value is True or value is False:
        return value
    if type(value) is not bool and not isinstance(value, np.bool_):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


cpdef double probability(p, str name="p") except -1.0:
    """A dropout probability: a real number in [0, 1]."""
    if type(p) is float and 0.0 <= <double>p <= 1.0:
        return <double>p
    if type(p) is not float and (isinstance(p, (bool, np.bool_))
                                 or not isinstance(p, numbers.Real)):
        raise TypeError(f"{name} must be a real number in [0, 1], got {type(p).__name__}")
    p = float(p)
    if not 0.0 <= p <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {p!r}")
    return p


cpdef object seed_value(seed):
    """A dropout seed: an int in [0, 2**64) (the 64-bit Philox key)."""
    cdef unsigned long long key
    if type(seed) is int:   # decided in C: the conversion raises outside [0, 2**64)
        try:
            key = seed
        except OverflowError:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}") from None
        return seed
    if type(seed) is not int and (isinstance(seed, (bool, np.bool_))
                                  or not isinstance(seed, numbers.Integral)):
        raise TypeError(f"seed must be an int in [0, 2**64), got {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return seed


cpdef tuple residual_scale(alpha, d, dtype, str name="alpha"):
    """A residual scale: ('fixed', float) for a real number (not learnable), ('scalar', 0-d
    array) for a learnable scalar, ('channel', (D,) array) for a learnable per-channel
    vector (LayerScale).  Arrays must have the input's dtype.  d: D, or the shape of a
    normalised row (a fused add + norm over several axes), which a vector must have."""
    cdef tuple shape = d if type(d) is tuple else (d,)
    if type(alpha) is float or (isinstance(alpha, numbers.Real) and not isinstance(
            alpha, (bool, np.bool_, np.ndarray))):
        alpha = float(alpha)
        if not math.isfinite(alpha):
            raise ValueError(f"{name} must be finite, got {alpha!r}")
        return "fixed", alpha
    if not isinstance(alpha, np.ndarray):
        raise TypeError(f"{name} must be a real number, or a {dtype} array of shape () or "
                        f"{shape}, got {type(alpha).__name__}")
    not_masked(alpha, name)
    if alpha.dtype != dtype or not alpha.dtype.isnative:
        raise TypeError(f"{name} must have dtype {dtype} (the input's), got "
                        f"{dtype_text(alpha.dtype)}")
    if alpha.shape == ():
        return "scalar", alpha
    if alpha.shape == shape:
        return "channel", alpha
    raise ValueError(f"{name} must have shape () (learnable scalar) or {shape} (per channel), "
                     f"got {alpha.shape}")


cpdef cnp.ndarray gate_array(g, shape, dtype, str name="g"):
    """Gate logits: an array of the branch's shape, or a (D,) per-channel vector."""
    d = shape[-1]
    if (type(g) is cnp.ndarray and cnp.PyArray_DescrCheck(dtype)
            and cnp.PyArray_TYPE(<cnp.ndarray>g) == (<cnp.dtype>dtype).type_num
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>g)
            and (shape_is(<cnp.ndarray>g, shape) or shape_is(<cnp.ndarray>g, (d,)))):
        return <cnp.ndarray>g   # (what like_array returns for these, decided in C)
    if np.shape(g) == (d,):
        return like_array(g, name, (d,), dtype)
    try:
        return like_array(g, name, shape, dtype)
    except ValueError:
        raise ValueError(f"{name} must have the shape of F {tuple(shape)} or ({d},) "
                         f"(per channel), got {np.shape(g)}") from None
