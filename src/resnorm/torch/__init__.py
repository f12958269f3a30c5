"""resnorm.torch: resnorm's CPU kernels inside PyTorch (optional: resnorm[torch]).

Imported only on request (``import resnorm.torch``); the rest of resnorm never imports
torch.  Guide: docs/torch.md.

* rms_norm, layer_norm: differentiable functions (also twice, under torch.compile,
  torch.func.vmap / grad / jvp and forward-mode AD); RMSNormFunction, LayerNormFunction:
  their torch.autograd.Functions.
* RMSNorm, LayerNorm: drop-in subclasses of torch.nn.RMSNorm / torch.nn.LayerNorm.
* add_rms_norm, add_layer_norm, dropout (AddRMSNormFunction, AddLayerNormFunction,
  DropoutFunction): fused Pre-Norm residual add (with dropout) + norm returning (y, h),
  and dropout.
* patch(model): switch a model's norm layers (torch's, and the Llama / Gemma / T5 style
  norms of Hugging Face models, recognised by what they compute) to resnorm, in place;
  returns a reversible Patch (undo(), or use it as a context manager).
* The resnorm:: custom operators (resnorm.torch.ops) are registered on import: what
  torch.compile, torch.jit.trace and TorchScript record.
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
