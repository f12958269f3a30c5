"""resnorm's NumPy functions applied to tensors: where resnorm.torch calls the norms, the
gated RMSNorm and dropout (the fused add + norm functions: resnorm.torch.residual).

Each function takes checked CPU tensors (float32/float64, x of shape (..., D)), hands
resnorm NumPy views of their storage and returns tensors that wrap the arrays resnorm
allocated (torch.from_numpy: no copy).  Nothing is copied, except a strided input, which
resnorm copies once.  resnorm checks every value (eps, shapes, dtypes) with its own errors.

The training forms return resnorm's cache, which the backward consumes: it holds NumPy
views of x and the weight (the same memory as the tensors) and the float64 row statistics.
The custom operators, which may pass only tensors between forward and backward, rebuild
the cache from saved tensors (rms_norm_cache, layer_norm_cache, gated_rms_norm_cache).

The norms' options, as resnorm takes them (``**options``): normalized_shape (None for the
last axis) and zero_centered_weight.
"""
import numpy as np

import resnorm

from ._tensors import mixed_params, tensor, threads, view


def rms_norm(x, weight_view, eps, normalized_shape=None, zero_centered_weight=False):
    """Inference: y = x * rstd * w (resnorm.rms_norm); weight as a NumPy view or None.
    The options spelled out, not as **options: this is the decode-sized call's path."""
    return tensor(resnorm.rms_norm(view(x), weight_view, eps,
                                   normalized_shape=normalized_shape,
                                   zero_centered_weight=zero_centered_weight,
                                   n_threads=threads()))


def layer_norm(x, weight_view, bias_view, eps, normalized_shape=None,
               zero_centered_weight=False):
    """Inference: y = (x - mean) * rstd * w + b (resnorm.layer_norm); NumPy views or None."""
    return tensor(resnorm.layer_norm(view(x), weight_view, bias_view, eps,
                                     normalized_shape=normalized_shape,
                                     zero_centered_weight=zero_centered_weight,
                                     n_threads=threads()))


def rms_norm_forward(x, weight, eps, weight_view=None, **options):
    """Training forward: (y, cache).  weight_view: the weight's NumPy view, when the caller
    already has one (a module's cached view)."""
    if weight_view is None:
        weight_view = view(weight)
    y, cache = resnorm.rms_norm_forward(view(x), weight_view, eps, **options,
                                        n_threads=threads())
    return tensor(y), cache


def layer_norm_forward(x, weight, bias, eps, weight_view=None, bias_view=None, **options):
    """Training forward: (y, cache); the views as for rms_norm_forward."""
    if weight_view is None:
        weight_view = view(weight)
    if bias_view is None:
        bias_view = view(bias)
    y, cache = resnorm.layer_norm_forward(view(x), weight_view, bias_view, eps, **options,
                                          n_threads=threads())
    return tensor(y), cache


def rms_norm_backward(dy, cache):
    """(dx, dweight, None) from rms_norm_forward's cache; dweight None without weight."""
    dx, dw = resnorm.rms_norm_backward(view(dy), cache, n_threads=threads())
    return tensor(dx), tensor(dw), None


def layer_norm_backward(dy, cache):
    """(dx, dweight, dbias) from layer_norm_forward's cache; None for an absent parameter."""
    dx, dw, db = resnorm.layer_norm_backward(view(dy), cache, n_threads=threads())
    return (tensor(dx), tensor(dw),
            tensor(db))


def _rows(x, axes):
    """x's storage as the (N, D) rows a cache holds (a view when x is contiguous), a row
    spanning the last `axes` axes."""
    d = 1
    for s in x.shape[x.dim() - axes:]:
        d *= s
    return view(x.contiguous()).reshape(-1, d)


def _gain(weight, zero_centered):
    """The (D,) gain the kernels applied: the weight, or 1 + weight (rounded once in its
    dtype, as resnorm computes it), flattened."""
    if weight is None:
        return None
    return view((weight.detach() + 1 if zero_centered else weight).reshape(-1))


def _param_dtype(mixed):
    """The caches' param_dtype: float32 for float32 parameters beside 16-bit x (mixed)."""
    return np.dtype(np.float32) if mixed else None


def rms_norm_cache(x, weight, rstd, axes=1, zero_centered=False):
    """The RMSNormCache rms_norm_forward made, from its tensors (x, weight, rstd)."""
    return resnorm.RMSNormCache(_rows(x, axes), _gain(weight, zero_centered), view(rstd),
                                tuple(x.shape), axes,
                                _param_dtype(mixed_params(x, weight, None)))


def layer_norm_cache(x, weight, has_bias, mean, rstd, axes=1, zero_centered=False,
                     mixed=False):
    """The LayerNormCache layer_norm_forward made, from its tensors; mixed: its parameters
    were float32 beside 16-bit x (the weight may be absent, so it is told)."""
    return resnorm.LayerNormCache(_rows(x, axes), _gain(weight, zero_centered), has_bias,
                                  view(mean), view(rstd), tuple(x.shape), axes,
                                  _param_dtype(mixed))


def gated_rms_norm(x, gate, weight, eps, group_size, norm_before_gate):
    """Inference: the gated RMSNorm (resnorm.gated_rms_norm); gate and weight tensors or
    None, group_size an int (a divisor of D)."""
    return tensor(resnorm.gated_rms_norm(view(x), view(gate), view(weight), eps,
                                         group_size=group_size,
                                         norm_before_gate=norm_before_gate,
                                         n_threads=threads()))


def gated_rms_norm_forward(x, gate, weight, eps, group_size, norm_before_gate):
    """Training forward of the gated RMSNorm: (y, cache), cache a GatedRMSNormCache (views
    of x, gate and the weight, the float64 rstd of each group of each row)."""
    y, cache = resnorm.gated_rms_norm_forward(view(x), view(gate), view(weight), eps,
                                              group_size=group_size,
                                              norm_before_gate=norm_before_gate,
                                              n_threads=threads())
    return tensor(y), cache


def gated_rms_norm_backward(dy, cache):
    """(dx, dgate, dweight) from gated_rms_norm_forward's cache; None for an absent gate
    or weight."""
    dx, dgate, dw = resnorm.gated_rms_norm_backward(view(dy), cache, n_threads=threads())
    return tensor(dx), tensor(dgate), tensor(dw)


def gated_rms_norm_cache(x, gate, weight, rstd, group_size, norm_before_gate):
    """The GatedRMSNormCache gated_rms_norm_forward made, from its tensors (x, gate,
    weight, rstd): what the custom operator's backward hands the backward kernel."""
    return resnorm.GatedRMSNormCache(
        x=_rows(x, 1), gate=None if gate is None else _rows(gate, 1),
        weight=view(weight), rstd=view(rstd), group_size=group_size,
        norm_before_gate=norm_before_gate, shape=tuple(x.shape),
        param_dtype=_param_dtype(mixed_params(x, weight, None)))


def dropout(x, p, seed):
    """y = x * keep / (1 - p) in training mode (resnorm.dropout); also its own backward."""
    return tensor(resnorm.dropout(view(x), p, seed=seed, n_threads=threads()))
