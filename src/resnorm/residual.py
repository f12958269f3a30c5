"""Residual connections: fused add + norm (Pre-Norm and Post-Norm), scaled and gated
residuals.  Checks, then one compiled kernel call.

Fused add + norm, with d = dropout(x) (resnorm.dropout, identity when p = 0 or in eval):

* Pre-Norm  ``y, h = add_rms_norm(x, residual, weight)``:  h = residual + alpha*d,
  y = rms_norm(h).  h is the new residual stream, y the next sublayer's input.  One pass
  over memory: read x and residual, write h and y.  ``add_layer_norm`` likewise.
* Post-Norm ``y = add_rms_norm_post(x, residual, weight)``:  y = rms_norm(residual + alpha*d)
  (h is not written).  ``add_layer_norm_post`` likewise.

alpha is fixed when given as a real number (no gradient), a learnable scalar when given as
a 0-d array, and a learnable per-channel vector (LayerScale) when given as a (D,) array;
backward returns dalpha of alpha's shape, or None when alpha is fixed.

Forms, as in resnorm.norms: the inference call returns only the outputs; ``name_forward``
also returns a cache, and ``name_backward(..., cache)`` consumes it.  Caches hold
references, not copies, to what backward reads (see each cache class): do not modify those
arrays between forward and backward.  What is cached and why: docs/residual.md.
"""
from dataclasses import dataclass

import numpy as np

from . import _checks, _residual
from ._parallel import streams, threads_for
from .inverted_dropout import DropoutSpec, dropout_spec, valid_spec
from .norms import _finish, _output_rows, _rows, _vector


# --------------------------------------------------------------------------- alpha

@dataclass(frozen=True)
class ResidualScale:
    """alpha as the kernels see it, and how its gradient is shaped."""
    kind: str                  # 'fixed' (no gradient), 'scalar' (shape ()), 'channel' (D,)
    vector: np.ndarray | None  # (D,) of the input dtype; None when alpha is a fixed 1

    @property
    def learnable(self):
        return self.kind != "fixed"

    def grad(self, per_channel, dtype):
        """dalpha from the kernels' float64 per-channel sums: None, a 0-d array or (D,)."""
        if self.kind == "fixed":
            return None
        if self.kind == "scalar":
            return np.asarray(per_channel.sum(), dtype=dtype)
        return per_channel.astype(dtype)


def _residual_scale(alpha, d, dtype):
    kind, value = _checks.residual_scale(alpha, d, dtype)
    if kind == "fixed":
        vector = None if value == 1.0 else np.full(d, value, dtype=dtype)
    elif kind == "scalar":
        vector = np.full(d, value[()], dtype=dtype)
    else:
        vector = np.require(value, requirements="CA")
    return ResidualScale(kind, vector)


def _not_kept(outputs, kept):
    """Training forms: no output buffer may overlap an input that backward will read."""
    for out_name, o in outputs.items():
        for name, a in kept.items():
            if o is not None and a is not None and np.may_share_memory(o, a):
                raise ValueError(f"{out_name} must not overlap {name} in the training form: "
                                 f"backward reads {name}")


def _valid_scale(alpha):
    """A ResidualScale as _residual_scale makes it (kept in caches)."""
    return isinstance(alpha, ResidualScale) and alpha.kind in ("fixed", "scalar", "channel")


# --------------------------------------------------------------------------- fused add + norm

@dataclass(frozen=True)
class AddNormCache:
    """What the backward of a fused add + norm needs.

    Pre-Norm keeps h (the returned residual stream, by reference) and, only for a learnable
    alpha, x.  Post-Norm keeps x and residual (by reference) and recomputes h row by row.
    Row statistics in float64: rstd (and mean for LayerNorm).  The dropout mask is not kept:
    it is regenerated from (seed, element index).
    """
    op: str                       # the forward function that made this cache
    h: np.ndarray | None          # (N, D) Pre-Norm only
    x: np.ndarray | None          # (N, D) Post-Norm, or a learnable alpha
    residual: np.ndarray | None   # (N, D) Post-Norm only
    weight: np.ndarray | None     # (D,)
    has_bias: bool
    alpha: ResidualScale
    dropout: DropoutSpec
    mean: np.ndarray | None       # (N,) float64, LayerNorm only
    rstd: np.ndarray              # (N,) float64
    shape: tuple
    dtype: np.dtype


