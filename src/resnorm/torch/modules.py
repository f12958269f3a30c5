"""Drop-in nn.Modules: torch.nn.RMSNorm / torch.nn.LayerNorm with resnorm's kernels,
GemmaRMSNorm, and GatedRMSNorm (the gated RMSNorm of hybrid Mamba models, with the
constructor and state_dict of Hugging Face's MambaRMSNormGated).

Each is a subclass of torch's own module that replaces forward (and, for a zero-centred
weight, the initial value), so the constructor arguments, parameters, state_dict keys,
reset_parameters, repr and isinstance checks are torch's: ``model.load_state_dict`` works
unchanged in both directions.

Supported: any normalized_shape (an int, or the trailing axes of the input, e.g. (5, 64)),
float32/float64/float16/bfloat16 CPU tensors; CUDA tensors and other dtypes raise TypeError
in forward.  float16/bfloat16 input with float32 parameters (torch.autocast's mixed case)
is computed as torch computes it: the float32 norm, each output rounded once to the
input's dtype, the parameters' gradients in float32.
Like torch's modules, RMSNorm follows the input's dtype (a float32 module takes float64
input and returns float64) and LayerNorm requires the parameters' dtype.
GemmaRMSNorm applies 1 + weight, with the weight initialised at 0.  Under TorchScript
forward calls resnorm's custom operators.
"""
import operator

import torch
from torch import nn

from . import _tensors as T
from . import functions, gated, kernels

_ABSENT = object()
_VIEWS = "_resnorm_param_views"


def parameter(module, name):
    """module.<name> without nn.Module.__getattr__'s cost (a parametrized tensor or any
    other attribute falls back to getattr; None for a module without one, such as a norm
    without parameters)."""
    p = module._parameters.get(name, _ABSENT)
    return getattr(module, name, None) if p is _ABSENT else p


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


def module_norm(module, x, layer, eps, normalized_shape=None, zero_centered=False):
    """The norm of x with module.weight (and, for LayerNorm, module.bias): what every
    resnorm module's forward runs.

    The module keeps its parameters' NumPy views (a ParamViews, in its __dict__), checked
    once; while they stay valid, an inference call runs in C (ParamViews.infer) from the
    views' check to the kernel.  RMSNorm follows x's dtype as torch.nn.RMSNorm does (a
    float32 weight is converted for float64 input); LayerNorm requires the parameters'
    dtype.  normalized_shape: the module's (a tuple; None: x's last axis), checked against
    x's trailing axes (valid views imply it: they hold the axes they were made for).
    zero_centered: the gain is 1 + weight.
    """
    if T.graph_capture():   # torch.compile / jit.trace: functions.norm's graph path
        weight = parameter(module, "weight")
        bias = parameter(module, "bias") if layer else None
        return _checked_norm(layer, x, weight, bias, eps, normalized_shape, zero_centered)
    views = module.__dict__.get(_VIEWS)
    if views is not None:
        y = views.infer(module._parameters, x, eps, zero_centered)
        if y is not None:
            return y
    weight = parameter(module, "weight")
    bias = parameter(module, "bias") if layer else None
    if views is None or type(x) is not torch.Tensor or not x.ndim or not views.valid(
            weight, bias, x):
        x = T.input_tensor(x)
        if follows_input(layer, x, weight):
            return _checked_norm(layer, x, weight, bias, eps, normalized_shape, zero_centered)
        if normalized_shape is not None:
            T.trailing_axes(x, tuple(normalized_shape))
        try:
            views = module.__dict__[_VIEWS] = T.param_views(layer, weight, bias, x,
                                                            normalized_shape, zero_centered)
        except T.NoStorage:
            # parameters wrapped by a torch.func transform (functional_call's inside grad
            # or vmap: per-sample gradients) have no storage to view; the Function's
            # transform rules take them
            return _checked_norm(layer, x, weight, bias, eps, normalized_shape,
                                 zero_centered)
    if eps is None:
        eps = views.default_eps
    ns = views.row
    if views.float32_gain:   # Gemma's 16-bit weight, beyond infer: functions.norm forms it
        return functions.norm(layer, x, weight, bias, eps, None, ns, zero_centered)
    if not (T.wants_grad(x, weight, bias) or T.transforms_active()):
        try:
            if layer:
                return kernels.layer_norm(x, views.weight_view, views.bias_view, eps, ns,
                                          zero_centered)
            return kernels.rms_norm(x, views.weight_view, eps, ns, zero_centered)
        except T.NoStorage:
            pass   # the general path gives the error or takes the batched tensor
        return functions.norm(layer, x, weight, bias, eps, None, ns, zero_centered)
    if layer:
        return functions.LayerNormFunction.apply(x, weight, bias, eps,
                                                 (views.weight_view, views.bias_view), ns,
                                                 zero_centered)[0]
    return functions.RMSNormFunction.apply(x, weight, eps, (views.weight_view,), ns,
                                           zero_centered)[0]


