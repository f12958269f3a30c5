"""The position-wise feed-forward network: Linear -> GELU -> Linear."""
from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _checks
from . import init
from .activations import GELU
from .init import Seed
from .linear import Linear
from .module import Module


class FeedForward(Module):
    """The position-wise feed-forward network ``y = linear2(gelu(linear1(x)))``.

    linear1 maps D to d_ff, linear2 d_ff back to D, with torch's
    ``TransformerEncoderLayer`` parameter names (``linear1.weight`` (d_ff, D),
    ``linear1.bias``, ``linear2.weight`` (D, d_ff), ``linear2.bias``).  Backward:
    ``da = linear2.backward(dy)``, ``dh = da * gelu'(h)`` in place,
    ``dx = linear1.backward(dh)``.  The children cache x, h = linear1(x) and a = gelu(h).

    Parameters
    ----------
    d_model : int
        D, the width of the input and the output.
    d_ff : int
        The hidden width.
    activation : {"gelu", "gelu_tanh"}, default "gelu"
        The exact (erf) GELU or its tanh approximation.
    bias : bool, default True
        Whether both Linear layers have biases.
    dtype : {numpy.float32, numpy.float64}, default numpy.float32
        The dtype of the parameters and of the inputs.
    seed : int, numpy.random.SeedSequence or numpy.random.Generator, default 0
        Initialisation of both Linear layers.

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int, `activation` is not one of the two names, or
        `dtype` or `seed` is not accepted.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> ffn = nn.FeedForward(8, 32, seed=0)
    >>> sorted(ffn.params())
    ['linear1.bias', 'linear1.weight', 'linear2.bias', 'linear2.weight']
    >>> y = ffn.forward(np.ones((2, 3, 8), np.float32))
    >>> ffn.backward(np.ones_like(y)).shape
    (2, 3, 8)
    """

    def __init__(self, d_model: int, d_ff: int, *,
                 activation: Literal["gelu", "gelu_tanh"] = "gelu", bias: bool = True,
                 dtype: DTypeLike = np.float32, seed: Seed = 0) -> None:
        super().__init__()
        _checks.one_of(activation, "activation", ("gelu", "gelu_tanh"))
        rng = init.generator(seed)
        self.linear1 = self.add_module("linear1", Linear(d_model, d_ff, bias, dtype=dtype,
                                                         seed=rng))
        self.activation = self.add_module(
            "activation", GELU("tanh" if activation == "gelu_tanh" else "none"))
        self.linear2 = self.add_module("linear2", Linear(d_ff, d_model, bias, dtype=dtype,
                                                         seed=rng))

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        return self.linear2.forward(self.activation.forward(self.linear1.forward(x)))

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        da = self.linear2.backward(dy)
        dh = self.activation.backward(da, out=da)
        return self.linear1.backward(dh)
