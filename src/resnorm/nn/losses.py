"""Losses that return their value and the gradient of their input together."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _checks


def mse_loss(y: ArrayLike, target: ArrayLike) -> tuple[float, NDArray[np.floating]]:
    """The mean squared error and its gradient: ``mean((y - target)^2)``.

    Parameters
    ----------
    y : array_like of float32 or float64
        The prediction.
    target : array_like
        The target, of y's shape and dtype.

    Returns
    -------
    loss : float
        ``mean((y - target)^2)``, accumulated in float64.
    dy : ndarray
        Its gradient with respect to y, ``2 (y - target) / y.size``, in y's dtype.

    Raises
    ------
    TypeError
        If y is not a float array or target does not have its dtype.
    ValueError
        If target does not have y's shape.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> loss, dy = nn.mse_loss(np.array([1.0, 2.0]), np.array([0.0, 0.0]))
    >>> loss, dy
    (2.5, array([1., 2.]))
    """
    y = _checks.float_array(y, "y")
    target = _checks.like_array(target, "target", y.shape, y.dtype)
    diff = y - target
    loss = float(np.mean(diff.astype(np.float64) ** 2))
    return loss, diff * y.dtype.type(2.0 / y.size)
