"""A stack of Transformer blocks of one type, with an optional final norm."""
import numpy as np

from .. import _checks
from . import init
from ._block import make_norm
from .blocks import PostNormBlock, PreNormBlock
from .deepnorm import DeepNormBlock
from .module import Module
from .parallel import ParallelBlock
from .sandwich import SandwichBlock

BLOCK_TYPES = {"pre": PreNormBlock, "post": PostNormBlock, "parallel": ParallelBlock,
               "deepnorm": DeepNormBlock, "sandwich": SandwichBlock}
# Block types whose residual stream is never normalised inside the blocks: they need a
# final norm (the default of final_norm=None)
UNNORMALISED_STREAM = ("pre", "parallel", "sandwich")


class TransformerStack(Module):
    """n_layers blocks, then (by default for the block types that need it) a final norm.

    block: "pre" (PreNormBlock), "post" (PostNormBlock), "parallel" (ParallelBlock),
    "deepnorm" (DeepNormBlock, whose alpha and beta come from n_layers) or "sandwich"
    (SandwichBlock).  final_norm: None = True for the blocks whose residual stream is
    never normalised (pre, parallel, sandwich), False for post and deepnorm.
    Other keyword options go to every block.  Names as torch.nn.TransformerEncoder:
    layers.<i>.<block names>, norm.weight / norm.bias.
    """

    def __init__(self, n_layers, d_model, n_heads, d_ff=None, *, block="pre", final_norm=None,
                 norm="layer", eps=1e-5, bias=True, dtype=np.float32, seed=0, **options):
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
