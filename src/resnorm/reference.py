"""Plain NumPy float64 twins of every compiled kernel, written to be read.

Each function follows its Cython kernel step by step (same names, same reductions), but
favours clarity over speed and computes everything in float64.  Tests compare the kernels
against these; explain mode prints their intermediate values.

Shapes: x is (..., D); row statistics (mean, rstd) have shape (...,); weight/bias are (D,).
With normalized_shape (the norms and the fused add + norm, as in torch) a row is the last
k axes together: x is (..., *normalized_shape), the statistics (...,), weight/bias
normalized_shape.  zero_centered_weight: the gain applied is 1 + weight.
"""
import numpy as np


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _axes(x, normalized_shape):
    """How many trailing axes of x a row spans (normalized_shape None: the last one)."""
    if normalized_shape is None:
        return 1
    return len(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else 1


def _flat(a, k):
    """a (..., *row) with its last k axes flattened into one (None stays None)."""
    if a is None:
        return None
    lead, row = np.shape(a)[:np.ndim(a) - k], np.shape(a)[np.ndim(a) - k:]
    return np.reshape(a, lead + (int(np.prod(row)),))


def gain(weight, zero_centered_weight=False):
    """The per-channel factor a norm applies: weight, or 1 + weight for a zero-centred
    weight (Gemma: weight starts at 0, the identity); None for no weight."""
    w = _f64(weight)
    return 1.0 + w if w is not None and zero_centered_weight else w


# --------------------------------------------------------------------------- RMSNorm

def rms_norm_forward(x, weight=None, eps=1e-6, *, normalized_shape=None,
                     zero_centered_weight=False):
    """y = xn * w,  xn = x * rstd,  rstd = 1/sqrt(ms + eps),  ms = mean(x^2) over a row.
    Returns (y, rstd)."""
    k = _axes(x, normalized_shape)
    shape = np.shape(x)
    x, w = _flat(_f64(x), k), _flat(gain(weight, zero_centered_weight), k)
    ms = np.mean(x * x, axis=-1)                    # the one row reduction: the mean square
    rstd = 1.0 / np.sqrt(ms + eps)
    xn = x * rstd[..., None]                        # the normalised row
    y = xn if w is None else xn * w
    return y.reshape(shape), rstd


def rms_norm_backward(dy, x, weight, rstd, *, normalized_shape=None, zero_centered_weight=False):
    """Gradients of y = x * rstd * w.  Returns (dx, dweight); dweight is None without weight.

    With g = dy * w and xn = x * rstd:  dx = rstd * (g - xn * m),  m = mean(g * xn);
    dw = sum_rows dy * xn (also for a zero-centred weight: 1 + w has w's gradient).
    (Derivation: docs/rms_norm.md.)
    """
    k = _axes(x, normalized_shape)
    shape, row = np.shape(x), np.shape(x)[np.ndim(x) - k:]
    dy, x = _flat(_f64(dy), k), _flat(_f64(x), k)
    w, rstd = _flat(gain(weight, zero_centered_weight), k), _f64(rstd)[..., None]
    xn = x * rstd
    g = dy if w is None else dy * w
    m = np.mean(g * xn, axis=-1, keepdims=True)     # the one row reduction
    dx = rstd * (g - xn * m)
    dw = None if w is None else (dy * xn).reshape(-1, x.shape[-1]).sum(axis=0).reshape(row)
    return dx.reshape(shape), dw


# --------------------------------------------------------------------------- LayerNorm

def layer_norm_forward(x, weight=None, bias=None, eps=1e-5, *, normalized_shape=None,
                       zero_centered_weight=False):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps), var biased (divide by D,
    the elements of a row).

    Returns (y, mean, rstd).
    """
    k = _axes(x, normalized_shape)
    shape = np.shape(x)
    x, w, b = _flat(_f64(x), k), _flat(gain(weight, zero_centered_weight), k), _flat(_f64(bias), k)
    mean = np.mean(x, axis=-1)                      # reduction 1
    centred = x - mean[..., None]
    var = np.mean(centred * centred, axis=-1)       # reduction 2 (two-pass variance)
    rstd = 1.0 / np.sqrt(var + eps)
    y = centred * rstd[..., None]
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y.reshape(shape), mean, rstd


def layer_norm_backward(dy, x, weight, mean, rstd, *, normalized_shape=None,
                        zero_centered_weight=False):
    """Gradients of y = xhat * w + b.  Returns (dx, dweight, dbias).

    With g = dy * w and xhat = (x - mean) * rstd:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum_rows dy * xhat,
    db = sum_rows dy.  (Derivation: docs/layer_norm.md.)  dweight is None without weight;
    dbias is always returned (the caller drops it when there is no bias).
    """
    k = _axes(x, normalized_shape)
    shape, row = np.shape(x), np.shape(x)[np.ndim(x) - k:]
    dy, x, w = _flat(_f64(dy), k), _flat(_f64(x), k), _flat(gain(weight, zero_centered_weight), k)
    mean, rstd = _f64(mean)[..., None], _f64(rstd)[..., None]
    xhat = (x - mean) * rstd
    g = dy if w is None else dy * w
    mean_g = np.mean(g, axis=-1, keepdims=True)               # reduction 1
    mean_gxhat = np.mean(g * xhat, axis=-1, keepdims=True)    # reduction 2
    dx = rstd * (g - mean_g - xhat * mean_gxhat)
    d = x.shape[-1]
    dw = None if w is None else (dy * xhat).reshape(-1, d).sum(axis=0).reshape(row)
    db = dy.reshape(-1, d).sum(axis=0).reshape(row)
    return dx.reshape(shape), dw, db


# --------------------------------------------------------------------------- dropout

# Philox-4x32-10 constants: two round multipliers and two Weyl key increments.
PHILOX_M0, PHILOX_M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
PHILOX_W0, PHILOX_W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def philox4x32_10(counter, key):
    """Philox-4x32-10 of counters (..., 4) under key (2,), all 32-bit words.  Returns (..., 4)
    uint32.  Ten rounds of:  (hi0, lo0) = M0*c0, (hi1, lo1) = M1*c2 (64-bit products),
    c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0), then the key is bumped by (W0, W1)."""
    c = [np.asarray(counter, dtype=np.uint64)[..., j] for j in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for _ in range(10):
        p0 = c[0] * PHILOX_M0                       # < 2**64: exact in uint64
        p1 = c[2] * PHILOX_M1
        c = [(p1 >> _SHIFT32) ^ c[1] ^ k0, p1 & _LOW32,
             (p0 >> _SHIFT32) ^ c[3] ^ k1, p0 & _LOW32]
        k0 = (k0 + PHILOX_W0) & _LOW32
        k1 = (k1 + PHILOX_W1) & _LOW32
    return np.stack(c, axis=-1).astype(np.uint32)


def dropout_uniforms(seed, n, start=0):
    """The 32-bit uniforms of flat elements start .. start+n-1 under a 64-bit seed.

    Element i takes output word (i % 64) // 16 of the Philox block whose counter is
    16 * (i // 64) + i % 16 (low and high 32 bits in words 0 and 1, words 2, 3 zero); the
    key is (seed low 32 bits, seed high 32 bits).  (This is resnorm_c/core/philox.h's map: a
    vector of 16 blocks yields 16 consecutive elements per word.)
    """
    i = np.arange(start, start + n, dtype=np.uint64)
    block = (i // np.uint64(64)) * np.uint64(16) + i % np.uint64(16)
    word = ((i % np.uint64(64)) // np.uint64(16)).astype(np.intp)
    zero = np.zeros_like(block)
    counter = np.stack([block & _LOW32, block >> _SHIFT32, zero, zero], axis=-1)
    outputs = philox4x32_10(counter, (seed & 0xFFFFFFFF, seed >> 32))
    return outputs[np.arange(n), word]


def dropout_mask(shape, p, seed):
    """The keep-mask of an array of this shape: element i (flat C-order index) is kept when
    its uniform is >= floor(p * 2**32), i.e. with probability 1 - p.  p = 1 keeps nothing."""
    if p == 1.0:
        return np.zeros(shape, dtype=bool)
    threshold = np.floor(p * 2.0**32)
    return (dropout_uniforms(seed, int(np.prod(shape))) >= threshold).reshape(shape)


def _keep_scale(p):
    """What a kept element is multiplied by: 1/(1-p) (inverted dropout); 0 when p = 1."""
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)


def dropout_forward(x, p, seed, training=True):
    """y = x * keep / (1 - p) in training; y = x in eval or for p = 0.  Returns (y, keep)."""
    x = _f64(x)
    if not training or p == 0.0:
        return x.copy(), np.ones(x.shape, dtype=bool)
    keep = dropout_mask(x.shape, p, seed)
    return x * (keep * _keep_scale(p)), keep


def dropout_backward(dy, keep, p):
    """dx = dy * keep / (1 - p): dropout is linear, its own transpose."""
    return _f64(dy) * (keep * _keep_scale(p))


# --------------------------------------------------------------------------- fused add + norm

def sum_like(a, alpha):
    """Sums a (..., D) over what alpha broadcasts along: everything for a scalar alpha, the
    rows for a (D,) alpha (for alpha of a normalised row's shape, the rows of that shape)."""
    if np.ndim(alpha) == 0:
        return np.asarray(a.sum())
    return a.reshape((-1,) + np.shape(alpha)).sum(axis=0)


def add_rms_norm_forward(x, residual, weight=None, eps=1e-6, alpha=1.0, p=0.0, seed=0,
                         training=True, **norm):
    """Pre-Norm, step by step:  d = dropout(x);  h = residual + alpha * d;  y = rms_norm(h).
    norm: normalized_shape, zero_centered_weight, as for rms_norm_forward.
    Returns (y, h, rstd, keep)."""
    d, keep = dropout_forward(x, p, seed, training)
    h = _f64(residual) + _f64(alpha) * d
    y, rstd = rms_norm_forward(h, weight, eps, **norm)
    return y, h, rstd, keep


def add_rms_norm_backward(dy, dh, x, h, weight, rstd, alpha, keep, p, **norm):
    """Gradients of (y, h) of add_rms_norm_forward given dy and dh (dh None: 0).

    gh = dh + (RMSNorm backward of dy at h);  dresidual = gh;  dx = dropout_backward(alpha*gh);
    dalpha = sum gh * dropout(x).  Returns (dx, dresidual, dweight, dalpha)."""
    gh, dweight = rms_norm_backward(dy, h, weight, rstd, **norm)
    if dh is not None:
        gh = gh + _f64(dh)
    d = dropout_backward(x, keep, p)                 # = dropout(x): the same linear map
    dx = dropout_backward(_f64(alpha) * gh, keep, p)
    return dx, gh, dweight, sum_like(gh * d, alpha)


def add_layer_norm_forward(x, residual, weight=None, bias=None, eps=1e-5, alpha=1.0, p=0.0,
                           seed=0, training=True, **norm):
    """Pre-Norm:  d = dropout(x);  h = residual + alpha * d;  y = layer_norm(h).
    Returns (y, h, mean, rstd, keep)."""
    d, keep = dropout_forward(x, p, seed, training)
    h = _f64(residual) + _f64(alpha) * d
    y, mean, rstd = layer_norm_forward(h, weight, bias, eps, **norm)
    return y, h, mean, rstd, keep


def add_layer_norm_backward(dy, dh, x, h, weight, mean, rstd, alpha, keep, p, **norm):
    """Gradients of (y, h) of add_layer_norm_forward.  Returns (dx, dresidual, dweight,
    dbias, dalpha)."""
    gh, dweight, dbias = layer_norm_backward(dy, h, weight, mean, rstd, **norm)
    if dh is not None:
        gh = gh + _f64(dh)
    d = dropout_backward(x, keep, p)
    dx = dropout_backward(_f64(alpha) * gh, keep, p)
    return dx, gh, dweight, dbias, sum_like(gh * d, alpha)


def add_rms_norm_post_forward(x, residual, weight=None, eps=1e-6, alpha=1.0, p=0.0, seed=0,
                              training=True, **norm):
    """Post-Norm:  y = rms_norm(residual + alpha * dropout(x)): the Pre-Norm computation, of
    which only y leaves the block.  Returns (y, h, rstd, keep)."""
    return add_rms_norm_forward(x, residual, weight, eps, alpha, p, seed, training, **norm)


def add_rms_norm_post_backward(dy, x, h, weight, rstd, alpha, keep, p, **norm):
    """Pre-Norm backward with no gradient along h (dh = 0)."""
    return add_rms_norm_backward(dy, None, x, h, weight, rstd, alpha, keep, p, **norm)


def add_layer_norm_post_forward(x, residual, weight=None, bias=None, eps=1e-5, alpha=1.0,
                                p=0.0, seed=0, training=True, **norm):
    """Post-Norm:  y = layer_norm(residual + alpha * dropout(x)).
    Returns (y, h, mean, rstd, keep)."""
    return add_layer_norm_forward(x, residual, weight, bias, eps, alpha, p, seed, training,
                                  **norm)


def add_layer_norm_post_backward(dy, x, h, weight, mean, rstd, alpha, keep, p, **norm):
    """Pre-Norm backward with dh = 0."""
    return add_layer_norm_backward(dy, None, x, h, weight, mean, rstd, alpha, keep, p, **norm)


# --------------------------------------------------------------------------- scaled, gated

def scaled_residual_forward(x, F, alpha):
    """h = x + alpha * F  (alpha a scalar or a (D,) vector)."""
    return _f64(x) + _f64(alpha) * _f64(F)


def scaled_residual_backward(dh, F, alpha):
    """dx = dh;  dF = alpha * dh;  dalpha = sum dh * F.  Returns (dx, dF, dalpha)."""
    dh = _f64(dh)
    return dh.copy(), _f64(alpha) * dh, sum_like(dh * _f64(F), alpha)


def sigmoid(g):
    """1 / (1 + exp(-g)), written with exp(-|g|) so that it never overflows."""
    g = _f64(g)
    e = np.exp(-np.abs(g))
    return np.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def sigmoid_grad(g):
    """s * (1 - s), s = sigmoid(g), written as e / (1 + e)^2 with e = exp(-|g|): it keeps its
    precision where s rounds to 1 (1 - s would be 0 for g > 37)."""
    e = np.exp(-np.abs(_f64(g)))
    return e / (1.0 + e) ** 2


def gated_residual_forward(x, F, g):
    """h = x + sigmoid(g) * F  (g of F's shape, or a (D,) per-channel vector)."""
    return _f64(x) + sigmoid(g) * _f64(F)


def gated_residual_backward(dh, F, g):
    """dx = dh;  dF = s * dh;  dg = dh * F * s * (1 - s), s = sigmoid(g), summed over rows
    when g is per channel.  Returns (dx, dF, dg)."""
    dh, F, s = _f64(dh), _f64(F), sigmoid(g)
    dg = dh * F * sigmoid_grad(g)
    if np.shape(g) != dh.shape:
        dg = dg.reshape(-1, dg.shape[-1]).sum(axis=0)
    return dh.copy(), s * dh, dg
