"""RMSNorm and LayerNorm modules over the last axis, on resnorm's compiled norm kernels."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _checks
from ..norms import layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward
from .module import Module


def _param_dtype(param_dtype, dtype):
    """The parameters' dtype: the module's (param_dtype None), or float32 beside a 16-bit
    dtype (mixed precision: the float32 norm of the widened rows, rounded once)."""
    if param_dtype is None:
        return dtype
    pdt = _checks.float_dtype(param_dtype, "param_dtype", halves=True)
    if pdt != dtype and not (pdt == np.float32 and dtype.itemsize == 2):
        raise TypeError(f"param_dtype must be the module's dtype ({dtype}), or float32 "
                        f"beside float16 or bfloat16, got {pdt}")
    return pdt


def _initial_weight(d, dtype, zero_centered_weight):
    """The weight a norm starts with: the identity gain, ones (or zeros when the gain is
    1 + weight)."""
    zero = _checks.flag(zero_centered_weight, "zero_centered_weight")
    return zero, (np.zeros if zero else np.ones)(d, dtype)


class RMSNorm(Module):
    """RMSNorm over the last axis: ``y = x * rstd * weight``, ``rstd = 1/sqrt(mean(x^2) + eps)``.

    Backward (`resnorm.rms_norm_backward`): ``dx = rstd * (g - xn * mean(g*xn))`` with
    ``g = dy*weight``, ``xn = x*rstd``; ``dweight += sum over rows of dy*xn``.  Caches x
    (a reference: do not modify it before backward) and rstd (one float64 per row).
    NumPy twin: `resnorm.reference.rms_norm_forward` / `rms_norm_backward`.

    Parameters
    ----------
    d : int
        The size of the normalised (last) axis; ``weight`` has shape (d,) and starts at 1
        (0 with zero_centered_weight).
    eps : float, default 1e-6
        Added to the mean square.
    zero_centered_weight : bool, default False
        Whether the gain applied is ``1 + weight`` (Gemma); the weight then starts at 0,
        so that weight decay pulls toward the identity.  dweight is the same sum.
    dtype : {numpy.float32, numpy.float64, numpy.float16, ml_dtypes.bfloat16}, default numpy.float32
        The dtype of the weight and of the inputs (16-bit: computed in float32, see
        docs/half_precision.md).
    param_dtype : numpy.float32, optional
        The weight's dtype when it differs from dtype: float32 beside a 16-bit dtype
        (mixed precision; dweight float32 too).  None: dtype.

    Raises
    ------
    TypeError, ValueError
        If d is not a positive int, eps is not a finite number > 0, dtype is not
        float32, float64, float16 or bfloat16, or param_dtype is neither dtype nor float32
        beside a 16-bit dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> norm = nn.RMSNorm(4)
    >>> y = norm.forward(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    >>> y.round(4)
    array([[0.3651, 0.7303, 1.0954, 1.4606]], dtype=float32)
    >>> dx = norm.backward(np.ones_like(y))
    >>> norm.dweight.round(4)
    array([0.3651, 0.7303, 1.0954, 1.4606], dtype=float32)
    """

    def __init__(self, d: int, eps: float = 1e-6, *, zero_centered_weight: bool = False,
                 dtype: DTypeLike = np.float32, param_dtype: DTypeLike | None = None) -> None:
        super().__init__()
        self.d = _checks.positive_int(d, "d")
        self.eps = _checks.eps_value(eps)
        self.dtype = _checks.float_dtype(dtype, halves=True)
        self.param_dtype = _param_dtype(param_dtype, self.dtype)
        self.zero_centered_weight, weight = _initial_weight(self.d, self.param_dtype,
                                                            zero_centered_weight)
        self.weight, self.dweight = self.add_param("weight", weight)
        self._cache = None

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = _checks.module_input(x, "x", self.dtype, self.d)
        y, self._cache = rms_norm_forward(x, self.weight, self.eps,
                                          zero_centered_weight=self.zero_centered_weight)
        return y

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        with self._backward_cache() as cache:
            dx, dw = rms_norm_backward(dy, cache)
        self.dweight += dw
        return dx


class LayerNorm(Module):
    """LayerNorm over the last axis: ``y = (x - mean) * rstd * weight + bias``.

    ``rstd = 1/sqrt(var + eps)`` with the biased variance (divided by d), computed in two
    passes in double.  Backward (`resnorm.layer_norm_backward`):
    ``dx = rstd * (g - mean(g) - xhat * mean(g*xhat))`` with ``g = dy*weight``;
    ``dweight += sum dy*xhat``, ``dbias += sum dy`` over rows.  Caches x (a reference)
    and mean and rstd (float64, one each per row).  NumPy twin:
    `resnorm.reference.layer_norm_forward` / `layer_norm_backward`.

    Parameters
    ----------
    d : int
        The size of the normalised (last) axis; ``weight`` (d,) starts at 1, ``bias``
        (d,) at 0, as in ``torch.nn.LayerNorm``.
    eps : float, default 1e-5
        Added to the variance.
    bias : bool, default True
        Whether the norm has a bias.
    zero_centered_weight : bool, default False
        Whether the gain applied is ``1 + weight`` (Gemma); the weight then starts at 0,
        so that weight decay pulls toward the identity.  dweight is the same sum.
    dtype : {numpy.float32, numpy.float64, numpy.float16, ml_dtypes.bfloat16}, default numpy.float32
        The dtype of the parameters and of the inputs (16-bit: computed in float32).
    param_dtype : numpy.float32, optional
        The parameters' dtype when it differs from dtype, as in `RMSNorm`.

    Raises
    ------
    TypeError, ValueError
        If d is not a positive int, eps is not a finite number > 0, dtype is not
        float32, float64, float16 or bfloat16, or param_dtype is neither dtype nor float32
        beside a 16-bit dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> norm = nn.LayerNorm(4, dtype=np.float64)
    >>> y = norm.forward(np.array([[1.0, 2.0, 3.0, 4.0]]))
    >>> y.round(4)
    array([[-1.3416, -0.4472,  0.4472,  1.3416]])
    >>> dx = norm.backward(np.ones_like(y))
    >>> norm.dbias
    array([1., 1., 1., 1.])
    """

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True, *,
                 zero_centered_weight: bool = False, dtype: DTypeLike = np.float32,
                 param_dtype: DTypeLike | None = None) -> None:
        super().__init__()
        self.d = _checks.positive_int(d, "d")
        self.eps = _checks.eps_value(eps)
        self.dtype = _checks.float_dtype(dtype, halves=True)
        self.param_dtype = _param_dtype(param_dtype, self.dtype)
        self.zero_centered_weight, weight = _initial_weight(self.d, self.param_dtype,
                                                            zero_centered_weight)
        self.weight, self.dweight = self.add_param("weight", weight)
        self.bias = self.dbias = None
        if bias:
            self.bias, self.dbias = self.add_param("bias", np.zeros(self.d, self.param_dtype))
        self._cache = None

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = _checks.module_input(x, "x", self.dtype, self.d)
        y, self._cache = layer_norm_forward(x, self.weight, self.bias, self.eps,
                                            zero_centered_weight=self.zero_centered_weight)
        return y

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        with self._backward_cache() as cache:
            dx, dw, db = layer_norm_backward(dy, cache)
        self.dweight += dw
        if db is not None:
            self.dbias += db
        return dx
