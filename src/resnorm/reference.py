"""Plain NumPy float64 twins of every compiled kernel, written to be read.

Each function follows its Cython kernel step by step (same names, same reductions), but
favours clarity over speed and computes everything in float64.  Tests compare the kernels
against these; explain mode prints their intermediate values.

Shapes: x is (..., D); row statistics (mean, rstd) have shape (...,); weight/bias are (D,).
"""
import numpy as np


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


# --------------------------------------------------------------------------- RMSNorm

def rms_norm_forward(x, weight=None, eps=1e-6):
    """y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps).  Returns (y, rstd)."""
    x, w = _f64(x), _f64(weight)
    mean_square = np.mean(x * x, axis=-1)           # the one row reduction
    rstd = 1.0 / np.sqrt(mean_square + eps)
    y = x * rstd[..., None]
    if w is not None:
        y = y * w
    return y, rstd


def rms_norm_backward(dy, x, weight, rstd):
    """Gradients of y = x * rstd * w.  Returns (dx, dweight); dweight is None without weight.

    With g = dy * w:  dx = rstd * (g - x * rstd^2 * mean(g * x)),  dw = sum_rows dy * x * rstd.
    (Derivation: docs/rms_norm.md.)
    """
    dy, x, w, rstd = _f64(dy), _f64(x), _f64(weight), _f64(rstd)[..., None]
    g = dy if w is None else dy * w
    c = np.mean(g * x, axis=-1, keepdims=True)      # the one row reduction
    dx = rstd * (g - x * rstd**2 * c)
    dw = None if w is None else (dy * x * rstd).reshape(-1, x.shape[-1]).sum(axis=0)
    return dx, dw


# --------------------------------------------------------------------------- LayerNorm

def layer_norm_forward(x, weight=None, bias=None, eps=1e-5):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps), var biased (divide by D).

    Returns (y, mean, rstd).
    """
    x, w, b = _f64(x), _f64(weight), _f64(bias)
    mean = np.mean(x, axis=-1)                      # reduction 1
    centred = x - mean[..., None]
    var = np.mean(centred * centred, axis=-1)       # reduction 2 (two-pass variance)
    rstd = 1.0 / np.sqrt(var + eps)
    y = centred * rstd[..., None]
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y, mean, rstd


def layer_norm_backward(dy, x, weight, mean, rstd):
    """Gradients of y = xhat * w + b.  Returns (dx, dweight, dbias).

    With g = dy * w and xhat = (x - mean) * rstd:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum_rows dy * xhat,
    db = sum_rows dy.  (Derivation: docs/layer_norm.md.)  dweight is None without weight;
    dbias is always returned (the caller drops it when there is no bias).
    """
    dy, x, w = _f64(dy), _f64(x), _f64(weight)
    mean, rstd = _f64(mean)[..., None], _f64(rstd)[..., None]
    xhat = (x - mean) * rstd
    g = dy if w is None else dy * w
    mean_g = np.mean(g, axis=-1, keepdims=True)               # reduction 1
    mean_gxhat = np.mean(g * xhat, axis=-1, keepdims=True)    # reduction 2
    dx = rstd * (g - mean_g - xhat * mean_gxhat)
    d = x.shape[-1]
    dw = None if w is None else (dy * xhat).reshape(-1, d).sum(axis=0)
    db = dy.reshape(-1, d).sum(axis=0)
    return dx, dw, db
