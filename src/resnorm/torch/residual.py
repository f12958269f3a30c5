"""torch.autograd.Functions for resnorm's fused residual kernels: Pre-Norm add + norm with
dropout, and inverted dropout.

Pre-Norm (resnorm.add_rms_norm / add_layer_norm):  h = residual + alpha * dropout(x, p, seed),
y = norm(h); apply returns (y, h): y feeds the next sublayer, h is the new residual stream.
One pass over memory: x and residual are read once, y and h written once.  Backward takes
the gradients of both outputs (that of h may be absent) and never stores the dropout mask:
the kernel regenerates it from (seed, index).

alpha: a real number (fixed, no gradient), or a tensor of shape () or (D,) of x's dtype
(a learnable scalar / LayerScale vector: it gets a gradient when it requires grad).
ctx keeps resnorm's cache (h by reference, the float64 row statistics, x only for a tensor
alpha) and saves h, the weight and (when alpha requires grad) x, so that autograd catches
an in-place change of any of them before backward.

Second derivatives: a backward asked to build a graph (create_graph=True) returns
differentiable torch expressions of the same formulas (resnorm.torch.composite).
torch.compile / torch.jit.trace see the fused call as torch's add and resnorm's dropout and
norm operators.  torch.func transforms (vmap, grad, jvp) and forward-mode AD are refused
with a message that names the alternative.
"""
import numpy as np
import torch

import resnorm

from . import _tensors as T
from . import composite, kernels, ops
from .functions import norm

_NO_TRANSFORMS = ("{name} does not support torch.func transforms (vmap, grad, jacrev, ...) "
                  "or forward-mode AD. Compose what it fuses instead: h = residual + alpha * "
                  "torch.nn.functional.dropout(x, p); y = resnorm.torch.{norm}(h, ...), "
                  "which supports them.")


def _refuse_transforms(name, norm_name):
    if T.functorch_active():
        raise RuntimeError(_NO_TRANSFORMS.format(name=f"resnorm.torch.{name}", norm=norm_name))


def _alpha_arg(alpha, x, wanted):
    """alpha as resnorm takes it: a number as is, a tensor as a NumPy view, except that a
    0-d tensor whose gradient is not wanted is passed as its (exact) value, so that
    resnorm neither keeps x nor computes dalpha for it."""
    alpha = T.scale_tensor(alpha, x)
    if not isinstance(alpha, torch.Tensor):
        return alpha
    if alpha.dim() == 0 and not wanted:
        return alpha.item()
    return T.view(alpha)


def _forward(ctx, layer, x, residual, weight, bias, alpha, eps, p, seed, training):
    """Checks, runs resnorm's fused forward; keeps its cache on ctx; returns (y, h)."""
    x = T.input_tensor(x)
    residual = T.partner(residual, "residual", x)
    T.param_tensor(weight, "weight", x)
    T.param_tensor(bias, "bias", x)
    eps = T.eps_for(eps, x)
    options = dict(alpha=_alpha_arg(alpha, x, ctx.needs_input_grad[3]), p=p, seed=seed,
                   training=training, n_threads=T.threads())
    if layer:
        (y, h), ctx.cache = resnorm.add_layer_norm_forward(
            T.view(x), T.view(residual), T.view(weight), T.view(bias), eps, **options)
    else:
        (y, h), ctx.cache = resnorm.add_rms_norm_forward(
            T.view(x), T.view(residual), T.view(weight), eps, **options)
    y, h = T.tensor(y), T.tensor(h)
    ctx.alpha, ctx.eps, ctx.p, ctx.seed, ctx.training = alpha, eps, p, seed, training
    ctx.has_bias = bias is not None
    ctx.set_materialize_grads(False)   # an unused h must not cost a tensor of zeros
    ctx.save_for_backward(h, weight, x if ctx.needs_input_grad[3] else None)
    return y, h


def _backward(ctx, layer, dy, dh):
    """(dx, dresidual, dweight, dalpha, dbias), None where autograd wants none: resnorm's
    fused backward, or differentiable torch expressions when a graph is to be built."""
    h, weight, x = ctx.saved_tensors   # also autograd's in-place check of h, weight, x
    want = ctx.needs_input_grad
    if torch.is_grad_enabled():
        grads = composite.add_norm_backward(
            dy, dh, h, x, weight, ctx.has_bias, ctx.alpha, ctx.eps, layer,
            lambda t: dropout(t, ctx.p, seed=ctx.seed, training=ctx.training))
    else:
        dy = torch.zeros_like(h) if dy is None else dy
        if layer:
            dx, dres, dw, db, dalpha = resnorm.add_layer_norm_backward(
                T.view(dy), T.view(dh), ctx.cache, n_threads=T.threads())
        else:
            (dx, dres, dw, dalpha), db = resnorm.add_rms_norm_backward(
                T.view(dy), T.view(dh), ctx.cache, n_threads=T.threads()), None
        grads = tuple(T.tensor(g) for g in (dx, dres, dw, dalpha, db))
    wanted = (*want[:4], layer and want[4])
    return tuple(g if w else None for g, w in zip(grads, wanted))


class AddRMSNormFunction(torch.autograd.Function):
    """h = residual + alpha * dropout(x);  y = h * rstd * w,  rstd = 1/sqrt(mean(h^2) + eps).

    Backward: gh = dh + rstd*(g - hn*mean(g*hn)), g = dy*w, hn = h*rstd; dresidual = gh;
    dx = gh * alpha * keep/(1-p); dweight = sum dy*hn; dalpha = sum gh * dropout(x).
    NumPy reference: resnorm.reference.add_rms_norm_forward / add_rms_norm_backward.
    apply(x, residual, weight or None, alpha, eps, p, seed, training) -> (y, h).
    """

    @staticmethod
    def forward(ctx, x, residual, weight, alpha, eps, p, seed, training):
        return _forward(ctx, False, x, residual, weight, None, alpha, eps, p, seed, training)

    @staticmethod
    def backward(ctx, dy, dh):
        return _backward(ctx, False, dy, dh)[:4] + (None,) * 4

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(_NO_TRANSFORMS.format(name="resnorm.torch.add_rms_norm",
                                                 norm="rms_norm"))


class AddLayerNormFunction(torch.autograd.Function):
    """h = residual + alpha * dropout(x);  y = (h - mean) * rstd * w + b.

    Backward: hhat = (h-mean)*rstd, g = dy*w, gh = dh + rstd*(g - mean(g) - hhat*mean(g*hhat));
    dresidual = gh; dx = gh * alpha * keep/(1-p); dweight = sum dy*hhat; dbias = sum dy;
    dalpha = sum gh * dropout(x).
    NumPy reference: resnorm.reference.add_layer_norm_forward / add_layer_norm_backward.
    apply(x, residual, weight or None, alpha, bias or None, eps, p, seed, training) -> (y, h)
    (alpha before bias, so that both Functions have x, residual, weight, alpha first).
    """

    @staticmethod
    def forward(ctx, x, residual, weight, alpha, bias, eps, p, seed, training):
        return _forward(ctx, True, x, residual, weight, bias, alpha, eps, p, seed, training)

    @staticmethod
    def backward(ctx, dy, dh):
        return _backward(ctx, True, dy, dh) + (None,) * 4

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(_NO_TRANSFORMS.format(name="resnorm.torch.add_layer_norm",
                                                 norm="layer_norm"))


class DropoutFunction(torch.autograd.Function):
    """y = x * keep / (1 - p),  keep_k = [Philox uniform(seed, k) >= floor(p * 2**32)].

    Backward: dx = dy * keep / (1 - p), the mask regenerated from (seed, k): nothing is saved
    (the backward is this Function again, so it is differentiable any number of times).
    Forward-mode AD: the tangent gets the same mask.
    NumPy reference: resnorm.reference.dropout_forward / dropout_backward.
    apply(x, p, seed) (training mode; see resnorm.torch.dropout for eval and p = 0).
    """

    @staticmethod
    def forward(ctx, x, p, seed):
        ctx.p, ctx.seed = p, seed
        return kernels.dropout(T.input_tensor(x), p, seed)

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            return DropoutFunction.apply(dy, ctx.p, ctx.seed), None, None
        return kernels.dropout(dy, ctx.p, ctx.seed), None, None

    @staticmethod
    def jvp(ctx, dx, _dp, _dseed):
        return DropoutFunction.apply(dx, ctx.p, ctx.seed)


