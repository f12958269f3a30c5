"""RMSNorm and LayerNorm modules over the last axis, on resnorm's compiled norm kernels."""
import numpy as np

from .. import _checks
from ..norms import layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward
from .module import Module


def _initial_weight(d, dtype, zero_centered_weight):
    """The weight a norm starts with: the identity gain, ones (or zeros when the gain is
    1 + weight)."""
    zero = _checks.flag(zero_centered_weight, "zero_centered_weight")
    return zero, (np.zeros if zero else np.ones)(d, dtype)


class RMSNorm(Module):
    """y = x * rstd * weight,  rstd = 1/sqrt(mean(x^2) + eps).

    Backward (resnorm.rms_norm_backward): dx = rstd * (g - xn * mean(g*xn)), g = dy*w,
    xn = x*rstd;  dweight += sum over rows of dy*xn.
    Caches: x (reference) and rstd (one float64 per row).   weight starts at ones.
    zero_centered_weight=True: the gain is 1 + weight (Gemma) and weight starts at zeros,
    so that weight decay pulls toward the identity; dweight is the same sum.
    NumPy reference: resnorm.reference.rms_norm_forward / rms_norm_backward.
    """

    def __init__(self, d, eps=1e-6, *, zero_centered_weight=False, dtype=np.float32):
        super().__init__()
        self.d = _checks.positive_int(d, "d")
        self.eps = _checks.eps_value(eps)
        self.dtype = _checks.float_dtype(dtype)
        self.zero_centered_weight, weight = _initial_weight(self.d, self.dtype,
                                                            zero_centered_weight)
        self.weight, self.dweight = self.add_param("weight", weight)
        self._cache = None

    def forward(self, x):
        x = _checks.module_input(x, "x", self.dtype, self.d)
        y, self._cache = rms_norm_forward(x, self.weight, self.eps,
                                          zero_centered_weight=self.zero_centered_weight)
        return y

    def backward(self, dy):
        dx, dw = rms_norm_backward(dy, self._take_cache())
        self.dweight += dw
        return dx


class LayerNorm(Module):
    """y = (x - mean) * rstd * weight + bias,  rstd = 1/sqrt(var + eps), var biased.

    Backward (resnorm.layer_norm_backward): dx = rstd * (g - mean(g) - xhat * mean(g*xhat)),
    g = dy*w;  dweight += sum dy*xhat;  dbias += sum dy.
    Caches: x (reference), mean and rstd (float64, one each per row).  weight = 1, bias = 0
    at the start, as in torch.nn.LayerNorm (zero_centered_weight=True: the gain is
    1 + weight, and weight starts at 0).
    NumPy reference: resnorm.reference.layer_norm_forward / layer_norm_backward.
    """

    def __init__(self, d, eps=1e-5, bias=True, *, zero_centered_weight=False,
                 dtype=np.float32):
        super().__init__()
        self.d = _checks.positive_int(d, "d")
        self.eps = _checks.eps_value(eps)
        self.dtype = _checks.float_dtype(dtype)
        self.zero_centered_weight, weight = _initial_weight(self.d, self.dtype,
                                                            zero_centered_weight)
        self.weight, self.dweight = self.add_param("weight", weight)
        self.bias = self.dbias = None
        if bias:
            self.bias, self.dbias = self.add_param("bias", np.zeros(self.d, self.dtype))
        self._cache = None

    def forward(self, x):
        x = _checks.module_input(x, "x", self.dtype, self.d)
        y, self._cache = layer_norm_forward(x, self.weight, self.bias, self.eps,
                                            zero_centered_weight=self.zero_centered_weight)
        return y

    def backward(self, dy):
        dx, dw, db = layer_norm_backward(dy, self._take_cache())
        self.dweight += dw
        if db is not None:
            self.dbias += db
        return dx
