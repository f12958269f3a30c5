"""GELU, exact (erf) or with the tanh approximation, as an elementwise module."""
import numpy as np

from .. import _checks, _layers
from .._parallel import threads_for
from .module import Module


class GELU(Module):
    """y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))                 approximate="none"
    y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))              approximate="tanh"

    Backward: dx = dy * (Phi(x) + x phi(x)) (exact), or the derivative of the tanh form
    (resnorm_c/layers.pyx gelu_backward).  The names follow torch.nn.GELU(approximate=...).
    Caches: x.   NumPy reference: resnorm.nn.reference.gelu / gelu_backward.
    """

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = _checks.one_of(approximate, "approximate", ("none", "tanh"))
        self._cache = None

    def forward(self, x):
        x = _checks.float_array(x, "x")
        flat = np.ascontiguousarray(x).reshape(-1)
        y = np.empty_like(flat)
        _layers.gelu_forward(y, flat, self.approximate == "tanh", threads_for(None, y.size))
        self._cache = (flat, x.shape)
        return y.reshape(x.shape)

    def backward(self, dy, out=None):
        """dx; out may be a preallocated C-contiguous buffer for it, dy itself included."""
        flat, shape = self._take_cache()
        dy = _checks.like_array(dy, "dy", shape, flat.dtype)
        dy_flat = np.ascontiguousarray(dy).reshape(-1)
        if out is None:
            dx = np.empty_like(flat)
        else:
            _checks.out_array(out, shape, flat.dtype, {"dy": dy})
            if not out.flags.c_contiguous:
                raise ValueError("out must be C-contiguous")
            dx = out.reshape(-1)
        _layers.gelu_backward(dx, dy_flat, flat, self.approximate == "tanh",
                              threads_for(None, dx.size))
        return dx.reshape(shape)
