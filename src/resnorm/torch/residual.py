"""torch.autograd.Functions for resnorm's fused residual kernels: Pre-Norm add + norm with
dropout, and inverted dropout.

Pre-Norm (resnorm.add_rms_norm / add_layer_norm):  h = residual + alpha * dropout(x, p, seed),
y = norm(h); apply returns (y, h): y feeds the next sublayer, h is the new residual stream.
One pass over memory: x and residual are read once, y and h written once, straight into
tensors allocated here.  Backward takes the gradients of both outputs (that of h may be
absent) and never stores the dropout mask: the kernel regenerates it from (seed, index).

alpha: a real number (fixed, no gradient), or a tensor of shape () or (D,) of x's dtype
(a learnable scalar / LayerScale vector: it gets a gradient when it requires grad).
ctx saves h, weight, the float64 row statistics and, only when alpha needs a gradient, x.
Double backward is not supported (once_differentiable).
"""
import torch
from torch.autograd.function import once_differentiable

from .. import _residual
from .._checks import eps_value
from ..inverted_dropout import dropout_spec
from ..residual import _residual_scale
from . import _tensors as T


def _forward_common(ctx, x, residual, weight, bias, alpha, eps, p, seed, training):
    """Checks the arguments shared by both Pre-Norm Functions; stores the non-tensor state
    on ctx.  Returns (x, residual, weight, bias, scale, eps, spec)."""
    x = T.float_tensor(x, "x")
    residual = T.partner(residual, "residual", x)
    weight = T.optional_param(weight, "weight", x)
    bias = T.optional_param(bias, "bias", x)
    scale = _residual_scale(T.scale(alpha, x), x.shape[-1], T.NUMPY_DTYPE[x.dtype])
    eps = eps_value(eps)
    spec = dropout_spec(p, seed, training)
    ctx.scale, ctx.spec, ctx.alpha_is_tensor = scale, spec, isinstance(alpha, torch.Tensor)
    ctx.set_materialize_grads(False)   # an unused h must not cost a tensor of zeros
    return x, residual, weight, bias, scale, eps, spec


def _backward_buffers(ctx, x_like, dy, dh):
    """(dy, dh, dx, dresidual, dalpha) for the backward kernels; dalpha is a float64 (D,)
    buffer only when alpha needs a gradient."""
    dy = torch.zeros_like(x_like) if dy is None else dy.contiguous()
    dh = None if dh is None else dh.contiguous()
    want_dalpha = ctx.needs_input_grad[3] and ctx.scale.learnable
    dalpha = torch.empty(x_like.shape[-1], dtype=torch.float64) if want_dalpha else None
    return dy, dh, T.new_like(x_like), T.new_like(x_like), dalpha


def _alpha_grad(ctx, dalpha, dtype):
    """dalpha in alpha's shape (summed over channels for a scalar), or None."""
    if dalpha is None:
        return None
    return torch.from_numpy(ctx.scale.grad(dalpha.numpy(), T.NUMPY_DTYPE[dtype]))


