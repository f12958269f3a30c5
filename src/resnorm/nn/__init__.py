"""Transformer layers with explicit forward and backward, on resnorm's kernels.

No autograd: every module caches in forward exactly what its backward needs (in the spirit
of llm.c), and ``backward(dy)`` returns the input gradient and accumulates the parameter
gradients.  Parameter names and layouts follow torch.nn.TransformerEncoderLayer
(batch_first=True); see docs/blocks.md.
"""
from .activations import GELU
from .attention import CausalSelfAttention
from .blocks import PostNormBlock, PreNormBlock
from .deepnorm import DeepNormBlock, deepnorm_constants, deepnorm_init
from .dropout import Dropout
from .feedforward import FeedForward
from .linear import Linear
from .losses import mse_loss
from .module import Module
from .norms import LayerNorm, RMSNorm
from .optim import SGD, Adam
from .parallel import ParallelBlock
from .sandwich import SandwichBlock
from .stack import TransformerStack

__all__ = [
    "Adam",
    "CausalSelfAttention",
    "DeepNormBlock",
    "Dropout",
    "FeedForward",
    "GELU",
    "LayerNorm",
    "Linear",
    "Module",
    "ParallelBlock",
    "PostNormBlock",
    "PreNormBlock",
    "RMSNorm",
    "SGD",
    "SandwichBlock",
    "TransformerStack",
    "deepnorm_constants",
    "deepnorm_init",
    "mse_loss",
]
