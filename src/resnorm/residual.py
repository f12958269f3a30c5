"""Residual connections: fused add + norm (Pre-Norm and Post-Norm), scaled and gated
residuals.

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

Each function here declares a compiled function of resnorm._api, as in resnorm.norms.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._compiled import compiled
from ._api import AddNormCache, GatedResidualCache, ResidualScale, ScaledResidualCache

__all__ = ["AddNormCache", "GatedResidualCache", "ResidualScale", "ScaledResidualCache",
           "add_layer_norm", "add_layer_norm_backward", "add_layer_norm_forward",
           "add_layer_norm_post", "add_layer_norm_post_backward", "add_layer_norm_post_forward",
           "add_rms_norm", "add_rms_norm_backward", "add_rms_norm_forward", "add_rms_norm_post",
           "add_rms_norm_post_backward", "add_rms_norm_post_forward", "gated_residual",
           "gated_residual_backward", "gated_residual_forward", "scaled_residual",
           "scaled_residual_backward", "scaled_residual_forward"]

# --------------------------------------------------------------------------- Pre-Norm

@compiled
def add_rms_norm_forward(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                         eps: float = 1e-6, *,
                         normalized_shape: int | tuple[int, ...] | None = None,
                         zero_centered_weight: bool = False,
                         alpha: float | ArrayLike = 1.0, p: float = 0.0,
                         seed: int | None = None, training: bool = True,
                         out: NDArray[np.floating] | None = None,
                         residual_out: NDArray[np.floating] | None = None,
                         n_threads: int | None = None
                         ) -> tuple[tuple[NDArray[np.floating], NDArray[np.floating]],
                                    AddNormCache]:
    """Pre-Norm add + RMSNorm in one pass, keeping what backward needs.

    ``h = residual + alpha * dropout(x, p, seed)``, ``y = h * rstd * w``,
    ``rstd = 1 / sqrt(mean(h**2) + eps)`` over the last axis.

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16, shape (..., D)
        The sublayer's output (the branch).
    residual : ndarray
        The residual stream, x's shape and dtype.
    weight : ndarray, shape (D,), optional
        The norm's gain, of x's dtype (None: 1); float32 beside float16 or bfloat16 x
        (mixed precision): h rounded to x's dtype, then the float32 norm of it rounded
        once, dweight float32 (docs/half_precision.md).
    eps : float, default 1e-6
    normalized_shape : int or tuple of int, optional
        The normalised trailing axes, as in torch (e.g. ``(5, 64)`` for x of shape
        (..., 5, 64)): each row of h is then their elements together, and weight (bias,
        a per-channel alpha) have this shape.  None: the last axis.
    zero_centered_weight : bool, default False
        Apply ``1 + weight`` (rounded once in x's dtype) instead of ``weight`` (Gemma's
        RMSNorm); dweight is still the gradient of weight.
    alpha : float or ndarray, default 1.0
        A real number (fixed), a 0-d array (learnable scalar) or a (D,) array (learnable per
        channel, LayerScale); arrays of x's dtype.
    p : float, default 0.0
        Dropout probability of x, in [0, 1] (off when training is False).
    seed : int, optional
        Dropout seed in [0, 2**64): the mask is a function of (seed, element index).
        Required when p > 0 in training (a fixed seed drops the same elements on every
        call: pass a fresh one per step and layer).
    training : bool, default True
    out, residual_out : ndarray, optional
        Buffers for y and h; ``residual_out=residual`` updates the stream in place.
    n_threads : int, optional
        None uses the OpenMP default.

    Returns
    -------
    (y, h) : tuple of ndarray
        The next sublayer's input and the new residual stream.
    cache : AddNormCache
        Keeps h by reference: do not overwrite it (e.g. as the next call's residual_out)
        before backward.

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument (docs/input-checks.md).

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> (y, h), cache = resnorm.add_rms_norm_forward(np.array([[1.0, 2.0]]), np.array([[2.0, 2.0]]))
    >>> h, y.round(4)
    (array([[3., 4.]]), array([[0.8485, 1.1314]]))
    """


@compiled
def add_rms_norm(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                 eps: float = 1e-6, *,
                 normalized_shape: int | tuple[int, ...] | None = None,
                 zero_centered_weight: bool = False,
                 alpha: float | ArrayLike = 1.0, p: float = 0.0,
                 seed: int | None = None, training: bool = True, out: NDArray[np.floating] | None = None,
                 residual_out: NDArray[np.floating] | None = None,
                 n_threads: int | None = None
                 ) -> tuple[NDArray[np.floating], NDArray[np.floating]]:
    """Pre-Norm add + RMSNorm: ``h = residual + alpha * dropout(x)``, ``y = rms_norm(h)``.

    The inference form of :func:`add_rms_norm_forward` (same arguments, no cache).  One pass
    over memory: reads x and residual, writes h and y.  ``out=x`` and
    ``residual_out=residual`` work in place.

    Parameters
    ----------
    x, residual : ndarray
        Branch and residual stream, the same shape (..., D) and dtype.
    weight : ndarray, shape (D,), optional
    eps : float, default 1e-6
    normalized_shape, zero_centered_weight, alpha, p, seed, training
        As in :func:`add_rms_norm_forward`.
    out, residual_out : ndarray, optional
    n_threads : int, optional

    Returns
    -------
    y, h : ndarray

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, h = resnorm.add_rms_norm(np.array([[1.0, 2.0]]), np.array([[2.0, 2.0]]))
    >>> h
    array([[3., 4.]])
    """


@compiled
def add_rms_norm_backward(dy: ArrayLike, dh: ArrayLike | None, cache: AddNormCache, *,
                          out: NDArray[np.floating] | None = None,
                          dresidual_out: NDArray[np.floating] | None = None,
                          n_threads: int | None = None
                          ) -> tuple[NDArray[np.floating], NDArray[np.floating],
                                     NDArray[np.floating] | None, NDArray[np.floating] | None]:
    """Gradients of :func:`add_rms_norm_forward`.

    ``gh = dh + rstd * (g - hn * mean(g * hn))`` (g = dy*w, hn = h*rstd) is the gradient
    reaching h; ``dresidual = gh``, ``dx = gh * alpha * keep / (1 - p)``,
    ``dweight = sum over rows of dy * hn``, ``dalpha = sum of gh * dropout(x)`` (over rows,
    and over channels for a scalar alpha).

    Parameters
    ----------
    dy : ndarray
        Gradient of y.
    dh : ndarray or None
        Gradient arriving along the residual stream (None: zero).
    cache : AddNormCache
        From :func:`add_rms_norm_forward`.
    out, dresidual_out : ndarray, optional
        Buffers for dx and dresidual (each may be dy or dh itself; never an array the cache
        holds).
    n_threads : int, optional

    Returns
    -------
    dx, dresidual : ndarray
    dweight : ndarray or None
        Of the weight's shape; None without weight.
    dalpha : ndarray or None
        None for a fixed alpha, else of alpha's shape.

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`add_rms_norm_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> _, cache = resnorm.add_rms_norm_forward(np.array([[1.0, 2.0]]), np.array([[2.0, 2.0]]))
    >>> dx, dres, dw, dalpha = resnorm.add_rms_norm_backward(np.ones((1, 2)), None, cache)
    >>> np.array_equal(dx, dres), dw, dalpha
    (True, None, None)
    """


@compiled
def add_layer_norm_forward(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                           bias: ArrayLike | None = None, eps: float = 1e-5, *,
                           normalized_shape: int | tuple[int, ...] | None = None,
                           zero_centered_weight: bool = False,
                           alpha: float | ArrayLike = 1.0, p: float = 0.0, seed: int | None = None,
                           training: bool = True, out: NDArray[np.floating] | None = None,
                           residual_out: NDArray[np.floating] | None = None,
                           n_threads: int | None = None
                           ) -> tuple[tuple[NDArray[np.floating], NDArray[np.floating]],
                                      AddNormCache]:
    """Pre-Norm add + LayerNorm in one pass, keeping what backward needs.

    ``h = residual + alpha * dropout(x)``, ``y = (h - mean) * rstd * w + b``,
    ``rstd = 1 / sqrt(var(h) + eps)`` over the last axis.

    Parameters
    ----------
    x, residual : ndarray
        Branch and residual stream, the same shape (..., D) and dtype.
    weight, bias : ndarray, shape (D,), optional
    eps : float, default 1e-5
    normalized_shape, zero_centered_weight, alpha, p, seed, training, out, residual_out, n_threads
        As in :func:`add_rms_norm_forward`.

    Returns
    -------
    (y, h) : tuple of ndarray
    cache : AddNormCache

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> (y, h), cache = resnorm.add_layer_norm_forward(np.array([[1.0, 2.0, 3.0]]), np.zeros((1, 3)))
    >>> y.round(4)
    array([[-1.2247,  0.    ,  1.2247]])
    """


@compiled
def add_layer_norm(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                   bias: ArrayLike | None = None, eps: float = 1e-5, *,
                   normalized_shape: int | tuple[int, ...] | None = None,
                   zero_centered_weight: bool = False,
                   alpha: float | ArrayLike = 1.0, p: float = 0.0, seed: int | None = None,
                   training: bool = True, out: NDArray[np.floating] | None = None,
                   residual_out: NDArray[np.floating] | None = None,
                   n_threads: int | None = None
                   ) -> tuple[NDArray[np.floating], NDArray[np.floating]]:
    """Pre-Norm add + LayerNorm: ``h = residual + alpha * dropout(x)``, ``y = layer_norm(h)``.

    The inference form of :func:`add_layer_norm_forward` (same arguments, no cache).

    Parameters
    ----------
    x, residual : ndarray
    weight, bias : ndarray, shape (D,), optional
    eps : float, default 1e-5
    normalized_shape, zero_centered_weight, alpha, p, seed, training, out, residual_out, n_threads
        As in :func:`add_rms_norm_forward`.

    Returns
    -------
    y, h : ndarray

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, h = resnorm.add_layer_norm(np.array([[1.0, 2.0, 3.0]]), np.ones((1, 3)))
    >>> h
    array([[2., 3., 4.]])
    """


@compiled
def add_layer_norm_backward(dy: ArrayLike, dh: ArrayLike | None, cache: AddNormCache, *,
                            out: NDArray[np.floating] | None = None,
                            dresidual_out: NDArray[np.floating] | None = None,
                            n_threads: int | None = None
                            ) -> tuple[NDArray[np.floating], NDArray[np.floating],
                                       NDArray[np.floating] | None, NDArray[np.floating] | None,
                                       NDArray[np.floating] | None]:
    """Gradients of :func:`add_layer_norm_forward`.

    ``gh = dh + rstd * (g - mean_g - hhat * mean_ghhat)`` (g = dy*w,
    hhat = (h - mean)*rstd, mean_g = mean(g), mean_ghhat = mean(g*hhat)); ``dresidual = gh``,
    ``dx = gh * alpha * keep / (1 - p)``, ``dweight = sum over rows of dy * hhat``,
    ``dbias = sum over rows of dy``, ``dalpha = sum of gh * dropout(x)``.

    Parameters
    ----------
    dy : ndarray
    dh : ndarray or None
    cache : AddNormCache
        From :func:`add_layer_norm_forward`.
    out, dresidual_out : ndarray, optional
    n_threads : int, optional

    Returns
    -------
    dx, dresidual : ndarray
    dweight, dbias, dalpha : ndarray or None
        None for an absent weight / bias or a fixed alpha.

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`add_layer_norm_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> _, cache = resnorm.add_layer_norm_forward(np.array([[1.0, 2.0, 3.0]]), np.zeros((1, 3)),
    ...                                           bias=np.zeros(3))
    >>> dx, dres, dw, db, dalpha = resnorm.add_layer_norm_backward(np.ones((1, 3)), None, cache)
    >>> db
    array([1., 1., 1.])
    """


# --------------------------------------------------------------------------- Post-Norm

@compiled
def add_rms_norm_post_forward(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                              eps: float = 1e-6, *,
                              normalized_shape: int | tuple[int, ...] | None = None,
                              zero_centered_weight: bool = False,
                              alpha: float | ArrayLike = 1.0, p: float = 0.0,
                              seed: int | None = None, training: bool = True,
                              out: NDArray[np.floating] | None = None,
                              n_threads: int | None = None
                              ) -> tuple[NDArray[np.floating], AddNormCache]:
    """Post-Norm: ``y = rms_norm(residual + alpha * dropout(x))``, keeping what backward needs.

    The sum h is not written (forward moves three streams: x, residual, y); backward
    recomputes it row by row from the cached x and residual (by reference: do not modify
    them before backward; out must not be either of them).

    Parameters
    ----------
    x, residual : ndarray
        Branch and residual stream, the same shape (..., D) and dtype.
    weight : ndarray, shape (D,), optional
    eps : float, default 1e-6
    normalized_shape, zero_centered_weight, alpha, p, seed, training, n_threads
        As in :func:`add_rms_norm_forward`.
    out : ndarray, optional
        Buffer for y.

    Returns
    -------
    y : ndarray
    cache : AddNormCache

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, cache = resnorm.add_rms_norm_post_forward(np.array([[1.0, 2.0]]), np.array([[2.0, 2.0]]))
    >>> y.round(4)
    array([[0.8485, 1.1314]])
    """


@compiled
def add_rms_norm_post(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                      eps: float = 1e-6, *,
                      normalized_shape: int | tuple[int, ...] | None = None,
                      zero_centered_weight: bool = False,
                      alpha: float | ArrayLike = 1.0, p: float = 0.0,
                      seed: int | None = None, training: bool = True,
                      out: NDArray[np.floating] | None = None,
                      n_threads: int | None = None) -> NDArray[np.floating]:
    """Post-Norm: ``y = rms_norm(residual + alpha * dropout(x), weight, eps)``.

    The inference form of :func:`add_rms_norm_post_forward` (same arguments); ``out=x`` or
    ``out=residual`` work in place.

    Parameters
    ----------
    x, residual : ndarray
    weight : ndarray, shape (D,), optional
    eps : float, default 1e-6
    normalized_shape, zero_centered_weight, alpha, p, seed, training, out, n_threads
        As in :func:`add_rms_norm_post_forward`.

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
    >>> resnorm.add_rms_norm_post(np.array([[1.0, 2.0]]), np.array([[2.0, 2.0]])).round(4)
    array([[0.8485, 1.1314]])
    """


@compiled
def add_rms_norm_post_backward(dy: ArrayLike, cache: AddNormCache, *,
                               out: NDArray[np.floating] | None = None,
                               dresidual_out: NDArray[np.floating] | None = None,
                               n_threads: int | None = None
                               ) -> tuple[NDArray[np.floating], NDArray[np.floating],
                                          NDArray[np.floating] | None,
                                          NDArray[np.floating] | None]:
    """Gradients of :func:`add_rms_norm_post_forward` (h recomputed from the cache).

    ``gh = rstd * (g - hn * mean(g * hn))``, g = dy*w, hn = h*rstd; ``dresidual = gh``,
    ``dx = gh * alpha * keep / (1 - p)``, ``dweight = sum dy * hn``,
    ``dalpha = sum gh * dropout(x)``.

    Parameters
    ----------
    dy : ndarray
    cache : AddNormCache
        From :func:`add_rms_norm_post_forward`.
    out, dresidual_out : ndarray, optional
        Buffers for dx and dresidual (each may be dy itself; never an array the cache holds).
    n_threads : int, optional

    Returns
    -------
    dx, dresidual : ndarray
    dweight, dalpha : ndarray or None

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`add_rms_norm_post_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> _, cache = resnorm.add_rms_norm_post_forward(np.array([[1.0, 2.0]]), np.array([[2.0, 2.0]]))
    >>> dx, dres, dw, dalpha = resnorm.add_rms_norm_post_backward(np.ones((1, 2)), cache)
    >>> dx.round(4)
    array([[ 0.0453, -0.0339]])
    """


@compiled
def add_layer_norm_post_forward(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                                bias: ArrayLike | None = None, eps: float = 1e-5, *,
                                normalized_shape: int | tuple[int, ...] | None = None,
                                zero_centered_weight: bool = False,
                                alpha: float | ArrayLike = 1.0, p: float = 0.0, seed: int | None = None,
                                training: bool = True, out: NDArray[np.floating] | None = None,
                                n_threads: int | None = None
                                ) -> tuple[NDArray[np.floating], AddNormCache]:
    """Post-Norm: ``y = layer_norm(residual + alpha * dropout(x))``, keeping what backward
    needs (h is recomputed in backward, as in :func:`add_rms_norm_post_forward`).

    Parameters
    ----------
    x, residual : ndarray
    weight, bias : ndarray, shape (D,), optional
    eps : float, default 1e-5
    normalized_shape, zero_centered_weight, alpha, p, seed, training, out, n_threads
        As in :func:`add_rms_norm_post_forward`.

    Returns
    -------
    y : ndarray
    cache : AddNormCache

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, cache = resnorm.add_layer_norm_post_forward(np.array([[1.0, 2.0, 3.0]]), np.zeros((1, 3)))
    >>> y.round(4)
    array([[-1.2247,  0.    ,  1.2247]])
    """


@compiled
def add_layer_norm_post(x: ArrayLike, residual: ArrayLike, weight: ArrayLike | None = None,
                        bias: ArrayLike | None = None, eps: float = 1e-5, *,
                        normalized_shape: int | tuple[int, ...] | None = None,
                        zero_centered_weight: bool = False,
                        alpha: float | ArrayLike = 1.0, p: float = 0.0, seed: int | None = None,
                        training: bool = True, out: NDArray[np.floating] | None = None,
                        n_threads: int | None = None) -> NDArray[np.floating]:
    """Post-Norm: ``y = layer_norm(residual + alpha * dropout(x), weight, bias, eps)``.

    The inference form of :func:`add_layer_norm_post_forward` (same arguments).

    Parameters
    ----------
    x, residual : ndarray
    weight, bias : ndarray, shape (D,), optional
    eps : float, default 1e-5
    normalized_shape, zero_centered_weight, alpha, p, seed, training, out, n_threads
        As in :func:`add_rms_norm_post_forward`.

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
    >>> resnorm.add_layer_norm_post(np.array([[1.0, 2.0, 3.0]]), np.ones((1, 3))).round(4)
    array([[-1.2247,  0.    ,  1.2247]])
    """


@compiled
def add_layer_norm_post_backward(dy: ArrayLike, cache: AddNormCache, *,
                                 out: NDArray[np.floating] | None = None,
                                 dresidual_out: NDArray[np.floating] | None = None,
                                 n_threads: int | None = None
                                 ) -> tuple[NDArray[np.floating], NDArray[np.floating],
                                            NDArray[np.floating] | None,
                                            NDArray[np.floating] | None,
                                            NDArray[np.floating] | None]:
    """Gradients of :func:`add_layer_norm_post_forward` (h recomputed from the cache).

    ``gh = rstd * (g - mean_g - hhat * mean_ghhat)``; ``dresidual = gh``,
    ``dx = gh * alpha * keep / (1 - p)``, ``dweight = sum dy * hhat``, ``dbias = sum dy``,
    ``dalpha = sum gh * dropout(x)``.

    Parameters
    ----------
    dy : ndarray
    cache : AddNormCache
        From :func:`add_layer_norm_post_forward`.
    out, dresidual_out : ndarray, optional
    n_threads : int, optional

    Returns
    -------
    dx, dresidual : ndarray
    dweight, dbias, dalpha : ndarray or None

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`add_layer_norm_post_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> _, cache = resnorm.add_layer_norm_post_forward(np.array([[1.0, 2.0, 3.0]]),
    ...                                                np.zeros((1, 3)), bias=np.zeros(3))
    >>> resnorm.add_layer_norm_post_backward(np.ones((1, 3)), cache)[3]
    array([1., 1., 1.])
    """


# --------------------------------------------------------------------------- scaled residual

@compiled
def scaled_residual_forward(x: ArrayLike, F: ArrayLike, alpha: float | ArrayLike, *,
                            out: NDArray[np.floating] | None = None,
                            n_threads: int | None = None
                            ) -> tuple[NDArray[np.floating], ScaledResidualCache]:
    """Scaled residual ``h = x + alpha * F``, keeping what backward needs.

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16, shape (..., D)
        The residual stream.
    F : ndarray
        The branch, x's shape and dtype.
    alpha : float or ndarray
        A real number (fixed, no gradient), a 0-d array (learnable scalar) or a (D,) array
        (learnable per channel, LayerScale), arrays of x's dtype.
    out : ndarray, optional
        Buffer for h (may be x; not F or alpha when alpha is learnable).
    n_threads : int, optional

    Returns
    -------
    h : ndarray
    cache : ScaledResidualCache

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> h, cache = resnorm.scaled_residual_forward(np.ones((1, 2)), np.ones((1, 2)), 0.5)
    >>> h
    array([[1.5, 1.5]])
    """


@compiled
def scaled_residual(x: ArrayLike, F: ArrayLike, alpha: float | ArrayLike, *,
                    out: NDArray[np.floating] | None = None,
                    n_threads: int | None = None) -> NDArray[np.floating]:
    """Scaled residual ``h = x + alpha * F``: the inference form of
    :func:`scaled_residual_forward` (same arguments; out may be x or F).

    Parameters
    ----------
    x, F : ndarray
    alpha : float or ndarray
    out : ndarray, optional
    n_threads : int, optional

    Returns
    -------
    h : ndarray

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> resnorm.scaled_residual(np.ones((1, 2)), np.ones((1, 2)), np.array([0.5, 2.0]))
    array([[1.5, 3. ]])
    """


@compiled
def scaled_residual_backward(dh: ArrayLike, cache: ScaledResidualCache, *,
                             out: NDArray[np.floating] | None = None,
                             dbranch_out: NDArray[np.floating] | None = None,
                             n_threads: int | None = None
                             ) -> tuple[NDArray[np.floating], NDArray[np.floating],
                                        NDArray[np.floating] | None]:
    """Gradients of :func:`scaled_residual_forward`: ``dx = dh``, ``dF = alpha * dh``,
    ``dalpha = sum of dh * F`` (over rows; and over channels for a scalar alpha).

    Parameters
    ----------
    dh : ndarray
        Gradient of h.
    cache : ScaledResidualCache
    out : ndarray, optional
        Buffer for dx (h's shape and dtype); it may be dh itself, never an array the cache
        holds (F, alpha).
    dbranch_out : ndarray, optional
        Buffer for dF, with the same rules; out and dbranch_out must not share memory.
    n_threads : int, optional

    Returns
    -------
    dx, dF : ndarray
    dalpha : ndarray or None
        None for a fixed alpha, else of alpha's shape.

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`scaled_residual_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> _, cache = resnorm.scaled_residual_forward(np.ones((2, 2)), np.ones((2, 2)), np.array(0.5))
    >>> resnorm.scaled_residual_backward(np.ones((2, 2)), cache)[2]
    array(4.)
    """


# --------------------------------------------------------------------------- gated residual

@compiled
def gated_residual_forward(x: ArrayLike, F: ArrayLike, g: ArrayLike, *,
                           out: NDArray[np.floating] | None = None,
                           n_threads: int | None = None
                           ) -> tuple[NDArray[np.floating], GatedResidualCache]:
    """Gated residual ``h = x + sigmoid(g) * F``, keeping what backward needs.

    sigmoid is evaluated from ``e = exp(-|g|)`` (no overflow) in x's dtype: in float32
    with resnorm's vectorised exp, within 3 units in the last place of the float64 value;
    in float64 with the C library's exp.

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16, shape (..., D)
    F : ndarray
        The branch, x's shape and dtype.
    g : ndarray
        Gate logits of F's shape, or (D,) (one gate per channel).
    out : ndarray, optional
        Buffer for h (may be x; not F or g, which backward reads).
    n_threads : int, optional

    Returns
    -------
    h : ndarray
    cache : GatedResidualCache

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> h, cache = resnorm.gated_residual_forward(np.zeros((1, 2)), np.ones((1, 2)), np.zeros(2))
    >>> h
    array([[0.5, 0.5]])
    """


@compiled
def gated_residual(x: ArrayLike, F: ArrayLike, g: ArrayLike, *,
                   out: NDArray[np.floating] | None = None,
                   n_threads: int | None = None) -> NDArray[np.floating]:
    """Gated residual ``h = x + sigmoid(g) * F``: the inference form of
    :func:`gated_residual_forward` (same arguments; out may be x, F or g).

    Parameters
    ----------
    x, F : ndarray
    g : ndarray
        F's shape, or (D,).
    out : ndarray, optional
    n_threads : int, optional

    Returns
    -------
    h : ndarray

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> resnorm.gated_residual(np.zeros((1, 2)), np.ones((1, 2)), np.array([[0.0, 50.0]]))
    array([[0.5, 1. ]])
    """


@compiled
def gated_residual_backward(dh: ArrayLike, cache: GatedResidualCache, *,
                            out: NDArray[np.floating] | None = None,
                            dbranch_out: NDArray[np.floating] | None = None,
                            dgate_out: NDArray[np.floating] | None = None,
                            n_threads: int | None = None
                            ) -> tuple[NDArray[np.floating], NDArray[np.floating],
                                       NDArray[np.floating]]:
    """Gradients of :func:`gated_residual_forward`, with ``s = sigmoid(g)``: ``dx = dh``,
    ``dF = s * dh``, ``dg = F * (dh * s * (1 - s))`` (summed over rows for a per-channel g).

    Parameters
    ----------
    dh : ndarray
    cache : GatedResidualCache
    out : ndarray, optional
        Buffer for dx (h's shape and dtype); it may be dh itself, never an array the cache
        holds (F, g).
    dbranch_out : ndarray, optional
        Buffer for dF, with the same rules.
    dgate_out : ndarray, optional
        Buffer for dg, of g's shape (F's, or (D,) for a per-channel gate), with the same
        rules.  The buffers given must not share memory with each other.
    n_threads : int, optional

    Returns
    -------
    dx, dF, dg : ndarray
        dg of g's shape.

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`gated_residual_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> _, cache = resnorm.gated_residual_forward(np.zeros((1, 2)), np.ones((1, 2)), np.zeros(2))
    >>> resnorm.gated_residual_backward(np.ones((1, 2)), cache)[2]
    array([0.25, 0.25])
    """
