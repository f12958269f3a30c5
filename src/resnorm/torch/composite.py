"""The norms' derivatives written in torch operations, for what resnorm's kernels do not
compute: second derivatives (a backward that is itself differentiated), forward-mode
derivatives (jvp) and backward passes inside torch.func transforms.

The formulas are those of resnorm.reference (and docs/rms_norm.md, docs/layer_norm.md),
with the row statistics recomputed from x in x's dtype so that every result stays
differentiable:

    RMSNorm:    xhat = x * rstd,              rstd = 1/sqrt(mean(x^2) + eps)
    LayerNorm:  xhat = (x - mean(x)) * rstd,  rstd = 1/sqrt(var(x) + eps)
    y = xhat * w + b          (w: the gain, 1 + weight for a zero-centred weight)

The means run over a row: the last `axes` axes of x (normalized_shape).  xhat's Jacobian J
is symmetric, J g = rstd * (g - [mean(g)] - xhat * mean(g * xhat)) (the bracket for
LayerNorm only), so the same expression gives dx = J (dy * w) in backward and the tangent
J dx in forward mode.  The gain's derivative is that of the weight, so dweight = sum dy *
xhat either way.

norm_float64 and gated_norm_float64 are the forward computed in float64, which
torch.compile records for small calls instead of resnorm's operators.

The gated RMSNorm (gated_norm, gated_backward, gated_jvp) normalises groups of
consecutive elements of a row, u = x * silu(gate) before the norm, or the norm's output
times silu(gate) after it: the same J per group, with the chain rule through the gate.
"""
import torch

from ._tensors import NoStorage


def _row(axes):
    """The dims of a row: the last `axes` axes."""
    return tuple(range(-axes, 0))


def normalized(x, eps, layer, axes=1):
    """(xhat, rstd) of x over its rows, in x's dtype (rstd keeps the reduced axes)."""
    dims = _row(axes)
    xc = x - x.mean(dims, keepdim=True) if layer else x
    rstd = (xc * xc).mean(dims, keepdim=True).add(eps).rsqrt()
    return xc * rstd, rstd


def norm_float64(x, weight, bias, eps, layer, axes=1, zero_centered=False):
    """y of the norm computed in float64 and rounded once to x's dtype: what torch.compile
    records for a small call (resnorm.torch._tensors.records_expression), at least as
    accurate as the kernel.  The gain is formed in the weight's dtype, as the kernels form
    it."""
    xhat, _ = normalized(x.double(), eps, layer, axes)
    w = gain(weight, zero_centered)
    y = xhat if w is None else xhat * w.double()
    return (y if bias is None else y + bias.double()).to(x.dtype)


def jacobian_times(xhat, rstd, g, layer, axes=1):
    """J g for J = d xhat / d x (symmetric: also the vector-Jacobian product)."""
    dims = _row(axes)
    if layer:
        g = g - g.mean(dims, keepdim=True)
    return rstd * (g - xhat * (g * xhat).mean(dims, keepdim=True))


def channel_sum(t, axes=1):
    """t summed over every axis but the last `axes`: a parameter gradient of a row's
    shape."""
    row = t.shape[t.dim() - axes:]
    return t.reshape((-1,) + tuple(row)).sum(0)


def gain(weight, zero_centered):
    """The factor a norm applies: weight, or 1 + weight (None stays None)."""
    return weight + 1 if weight is not None and zero_centered else weight


def norm_backward(dy, x, weight, has_bias, eps, layer, want, axes=1, zero_centered=False):
    """(dx, dweight, dbias) as differentiable torch expressions; None where want[i] is
    False or the parameter is absent."""
    xhat, rstd = normalized(x, eps, layer, axes)
    w = gain(weight, zero_centered)
    g = dy if w is None else dy * w
    dx = jacobian_times(xhat, rstd, g, layer, axes) if want[0] else None
    dw = channel_sum(dy * xhat, axes) if want[1] and weight is not None else None
    db = channel_sum(dy, axes) if want[2] and has_bias else None
    return dx, dw, db


def norm_jvp(x, weight, eps, layer, dx, dweight, dbias, axes=1, zero_centered=False):
    """The tangent of y = xhat * w + b for tangents dx, dweight, dbias (each may be None)."""
    xhat, rstd = normalized(x, eps, layer, axes)
    t = xhat * 0 if dx is None else jacobian_times(xhat, rstd, dx, layer, axes)
    w = gain(weight, zero_centered)
    if w is not None:
        t = t * w
    if dweight is not None:
        t = t + xhat * dweight
    if dbias is not None:
        t = t + dbias
    return t


