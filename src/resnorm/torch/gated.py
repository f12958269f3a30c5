"""The gated RMSNorm of hybrid Mamba models on CPU tensors: its torch.autograd.Function, its
functional form and the choice of path for each call (as resnorm.torch.functions chooses
for the norms).

    gate before the norm (norm_before_gate=False):  u = x * silu(gate),  y = u * rstd(u) * w
    norm before the gate (norm_before_gate=True):   y = x * rstd(x) * w * silu(gate)

rstd(v) = 1/sqrt(mean(v^2) + eps) over each group of group_size consecutive elements of a
row (group_size None: the whole row), each group with its slice of the weight.

Paths, cheapest first: no gradient wanted, resnorm.gated_rms_norm into a fresh tensor;
gradients wanted, GatedRMSNormFunction (resnorm's forward and backward kernels); a graph
being recorded (torch.compile, torch.jit.trace), the custom operator
resnorm::gated_rms_norm (a small call inside torch.compile: the float64 expression, as in
resnorm.torch.functions); inside torch.func transforms or a forward-mode AD level, the
Function through torch's full machinery (its vmap and jvp rules).  A backward asked to
build a graph returns resnorm.torch.composite's expressions carrying the kernel's values,
so double backward is exact.
"""
import operator

import torch

from . import _tensors as T
from . import composite, kernels, ops
from .functions import _NormFunction


def _kernel_backward(ctx, dy):
    return kernels.gated_rms_norm_backward(dy, ctx.cache)


class GatedRMSNormFunction(_NormFunction):
    """The gated RMSNorm: u = x * silu(gate), y = u * rstd(u) * w (norm_before_gate False),
    or y = x * rstd(x) * w * silu(gate) (True); rstd per group of group_size elements.

    ``GatedRMSNormFunction.apply(x, gate, weight, eps, group_size, norm_before_gate) ->
    (y, cache)``: x (..., D); gate None or of x's shape and dtype; weight (D,) or None;
    eps a positive float; group_size an int dividing D; cache is resnorm's
    GatedRMSNormCache (NumPy views of x, the gate and the weight, the float64 rstd of each
    group), what backward consumes.  resnorm.torch.gated_rms_norm checks the arguments and
    returns y alone.

    Backward (s = sigmoid(z), silu(z) = z s, silu'(z) = s (1 + z (1 - s)), J the RMSNorm's
    Jacobian of a group, J g = rstd (g - vn mean(g vn))): gate before the norm,
    du = J (dy w), dx = du silu(z), dgate = du x silu'(z), dw = sum_rows dy un; norm before
    the gate, da = dy silu(z), dx = J (da w), dgate = dy xn w silu'(z), dw = sum_rows da xn.
    NumPy reference: resnorm.reference.gated_rms_norm_forward / gated_rms_norm_backward.
    Supports double backward, forward-mode AD (jvp) and torch.func.vmap.
    """

    @classmethod
    def apply(cls, x, gate, *args):
        # a tensor made under inference_mode cannot be saved for backward: a normal copy
        # (as RMSNormFunction takes it; anything else goes on to the checks that name it)
        if isinstance(x, torch.Tensor) and x.is_inference():
            x = x.clone()
        if isinstance(gate, torch.Tensor) and gate.is_inference():
            gate = gate.clone()
        return super().apply(x, gate, *args)

    @staticmethod
    def forward(x, gate, weight, eps, group_size, norm_before_gate):
        return kernels.gated_rms_norm_forward(x, gate, weight, eps, group_size,
                                              norm_before_gate)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, gate, weight, eps, group_size, norm_before_gate = inputs
        ctx.cache, ctx.eps = output[1], eps
        ctx.group_size, ctx.norm_before_gate = group_size, norm_before_gate
        ctx.save_for_backward(x, gate, weight)
        if T.transforms_active():   # a jvp may follow
            ctx.save_for_forward(x, gate, weight)

    @staticmethod
    def backward(ctx, dy, _dcache):
        return composite.gated_gradients(ctx, dy, _kernel_backward)

    @staticmethod
    def jvp(ctx, dx, dgate, dweight, *_rest):
        x, gate, weight = ctx.saved_tensors
        return composite.gated_jvp(x, gate, weight, ctx.eps, ctx.group_size,
                                   ctx.norm_before_gate, dx, dgate, dweight), None

    @staticmethod
    def vmap(info, in_dims, x, gate, weight, eps, group_size, norm_before_gate):
        # the batch dimension becomes more rows (x and the gate expanded where only
        # another input is batched); a batched weight is applied with torch operations
        # after an unweighted norm, in float32 for 16-bit x, rounded once
        b = info.batch_size

        def batched(t, dim):
            return t.movedim(dim, 0) if dim is not None else t.expand(b, *t.shape)
        x_dim, gate_dim, weight_dim = in_dims[:3]
        x = batched(x, x_dim)
        if gate is not None:
            gate = batched(gate, gate_dim)
        if weight_dim is None:
            y, cache = GatedRMSNormFunction.apply(x, gate, weight, eps, group_size,
                                                  norm_before_gate)
        else:
            half = x.dtype in T.HALF_DTYPES
            wide = (lambda t: t.float()) if half else (lambda t: t)   # noqa: E731
            y, cache = GatedRMSNormFunction.apply(
                wide(x), None if gate is None else wide(gate), None, eps, group_size,
                norm_before_gate)
            w = weight.movedim(weight_dim, 0).reshape(
                (b,) + (1,) * (x.dim() - 2) + (x.shape[-1],))
            y = y * w
            y = y.to(x.dtype) if half else y
        return (y, cache), (0, None)


def checked_group_size(group_size, d):
    """group_size as an int dividing d, the row's size (None: d, one group per row)."""
    if group_size is None:
        return d
    try:
        gs = operator.index(group_size)
    except TypeError:
        raise TypeError(f"group_size must be None or an int, got "
                        f"{type(group_size).__name__}") from None
    if isinstance(group_size, bool) or gs <= 0 or d % gs:
        raise ValueError(f"group_size must be a positive divisor of the last axis "
                         f"({d}), got {group_size!r}")
    return gs


def checked_gate(gate, x):
    """None, or gate checked as a dense CPU tensor of x's shape and dtype."""
    return None if gate is None else T.partner(gate, "gate", x)


def gated_norm(x, gate, weight, eps, group_size, norm_before_gate):
    """One gated RMSNorm call on the cheapest path that computes it (see the module
    docstring); the arguments as gated_rms_norm takes them."""
    x = T.input_tensor(x)
    gate = checked_gate(gate, x)
    T.param_tensor(weight, "weight", x)
    eps = T.eps_for(eps, x)
    gs = checked_group_size(group_size, x.shape[-1])
    norm_before_gate = bool(norm_before_gate)
    if T.graph_capture():
        if T.records_expression(x):   # (as resnorm.torch.functions.norm)
            return composite.gated_norm_float64(x, gate, weight, eps, gs, norm_before_gate)
        return ops.gated_rms_norm(x, gate, weight, eps, gs, norm_before_gate)[0]
    if not (T.wants_grad(x, gate, weight) or T.transforms_active()):
        try:
            return kernels.gated_rms_norm(x, gate, weight, eps, gs, norm_before_gate)
        except T.NoStorage:
            pass   # a batched tensor outside torch.func: the Function's rules take it
    return GatedRMSNormFunction.apply(x, gate, weight, eps, gs, norm_before_gate)[0]


def gated_rms_norm(x, gate=None, weight=None, eps=1e-6, *, group_size=None,
                   norm_before_gate=False):
    """The gated RMSNorm of hybrid Mamba models, over the last axis of x (..., D), by
    groups of group_size consecutive elements:

    * norm_before_gate=False: u = x * silu(gate), y = u * rstd(u) * w (Hugging Face's
      MambaRMSNormGated of Mamba-2, Bamba, GraniteMoeHybrid, Zamba 2, Nemotron-H);
    * norm_before_gate=True: y = x * rstd(x) * w * silu(gate) (Qwen3-Next's
      Qwen3NextRMSNormGated; Falcon-H1's, with its config's default
      mamba_norm_before_gate=True);

    rstd(v) = 1/sqrt(mean(v^2) + eps) over each group, silu(z) = z * sigmoid(z).

    Differentiable (GatedRMSNormFunction) in x, the gate and the weight, also twice, and
    under torch.compile, torch.func.vmap and forward-mode AD.

    Parameters
    ----------
    x : torch.Tensor
        float32, float64, float16 or bfloat16 CPU tensor of shape (..., D); the 16-bit
        types are computed in float32 and rounded once.
    gate : torch.Tensor or None
        The gate logits z, of x's shape and dtype; None: no gate (an RMSNorm by groups).
    weight : torch.Tensor or None
        (D,) of x's dtype, or None (w = 1); float32 beside float16/bfloat16 x
        (torch.autocast): the float32 norm rounded once to x's dtype, the weight's
        gradient float32.
    eps : float or None
        Added to each group's mean square; None means torch.finfo(x.dtype).eps
        (float32's for float16 and bfloat16).
    group_size : int or None
        The size of the groups a row is normalised by, a divisor of D (Mamba-2's
        D / n_groups); None: D, the whole row.
    norm_before_gate : bool
        Apply the gate after the norm (True) instead of before it (False).

    Returns
    -------
    torch.Tensor
        y, a new tensor of x's shape and dtype.

    Raises
    ------
    TypeError
        x, gate or weight not a tensor, not on the CPU, not dense, or of another dtype.
    ValueError
        gate or weight of the wrong shape, group_size not a divisor of D, eps not finite
        and > 0.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> x = torch.tensor([[3.0, 4.0, 1.0, 1.0]])
    >>> rt.gated_rms_norm(x, eps=1e-12, group_size=2)
    tensor([[0.8485, 1.1314, 1.0000, 1.0000]])
    >>> gate = torch.full((1, 4), 50.0)      # silu(50) = 50: the gate scales by 50
    >>> rt.gated_rms_norm(x, gate, eps=1e-12, group_size=2)    # ... before the norm
    tensor([[0.8485, 1.1314, 1.0000, 1.0000]])
    >>> rt.gated_rms_norm(x, gate, eps=1e-12, group_size=2, norm_before_gate=True)
    tensor([[42.4264, 56.5685, 50.0000, 50.0000]])

    NumPy reference: resnorm.reference.gated_rms_norm_forward.
    """
    return gated_norm(x, gate, weight, eps, group_size, norm_before_gate)
