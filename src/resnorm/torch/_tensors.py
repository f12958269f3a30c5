"""torch tensors in, NumPy views out: the argument checks of resnorm.torch.

Same error style as the rest of resnorm (which never imports torch): TypeError for a wrong
kind, device or dtype, ValueError for a wrong value or shape; messages name the argument.
Values (eps, p, seed, alpha, n_threads) are checked by the resnorm functions themselves.

A CPU tensor and its ``.numpy()`` view share memory, so resnorm's functions read a tensor's
own storage and write into tensors allocated here: no copies, except that a strided input
is copied once by the function it reaches (as for any strided NumPy array).
"""
import operator
from typing import Optional

import numpy as np
import torch

# compiled (resnorm_c/torch_storage.pyx): the tensor views, the norms' inference calls
# (ParamViews, norm_infer), and the tests every call path shares (functorch_active,
# transforms_active, wants_grad, threads), used as T.<name>
from ._storage import (ParamViews, functorch_active, norm_infer, plain_view, threads,
                       transforms_active, wants_grad)

# The one place that says which torch dtypes resnorm's kernels take, and as which NumPy
# dtype.  NumPy has no bfloat16 of its own: torch.bfloat16 tensors are viewed as
# ml_dtypes.bfloat16 arrays (bit-cast through int16, no copy), so they need ml_dtypes,
# imported the first time a bfloat16 tensor is seen.
NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
                torch.float16: np.dtype(np.float16), torch.bfloat16: None}
HALF_DTYPES = (torch.float16, torch.bfloat16)


def _bfloat16():
    """ml_dtypes.bfloat16 as a NumPy dtype (None when ml_dtypes is not installed)."""
    if NUMPY_DTYPES[torch.bfloat16] is None:
        try:
            import ml_dtypes
        except ImportError:
            return None
        NUMPY_DTYPES[torch.bfloat16] = np.dtype(ml_dtypes.bfloat16)
    return NUMPY_DTYPES[torch.bfloat16]


def numpy_dtype(dtype):
    """The NumPy dtype resnorm sees for tensors of a dtype resnorm.torch takes."""
    return _bfloat16() if dtype is torch.bfloat16 else NUMPY_DTYPES[dtype]


def dtype_problem(dtype):
    """Why resnorm's kernels cannot take tensors of this dtype (a sentence), or None."""
    if dtype is torch.bfloat16 and _bfloat16() is None:
        return ("resnorm views torch.bfloat16 tensors as ml_dtypes.bfloat16 arrays: "
                "pip install ml_dtypes")
    if dtype in NUMPY_DTYPES:
        return None
    return (f"resnorm's kernels take torch.float32, torch.float64, torch.float16 or "
            f"torch.bfloat16, not {dtype}")


def _dtype_error(name, dtype):
    return TypeError(f"{name} must have dtype torch.float32, torch.float64, torch.float16 or "
                     f"torch.bfloat16, got {dtype}; {dtype_problem(dtype)}")


# torch.jit.is_tracing() is this flag behind a Python call that costs a tenth of a small
# norm; the public function is the fallback.
_jit_tracing = getattr(torch._C, "_is_tracing", torch.jit.is_tracing)


def graph_capture():
    """True while torch.compile or torch.jit.trace records a graph."""
    return torch.compiler.is_compiling() or _jit_tracing()


# The largest norm call (elements of x) that torch.compile records as float64 torch
# operations (resnorm.torch.composite) instead of resnorm's custom operator: the kernels'
# threshold for a call worth a second thread.  Inside a compiled graph an operator's call
# costs about 50-70 us of dispatch (the kernel itself 2-5 us at this size), where Inductor
# fuses the expression with its neighbours: a small Llama's compiled decode step (nine
# norms of one row) took 0.79-0.81x of the unpatched model's through the operator.
COMPILED_EXPRESSION_MAX = 1 << 14


def records_expression(x):
    """True when torch.compile is recording a norm of x small enough to record as float64
    torch operations (COMPILED_EXPRESSION_MAX); torch.jit.trace always records the
    operator."""
    return torch.compiler.is_compiling() and x.numel() <= COMPILED_EXPRESSION_MAX


