"""The position-wise feed-forward network: Linear -> GELU -> Linear."""
import numpy as np

from .. import _checks
from . import init
from .activations import GELU
from .linear import Linear
from .module import Module


class FeedForward(Module):
    """y = linear2(gelu(linear1(x))),  linear1: D -> d_ff,  linear2: d_ff -> D.

    Backward: da = linear2.backward(dy); dh = da * gelu'(h) (in place); dx = linear1.backward(dh).
    Caches (in its children): x (linear1), h = linear1(x) (GELU), a = gelu(h) (linear2).
    Parameters (torch.nn.TransformerEncoderLayer names): linear1.weight (d_ff, D),
    linear1.bias, linear2.weight (D, d_ff), linear2.bias.
    activation: "gelu" (exact erf form) or "gelu_tanh" (tanh approximation).
    """

    def __init__(self, d_model, d_ff, *, activation="gelu", bias=True, dtype=np.float32,
                 seed=0):
        super().__init__()
        _checks.one_of(activation, "activation", ("gelu", "gelu_tanh"))
        rng = init.generator(seed)
        self.linear1 = self.add_module("linear1", Linear(d_model, d_ff, bias, dtype=dtype,
                                                         seed=rng))
        self.activation = self.add_module(
            "activation", GELU("tanh" if activation == "gelu_tanh" else "none"))
        self.linear2 = self.add_module("linear2", Linear(d_ff, d_model, bias, dtype=dtype,
                                                         seed=rng))

    def forward(self, x):
        return self.linear2.forward(self.activation.forward(self.linear1.forward(x)))

    def backward(self, dy):
        da = self.linear2.backward(dy)
        dh = self.activation.backward(da, out=da)
        return self.linear1.backward(dh)