def _check_add_norm_cache(cache):
    """The arrays add_norm_backward reads, as the forward function made them."""
    layer, prenorm = cache.op.startswith("add_layer_norm"), "_post" not in cache.op
    valid = (_valid_scale(cache.alpha) and valid_spec(cache.dropout)
             and type(cache.has_bias) is bool)
    learnable = valid and cache.alpha.learnable

    def expected(n, d, dtype):
        rows = (n, d)
        return [(cache.h, rows, dtype, prenorm), (cache.x, rows, dtype, learnable or not prenorm),
                (cache.residual, rows, dtype, not prenorm), (cache.weight, (d,), dtype, False),
                (cache.alpha.vector, (d,), dtype, learnable),
                (cache.mean, (n,), np.float64, layer), (cache.rstd, (n,), np.float64, True)]

    # the kernel tells Pre- from Post-Norm by h, and LayerNorm from RMSNorm by mean
    valid = valid and (prenorm or cache.h is None) and (layer or cache.mean is None)
    _checks.cache_arrays(cache, expected, valid)


def _add_norm(op, x, residual, weight, bias, eps, alpha, p, seed, training, out, residual_out,
              n_threads, keep_cache):
    """Checks every argument, runs the forward kernel; returns (y, h or None, cache or None)."""
    layer = op.startswith("add_layer_norm")
    prenorm = "_post" not in op
    x = _checks.float_array(x, "x")
    residual = _checks.like_array(residual, "residual", x.shape, x.dtype)
    d = x.shape[-1]
    weight = _vector(_checks.optional_param(weight, "weight", d, x.dtype))
    bias = _vector(_checks.optional_param(bias, "bias", d, x.dtype)) if layer else None
    eps = _checks.eps_value(eps, x.dtype)
    scale = _residual_scale(alpha, d, x.dtype)
    spec = dropout_spec(p, seed, training)
    n_threads = _checks.n_threads_value(n_threads)

    rows_x, rows_r = _rows(x), _rows(residual)
    inputs = {"x": x, "residual": residual, "weight": weight, "bias": bias,
              "alpha": scale.vector}
    keeps_x = not prenorm or scale.learnable
    if keep_cache:
        _not_kept({"out": out, "residual_out": residual_out},
                  {"x": x if keeps_x else None, "residual": None if prenorm else residual,
                   "weight": weight, "alpha": scale.vector if scale.learnable else None})
    if out is not None and residual_out is not None and np.may_share_memory(out, residual_out):
        raise ValueError("out and residual_out must be different, non-overlapping arrays")
    y_rows = _output_rows(out, rows_x, x.shape, inputs)
    h_rows = None
    if prenorm:
        h_rows = _output_rows(residual_out, rows_x, x.shape, inputs, "residual_out")
    # A rare row (resnorm_c/rare_rows.pxd) is stored as h first (Post-Norm: in y), then
    # normalised with weight and bias: a buffer that is weight or bias itself (rank-1
    # input, in place) is written through a temporary.
    if prenorm:
        h_rows = _apart_from(h_rows, (weight, bias))
    else:
        y_rows = _apart_from(y_rows, (weight, bias))

    n = rows_x.shape[0]
    mean = np.empty(n) if layer else None
    rstd = np.empty(n)
    nt, stream = threads_for(n_threads, rows_x.size), streams(y_rows.nbytes)
    _residual.add_norm_forward(y_rows, h_rows, mean, rstd, rows_x, rows_r, weight, bias,
                               scale.vector, eps, spec.kernel_arg(), nt, stream)
    y = _finish(out, y_rows, x.shape)
    h = _finish(residual_out, h_rows, x.shape) if prenorm else None
    cache = None
    if keep_cache:
        cache = AddNormCache(
            op=op, h=h_rows, x=rows_x if keeps_x else None,
            residual=None if prenorm else rows_r, weight=weight, has_bias=bias is not None,
            alpha=scale, dropout=spec, mean=mean, rstd=rstd, shape=x.shape, dtype=x.dtype)
    return y, h, cache


