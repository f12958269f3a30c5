"""RMSNorm and LayerNorm over the last axis: checks, then one compiled kernel call.

Two forms of each norm:

* inference: ``y = rms_norm(x, weight, eps)`` returns only the output;
* training:  ``y, cache = rms_norm_forward(x, weight, eps)`` also returns what backward
  needs, and ``dx, dweight = rms_norm_backward(dy, cache)`` consumes it.

The cache holds the input rows (a reference, not a copy, when the input was already
C-contiguous: do not modify x between forward and backward) and the row statistics in
float64 (RMSNorm: rstd; LayerNorm: mean and rstd).  Everything else is recomputed.

Inputs of any rank (..., D) are normalised over the last axis.  Non-contiguous (or
misaligned) inputs are copied once into a contiguous buffer; contiguous inputs are read
in place.  Inputs are never modified, unless ``out`` is the input itself.
"""
from dataclasses import dataclass

import numpy as np

from . import _checks, _norms
from . import _parallel
from ._parallel import streams, threads_for


def _fast_limits():
    """What the compiled fast paths of the inference forms need to decide threads and
    streaming exactly as threads_for / streams do, and to accept n_threads as
    n_threads_value does; read at each call, like threads_for reads them."""
    return (_parallel.PARALLEL_MIN_ELEMENTS, _parallel.STREAM_MIN_BYTES, _checks.MAX_THREADS)


@dataclass(frozen=True)
class RMSNormCache:
    """What rms_norm_backward needs: the input rows and their rstd."""
    x: np.ndarray              # (N, D) the rows the kernel read
    weight: np.ndarray | None  # (D,) or None
    rstd: np.ndarray           # (N,) float64, 1/sqrt(mean(x^2) + eps)
    shape: tuple               # shape of the original input, given back to dx


@dataclass(frozen=True)
class LayerNormCache:
    """What layer_norm_backward needs: the input rows, their mean and rstd."""
    x: np.ndarray              # (N, D)
    weight: np.ndarray | None  # (D,) or None
    has_bias: bool             # whether a dbias is wanted
    mean: np.ndarray           # (N,) float64
    rstd: np.ndarray           # (N,) float64, 1/sqrt(var + eps)
    shape: tuple


def _rows(a):
    """a as a C-contiguous, aligned (N, D) array: a view when possible, else one copy."""
    if not (a.flags.c_contiguous and a.flags.aligned):
        a = np.require(a, requirements="CA")
    return a.reshape(-1, a.shape[-1])


def _vector(p):
    return None if p is None else np.require(p, requirements="CA")


def _output_rows(out, rows, shape, inputs, name="out"):
    """Where the kernel writes: out's own memory when it is a C-contiguous aligned array,
    else a fresh buffer (copied into out afterwards by _finish)."""
    if out is None:
        return np.empty_like(rows)
    _checks.out_array(out, shape, rows.dtype, inputs, name)
    if out.flags.c_contiguous and out.flags.aligned:
        return out.reshape(rows.shape)
    return np.empty_like(rows)


def _prepare(x, params, eps, out, n_threads, training):
    """Checks every argument; returns (x, rows, params, eps, out_rows, n_threads, stream)."""
    x = _checks.float_array(x, "x")
    d = x.shape[-1]
    params = [_vector(_checks.optional_param(p, name, d, x.dtype)) for name, p in params]
    eps = _checks.eps_value(eps, x.dtype)
    n_threads = _checks.n_threads_value(n_threads)
    inputs = {"x": x, **dict(zip(("weight", "bias"), params))}
    if training and out is not None:
        for name, a in inputs.items():
            if a is not None and np.may_share_memory(out, a):
                raise ValueError(f"out must not share memory with {name} in the training form: "
                                 "the cache keeps the inputs for backward")
    rows = _rows(x)
    out_rows = _output_rows(out, rows, x.shape, inputs)
    return (x, rows, params, eps, out_rows, threads_for(n_threads, rows.size),
            streams(out_rows.nbytes))


def _prepare_backward(dy, cache, cache_type, stat_names, out, n_threads):
    """Checks dy, cache, out and n_threads; returns (dy_rows, dx_rows, n_threads, stream)."""
    if not isinstance(cache, cache_type):
        raise TypeError(f"cache must be the {cache_type.__name__} returned by the forward "
                        f"function, got {type(cache).__name__}")
    _checks.training_cache(cache, stat_names)
    dy = _checks.like_array(dy, "dy", cache.shape, cache.x.dtype)
    n_threads = _checks.n_threads_value(n_threads)
    dy_rows = _rows(dy)
    dx_rows = _output_rows(out, dy_rows, cache.shape, {"dy": dy})
    for name in ("x", "weight") + stat_names:  # the cache must stay valid for another call
        a = getattr(cache, name)
        if out is not None and a is not None and np.may_share_memory(out, a):
            raise ValueError(f"out must not share memory with the cache's {name}: "
                             f"pass out=dy or a separate buffer")
    return dy_rows, dx_rows, threads_for(n_threads, dy_rows.size), streams(dx_rows.nbytes)


def _finish(out, out_rows, shape):
    """The result in the caller's shape; copies into out when it could not be written directly."""
    if out is None:
        return out_rows.reshape(shape)
    if not np.may_share_memory(out, out_rows):
        out[...] = out_rows.reshape(shape)
    return out


# --------------------------------------------------------------------------- RMSNorm