def input_tensor(x, name="x"):
    """x checked: a dense float32/float64/float16/bfloat16 CPU tensor with at least one
    axis and a non-empty last axis (shape (..., D)).  Returns x."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_cpu:
        raise TypeError(f"{name} must be a CPU tensor (resnorm kernels run on the CPU), "
                        f"got a tensor on device '{x.device}'")
    if x.layout is not torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}")
    if x.dtype not in NUMPY_DTYPES or dtype_problem(x.dtype) is not None:
        raise _dtype_error(name, x.dtype)
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one axis (shape (..., D)), got a scalar")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last axis, got shape {tuple(x.shape)}")
    return x


def default_eps(dtype):
    """The eps that None stands for, as in torch.nn.functional.rms_norm: the machine
    epsilon of the type the norm is computed in (float32 for float16 and bfloat16)."""
    return torch.finfo(torch.float32 if dtype in HALF_DTYPES else dtype).eps


def eps_for(eps, x):
    """eps=None means default_eps(x.dtype), as in torch.nn.functional.rms_norm."""
    return default_eps(x.dtype) if eps is None else eps


def row_shape(normalized_shape, x):
    """The shape of one normalised row, as a tuple: x's last axis for None, else torch's
    normalized_shape (an int, or a sequence of ints such as torch.Size) as a tuple.  The
    sizes are checked against x by trailing_axes (and by resnorm)."""
    if normalized_shape is None:
        return (x.shape[-1],)
    sizes = normalized_shape if isinstance(normalized_shape, (tuple, list)) else (
        normalized_shape,)
    try:
        return tuple(operator.index(s) for s in sizes)
    except TypeError:
        raise TypeError(f"normalized_shape must be None, an int or a sequence of ints, got "
                        f"{normalized_shape!r}") from None


def trailing_axes(x, row, name="input"):
    """Checks that x ends with the normalised axes `row` (a tuple, e.g. a module's
    normalized_shape)."""
    if isinstance(x, torch.Tensor) and tuple(x.shape[x.dim() - len(row):]) != row:
        sizes = ", ".join(map(str, row))
        raise ValueError(f"{name} must have shape (..., {sizes}) for normalized_shape={row}, "
                         f"got {tuple(x.shape)}")


def normalized_arg(row):
    """normalized_shape as resnorm takes it: None for the last axis alone (its fast path)."""
    return None if len(row) == 1 else row


def param_tensor(p, name, x, row=None):
    """None, or p checked as a CPU tensor of x's dtype (or float32 beside float16/bfloat16
    x: mixed_params) of the normalised row's shape (row; None: (D,), D = x's last axis)."""
    if p is None:
        return None
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(p).__name__}")
    if not p.is_cpu:
        raise TypeError(f"{name} must be a CPU tensor, got a tensor on device '{p.device}'")
    if p.layout is not torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {p.layout}")
    if p.dtype is not x.dtype and not _float32_beside_half(p, x):
        raise TypeError(f"{name} must have the input's dtype {x.dtype}, got {p.dtype}")
    if row is None or len(row) == 1:
        if p.dim() != 1 or p.shape[0] != x.shape[-1]:
            raise ValueError(f"{name} must have shape ({x.shape[-1]},) (the input's last "
                             f"axis), got {tuple(p.shape)}")
    elif tuple(p.shape) != row:
        raise ValueError(f"{name} must have shape {row} (normalized_shape), got "
                         f"{tuple(p.shape)}")
    return p


def partner(t, name, x):
    """t checked as a dense CPU tensor of exactly x's shape and dtype (the residual of an add)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu or t.layout is not torch.strided:
        raise TypeError(f"{name} must be a dense CPU tensor, got {t.layout} on '{t.device}'")
    if t.dtype is not x.dtype:
        raise TypeError(f"{name} must have the input's dtype {x.dtype}, got {t.dtype}")
    if t.shape != x.shape:
        raise ValueError(f"{name} must have the input's shape {tuple(x.shape)}, "
                         f"got {tuple(t.shape)}")
    return t


def scale_tensor(alpha, x, name="alpha"):
    """alpha (or a gate) checked where torch knows more than resnorm: a tensor must be a
    CPU tensor of x's dtype (its shape is checked by resnorm).  Numbers pass as they are."""
    if isinstance(alpha, torch.Tensor):
        if not alpha.is_cpu:
            raise TypeError(f"{name} must be a CPU tensor, got a tensor on device "
                            f"'{alpha.device}'")
        if alpha.dtype is not x.dtype:
            raise TypeError(f"{name} must have the input's dtype {x.dtype}, got {alpha.dtype}")
    return alpha


class NoStorage(RuntimeError):
    """A tensor that has no NumPy view: a batched tensor (torch.func's vmap, gradcheck's
    batched gradients), or one that input_tensor would refuse (on the GPU, sparse)."""


