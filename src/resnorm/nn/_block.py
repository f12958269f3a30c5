"""What every Transformer block shares: its sublayers, norms, residual connections, options.

The blocks themselves (how these parts are wired, forward and backward) are in blocks.py
(Pre-Norm, Post-Norm), parallel.py, deepnorm.py and sandwich.py.
"""
import numpy as np

from .. import _checks
from . import init
from ._residual import Residual
from .attention import CausalSelfAttention
from .feedforward import FeedForward
from .module import Module
from .norms import LayerNorm, RMSNorm

NORM_KINDS = ("rms", "layer")


def make_norm(kind, d, eps, bias, dtype):
    """RMSNorm (weight only) or LayerNorm (weight, and bias when bias=True)."""
    if _checks.one_of(kind, "norm", NORM_KINDS) == "rms":
        return RMSNorm(d, eps, dtype=dtype)
    return LayerNorm(d, eps, bias, dtype=dtype)


class Block(Module):
    """Self-attention, the feed-forward network, the norms named in norm_names and two
    residual connections res1, res2 (of the kinds residual_kinds(residual) gives).

    Registration order is torch.nn.TransformerEncoderLayer's named_parameters() order:
    self_attn.*, linear1.*, linear2.*, then the norms, then res1.*, res2.*.
    """

    norm_names = ("norm1", "norm2")

    def __init__(self, d_model, n_heads, d_ff=None, *, norm="layer", residual="plain",
                 dropout=0.0, attn_dropout=0.0, causal=True, activation="gelu", eps=1e-5,
                 bias=True, alpha=1.0, gate=0.0, dtype=np.float32, seed=0):
        super().__init__()
        self.d_model = _checks.positive_int(d_model, "d_model")
        d_ff = 4 * self.d_model if d_ff is None else _checks.positive_int(d_ff, "d_ff")
        self.dtype = _checks.float_dtype(dtype)
        rng = init.generator(seed)
        self.self_attn = self.add_module("self_attn", CausalSelfAttention(
            d_model, n_heads, causal=causal, bias=bias,
            dropout=_checks.probability(attn_dropout, "attn_dropout"), dtype=dtype, seed=rng))
        # registered under "" so its parameters are named linear1.*, linear2.* as in torch
        self.ffn = self.add_module("", FeedForward(d_model, d_ff, activation=activation,
                                                   bias=bias, dtype=dtype, seed=rng))
        for name in self.norm_names:
            setattr(self, name, self.add_module(name, make_norm(norm, d_model, eps, bias,
                                                                dtype)))
        seeds = init.child_seeds(rng, 2)
        self.res1, self.res2 = (
            self.add_module(name, Residual(kind, d_model, p=dropout, alpha=alpha, gate=gate,
                                           dtype=dtype, seed=s))
            for name, kind, s in zip(("res1", "res2"), self.residual_kinds(residual), seeds))

    def residual_kinds(self, residual):
        """The kinds of res1 and res2 for the block's residual option."""
        return residual, residual

    def _input(self, x):
        return _checks.module_input(x, "x", self.dtype, self.d_model, ndim=3)
