"""The norm ops of the benchmark: RMSNorm and LayerNorm, forward and backward.

Traffic (bytes): forward reads x and the (D,) parameters, writes y; backward reads dy, x
and the float64 row statistics, writes dx and the parameter gradients.
"""
import numpy as np

from .. import norms
from ._cases import (BACKWARD, FORWARD, Case, arrays, autograd, column, numpy_layer,
                     numpy_layer_backward, numpy_rms, numpy_rms_backward, register, tensors)


@register("rms_norm", FORWARD)
def _rms_norm(shape, dtype, torch):
    x, w = arrays(shape, dtype, ["x", "w"])
    y = np.empty_like(x)
    tx, tw = tensors(torch, [x, w])
    return Case(
        2 * x.nbytes + w.nbytes,
        out=lambda n: norms.rms_norm(x, w, 1e-6, out=y, n_threads=n),
        alloc=lambda n: norms.rms_norm(x, w, 1e-6, n_threads=n),
        numpy=lambda: numpy_rms(x, w),
        torch=torch and (lambda: torch.nn.functional.rms_norm(tx, (shape[1],), tw, 1e-6)))


@register("layer_norm", FORWARD)
def _layer_norm(shape, dtype, torch):
    x, w, b = arrays(shape, dtype, ["x", "w", "b"])
    y = np.empty_like(x)
    tx, tw, tb = tensors(torch, [x, w, b])
    return Case(
        2 * x.nbytes + 2 * w.nbytes,
        out=lambda n: norms.layer_norm(x, w, b, 1e-5, out=y, n_threads=n),
        alloc=lambda n: norms.layer_norm(x, w, b, 1e-5, n_threads=n),
        numpy=lambda: numpy_layer(x, w, b),
        torch=torch and (lambda: torch.nn.functional.layer_norm(tx, (shape[1],), tw, tb, 1e-5)))


@register("rms_norm_backward", BACKWARD)
def _rms_norm_backward(shape, dtype, torch):
    x, w, dy = arrays(shape, dtype, ["x", "w", "dy"])
    dx = np.empty_like(x)
    _, cache = norms.rms_norm_forward(x, w, 1e-6)
    rstd = column(cache.rstd, dtype)
    tfn = None
    if torch is not None:
        tx, tw = tensors(torch, [x, w], grad=True)
        ty = torch.nn.functional.rms_norm(tx, (shape[1],), tw, 1e-6)
        tfn = autograd(torch, ty, (tx, tw), torch.from_numpy(dy))
    return Case(
        3 * x.nbytes + 2 * w.nbytes + shape[0] * 8,
        out=lambda n: norms.rms_norm_backward(dy, cache, out=dx, n_threads=n),
        alloc=lambda n: norms.rms_norm_backward(dy, cache, n_threads=n),
        numpy=lambda: numpy_rms_backward(dy, x, w, rstd), torch=tfn)


@register("layer_norm_backward", BACKWARD)
def _layer_norm_backward(shape, dtype, torch):
    x, w, b, dy = arrays(shape, dtype, ["x", "w", "b", "dy"])
    dx = np.empty_like(x)
    _, cache = norms.layer_norm_forward(x, w, b, 1e-5)
    mean, rstd = column(cache.mean, dtype), column(cache.rstd, dtype)
    tfn = None
    if torch is not None:
        tx, tw, tb = tensors(torch, [x, w, b], grad=True)
        ty = torch.nn.functional.layer_norm(tx, (shape[1],), tw, tb, 1e-5)
        tfn = autograd(torch, ty, (tx, tw, tb), torch.from_numpy(dy))
    return Case(
        3 * x.nbytes + 3 * w.nbytes + 2 * shape[0] * 8,
        out=lambda n: norms.layer_norm_backward(dy, cache, out=dx, n_threads=n),
        alloc=lambda n: norms.layer_norm_backward(dy, cache, n_threads=n),
        numpy=lambda: numpy_layer_backward(dy, x, w, mean, rstd), torch=tfn)