def grouped(t, group_size):
    """t (..., D) seen as (..., D / group_size, group_size): the gated RMSNorm's groups."""
    return t.reshape(tuple(t.shape[:-1]) + (t.shape[-1] // group_size, group_size))


def silu_parts(gate):
    """(silu(gate), silu'(gate)): silu(z) = z * s, silu'(z) = s * (1 + z * (1 - s)),
    s = sigmoid(z)."""
    s = torch.sigmoid(gate)
    return gate * s, s * (1 + gate * (1 - s))


def gated_norm(x, gate, weight, eps, group_size, norm_before_gate):
    """The gated RMSNorm as a torch expression (each group of group_size consecutive
    elements of a row normalised on its own):

        gate before the norm:  u = x * silu(gate),  y = u * rstd(u) * w
        norm before the gate:  y = x * rstd(x) * w * silu(gate)

    gate None: y = x * rstd(x) * w; weight None: w = 1."""
    silu = None if gate is None else silu_parts(gate)[0]
    v = x * silu if silu is not None and not norm_before_gate else x
    vn, _ = normalized(grouped(v, group_size), eps, False)
    y = vn.reshape(x.shape)
    if weight is not None:
        y = y * weight
    return y * silu if silu is not None and norm_before_gate else y


def gated_norm_float64(x, gate, weight, eps, group_size, norm_before_gate):
    """gated_norm computed in float64 and rounded once to x's dtype (as norm_float64)."""
    return gated_norm(x.double(), None if gate is None else gate.double(),
                      None if weight is None else weight.double(), eps, group_size,
                      norm_before_gate).to(x.dtype)


def gated_backward(dy, x, gate, weight, eps, group_size, norm_before_gate, want):
    """(dx, dgate, dweight) of the gated RMSNorm as differentiable torch expressions; None
    where want[i] is False or the input is absent.

    Gate before the norm:  un = u * rstd, g = dy * w:  du = J g (per group),
        dx = du * silu(z),  dgate = du * x * silu'(z),  dweight = sum dy * un.
    Norm before the gate:  xn = x * rstd, a = xn * w, da = dy * silu(z):
        dgate = dy * a * silu'(z),  dx = J (da * w),  dweight = sum da * xn.
    """
    shape, gs = x.shape, group_size
    silu, dsilu = (None, None) if gate is None else silu_parts(gate)
    if not norm_before_gate:
        v, g = (x if silu is None else x * silu), dy
    else:
        v, g = x, (dy if silu is None else dy * silu)   # g: the gradient entering the norm
    vn, rstd = normalized(grouped(v, gs), eps, False)
    vn = vn.reshape(shape)
    dx = dgate = dw = None
    gw = g if weight is None else g * weight
    if want[0] or (want[1] and not norm_before_gate):
        dv = jacobian_times(grouped(vn, gs), rstd, grouped(gw, gs), False).reshape(shape)
        if norm_before_gate or silu is None:
            dx = dv
        else:
            dx = dv * silu
            if want[1]:
                dgate = dv * x * dsilu
    if want[1] and norm_before_gate and silu is not None:
        dgate = dy * (vn if weight is None else vn * weight) * dsilu
    if want[2] and weight is not None:
        dw = channel_sum(g * vn)
    return (dx if want[0] else None, dgate, dw)


def gated_jvp(x, gate, weight, eps, group_size, norm_before_gate, dx, dgate, dweight):
    """The tangent of the gated RMSNorm's y for tangents dx, dgate, dweight (each may be
    None)."""
    shape, gs = x.shape, group_size
    silu, dsilu = (None, None) if gate is None else silu_parts(gate)
    tgate = None if dgate is None or silu is None else dsilu * dgate
    if not norm_before_gate:
        v = x if silu is None else x * silu
        dv = None if dx is None else (dx if silu is None else dx * silu)
        if tgate is not None:
            dv = x * tgate if dv is None else dv + x * tgate
    else:
        v, dv = x, dx
    vn, rstd = normalized(grouped(v, gs), eps, False)
    t = (vn * 0 if dv is None else jacobian_times(vn, rstd, grouped(dv, gs), False)
         ).reshape(shape)
    vn = vn.reshape(shape)
    if weight is not None:
        t = t * weight
    if dweight is not None:
        t = t + vn * dweight
    if norm_before_gate and silu is not None:
        t = t * silu
        if tgate is not None:
            t = t + (vn if weight is None else vn * weight) * tgate
    return t


def kernel_or_expressions(ctx, dy, kernel_backward, expressions):
    """The gradients an autograd backward returns, normally kernel_backward(ctx, dy),
    resnorm's backward kernel.  With create_graph=True (torch.is_grad_enabled() inside
    backward; also how torch.func.grad runs backward) they are expressions(), torch
    expressions that can be differentiated again, carrying the kernel's values
    (kernel_valued); for a batched dy (no storage to view: vmap over autograd.grad,
    gradcheck's batched gradients, torch.func) the expressions alone."""
    grads = None
    try:
        grads = kernel_backward(ctx, dy)
    except NoStorage:   # a batched dy: vmap over autograd.grad, gradcheck's batches
        pass
    if grads is None or torch.is_grad_enabled():
        exprs = expressions()
        grads = exprs if grads is None else kernel_valued(exprs, grads)
    return grads


def gated_gradients(ctx, dy, kernel_backward):
    """What the gated RMSNorm's autograd backward returns: (dx, dgate, dweight, None for
    the options): kernel_or_expressions of kernel_backward(ctx, dy) -> (dx, dgate,
    dweight), resnorm's backward kernel, and gated_backward's expressions.  ctx holds x,
    gate and weight as its first saved tensors, eps, group_size and norm_before_gate."""
    x, gate, weight = ctx.saved_tensors[:3]
    want = ctx.needs_input_grad
    if dy is None:
        return (None,) * len(want)
    grads = kernel_or_expressions(ctx, dy, kernel_backward, lambda: gated_backward(
        dy, x, gate, weight, ctx.eps, ctx.group_size, ctx.norm_before_gate, want))
    return tuple(g if w else None for g, w in zip(grads, want[:3])) + (None,) * (
        len(want) - 3)


def add_norm_backward(dy, dh, h, x, weight, has_bias, alpha, eps, layer, drop, axes=1,
                      zero_centered=False):
    """The fused add + norm's gradients (dx, dresidual, dweight, dalpha, dbias) as
    differentiable torch expressions (h = residual + alpha * drop(x), y = norm(h)):

        gh = dh + J (dy * w)  (J from h's statistics);  dresidual = gh;
        dx = alpha * drop(gh);  dalpha = sum gh * drop(x);  dweight = sum dy * hhat;
        dbias = sum dy.

    dy or dh may be None (that output unused; Post-Norm has no dh); x is None when alpha
    needs no gradient.
    """
    hhat, rstd = normalized(h, eps, layer, axes)
    w = gain(weight, zero_centered)
    gh = dh
    if dy is not None:
        gn = jacobian_times(hhat, rstd, dy if w is None else dy * w, layer, axes)
        gh = gn if dh is None else gn + dh
    dx = drop(gh) * alpha
    dalpha = None
    if x is not None:
        s = gh * drop(x)
        dalpha = s.sum() if alpha.dim() == 0 else channel_sum(s, alpha.dim())
    dw = channel_sum(dy * hhat, axes) if dy is not None and weight is not None else None
    db = channel_sum(dy, axes) if dy is not None and has_bias else None
    return dx, gh, dw, dalpha, db


def kernel_valued(expressions, values):
    """Each differentiable expression with the value of resnorm's kernel instead of its own
    (None where either is None): a backward asked to build a graph returns the kernel's
    first-order gradients, more accurate than these expressions in x's dtype (in bfloat16
    and float16 two to four times), and their derivatives those of the expressions.  The
    correction is added in float64, where the difference of two values of x's dtype is
    exact, so the value is the kernel's bit for bit (float64: to the last bit or two)."""
    def carry(e, k):
        if e is None or k is None:
            return e
        wide = e.to(torch.float64)
        return (wide + (k.to(torch.float64) - wide).detach()).to(e.dtype)
    return tuple(carry(e, k) for e, k in zip(expressions, values))


def gradients(ctx, dy, layer, kernel_backward):
    """What a norm's autograd backward returns: (dx, dweight, [dbias,] None for eps, ...).

    ctx holds x and weight as its first saved tensors (unpacking them is also autograd's
    check that x was not modified in place since forward), eps, has_bias, axes (how many
    trailing axes a row spans) and zero_centered.  The gradients: kernel_or_expressions of
    kernel_backward(ctx, dy) -> (dx, dweight, dbias), resnorm's backward kernel, and
    norm_backward's expressions.
    """
    x, weight = ctx.saved_tensors[:2]
    want = ctx.needs_input_grad
    if dy is None:
        return (None,) * len(want)
    dx, dw, db = kernel_or_expressions(ctx, dy, kernel_backward, lambda: norm_backward(
        dy, x, weight, ctx.has_bias, ctx.eps, layer, want, ctx.axes, ctx.zero_centered))
    rest = (None,) * (len(want) - (3 if layer else 2))
    if layer:
        return (dx if want[0] else None, dw if want[1] else None, db if want[2] else None,
                *rest)
    return (dx if want[0] else None, dw if want[1] else None, *rest)