def follows_input(layer, x, weight):
    """An RMSNorm weight of another dtype than x, converted to x's as torch.nn.RMSNorm does
    (a float32 weight for float64 input); not torch's mixed precision (T.mixed_params),
    which keeps the float32 weight."""
    return (not layer and weight is not None and weight.dtype is not x.dtype
            and not T.mixed_params(x, weight, None))


def _checked_norm(layer, x, weight, bias, eps, normalized_shape, zero_centered):
    """module_norm without cached views (while a graph is recorded)."""
    x = T.input_tensor(x)
    if normalized_shape is not None:
        normalized_shape = tuple(normalized_shape)
        T.trailing_axes(x, normalized_shape)
        normalized_shape = T.normalized_arg(normalized_shape)   # one axis: the fast path's
    if follows_input(layer, x, weight):
        weight = weight.to(x.dtype)
    return functions.norm(layer, x, weight, bias, eps, None, normalized_shape, zero_centered)


class _ZeroCentered:
    """The zero-centred weight of a norm module class (GemmaRMSNorm): the gain is
    1 + weight, and reset_parameters starts the weight at 0 (the identity gain, where
    weight decay pulls it)."""
    zero_centered_weight = False   # a class's constant (also for TorchScript: __constants__)

    def reset_parameters(self):
        super().reset_parameters()
        if self.zero_centered_weight and self.weight is not None:
            with torch.no_grad():
                self.weight.zero_()

    def extra_repr(self):
        return super().extra_repr() + (", zero_centered_weight=True"
                                       if self.zero_centered_weight else "")


