"""The norm ops of the benchmark: RMSNorm, LayerNorm and the gated RMSNorm of hybrid Mamba
models, inference and training forms, forward and backward.

Traffic (bytes): forward reads x (the gated norm: and the gate) and the (D,) parameters,
writes y (training forms also the float64 row statistics); backward reads dy, x (and the
gate) and the float64 row statistics, writes dx (and dgate) and the parameter gradients.
"""
import numpy as np

from .. import (gated_rms_norm, gated_rms_norm_backward, gated_rms_norm_forward, layer_norm,
                layer_norm_backward, layer_norm_forward, reference, rms_norm,
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


# --------------------------------------------------------------------------- gated RMSNorm
# Mamba2's form (norm_before_gate=False): u = x * silu(g), y = u * rstd(u) * w, one group per
# row (group_size=None).  A grouped call (group_size dividing D) runs the same kernel with
# one statistic per group: these ops time the one-group form only.  The torch peer is
# Hugging Face's MambaRMSNormGated.forward (transformers 5: Mamba2RMSNormGated,
# BambaRMSNormGated, ... at group_size = D): the arithmetic in float32 (float64 inputs: in
# float64, which HF's .to(torch.float32) would round away), the result cast back to the
# input dtype before the weight.  No ONNX Runtime peer: its com.microsoft GatedRMSNorm
# (onnxruntime 1.32) is the other form, the norm before the gate (Qwen3-Next), and has no
# float64 kernel.

GATED_EPS = RMS_EPS


def _torch_gated(torch, dtype):
    """MambaRMSNormGated.forward as a function of (x, gate, weight) tensors."""
    F = torch.nn.functional
    acc = torch.float64 if dtype == np.float64 else torch.float32

    def gated(tx, tg, tw):
        h = tx.to(acc) * F.silu(tg.to(acc))
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + GATED_EPS)
        return tw * h.to(tx.dtype)
    return gated


def _silu(g):
    """(sigmoid(g), silu(g)) in g's dtype, as a NumPy user writes them."""
    s = 1 / (1 + np.exp(-g))
    return s, g * s


def _gated_reference(x, g, w):
    """(y, rstd) of the float64 reference; rstd as resnorm's cache holds it, one per row."""
    y, cache = reference.gated_rms_norm_forward(x, g, w, GATED_EPS)
    return y, cache["rstd"].reshape(-1)


def _gated(training):
    """u = x * silu(g), y = u * rstd(u) * w (Mamba2's gated RMSNorm, one group per row; a
    grouped call is the same kernel)."""
    def setup(shape, dtype, torch):
        x, g, w = arrays(shape, dtype, ["x", "g", "w"])
        y = np.empty_like(x)
        fn = gated_rms_norm_forward if training else gated_rms_norm
        peers = {"numba": nb.gated_rms_norm(x, g, w, GATED_EPS, stats=training)}
        if not training:
            peers["numpy"] = fixed(lambda: numpy_rms(x * _silu(g)[1], w, GATED_EPS))
        spec = None
        if torch is not None and not training:
            spec = TorchSpec(_torch_gated(torch, dtype), [x, g, w])
        return Case(
            3 * x.nbytes + w.nbytes + (shape[0] * 8 if training else 0),
            out=lambda n: fn(x, g, w, GATED_EPS, out=y, n_threads=n),
            alloc=lambda n: fn(x, g, w, GATED_EPS, n_threads=n),
            reference=lambda rows, keep: _gated_reference(x[rows], g[rows], w)[
                :2 if training else 1],
            flat=(lambda res: (res[0], res[1].rstd)) if training else parts,
            peers=peers, torch=spec)
    return setup


register("gated_rms_norm", FORWARD)(_gated(training=False))
register("gated_rms_norm_forward", FORWARD, table=False)(_gated(training=True))


@register("gated_rms_norm_backward", BACKWARD)
def _gated_rms_norm_backward(shape, dtype, torch):
    """dx, dgate, dweight of Mamba2's gated RMSNorm (one group per row), from the forward's
    cache (x, the gate and rstd; u is recomputed)."""
    x, g, w, dy = arrays(shape, dtype, ["x", "g", "w", "dy"])
    dx, dg = np.empty_like(x), np.empty_like(x)
    _, cache = gated_rms_norm_forward(x, g, w, GATED_EPS)
    rstd = column(cache.rstd, dtype)

    def ref(rows, keep):
        _, ref_cache = reference.gated_rms_norm_forward(x[rows], g[rows], w, GATED_EPS)
        return reference.gated_rms_norm_backward(dy[rows], ref_cache)

    def numpy_backward():
        s, a = _silu(g)
        du, dw = numpy_rms_backward(dy, x * a, w, rstd)
        return du * a, du * x * (s + a * (1 - s)), dw

    spec = None
    if torch is not None:
        spec = TorchSpec(_torch_gated(torch, dtype), [x, g, w], grads=[dy])
    # reads dy, x, gate, w and the float64 rstd; writes dx, dgate, dweight
    return Case(
        5 * x.nbytes + 2 * w.nbytes + shape[0] * 8,
        out=lambda n: gated_rms_norm_backward(dy, cache, out=dx, dgate_out=dg, n_threads=n),
        alloc=lambda n: gated_rms_norm_backward(dy, cache, n_threads=n),
        reference=ref, summed=(2,),
        peers={"numpy": fixed(numpy_backward),
               "numba": nb.gated_rms_norm_backward(dy, x, g, w, cache.rstd.astype(dtype))},
        torch=spec)