class AddRMSNormFunction(torch.autograd.Function):
    """h = residual + alpha * dropout(x);  y = h * rstd * w,  rstd = 1/sqrt(mean(h^2) + eps).

    Backward: gh = dh + rstd*(g - hn*mean(g*hn)), g = dy*w, hn = h*rstd; dresidual = gh;
    dx = gh * alpha * keep/(1-p); dweight = sum dy*hn; dalpha = sum gh * dropout(x).
    NumPy reference: resnorm.reference.add_rms_norm_forward / add_rms_norm_backward.
    apply(x, residual, weight or None, alpha, eps, p, seed, training) -> (y, h).
    """

    @staticmethod
    def forward(ctx, x, residual, weight, alpha, eps, p, seed, training):
        x, residual, weight, _, scale, eps, spec = _forward_common(
            ctx, x, residual, weight, None, alpha, eps, p, seed, training)
        y, h, rstd = T.new_like(x), T.new_like(x), T.row_stat(x)
        _residual.add_norm_forward(T.rows(y), T.rows(h), None, rstd.numpy(), T.rows(x),
                                   T.rows(residual), T.vector(weight), None, scale.vector, eps,
                                   spec.kernel_arg(), *T.launch(y))
        if any(ctx.needs_input_grad):
            keep_x = ctx.needs_input_grad[3] and scale.learnable
            ctx.save_for_backward(h, weight, rstd, x if keep_x else None)
        return y, h

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh):
        h, weight, rstd, x = ctx.saved_tensors
        dy, dh, dx, dres, dalpha = _backward_buffers(ctx, h, dy, dh)
        want = ctx.needs_input_grad
        dw = T.new_like(weight) if want[2] else None
        _residual.add_norm_backward(
            T.rows(dx), T.rows(dres), T.vector(dw), None, T.vector(dalpha), T.rows(dy),
            T.rows(dh), T.rows(h), T.rows(x), None, T.vector(weight), ctx.scale.vector, None,
            rstd.numpy(), ctx.spec.kernel_arg(), *T.launch(dx))
        return ((dx if want[0] else None), (dres if want[1] else None), dw,
                _alpha_grad(ctx, dalpha, h.dtype), None, None, None, None)


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
        x, residual, weight, bias, scale, eps, spec = _forward_common(
            ctx, x, residual, weight, bias, alpha, eps, p, seed, training)
        y, h, mean, rstd = T.new_like(x), T.new_like(x), T.row_stat(x), T.row_stat(x)
        _residual.add_norm_forward(T.rows(y), T.rows(h), mean.numpy(), rstd.numpy(),
                                   T.rows(x), T.rows(residual), T.vector(weight),
                                   T.vector(bias), scale.vector, eps, spec.kernel_arg(),
                                   *T.launch(y))
        if any(ctx.needs_input_grad):
            keep_x = ctx.needs_input_grad[3] and scale.learnable
            ctx.save_for_backward(h, weight, mean, rstd, x if keep_x else None)
        return y, h

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh):
        h, weight, mean, rstd, x = ctx.saved_tensors
        dy, dh, dx, dres, dalpha = _backward_buffers(ctx, h, dy, dh)
        want = ctx.needs_input_grad
        dw = T.new_like(weight) if want[2] else None
        db = torch.empty(h.shape[-1], dtype=h.dtype) if want[4] else None
        _residual.add_norm_backward(
            T.rows(dx), T.rows(dres), T.vector(dw), T.vector(db), T.vector(dalpha), T.rows(dy),
            T.rows(dh), T.rows(h), T.rows(x), None, T.vector(weight), ctx.scale.vector,
            mean.numpy(), rstd.numpy(), ctx.spec.kernel_arg(), *T.launch(dx))
        return ((dx if want[0] else None), (dres if want[1] else None), dw,
                _alpha_grad(ctx, dalpha, h.dtype), db, None, None, None, None)


class DropoutFunction(torch.autograd.Function):
    """y = x * keep / (1 - p),  keep_k = [Philox uniform(seed, k) >= floor(p * 2**32)].

    Backward: dx = dy * keep / (1 - p), the mask regenerated from (seed, k): nothing is saved.
    NumPy reference: resnorm.reference.dropout_forward / dropout_backward.
    apply(x, p, seed) (training mode; see resnorm.torch.dropout for eval and p = 0).
    """

    @staticmethod
    def forward(ctx, x, p, seed):
        x = T.float_tensor(x, "x")
        ctx.spec = dropout_spec(p, seed, True)
        return _dropout(x, ctx.spec)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return _dropout(dy.contiguous(), ctx.spec), None, None


def _dropout(a, spec):
    out = T.new_like(a)
    n_threads, stream = T.launch(out)
    _residual.dropout_forward(T.vector(out).reshape(-1), T.vector(a).reshape(-1),
                              spec.kernel_arg(), n_threads, stream)
    return out


def add_rms_norm(x, residual, weight=None, eps=1e-6, *, alpha=1.0, p=0.0, seed=0,
                 training=True):
    """Pre-Norm:  h = residual + alpha * dropout(x),  y = rms_norm(h, weight, eps).
    Returns (y, h).  Differentiable (AddRMSNormFunction).
    NumPy reference: resnorm.reference.add_rms_norm_forward.
    """
    return AddRMSNormFunction.apply(x, residual, weight, alpha, eps, p, seed, training)


def add_layer_norm(x, residual, weight=None, bias=None, eps=1e-5, *, alpha=1.0, p=0.0, seed=0,
                   training=True):
    """Pre-Norm:  h = residual + alpha * dropout(x),  y = layer_norm(h, weight, bias, eps).
    Returns (y, h).  Differentiable (AddLayerNormFunction).
    NumPy reference: resnorm.reference.add_layer_norm_forward.
    """
    return AddLayerNormFunction.apply(x, residual, weight, alpha, bias, eps, p, seed, training)


def dropout(x, p, *, seed, training=True):
    """y = x * keep / (1 - p) in training; x itself in eval mode and for p = 0 (as
    torch.nn.functional.dropout).  Differentiable (DropoutFunction).
    NumPy reference: resnorm.reference.dropout_forward.
    """
    spec = dropout_spec(p, seed, training)
    if not spec.active:
        T.float_tensor(x, "x")
        return x
    return DropoutFunction.apply(x, p, seed)
