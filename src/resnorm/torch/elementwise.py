"""torch.autograd.Functions for resnorm's scaled and gated residuals.

Scaled (resnorm.scaled_residual):  h = x + alpha * F, alpha a number (fixed), or a tensor of
shape () or (D,) of x's dtype (a learnable scalar, LayerScale).
Gated (resnorm.gated_residual):  h = x + sigmoid(g) * F, g of F's shape or (D,) (a gate per
channel).

Backward runs resnorm's backward kernel on the forward's cache (which keeps F, g and a
tensor alpha by reference; ctx saves them too, so that autograd catches an in-place change
before backward).  A backward asked to build a graph (create_graph=True) returns the same formulas
in torch operations, so double backward is exact.  Inside torch.func transforms, a
forward-mode AD level or while torch.compile / torch.jit.trace record a graph, the
functions compute the same formula with torch's own operations (elementwise, they fuse
nothing that torch would not).
"""
import torch

import resnorm

from . import _tensors as T
from .composite import channel_sum
from .residual import alpha_arg, saved_scale


def _inputs(x, F):
    x = T.input_tensor(x)
    return x, T.partner(F, "F", x)


def _gate(g, x):
    """g checked where torch knows more than resnorm: a CPU tensor of x's dtype (its shape,
    F's or (D,), is checked by resnorm)."""
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"g must be a torch.Tensor, got {type(g).__name__}")
    return T.scale_tensor(g, x, "g")


def _composed(x):
    """True when the formula is to be computed with torch operations: a graph being
    recorded, torch.func transforms, forward-mode AD."""
    return T.graph_capture() or T.transforms_active()


def _summed_like(t, like):
    """t summed to like's shape: over everything for a 0-d like, over the rows for (D,)."""
    if like.shape == t.shape:
        return t
    return t.sum() if like.dim() == 0 else channel_sum(t)


class ScaledResidualFunction(torch.autograd.Function):
    """h = x + alpha * F.

    Backward: dx = dh, dF = alpha * dh, dalpha = sum dh * F (over rows; over everything for
    a scalar alpha).  NumPy reference: resnorm.reference.scaled_residual_forward /
    scaled_residual_backward.  apply(x, F, alpha) -> h.
    """

    @staticmethod
    def forward(ctx, x, F, alpha):
        x, F = _inputs(x, F)
        wanted = ctx.needs_input_grad[2]
        h, ctx.cache = resnorm.scaled_residual_forward(
            T.view(x), T.view(F), alpha_arg(alpha, x, wanted), n_threads=T.threads())
        # dF = alpha * dh: a tensor alpha is saved, so that an in-place change of it before
        # backward is refused by autograd instead of read
        ctx.alpha, alpha_t = saved_scale(alpha)
        ctx.save_for_backward(F if wanted else None, alpha_t)
        return T.tensor(h)

    @staticmethod
    def backward(ctx, dh):
        F, alpha = ctx.saved_tensors
        want = ctx.needs_input_grad
        if torch.is_grad_enabled():
            alpha = ctx.alpha if alpha is None else alpha
            grads = (dh, alpha * dh, _summed_like(dh * F, alpha) if want[2] else None)
        else:
            dx, dF, dalpha = resnorm.scaled_residual_backward(T.view(dh), ctx.cache,
                                                              n_threads=T.threads())
            grads = (T.tensor(dx), T.tensor(dF), T.tensor(dalpha))
        return tuple(g if w else None for g, w in zip(grads, want))


class GatedResidualFunction(torch.autograd.Function):
    """h = x + sigmoid(g) * F.

    Backward, s = sigmoid(g): dx = dh, dF = s * dh, dg = F * (dh * s(1 - s)) (summed over
    rows for a (D,) g).  NumPy reference: resnorm.reference.gated_residual_forward /
    gated_residual_backward.  apply(x, F, g) -> h.
    """

    @staticmethod
    def forward(ctx, x, F, g):
        x, F = _inputs(x, F)
        _gate(g, x)
        h, ctx.cache = resnorm.gated_residual_forward(T.view(x), T.view(F), T.view(g),
                                                      n_threads=T.threads())
        ctx.save_for_backward(F, g)
        return T.tensor(h)

    @staticmethod
    def backward(ctx, dh):
        F, g = ctx.saved_tensors
        want = ctx.needs_input_grad
        if torch.is_grad_enabled():
            s = torch.sigmoid(g)
            grads = (dh, s * dh, _summed_like(F * (dh * (s * (1 - s))), g))
        else:
            grads = tuple(T.tensor(t) for t in resnorm.gated_residual_backward(
                T.view(dh), ctx.cache, n_threads=T.threads()))
        return tuple(t if w else None for t, w in zip(grads, want))


def scaled_residual(x, F, alpha):
    """Scaled residual: h = x + alpha * F (a weighted skip, ReZero, LayerScale).

    Differentiable (ScaledResidualFunction), also twice.

    Parameters
    ----------
    x, F : torch.Tensor
        float32, float64, float16 or bfloat16 CPU tensors of one shape (..., D) and dtype:
        the residual stream and the branch.
    alpha : float or torch.Tensor
        A number (fixed), or a tensor of shape () or (D,) of x's dtype (learnable).

    Returns
    -------
    torch.Tensor
        h, a new tensor.

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.scaled_residual(torch.ones(1, 2), torch.ones(1, 2), torch.tensor([0.5, 2.0]))
    tensor([[1.5000, 3.0000]])

    NumPy reference: resnorm.reference.scaled_residual_forward.
    """
    if _composed(x):
        return x + alpha * F
    return ScaledResidualFunction.apply(x, F, alpha)


def gated_residual(x, F, g):
    """Gated residual: h = x + sigmoid(g) * F.

    Differentiable (GatedResidualFunction), also twice.

    Parameters
    ----------
    x, F : torch.Tensor
        float32, float64, float16 or bfloat16 CPU tensors of one shape (..., D) and dtype.
    g : torch.Tensor
        Gate logits of F's shape (computed by another layer), or (D,) (one per channel),
        of x's dtype.

    Returns
    -------
    torch.Tensor
        h, a new tensor.

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.gated_residual(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(2))
    tensor([[0.5000, 0.5000]])

    NumPy reference: resnorm.reference.gated_residual_forward.
    """
    if _composed(x):
        return x + torch.sigmoid(g) * F
    return GatedResidualFunction.apply(x, F, g)
