"""Differentiable RMSNorm and LayerNorm on CPU tensors: the functional forms, their
torch.autograd.Functions, and the choice of path for each call.

Which path a call takes (``norm``), cheapest first:

* no gradient wanted (torch.no_grad, inference_mode, or no input requires grad): resnorm's
  inference function straight into a fresh tensor, no autograd node;
* gradients wanted: the autograd Function (forward and backward kernels, first order);
* torch.compile or torch.jit.trace recording a graph: the custom operators of
  resnorm.torch.ops, so resnorm appears as one node of the graph;
* inside torch.func transforms or a forward-mode AD dual level: the Function through
  torch's full machinery, which calls its vmap / jvp rules.

Second derivatives: a backward asked to build a graph (create_graph=True, and everything
under torch.func.grad) returns resnorm.torch.composite's differentiable expressions, so
double backward is exact (checked with torch.autograd.gradgradcheck).
"""
import torch

from . import _tensors as T
from . import composite, kernels, ops


class _NormFunction(torch.autograd.Function):
    """The apply of both norm Functions: outside torch.func transforms it skips
    Function.apply's per-call signature binding (which costs as much as a small norm);
    inside them it is torch's Function.apply, which dispatches to the vmap / jvp rules."""

    @classmethod
    def apply(cls, *args):
        if T.functorch_active():
            return super().apply(*args)
        return super(torch.autograd.Function, cls).apply(*args)


def _vmap(cls, info, in_dims, x, params, eps):
    """The vmap rule of both Functions: the batch dimension becomes more rows of x (x is
    expanded when only a parameter is batched); batched parameters are applied with torch
    operations after an unweighted norm (the kernels take one (D,) weight)."""
    x_dim, param_dims = in_dims[0], in_dims[1:1 + len(params)]
    b = info.batch_size
    x = x.movedim(x_dim, 0) if x_dim is not None else x.expand(b, *x.shape)
    if all(d is None for d in param_dims):
        y, cache = cls.apply(x, *params, eps)
    else:
        y, cache = cls.apply(x, *([None] * len(params)), eps)
        shape = (b,) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        for op, p, d in zip((torch.mul, torch.add), params, param_dims):
            if p is not None:
                y = op(y, p if d is None else p.movedim(d, 0).reshape(shape))
    return (y, cache), (0, None)


def _setup(ctx, x, weight, bias, eps, output):
    """The common setup_context: the cache for the kernels, x and weight for autograd's
    in-place check and for the differentiable backward."""
    ctx.cache, ctx.eps, ctx.has_bias = output[1], eps, bias is not None
    ctx.save_for_backward(x, weight)
    if T.transforms_active():   # a jvp may follow
        ctx.save_for_forward(x, weight)


def _rms_kernel_backward(ctx, dy):
    return kernels.rms_norm_backward(dy, ctx.cache)


class RMSNormFunction(_NormFunction):
    """y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps) over the last axis.

    ``RMSNormFunction.apply(x, weight, eps, views=None) -> (y, cache)``: x (..., D), weight
    (D,) or None, eps a positive float; views: optional (weight_view,), the NumPy view of
    the weight its caller already holds (a module's); cache is resnorm's RMSNormCache
    (NumPy views of x and the weight, the float64 rstd of each row), what backward
    consumes.  resnorm.torch.rms_norm checks the arguments and returns y alone.

    Backward: dx = rstd * (g - xn * mean(g*xn)), g = dy*w, xn = x*rstd; dw = sum_rows dy*xn.
    NumPy reference: resnorm.reference.rms_norm_forward / rms_norm_backward.
    Supports double backward, forward-mode AD (jvp) and torch.func.vmap.
    """

    @staticmethod
    def forward(x, weight, eps, views=None):
        return kernels.rms_norm_forward(x, weight, eps, views and views[0])

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, eps = inputs[:3]
        _setup(ctx, x, weight, None, eps, output)

    @staticmethod
    def backward(ctx, dy, _dcache):
        return composite.gradients(ctx, dy, False, _rms_kernel_backward)

    @staticmethod
    def jvp(ctx, dx, dweight, _deps, _dviews=None):
        x, weight = ctx.saved_tensors
        return composite.norm_jvp(x, weight, ctx.eps, False, dx, dweight, None), None

    @staticmethod
    def vmap(info, in_dims, x, weight, eps, views=None):
        return _vmap(RMSNormFunction, info, in_dims, x, (weight,), eps)


def _layer_kernel_backward(ctx, dy):
    return kernels.layer_norm_backward(dy, ctx.cache)


class LayerNormFunction(_NormFunction):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps) over the last axis.

    ``LayerNormFunction.apply(x, weight, bias, eps, views=None) -> (y, cache)``: weight,
    bias (D,) or None independently; views: optional (weight_view, bias_view) the caller
    already holds; cache is resnorm's LayerNormCache (views of x and the weight, the
    float64 mean and rstd of each row), what backward consumes.
    resnorm.torch.layer_norm checks the arguments and returns y alone.

    Backward: xhat = (x-mean)*rstd, g = dy*w: dx = rstd*(g - mean(g) - xhat*mean(g*xhat)),
    dw = sum_rows dy*xhat, db = sum_rows dy.
    NumPy reference: resnorm.reference.layer_norm_forward / layer_norm_backward.
    Supports double backward, forward-mode AD (jvp) and torch.func.vmap.
    """

    @staticmethod
    def forward(x, weight, bias, eps, views=None):
        return kernels.layer_norm_forward(x, weight, bias, eps, *(views or ()))

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, eps = inputs[:4]
        _setup(ctx, x, weight, bias, eps, output)

    @staticmethod
    def backward(ctx, dy, _dcache):
        return composite.gradients(ctx, dy, True, _layer_kernel_backward)

    @staticmethod
    def jvp(ctx, dx, dweight, dbias, _deps, _dviews=None):
        x, weight = ctx.saved_tensors
        return composite.norm_jvp(x, weight, ctx.eps, True, dx, dweight, dbias), None

    @staticmethod
    def vmap(info, in_dims, x, weight, bias, eps, views=None):
        return _vmap(LayerNormFunction, info, in_dims, x, (weight, bias), eps)


def wants_grad(x, weight, bias):
    """True when autograd must record this norm: grad mode on and an input requiring grad."""
    return torch.is_grad_enabled() and (x.requires_grad
                                        or (weight is not None and weight.requires_grad)
                                        or (bias is not None and bias.requires_grad))


def norm(layer, x, weight, bias, eps, views=None):
    """One norm call on the cheapest path that computes it (see the module docstring).

    layer: LayerNorm (else RMSNorm, bias None).  views: NumPy views (weight, bias) the
    caller already holds for these parameters (a module's ParamViews), or None.
    """
    x = T.input_tensor(x)
    eps = T.eps_for(eps, x)
    T.param_tensor(weight, "weight", x)
    T.param_tensor(bias, "bias", x)
    if T.graph_capture():
        if layer:
            return ops.layer_norm(x, weight, bias, eps)[0]
        return ops.rms_norm(x, weight, eps)[0]
    if not (wants_grad(x, weight, bias) or T.transforms_active()):
        try:
            if layer:
                return kernels.layer_norm(x, *(views or (T.view(weight), T.view(bias))), eps)
            return kernels.rms_norm(x, views[0] if views else T.view(weight), eps)
        except T.NoStorage:
            pass   # a batched tensor outside torch.func: the Function's rules take it
    if layer:
        return LayerNormFunction.apply(x, weight, bias, eps, views)[0]
    return RMSNormFunction.apply(x, weight, eps, views)[0]


def rms_norm(x, weight=None, eps=1e-6):
    """y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps), over the last axis of x (..., D).

    Differentiable (RMSNormFunction), also twice, and under torch.compile, torch.func.vmap
    and forward-mode AD.

    Parameters
    ----------
    x : torch.Tensor
        float32 or float64 CPU tensor of shape (..., D).
    weight : torch.Tensor or None
        (D,) of x's dtype, or None (w = 1).
    eps : float or None
        Added to mean(x^2); None means torch.finfo(x.dtype).eps, as in torch.

    Returns
    -------
    torch.Tensor
        y, a new tensor of x's shape and dtype.

    Raises
    ------
    TypeError
        x or weight not a tensor, not on the CPU, not dense, or of another dtype
        (half precision included).
    ValueError
        weight of the wrong shape, x without a last axis, eps not finite and > 0.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> x = torch.tensor([[3.0, 4.0]])
    >>> rt.rms_norm(x, eps=1e-12)
    tensor([[0.8485, 1.1314]])

    NumPy reference: resnorm.reference.rms_norm_forward.
    """
    return norm(False, x, weight, None, eps)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps), over the last axis of x.

    Differentiable (LayerNormFunction), also twice, and under torch.compile, torch.func.vmap
    and forward-mode AD.

    Parameters
    ----------
    x : torch.Tensor
        float32 or float64 CPU tensor of shape (..., D).
    weight, bias : torch.Tensor or None
        (D,) of x's dtype, or None, independently.
    eps : float or None
        Added to the (biased) variance; None means torch.finfo(x.dtype).eps.

    Returns
    -------
    torch.Tensor
        y, a new tensor of x's shape and dtype.

    Raises
    ------
    TypeError, ValueError
        As rms_norm.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.layer_norm(torch.tensor([[1.0, 3.0]]), eps=1e-12)
    tensor([[-1.,  1.]])

    NumPy reference: resnorm.reference.layer_norm_forward.
    """
    return norm(True, x, weight, bias, eps)
