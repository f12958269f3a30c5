"""Pre-Norm and Post-Norm Transformer encoder blocks, and a stack of them.

Pre-Norm:   u = x + Dropout(Attn(Norm1(x)));   y = u + Dropout(FFN(Norm2(u)))
Post-Norm:  u = Norm1(x + Dropout(Attn(x)));   y = Norm2(u + Dropout(FFN(u)))

Parameter names and layouts are those of torch.nn.TransformerEncoderLayer(batch_first=True)
(and of torch.nn.TransformerEncoder for the stack): docs/blocks.md has the table.
"""
from __future__ import annotations

import inspect
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _checks
from . import init
from ._residual import (Residual, post_add_norm_backward, post_add_norm_forward,
                        pre_add_norm_backward, pre_add_norm_forward)
from .attention import CausalSelfAttention
from .feedforward import FeedForward
from .init import Seed
from .module import Module
from .norms import LayerNorm, RMSNorm

NORM_KINDS = ("rms", "layer")

# The options of both blocks, written once: appended to each block's docstring.
_BLOCK_OPTIONS = """\
Parameters
----------
d_model : int
    D, the model width.
n_heads : int
    The number of attention heads; d_model must be a multiple of it.
d_ff : int, optional
    The feed-forward hidden width; default ``4 * d_model`` (torch's default is 2048:
    pass it explicitly when comparing).
norm : {"layer", "rms"}, default "layer"
    LayerNorm (weight and bias) or RMSNorm (weight) for norm1 and norm2.
residual : {"plain", "scaled", "gated", "none"}, default "plain"
    ``h = x + d``; ``x + alpha*d`` (learnable scalar ``resK.alpha``);
    ``x + sigmoid(gate)*d`` (learnable per-channel logits ``resK.gate``); ``h = d``
    (no skip connection, for experiments).  d is the dropped-out sublayer output.
dropout : float, default 0.0
    Inverted dropout on both residual branches, in training mode only.
causal : bool, default True
    Mask key j > query i in attention.
activation : {"gelu", "gelu_tanh"}, default "gelu"
    The feed-forward activation: exact (erf) GELU or its tanh approximation.
eps : float, default 1e-5
    eps of both norms (torch's ``layer_norm_eps``).
bias : bool, default True
    Biases of every Linear layer and LayerNorm.
alpha : float, default 1.0
    The start value of alpha with ``residual="scaled"``.
gate : float, default 0.0
    The start value of the gate logits with ``residual="gated"``.
dtype : {numpy.float32, numpy.float64}, default numpy.float32
    The dtype of all parameters and activations.
seed : int, numpy.random.SeedSequence or numpy.random.Generator, default 0
    Deterministic initialisation (torch's distributions) and dropout masks.

Raises
------
TypeError, ValueError
    If an option is of the wrong type or out of range (the message names it).
"""


def _with_block_options(cls):
    """Puts the shared options into a block class's docstring, before its Examples."""
    if cls.__doc__ is None:   # python -OO strips docstrings
        return cls
    head, examples = inspect.cleandoc(cls.__doc__).split("\nExamples\n", 1)
    cls.__doc__ = f"{head.rstrip()}\n\n{_BLOCK_OPTIONS}\nExamples\n{examples}"
    return cls


def _make_norm(kind: str, d: int, eps: float, bias: bool, dtype: DTypeLike
               ) -> RMSNorm | LayerNorm:
    """RMSNorm (weight only) or LayerNorm (weight, and bias when bias=True)."""
    if _checks.one_of(kind, "norm", NORM_KINDS) == "rms":
        return RMSNorm(d, eps, dtype=dtype)
    return LayerNorm(d, eps, bias, dtype=dtype)