def _fused(fn, name, norm_name, layer, x, residual, weight, bias, alpha, eps, p, seed,
           training):
    _refuse_transforms(name, norm_name)
    if T.graph_capture():
        h = residual + alpha * dropout(x, p, seed=seed, training=training)
        return norm(layer, h, weight, bias, eps), h
    args = (x, residual, weight, alpha) + ((bias,) if layer else ())
    return fn.apply(*args, eps, p, seed, training)


def add_rms_norm(x, residual, weight=None, eps=1e-6, *, alpha=1.0, p=0.0, seed=0,
                 training=True):
    """Pre-Norm:  h = residual + alpha * dropout(x),  y = rms_norm(h, weight, eps).

    Differentiable (AddRMSNormFunction), also twice.

    Parameters
    ----------
    x, residual : torch.Tensor
        float32/float64 CPU tensors of one shape (..., D) and dtype: the sublayer's output
        and the residual stream.
    weight : torch.Tensor or None
        (D,) of x's dtype.
    eps : float or None
        None: torch.finfo(x.dtype).eps.
    alpha : float or torch.Tensor
        A number (fixed), or a tensor of shape () or (D,) of x's dtype (learnable).
    p, seed, training
        Dropout of x: probability in [0, 1], an int seed in [0, 2**64) (the mask is a
        function of (seed, element index)), training=False turns it off.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        (y, h): the normalised output and the new residual stream.

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message; RuntimeError inside torch.func transforms.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> y, h = rt.add_rms_norm(torch.ones(1, 2), torch.tensor([[2.0, 3.0]]), eps=1e-12)
    >>> h
    tensor([[3., 4.]])

    NumPy reference: resnorm.reference.add_rms_norm_forward.
    """
    return _fused(AddRMSNormFunction, "add_rms_norm", "rms_norm", False, x, residual, weight,
                  None, alpha, eps, p, seed, training)


def add_layer_norm(x, residual, weight=None, bias=None, eps=1e-5, *, alpha=1.0, p=0.0, seed=0,
                   training=True):
    """Pre-Norm:  h = residual + alpha * dropout(x),  y = layer_norm(h, weight, bias, eps).

    Differentiable (AddLayerNormFunction), also twice.  Arguments as add_rms_norm, plus
    bias (D,) or None.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        (y, h).

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message; RuntimeError inside torch.func transforms.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> y, h = rt.add_layer_norm(torch.ones(1, 2), torch.tensor([[0.0, 2.0]]), eps=1e-12)
    >>> y
    tensor([[-1.,  1.]])

    NumPy reference: resnorm.reference.add_layer_norm_forward.
    """
    return _fused(AddLayerNormFunction, "add_layer_norm", "layer_norm", True, x, residual,
                  weight, bias, alpha, eps, p, seed, training)


def dropout(x, p, *, seed, training=True):
    """Inverted dropout: y = x * keep / (1 - p) in training; x itself in eval mode and for
    p = 0 (as torch.nn.functional.dropout).

    Differentiable (DropoutFunction) any number of times, and in forward mode.

    Parameters
    ----------
    x : torch.Tensor
        float32/float64 CPU tensor of any shape.
    p : float
        Probability in [0, 1] of dropping an element.
    seed : int
        In [0, 2**64): the mask is a function of (seed, element index), the same on any
        thread count; draw a fresh one per call and step.
    training : bool
        False: no dropout.

    Returns
    -------
    torch.Tensor
        y (x itself when dropout is off).

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> x = torch.ones(4)
    >>> rt.dropout(x, 0.5, seed=1, training=False) is x
    True

    NumPy reference: resnorm.reference.dropout_forward.
    """
    x = T.input_tensor(x)
    if T.graph_capture():
        if not training or p == 0:
            return x
        return ops.dropout(x, p, ops.dropout_seed(seed))
    if training is False or p == 0:
        # no kernel runs: resnorm checks p, seed and training on a one-element array
        resnorm.dropout(np.zeros(1, T.NUMPY_DTYPES[x.dtype]), p, seed=seed,
                        training=training)
        return x
    if T.functorch_active():
        raise RuntimeError("resnorm.torch.dropout does not support torch.func transforms: "
                           "its mask is a function of the element index, not of the sample; "
                           "use torch.nn.functional.dropout inside vmap / grad")
    return DropoutFunction.apply(x, p, seed)