def _apart_from(rows, params):
    """rows, or a fresh buffer when rows shares memory with one of params."""
    if any(p is not None and np.may_share_memory(rows, p) for p in params):
        return np.empty_like(rows)
    return rows


def _add_norm_backward(op, dy, dh, cache, n_threads, out, dresidual_out):
    """Checks, runs the backward kernel; returns (dx, dresidual, dweight, dbias, dalpha)."""
    if not isinstance(cache, AddNormCache) or cache.op != op:
        made_by = cache.op if isinstance(cache, AddNormCache) else type(cache).__name__
        raise TypeError(f"cache must be the AddNormCache returned by {op}, got {made_by}")
    _check_add_norm_cache(cache)
    dtype = cache.dtype
    dy = _checks.like_array(dy, "dy", cache.shape, dtype)
    if dh is not None:
        dh = _checks.like_array(dh, "dh", cache.shape, dtype)
    n_threads = _checks.n_threads_value(n_threads)
    inputs = {"dy": dy, "dh": dh}
    kept = {"h": cache.h, "x": cache.x, "residual": cache.residual, "weight": cache.weight,
            "alpha": cache.alpha.vector, "mean": cache.mean, "rstd": cache.rstd}
    dy = _rows(dy)
    dx = _gradient_rows(out, "out", dy, cache.shape, inputs, kept)
    dresidual = _gradient_rows(dresidual_out, "dresidual_out", dy, cache.shape, inputs, kept)
    if out is not None and dresidual_out is not None and np.may_share_memory(out,
                                                                             dresidual_out):
        raise ValueError("out and dresidual_out must not share memory: they receive "
                         "different gradients")
    n, d = dy.shape
    dweight = None if cache.weight is None else np.empty(d, dtype)
    dbias = np.empty(d, dtype) if cache.has_bias else None
    dalpha = np.empty(d) if cache.alpha.learnable else None
    nt, stream = threads_for(n_threads, dy.size), streams(dx.nbytes)
    _residual.add_norm_backward(dx, dresidual, dweight, dbias, dalpha, dy,
                                None if dh is None else _rows(dh), cache.h, cache.x,
                                cache.residual, cache.weight, cache.alpha.vector, cache.mean,
                                cache.rstd, cache.dropout.kernel_arg(), nt, stream)
    return (_finish(out, dx, cache.shape), _finish(dresidual_out, dresidual, cache.shape),
            dweight, dbias, cache.alpha.grad(dalpha, dtype))


def _gradient_rows(buffer, name, rows, shape, inputs, kept):
    """Where the kernel writes one gradient: as _output_rows, but never memory of an input
    (the fused backward kernel reads dy and dh while it writes), so buffer may be dy or dh
    itself only through a fresh array that _finish copies into it."""
    target = _output_rows(buffer, rows, shape, inputs, name)
    for what, a in kept.items():  # the cache must stay valid for another call
        if buffer is not None and a is not None and np.may_share_memory(buffer, a):
            raise ValueError(f"{name} must not share memory with the cache's {what}: "
                             f"pass a separate buffer")
    if any(a is not None and np.may_share_memory(target, a) for a in inputs.values()):
        return np.empty_like(rows)
    return target


