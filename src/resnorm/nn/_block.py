"""What every Transformer block shares: its sublayers, norms, residual connections, options.

The blocks themselves (how these parts are wired, forward and backward) are in blocks.py
(Pre-Norm, Post-Norm), parallel.py, deepnorm.py and sandwich.py.  The options they share
are documented once, here (BLOCK_OPTIONS), and filled into each block's docstring by
`block_doc`.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _checks
from .._docstrings import complete_parameters
from . import init
from ._residual import Residual
from .attention import CausalSelfAttention
from .feedforward import FeedForward
from .init import Seed
from .module import Module
from .norms import LayerNorm, RMSNorm

NORM_KINDS = ("rms", "layer")
NormKind = Literal["layer", "rms"]
ResidualKind = Literal["plain", "scaled", "gated", "none"]
Activation = Literal["gelu", "gelu_tanh"]

# The numpydoc entry of every option the blocks share (TransformerStack too): a block's
# docstring writes only the entries that are its own.
BLOCK_OPTIONS = {
    "d_model": """d_model : int
    D, the model width: inputs and outputs are (B, T, D).""",
    "n_heads": """n_heads : int
    The number of attention heads; d_model must be a multiple of it.""",
    "d_ff": """d_ff : int, optional
    The feed-forward hidden width; default ``4 * d_model`` (torch's default is 2048: pass
    it explicitly when comparing).""",
    "norm": """norm : {"layer", "rms"}, default "layer"
    LayerNorm (weight, and bias with bias=True) or RMSNorm (weight) for every norm.""",
    "residual": """residual : {"plain", "scaled", "gated", "none"}, default "plain"
    The residual connections res1 and res2, with d the dropped-out sublayer output:
    ``h = x + d``; ``x + alpha * d`` (a learnable scalar ``resK.alpha``);
    ``x + sigmoid(gate) * d`` (learnable per-channel logits ``resK.gate``); ``h = d``
    (no skip connection, for experiments).""",
    "dropout": """dropout : float, default 0.0
    Inverted dropout on both residual branches, in training mode only.""",
    "attn_dropout": """attn_dropout : float, default 0.0
    Dropout on the attention probabilities, in training mode only.""",
    "causal": """causal : bool, default True
    Mask key j > query i in attention.""",
    "activation": """activation : {"gelu", "gelu_tanh"}, default "gelu"
    The feed-forward activation: exact (erf) GELU or its tanh approximation.""",
    "eps": """eps : float, default 1e-5
    eps of every norm (torch's ``layer_norm_eps``).""",
    "bias": """bias : bool, default True
    Biases of every Linear layer and LayerNorm.""",
    "alpha": """alpha : float, default 1.0
    The start value of ``resK.alpha`` with ``residual="scaled"``.""",
    "gate": """gate : float, default 0.0
    The start value of the gate logits ``resK.gate`` with ``residual="gated"``.""",
    "dtype": """dtype : {numpy.float32, numpy.float64}, default numpy.float32
    The dtype of all parameters and activations.""",
    "seed": """seed : int, numpy.random.SeedSequence or numpy.random.Generator, default 0
    Deterministic initialisation (torch's distributions) and dropout masks.""",
}
BLOCK_RAISES = """TypeError, ValueError
    If an option is of the wrong type or out of range (the message names it)."""

# Completes a block's docstring: the shared options it does not document itself, and the
# shared Raises when it has none of its own.
block_doc = complete_parameters(BLOCK_OPTIONS, {"Raises": BLOCK_RAISES})


def make_norm(kind: NormKind, d: int, eps: float, bias: bool, dtype: DTypeLike
              ) -> RMSNorm | LayerNorm:
    """RMSNorm (weight only) or LayerNorm (weight, and bias when bias=True)."""
    if _checks.one_of(kind, "norm", NORM_KINDS) == "rms":
        return RMSNorm(d, eps, dtype=dtype)
    return LayerNorm(d, eps, bias, dtype=dtype)


class Block(Module):
    """Self-attention, the feed-forward network, the norms named in norm_names and two
    residual connections res1, res2 (of the kinds _residual_kinds(residual) gives).

    Registration order is torch.nn.TransformerEncoderLayer's named_parameters() order:
    self_attn.*, linear1.*, linear2.*, then the norms, then res1.*, res2.*.
    """

    norm_names = ("norm1", "norm2")

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *,
                 norm: NormKind = "layer", residual: ResidualKind = "plain",
                 dropout: float = 0.0, attn_dropout: float = 0.0, causal: bool = True,
                 activation: Activation = "gelu", eps: float = 1e-5, bias: bool = True,
                 alpha: float = 1.0, gate: float = 0.0, dtype: DTypeLike = np.float32,
                 seed: Seed = 0) -> None:
        super().__init__()
        self._shape = None   # the last forward's input shape (its output's)
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
            for name, kind, s in zip(("res1", "res2"), self._residual_kinds(residual), seeds))

    def _residual_kinds(self, residual: ResidualKind) -> tuple[ResidualKind, ResidualKind]:
        """The kinds of res1 and res2 for the block's residual option."""
        return residual, residual

    def _input(self, x: ArrayLike) -> NDArray[np.floating]:
        x = _checks.module_input(x, "x", self.dtype, self.d_model, ndim=3)
        self._shape = x.shape
        return x

    def _output_gradient(self, dy: ArrayLike) -> NDArray[np.floating]:
        """dy checked against the last forward's output (x's shape and dtype) under its own
        name, before any sublayer's backward sees it (as its dh, say).  Before any forward,
        the sublayers say there was none."""
        if self._shape is None:
            return dy
        return _checks.like_array(dy, "dy", self._shape, self.dtype)
