"""A stack of Transformer blocks of one type, with an optional final norm."""
from __future__ import annotations

from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _checks
from . import init
from ._block import NormKind, block_doc, make_norm
from .blocks import PostNormBlock, PreNormBlock
from .deepnorm import DeepNormBlock
from .init import Seed
from .module import Module
from .parallel import ParallelBlock
from .sandwich import SandwichBlock

BLOCK_TYPES = {"pre": PreNormBlock, "post": PostNormBlock, "parallel": ParallelBlock,
               "deepnorm": DeepNormBlock, "sandwich": SandwichBlock}
# Block types whose residual stream is never normalised inside the blocks: they need a
# final norm (the default of final_norm=None)
UNNORMALISED_STREAM = ("pre", "parallel", "sandwich")


@block_doc
class TransformerStack(Module):
    """n_layers blocks of one type, then (by default for the block types that need it) a
    final norm.

    Parameter names are those of ``torch.nn.TransformerEncoder(layer, n_layers,
    norm=LayerNorm(d_model))``: ``layers.<i>.<block names>``, then ``norm.weight`` and
    ``norm.bias``.  Backward runs the final norm's and the blocks' backward in reverse
    order and returns dx.

    Parameters
    ----------
    n_layers : int
        The number of blocks; with ``block="deepnorm"`` also the depth N that sets the
        blocks' alpha and beta.
    block : {"pre", "post", "parallel", "deepnorm", "sandwich"}, default "pre"
        `PreNormBlock`, `PostNormBlock`, `ParallelBlock`, `DeepNormBlock` or
        `SandwichBlock`.
    final_norm : bool, optional
        Whether a norm follows the last block; default True for the block types whose
        residual stream is never normalised ("pre", "parallel", "sandwich"), False for
        "post" and "deepnorm".
    norm : {"layer", "rms"}, default "layer"
        The kind of every norm, the final one included.
    **options
        Passed to every block, as its type takes them: residual, dropout, attn_dropout,
        causal, activation, alpha, gate; shared_norm for "parallel"; alpha and beta for
        "deepnorm" (which has no residual or gate option).

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
    >>> post = nn.TransformerStack(2, 16, 2, block="post", norm="rms", seed=0)
    >>> post.norm is None, type(post.layers[1]).__name__
    (True, 'PostNormBlock')
    """

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int | None = None, *,
                 block: Literal["pre", "post", "parallel", "deepnorm", "sandwich"] = "pre",
                 final_norm: bool | None = None, norm: NormKind = "layer", eps: float = 1e-5,
                 bias: bool = True, dtype: DTypeLike = np.float32, seed: Seed = 0,
                 **options: Any) -> None:
        super().__init__()
        n_layers = _checks.positive_int(n_layers, "n_layers")
        cls = BLOCK_TYPES[_checks.one_of(block, "block", tuple(BLOCK_TYPES))]
        if block == "deepnorm":
            options["n_layers"] = n_layers
        rng = init.generator(seed)
        self.layers = [
            self.add_module(f"layers.{i}", cls(d_model, n_heads, d_ff, norm=norm, eps=eps,
                                               bias=bias, dtype=dtype, seed=rng, **options))
            for i in range(n_layers)]
        if final_norm is None:
            final_norm = block in UNNORMALISED_STREAM
        self.norm = (self.add_module("norm", make_norm(norm, d_model, eps, bias, dtype))
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