def add_rms_norm_forward(x, residual, weight=None, eps=1e-6, *, alpha=1.0, p=0.0, seed=0,
                         training=True, out=None, residual_out=None, n_threads=None):
    """Pre-Norm:  h = residual + alpha * dropout(x, p, seed),  y = h * rstd * w,
    rstd = 1/sqrt(mean(h^2) + eps) over the last axis.  Returns ((y, h), cache).

    Backward (add_rms_norm_backward): gh = dh + rstd*(g - hn*mean(g*hn)), g = dy*w,
    hn = h*rstd;  dresidual = gh,  dx = gh * alpha * keep/(1-p),  dweight = sum dy*hn,
    dalpha = sum gh * dropout(x).   NumPy reference: resnorm.reference.add_rms_norm_forward.

    x, residual: (..., D) float32/float64 of the same shape and dtype.  weight: (D,) or None.
    alpha: a real number (fixed), a 0-d array (learnable scalar) or a (D,) array (learnable
    per channel), arrays of x's dtype.  p in [0, 1], seed in [0, 2**64): dropout of x
    (off when training=False).  out, residual_out: optional buffers for y and h;
    residual_out=residual updates the residual stream in place.  The cache keeps h by
    reference: do not overwrite it (e.g. as the next call's residual_out) before backward.
    """
    y, h, cache = _add_norm("add_rms_norm_forward", x, residual, weight, None, eps, alpha, p,
                            seed, training, out, residual_out, n_threads, keep_cache=True)
    return (y, h), cache


def add_rms_norm(x, residual, weight=None, eps=1e-6, *, alpha=1.0, p=0.0, seed=0,
                 training=True, out=None, residual_out=None, n_threads=None):
    """Pre-Norm:  h = residual + alpha * dropout(x),  y = rms_norm(h, weight, eps).  Returns (y, h).

    Inference form of add_rms_norm_forward (same arguments).  One pass over memory: reads x
    and residual, writes h and y.  out=x and residual_out=residual work in place.
    NumPy reference: resnorm.reference.add_rms_norm_forward.
    """
    y, h, _ = _add_norm("add_rms_norm_forward", x, residual, weight, None, eps, alpha, p, seed,
                        training, out, residual_out, n_threads, keep_cache=False)
    return y, h


def add_rms_norm_backward(dy, dh, cache, *, out=None, dresidual_out=None, n_threads=None):
    """gh = dh + rstd * (g - hn * mean(g*hn)),  g = dy*w,  hn = h*rstd   (gradient reaching h);
    dresidual = gh;  dx = gh * alpha * keep/(1-p);  dweight = sum_rows dy*hn;
    dalpha = sum gh * dropout(x)  (over rows, and over channels for a scalar alpha).

    dy: gradient of y; dh: gradient arriving along the residual stream (None: zero).
    out, dresidual_out: optional buffers for dx and dresidual (each may be dy or dh itself;
    never an array the cache holds).
    Returns (dx, dresidual, dweight, dalpha); dweight is None without weight, dalpha None
    for a fixed alpha.  NumPy reference: resnorm.reference.add_rms_norm_backward.
    """
    dx, dres, dw, _, da = _add_norm_backward("add_rms_norm_forward", dy, dh, cache, n_threads,
                                             out, dresidual_out)
    return dx, dres, dw, da


def add_layer_norm_forward(x, residual, weight=None, bias=None, eps=1e-5, *, alpha=1.0, p=0.0,
                           seed=0, training=True, out=None, residual_out=None, n_threads=None):
    """Pre-Norm:  h = residual + alpha * dropout(x),  y = (h - mean) * rstd * w + b,
    rstd = 1/sqrt(var(h) + eps).  Returns ((y, h), cache).

    Backward (add_layer_norm_backward): hhat = (h-mean)*rstd, g = dy*w,
    gh = dh + rstd*(g - mean(g) - hhat*mean(g*hhat));  dresidual = gh,
    dx = gh * alpha * keep/(1-p), dweight = sum dy*hhat, dbias = sum dy, dalpha = sum gh*dropout(x).
    NumPy reference: resnorm.reference.add_layer_norm_forward.  Arguments as add_rms_norm_forward,
    plus bias (D,) or None.
    """
    y, h, cache = _add_norm("add_layer_norm_forward", x, residual, weight, bias, eps, alpha, p,
                            seed, training, out, residual_out, n_threads, keep_cache=True)
    return (y, h), cache


def add_layer_norm(x, residual, weight=None, bias=None, eps=1e-5, *, alpha=1.0, p=0.0, seed=0,
                   training=True, out=None, residual_out=None, n_threads=None):
    """Pre-Norm:  h = residual + alpha * dropout(x),  y = layer_norm(h, weight, bias, eps).
    Returns (y, h).  Inference form of add_layer_norm_forward (same arguments).
    NumPy reference: resnorm.reference.add_layer_norm_forward.
    """
    y, h, _ = _add_norm("add_layer_norm_forward", x, residual, weight, bias, eps, alpha, p, seed,
                        training, out, residual_out, n_threads, keep_cache=False)
    return y, h


def add_layer_norm_backward(dy, dh, cache, *, out=None, dresidual_out=None, n_threads=None):
    """gh = dh + rstd * (g - mean(g) - hhat * mean(g*hhat)),  g = dy*w,  hhat = (h - mean)*rstd;
    dresidual = gh;  dx = gh * alpha * keep/(1-p);  dweight = sum_rows dy*hhat;
    dbias = sum_rows dy;  dalpha = sum gh * dropout(x).

    out, dresidual_out: optional buffers for dx and dresidual (each may be dy or dh itself;
    never an array the cache holds).
    Returns (dx, dresidual, dweight, dbias, dalpha) (None for an absent weight / bias or a
    fixed alpha).  dh may be None.  NumPy reference: resnorm.reference.add_layer_norm_backward.
    """
    return _add_norm_backward("add_layer_norm_forward", dy, dh, cache, n_threads, out,
                              dresidual_out)


def add_rms_norm_post_forward(x, residual, weight=None, eps=1e-6, *, alpha=1.0, p=0.0, seed=0,
                              training=True, out=None, n_threads=None):
    """Post-Norm:  y = rms_norm(residual + alpha * dropout(x), weight, eps).  Returns (y, cache).

    The sum h is not written (forward moves three streams: x, residual, y); backward
    recomputes it row by row from the cached x and residual (by reference: do not modify
    them before backward; out must not be either of them).
    Backward: as add_rms_norm_backward with dh = 0.
    NumPy reference: resnorm.reference.add_rms_norm_post_forward.
    """
    y, _, cache = _add_norm("add_rms_norm_post_forward", x, residual, weight, None, eps, alpha,
                            p, seed, training, out, None, n_threads, keep_cache=True)
    return y, cache


def add_rms_norm_post(x, residual, weight=None, eps=1e-6, *, alpha=1.0, p=0.0, seed=0,
                      training=True, out=None, n_threads=None):
    """Post-Norm:  y = rms_norm(residual + alpha * dropout(x), weight, eps).

    Inference form of add_rms_norm_post_forward (same arguments); out=x or out=residual
    work in place.  NumPy reference: resnorm.reference.add_rms_norm_post_forward.
    """
    return _add_norm("add_rms_norm_post_forward", x, residual, weight, None, eps, alpha, p, seed,
                     training, out, None, n_threads, keep_cache=False)[0]


def add_rms_norm_post_backward(dy, cache, *, out=None, dresidual_out=None, n_threads=None):
    """gh = rstd * (g - hn * mean(g*hn)),  g = dy*w,  hn = h*rstd,  h recomputed;
    dresidual = gh;  dx = gh * alpha * keep/(1-p);  dweight = sum dy*hn;
    dalpha = sum gh*dropout(x).

    out, dresidual_out: optional buffers for dx and dresidual (each may be dy itself; never
    an array the cache holds).
    Returns (dx, dresidual, dweight, dalpha).
    NumPy reference: resnorm.reference.add_rms_norm_post_backward.
    """
    dx, dres, dw, _, da = _add_norm_backward("add_rms_norm_post_forward", dy, None, cache,
                                             n_threads, out, dresidual_out)
    return dx, dres, dw, da


def add_layer_norm_post_forward(x, residual, weight=None, bias=None, eps=1e-5, *, alpha=1.0,
                                p=0.0, seed=0, training=True, out=None, n_threads=None):
    """Post-Norm:  y = layer_norm(residual + alpha * dropout(x), weight, bias, eps).
    Returns (y, cache).  As add_rms_norm_post_forward (h recomputed in backward).
    NumPy reference: resnorm.reference.add_layer_norm_post_forward.
    """
    y, _, cache = _add_norm("add_layer_norm_post_forward", x, residual, weight, bias, eps,
                            alpha, p, seed, training, out, None, n_threads, keep_cache=True)
    return y, cache


def add_layer_norm_post(x, residual, weight=None, bias=None, eps=1e-5, *, alpha=1.0, p=0.0,
                        seed=0, training=True, out=None, n_threads=None):
    """Post-Norm:  y = layer_norm(residual + alpha * dropout(x), weight, bias, eps).

    Inference form of add_layer_norm_post_forward (same arguments).
    NumPy reference: resnorm.reference.add_layer_norm_post_forward.
    """
    return _add_norm("add_layer_norm_post_forward", x, residual, weight, bias, eps, alpha, p,
                     seed, training, out, None, n_threads, keep_cache=False)[0]


def add_layer_norm_post_backward(dy, cache, *, out=None, dresidual_out=None, n_threads=None):
    """gh = rstd * (g - mean(g) - hhat * mean(g*hhat)),  g = dy*w,  h recomputed;
    dresidual = gh;  dx = gh * alpha * keep/(1-p);  dweight = sum dy*hhat;  dbias = sum dy;
    dalpha = sum gh * dropout(x).

    out, dresidual_out: optional buffers for dx and dresidual (each may be dy itself; never
    an array the cache holds).
    Returns (dx, dresidual, dweight, dbias, dalpha).
    NumPy reference: resnorm.reference.add_layer_norm_post_backward.
    """
    return _add_norm_backward("add_layer_norm_post_forward", dy, None, cache, n_threads, out,
                              dresidual_out)


# --------------------------------------------------------------------------- scaled residual

@dataclass(frozen=True)
class ScaledResidualCache:
    """What scaled_residual_backward needs: alpha, and F (by reference) when alpha is learnable."""
    branch: np.ndarray | None  # (N, D) F, only for a learnable alpha
    alpha: ResidualScale
    shape: tuple
    dtype: np.dtype


def _two_inputs(x, F):
    x = _checks.float_array(x, "x")
    return x, _checks.like_array(F, "F", x.shape, x.dtype)


def _scaled_residual(x, F, alpha, out, n_threads, keep_cache):
    """Checks every argument, runs the kernel; returns (h, cache or None)."""
    x, F = _two_inputs(x, F)
    scale = _residual_scale(alpha, x.shape[-1], x.dtype)
    n_threads = _checks.n_threads_value(n_threads)
    if keep_cache:
        _not_kept({"out": out}, {"F": F, "alpha": scale.vector} if scale.learnable else {})
    rows_x, rows_f = _rows(x), _rows(F)
    out_rows = _output_rows(out, rows_x, x.shape, {"x": x, "F": F, "alpha": scale.vector})
    _residual.scaled_residual_forward(out_rows, rows_x, rows_f, scale.vector,
                                      threads_for(n_threads, rows_x.size),
                                      streams(out_rows.nbytes))
    cache = None
    if keep_cache:
        cache = ScaledResidualCache(rows_f if scale.learnable else None, scale, x.shape, x.dtype)
    return _finish(out, out_rows, x.shape), cache


