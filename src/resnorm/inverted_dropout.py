"""Inverted dropout with a counter-based mask.

Training:  y = x * keep / (1 - p), keep_k = 1 with probability 1 - p.   Eval: y = x.

keep_k is decided by the 32-bit Philox-4x32-10 uniform of (seed, k), k the element's flat
C-order index: element k is kept when uniform >= floor(p * 2**32).  The mask is therefore a
pure function of (seed, k): the same for any thread count and on any machine, and backward
regenerates it from the seed instead of storing it (docs/dropout.md).

Forms, as in resnorm.norms:

* ``y = dropout(x, p, seed=s)``
* ``y, cache = dropout_forward(x, p, seed=s)`` and ``dx = dropout_backward(dy, cache)``.
  With ``return_mask=True`` the boolean keep-mask is also computed, as ``cache.mask``.

Use a different seed for every dropout site and every step (for example a hash of (step,
layer)): the same seed gives the same mask for every array of the same size.

Each function here declares a compiled function of resnorm._api, as in resnorm.norms.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._compiled import compiled
from ._api import DropoutCache, DropoutSpec, dropout_spec, valid_spec

__all__ = ["DropoutCache", "DropoutSpec", "dropout", "dropout_backward", "dropout_forward",
           "dropout_spec", "valid_spec"]


@compiled
def dropout_forward(x: ArrayLike, p: float, *, seed: int, training: bool = True,
                    out: NDArray[np.floating] | None = None, n_threads: int | None = None,
                    return_mask: bool = False) -> tuple[NDArray[np.floating], DropoutCache]:
    """Inverted dropout, keeping what backward needs (the site, never the mask).

    ``y = x * keep / (1 - p)`` in training, with ``keep_k = [uniform(seed, k) >=
    floor(p * 2**32)]``; ``y = x`` (a copy, bitwise equal) in eval mode and for p = 0.

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16
        Any shape.
    p : float
        Drop probability in [0, 1] (p = 1: y = x * 0).
    seed : int
        In [0, 2**64).
    training : bool, default True
    out : ndarray, optional
        Buffer for y (may be x itself).
    n_threads : int, optional
        None uses the OpenMP default.
    return_mask : bool, default False
        Also compute the boolean keep-mask, as ``cache.mask``.

    Returns
    -------
    y : ndarray
    cache : DropoutCache

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    See Also
    --------
    resnorm.reference.dropout_forward : the NumPy twin.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, cache = resnorm.dropout_forward(np.ones(8), 0.5, seed=3, return_mask=True)
    >>> np.array_equal(y, np.where(cache.mask, 2.0, 0.0))
    True
    """


@compiled
def dropout(x: ArrayLike, p: float, *, seed: int, training: bool = True,
            out: NDArray[np.floating] | None = None,
            n_threads: int | None = None) -> NDArray[np.floating]:
    """Inverted dropout: ``y = x * keep / (1 - p)`` in training, ``y = x`` in eval.

    The inference form of :func:`dropout_forward` (same arguments, no cache).

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16
    p : float
    seed : int
    training : bool, default True
    out : ndarray, optional
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
    >>> resnorm.dropout(np.ones(4), 0.5, seed=1, training=False)
    array([1., 1., 1., 1.])
    """


@compiled
def dropout_backward(dy: ArrayLike, cache: DropoutCache, *,
                     out: NDArray[np.floating] | None = None,
                     n_threads: int | None = None) -> NDArray[np.floating]:
    """Gradient of :func:`dropout_forward`: ``dx = dy * keep / (1 - p)``, the same mask,
    regenerated from (seed, k).

    Parameters
    ----------
    dy : ndarray
        Gradient of y, the forward input's shape and dtype.
    cache : DropoutCache
    out : ndarray, optional
        Buffer for dx (may be dy itself).
    n_threads : int, optional

    Returns
    -------
    dx : ndarray

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`dropout_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> y, cache = resnorm.dropout_forward(np.ones(8), 0.5, seed=3)
    >>> np.array_equal(resnorm.dropout_backward(np.ones(8), cache), y)
    True
    """
