"""resnorm: fast, honest CPU kernels for the pieces that hold a deep Transformer together."""
from . import reference
from ._runtime import build_flags, openmp_enabled, simd_level
from ._runtime import get_max_threads as get_num_threads
from .explain import explain
from .norms import (
    LayerNormCache,
    RMSNormCache,
    layer_norm,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm,
    rms_norm_backward,
    rms_norm_forward,
)

__version__ = "0.1.0"

__all__ = [
    "LayerNormCache",
    "RMSNormCache",
    "build_flags",
    "explain",
    "get_num_threads",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "openmp_enabled",
    "reference",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
    "simd_level",
]
