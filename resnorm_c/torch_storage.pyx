"""NumPy views of memory that torch tensors own, and a norm module's inference call, made in
C (resnorm.torch._storage).

resnorm.torch hands resnorm's functions NumPy views of tensors.  ``Tensor.numpy()`` makes
one in about a microsecond (argument parsing and checks), which is most of what a
decode-sized norm costs through a module; ``plain_view`` makes the view of a dense,
contiguous CPU tensor from its address and shape in a fraction of that.  The view is
read-only (resnorm reads inputs and never writes into them) and keeps the tensor alive
through its base, as ``Tensor.numpy()`` does.

``ParamViews`` holds a norm module's parameters as resnorm takes them, checked once, and
runs the module's inference call (``infer``): the checks that the cached views still hold,
the view of x, a torch output and resnorm's kernel, with no Python function between.  A
module's forward then costs about what torch's own does (resnorm.torch.modules).
``norm_infer`` does the same for the function form when its arguments need no
conversion (resnorm.torch.functions).

This module reads torch tensors through their Python attributes only (no torch headers).
"""
cimport numpy as cnp
from cpython.ref cimport Py_INCREF

import numpy as np
import torch
from torch.autograd import forward_ad

from resnorm import _api

cnp.import_array()


cdef extern from "numpy/arrayobject.h":
    # steals a reference to descr (NumPy's C API, which Cython's numpy declarations lack)
    object PyArray_NewFromDescr(type subtype, cnp.dtype descr, int nd, cnp.npy_intp *dims,
                                cnp.npy_intp *strides, void *data, int flags, object obj)


cdef object array_at(Py_ssize_t address, shape, cnp.dtype dtype, base, int flags):
    """The C-contiguous array of `shape` and `dtype` at `address` (flags: NumPy's, which say
    whether it is writeable), whose base is `base` (the tensor that owns the memory)."""
    cdef Py_ssize_t ndim = len(shape), k
    cdef cnp.npy_intp dims[cnp.NPY_MAXDIMS]
    if ndim > cnp.NPY_MAXDIMS:
        raise ValueError(f"shape has {ndim} axes, more than NumPy's {cnp.NPY_MAXDIMS}")
    for k in range(ndim):
        dims[k] = shape[k]
    Py_INCREF(dtype)   # PyArray_NewFromDescr steals a reference to the descriptor
    a = PyArray_NewFromDescr(cnp.ndarray, dtype, <int>ndim, dims, NULL, <void *>address,
                             flags, None)
    Py_INCREF(base)    # PyArray_SetBaseObject steals a reference to the base
    cnp.PyArray_SetBaseObject(a, base)
    return a


def contiguous_view(Py_ssize_t address, shape, cnp.dtype dtype, base):
    """The read-only C-contiguous array of `shape` (a tuple of sizes) and `dtype` at
    `address`, whose base is `base` (the tensor that owns the memory).  The caller vouches
    for what only torch can tell: that base is a dense, contiguous CPU tensor of that dtype,
    with no lazy negation, owning its shape's elements from that address."""
    return array_at(address, shape, dtype, base, cnp.NPY_ARRAY_C_CONTIGUOUS)


cdef object _TENSOR = torch.Tensor
cdef object _PARAMETER = torch.nn.Parameter


cdef object storage_view(t, shape, cnp.dtype dtype):
    """The read-only view of tensor t of `shape` (t.shape) as `dtype` when t is dense,
    contiguous, on the CPU and not lazily negated; else None."""
    try:   # a layout without strides (sparse, mkldnn) raises: Tensor.numpy() tells
        if t.is_cpu and t.is_contiguous() and not t.is_neg():
            return array_at(t.data_ptr(), shape, dtype, t, cnp.NPY_ARRAY_C_CONTIGUOUS)
    except RuntimeError:
        pass
    return None


cpdef object plain_view(t, cnp.dtype dtype):
    """The read-only view of t's storage as `dtype` (NumPy's dtype for t's), when t is a
    plain tensor or parameter (no subclass that redefines what it holds) that is dense,
    contiguous, on the CPU and not lazily negated; else None."""
    if type(t) is not _TENSOR and type(t) is not _PARAMETER:
        return None
    return storage_view(t, t.shape, dtype)


# torch has no public test for "inside a torch.func transform" or "inside a forward-mode AD
# dual level"; these are the flags torch.autograd.Function.apply and forward_ad read
# themselves.  Should a future torch drop them, resnorm.torch takes the path for
# transformed tensors every time, which is always correct.
functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)
_grad_enabled = torch.is_grad_enabled
_torch_threads = torch.get_num_threads


# torch's thread count when resnorm.torch was imported: its default, unless the program
# set one before
_torch_default_threads = _torch_threads()


cpdef object threads():
    """n_threads for resnorm, by the NumPy API's rule: None (OpenMP's default count, sized to
    the cores other processes leave free) while torch's thread count is its default, and
    the count torch.set_num_threads gave it otherwise (an explicit count, as n_threads=k
    is: then it sets both libraries').  Inputs under 2**14 elements run on one thread."""
    cdef int n = _torch_threads()
    return None if n == _torch_default_threads else n


cpdef bint transforms_active() except -1:
    """True inside a torch.func transform (vmap, grad, jvp, ...) or a forward-mode AD dual
    level: tensors there may carry a batch dimension or a tangent besides their storage,
    so NumPy views of them would be wrong or fail."""
    return functorch_active() or getattr(forward_ad, "_current_level", 0) >= 0


cpdef bint wants_grad(x, weight, bias) except -1:
    """True when autograd must record this norm: grad mode on and an input requiring grad."""
    return _grad_enabled() and (x.requires_grad
                                or (weight is not None and weight.requires_grad)
                                or (bias is not None and bias.requires_grad))


cdef object _FLOAT32 = torch.float32
cdef cnp.dtype _NP_FLOAT32 = cnp.dtype("float32")
cdef object _ONE32 = np.float32(1)


cdef object param_view(p, dtype, cnp.dtype np_dtype, tuple row):
    """The view of p, a plain (D,) parameter (row = (D,)) of x's dtype, or float32 beside
    float16 / bfloat16 x (torch's mixed case, which resnorm's functions take as it is),
    else None."""
    if (type(p) is not _TENSOR and type(p) is not _PARAMETER) or p.shape != row:
        return None
    if p.dtype is dtype:
        return plain_view(p, np_dtype)
    if p.dtype is _FLOAT32 and np_dtype.itemsize == 2:
        return plain_view(p, _NP_FLOAT32)
    return None


cdef object norm_into(bint layer, x, shape, cnp.dtype np_dtype, xv, weight_view, bias_view,
                      eps, row, zero_centered):
    """resnorm's inference kernel on the view xv of x (of `shape`), writing a new tensor
    from torch.empty_like(x) (x is contiguous: so is the output), which it returns."""
    y = torch.empty_like(x)
    yv = array_at(y.data_ptr(), shape, np_dtype, y, cnp.NPY_ARRAY_CARRAY)
    if layer:
        _api.layer_norm(xv, weight_view, bias_view, eps, normalized_shape=row,
                        zero_centered_weight=zero_centered, out=yv, n_threads=threads())
    else:
        _api.rms_norm(xv, weight_view, eps, normalized_shape=row,
                      zero_centered_weight=zero_centered, out=yv, n_threads=threads())
    return y


def norm_infer(bint layer, x, weight, bias, eps, zero_centered, dict numpy_dtypes):
    """resnorm.torch's rms_norm / layer_norm over x's last axis when no gradient is recorded
    and every argument is what resnorm's kernel reads as it is: x a plain, dense,
    contiguous CPU tensor of a dtype in numpy_dtypes (torch dtype -> NumPy's), weight and
    bias None or plain (D,) tensors of x's dtype (or float32 beside 16-bit x) and layout,
    eps a number.  None for anything else: the caller's checks then take the call (and
    give every error).
    zero_centered: passed to resnorm as it is (resnorm checks it); layer: LayerNorm."""
    if type(x) is not _TENSOR or eps is None:
        return None
    dtype = x.dtype
    np_dtype = numpy_dtypes.get(dtype)
    shape = x.shape
    if np_dtype is None or not len(shape):
        return None
    cdef tuple row = (shape[len(shape) - 1],)
    if not row[0]:
        return None
    wv = bv = None
    if weight is not None:
        wv = param_view(weight, dtype, np_dtype, row)
        if wv is None:
            return None
    if bias is not None:
        bv = param_view(bias, dtype, np_dtype, row)
        if bv is None:
            return None
    if wants_grad(x, weight, bias) or transforms_active():
        return None
    xv = storage_view(x, shape, np_dtype)
    if xv is None:
        return None
    return norm_into(layer, x, shape, np_dtype, xv, wv, bv, eps, None, zero_centered)


cdef tuple _where(t):
    """(address, shape) of a parameter's memory; (0, None) for no parameter."""
    return (0, None) if t is None else (t.data_ptr(), t.shape)


cdef class ParamViews:
    """A norm module's weight and bias as resnorm takes them, checked once (by the caller,
    resnorm.torch.modules): NumPy views of their storage, for inputs of one dtype and last
    axis.  valid() says, in a few attribute reads, whether they still describe the module's
    parameters; infer() runs the module's inference call while they do.

    An optimizer step or load_state_dict changes the values in place (the views see them);
    assigning a new tensor or new .data (model.double(), param.data = ...) makes valid()
    False.  The views keep the old storage alive, so a new storage cannot reuse its address.
    """
    cdef readonly object weight, bias, dtype, pdtype, row, weight_view, bias_view, default_eps
    cdef readonly Py_ssize_t d
    cdef readonly bint layer, float32_gain
    cdef object w_shape, b_shape
    cdef Py_ssize_t w_ptr, b_ptr
    cdef cnp.dtype np_dtype

    def __init__(self, bint layer, weight, bias, x, row, cnp.dtype np_dtype, weight_view,
                 bias_view, default_eps, pdtype, bint float32_gain=False):
        """layer: LayerNorm (else RMSNorm); row: normalized_shape as a tuple, None for the
        last axis; np_dtype: NumPy's dtype for x's; the parameters' views; the eps that
        None stands for; pdtype: the parameters' dtype (x's, or float32 beside 16-bit x);
        float32_gain: a zero-centred weight's gain is formed in float32 (the 16-bit weight
        of Gemma's RMSNorm, resnorm.torch._tensors.float32_gain)."""
        self.layer, self.weight, self.bias, self.dtype = layer, weight, bias, x.dtype
        self.float32_gain = float32_gain
        self.pdtype = pdtype
        shape = x.shape
        self.d = shape[len(shape) - 1]
        self.row = row
        self.np_dtype = np_dtype
        self.w_ptr, self.w_shape = _where(weight)
        self.b_ptr, self.b_shape = _where(bias)
        self.weight_view, self.bias_view = weight_view, bias_view
        self.default_eps = default_eps

    cpdef bint valid(self, weight, bias, x) except -1:
        """True when weight and bias are the same tensors with the same memory, and x has
        the dtype and the normalised axes they were checked for."""
        return self.holds(weight, bias, x.dtype, x.shape)

    cdef bint holds(self, weight, bias, dtype, shape) except -1:
        """valid() for x's dtype and shape (identity first: the cheapest reads decide the
        common cases)."""
        if weight is not self.weight or bias is not self.bias or dtype is not self.dtype:
            return False
        if shape[len(shape) - 1] != self.d or (self.row is not None
                                   and tuple(shape[len(shape) - len(self.row):]) != self.row):
            return False
        return ((weight is None or (weight.data_ptr() == self.w_ptr
                                    and weight.dtype is self.pdtype
                                    and weight.shape == self.w_shape))
                and (bias is None or (bias.data_ptr() == self.b_ptr
                                      and bias.dtype is self.pdtype
                                      and bias.shape == self.b_shape)))

    def infer(self, dict params, x, eps, bint zero_centered):
        """The module's output for x when no gradient is recorded and the views hold:
        resnorm's kernel reading x's storage and writing a new torch tensor; None when x
        takes the general path (autograd, a transform, a strided or non-plain tensor,
        parameters that changed).  params: the module's _parameters; eps None: the
        default."""
        if type(x) is not _TENSOR:
            return None
        shape = x.shape
        if not len(shape):
            return None
        weight = params.get("weight")
        bias = params.get("bias") if self.layer else None
        if not self.holds(weight, bias, x.dtype, shape) or wants_grad(x, weight, bias) \
                or transforms_active():
            return None
        xv = storage_view(x, shape, self.np_dtype)
        if xv is None:
            return None
        weight_view = self.weight_view
        if zero_centered and self.float32_gain:   # _tensors.gemma_gain, from w's values now
            weight_view = np.add(weight_view, _ONE32, dtype=_NP_FLOAT32)
            zero_centered = False
        return norm_into(self.layer, x, shape, self.np_dtype, xv, weight_view,
                         self.bias_view, self.default_eps if eps is None else eps, self.row,
                         zero_centered)