def rms_norm_forward(x, weight=None, eps=1e-6, *, out=None, n_threads=None):
    """y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps), over the last axis.

    Training form: returns (y, cache) for rms_norm_backward.
    Backward: dx = rstd * (g - x * rstd^2 * mean(g*x)) with g = dy*w; dw = sum dy*x*rstd.
    NumPy reference: resnorm.reference.rms_norm_forward.

    x: (..., D) float32/float64.  weight: (D,) of the same dtype, or None (w = 1).
    out: optional preallocated output, sharing no memory with x or weight.
    n_threads: None = OpenMP default.  Every check and its error: docs/input-checks.md.
    """
    x, rows, (w,), eps, out_rows, nt, stream = _prepare(
        x, [("weight", weight)], eps, out, n_threads, training=True)
    rstd = np.empty(rows.shape[0])
    _norms.rms_norm_forward(out_rows, rstd, rows, w, eps, nt, stream)
    return _finish(out, out_rows, x.shape), RMSNormCache(rows, w, rstd, x.shape)


def rms_norm(x, weight=None, eps=1e-6, *, out=None, n_threads=None):
    """y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps), over the last axis of x (..., D).

    Inference form of rms_norm_forward (same arguments); out=x normalises in place.
    NumPy reference: resnorm.reference.rms_norm_forward.
    """
    y = _norms.rms_norm_ready(x, weight, eps, out, n_threads, _fast_limits())
    if y is not None:  # every argument was already final: done, no Python-level checks
        return y
    x, rows, (w,), eps, out_rows, nt, stream = _prepare(
        x, [("weight", weight)], eps, out, n_threads, training=False)
    _norms.rms_norm_forward(out_rows, np.empty(rows.shape[0]), rows, w, eps, nt, stream)
    return _finish(out, out_rows, x.shape)


def rms_norm_backward(dy, cache, *, out=None, n_threads=None):
    """dx = rstd * (g - xn * mean(g*xn)),  g = dy*w,  xn = x*rstd;   dweight = sum_rows dy*xn.

    (Equal to rstd * (g - x * rstd^2 * mean(g*x)).)  dy: gradient of y, same shape and dtype
    as the forward input.  cache: from rms_norm_forward.  out: optional buffer for dx; it
    may be dy itself (dx overwrites dy), never an array held by the cache.  Returns
    (dx, dweight); dweight is None when forward had no weight.
    NumPy reference: resnorm.reference.rms_norm_backward.
    """
    dy_rows, dx_rows, nt, stream = _prepare_backward(dy, cache, RMSNormCache, ("rstd",), out,
                                                  n_threads)
    dw = None if cache.weight is None else np.empty_like(cache.weight)
    _norms.rms_norm_backward(dx_rows, dw, dy_rows, cache.x, cache.weight, cache.rstd, nt,
                             stream)
    return _finish(out, dx_rows, cache.shape), dw


# --------------------------------------------------------------------------- LayerNorm

def layer_norm_forward(x, weight=None, bias=None, eps=1e-5, *, out=None, n_threads=None):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps), over the last axis.

    var is the biased variance (divide by D), computed two-pass in double.
    Training form: returns (y, cache) for layer_norm_backward.
    Backward: xhat = (x-mean)*rstd, g = dy*w: dx = rstd*(g - mean(g) - xhat*mean(g*xhat)),
    dw = sum dy*xhat, db = sum dy.   NumPy reference: resnorm.reference.layer_norm_forward.

    weight, bias: (D,) of x's dtype, or None, independently.
    """
    x, rows, (w, b), eps, out_rows, nt, stream = _prepare(
        x, [("weight", weight), ("bias", bias)], eps, out, n_threads, training=True)
    mean, rstd = np.empty(rows.shape[0]), np.empty(rows.shape[0])
    _norms.layer_norm_forward(out_rows, mean, rstd, rows, w, b, eps, nt, stream)
    cache = LayerNormCache(rows, w, b is not None, mean, rstd, x.shape)
    return _finish(out, out_rows, x.shape), cache


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, out=None, n_threads=None):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps), over the last axis of x.

    Inference form of layer_norm_forward (same arguments); out=x normalises in place.
    NumPy reference: resnorm.reference.layer_norm_forward.
    """
    y = _norms.layer_norm_ready(x, weight, bias, eps, out, n_threads, _fast_limits())
    if y is not None:
        return y
    x, rows, (w, b), eps, out_rows, nt, stream = _prepare(
        x, [("weight", weight), ("bias", bias)], eps, out, n_threads, training=False)
    n = rows.shape[0]
    _norms.layer_norm_forward(out_rows, np.empty(n), np.empty(n), rows, w, b, eps, nt, stream)
    return _finish(out, out_rows, x.shape)


def layer_norm_backward(dy, cache, *, out=None, n_threads=None):
    """dx = rstd * (g - mean(g) - xhat * mean(g*xhat)),  g = dy*w,  xhat = (x - mean)*rstd;
    dweight = sum_rows dy*xhat;  dbias = sum_rows dy.

    out: optional buffer for dx; it may be dy itself (never an array held by the cache).
    Returns (dx, dweight, dbias); dweight / dbias are None when forward had no weight / bias.
    NumPy reference: resnorm.reference.layer_norm_backward.
    """
    dy_rows, dx_rows, nt, stream = _prepare_backward(dy, cache, LayerNormCache, ("mean", "rstd"),
                                                  out, n_threads)
    dw = None if cache.weight is None else np.empty_like(cache.weight)
    db = np.empty(dy_rows.shape[1], dy_rows.dtype) if cache.has_bias else None
    _norms.layer_norm_backward(dx_rows, dw, db, dy_rows, cache.x, cache.weight, cache.mean,
                               cache.rstd, nt, stream)
    return _finish(out, dx_rows, cache.shape), dw, db
