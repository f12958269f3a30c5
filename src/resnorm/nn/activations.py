"""GELU, exact (erf) or with the tanh approximation, as an elementwise module."""
from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _checks, _layers
from .._parallel import threads_for
from .module import Module


class GELU(Module):
    """The Gaussian error linear unit, elementwise, as ``torch.nn.GELU(approximate=...)``.

    ``approximate="none"``: ``y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))``;
    ``approximate="tanh"``: ``y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.
    Backward: ``dx = dy * (Phi(x) + x phi(x))`` (exact), or the derivative of the tanh
    form.  float32 uses vectorised exp/erfc (max absolute error 3.8e-7), float64 libm's.
    Caches x.  NumPy twin: ``resnorm.nn.reference.gelu`` / ``gelu_backward``.

    Parameters
    ----------
    approximate : {"none", "tanh"}, default "none"
        The exact form or the tanh approximation.

    Raises
    ------
    ValueError
        If `approximate` is not one of the two strings.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> gelu = nn.GELU()
    >>> gelu.forward(np.array([-1.0, 0.0, 1.0]))
    array([-0.15865525,  0.        ,  0.84134475])
    >>> gelu.backward(np.ones(3))
    array([-0.08331547,  0.5       ,  1.08331547])
    """

    def __init__(self, approximate: Literal["none", "tanh"] = "none") -> None:
        super().__init__()
        self.approximate = _checks.one_of(approximate, "approximate", ("none", "tanh"))
        self._cache = None

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = _checks.float_array(x, "x")
        flat = np.ascontiguousarray(x).reshape(-1)
        y = np.empty_like(flat)
        _layers.gelu_forward(y, flat, self.approximate == "tanh", threads_for(None, y.size))
        self._cache = (flat, x.shape)
        return y.reshape(x.shape)

    def backward(self, dy: ArrayLike, out: NDArray[np.floating] | None = None
                 ) -> NDArray[np.floating]:
        """The gradient of the input.

        Parameters
        ----------
        dy : array_like
            Gradient of the loss with respect to the last forward's output (its shape and
            dtype).
        out : ndarray, optional
            A C-contiguous buffer of that shape and dtype for the result; dy itself may be
            passed (the gradient is then computed in place).

        Returns
        -------
        ndarray
            ``dy * GELU'(x)`` (`out` when given).

        Raises
        ------
        RuntimeError
            If there was no forward since the last backward.
        TypeError, ValueError
            If dy or out does not have the forward input's shape and dtype, or out is not
            C-contiguous.
        """
        with self._backward_cache() as (flat, shape):
            dy = _checks.like_array(dy, "dy", shape, flat.dtype)
            if out is None:
                dx = np.empty_like(flat)
            else:
                _checks.out_array(out, shape, flat.dtype, {"dy": dy})
                if not out.flags.c_contiguous:
                    raise ValueError("out must be C-contiguous")
                dx = out.reshape(-1)
        dy_flat = np.ascontiguousarray(dy).reshape(-1)
        _layers.gelu_backward(dx, dy_flat, flat, self.approximate == "tanh",
                              threads_for(None, dx.size))
        return dx.reshape(shape)
