"""resnorm.torch: resnorm's CPU kernels inside PyTorch autograd (optional: resnorm[torch]).

Imported only on request (``import resnorm.torch``); the rest of resnorm never imports
torch.  Guide: docs/torch.md.

* RMSNormFunction, LayerNormFunction: torch.autograd.Functions; rms_norm, layer_norm: the
  functional forms.
* RMSNorm, LayerNorm: drop-in subclasses of torch.nn.RMSNorm / torch.nn.LayerNorm.
* AddRMSNormFunction, AddLayerNormFunction, DropoutFunction; add_rms_norm, add_layer_norm,
  dropout: fused Pre-Norm residual add (with dropout) + norm returning (y, h), and dropout.
* patch(model): switch a model's torch norms to resnorm's in place; returns a reversible
  Patch (undo(), or use it as a context manager).
"""
import torch

if not hasattr(torch.nn, "RMSNorm"):
    raise ImportError(f"resnorm.torch needs torch>=2.4 (for torch.nn.RMSNorm); "
                      f"found torch {torch.__version__}")

from . import ops  # noqa: E402,F401  (registers the resnorm:: custom operators)
from .functions import LayerNormFunction, RMSNormFunction, layer_norm, rms_norm  # noqa: E402
from .modules import LayerNorm, RMSNorm  # noqa: E402
from .patch import Patch, patch  # noqa: E402
from .residual import (  # noqa: E402
    AddLayerNormFunction,
    AddRMSNormFunction,
    DropoutFunction,
    add_layer_norm,
    add_rms_norm,
    dropout,
)

__all__ = [
    "AddLayerNormFunction",
    "AddRMSNormFunction",
    "DropoutFunction",
    "LayerNorm",
    "LayerNormFunction",
    "Patch",
    "RMSNorm",
    "RMSNormFunction",
    "add_layer_norm",
    "add_rms_norm",
    "dropout",
    "layer_norm",
    "patch",
    "rms_norm",
]
