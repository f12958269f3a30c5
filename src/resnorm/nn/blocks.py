"""Pre-Norm and Post-Norm Transformer encoder blocks, and a stack of them.

Pre-Norm:   u = x + Dropout(Attn(Norm1(x)));   y = u + Dropout(FFN(Norm2(u)))
Post-Norm:  u = Norm1(x + Dropout(Attn(x)));   y = Norm2(u + Dropout(FFN(u)))

Parameter names and layouts are those of torch.nn.TransformerEncoderLayer(batch_first=True)
(and of torch.nn.TransformerEncoder for the stack): docs/blocks.md has the table.
"""
import numpy as np

from .. import _checks
from . import init
from ._residual import (Residual, post_add_norm_backward, post_add_norm_forward,
                        pre_add_norm_backward, pre_add_norm_forward)
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


class _Block(Module):
    """What both blocks share: sublayers, norms, residual connections, options."""

    def __init__(self, d_model, n_heads, d_ff=None, *, norm="layer", residual="plain",
                 dropout=0.0, causal=True, activation="gelu", eps=1e-5, bias=True, alpha=1.0,
                 gate=0.0, dtype=np.float32, seed=0):
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
        self.norm1 = self.add_module("norm1", make_norm(norm, d_model, eps, bias, dtype))
        self.norm2 = self.add_module("norm2", make_norm(norm, d_model, eps, bias, dtype))
        seeds = init.child_seeds(rng, 2)
        self.res1, self.res2 = (
            self.add_module(name, Residual(residual, d_model, p=dropout, alpha=alpha,
                                           gate=gate, dtype=dtype, seed=s))
            for name, s in zip(("res1", "res2"), seeds))

    def _input(self, x):
        return _checks.module_input(x, "x", self.dtype, self.d_model, ndim=3)


class PreNormBlock(_Block):
    """u = x + Dropout(Attn(Norm1(x)));  y = u + Dropout(FFN(Norm2(u))).

    Options: norm "layer" | "rms"; residual "plain" | "scaled" | "gated" | "none" (see
    resnorm.nn._residual.Residual); dropout rate on both residual branches; causal mask;
    activation "gelu" (erf) | "gelu_tanh"; eps of both norms; bias on every Linear and
    LayerNorm; alpha / gate: initial residual scale / gate logit.  d_ff defaults to 4*d_model.
    Backward returns dx and accumulates every parameter gradient.
    NumPy reference: resnorm.nn.reference.pre_norm_block.
    """

    def forward(self, x):
        x = self._input(x)
        a = self.self_attn.forward(self.norm1.forward(x))
        n2, u = pre_add_norm_forward(self.res1, self.norm2, x, a)
        return self.res2.forward(u, self.ffn.forward(n2))

    def backward(self, dy):
        du, df = self.res2.backward(dy)
        dx, da = pre_add_norm_backward(self.res1, self.norm2, self.ffn.backward(df), du)
        g = self.norm1.backward(self.self_attn.backward(da))   # fresh: safe to add into
        if dx is not None:
            g += dx
        return g


class PostNormBlock(_Block):
    """u = Norm1(x + Dropout(Attn(x)));  y = Norm2(u + Dropout(FFN(u))).

    Same options as PreNormBlock.   NumPy reference: resnorm.nn.reference.post_norm_block.
    """

    def forward(self, x):
        x = self._input(x)
        u = post_add_norm_forward(self.res1, self.norm1, x, self.self_attn.forward(x))
        return post_add_norm_forward(self.res2, self.norm2, u, self.ffn.forward(u))

    def backward(self, dy):
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
    """n_layers blocks, then (Pre-Norm by default) a final norm.

    block: "pre" (PreNormBlock) or "post" (PostNormBlock).  final_norm: None = True for
    Pre-Norm (its residual stream is never normalised otherwise), False for Post-Norm.
    Other keyword options go to every block.  Names as torch.nn.TransformerEncoder:
    layers.<i>.<block names>, norm.weight / norm.bias.
    """

    def __init__(self, n_layers, d_model, n_heads, d_ff=None, *, block="pre", final_norm=None,
                 norm="layer", eps=1e-5, bias=True, dtype=np.float32, seed=0, **options):
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
        self.norm = (self.add_module("norm", make_norm(norm, d_model, eps, bias, dtype))
                     if final_norm else None)

    def forward(self, x):
        for layer in self.layers:
            x = layer.forward(x)
        return x if self.norm is None else self.norm.forward(x)

    def backward(self, dy):
        if self.norm is not None:
            dy = self.norm.backward(dy)
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy
