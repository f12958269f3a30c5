"""Drop-in nn.Modules: torch.nn.RMSNorm / torch.nn.LayerNorm with resnorm's kernels.

Each is a subclass of torch's own module that only replaces forward, so the constructor
arguments, parameters, state_dict keys, reset_parameters, repr and isinstance checks are
torch's: ``model.load_state_dict`` works unchanged in both directions.

Supported: normalized_shape over the last axis only (an int or a 1-tuple), float32/float64
CPU tensors.  A multi-axis normalized_shape raises ValueError at construction; CUDA tensors
and other dtypes raise TypeError in forward.  Like torch's modules, RMSNorm follows the
input's dtype (a float32 module takes float64 input and returns float64) and LayerNorm
requires the parameters' dtype.  Under TorchScript forward calls resnorm's custom operators.
"""
import torch
from torch import nn

from . import _tensors as T
from . import functions, kernels

_ABSENT = object()
_VIEWS = "_resnorm_param_views"


def _check_shape(module):
    shape = module.normalized_shape
    if len(shape) != 1:
        raise ValueError(f"normalized_shape={tuple(shape)} spans {len(shape)} axes; resnorm "
                         f"normalises over the last axis only (normalized_shape an int or a "
                         f"1-tuple)")


def parameter(module, name):
    """module.<name> without nn.Module.__getattr__'s cost (a parametrized tensor or any
    other attribute falls back to getattr)."""
    p = module._parameters.get(name, _ABSENT)
    return getattr(module, name) if p is _ABSENT else p


def forget_views(module_or_state):
    """Drops the parameter views a module (or a copy of its __dict__) keeps: patch's undo,
    and pickling, where the views of the old storage would be stale."""
    state = module_or_state if isinstance(module_or_state, dict) else module_or_state.__dict__
    state.pop(_VIEWS, None)


class _ViewsNotPickled:
    """Pickling and deepcopy leave the cached views out (they would view the old storage)."""

    def __getstate__(self):
        state = self.__dict__.copy()
        forget_views(state)
        return state


def module_norm(module, x, layer, eps, normalized_shape=None):
    """The norm of x with module.weight (and, for LayerNorm, module.bias): what every
    resnorm module's forward runs.

    The module keeps its parameters' NumPy views (ParamViews, in its __dict__), checked
    once; while they stay valid, a call costs a few attribute reads on top of resnorm's
    own.  RMSNorm follows x's dtype as torch.nn.RMSNorm does (a float32 weight is
    converted for float64 input); LayerNorm requires the parameters' dtype.
    normalized_shape: the module's, checked against x's last axis (valid views imply it:
    they hold the axis they were made for).
    """
    weight = parameter(module, "weight")
    bias = parameter(module, "bias") if layer else None
    if T.graph_capture():   # torch.compile / jit.trace: resnorm's custom operators
        return _checked_norm(layer, x, weight, bias, eps, normalized_shape)
    views = module.__dict__.get(_VIEWS)
    if views is None or type(x) is not torch.Tensor or not x.ndim or not views.valid(
            weight, bias, x):
        x = T.input_tensor(x)
        if not layer and weight is not None and weight.dtype is not x.dtype:
            return _checked_norm(layer, x, weight, bias, eps, normalized_shape)
        if normalized_shape is not None:
            T.last_axis(x, normalized_shape)
        views = module.__dict__[_VIEWS] = T.ParamViews(weight, bias, x)
    if eps is None:
        eps = views.default_eps
    if not (functions.wants_grad(x, weight, bias) or T.transforms_active()):
        try:
            if layer:
                return kernels.layer_norm(x, views.weight_view, views.bias_view, eps)
            return kernels.rms_norm(x, views.weight_view, eps)
        except T.NoStorage:
            pass   # the general path gives the error or takes the batched tensor
        return functions.norm(layer, x, weight, bias, eps)
    if layer:
        return functions.LayerNormFunction.apply(x, weight, bias, eps,
                                                 (views.weight_view, views.bias_view))[0]
    return functions.RMSNormFunction.apply(x, weight, eps, (views.weight_view,))[0]


def _checked_norm(layer, x, weight, bias, eps, normalized_shape):
    """module_norm without cached views (while a graph is recorded)."""
    x = T.input_tensor(x)
    if normalized_shape is not None:
        T.last_axis(x, normalized_shape)
    if not layer and weight is not None and weight.dtype is not x.dtype:
        weight = weight.to(x.dtype)
    return functions.norm(layer, x, weight, bias, eps)


class RMSNorm(_ViewsNotPickled, nn.RMSNorm):
    """torch.nn.RMSNorm computed by resnorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).

    Parameters
    ----------
    normalized_shape : int or 1-tuple
        D, the size of the last axis.
    eps : float or None
        None (the default) means torch.finfo(x.dtype).eps, as in torch.
    elementwise_affine : bool
        Whether the module has a learnable weight (initialised to ones).
    device, dtype
        As for torch.nn.RMSNorm (resnorm runs float32/float64 on the CPU).

    Raises
    ------
    ValueError
        normalized_shape spans more than the last axis.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.RMSNorm(2, eps=1e-12)(torch.tensor([[3.0, 4.0]]))
    tensor([[0.8485, 1.1314]], grad_fn=<RMSNormFunctionBackward>)
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        _check_shape(self)

    def forward(self, x):
        if torch.jit.is_scripting():
            weight = self.weight
            if weight is not None and weight.dtype != x.dtype:
                weight = weight.to(x.dtype)
            return torch.ops.resnorm.rms_norm(x, weight, self.eps)[0]
        return module_norm(self, x, False, self.eps, self.normalized_shape)


class LayerNorm(_ViewsNotPickled, nn.LayerNorm):
    """torch.nn.LayerNorm computed by resnorm: y = (x - mean) * rstd * w + b.

    Parameters
    ----------
    normalized_shape : int or 1-tuple
        D, the size of the last axis.
    eps : float
        Added to the (biased) variance.
    elementwise_affine, bias : bool
        Whether the module has a learnable weight (ones) and bias (zeros).
    device, dtype
        As for torch.nn.LayerNorm (resnorm runs float32/float64 on the CPU).

    Raises
    ------
    ValueError
        normalized_shape spans more than the last axis.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> with torch.no_grad():
    ...     rt.LayerNorm(2, eps=1e-12)(torch.tensor([[1.0, 3.0]]))
    tensor([[-1.,  1.]])
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        _check_shape(self)

    def forward(self, x):
        if torch.jit.is_scripting():
            return torch.ops.resnorm.layer_norm(x, self.weight, self.bias, self.eps)[0]
        return module_norm(self, x, True, self.eps, self.normalized_shape)
