"""Linear layer: y = x @ W^T + b, with W stored (out_features, in_features) as in torch."""
import numpy as np

from .. import _checks, _layers
from .._parallel import threads_for
from .._api import kernel_rows
from . import init
from ._blas import single_threaded_blas
from .module import Module


class Linear(Module):
    """y = x @ weight^T + bias over the last axis of x (..., in_features).

    Backward: dx = dy @ weight;  dweight += dy^T @ x;  dbias += sum over rows of dy.
    Matrix products: sgemm/dgemm from scipy's BLAS, one per row block, in parallel
    (resnorm_c/layers.pyx, threads: resnorm.nn._blas).
    Caches: x (a reference when x was C-contiguous, else one contiguous copy).
    NumPy reference: resnorm.nn.reference.linear_forward / linear_backward.
    Parameters: weight (out, in) ~ U(+-1/sqrt(in)), bias (out,) likewise (torch's default).
    """

    def __init__(self, in_features, out_features, bias=True, *, dtype=np.float32, seed=0):
        super().__init__()
        self.in_features = _checks.positive_int(in_features, "in_features")
        self.out_features = _checks.positive_int(out_features, "out_features")
        self.dtype = _checks.float_dtype(dtype)
        rng = init.generator(seed)
        bound = init.linear_bound(in_features)
        w = init.uniform(rng, (out_features, in_features), bound, self.dtype)
        self.weight, self.dweight = self.add_param("weight", w)
        self.bias = self.dbias = None
        if bias:
            self.bias, self.dbias = self.add_param(
                "bias", init.uniform(rng, (out_features,), bound, self.dtype))
        self._cache = None

    def forward(self, x):
        x = _checks.module_input(x, "x", self.dtype, self.in_features)
        rows = kernel_rows(x)
        y = np.empty((rows.shape[0], self.out_features), self.dtype)
        with single_threaded_blas() as parallel_gemm:
            _layers.linear_forward(y, rows, self.weight, self.bias, threads_for(None, y.size),
                                   parallel_gemm)
        self._cache = (rows, x.shape)
        return y.reshape(x.shape[:-1] + (self.out_features,))

    def backward(self, dy):
        rows, shape = self._take_cache()
        dy = _checks.like_array(dy, "dy", shape[:-1] + (self.out_features,), self.dtype)
        dy = kernel_rows(dy)
        dx = np.empty_like(rows)
        with single_threaded_blas() as parallel_gemm:
            _layers.linear_backward(dx, self.dweight, self.dbias, dy, rows, self.weight,
                                    threads_for(None, dy.size), parallel_gemm)
        return dx.reshape(shape)
