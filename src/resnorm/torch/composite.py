"""The norms' derivatives written in torch operations, for what resnorm's kernels do not
compute: second derivatives (a backward that is itself differentiated), forward-mode
derivatives (jvp) and backward passes inside torch.func transforms.

The formulas are those of resnorm.reference (and docs/rms_norm.md, docs/layer_norm.md),
with the row statistics recomputed from x in x's dtype so that every result stays
differentiable:

    RMSNorm:    xhat = x * rstd,              rstd = 1/sqrt(mean(x^2) + eps)
    LayerNorm:  xhat = (x - mean(x)) * rstd,  rstd = 1/sqrt(var(x) + eps)
    y = xhat * w + b

xhat's Jacobian J is symmetric, J g = rstd * (g - [mean(g)] - xhat * mean(g * xhat)) (the
bracket for LayerNorm only), so the same expression gives dx = J (dy * w) in backward and
the tangent J dx in forward mode.
"""
import torch

from ._tensors import NoStorage


def normalized(x, eps, layer):
    """(xhat, rstd) of x over its last axis, in x's dtype (rstd keeps the reduced axis)."""
    xc = x - x.mean(-1, keepdim=True) if layer else x
    rstd = (xc * xc).mean(-1, keepdim=True).add(eps).rsqrt()
    return xc * rstd, rstd


def jacobian_times(xhat, rstd, g, layer):
    """J g for J = d xhat / d x (symmetric: also the vector-Jacobian product)."""
    if layer:
        g = g - g.mean(-1, keepdim=True)
    return rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))


def channel_sum(t):
    """t summed over every axis but the last: a (D,) parameter gradient."""
    return t.reshape(-1, t.shape[-1]).sum(0)


def norm_backward(dy, x, weight, has_bias, eps, layer, want):
    """(dx, dweight, dbias) as differentiable torch expressions; None where want[i] is
    False or the parameter is absent."""
    xhat, rstd = normalized(x, eps, layer)
    g = dy if weight is None else dy * weight
    dx = jacobian_times(xhat, rstd, g, layer) if want[0] else None
    dw = channel_sum(dy * xhat) if want[1] and weight is not None else None
    db = channel_sum(dy) if want[2] and has_bias else None
    return dx, dw, db


def norm_jvp(x, weight, eps, layer, dx, dweight, dbias):
    """The tangent of y = xhat * w + b for tangents dx, dweight, dbias (each may be None)."""
    xhat, rstd = normalized(x, eps, layer)
    t = xhat * 0 if dx is None else jacobian_times(xhat, rstd, dx, layer)
    if weight is not None:
        t = t * weight
    if dweight is not None:
        t = t + xhat * dweight
    if dbias is not None:
        t = t + dbias
    return t


def add_norm_backward(dy, dh, h, x, weight, has_bias, alpha, eps, layer, drop):
    """The fused Pre-Norm add + norm's gradients (dx, dresidual, dweight, dalpha, dbias) as
    differentiable torch expressions (h = residual + alpha * drop(x), y = norm(h)):

        gh = dh + J (dy * w)  (J from h's statistics);  dresidual = gh;
        dx = alpha * drop(gh);  dalpha = sum gh * drop(x);  dweight = sum dy * hhat;
        dbias = sum dy.

    dy or dh may be None (that output unused); x is None when alpha needs no gradient.
    """
    hhat, rstd = normalized(h, eps, layer)
    gh = dh
    if dy is not None:
        gn = jacobian_times(hhat, rstd, dy if weight is None else dy * weight, layer)
        gh = gn if dh is None else gn + dh
    dx = drop(gh) * alpha
    dalpha = None
    if x is not None:
        s = gh * drop(x)
        dalpha = s.sum() if alpha.dim() == 0 else channel_sum(s)
    dw = channel_sum(dy * hhat) if dy is not None and weight is not None else None
    db = channel_sum(dy) if dy is not None and has_bias else None
    return dx, gh, dw, dalpha, db


def gradients(ctx, dy, layer, kernel_backward):
    """What a norm's autograd backward returns: (dx, dweight, [dbias,] None for eps, ...).

    ctx holds x and weight as its first saved tensors (unpacking them is also autograd's
    check that x was not modified in place since forward), eps and has_bias.  Normally the
    gradients come from kernel_backward(ctx, dy) -> (dx, dweight, dbias), resnorm's
    backward kernel.  With create_graph=True (torch.is_grad_enabled() inside backward; also
    how torch.func.grad runs backward) they come from norm_backward's differentiable
    expressions, so that they can be differentiated again; for a batched dy (no storage to
    view: vmap over autograd.grad, gradcheck's batched gradients) from the same.
    """
    x, weight = ctx.saved_tensors[:2]
    want = ctx.needs_input_grad
    if dy is None:
        return (None,) * len(want)
    grads = None
    if not torch.is_grad_enabled():
        try:
            grads = kernel_backward(ctx, dy)
        except NoStorage:   # a batched dy: vmap over autograd.grad, gradcheck's batches
            pass
    if grads is None:
        grads = norm_backward(dy, x, weight, ctx.has_bias, ctx.eps, layer, want)
    dx, dw, db = grads
    rest = (None,) * (len(want) - (3 if layer else 2))
    if layer:
        return (dx if want[0] else None, dw if want[1] else None, db if want[2] else None,
                *rest)
    return (dx if want[0] else None, dw if want[1] else None, *rest)