def scaled_residual_forward(x, F, alpha, *, out=None, n_threads=None):
    """h = x + alpha * F.  Returns (h, cache).

    alpha: a real number (fixed, no gradient), a 0-d array (learnable scalar) or a (D,)
    array (learnable per channel, LayerScale), arrays of x's dtype.
    Backward (scaled_residual_backward): dx = dh, dF = alpha * dh, dalpha = sum dh * F
    (over rows; and over channels for a scalar alpha).
    NumPy reference: resnorm.reference.scaled_residual_forward.
    out: optional buffer for h (may be x; not F or alpha when alpha is learnable).
    """
    return _scaled_residual(x, F, alpha, out, n_threads, keep_cache=True)


def scaled_residual(x, F, alpha, *, out=None, n_threads=None):
    """h = x + alpha * F.  Inference form of scaled_residual_forward (same arguments; out
    may be x or F).  NumPy reference: resnorm.reference.scaled_residual_forward."""
    return _scaled_residual(x, F, alpha, out, n_threads, keep_cache=False)[0]


def _backward_rows(dh, cache, cache_type, forward_name, n_threads, expected, valid=None):
    """Checks dh, the cache (its type, valid(), the arrays of expected: see
    _checks.cache_arrays) and n_threads; returns (dh rows, n_threads, stream)."""
    if not isinstance(cache, cache_type):
        raise TypeError(f"cache must be the {cache_type.__name__} returned by {forward_name}, "
                        f"got {type(cache).__name__}")
    _checks.cache_arrays(cache, expected, valid is None or valid())
    dh = _rows(_checks.like_array(dh, "dh", cache.shape, cache.dtype))
    n_threads = _checks.n_threads_value(n_threads)
    return dh, threads_for(n_threads, dh.size), streams(dh.nbytes)


def scaled_residual_backward(dh, cache, *, n_threads=None):
    """dx = dh;  dF = alpha * dh;  dalpha = sum dh * F.  Returns (dx, dF, dalpha);
    dalpha is None for a fixed alpha, else of alpha's shape.
    NumPy reference: resnorm.reference.scaled_residual_backward."""
    def expected(n, d, dtype):
        learnable = cache.alpha.learnable
        return [(cache.branch, (n, d), dtype, learnable),
                (cache.alpha.vector, (d,), dtype, learnable)]

    dh, nt, stream = _backward_rows(dh, cache, ScaledResidualCache, "scaled_residual_forward",
                                    n_threads, expected, lambda: _valid_scale(cache.alpha))
    dx, dF = np.empty_like(dh), np.empty_like(dh)
    dalpha = np.empty(dh.shape[1]) if cache.alpha.learnable else None
    _residual.scaled_residual_backward(dx, dF, dalpha, dh, cache.branch, cache.alpha.vector, nt,
                                       stream)
    return (dx.reshape(cache.shape), dF.reshape(cache.shape),
            cache.alpha.grad(dalpha, cache.dtype))


# --------------------------------------------------------------------------- gated residual

@dataclass(frozen=True)
class GatedResidualCache:
    """What gated_residual_backward needs: F and the gate (by reference).  A per-channel
    gate keeps sigmoid(g) and sigmoid'(g) as (D,) vectors; a full gate recomputes them."""
    branch: np.ndarray         # (N, D) F
    gate: np.ndarray | None    # (N, D) g, full-shape gates only
    s: np.ndarray | None       # (D,) sigmoid(g) in the input dtype, per-channel gates only
    ds: np.ndarray | None      # (D,) float64 sigmoid(g)*(1-sigmoid(g)), per-channel only
    shape: tuple
    dtype: np.dtype


