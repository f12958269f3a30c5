"""torch.autograd.Functions that run resnorm's compiled norm kernels on CPU tensors.

Forward allocates its output (and the float64 row statistics) with torch.empty and lets the
kernel write straight into that storage through ``.numpy()`` views; contiguous inputs are
read in place.  ctx saves only what backward needs: the input x, the weight and the row
statistics (RMSNorm: rstd; LayerNorm: mean, rstd), as tensors, so autograd's version
counters catch an in-place change of x between forward and backward.

Backward computes dweight / dbias only when autograd asks for them (needs_input_grad).
The kernel always produces dx (dweight needs the same row reduction); when x needs no
gradient it goes to a scratch buffer and is dropped.  Double backward is not supported
(once_differentiable raises a clear error).
"""
import torch
from torch.autograd.function import once_differentiable

from .. import _norms
from .._checks import eps_value
from . import _tensors as T


class RMSNormFunction(torch.autograd.Function):
    """y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps) over the last axis.

    Backward: dx = rstd * (g - xn * mean(g*xn)), g = dy*w, xn = x*rstd; dw = sum_rows dy*xn.
    NumPy reference: resnorm.reference.rms_norm_forward / rms_norm_backward.
    apply(x, weight or None, eps).
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        x = T.float_tensor(x, "x")
        weight = T.optional_param(weight, "weight", x)
        eps = eps_value(eps)
        y, rstd = T.new_like(x), T.row_stat(x)
        _norms.rms_norm_forward(T.rows(y), rstd.numpy(), T.rows(x), T.vector(weight), eps,
                                *T.launch(y))
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        want_dx, want_dw = ctx.needs_input_grad[:2]
        dy = dy.contiguous()
        dx = T.new_like(x)
        dw = T.new_like(weight) if want_dw else None
        _norms.rms_norm_backward(T.rows(dx), T.vector(dw), T.rows(dy), T.rows(x),
                                 T.vector(weight), rstd.numpy(), *T.launch(dx))
        return (dx if want_dx else None), dw, None


class LayerNormFunction(torch.autograd.Function):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps) over the last axis.

    Backward: xhat = (x-mean)*rstd, g = dy*w: dx = rstd*(g - mean(g) - xhat*mean(g*xhat)),
    dw = sum_rows dy*xhat, db = sum_rows dy.
    NumPy reference: resnorm.reference.layer_norm_forward / layer_norm_backward.
    apply(x, weight or None, bias or None, eps).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x = T.float_tensor(x, "x")
        weight = T.optional_param(weight, "weight", x)
        bias = T.optional_param(bias, "bias", x)
        eps = eps_value(eps)
        y, mean, rstd = T.new_like(x), T.row_stat(x), T.row_stat(x)
        _norms.layer_norm_forward(T.rows(y), mean.numpy(), rstd.numpy(), T.rows(x),
                                  T.vector(weight), T.vector(bias), eps, *T.launch(y))
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        want_dx, want_dw, want_db = ctx.needs_input_grad[:3]
        dy = dy.contiguous()
        dx = T.new_like(x)
        dw = T.new_like(weight) if want_dw else None
        db = torch.empty(x.shape[-1], dtype=x.dtype) if want_db else None
        _norms.layer_norm_backward(T.rows(dx), T.vector(dw), T.vector(db), T.rows(dy),
                                   T.rows(x), T.vector(weight), mean.numpy(), rstd.numpy(),
                                   *T.launch(dx))
        return (dx if want_dx else None), dw, db, None


def rms_norm(x, weight=None, eps=1e-6):
    """y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps), over the last axis of x (..., D).

    Differentiable (RMSNormFunction).  x, weight: float32/float64 CPU tensors of one dtype;
    weight (D,) or None.  NumPy reference: resnorm.reference.rms_norm_forward.
    """
    return RMSNormFunction.apply(x, weight, eps)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps), over the last axis of x.

    Differentiable (LayerNormFunction).  weight, bias: (D,) or None, independently.
    NumPy reference: resnorm.reference.layer_norm_forward.
    """
    return LayerNormFunction.apply(x, weight, bias, eps)