class _Block(Module):
    """What both blocks share: sublayers, norms, residual connections, options."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *,
                 norm: Literal["layer", "rms"] = "layer",
                 residual: Literal["plain", "scaled", "gated", "none"] = "plain",
                 dropout: float = 0.0, causal: bool = True,
                 activation: Literal["gelu", "gelu_tanh"] = "gelu", eps: float = 1e-5,
                 bias: bool = True, alpha: float = 1.0, gate: float = 0.0,
                 dtype: DTypeLike = np.float32, seed: Seed = 0) -> None:
        super().__init__()
        self.d_model = _checks.positive_int(d_model, "d_model")
        d_ff = 4 * self.d_model if d_ff is None else _checks.positive_int(d_ff, "d_ff")
        self.dtype = _checks.float_dtype(dtype)
        rng = init.generator(seed)
        # registration order = torch's named_parameters() order
        self.self_attn = self.add_module("self_attn", CausalSelfAttention(
            d_model, n_heads, causal=causal, bias=bias, dtype=dtype, seed=rng))
        # registered under "" so its parameters are named linear1.*, linear2.* as in torch
        self.ffn = self.add_module("", FeedForward(d_model, d_ff, activation=activation,
                                                   bias=bias, dtype=dtype, seed=rng))
        self.norm1 = self.add_module("norm1", _make_norm(norm, d_model, eps, bias, dtype))
        self.norm2 = self.add_module("norm2", _make_norm(norm, d_model, eps, bias, dtype))
        seeds = init.child_seeds(rng, 2)
        self.res1, self.res2 = (
            self.add_module(name, Residual(residual, d_model, p=dropout, alpha=alpha,
                                           gate=gate, dtype=dtype, seed=s))
            for name, s in zip(("res1", "res2"), seeds))

    def _input(self, x: ArrayLike) -> NDArray[np.floating]:
        return _checks.module_input(x, "x", self.dtype, self.d_model, ndim=3)


@_with_block_options
class PreNormBlock(_Block):
    """A Pre-Norm Transformer encoder block over inputs (B, T, D).

    ``u = x + Dropout(Attn(Norm1(x)))``, ``y = u + Dropout(FFN(Norm2(u)))``: the residual
    stream is never normalised.  Parameters are named as in
    ``torch.nn.TransformerEncoderLayer(d_model, n_heads, d_ff, batch_first=True,
    norm_first=True)``; the second add + norm runs as one fused kernel.  NumPy twin:
    ``resnorm.nn.reference.pre_norm_block``.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> block = nn.PreNormBlock(16, 2, seed=0)
    >>> x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    >>> y = block.forward(x)
    >>> dx = block.backward(np.ones_like(y))
    >>> y.shape, dx.shape, block.num_params()
    ((2, 5, 16), (2, 5, 16), 3280)
    """

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = self._input(x)
        a = self.self_attn.forward(self.norm1.forward(x))
        n2, u = pre_add_norm_forward(self.res1, self.norm2, x, a)
        return self.res2.forward(u, self.ffn.forward(n2))

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        du, df = self.res2.backward(dy)
        dx, da = pre_add_norm_backward(self.res1, self.norm2, self.ffn.backward(df), du)
        g = self.norm1.backward(self.self_attn.backward(da))   # fresh: safe to add into
        if dx is not None:
            g += dx
        return g


@_with_block_options
class PostNormBlock(_Block):
    """A Post-Norm Transformer encoder block over inputs (B, T, D).

    ``u = Norm1(x + Dropout(Attn(x)))``, ``y = Norm2(u + Dropout(FFN(u)))``: every residual
    sum is normalised, each add + norm as one fused kernel.  Parameters are named as in
    ``torch.nn.TransformerEncoderLayer(d_model, n_heads, d_ff, batch_first=True)``.
    NumPy twin: ``resnorm.nn.reference.post_norm_block``.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> block = nn.PostNormBlock(16, 2, norm="rms", seed=0)
    >>> y = block.forward(np.ones((1, 4, 16), np.float32))
    >>> bool(np.allclose(np.mean(y.astype(np.float64) ** 2, axis=-1), 1, atol=1e-3))
    True
    """

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = self._input(x)
        u = post_add_norm_forward(self.res1, self.norm1, x, self.self_attn.forward(x))
        return post_add_norm_forward(self.res2, self.norm2, u, self.ffn.forward(u))

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        du, df = post_add_norm_backward(self.res2, self.norm2, dy)
        g = self.ffn.backward(df)               # fresh: safe to add into
        if du is not None:
            g += du
        dx, da = post_add_norm_backward(self.res1, self.norm1, g)
        g = self.self_attn.backward(da)
        if dx is not None:
            g += dx
        return g


class TransformerStack(Module):
    """n_layers Pre-Norm or Post-Norm blocks, then (for Pre-Norm, by default) a final norm.

    Parameter names are those of ``torch.nn.TransformerEncoder(layer, n_layers,
    norm=LayerNorm(d_model))``: ``layers.<i>.<block names>``, then ``norm.weight`` and
    ``norm.bias``.

    Parameters
    ----------
    n_layers : int
        The number of blocks.
    d_model, n_heads, d_ff
        As for `PreNormBlock`.
    block : {"pre", "post"}, default "pre"
        `PreNormBlock` or `PostNormBlock`.
    final_norm : bool, optional
        Whether a norm follows the last block; default True for Pre-Norm (its residual
        stream is never normalised otherwise), False for Post-Norm.
    norm : {"layer", "rms"}, default "layer"
        The kind of every norm, the final one included.
    eps : float, default 1e-5
        eps of every norm.
    bias : bool, default True
        Biases of every Linear layer and LayerNorm.
    dtype : {numpy.float32, numpy.float64}, default numpy.float32
        The dtype of all parameters and activations.
    seed : int, numpy.random.SeedSequence or numpy.random.Generator, default 0
        Deterministic initialisation and dropout masks.
    **options
        Passed to every block: residual, dropout, causal, activation, alpha, gate.

    Raises
    ------
    TypeError, ValueError
        If an option is of the wrong type or out of range (the message names it).

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> model = nn.TransformerStack(2, 16, 2, block="pre", dropout=0.1, seed=0)
    >>> [name for name in model.params() if not name.startswith("layers.1.")][-4:]
    ['layers.0.norm2.weight', 'layers.0.norm2.bias', 'norm.weight', 'norm.bias']
    >>> x = np.ones((2, 4, 16), np.float32)
    >>> y = model.forward(x)
    >>> model.backward(np.ones_like(y)).shape
    (2, 4, 16)
    """

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int | None = None, *,
                 block: Literal["pre", "post"] = "pre", final_norm: bool | None = None,
                 norm: Literal["layer", "rms"] = "layer", eps: float = 1e-5,
                 bias: bool = True, dtype: DTypeLike = np.float32, seed: Seed = 0,
                 **options: Any) -> None:
        super().__init__()
        n_layers = _checks.positive_int(n_layers, "n_layers")
        cls = {"pre": PreNormBlock, "post": PostNormBlock}[
            _checks.one_of(block, "block", ("pre", "post"))]
        rng = init.generator(seed)
        self.layers = [
            self.add_module(f"layers.{i}", cls(d_model, n_heads, d_ff, norm=norm, eps=eps,
                                               bias=bias, dtype=dtype, seed=rng, **options))
            for i in range(n_layers)]
        if final_norm is None:
            final_norm = block == "pre"
        self.norm = (self.add_module("norm", _make_norm(norm, d_model, eps, bias, dtype))
                     if final_norm else None)

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        for layer in self.layers:
            x = layer.forward(x)
        return x if self.norm is None else self.norm.forward(x)

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        if self.norm is not None:
            dy = self.norm.backward(dy)
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy
