# What the training forms keep for backward (included by api.pyx).  Frozen dataclasses
# (dataclasses.fields and dataclasses.replace work on them), compiled.  The call path builds
# each through the cdef constructor beside it (the type's __new__, then its fields set in
# C): a training call builds its cache every time, and the dataclass's __init__ parses its
# arguments as a Python call would, a visible part of a small call's time.
# Caches hold references, not copies: do not modify the arrays they hold between forward
# and backward.


# The norms' caches hold rows of D elements: D is the size of the last axis, or of the last
# `axes` axes together (normalized_shape = shape[-axes:]).  `weight` is the gain the kernel
# applied, as a (D,) vector: the weight itself, or 1 + weight for a zero-centred weight
# (whose gradient is the same sum, dy * xhat over rows).  `param_dtype` is float32 when
# 16-bit rows met float32 parameters (mixed_kernels.pxd): then dweight and dbias are float32;
# None: they have x's dtype.

@cython.dataclasses.dataclass(frozen=True)
cdef class RMSNormCache:
    """What rms_norm_backward needs: the input rows and their rstd."""
    x: object       # (N, D) the rows the kernel read
    weight: object  # (D,) the gain applied, or None
    rstd: object    # (N,) float64, 1/sqrt(mean(x^2) + eps)
    shape: object   # shape of the original input, given back to dx
    axes: object = 1  # how many trailing axes of shape a row spans
    param_dtype: object = None  # float32 for float32 parameters beside 16-bit rows

    @property
    def normalized_shape(self):
        """The normalised axes' sizes: dweight's shape."""
        return tuple(self.shape[len(self.shape) - self.axes:])


cdef RMSNormCache rms_norm_cache(x, weight, rstd, shape, axes, param_dtype):
    """RMSNormCache(x, weight, rstd, shape, axes, param_dtype), built in C."""
    cdef RMSNormCache c = RMSNormCache.__new__(RMSNormCache)
    c.x, c.weight, c.rstd, c.shape, c.axes = x, weight, rstd, shape, axes
    c.param_dtype = param_dtype
    return c


@cython.dataclasses.dataclass(frozen=True)
cdef class LayerNormCache:
    """What layer_norm_backward needs: the input rows, their mean and rstd."""
    x: object         # (N, D)
    weight: object    # (D,) the gain applied, or None
    has_bias: object  # whether a dbias is wanted
    mean: object      # (N,) float64
    rstd: object      # (N,) float64, 1/sqrt(var + eps)
    shape: object
    axes: object = 1
    param_dtype: object = None

    @property
    def normalized_shape(self):
        """The normalised axes' sizes: dweight's and dbias's shape."""
        return tuple(self.shape[len(self.shape) - self.axes:])


cdef LayerNormCache layer_norm_cache(x, weight, has_bias, mean, rstd, shape, axes,
                                     param_dtype):
    """LayerNormCache(x, weight, has_bias, mean, rstd, shape, axes, param_dtype), built in
    C."""
    cdef LayerNormCache c = LayerNormCache.__new__(LayerNormCache)
    c.x, c.weight, c.has_bias, c.mean, c.rstd = x, weight, has_bias, mean, rstd
    c.shape, c.axes, c.param_dtype = shape, axes, param_dtype
    return c


@cython.dataclasses.dataclass(frozen=True)
cdef class DropoutSpec:
    """One dropout site: the probability p, the seed, and whether the call is training."""
    p: object
    seed: object
    training: object

    @property
    def active(self):
        """False for eval mode and for p = 0: then dropout is exactly the identity."""
        return self.training and self.p > 0.0

    @property
    def threshold(self):
        """Elements whose uniform is below this are dropped (drop_threshold)."""
        return drop_threshold(self.p)

    @property
    def scale(self):
        """The multiplier of kept elements (keep_scale)."""
        return keep_scale(self.p)

    def kernel_arg(self):
        """The site as the kernels of resnorm._layers take it: the fields of rn_dropout
        (on, seed, threshold, scale) as a dict; off when the spec is inactive."""
        return kernel_dropout(self)

    def mask(self, shape, n_threads=None):
        """The boolean keep-mask of an array of this shape (what the kernels apply)."""
        cdef rn_dropout site = kernel_dropout(self)
        cdef cnp.ndarray keep
        if not self.active:
            return np.ones(shape, dtype=bool)
        if self.p == 1.0:
            return np.zeros(shape, dtype=bool)
        keep = np.empty(int(np.prod(shape)), dtype=np.uint8)
        cdef Py_ssize_t n = keep.shape[0]
        cdef int nt = team(threads_of(n_threads), n)
        saved = release_gil(n)
        dropout_mask(<uint8_t *>cnp.PyArray_DATA(keep), &site, n, nt)
        take_gil_back(saved)
        return keep.view(bool).reshape(shape)