def view(t):
    """The NumPy view of a CPU tensor's storage (None stays None), else NoStorage.

    A dense, contiguous CPU tensor of a dtype resnorm takes gets a read-only view made in
    C from its address (resnorm.torch._storage; resnorm only reads the tensors it views):
    Tensor.numpy() takes about a microsecond, most of a small norm's cost."""
    if t is None:
        return None
    dtype = NUMPY_DTYPES.get(t.dtype)   # bfloat16's is None until ml_dtypes is loaded
    if dtype is not None:
        v = plain_view(t, dtype)
        if v is not None:
            return v
    if not t.is_cpu:   # numpy(force=True) would copy it to the CPU
        raise NoStorage(f"resnorm.torch cannot view a tensor on '{t.device}'")
    try:
        if t.is_neg():   # a lazily negated view (z.conj().imag): its values, copied once
            t = t.resolve_neg()
        # force=True: detach (a tensor that requires grad), in one call
        if t.dtype is torch.bfloat16:   # NumPy has no bfloat16: the bits, as ml_dtypes'
            bits = t.view(torch.int16)
            return (bits.numpy(force=True) if t.requires_grad else bits.numpy()).view(
                _bfloat16())
        return t.numpy(force=True) if t.requires_grad else t.numpy()
    except (RuntimeError, TypeError) as e:
        raise NoStorage(f"resnorm.torch cannot view this tensor's storage: {e}") from e


def new_like(x):
    """A fresh contiguous tensor with x's shape and dtype: the output buffer a kernel writes."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def row_count(x, axes=1):
    """Number of rows N of x seen as (N, D), a row spanning its last `axes` axes."""
    d = 1
    for s in x.shape[x.dim() - axes:]:
        d *= s
    return x.numel() // d


def tensor(a):
    """The tensor sharing the memory of an array resnorm returned (None stays None)."""
    if a is None:
        return None
    if a.dtype.itemsize == 2 and a.dtype.kind == "V":   # ml_dtypes.bfloat16: its bits
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _float32_beside_half(p, x):
    """p (a tensor) is float32 and x float16/bfloat16: the mixed case's one rule."""
    return p.dtype is torch.float32 and x.dtype in HALF_DTYPES


def mixed_params(x, weight, bias):
    """float16/bfloat16 x with a float32 weight or bias: torch's mixed precision (a float32
    module receiving half-precision activations, as under torch.autocast), which resnorm
    computes as the float32 norm of the widened rows rounded once to x's dtype, its
    parameters' gradients in float32.  (Every fused call asks: no generator.)"""
    if x.dtype not in HALF_DTYPES:   # the common case decided at once
        return False
    return ((weight is not None and _float32_beside_half(weight, x))
            or (bias is not None and _float32_beside_half(bias, x)))


def float32_gain(layer: bool, x: torch.Tensor, weight: Optional[torch.Tensor]) -> bool:
    """Whether this norm applies its zero-centred weight (callers ask only for one) as the
    float32 gain 1 + weight: an RMSNorm's 16-bit weight beside x of its dtype, where
    Gemma's module forms 1.0 + weight.float() (resnorm's kernels round 1 + w in w's dtype,
    as Nemotron's LayerNorm1P forms weight + 1, so LayerNorm keeps that rule).  The caller
    then passes gemma_gain(weight) as a float32 weight: torch's mixed case (mixed_params).
    Annotated for TorchScript (the scripted modules ask it too); Python callers may pass
    any x and weight."""
    return (not layer and isinstance(x, torch.Tensor)
            and (x.dtype == torch.float16 or x.dtype == torch.bfloat16)
            and isinstance(weight, torch.Tensor) and weight.dtype == x.dtype)


def gemma_gain(weight: torch.Tensor) -> torch.Tensor:
    """1 + weight formed in float32, as Gemma's module forms it (1.0 + weight.float()): a
    torch expression, so the weight's gradient reaches it through torch's cast, as in
    Gemma's own graph.  (ParamViews.infer forms the same float32 sum with NumPy.)"""
    return weight.float() + 1


def param_views(layer, weight, bias, x, row=None, zero_centered=False):
    """A norm module's ParamViews for inputs like x: its weight and bias (None or tensors)
    checked once for x's dtype and the normalised axes (row: the module's normalized_shape
    as a tuple; None: x's last axis), with their NumPy views.  layer: LayerNorm;
    zero_centered: the module's gain is 1 + weight (float32_gain says how it is formed)."""
    param_tensor(weight, "weight", x, row)
    param_tensor(bias, "bias", x, row)
    pdtype = torch.float32 if mixed_params(x, weight, bias) else x.dtype
    return ParamViews(layer, weight, bias, x, None if row is None or len(row) == 1 else row,
                      numpy_dtype(x.dtype), view(weight), view(bias), default_eps(x.dtype),
                      pdtype, zero_centered and float32_gain(layer, x, weight))