class RMSNorm(_ViewsNotPickled, _ZeroCentered, nn.RMSNorm):
    """torch.nn.RMSNorm computed by resnorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).

    Parameters
    ----------
    normalized_shape : int or tuple of int
        The normalised trailing axes: D, the size of the last axis, or several (e.g.
        (5, 64)), whose elements form one row.
    eps : float or None
        None (the default) means torch.finfo(x.dtype).eps (float32's for float16
        and bfloat16), as in torch.
    elementwise_affine : bool
        Whether the module has a learnable weight (initialised to ones).
    device, dtype
        As for torch.nn.RMSNorm (resnorm runs float32/float64 on the CPU).

    See Also
    --------
    GemmaRMSNorm : the same with the gain 1 + weight.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.RMSNorm(2, eps=1e-12)(torch.tensor([[3.0, 4.0]]))
    tensor([[0.8485, 1.1314]], grad_fn=<RMSNormFunctionBackward>)
    >>> rt.RMSNorm((2, 3))(torch.ones(4, 2, 3)).shape
    torch.Size([4, 2, 3])
    """

    __constants__ = nn.RMSNorm.__constants__ + ["zero_centered_weight"]

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)

    def forward(self, x):
        if torch.jit.is_scripting():
            weight = self.weight
            zero_centered = self.zero_centered_weight
            if weight is not None and weight.dtype != x.dtype:
                weight = weight.to(x.dtype)
            if zero_centered and weight is not None and T.float32_gain(False, x, weight):
                weight, zero_centered = T.gemma_gain(weight), False   # as functions.norm
            return torch.ops.resnorm.rms_norm(x, weight, self.eps, len(self.normalized_shape),
                                              zero_centered)[0]
        return module_norm(self, x, False, self.eps, self.normalized_shape,
                           self.zero_centered_weight)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm computed by resnorm: y = x * rstd * (1 + weight), the weight starting
    at zeros; the constructor and state_dict of Hugging Face's GemmaRMSNorm (dim, eps), so
    it loads Gemma's norm weights as they are.

    Gemma's own module computes in float32 whatever the input's dtype, the gain 1 + weight
    included; this one, like RMSNorm, in the input's (float32 or float64), and for float16
    and bfloat16 inputs as Gemma's does: in float32, the gain 1 + weight formed in float32,
    the output rounded once (Gemma's outputs wherever the float32 statistics round alike).

    Parameters
    ----------
    dim : int
        The size of the last axis.
    eps : float
        Added to mean(x^2).
    device, dtype
        As for RMSNorm.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> norm = rt.GemmaRMSNorm(2)
    >>> norm.weight
    Parameter containing:
    tensor([0., 0.], requires_grad=True)
    >>> with torch.no_grad():
    ...     norm(torch.tensor([[3.0, 4.0]]))
    tensor([[0.8485, 1.1314]])
    """
    zero_centered_weight = True

    def __init__(self, dim, eps=1e-6, device=None, dtype=None):
        super().__init__(dim, eps, True, device, dtype)


class LayerNorm(_ViewsNotPickled, _ZeroCentered, nn.LayerNorm):
    """torch.nn.LayerNorm computed by resnorm: y = (x - mean) * rstd * w + b.

    Parameters
    ----------
    normalized_shape : int or tuple of int
        The normalised trailing axes, as for RMSNorm.
    eps : float
        Added to the (biased) variance.
    elementwise_affine, bias : bool
        Whether the module has a learnable weight (ones) and bias (zeros).
    device, dtype
        As for torch.nn.LayerNorm (resnorm runs float32/float64 on the CPU).

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> with torch.no_grad():
    ...     rt.LayerNorm(2, eps=1e-12)(torch.tensor([[1.0, 3.0]]))
    tensor([[-1.,  1.]])
    """

    __constants__ = nn.LayerNorm.__constants__ + ["zero_centered_weight"]

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x):
        if torch.jit.is_scripting():
            return torch.ops.resnorm.layer_norm(x, self.weight, self.bias, self.eps,
                                                len(self.normalized_shape),
                                                self.zero_centered_weight)[0]
        return module_norm(self, x, True, self.eps, self.normalized_shape,
                           self.zero_centered_weight)


class GatedRMSNorm(nn.Module):
    """The gated RMSNorm of hybrid Mamba models computed by resnorm, by groups of
    group_size consecutive elements of a row (resnorm.torch.gated_rms_norm):

    * norm_before_gate=False: u = x * silu(gate), y = u * rstd(u) * w (Hugging Face's
      MambaRMSNormGated: Mamba-2, Bamba, GraniteMoeHybrid, Zamba 2, Nemotron-H);
    * norm_before_gate=True: y = x * rstd(x) * w * silu(gate) (Qwen3-Next's
      Qwen3NextRMSNormGated; Falcon-H1's, whose norm_before_gate is its config's);

    rstd(v) = 1/sqrt(mean(v^2) + eps) over each group.  forward(hidden_states, gate=None)
    is Hugging Face's call; the weight (ones at first) is its state_dict's one key, so the
    module loads their norm weights as they are.

    Hugging Face's modules compute in float32 whatever the input's dtype; this one in the
    input's (float32 or float64), and for float16 and bfloat16 in float32, rounded once.
    As torch.nn.RMSNorm, it follows the input's dtype (a float32 module takes float64
    input); float32 weight beside float16 or bfloat16 input is torch.autocast's mixed
    case (resnorm.torch.gated_rms_norm).

    Parameters
    ----------
    hidden_size : int
        D, the size of the last axis (and of the weight).
    eps : float or None
        Added to each group's mean square; None: torch.finfo(x.dtype).eps.
    group_size : int or None
        A divisor of hidden_size (Mamba-2's hidden_size / n_groups); None: hidden_size,
        one group per row.
    norm_before_gate : bool
        Apply the gate after the norm instead of before it.
    device, dtype
        Of the weight, as for torch.nn.RMSNorm.

    Raises
    ------
    ValueError
        group_size does not divide hidden_size.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> norm = rt.GatedRMSNorm(4, eps=1e-12, group_size=2)
    >>> norm
    GatedRMSNorm(4, eps=1e-12, group_size=2, norm_before_gate=False)
    >>> x = torch.tensor([[3.0, 4.0, 1.0, 1.0]])
    >>> with torch.no_grad():
    ...     norm(x, torch.full((1, 4), 50.0))
    tensor([[0.8485, 1.1314, 1.0000, 1.0000]])
    """

    __constants__ = ["hidden_size", "eps", "group_size", "norm_before_gate"]

    def __init__(self, hidden_size, eps=1e-6, group_size=None, norm_before_gate=False,
                 device=None, dtype=None):
        super().__init__()
        self.hidden_size = operator.index(hidden_size)
        if self.hidden_size <= 0:
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        self.eps = eps
        self.group_size = gated.checked_group_size(group_size, self.hidden_size)
        self.norm_before_gate = bool(norm_before_gate)
        self.weight = nn.Parameter(torch.empty(self.hidden_size, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        """The weight back to ones."""
        nn.init.ones_(self.weight)

    def forward(self, hidden_states, gate=None):
        """y for hidden_states (..., hidden_size) and gate (its shape and dtype, or None)."""
        weight = self.weight
        if torch.jit.is_scripting():
            if weight.dtype != hidden_states.dtype and not (
                    weight.dtype == torch.float32
                    and (hidden_states.dtype == torch.float16
                         or hidden_states.dtype == torch.bfloat16)):
                weight = weight.to(hidden_states.dtype)
            return torch.ops.resnorm.gated_rms_norm(hidden_states, gate, weight, self.eps,
                                                    self.group_size,
                                                    self.norm_before_gate)[0]
        if isinstance(hidden_states, torch.Tensor) and follows_input(False, hidden_states,
                                                                     weight):
            weight = weight.to(hidden_states.dtype)
        return gated.gated_norm(hidden_states, gate, weight, self.eps, self.group_size,
                                self.norm_before_gate)

    def extra_repr(self):
        return (f"{self.hidden_size}, eps={self.eps}, group_size={self.group_size}, "
                f"norm_before_gate={self.norm_before_gate}")
