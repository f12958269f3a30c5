"""Plain NumPy float64 twins of every compiled kernel, written to be read.

Each function follows its Cython kernel step by step (same names, same reductions), but
favours clarity over speed and computes everything in float64.  Tests compare the kernels
against these; explain mode prints their intermediate values.

Shapes: x is (..., D); row statistics (mean, rstd) have shape (...,); weight/bias are (D,).
Inputs may be any array-like of real numbers; outputs are float64 arrays.  Nothing is
checked here: the functions are the formulas, and the checks live in the public API.
With normalized_shape (the norms and the fused add + norm, as in torch) a row is the last
k axes together: x is ``(..., *normalized_shape)``, the statistics (...,), weight/bias
normalized_shape.  zero_centered_weight: the gain applied is 1 + weight.
"""
from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

F64 = NDArray[np.float64]


# Descriptions that several docstrings share, written once: "{name}" in a docstring
# decorated with @_shared_doc stands for the entry of that name.
_SHARED_DOC = {
    "forward_args": """alpha : float or array_like of shape (D,), default 1.0
    The residual scale.
p : float, default 0.0
    The drop probability of x.
seed : int, default 0
    The mask seed.
training : bool, default True
    False: no dropout.""",
    "backward_args": """alpha : float or array_like of shape (D,)
    The forward's residual scale.
keep : ndarray of bool, shape (..., D)
    The forward's keep-mask.
p : float
    The forward's drop probability.""",
    "weight_grad": """dweight : ndarray, shape (D,), or None
    The gradient of the weight; None without a weight.""",
    "norm_args": """normalized_shape : int or tuple of int, optional
    The trailing axes a row spans together, as in torch (default: the last axis).
zero_centered_weight : bool, default False
    Whether the gain applied is 1 + weight (Gemma).""",
    "norm_kwargs": """**norm
    normalized_shape and zero_centered_weight, as for `rms_norm_forward`.""",
    "alpha_grad": """dalpha : ndarray, shape () or (D,)
    The gradient of alpha.""",
}


