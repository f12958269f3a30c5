"""resnorm.torch: resnorm's CPU kernels inside PyTorch (optional: resnorm[torch]).

Imported only on request (``import resnorm.torch``); the rest of resnorm never imports
torch.  Guide: docs/torch.md.

* rms_norm, layer_norm: differentiable functions (also twice, under torch.compile,
  torch.func.vmap / grad / jvp and forward-mode AD), over the last axis or the trailing
  axes of normalized_shape, with an optional zero-centred weight; RMSNormFunction,
  LayerNormFunction: their torch.autograd.Functions.
* RMSNorm, LayerNorm: drop-in subclasses of torch.nn.RMSNorm / torch.nn.LayerNorm;
  GemmaRMSNorm: Gemma's (1 + w) RMSNorm, which loads Gemma's weights.
* gated_rms_norm (GatedRMSNormFunction) and the module GatedRMSNorm: the gated RMSNorm of
  hybrid Mamba models (x * silu(gate) normalised, or the norm times silu(gate)), by
  groups of a row; the module has forward(hidden_states, gate=None) and the state_dict of
  Hugging Face's MambaRMSNormGated.
* add_rms_norm, add_layer_norm (Pre-Norm, returning (y, h)), add_rms_norm_post,
  add_layer_norm_post (Post-Norm), dropout, and their Functions: the fused residual add
  (with dropout) + norm, and dropout; AddRMSNorm, AddLayerNorm, AddRMSNormPost,
  AddLayerNormPost: the same as modules.
* scaled_residual, gated_residual (ScaledResidualFunction, GatedResidualFunction) and the
  modules ScaledResidual (fixed, learnable scalar, LayerScale), GatedResidual.
* patch(model): switch a model's norm layers (torch's, and the Llama / Gemma / T5 style
  norms of Hugging Face models, recognised by what they compute, over one or several
  axes, and the gated RMSNorms of their hybrid Mamba models) to resnorm, in place;
  returns a reversible Patch (undo(), or use it as a context manager).
* The resnorm:: custom operators (resnorm.torch.ops) are registered on import: what
  torch.compile, torch.jit.trace and TorchScript record.
"""
import torch

if not hasattr(torch.nn, "RMSNorm"):
    raise ImportError(f"resnorm.torch needs torch>=2.4 (for torch.nn.RMSNorm); "
                      f"found torch {torch.__version__}")

from . import ops  # noqa: E402,F401  (registers the resnorm:: custom operators)
from .elementwise import (  # noqa: E402
    GatedResidualFunction,
    ScaledResidualFunction,
    gated_residual,
    scaled_residual,
)
from .functions import LayerNormFunction, RMSNormFunction, layer_norm, rms_norm  # noqa: E402
from .gated import GatedRMSNormFunction, gated_rms_norm  # noqa: E402
from .modules import GatedRMSNorm, GemmaRMSNorm, LayerNorm, RMSNorm  # noqa: E402
from .patch import Patch, patch  # noqa: E402
from .residual import (  # noqa: E402
    AddLayerNormFunction,
    AddLayerNormPostFunction,
    AddRMSNormFunction,
    AddRMSNormPostFunction,
    DropoutFunction,
    add_layer_norm,
    add_layer_norm_post,
    add_rms_norm,
    add_rms_norm_post,
    dropout,
)
from .residual_modules import (  # noqa: E402
    AddLayerNorm,
    AddLayerNormPost,
    AddRMSNorm,
    AddRMSNormPost,
    GatedResidual,
    ScaledResidual,
)

__all__ = [
    "AddLayerNorm",
    "AddLayerNormFunction",
    "AddLayerNormPost",
    "AddLayerNormPostFunction",
    "AddRMSNorm",
    "AddRMSNormFunction",
    "AddRMSNormPost",
    "AddRMSNormPostFunction",
    "DropoutFunction",
    "GatedRMSNorm",
    "GatedRMSNormFunction",
    "GatedResidual",
    "GatedResidualFunction",
    "GemmaRMSNorm",
    "LayerNorm",
    "LayerNormFunction",
    "Patch",
    "RMSNorm",
    "RMSNormFunction",
    "ScaledResidual",
    "ScaledResidualFunction",
    "add_layer_norm",
    "add_layer_norm_post",
    "add_rms_norm",
    "add_rms_norm_post",
    "dropout",
    "gated_residual",
    "gated_rms_norm",
    "layer_norm",
    "patch",
    "rms_norm",
    "scaled_residual",
]
