"""nn.Modules for resnorm's residual kernels: the fused add + norm (Pre-Norm, which returns
the residual stream too, and Post-Norm), and the scaled and gated residuals.

The fused modules hold a norm's parameters under torch's names (weight, and LayerNorm's
bias, of normalized_shape), so ``load_state_dict`` takes the state of a torch.nn.RMSNorm /
LayerNorm of the same shape.  Their forward takes (x, residual):

    Pre-Norm   (y, h) = AddRMSNorm(...)(x, residual):  h = residual + alpha * dropout(x),
               y = rms_norm(h); h is the new residual stream, y the next sublayer's input.
    Post-Norm  y = AddRMSNormPost(...)(x, residual) = rms_norm(residual + alpha * dropout(x)).

Dropout (p > 0) is active in training mode only.  Each training call draws its mask's seed
from torch's default generator, as torch's own dropout draws its mask, so
torch.manual_seed makes a run repeatable, and torch.utils.checkpoint, which restores the
generator before it recomputes a forward, recomputes the same mask.  The seed stays a
0-d int64 tensor (never read with .item() in the module): torch.compile records the draw
and the dropout in its graph, without a break (a compiled graph draws its random numbers
its own way, so its masks are not the eager ones, as for torch's dropout).
"""
import torch
from torch import nn

from .elementwise import gated_residual, scaled_residual
from .modules import GatedRMSNorm, GemmaRMSNorm, LayerNorm, RMSNorm
from .residual import fused

_SEEDS = 2 ** 62   # dropout seeds are drawn in [0, _SEEDS)


