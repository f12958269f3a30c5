"""torch tensors in, kernel-ready NumPy views out: the argument checks of resnorm.torch.

Same error style as resnorm._checks (which must never import torch): TypeError for a wrong
kind, device or dtype, ValueError for a wrong value or shape; messages name the argument.
A CPU tensor and its ``.numpy()`` view share memory, so the kernels read the tensor's own
storage and write into tensors allocated here with torch.empty: no copies, except one
``.contiguous()`` copy of an input that is not contiguous.
"""
import numbers

import numpy as np
import torch

from .._parallel import streams, threads_for
from ..norms import _rows

FLOAT_DTYPES = (torch.float32, torch.float64)
NUMPY_DTYPE = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


def float_tensor(t, name):
    """t, checked: a contiguous float32/float64 CPU tensor with a non-empty last axis.

    A non-contiguous tensor is copied once by .contiguous(); a contiguous one is returned
    as is (the kernels then read its storage in place).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"{name} must be a CPU tensor (resnorm kernels run on the CPU), "
                        f"got a tensor on device '{t.device}'")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype torch.float32 or torch.float64, got {t.dtype}")
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one axis (shape (..., D)), got a scalar")
    if t.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last axis, got shape {tuple(t.shape)}")
    return t.contiguous()


def optional_param(p, name, like):
    """None, or p checked as a (D,) tensor of like's dtype (D = like's last axis)."""
    if p is None:
        return None
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(p).__name__}")
    if p.device.type != "cpu":
        raise TypeError(f"{name} must be a CPU tensor, got a tensor on device '{p.device}'")
    if p.dtype != like.dtype:
        raise TypeError(f"{name} must have the input's dtype {like.dtype}, got {p.dtype}")
    if tuple(p.shape) != (like.shape[-1],):
        raise ValueError(f"{name} must have shape ({like.shape[-1]},) (the input's last "
                         f"axis), got {tuple(p.shape)}")
    return p.contiguous()


def partner(t, name, x):
    """t checked as a CPU tensor of exactly x's shape and dtype (the residual of an add)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu" or t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense CPU tensor, got {t.layout} on '{t.device}'")
    if t.dtype != x.dtype:
        raise TypeError(f"{name} must have the input's dtype {x.dtype}, got {t.dtype}")
    if t.shape != x.shape:
        raise ValueError(f"{name} must have the input's shape {tuple(x.shape)}, "
                         f"got {tuple(t.shape)}")
    return t.contiguous()


def scale(alpha, x):
    """A residual scale for resnorm.residual: a real number as is (fixed), or a tensor alpha
    of shape () or (D,) checked and given as a NumPy view (its shape and dtype are then
    checked by resnorm._checks.residual_scale)."""
    if not isinstance(alpha, torch.Tensor):
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
            raise TypeError(f"alpha must be a real number or a torch.Tensor of shape () or "
                            f"({x.shape[-1]},), got {type(alpha).__name__}")
        return alpha
    if alpha.device.type != "cpu":
        raise TypeError(f"alpha must be a CPU tensor, got a tensor on device '{alpha.device}'")
    if alpha.dtype != x.dtype:
        raise TypeError(f"alpha must have the input's dtype {x.dtype}, got {alpha.dtype}")
    return alpha.detach().contiguous().numpy()


def last_axis(x, normalized_shape):
    """Checks that x's last axis has the module's normalized_shape (a 1-tuple)."""
    if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[-1] != normalized_shape[0]:
        raise ValueError(f"input must have shape (..., {normalized_shape[0]}) for "
                         f"normalized_shape={normalized_shape}, got {tuple(x.shape)}")


def rows(t):
    """The (N, D) NumPy view of a contiguous tensor's storage (None stays None)."""
    return None if t is None else _rows(t.detach().numpy())


def vector(t):
    """The (D,) NumPy view of a contiguous vector tensor (None stays None)."""
    return None if t is None else t.detach().numpy()


def new_like(x):
    """A fresh contiguous tensor with x's shape and dtype (the kernel's output buffer)."""
    return torch.empty(x.shape, dtype=x.dtype)


def n_rows(x):
    """Number of rows N of x seen as (N, D)."""
    return x.numel() // x.shape[-1]


def row_stat(x):
    """A fresh float64 tensor with one value per row of x (rstd, mean)."""
    return torch.empty(n_rows(x), dtype=torch.float64)


def launch(out):
    """(n_threads, stream) for a kernel writing tensor out: threads follow
    torch.get_num_threads(), so torch.set_num_threads sets both libraries' thread count."""
    return threads_for(torch.get_num_threads(), out.numel()), streams(out.numel() * out.element_size())