cdef inline uint32_t drop_threshold(double p) noexcept:
    """Elements whose uniform is below this are dropped: floor(p * 2**32), exact in double.
    For p = 1 (all dropped) the multiplier is 0 instead: 2**32 would not fit."""
    return 0xFFFFFFFF if p == 1.0 else <uint32_t>(p * 4294967296.0)


cdef inline double keep_scale(double p) noexcept:
    """The multiplier of kept elements, 1/(1-p); 0 for p = 1."""
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)


cdef inline rn_dropout site_of(double p, seed, bint training) except *:
    """A checked site as the kernels take it: off in eval mode and for p = 0."""
    cdef rn_dropout site
    site.on = training and p > 0.0
    site.seed = seed if site.on else 0
    site.threshold = drop_threshold(p) if site.on else 0
    site.scale = keep_scale(p) if site.on else 1.0
    return site


cdef object site_seed(seed, double p, bint training):
    """The checked seed of a dropout site.  None is taken only where no mask is drawn
    (p = 0, eval mode): a default seed would drop the same elements on every call."""
    if seed is not None:
        return seed_value(seed)
    if training and p > 0.0:
        raise TypeError("seed is required when p > 0 in training: the dropout mask is a "
                        "function of (seed, element index), so one seed drops the same "
                        "elements on every call; pass a fresh seed per step and layer")
    return 0


cdef inline rn_dropout dropout_site(p, seed, training) except *:
    """Checks p, seed and training (as dropout_spec does); returns their site."""
    cdef double q = probability(p)
    cdef bint on = flag(training, "training")
    return site_of(q, site_seed(seed, q, on), on)


cdef rn_dropout kernel_dropout(DropoutSpec spec) except *:
    """The dropout site of a spec as the kernels take it."""
    return site_of(spec.p, spec.seed, spec.training)


cpdef DropoutSpec dropout_spec(p, seed, training):
    """Checks p, seed and training; returns their DropoutSpec (built without a call of
    the dataclass's __init__: a training forward makes one every call)."""
    cdef DropoutSpec spec = DropoutSpec.__new__(DropoutSpec)
    spec.p = probability(p)
    spec.training = flag(training, "training")
    spec.seed = site_seed(seed, spec.p, spec.training)
    return spec


cpdef bint valid_spec(spec) noexcept:
    """True for a DropoutSpec as dropout_spec makes it (caches keep one)."""
    if type(spec) is not DropoutSpec:
        return False
    cdef DropoutSpec s = <DropoutSpec>spec
    return (type(s.p) is float and 0.0 <= <double>s.p <= 1.0 and type(s.seed) is int
            and 0 <= s.seed < (1 << 64) and (s.training is True or s.training is False))


@cython.dataclasses.dataclass(frozen=True)
cdef class DropoutCache:
    """What dropout_backward needs: the site (p, seed) and the shape, never the mask."""
    spec: object
    shape: object
    dtype: object
    mask: object  # bool keep-mask, only with return_mask=True


cdef DropoutCache dropout_cache(spec, shape, dtype, mask):
    """DropoutCache(spec, shape, dtype, mask), built in C."""
    cdef DropoutCache c = DropoutCache.__new__(DropoutCache)
    c.spec, c.shape, c.dtype, c.mask = spec, shape, dtype, mask
    return c


@cython.dataclasses.dataclass(frozen=True)
cdef class ResidualScale:
    """alpha as the kernels see it, and how its gradient is shaped."""
    kind: object    # 'fixed' (no gradient), 'scalar' (shape ()), 'channel' (D,)
    vector: object  # (D,) of the input dtype; None when alpha is a fixed 1

    @property
    def learnable(self):
        return self.learns()

    cdef bint learns(self):
        """alpha has a gradient: its kind is 'scalar' or 'channel'."""
        return self.kind != "fixed"

    cdef object grad(self, cnp.ndarray per_channel, dtype, shape=None):
        """dalpha from the kernels' float64 per-channel sums (a fresh array), rounded once
        to dtype: None, a 0-d array, or (D,) (of `shape`, a normalised row's, when given)."""
        if self.kind == "fixed":
            return None
        if self.kind == "scalar":
            return np.asarray(per_channel.sum(), dtype=dtype)
        cdef cnp.ndarray grad = per_channel
        cdef Py_ssize_t d = cnp.PyArray_DIM(per_channel, 0)
        if dtype.num == cnp.NPY_FLOAT:   # (float64 is the sums themselves)
            grad = new_vector(d, cnp.NPY_FLOAT)
            rn_narrow(<float *>cnp.PyArray_DATA(grad),
                      <const double *>cnp.PyArray_DATA(per_channel), d)
        elif dtype.num != cnp.NPY_DOUBLE:
            grad = per_channel.astype(dtype)
        return grad if shape is None else grad.reshape(shape)


cdef ResidualScale new_scale(kind, vector):
    """ResidualScale(kind, vector), built in C."""
    cdef ResidualScale c = ResidualScale.__new__(ResidualScale)
    c.kind, c.vector = kind, vector
    return c


cdef ResidualScale UNIT_SCALE = new_scale("fixed", None)


cdef ResidualScale residual_scale_of(alpha, cnp.ndarray x, int k=1):
    """alpha checked (residual_scale) and as the kernels take it: a (D,) vector of x's
    dtype, or None for a fixed 1.  k: the rows span x's last k axes (a vector has their
    shape)."""
    if type(alpha) is float and <double>alpha == 1.0:
        return UNIT_SCALE
    cdef Py_ssize_t d1
    if k == 1 and cnp.PyArray_NDIM(x) >= 1:
        # the common forms, decided in C: what residual_scale would return for them
        d1 = cnp.PyArray_DIM(x, cnp.PyArray_NDIM(x) - 1)
        if type(alpha) is float and isfinite(<double>alpha):
            return new_scale("fixed", filled(<double>alpha, d1, x.descr))
        if (type(alpha) is cnp.ndarray
                and cnp.PyArray_TYPE(<cnp.ndarray>alpha) == cnp.PyArray_TYPE(x)
                and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>alpha)
                and cnp.PyArray_NDIM(<cnp.ndarray>alpha) == 1
                and cnp.PyArray_DIM(<cnp.ndarray>alpha, 0) == d1
                and kernel_layout(<cnp.ndarray>alpha)):
            return new_scale("channel", alpha)
    cdef tuple row = shape_of(x)[x.ndim - k:]
    cdef Py_ssize_t d = math.prod(row)
    kind, value = residual_scale(alpha, row if k > 1 else d, x.descr)
    if kind == "fixed":
        vector = None if value == 1.0 else filled(value, d, x.descr)
    elif kind == "scalar":
        # (a 0-d array of an element dtype: exact as a double)
        vector = filled(float(value[()]), d, x.descr)
    else:
        vector = vector_of(value)
    return new_scale(kind, vector)


# A scalar alpha reaches the kernels as a (D,) vector of it.  Vectors of up to
# FILLED_MAX_BYTES are kept, read-only, at most FILLED_KEPT of them, and serve every later
# call with the same value (its bits: -0.0 is not 0.0), D and dtype: for a small call,
# filling the vector cost more than all of the call's checks.
cdef dict filled_kept = {}
cdef enum:
    FILLED_KEPT = 16
    FILLED_MAX_BYTES = 1 << 16


cdef cnp.ndarray filled(double value, Py_ssize_t d, dtype):
    """A read-only (D,) vector of value in dtype."""
    cdef uint64_t bits
    memcpy(&bits, &value, sizeof(double))
    key = (bits, d, dtype)
    cdef cnp.ndarray vector = filled_kept.get(key)
    if vector is not None:
        return vector
    vector = np.full(d, value, dtype=dtype)
    vector.setflags(write=False)
    if d * vector.itemsize <= FILLED_MAX_BYTES:
        if len(filled_kept) >= FILLED_KEPT:
            filled_kept.clear()
        filled_kept[key] = vector
    return vector


cpdef bint valid_scale(alpha) noexcept:
    """A ResidualScale as residual_scale_of makes it (kept in caches)."""
    if type(alpha) is not ResidualScale:
        return False
    kind = (<ResidualScale>alpha).kind
    return type(kind) is str and (kind == "fixed" or kind == "scalar" or kind == "channel")


@cython.dataclasses.dataclass(frozen=True)
cdef class AddNormCache:
    """What the backward of a fused add + norm needs.

    Pre-Norm keeps h (the returned residual stream, by reference) and, only for a learnable
    alpha, x.  Post-Norm keeps x and residual (by reference) and recomputes h row by row.
    Row statistics in float64: rstd (and mean for LayerNorm).  The dropout mask is not kept:
    it is regenerated from (seed, element index).
    """
    op: object        # the forward function that made this cache
    h: object         # (N, D) Pre-Norm only
    x: object         # (N, D) Post-Norm, or a learnable alpha
    residual: object  # (N, D) Post-Norm only
    weight: object    # (D,) the gain applied (1 + weight for a zero-centred one)
    has_bias: object
    alpha: object     # ResidualScale
    dropout: object   # DropoutSpec
    mean: object      # (N,) float64, LayerNorm only
    rstd: object      # (N,) float64
    shape: object
    dtype: object
    axes: object = 1  # how many trailing axes of shape a row spans
    param_dtype: object = None  # float32 for float32 parameters beside 16-bit rows

    @property
    def normalized_shape(self):
        """The normalised axes' sizes: the parameters' gradients' shape."""
        return tuple(self.shape[len(self.shape) - self.axes:])


