"""The norm ops of the benchmark: RMSNorm and LayerNorm, inference and training forms,
forward and backward.

Traffic (bytes): forward reads x and the (D,) parameters, writes y (training forms also
the float64 row statistics); backward reads dy, x and the float64 row statistics, writes
dx and the parameter gradients.
"""
import numpy as np

from .. import (layer_norm, layer_norm_backward, layer_norm_forward, reference, rms_norm,
                rms_norm_backward, rms_norm_forward)
from . import _peers_numba as nb
from . import _peers_onnx as onnx
from ._cases import (BACKWARD, FORWARD, Case, arrays, column, fixed, numpy_layer,
                     numpy_layer_backward, numpy_rms, numpy_rms_backward, parts, register)
from ._peers_torch import TorchSpec

RMS_EPS, LAYER_EPS = 1e-6, 1e-5


def _rms(training):
    def setup(shape, dtype, torch):
        x, w = arrays(shape, dtype, ["x", "w"])
        y = np.empty_like(x)
        fn = rms_norm_forward if training else rms_norm
        peers = {"numba": nb.rms_norm(x, w, RMS_EPS, stats=training)}
        if not training:
            peers.update(numpy=fixed(lambda: numpy_rms(x, w, RMS_EPS)),
                         onnxruntime=onnx.rms_norm(x, w, RMS_EPS))
        spec = None
        if torch is not None and not training:
            spec = TorchSpec(lambda tx, tw: torch.nn.functional.rms_norm(
                tx, (shape[1],), tw, RMS_EPS), [x, w])
        return Case(
            2 * x.nbytes + w.nbytes + (shape[0] * 8 if training else 0),
            out=lambda n: fn(x, w, RMS_EPS, out=y, n_threads=n),
            alloc=lambda n: fn(x, w, RMS_EPS, n_threads=n),
            reference=lambda rows, keep: reference.rms_norm_forward(x[rows], w, RMS_EPS)[
                :2 if training else 1],
            flat=(lambda res: (res[0], res[1].rstd)) if training else parts,
            peers=peers, torch=spec)
    return setup


register("rms_norm", FORWARD)(_rms(training=False))
register("rms_norm_forward", FORWARD, table=False)(_rms(training=True))


def _layer(training):
    def setup(shape, dtype, torch):
        x, w, b = arrays(shape, dtype, ["x", "w", "b"])
        y = np.empty_like(x)
        fn = layer_norm_forward if training else layer_norm
        peers = {"numba": nb.layer_norm(x, w, b, LAYER_EPS, stats=training)}
        if not training:
            peers.update(numpy=fixed(lambda: numpy_layer(x, w, b, LAYER_EPS)),
                         onnxruntime=onnx.layer_norm(x, w, b, LAYER_EPS))
        spec = None
        if torch is not None and not training:
            spec = TorchSpec(lambda tx, tw, tb: torch.nn.functional.layer_norm(
                tx, (shape[1],), tw, tb, LAYER_EPS), [x, w, b])
        return Case(
            2 * x.nbytes + 2 * w.nbytes + (2 * shape[0] * 8 if training else 0),
            out=lambda n: fn(x, w, b, LAYER_EPS, out=y, n_threads=n),
            alloc=lambda n: fn(x, w, b, LAYER_EPS, n_threads=n),
            reference=lambda rows, keep: reference.layer_norm_forward(
                x[rows], w, b, LAYER_EPS)[:3 if training else 1],
            flat=(lambda res: (res[0], res[1].mean, res[1].rstd)) if training else parts,
            peers=peers, torch=spec)
    return setup


register("layer_norm", FORWARD)(_layer(training=False))
register("layer_norm_forward", FORWARD, table=False)(_layer(training=True))


@register("rms_norm_backward", BACKWARD)
def _rms_norm_backward(shape, dtype, torch):
    x, w, dy = arrays(shape, dtype, ["x", "w", "dy"])
    dx = np.empty_like(x)
    _, cache = rms_norm_forward(x, w, RMS_EPS)
    rstd = column(cache.rstd, dtype)
    spec = None
    if torch is not None:
        spec = TorchSpec(lambda tx, tw: torch.nn.functional.rms_norm(
            tx, (shape[1],), tw, RMS_EPS), [x, w], grads=[dy])
    return Case(
        3 * x.nbytes + 2 * w.nbytes + shape[0] * 8,
        out=lambda n: rms_norm_backward(dy, cache, out=dx, n_threads=n),
        alloc=lambda n: rms_norm_backward(dy, cache, n_threads=n),
        reference=lambda rows, keep: reference.rms_norm_backward(
            dy[rows], x[rows], w, cache.rstd[rows]),
        summed=(1,),
        peers={"numpy": fixed(lambda: numpy_rms_backward(dy, x, w, rstd)),
               "numba": nb.rms_norm_backward(dy, x, w, cache.rstd.astype(dtype))},
        torch=spec)


@register("layer_norm_backward", BACKWARD)
def _layer_norm_backward(shape, dtype, torch):
    x, w, b, dy = arrays(shape, dtype, ["x", "w", "b", "dy"])
    dx = np.empty_like(x)
    _, cache = layer_norm_forward(x, w, b, LAYER_EPS)
    mean, rstd = column(cache.mean, dtype), column(cache.rstd, dtype)
    spec = None
    if torch is not None:
        spec = TorchSpec(lambda tx, tw, tb: torch.nn.functional.layer_norm(
            tx, (shape[1],), tw, tb, LAYER_EPS), [x, w, b], grads=[dy])
    return Case(
        3 * x.nbytes + 3 * w.nbytes + 2 * shape[0] * 8,
        out=lambda n: layer_norm_backward(dy, cache, out=dx, n_threads=n),
        alloc=lambda n: layer_norm_backward(dy, cache, n_threads=n),
        reference=lambda rows, keep: reference.layer_norm_backward(
            dy[rows], x[rows], w, cache.mean[rows], cache.rstd[rows]),
        summed=(1, 2),
        peers={"numpy": fixed(lambda: numpy_layer_backward(dy, x, w, mean, rstd)),
               "numba": nb.layer_norm_backward(dy, x, w, cache.mean.astype(dtype),
                                               cache.rstd.astype(dtype))},
        torch=spec)