def _gated_residual(x, F, g, out, n_threads, keep_cache):
    """Checks every argument, runs the kernel; returns (h, cache or None)."""
    x, F = _two_inputs(x, F)
    g = _checks.gate_array(g, x.shape, x.dtype)
    n_threads = _checks.n_threads_value(n_threads)
    if keep_cache:
        _not_kept({"out": out}, {"F": F, "g": g})
    rows_x, rows_f = _rows(x), _rows(F)
    out_rows = _output_rows(out, rows_x, x.shape, {"x": x, "F": F, "g": g})
    nt, stream = threads_for(n_threads, rows_x.size), streams(out_rows.nbytes)
    if g.shape == x.shape:
        gate, s, ds = _rows(g), None, None
        _residual.gated_residual_forward(out_rows, rows_x, rows_f, gate, nt, stream)
    else:
        # per channel: the gate is a LayerScale vector sigmoid(g), evaluated once
        g64 = g.astype(np.float64).reshape(1, -1)
        s64, ds = np.empty_like(g64), np.empty_like(g64)
        _residual.sigmoid(s64, ds, g64, 1)
        gate, s, ds = None, s64[0].astype(x.dtype), ds[0]
        _residual.scaled_residual_forward(out_rows, rows_x, rows_f, s, nt, stream)
    cache = GatedResidualCache(rows_f, gate, s, ds, x.shape, x.dtype) if keep_cache else None
    return _finish(out, out_rows, x.shape), cache


def gated_residual_forward(x, F, g, *, out=None, n_threads=None):
    """h = x + sigmoid(g) * F,  g of F's shape or (D,) (per channel).  Returns (h, cache).

    Backward (gated_residual_backward): s = sigmoid(g): dx = dh, dF = s * dh,
    dg = dh * F * s * (1 - s) (summed over rows for a per-channel g).
    NumPy reference: resnorm.reference.gated_residual_forward.
    sigmoid is evaluated in float64 (exp of -|g|: no overflow), then rounded to x's dtype.
    out: optional buffer for h (may be x; not F or g, which backward reads).
    """
    return _gated_residual(x, F, g, out, n_threads, keep_cache=True)


def gated_residual(x, F, g, *, out=None, n_threads=None):
    """h = x + sigmoid(g) * F.  Inference form of gated_residual_forward (same arguments;
    out may be x, F or g).  NumPy reference: resnorm.reference.gated_residual_forward."""
    return _gated_residual(x, F, g, out, n_threads, keep_cache=False)[0]


def gated_residual_backward(dh, cache, *, n_threads=None):
    """dx = dh;  dF = sigmoid(g) * dh;  dg = dh * F * s * (1 - s)  (s = sigmoid(g); summed
    over rows for a per-channel g).  Returns (dx, dF, dg), dg of g's shape.
    NumPy reference: resnorm.reference.gated_residual_backward."""
    def expected(n, d, dtype):
        full = cache.gate is not None
        return [(cache.branch, (n, d), dtype, True), (cache.gate, (n, d), dtype, full),
                (cache.s, (d,), dtype, not full), (cache.ds, (d,), np.float64, not full)]

    dh, nt, stream = _backward_rows(dh, cache, GatedResidualCache, "gated_residual_forward",
                                    n_threads, expected)
    dx, dF = np.empty_like(dh), np.empty_like(dh)
    if cache.gate is not None:
        dg = np.empty_like(dh)
        _residual.gated_residual_backward(dx, dF, dg, dh, cache.branch, cache.gate, nt, stream)
        dg = dg.reshape(cache.shape)
    else:
        dsum = np.empty(dh.shape[1])
        _residual.scaled_residual_backward(dx, dF, dsum, dh, cache.branch, cache.s, nt, stream)
        dg = (dsum * cache.ds).astype(cache.dtype)
    return dx.reshape(cache.shape), dF.reshape(cache.shape), dg
