"""Linear layer: y = x @ W^T + b, with W stored (out_features, in_features) as in torch."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _checks, _layers
from .._parallel import threads_for
from .._api import kernel_rows
from . import init
from ._blas import single_threaded_blas
from .init import Seed
from .module import Module


class Linear(Module):
    """A fully connected layer: ``y = x @ weight.T + bias`` over the last axis of x.

    Backward: ``dx = dy @ weight``, ``dweight += dy.T @ x``, ``dbias += dy`` summed over
    rows.  The matrix products are scipy's BLAS sgemm/dgemm, one per block of 64 rows,
    run in parallel; the blocks depend on the shapes only, so results are bitwise the same
    for any thread count.  Caches x (a reference when x is C-contiguous, else one copy).
    NumPy twin: ``resnorm.nn.reference.linear_forward`` / ``linear_backward``.

    Parameters
    ----------
    in_features, out_features : int
        Sizes of the last axis of the input and of the output.
    bias : bool, default True
        Whether the layer has a bias.
    dtype : {numpy.float32, numpy.float64}, default numpy.float32
        The dtype of the parameters and of the inputs the layer accepts.
    seed : int, numpy.random.SeedSequence or numpy.random.Generator, default 0
        Initialisation: ``weight`` (out_features, in_features) and ``bias``
        (out_features,) are drawn from U(-1/sqrt(in_features), 1/sqrt(in_features)),
        torch's default (the numbers differ from torch's).

    Raises
    ------
    TypeError
        If a size is not an int, `dtype` is not float32 or float64, or `seed` is of
        another type.
    ValueError
        If a size is not positive.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> layer = nn.Linear(3, 2, seed=0)
    >>> layer.weight.shape, layer.bias.shape
    ((2, 3), (2,))
    >>> x = np.ones((4, 3), np.float32)
    >>> y = layer.forward(x)
    >>> bool(np.allclose(y, x @ layer.weight.T + layer.bias))
    True
    >>> dx = layer.backward(np.ones_like(y))
    >>> dx.shape, layer.dbias
    ((4, 3), array([4., 4.], dtype=float32))
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype: DTypeLike = np.float32, seed: Seed = 0) -> None:
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

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = _checks.module_input(x, "x", self.dtype, self.in_features)
        rows = kernel_rows(x)
        y = np.empty((rows.shape[0], self.out_features), self.dtype)
        with single_threaded_blas() as parallel_gemm:
            _layers.linear_forward(y, rows, self.weight, self.bias, threads_for(None, y.size),
                                   parallel_gemm)
        self._cache = (rows, x.shape)
        return y.reshape(x.shape[:-1] + (self.out_features,))

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        with self._backward_cache() as (rows, shape):
            dy = kernel_rows(_checks.like_array(dy, "dy", shape[:-1] + (self.out_features,),
                                                self.dtype))
        dx = np.empty_like(rows)
        with single_threaded_blas() as parallel_gemm:
            _layers.linear_backward(dx, self.dweight, self.dbias, dy, rows, self.weight,
                                    threads_for(None, dy.size), parallel_gemm)
        return dx.reshape(shape)