cdef AddNormCache add_norm_cache(op, h, x, residual, weight, has_bias, alpha, dropout, mean,
                                 rstd, shape, dtype, axes, param_dtype):
    """AddNormCache(op, h, x, residual, weight, has_bias, alpha, dropout, mean, rstd, shape,
    dtype, axes, param_dtype), built in C."""
    cdef AddNormCache c = AddNormCache.__new__(AddNormCache)
    c.op, c.h, c.x, c.residual, c.weight, c.has_bias = op, h, x, residual, weight, has_bias
    c.alpha, c.dropout, c.mean, c.rstd = alpha, dropout, mean, rstd
    c.shape, c.dtype, c.axes, c.param_dtype = shape, dtype, axes, param_dtype
    return c


@cython.dataclasses.dataclass(frozen=True)
cdef class ScaledResidualCache:
    """What scaled_residual_backward needs: alpha, and F (by reference) when alpha is learnable."""
    branch: object  # (N, D) F, only for a learnable alpha
    alpha: object   # ResidualScale
    shape: object
    dtype: object


cdef ScaledResidualCache scaled_residual_cache(branch, alpha, shape, dtype):
    """ScaledResidualCache(branch, alpha, shape, dtype), built in C."""
    cdef ScaledResidualCache c = ScaledResidualCache.__new__(ScaledResidualCache)
    c.branch, c.alpha, c.shape, c.dtype = branch, alpha, shape, dtype
    return c


@cython.dataclasses.dataclass(frozen=True)
cdef class GatedResidualCache:
    """What gated_residual_backward needs: F and the gate (by reference).  A full gate, and
    a per-channel gate of float16 or bfloat16, keep g and recompute sigmoid(g) from it; a
    per-channel gate of float32 or float64 keeps sigmoid(g) and sigmoid'(g) as (D,) vectors."""
    branch: object  # (N, D) F
    gate: object    # (N, D) g, or (D,) g per channel in float16 / bfloat16
    s: object       # (D,) sigmoid(g) in the input dtype, per-channel float32 / float64 only
    ds: object      # (D,) float64 sigmoid(g)*(1-sigmoid(g)), likewise
    shape: object
    dtype: object


cdef GatedResidualCache gated_residual_cache(branch, gate, s, ds, shape, dtype):
    """GatedResidualCache(branch, gate, s, ds, shape, dtype), built in C."""
    cdef GatedResidualCache c = GatedResidualCache.__new__(GatedResidualCache)
    c.branch, c.gate, c.s, c.ds, c.shape, c.dtype = branch, gate, s, ds, shape, dtype
    return c


@cython.dataclasses.dataclass(frozen=True)
cdef class GatedRMSNormCache:
    """What gated_rms_norm_backward needs: the input rows, the gate's rows and the rstd of
    every group of every row (sigmoid(gate) and the gated rows are recomputed)."""
    x: object          # (N, D) the rows the kernel read
    gate: object       # (N, D) the gate's rows, or None
    weight: object     # (D,) the weight, or None
    rstd: object       # (N * G,) float64, 1/sqrt(mean(v^2) + eps) per group of group_size
    group_size: object  # elements per group (D: one group per row)
    norm_before_gate: object  # True: y = norm(x) * silu(gate); False: norm(x * silu(gate))
    shape: object      # shape of the original input, given back to dx and dgate
    param_dtype: object = None  # float32 for a float32 weight beside 16-bit rows


cdef GatedRMSNormCache gated_rms_norm_cache(x, gate, weight, rstd, group_size,
                                            norm_before_gate, shape, param_dtype):
    """GatedRMSNormCache(...), built in C."""
    cdef GatedRMSNormCache c = GatedRMSNormCache.__new__(GatedRMSNormCache)
    c.x, c.gate, c.weight, c.rstd = x, gate, weight, rstd
    c.group_size, c.norm_before_gate, c.shape, c.param_dtype = (group_size, norm_before_gate,
                                                                shape, param_dtype)
    return c
