"""RMSNorm and LayerNorm over the last axis.

Two forms of each norm:

* inference: ``y = rms_norm(x, weight, eps)`` returns only the output;
* training:  ``y, cache = rms_norm_forward(x, weight, eps)`` also returns what backward
  needs, and ``dx, dweight = rms_norm_backward(dy, cache)`` consumes it.

The cache holds the input rows (a reference, not a copy, when the input was already
C-contiguous: do not modify x between forward and backward) and the row statistics in
float64 (RMSNorm: rstd; LayerNorm: mean and rstd).  Everything else is recomputed.

Inputs of any rank (..., D) are normalised over the last axis, or with
``normalized_shape`` (as in torch) over several trailing axes together: for x of shape
(..., 5, 64) and ``normalized_shape=(5, 64)`` each row is those 320 elements, and weight
and bias have shape (5, 64).  ``zero_centered_weight=True`` applies ``1 + weight``
instead of ``weight`` (Gemma's RMSNorm: a weight initialised at 0 is the identity gain).
Non-contiguous (or misaligned) inputs are copied once into a contiguous buffer; contiguous
inputs are read in place.  Inputs are never modified, unless ``out`` is the input itself.

Each function here declares a compiled function of resnorm._api (``@compiled``: the same
signature, checked at import), which checks the arguments (docs/input-checks.md), picks
threads and output buffers, and runs the kernel; a call reaches it with no Python in between.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._compiled import compiled
from ._api import LayerNormCache, RMSNormCache

__all__ = ["LayerNormCache", "RMSNormCache", "layer_norm", "layer_norm_backward",
           "layer_norm_forward", "rms_norm", "rms_norm_backward", "rms_norm_forward"]


# --------------------------------------------------------------------------- RMSNorm

@compiled
def rms_norm_forward(x: ArrayLike, weight: ArrayLike | None = None, eps: float = 1e-6, *,
                     normalized_shape: int | tuple[int, ...] | None = None,
                     zero_centered_weight: bool = False,
                     out: NDArray[np.floating] | None = None,
                     n_threads: int | None = None) -> tuple[NDArray[np.floating], RMSNormCache]:
    """RMSNorm over the last axis, keeping what backward needs.

    ``y = x * rstd * w``, ``rstd = 1 / sqrt(mean(x**2) + eps)`` per row.

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16, shape (..., D)
        The rows to normalise (any rank; the last axis is normalised).
    weight : ndarray, shape (D,), optional
        The per-channel gain ``w``, of x's dtype; None means 1.  For float16 or bfloat16
        x it may be float32 (mixed precision): y is then the float32 norm of the widened
        rows rounded once to x's dtype, and dweight is float32.
    eps : float, default 1e-6
        Added to the mean square; finite and at least the dtype's smallest normal number.
    normalized_shape : int or tuple of int, optional
        The normalised trailing axes of x, as in torch (e.g. ``(5, 64)`` for x of shape
        (..., 5, 64)); None: the last axis.  weight (and bias) then have this shape.
    zero_centered_weight : bool, default False
        Apply ``1 + weight`` (rounded once in x's dtype) instead of ``weight``: the weight
        is then a deviation from the identity gain, initialised at 0 (Gemma's RMSNorm).
    out : ndarray, optional
        Buffer for y (x's shape and dtype); it must share no memory with x or weight.
    n_threads : int, optional
        Threads of the kernel; None uses the OpenMP default (inputs under 16384 elements
        run on one thread).

    Returns
    -------
    y : ndarray
        The normalised rows, x's shape and dtype (``out`` when given).
    cache : RMSNormCache
        What :func:`rms_norm_backward` needs: x's rows (by reference), rstd (float64, one
        per row) and the gain applied.

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument (every check: docs/input-checks.md).

    See Also
    --------
    rms_norm : the inference form.  resnorm.reference.rms_norm_forward : the NumPy twin.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, cache = resnorm.rms_norm_forward(np.array([[3.0, 4.0]]), eps=1e-12)
    >>> y.round(4), cache.rstd.round(4)
    (array([[0.8485, 1.1314]]), array([0.2828]))
    """


@compiled
def rms_norm(x: ArrayLike, weight: ArrayLike | None = None, eps: float = 1e-6, *,
             normalized_shape: int | tuple[int, ...] | None = None,
             zero_centered_weight: bool = False,
             out: NDArray[np.floating] | None = None,
             n_threads: int | None = None) -> NDArray[np.floating]:
    """RMSNorm over the last axis: ``y = x * rstd * w``, ``rstd = 1/sqrt(mean(x**2) + eps)``.

    The inference form of :func:`rms_norm_forward` (same arguments; no cache), and
    ``out=x`` normalises in place.

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16, shape (..., D)
    weight : ndarray, shape (D,) (or normalized_shape), optional
    eps : float, default 1e-6
    normalized_shape : int or tuple of int, optional
    zero_centered_weight : bool, default False
        As in :func:`rms_norm_forward`.
    out : ndarray, optional
        Buffer for y; it may be x itself.
    n_threads : int, optional

    Returns
    -------
    y : ndarray
        x's shape and dtype (``out`` when given).

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> x = np.array([[1.0, -1.0, 1.0, -1.0]], np.float32)
    >>> resnorm.rms_norm(x, eps=1e-6)
    array([[ 0.9999995, -0.9999995,  0.9999995, -0.9999995]], dtype=float32)

    A zero-centred weight (Gemma) applies 1 + w:

    >>> resnorm.rms_norm(x, np.full(4, 0.5, np.float32), zero_centered_weight=True)
    array([[ 1.4999993, -1.4999993,  1.4999993, -1.4999993]], dtype=float32)
    """


@compiled
def rms_norm_backward(dy: ArrayLike, cache: RMSNormCache, *,
                      out: NDArray[np.floating] | None = None,
                      n_threads: int | None = None
                      ) -> tuple[NDArray[np.floating], NDArray[np.floating] | None]:
    """Gradients of :func:`rms_norm_forward`.

    With ``g = dy * w`` and ``xn = x * rstd``: ``dx = rstd * (g - xn * m)``,
    ``m = mean(g * xn)`` per row, and ``dweight = sum over rows of dy * xn``.

    Parameters
    ----------
    dy : ndarray
        Gradient of y: the forward input's shape and dtype.
    cache : RMSNormCache
        From :func:`rms_norm_forward`.
    out : ndarray, optional
        Buffer for dx; it may be dy itself, never an array the cache holds.
    n_threads : int, optional

    Returns
    -------
    dx : ndarray
    dweight : ndarray or None
        Of the weight's shape; None when forward had no weight.  For a zero-centred weight
        this is the gradient of the weight itself (the same sums: 1 + w has w's gradient).

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`rms_norm_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, cache = resnorm.rms_norm_forward(np.array([[3.0, 4.0]]), np.ones(2))
    >>> dx, dw = resnorm.rms_norm_backward(np.ones((1, 2)), cache)
    >>> dx.round(4), dw.round(4)
    (array([[ 0.0453, -0.0339]]), array([0.8485, 1.1314]))

    With ``normalized_shape``, dweight has the weight's shape:

    >>> y, cache = resnorm.rms_norm_forward(np.ones((2, 2, 3)), np.zeros((2, 3)),
    ...                                     normalized_shape=(2, 3), zero_centered_weight=True)
    >>> resnorm.rms_norm_backward(np.ones((2, 2, 3)), cache)[1].shape
    (2, 3)
    """


# --------------------------------------------------------------------------- LayerNorm

@compiled
def layer_norm_forward(x: ArrayLike, weight: ArrayLike | None = None,
                       bias: ArrayLike | None = None, eps: float = 1e-5, *,
                       normalized_shape: int | tuple[int, ...] | None = None,
                       zero_centered_weight: bool = False,
                       out: NDArray[np.floating] | None = None,
                       n_threads: int | None = None
                       ) -> tuple[NDArray[np.floating], LayerNormCache]:
    """LayerNorm over the last axis, keeping what backward needs.

    ``y = (x - mean) * rstd * w + b``, ``rstd = 1 / sqrt(var + eps)`` per row, with the
    biased variance (divide by D) summed in one pass about a shift near the row's mean
    (float32 lanes added into double for float32 and 16-bit rows, double for float64;
    two-pass in double for rows whose first 32 elements are unlike the rest, or whose
    float32 squares would overflow or underflow).

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16, shape (..., D)
    weight, bias : ndarray, shape (D,) (or normalized_shape), optional
        Of x's dtype, each None independently (w = 1, b = 0).  For float16 or bfloat16 x
        both may be float32 (mixed precision), as for :func:`rms_norm_forward`'s weight.
    eps : float, default 1e-5
    normalized_shape : int or tuple of int, optional
    zero_centered_weight : bool, default False
        As in :func:`rms_norm_forward`: the normalised trailing axes (weight and bias have
        their shape), and the gain ``1 + weight``.
    out : ndarray, optional
        Buffer for y; it must share no memory with x, weight or bias.
    n_threads : int, optional

    Returns
    -------
    y : ndarray
    cache : LayerNormCache
        x's rows (by reference), mean and rstd (float64).

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    See Also
    --------
    layer_norm : the inference form.  resnorm.reference.layer_norm_forward : the NumPy twin.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, cache = resnorm.layer_norm_forward(np.array([[1.0, 2.0, 3.0]]), eps=1e-12)
    >>> y.round(4), cache.mean, cache.rstd.round(4)
    (array([[-1.2247,  0.    ,  1.2247]]), array([2.]), array([1.2247]))
    """


@compiled
def layer_norm(x: ArrayLike, weight: ArrayLike | None = None, bias: ArrayLike | None = None,
               eps: float = 1e-5, *,
               normalized_shape: int | tuple[int, ...] | None = None,
               zero_centered_weight: bool = False,
               out: NDArray[np.floating] | None = None,
               n_threads: int | None = None) -> NDArray[np.floating]:
    """LayerNorm over the last axis: ``y = (x - mean) * rstd * w + b``.

    The inference form of :func:`layer_norm_forward` (same arguments; no cache), and
    ``out=x`` normalises in place.

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16, shape (..., D)
    weight, bias : ndarray, shape (D,) (or normalized_shape), optional
    eps : float, default 1e-5
    normalized_shape : int or tuple of int, optional
    zero_centered_weight : bool, default False
        As in :func:`layer_norm_forward`.
    out : ndarray, optional
        Buffer for y; it may be x itself.
    n_threads : int, optional

    Returns
    -------
    y : ndarray

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> resnorm.layer_norm(np.array([[1.0, 2.0, 3.0]]), bias=np.full(3, 10.0)).round(4)
    array([[ 8.7753, 10.    , 11.2247]])

    Over the last two axes together, as torch's ``normalized_shape=(2, 3)``:

    >>> x = np.arange(12.0).reshape(2, 2, 3)
    >>> resnorm.layer_norm(x, normalized_shape=(2, 3))[0].round(4)
    array([[-1.4638, -0.8783, -0.2928],
           [ 0.2928,  0.8783,  1.4638]])
    """


@compiled
def layer_norm_backward(dy: ArrayLike, cache: LayerNormCache, *,
                        out: NDArray[np.floating] | None = None,
                        n_threads: int | None = None
                        ) -> tuple[NDArray[np.floating], NDArray[np.floating] | None,
                                   NDArray[np.floating] | None]:
    """Gradients of :func:`layer_norm_forward`.

    With ``g = dy * w`` and ``xhat = (x - mean) * rstd``:
    ``dx = rstd * (g - mean_g - xhat * mean_gxhat)``, ``mean_g = mean(g)``,
    ``mean_gxhat = mean(g * xhat)`` per row; ``dweight = sum over rows of dy * xhat``;
    ``dbias = sum over rows of dy``.

    Parameters
    ----------
    dy : ndarray
        Gradient of y: the forward input's shape and dtype.
    cache : LayerNormCache
        From :func:`layer_norm_forward`.
    out : ndarray, optional
        Buffer for dx; it may be dy itself, never an array the cache holds.
    n_threads : int, optional

    Returns
    -------
    dx : ndarray
    dweight, dbias : ndarray or None
        Of the parameters' shape; None when forward had no weight / no bias.

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`layer_norm_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, cache = resnorm.layer_norm_forward(np.array([[1.0, 2.0, 3.0]]), bias=np.zeros(3))
    >>> dx, dw, db = resnorm.layer_norm_backward(np.array([[1.0, 0.0, 0.0]]), cache)
    >>> dx.round(4), dw, db
    (array([[ 0.2041, -0.4082,  0.2041]]), None, array([1., 0., 0.]))
    """
