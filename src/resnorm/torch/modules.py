"""Drop-in nn.Modules: torch.nn.RMSNorm / torch.nn.LayerNorm with resnorm's kernels.

Each is a subclass of torch's own module that only replaces forward, so the constructor
arguments, parameters, state_dict keys, reset_parameters, repr and isinstance checks are
torch's: ``model.load_state_dict`` works unchanged in both directions.

Supported: normalized_shape over the last axis only (an int or a 1-tuple), float32/float64
CPU tensors.  A multi-axis normalized_shape raises ValueError at construction; CUDA tensors
and other dtypes raise TypeError in forward.
"""
import torch
from torch import nn

from . import _tensors
from .functions import LayerNormFunction, RMSNormFunction


def unsupported_reason(module):
    """Why resnorm cannot run this norm module's configuration, or None when it can."""
    if len(module.normalized_shape) != 1:
        return (f"normalized_shape={module.normalized_shape} spans "
                f"{len(module.normalized_shape)} axes; resnorm normalises over the last "
                f"axis only (normalized_shape an int or a 1-tuple)")
    for name, p in module.named_parameters(recurse=False):
        if p.device.type != "cpu" or p.dtype not in _tensors.FLOAT_DTYPES:
            return (f"{name} is a {p.dtype} tensor on '{p.device}'; resnorm needs float32 "
                    f"or float64 on the CPU")
    return None


def _check_shape(module):
    if len(module.normalized_shape) != 1:
        raise ValueError(unsupported_reason(module))


class RMSNorm(nn.RMSNorm):
    """torch.nn.RMSNorm computed by resnorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).

    Same arguments as torch.nn.RMSNorm; eps=None means torch.finfo(x.dtype).eps, as in
    torch.  normalized_shape must be an int or a 1-tuple (the last axis).
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        _check_shape(self)

    def forward(self, x):
        _tensors.last_axis(x, self.normalized_shape)
        eps = self.eps
        if eps is None and isinstance(x, torch.Tensor) and x.is_floating_point():
            eps = torch.finfo(x.dtype).eps
        return RMSNormFunction.apply(x, self.weight, eps)


class LayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm computed by resnorm: y = (x - mean) * rstd * w + b.

    Same arguments as torch.nn.LayerNorm.  normalized_shape must be an int or a 1-tuple.
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        _check_shape(self)

    def forward(self, x):
        _tensors.last_axis(x, self.normalized_shape)
        return LayerNormFunction.apply(x, self.weight, self.bias, self.eps)