def _shared_doc(func: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces each line "{name}" of func's docstring by _SHARED_DOC[name], indented as
    that line (Python 3.13 strips docstring indentation, older versions keep it)."""
    if func.__doc__:   # python -OO strips docstrings
        func.__doc__ = re.sub(r"^([ \t]*)\{(\w+)\}$",
                              lambda m: textwrap.indent(_SHARED_DOC[m[2]], m[1]),
                              func.__doc__, flags=re.M)
    return func


def _f64(a: ArrayLike | None) -> F64 | None:
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


def gain(weight: ArrayLike | None, zero_centered_weight: bool = False) -> F64 | None:
    """The per-channel factor a norm applies: weight, or ``1 + weight`` for a zero-centred
    weight (Gemma: the weight starts at 0, the identity).

    Parameters
    ----------
    weight : array_like, or None
        The norm's weight.
    zero_centered_weight : bool, default False
        Whether the factor is 1 + weight.

    Returns
    -------
    gain : ndarray, or None
        The factor in float64; None without a weight.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.gain([0.0, 0.5], zero_centered_weight=True)
    array([1. , 1.5])
    """
    w = _f64(weight)
    return 1.0 + w if w is not None and zero_centered_weight else w


# --------------------------------------------------------------------------- RMSNorm

@_shared_doc
def rms_norm_forward(x: ArrayLike, weight: ArrayLike | None = None,
                     eps: float = 1e-6, *,
                     normalized_shape: int | tuple[int, ...] | None = None,
                     zero_centered_weight: bool = False) -> tuple[F64, F64]:
    """RMSNorm: ``y = xn * w``, ``xn = x * rstd``, ``rstd = 1/sqrt(ms + eps)``,
    ``ms = mean(x^2)``, over the last axis.

    Parameters
    ----------
    x : array_like, shape (..., D)
        The input.
    weight : array_like, shape (D,), optional
        The per-channel gain w (none: 1).
    eps : float, default 1e-6
        Added to the mean square.
    {norm_args}

    Returns
    -------
    y : ndarray, shape (..., D)
        The normalised input.
    rstd : ndarray, shape (...,)
        1/sqrt(mean(x^2) + eps) of every row.

    Examples
    --------
    >>> import numpy as np
    >>> import resnorm
    >>> from resnorm import reference
    >>> y, rstd = reference.rms_norm_forward([[3.0, 4.0]], eps=0.0)
    >>> y, rstd                    # mean(x^2) = 12.5
    (array([[0.84852814, 1.13137085]]), array([0.28284271]))
    >>> bool(np.allclose(resnorm.rms_norm(np.array([[3.0, 4.0]]), eps=1e-300), y))
    True
    """
    k = _axes(x, normalized_shape)
    shape = np.shape(x)
    x, w = _flat(_f64(x), k), _flat(gain(weight, zero_centered_weight), k)
    ms = np.mean(x * x, axis=-1)                    # the one row reduction: the mean square
    rstd = 1.0 / np.sqrt(ms + eps)
    xn = x * rstd[..., None]                        # the normalised row
    y = xn if w is None else xn * w
    return y.reshape(shape), rstd


@_shared_doc
def rms_norm_backward(dy: ArrayLike, x: ArrayLike, weight: ArrayLike | None,
                      rstd: ArrayLike, *,
                      normalized_shape: int | tuple[int, ...] | None = None,
                      zero_centered_weight: bool = False) -> tuple[F64, F64 | None]:
    """The gradients of RMSNorm's ``y = x * rstd * w``.

    With ``g = dy * w`` and ``xn = x * rstd``: ``dx = rstd * (g - xn * m)``,
    ``m = mean(g * xn)``, and ``dw = sum over rows of dy * xn`` (the derivation is in
    docs/rms_norm.md).

    Parameters
    ----------
    dy : array_like, shape (..., D)
        The gradient arriving at y.
    x : array_like, shape (..., D)
        The forward input.
    weight : array_like, shape (D,), or None
        The forward weight.
    rstd : array_like, shape (...,)
        The forward's row statistic, as `rms_norm_forward` returned it.
    {norm_args}

    Returns
    -------
    dx : ndarray, shape (..., D)
        The gradient of x.
    {weight_grad}

    Examples
    --------
    >>> from resnorm import reference
    >>> x = [[3.0, 4.0]]
    >>> y, rstd = reference.rms_norm_forward(x, eps=0.0)
    >>> reference.rms_norm_backward([[1.0, 0.0]], x, None, rstd)
    (array([[ 0.18101934, -0.1357645 ]]), None)
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

@_shared_doc
def layer_norm_forward(x: ArrayLike, weight: ArrayLike | None = None,
                       bias: ArrayLike | None = None, eps: float = 1e-5, *,
                       normalized_shape: int | tuple[int, ...] | None = None,
                       zero_centered_weight: bool = False) -> tuple[F64, F64, F64]:
    """LayerNorm: ``y = (x - mean) * rstd * w + b`` over the last axis.

    ``rstd = 1/sqrt(var + eps)`` with the biased variance (divided by D), computed in two
    passes (the mean first, then the mean square of the centred values).

    Parameters
    ----------
    x : array_like, shape (..., D)
        The input.
    weight, bias : array_like, shape (D,), optional
        The per-channel gain w (none: 1) and bias b (none: 0).
    eps : float, default 1e-5
        Added to the variance.
    {norm_args}

    Returns
    -------
    y : ndarray, shape (..., D)
        The normalised input.
    mean, rstd : ndarray, shape (...,)
        The row statistics.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.layer_norm_forward([[1.0, 3.0]], eps=0.0)
    (array([[-1.,  1.]]), array([2.]), array([1.]))
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


@_shared_doc
def layer_norm_backward(dy: ArrayLike, x: ArrayLike, weight: ArrayLike | None,
                        mean: ArrayLike, rstd: ArrayLike, *,
                        normalized_shape: int | tuple[int, ...] | None = None,
                        zero_centered_weight: bool = False) -> tuple[F64, F64 | None, F64]:
    """The gradients of LayerNorm's ``y = xhat * w + b``, ``xhat = (x - mean) * rstd``.

    With ``g = dy * w``: ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``,
    ``dw = sum over rows of dy * xhat``, ``db = sum over rows of dy`` (the derivation is
    in docs/layer_norm.md).

    Parameters
    ----------
    dy : array_like, shape (..., D)
        The gradient arriving at y.
    x : array_like, shape (..., D)
        The forward input.
    weight : array_like, shape (D,), or None
        The forward weight.
    mean, rstd : array_like, shape (...,)
        The forward's row statistics, as `layer_norm_forward` returned them.
    {norm_args}

    Returns
    -------
    dx : ndarray, shape (..., D)
        The gradient of x.
    {weight_grad}
    dbias : ndarray, shape (D,)
        The gradient of the bias, always returned (drop it when there is no bias).

    Examples
    --------
    >>> from resnorm import reference
    >>> x = [[1.0, 2.0, 4.0]]
    >>> y, mean, rstd = reference.layer_norm_forward(x, eps=0.0)
    >>> dx, dw, db = reference.layer_norm_backward([[1.0, 0.0, 0.0]], x, None, mean, rstd)
    >>> dx, db                     # dx sums to 0: a shift of x does not change y
    (array([[ 0.22908106, -0.3436216 ,  0.11454053]]), array([1., 0., 0.]))
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


def philox4x32_10(counter: ArrayLike, key: tuple[int, int]) -> NDArray[np.uint32]:
    """The Philox-4x32-10 counter-based generator (Salmon et al., SC'11).

    Ten rounds of: ``(hi0, lo0) = M0*c0``, ``(hi1, lo1) = M1*c2`` (64-bit products),
    ``c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)``, then the key is bumped by
    ``(W0, W1)``.

    Parameters
    ----------
    counter : array_like of int, shape (..., 4)
        Counters, four 32-bit words each.
    key : tuple of int
        The key, two 32-bit words.

    Returns
    -------
    ndarray of uint32, shape (..., 4)
        The four output words of every counter.

    Examples
    --------
    >>> from resnorm import reference
    >>> [hex(w) for w in reference.philox4x32_10([0, 0, 0, 0], (0, 0))]   # published answer
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
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


def dropout_uniforms(seed: int, n: int, start: int = 0) -> NDArray[np.uint32]:
    """The 32-bit uniforms of flat elements start .. start+n-1 under a 64-bit seed.

    Element i takes output word ``(i % 64) // 16`` of the Philox block whose counter is
    ``16 * (i // 64) + i % 16`` (low and high 32 bits in words 0 and 1, words 2 and 3
    zero); the key is (seed's low 32 bits, seed's high 32 bits).  This is the compiled
    generator's map: a vector of 16 blocks yields 16 consecutive elements per word.

    Parameters
    ----------
    seed : int
        The 64-bit seed, in [0, 2**64).
    n : int
        How many elements.
    start : int, default 0
        The flat index of the first one.

    Returns
    -------
    ndarray of uint32, shape (n,)
        One uniform per element.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.dropout_uniforms(1234, 4)
    array([ 546353992, 2666454581, 1070188760, 3055983166], dtype=uint32)
    >>> reference.dropout_uniforms(1234, 2, start=2)     # any slice of the same stream
    array([1070188760, 3055983166], dtype=uint32)
    """
    i = np.arange(start, start + n, dtype=np.uint64)
    block = (i // np.uint64(64)) * np.uint64(16) + i % np.uint64(16)
    word = ((i % np.uint64(64)) // np.uint64(16)).astype(np.intp)
    zero = np.zeros_like(block)
    counter = np.stack([block & _LOW32, block >> _SHIFT32, zero, zero], axis=-1)
    outputs = philox4x32_10(counter, (seed & 0xFFFFFFFF, seed >> 32))
    return outputs[np.arange(n), word]


def dropout_mask(shape: tuple[int, ...], p: float, seed: int) -> NDArray[np.bool_]:
    """The keep-mask of an array of this shape, as the dropout kernels compute it.

    Element i (flat C-order index) is kept when its uniform (`dropout_uniforms`) is
    ``>= floor(p * 2**32)``, i.e. with probability 1 - p.  p = 1 keeps nothing.

    Parameters
    ----------
    shape : tuple of int
        The array's shape.
    p : float
        The drop probability, in [0, 1].
    seed : int
        The 64-bit seed.

    Returns
    -------
    ndarray of bool, shape `shape`
        True where the element is kept.

    Examples
    --------
    >>> import numpy as np
    >>> import resnorm
    >>> from resnorm import reference
    >>> keep = reference.dropout_mask((2, 4), 0.5, seed=1234)
    >>> keep
    array([[False,  True, False,  True],
           [False,  True,  True,  True]])
    >>> y, cache = resnorm.dropout_forward(np.ones((2, 4)), 0.5, seed=1234, return_mask=True)
    >>> bool(np.array_equal(cache.mask, keep))          # the kernel's mask
    True
    """
    if p == 1.0:
        return np.zeros(shape, dtype=bool)
    threshold = np.floor(p * 2.0**32)
    return (dropout_uniforms(seed, int(np.prod(shape))) >= threshold).reshape(shape)


def _keep_scale(p: float) -> float:
    """What a kept element is multiplied by: 1/(1-p) (inverted dropout); 0 when p = 1."""
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)


def dropout_forward(x: ArrayLike, p: float, seed: int,
                    training: bool = True) -> tuple[F64, NDArray[np.bool_]]:
    """Inverted dropout: ``y = x * keep / (1 - p)`` in training; ``y = x`` in eval or for p = 0.

    Parameters
    ----------
    x : array_like
        The input, any shape.
    p : float
        The drop probability, in [0, 1].
    seed : int
        The 64-bit mask seed.
    training : bool, default True
        False: the identity.

    Returns
    -------
    y : ndarray
        The output, of x's shape.
    keep : ndarray of bool
        The keep-mask (all True in eval or for p = 0).

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.dropout_forward([1.0, 1.0, 1.0, 1.0], 0.5, seed=1234)
    (array([0., 2., 0., 2.]), array([False,  True, False,  True]))
    """
    x = _f64(x)
    if not training or p == 0.0:
        return x.copy(), np.ones(x.shape, dtype=bool)
    keep = dropout_mask(x.shape, p, seed)
    return x * (keep * _keep_scale(p)), keep


def dropout_backward(dy: ArrayLike, keep: NDArray[np.bool_], p: float) -> F64:
    """The gradient of dropout, ``dx = dy * keep / (1 - p)``: it is linear, its own transpose.

    Parameters
    ----------
    dy : array_like
        The gradient arriving at y.
    keep : ndarray of bool
        The forward's keep-mask.
    p : float
        The forward's drop probability.

    Returns
    -------
    ndarray
        dx, of dy's shape.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import reference
    >>> reference.dropout_backward([1.0, 1.0], np.array([True, False]), 0.5)
    array([2., 0.])
    """
    return _f64(dy) * (keep * _keep_scale(p))


# --------------------------------------------------------------------------- fused add + norm

def sum_like(a: F64, alpha: ArrayLike) -> F64:
    """Sums a (..., D) over what alpha broadcasts along: everything for a scalar alpha, the
    rows for a (D,) alpha (for alpha of a normalised row's shape, the rows of that shape).

    Parameters
    ----------
    a : ndarray, shape (..., D)
        The terms, e.g. ``gh * dropout(x)`` for the gradient of alpha.
    alpha : float or array_like
        The residual scale whose gradient is being summed.

    Returns
    -------
    total : ndarray, shape of alpha
        The sum.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import reference
    >>> a = np.arange(6.0).reshape(3, 2)
    >>> reference.sum_like(a, 1.0), reference.sum_like(a, np.ones(2))
    (array(15.), array([6., 9.]))
    """
    if np.ndim(alpha) == 0:
        return np.asarray(a.sum())
    return a.reshape((-1,) + np.shape(alpha)).sum(axis=0)


@_shared_doc
def add_rms_norm_forward(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                         eps: float = 1e-6, alpha: ArrayLike = 1.0, p: float = 0.0,
                         seed: int = 0, training: bool = True, **norm: Any
                         ) -> tuple[F64, F64, F64, NDArray[np.bool_]]:
    """The fused Pre-Norm add + RMSNorm, step by step.

    ``d = dropout(x)``, ``h = residual + alpha * d``, ``y = rms_norm(h)``.

    Parameters
    ----------
    x : array_like, shape (..., D)
        The sublayer output added to the stream.
    residual : array_like, shape (..., D)
        The residual stream.
    weight : array_like, shape (D,), optional
        The norm's gain.
    eps : float, default 1e-6
        The norm's eps.
    {forward_args}
    {norm_kwargs}

    Returns
    -------
    y : ndarray, shape (..., D)
        The norm of h.
    h : ndarray, shape (..., D)
        The new residual stream.
    rstd : ndarray, shape (...,)
        The norm's row statistic.
    keep : ndarray of bool, shape (..., D)
        The keep-mask.

    Examples
    --------
    >>> from resnorm import reference
    >>> y, h, rstd, keep = reference.add_rms_norm_forward([[1.0, 1.0]], [[2.0, 0.0]], eps=0.0)
    >>> h, y
    (array([[3., 1.]]), array([[1.34164079, 0.4472136 ]]))
    """
    d, keep = dropout_forward(x, p, seed, training)
    h = _f64(residual) + _f64(alpha) * d
    y, rstd = rms_norm_forward(h, weight, eps, **norm)
    return y, h, rstd, keep


@_shared_doc
def add_rms_norm_backward(dy: ArrayLike, dh: ArrayLike | None, x: ArrayLike, h: ArrayLike,
                          weight: ArrayLike | None, rstd: ArrayLike, alpha: ArrayLike,
                          keep: NDArray[np.bool_], p: float, **norm: Any
                          ) -> tuple[F64, F64, F64 | None, F64]:
    """The gradients of `add_rms_norm_forward`'s two outputs (y, h).

    ``gh = dh + (RMSNorm backward of dy at h)``; ``dresidual = gh``;
    ``dx = dropout_backward(alpha * gh)``; ``dalpha = sum of gh * dropout(x)`` (over
    everything for a scalar alpha, over rows for a (D,) alpha).

    Parameters
    ----------
    dy : array_like, shape (..., D)
        The gradient arriving at y.
    dh : array_like, shape (..., D), or None
        The gradient arriving along the stream h (None: 0).
    x, h : array_like, shape (..., D)
        The forward's x and its output h.
    weight : array_like, shape (D,), or None
        The norm's gain.
    rstd : array_like, shape (...,)
        The forward's row statistic.
    {backward_args}
    {norm_kwargs}

    Returns
    -------
    dx, dresidual : ndarray, shape (..., D)
        The gradients of x and of the residual stream.
    {weight_grad}
    {alpha_grad}

    Examples
    --------
    >>> from resnorm import reference
    >>> x, res = [[1.0, 1.0]], [[2.0, 0.0]]
    >>> y, h, rstd, keep = reference.add_rms_norm_forward(x, res, eps=0.0)
    >>> dx, dres, dw, dalpha = reference.add_rms_norm_backward(
    ...     [[0.0, 0.0]], [[1.0, 1.0]], x, h, None, rstd, 1.0, keep, 0.0)
    >>> dx, dres, dalpha           # with dy = 0 only the stream's gradient flows
    (array([[1., 1.]]), array([[1., 1.]]), array(2.))
    """
    gh, dweight = rms_norm_backward(dy, h, weight, rstd, **norm)
    if dh is not None:
        gh = gh + _f64(dh)
    d = dropout_backward(x, keep, p)                 # = dropout(x): the same linear map
    dx = dropout_backward(_f64(alpha) * gh, keep, p)
    return dx, gh, dweight, sum_like(gh * d, alpha)


@_shared_doc
def add_layer_norm_forward(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                           bias: ArrayLike | None = None, eps: float = 1e-5,
                           alpha: ArrayLike = 1.0, p: float = 0.0, seed: int = 0,
                           training: bool = True, **norm: Any
                           ) -> tuple[F64, F64, F64, F64, NDArray[np.bool_]]:
    """The fused Pre-Norm add + LayerNorm, step by step.

    ``d = dropout(x)``, ``h = residual + alpha * d``, ``y = layer_norm(h)``.

    Parameters
    ----------
    x, residual : array_like, shape (..., D)
        The sublayer output and the residual stream.
    weight, bias : array_like, shape (D,), optional
        The norm's gain and bias.
    eps : float, default 1e-5
        The norm's eps.
    {forward_args}
    {norm_kwargs}

    Returns
    -------
    y, h : ndarray, shape (..., D)
        The norm of h, and h.
    mean, rstd : ndarray, shape (...,)
        The norm's row statistics.
    keep : ndarray of bool, shape (..., D)
        The keep-mask.

    Examples
    --------
    >>> from resnorm import reference
    >>> y, h, mean, rstd, keep = reference.add_layer_norm_forward([[1.0, 1.0]], [[2.0, 0.0]],
    ...                                                           eps=0.0)
    >>> h, y, mean
    (array([[3., 1.]]), array([[ 1., -1.]]), array([2.]))
    """
    d, keep = dropout_forward(x, p, seed, training)
    h = _f64(residual) + _f64(alpha) * d
    y, mean, rstd = layer_norm_forward(h, weight, bias, eps, **norm)
    return y, h, mean, rstd, keep


@_shared_doc
def add_layer_norm_backward(dy: ArrayLike, dh: ArrayLike | None, x: ArrayLike, h: ArrayLike,
                            weight: ArrayLike | None, mean: ArrayLike, rstd: ArrayLike,
                            alpha: ArrayLike, keep: NDArray[np.bool_], p: float, **norm: Any
                            ) -> tuple[F64, F64, F64 | None, F64, F64]:
    """The gradients of `add_layer_norm_forward`'s two outputs (y, h).

    As `add_rms_norm_backward`, with LayerNorm's backward (`layer_norm_backward`) at h.

    Parameters
    ----------
    dy : array_like, shape (..., D)
        The gradient arriving at y.
    dh : array_like, shape (..., D), or None
        The gradient arriving along the stream h (None: 0).
    x, h : array_like, shape (..., D)
        The forward's x and its output h.
    weight : array_like, shape (D,), or None
        The norm's gain.
    mean, rstd : array_like, shape (...,)
        The forward's row statistics.
    {backward_args}
    {norm_kwargs}

    Returns
    -------
    dx, dresidual : ndarray, shape (..., D)
        The gradients of x and of the residual stream.
    {weight_grad}
    dbias : ndarray, shape (D,)
        The gradient of the bias.
    {alpha_grad}

    Examples
    --------
    >>> from resnorm import reference
    >>> x, res = [[1.0, 1.0]], [[2.0, 0.0]]
    >>> y, h, mean, rstd, keep = reference.add_layer_norm_forward(x, res, eps=0.0)
    >>> grads = reference.add_layer_norm_backward([[1.0, 1.0]], None, x, h, None, mean,
    ...                                           rstd, 1.0, keep, 0.0)
    >>> grads[0], grads[3]         # a constant dy does not reach x through LayerNorm
    (array([[0., 0.]]), array([1., 1.]))
    """
    gh, dweight, dbias = layer_norm_backward(dy, h, weight, mean, rstd, **norm)
    if dh is not None:
        gh = gh + _f64(dh)
    d = dropout_backward(x, keep, p)
    dx = dropout_backward(_f64(alpha) * gh, keep, p)
    return dx, gh, dweight, dbias, sum_like(gh * d, alpha)


@_shared_doc
def add_rms_norm_post_forward(x: ArrayLike, residual: ArrayLike,
                              weight: ArrayLike | None = None, eps: float = 1e-6,
                              alpha: ArrayLike = 1.0, p: float = 0.0, seed: int = 0,
                              training: bool = True, **norm: Any
                              ) -> tuple[F64, F64, F64, NDArray[np.bool_]]:
    """The fused Post-Norm add + RMSNorm: ``y = rms_norm(residual + alpha * dropout(x))``.

    The Pre-Norm computation (`add_rms_norm_forward`), of which only y leaves a Post-Norm
    block.

    Parameters
    ----------
    x, residual : array_like, shape (..., D)
        The sublayer output and the block input.
    weight : array_like, shape (D,), optional
        The norm's gain.
    eps : float, default 1e-6
        The norm's eps.
    {forward_args}
    {norm_kwargs}

    Returns
    -------
    y, h : ndarray, shape (..., D)
        The output and the sum it normalises.
    rstd : ndarray, shape (...,)
        The norm's row statistic.
    keep : ndarray of bool, shape (..., D)
        The keep-mask.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.add_rms_norm_post_forward([[1.0, 1.0]], [[2.0, 0.0]], eps=0.0)[0]
    array([[1.34164079, 0.4472136 ]])
    """
    return add_rms_norm_forward(x, residual, weight, eps, alpha, p, seed, training, **norm)


@_shared_doc
def add_rms_norm_post_backward(dy: ArrayLike, x: ArrayLike, h: ArrayLike,
                               weight: ArrayLike | None, rstd: ArrayLike, alpha: ArrayLike,
                               keep: NDArray[np.bool_], p: float, **norm: Any
                               ) -> tuple[F64, F64, F64 | None, F64]:
    """The gradients of `add_rms_norm_post_forward`: the Pre-Norm backward with dh = 0.

    Parameters
    ----------
    dy : array_like, shape (..., D)
        The gradient arriving at y.
    x, h : array_like, shape (..., D)
        The forward's x and the sum h it returned.
    weight : array_like, shape (D,), or None
        The norm's gain.
    rstd : array_like, shape (...,)
        The forward's row statistic.
    {backward_args}
    {norm_kwargs}

    Returns
    -------
    dx, dresidual : ndarray, shape (..., D)
        The gradients of x and of the block input.
    {weight_grad}
    {alpha_grad}

    Examples
    --------
    >>> from resnorm import reference
    >>> x, res = [[1.0, 1.0]], [[2.0, 0.0]]
    >>> y, h, rstd, keep = reference.add_rms_norm_post_forward(x, res, eps=0.0)
    >>> dx, dres, dw, dalpha = reference.add_rms_norm_post_backward(
    ...     [[1.0, 0.0]], x, h, None, rstd, 1.0, keep, 0.0)
    >>> bool((dx == dres).all())    # alpha = 1, no dropout: both are the norm's dx
    True
    """
    return add_rms_norm_backward(dy, None, x, h, weight, rstd, alpha, keep, p, **norm)


@_shared_doc
def add_layer_norm_post_forward(x: ArrayLike, residual: ArrayLike,
                                weight: ArrayLike | None = None, bias: ArrayLike | None = None,
                                eps: float = 1e-5, alpha: ArrayLike = 1.0, p: float = 0.0,
                                seed: int = 0, training: bool = True, **norm: Any
                                ) -> tuple[F64, F64, F64, F64, NDArray[np.bool_]]:
    """The fused Post-Norm add + LayerNorm: ``y = layer_norm(residual + alpha * dropout(x))``.

    Parameters
    ----------
    x, residual : array_like, shape (..., D)
        The sublayer output and the block input.
    weight, bias : array_like, shape (D,), optional
        The norm's gain and bias.
    eps : float, default 1e-5
        The norm's eps.
    {forward_args}
    {norm_kwargs}

    Returns
    -------
    y, h : ndarray, shape (..., D)
        The output and the sum it normalises.
    mean, rstd : ndarray, shape (...,)
        The norm's row statistics.
    keep : ndarray of bool, shape (..., D)
        The keep-mask.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.add_layer_norm_post_forward([[1.0, 1.0]], [[2.0, 0.0]], eps=0.0)[0]
    array([[ 1., -1.]])
    """
    return add_layer_norm_forward(x, residual, weight, bias, eps, alpha, p, seed, training,
                                  **norm)


@_shared_doc
def add_layer_norm_post_backward(dy: ArrayLike, x: ArrayLike, h: ArrayLike,
                                 weight: ArrayLike | None, mean: ArrayLike, rstd: ArrayLike,
                                 alpha: ArrayLike, keep: NDArray[np.bool_], p: float, **norm: Any
                                 ) -> tuple[F64, F64, F64 | None, F64, F64]:
    """The gradients of `add_layer_norm_post_forward`: the Pre-Norm backward with dh = 0.

    Parameters
    ----------
    dy : array_like, shape (..., D)
        The gradient arriving at y.
    x, h : array_like, shape (..., D)
        The forward's x and the sum h it returned.
    weight : array_like, shape (D,), or None
        The norm's gain.
    mean, rstd : array_like, shape (...,)
        The forward's row statistics.
    {backward_args}
    {norm_kwargs}

    Returns
    -------
    dx, dresidual : ndarray, shape (..., D)
        The gradients of x and of the block input.
    {weight_grad}
    dbias : ndarray, shape (D,)
        The gradient of the bias.
    {alpha_grad}

    Examples
    --------
    >>> from resnorm import reference
    >>> x, res = [[1.0, 1.0]], [[2.0, 0.0]]
    >>> y, h, mean, rstd, keep = reference.add_layer_norm_post_forward(x, res, eps=0.0)
    >>> reference.add_layer_norm_post_backward([[1.0, 1.0]], x, h, None, mean, rstd, 1.0,
    ...                                        keep, 0.0)[3]
    array([1., 1.])
    """
    return add_layer_norm_backward(dy, None, x, h, weight, mean, rstd, alpha, keep, p, **norm)


# --------------------------------------------------------------------------- scaled, gated

def scaled_residual_forward(x: ArrayLike, F: ArrayLike, alpha: ArrayLike) -> F64:
    """The scaled residual connection ``h = x + alpha * F``.

    Parameters
    ----------
    x, F : array_like, shape (..., D)
        The stream and the sublayer output.
    alpha : float or array_like of shape (D,)
        The scale: one number, or one per channel.

    Returns
    -------
    ndarray, shape (..., D)
        h.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.scaled_residual_forward([1.0, 1.0], [2.0, 4.0], 0.5)
    array([2., 3.])
    """
    return _f64(x) + _f64(alpha) * _f64(F)


def scaled_residual_backward(dh: ArrayLike, F: ArrayLike, alpha: ArrayLike
                             ) -> tuple[F64, F64, F64]:
    """The gradients of ``h = x + alpha * F``.

    ``dx = dh``, ``dF = alpha * dh``, ``dalpha = sum of dh * F``.

    Parameters
    ----------
    dh : array_like, shape (..., D)
        The gradient arriving at h.
    F : array_like, shape (..., D)
        The forward's sublayer output.
    alpha : float or array_like of shape (D,)
        The forward's scale.

    Returns
    -------
    dx, dF : ndarray, shape (..., D)
        The gradients of x and F.
    dalpha : ndarray, shape () or (D,)
        The gradient of alpha, summed over everything alpha broadcasts along.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.scaled_residual_backward([1.0, 1.0], [2.0, 4.0], 0.5)
    (array([1., 1.]), array([0.5, 0.5]), array(6.))
    """
    dh = _f64(dh)
    return dh.copy(), _f64(alpha) * dh, sum_like(dh * _f64(F), alpha)


def sigmoid(g: ArrayLike) -> F64:
    """The logistic function ``1 / (1 + exp(-g))``, written with ``exp(-|g|)``: it never
    overflows.

    Parameters
    ----------
    g : array_like
        Logits.

    Returns
    -------
    ndarray
        sigmoid(g), of g's shape.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.sigmoid([-800.0, 0.0, 800.0])
    array([0. , 0.5, 1. ])
    """
    g = _f64(g)
    e = np.exp(-np.abs(g))
    return np.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def sigmoid_grad(g: ArrayLike) -> F64:
    """The derivative of the sigmoid, ``s * (1 - s)`` with ``s = sigmoid(g)``.

    Written as ``e / (1 + e)^2`` with ``e = exp(-|g|)``: it keeps its precision where s
    rounds to 1 (``1 - s`` would be 0 for g > 37).

    Parameters
    ----------
    g : array_like
        Logits.

    Returns
    -------
    ndarray
        The derivative at g, of g's shape.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.sigmoid_grad([0.0, 40.0])
    array([2.50000000e-01, 4.24835426e-18])
    """
    e = np.exp(-np.abs(_f64(g)))
    return e / (1.0 + e) ** 2


def gated_residual_forward(x: ArrayLike, F: ArrayLike, g: ArrayLike) -> F64:
    """The gated residual connection ``h = x + sigmoid(g) * F``.

    Parameters
    ----------
    x, F : array_like, shape (..., D)
        The stream and the sublayer output.
    g : array_like, shape (..., D) or (D,)
        Gate logits: one per element, or one per channel.

    Returns
    -------
    ndarray, shape (..., D)
        h.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.gated_residual_forward([1.0, 1.0], [2.0, 2.0], [0.0, 100.0])
    array([2., 3.])
    """
    return _f64(x) + sigmoid(g) * _f64(F)


def gated_residual_backward(dh: ArrayLike, F: ArrayLike, g: ArrayLike
                            ) -> tuple[F64, F64, F64]:
    """The gradients of ``h = x + sigmoid(g) * F``.

    ``dx = dh``, ``dF = s * dh``, ``dg = dh * F * s * (1 - s)`` with ``s = sigmoid(g)``,
    summed over rows when g is per channel.

    Parameters
    ----------
    dh : array_like, shape (..., D)
        The gradient arriving at h.
    F : array_like, shape (..., D)
        The forward's sublayer output.
    g : array_like, shape (..., D) or (D,)
        The forward's gate logits.

    Returns
    -------
    dx, dF : ndarray, shape (..., D)
        The gradients of x and F.
    dg : ndarray, of g's shape
        The gradient of g.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.gated_residual_backward([[1.0, 1.0]], [[2.0, 2.0]], [0.0, 0.0])
    (array([[1., 1.]]), array([[0.5, 0.5]]), array([0.5, 0.5]))
    """
    dh, F, s = _f64(dh), _f64(F), sigmoid(g)
    dg = dh * F * sigmoid_grad(g)
    if np.shape(g) != dh.shape:
        dg = dg.reshape(-1, dg.shape[-1]).sum(axis=0)
    return dh.copy(), s * dh, dg


# --------------------------------------------------------------------------- gated RMSNorm

def silu(z: ArrayLike) -> F64:
    """The SiLU (swish) activation ``z * sigmoid(z)``.

    Parameters
    ----------
    z : array_like
        Gate logits.

    Returns
    -------
    ndarray
        silu(z), of z's shape.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.silu([-1.0, 0.0, 1.0, 40.0])    # silu(z) -> z for large z, -> 0 below
    array([-0.26894142,  0.        ,  0.73105858, 40.        ])
    """
    z = _f64(z)
    return z * sigmoid(z)


def silu_grad(z: ArrayLike) -> F64:
    """The derivative of the SiLU, ``s + z * s * (1 - s)`` with ``s = sigmoid(z)``.

    ``s * (1 - s)`` is `sigmoid_grad`, which keeps its precision where s rounds to 1.

    Parameters
    ----------
    z : array_like
        Gate logits.

    Returns
    -------
    ndarray
        The derivative at z, of z's shape.

    Examples
    --------
    >>> from resnorm import reference
    >>> reference.silu_grad([0.0, 1.0, 40.0])
    array([0.5       , 0.92767051, 1.        ])
    """
    z = _f64(z)
    return sigmoid(z) + z * sigmoid_grad(z)


def _grouped(a: F64, group_size: int) -> F64:
    """a (..., D) seen as (..., G, group_size): each group of a row on its own axis."""
    return a.reshape(a.shape[:-1] + (a.shape[-1] // group_size, group_size))


def gated_rms_norm_forward(x: ArrayLike, gate: ArrayLike | None = None,
                           weight: ArrayLike | None = None, eps: float = 1e-6,
                           group_size: int | None = None, norm_before_gate: bool = False
                           ) -> tuple[F64, dict[str, Any]]:
    """The gated RMSNorm of hybrid Mamba models, per group of ``group_size`` channels.

    The last axis is split into ``G = D / group_size`` groups of consecutive elements,
    each normalised on its own with its slice of the weight.  With ``a = silu(gate)``
    (``silu(z) = z * sigmoid(z)``; a = 1 without a gate):

    * gate before the norm (norm_before_gate False: Mamba2, Bamba, Zamba2): ``u = x * a``,
      ``rstd = 1/sqrt(mean(u^2) + eps)`` per group, ``y = un * w`` with ``un = u * rstd``;
    * norm before the gate (True: Qwen3-Next): ``rstd`` per group of x,
      ``xn = x * rstd``, ``y = xn * w * a``.

    Parameters
    ----------
    x : array_like, shape (..., D)
        The input.
    gate : array_like, shape (..., D), optional
        The gate logits z (none: no gate).
    weight : array_like, shape (D,), optional
        The per-channel gain w (none: 1).
    eps : float, default 1e-6
        Added to each group's mean square.
    group_size : int, optional
        The elements of a group; a divisor of D (default D: one group per row).
    norm_before_gate : bool, default False
        Whether the gate multiplies the normalised rows (True) or the input (False).

    Returns
    -------
    y : ndarray, shape (..., D)
        The output.
    cache : dict
        What `gated_rms_norm_backward` reads, named as the fields of
        resnorm.GatedRMSNormCache: x, gate, weight (float64, or None), rstd (shape
        (..., G)), group_size and norm_before_gate.

    Examples
    --------
    >>> import numpy as np
    >>> import resnorm
    >>> from resnorm import reference
    >>> x, z = np.array([[3.0, 4.0, 1.0, 1.0]]), np.array([[0.0, 1.0, 2.0, -1.0]])
    >>> y, cache = reference.gated_rms_norm_forward(x, z, group_size=2, eps=0.0)
    >>> y                          # the first group is u = (0, 2.92): y = (0, sqrt 2)
    array([[ 0.        ,  1.41421356,  1.39801499, -0.21343403]])
    >>> cache["rstd"]              # one per group
    array([[0.48361841, 0.79360787]])
    >>> bool(np.allclose(resnorm.gated_rms_norm(x, z, group_size=2, eps=1e-300), y))
    True
    """
    x, z, w = _f64(x), _f64(gate), _f64(weight)
    d = x.shape[-1]
    gs = d if group_size is None else int(group_size)
    a = None if z is None else silu(z)              # the gate's factor
    u = x if a is None or norm_before_gate else x * a   # the rows the statistics are of
    ug = _grouped(u, gs)
    ms = np.mean(ug * ug, axis=-1)                  # one reduction per group: the mean square
    rstd = 1.0 / np.sqrt(ms + eps)                  # (..., G)
    un = (ug * rstd[..., None]).reshape(x.shape)    # each group normalised
    y = un if w is None else un * w
    if a is not None and norm_before_gate:
        y = y * a
    cache = {"x": x, "gate": z, "weight": w, "rstd": rstd, "group_size": gs,
             "norm_before_gate": bool(norm_before_gate)}
    return y, cache


@_shared_doc
def gated_rms_norm_backward(dy: ArrayLike, cache: dict[str, Any]
                            ) -> tuple[F64, F64 | None, F64 | None]:
    """The gradients of `gated_rms_norm_forward`.

    Per group, with ``a = silu(z)``, ``da_dz = silu_grad(z)`` (``s + z * s * (1 - s)``)
    and ``g`` the gradient reaching the normalised rows times w:

    * gate before the norm: ``g = dy * w``, ``un = u * rstd``,
      ``du = rstd * (g - un * mean(g * un))``; ``dx = du * a``,
      ``dgate = du * x * da_dz``, ``dw = sum over rows of dy * un``;
    * norm before the gate: ``xn = x * rstd``, ``dgate = dy * xn * w * da_dz``; the
      gradient reaching the norm's output is ``dyn = dy * a``, then RMSNorm's backward:
      ``g = dyn * w``, ``dx = rstd * (g - xn * mean(g * xn))``,
      ``dw = sum over rows of dyn * xn``.

    Parameters
    ----------
    dy : array_like, shape (..., D)
        The gradient arriving at y.
    cache : dict
        What `gated_rms_norm_forward` returned beside y.

    Returns
    -------
    dx : ndarray, shape (..., D)
        The gradient of x.
    dgate : ndarray, shape (..., D), or None
        The gradient of the gate logits; None without a gate.
    {weight_grad}

    Examples
    --------
    >>> from resnorm import reference
    >>> x, z = [[3.0, 4.0]], [[0.0, 1.0]]
    >>> y, cache = reference.gated_rms_norm_forward(x, z, eps=0.0)
    >>> dx, dgate, dw = reference.gated_rms_norm_backward([[1.0, 0.0]], cache)
    >>> dx, dgate                  # silu(0) = 0: x0 does not reach y, its gate does
    (array([[0., 0.]]), array([[0.72542762, 0.        ]]))
    """
    x, z, w, rstd = cache["x"], cache["gate"], cache["weight"], cache["rstd"]
    gs, before = cache["group_size"], cache["norm_before_gate"]
    dy = _f64(dy)
    d = x.shape[-1]
    r = rstd[..., None]                             # (..., G, 1): each group's rstd
    a = None if z is None else silu(z)
    da_dz = None if z is None else silu_grad(z)
    if a is not None and before:
        xn = (_grouped(x, gs) * r).reshape(x.shape)
        dgate = dy * (xn if w is None else xn * w) * da_dz   # y = (xn * w) * a
        dyn = dy * a                                # the gradient reaching xn * w
        v = x                                       # the rows normalised
    else:
        dgate, dyn = None, dy
        v = x if a is None else x * a               # u
    vn = _grouped(v, gs) * r                        # un (or xn), grouped
    g = _grouped(dyn if w is None else dyn * w, gs)
    m = np.mean(g * vn, axis=-1, keepdims=True)     # one reduction per group
    dv = (r * (g - vn * m)).reshape(x.shape)        # the gradient reaching u (or x)
    if a is not None and not before:
        dx = dv * a                                 # u = x * a
        dgate = dv * x * da_dz
    else:
        dx = dv
    dw = None if w is None else (dyn * vn.reshape(x.shape)).reshape(-1, d).sum(axis=0)
    return dx, dgate, dw