class _AddNorm(nn.Module):
    """What the four fused modules share; layer and prenorm say which one it is."""
    layer = False
    prenorm = True

    def __init__(self, normalized_shape, eps, elementwise_affine, bias, zero_centered_weight,
                 alpha, p, device, dtype):
        super().__init__()
        if isinstance(normalized_shape, (tuple, list, torch.Size)):
            self.normalized_shape = tuple(normalized_shape)
        else:
            self.normalized_shape = (normalized_shape,)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.zero_centered_weight = bool(zero_centered_weight)
        self.alpha, self.p = alpha, p
        factory = {"device": device, "dtype": dtype}
        weight = bias_ = None
        if elementwise_affine:
            weight = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            if bias and self.layer:
                bias_ = nn.Parameter(torch.empty(self.normalized_shape, **factory))
        self.register_parameter("weight", weight)
        self.register_parameter("bias", bias_)
        self.reset_parameters()

    def reset_parameters(self):
        """weight = 1 (0 for a zero-centred weight: the gain 1 + 0), bias = 0."""
        with torch.no_grad():
            if self.weight is not None:
                self.weight.fill_(0.0 if self.zero_centered_weight else 1.0)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, x, residual):
        seed = None
        if self.training and self.p > 0:
            seed = torch.randint(0, _SEEDS, (), dtype=torch.int64)
        return fused(self.layer, self.prenorm, x, residual, self.weight, self.bias, self.eps,
                     self.normalized_shape, self.zero_centered_weight, self.alpha, self.p,
                     seed, self.training)

    def extra_repr(self):
        text = (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
        if self.alpha != 1.0:
            text += f", alpha={self.alpha}"
        if self.p:
            text += f", p={self.p}"
        if self.zero_centered_weight:
            text += ", zero_centered_weight=True"
        return text


class AddRMSNorm(_AddNorm):
    """Pre-Norm add + RMSNorm in one pass: forward(x, residual) -> (y, h) with
    h = residual + alpha * dropout(x, p), y = h * rstd * w, rstd = 1/sqrt(mean(h^2) + eps).

    Parameters
    ----------
    normalized_shape : int or tuple of int
        The normalised trailing axes (D, or several together), as for torch.nn.RMSNorm.
    eps : float or None
        None (the default) means torch.finfo(x.dtype).eps (float32's for float16
        and bfloat16), as in torch.
    elementwise_affine : bool
        Whether the module has a learnable weight (ones).
    zero_centered_weight : bool
        The gain is 1 + weight, and the weight starts at zeros (Gemma).
    alpha : float
        A fixed scale of the branch x.
    p : float
        Dropout probability of x in training mode; each such call draws its seed from
        torch's default generator (see resnorm.torch.residual_modules).
    device, dtype
        Of the weight (resnorm runs float32/float64 on the CPU).

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> norm = rt.AddRMSNorm(2, eps=1e-12)
    >>> y, h = norm(torch.ones(1, 2), torch.tensor([[2.0, 3.0]]))
    >>> h
    tensor([[3., 4.]], grad_fn=<AddRMSNormFunctionBackward>)
    >>> drop = rt.AddRMSNorm(4, p=0.5)
    >>> _ = torch.manual_seed(0)
    >>> y, h = drop(torch.ones(2, 4), torch.zeros(2, 4))
    >>> _ = torch.manual_seed(0)
    >>> torch.equal(drop(torch.ones(2, 4), torch.zeros(2, 4))[1], h)   # the same mask
    True

    NumPy reference: resnorm.reference.add_rms_norm_forward.
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, *,
                 zero_centered_weight=False, alpha=1.0, p=0.0, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, False, zero_centered_weight,
                         alpha, p, device, dtype)


class AddLayerNorm(_AddNorm):
    """Pre-Norm add + LayerNorm in one pass: forward(x, residual) -> (y, h) with
    h = residual + alpha * dropout(x, p), y = (h - mean) * rstd * w + b.

    Parameters
    ----------
    normalized_shape : int or tuple of int
        As for AddRMSNorm.
    eps : float
        Added to the (biased) variance.
    elementwise_affine, bias : bool
        Whether the module has a learnable weight (ones) and bias (zeros), as
        torch.nn.LayerNorm.
    zero_centered_weight, alpha, p, device, dtype
        As for AddRMSNorm.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> y, h = rt.AddLayerNorm(2, eps=1e-12)(torch.ones(1, 2), torch.tensor([[0.0, 2.0]]))
    >>> y
    tensor([[-1.,  1.]], grad_fn=<AddLayerNormFunctionBackward>)

    NumPy reference: resnorm.reference.add_layer_norm_forward.
    """
    layer = True

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, *,
                 zero_centered_weight=False, alpha=1.0, p=0.0, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, zero_centered_weight,
                         alpha, p, device, dtype)


class AddRMSNormPost(AddRMSNorm):
    """Post-Norm add + RMSNorm: forward(x, residual) -> y = rms_norm(residual + alpha *
    dropout(x, p)); the sum is not written (backward recomputes it).  Arguments as
    AddRMSNorm.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.AddRMSNormPost(2, eps=1e-12)(torch.ones(1, 2), torch.tensor([[2.0, 3.0]]))
    tensor([[0.8485, 1.1314]], grad_fn=<AddRMSNormPostFunctionBackward>)

    NumPy reference: resnorm.reference.add_rms_norm_post_forward.
    """
    prenorm = False


class AddLayerNormPost(AddLayerNorm):
    """Post-Norm add + LayerNorm (the original Transformer's): forward(x, residual) ->
    y = layer_norm(residual + alpha * dropout(x, p)).  Arguments as AddLayerNorm.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.AddLayerNormPost(2, eps=1e-12)(torch.ones(1, 2), torch.tensor([[0.0, 2.0]]))
    tensor([[-1.,  1.]], grad_fn=<AddLayerNormPostFunctionBackward>)

    NumPy reference: resnorm.reference.add_layer_norm_post_forward.
    """
    prenorm = False


class ScaledResidual(nn.Module):
    """Scaled residual: forward(x, F) -> x + alpha * F.

    Parameters
    ----------
    dim : int or None
        With learnable=True: None for one learnable scalar (ReZero-style), D for a
        per-channel vector over the last axis (LayerScale).
    alpha : float
        The fixed scale, or the learnable one's initial value (e.g. 0 for ReZero, 1e-5 or
        0.1 for LayerScale).
    learnable : bool
        Whether alpha is a parameter.
    device, dtype
        Of a learnable alpha.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> layer_scale = rt.ScaledResidual(2, alpha=0.5, learnable=True)
    >>> layer_scale(torch.ones(1, 2), torch.ones(1, 2))
    tensor([[1.5000, 1.5000]], grad_fn=<ScaledResidualFunctionBackward>)

    NumPy reference: resnorm.reference.scaled_residual_forward.
    """

    def __init__(self, dim=None, alpha=1.0, learnable=False, device=None, dtype=None):
        super().__init__()
        self.dim, self.learnable = dim, learnable
        if learnable:
            shape = () if dim is None else (dim,)
            self.alpha = nn.Parameter(torch.full(shape, float(alpha), device=device,
                                                 dtype=dtype))
        else:
            self.alpha = float(alpha)

    def forward(self, x, F):
        return scaled_residual(x, F, self.alpha)

    def extra_repr(self):
        if not self.learnable:
            return f"alpha={self.alpha}"
        return f"dim={self.dim}, learnable=True"


class GatedResidual(nn.Module):
    """Gated residual with a learnable gate per channel: forward(x, F) -> x + sigmoid(gate) * F.

    Parameters
    ----------
    dim : int
        D, the size of the last axis.
    gate : float
        The gate logits' initial value (0: sigmoid = 0.5).
    device, dtype
        Of the gate.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.GatedResidual(2)(torch.zeros(1, 2), torch.ones(1, 2))
    tensor([[0.5000, 0.5000]], grad_fn=<GatedResidualFunctionBackward>)

    NumPy reference: resnorm.reference.gated_residual_forward.
    """

    def __init__(self, dim, gate=0.0, device=None, dtype=None):
        super().__init__()
        self.gate = nn.Parameter(torch.full((dim,), float(gate), device=device, dtype=dtype))

    def forward(self, x, F):
        return gated_residual(x, F, self.gate)

    def extra_repr(self):
        return f"{self.gate.shape[0]}"


# resnorm.torch's own modules: patch() leaves them as they are
OWN_MODULES = (RMSNorm, GemmaRMSNorm, LayerNorm, GatedRMSNorm, AddRMSNorm, AddLayerNorm,
               AddRMSNormPost, AddLayerNormPost, ScaledResidual, GatedResidual)
