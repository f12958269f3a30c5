"""resnorm's norms (the gated RMSNorm too) and dropout as torch custom operators
(torch.library.custom_op).

What torch.compile, torch.jit.trace and TorchScript call: an operator is one opaque node in
their graphs, so ``torch.compile(model, fullgraph=True)`` compiles a patched model without a
graph break from resnorm, and inductor still compiles everything around it.  Each operator
has a fake (meta) implementation giving its outputs' shapes and dtypes, and an autograd
formula (register_autograd) whose backward is the matching backward operator.  Eager code
does not go through these operators (the dispatcher costs more than a small norm): it calls
resnorm.torch.kernels directly (resnorm.torch.functions).

    resnorm::rms_norm(x, weight?, eps?, axes=1, zero_centered=False) -> (y, rstd)
    resnorm::rms_norm_backward(dy, x, weight?, rstd, axes=1, zero_centered=False)
        -> [dx, dweight (with a weight)]
    resnorm::layer_norm(x, weight?, bias?, eps?, axes=1, zero_centered=False) -> (y, mean, rstd)
    resnorm::layer_norm_backward(dy, x, weight?, has_bias, mean, rstd, axes=1,
                                 zero_centered=False) -> [dx, dweight?, dbias?]
    resnorm::gated_rms_norm(x, gate?, weight?, eps?, group_size, norm_before_gate=False)
        -> (y, rstd)
    resnorm::gated_rms_norm_backward(dy, x, gate?, weight?, rstd, group_size,
                                     norm_before_gate=False) -> [dx, dgate?, dweight?]
    resnorm::dropout(x, p, seed) -> y      (its own backward: the same mask on dy)
    resnorm::seeded_dropout(x, p, seed) -> (y, seed)   (seed a 0-d int64 tensor, read
        when the operator runs, so that a graph takes a seed that changes between calls, a
        module's buffer; the second output is the copy of it that backward reads)

eps None: torch.finfo(dtype).eps (float32's for the 16-bit dtypes); axes: how many trailing
axes of x a row spans (weight and bias have their shape); zero_centered: the gain is 1 + w.
The gated RMSNorm's group_size is an int dividing x's last axis (its rstd: one value per
group of each row).

A backward asked to build a graph (create_graph=True) returns resnorm.torch.composite's
differentiable expressions, carrying the values of the backward kernel.
"""
import torch

from . import _tensors as T
from . import composite, kernels

_SEED_WRAP = 2 ** 64   # dropout seeds are in [0, 2**64); operator ints are signed 64-bit


def _options(x, weight, bias, axes, zero_centered):
    """Checks the parameters against x's last `axes` axes; the options as resnorm takes
    them."""
    if not 1 <= axes <= x.dim():
        raise ValueError(f"axes must be in [1, {x.dim()}] (x's normalised trailing axes), "
                         f"got {axes}")
    row = tuple(x.shape[x.dim() - axes:])
    T.param_tensor(weight, "weight", x, row)
    T.param_tensor(bias, "bias", x, row)
    return dict(normalized_shape=T.normalized_arg(row), zero_centered_weight=zero_centered)


def _setup_options(ctx, inputs, n):
    """ctx.axes and ctx.zero_centered from an operator's inputs (n before them)."""
    ctx.axes, ctx.zero_centered = inputs[n], inputs[n + 1]


# --------------------------------------------------------------------------- RMSNorm

@torch.library.custom_op("resnorm::rms_norm", mutates_args=(), device_types="cpu")
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float | None, axes: int = 1,
             zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x * rstd * w and rstd (float64, one value per row); eps None: the dtype's."""
    options = _options(T.input_tensor(x), weight, None, axes, zero_centered)
    y, cache = kernels.rms_norm_forward(x, weight, T.eps_for(eps, x), **options)
    return y, T.tensor(cache.rstd)


@rms_norm.register_fake
def _(x, weight, eps, axes=1, zero_centered=False):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty((T.row_count(x, axes),), dtype=torch.float64))


@torch.library.custom_op("resnorm::rms_norm_backward", mutates_args=(), device_types="cpu")
def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                      rstd: torch.Tensor, axes: int = 1,
                      zero_centered: bool = False) -> list[torch.Tensor]:
    """[dx] or [dx, dweight]."""
    cache = kernels.rms_norm_cache(x, weight, rstd, axes, zero_centered)
    dx, dw, _ = kernels.rms_norm_backward(dy, cache)
    return [dx] if dw is None else [dx, dw]


@rms_norm_backward.register_fake
def _(dy, x, weight, rstd, axes=1, zero_centered=False):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    return [dx] if weight is None else [dx, torch.empty_like(weight)]


def _rms_setup(ctx, inputs, output):
    x, weight, eps = inputs[:3]
    ctx.eps, ctx.has_bias = T.eps_for(eps, x), False
    _setup_options(ctx, inputs, 3)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, weight, output[1])


def _rms_kernel_backward(ctx, dy):
    x, weight, rstd = ctx.saved_tensors
    grads = rms_norm_backward(dy, x, weight, rstd, ctx.axes, ctx.zero_centered)
    return grads[0], (grads[1] if len(grads) > 1 else None), None


def _rms_backward(ctx, dy, _drstd):
    return composite.gradients(ctx, dy, False, _rms_kernel_backward)


rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


# --------------------------------------------------------------------------- LayerNorm

@torch.library.custom_op("resnorm::layer_norm", mutates_args=(), device_types="cpu")
def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float | None, axes: int = 1, zero_centered: bool = False) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = (x - mean) * rstd * w + b, mean and rstd (float64, one value per row)."""
    options = _options(T.input_tensor(x), weight, bias, axes, zero_centered)
    y, cache = kernels.layer_norm_forward(x, weight, bias, T.eps_for(eps, x), **options)
    return y, T.tensor(cache.mean), T.tensor(cache.rstd)


@layer_norm.register_fake
def _(x, weight, bias, eps, axes=1, zero_centered=False):
    stat = x.new_empty((T.row_count(x, axes),), dtype=torch.float64)
    return (torch.empty_like(x, memory_format=torch.contiguous_format), stat,
            torch.empty_like(stat))


@torch.library.custom_op("resnorm::layer_norm_backward", mutates_args=(), device_types="cpu")
def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                        has_bias: bool, mean: torch.Tensor, rstd: torch.Tensor, axes: int = 1,
                        zero_centered: bool = False, mixed: bool = False) -> list[torch.Tensor]:
    """[dx], then dweight (with a weight), then dbias (with a bias); mixed: float32
    parameters beside 16-bit x (their gradients float32)."""
    cache = kernels.layer_norm_cache(x, weight, has_bias, mean, rstd, axes, zero_centered,
                                     mixed)
    return [t for t in kernels.layer_norm_backward(dy, cache) if t is not None]


@layer_norm_backward.register_fake
def _(dy, x, weight, has_bias, mean, rstd, axes=1, zero_centered=False, mixed=False):
    grads = [torch.empty_like(x, memory_format=torch.contiguous_format)]
    if weight is not None:
        grads.append(torch.empty_like(weight))
    if has_bias:
        grads.append(x.new_empty(tuple(x.shape[x.dim() - axes:]),
                                 dtype=torch.float32 if mixed else x.dtype))
    return grads


def _layer_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs[:4]
    ctx.eps = T.eps_for(eps, x)
    ctx.has_bias = bias is not None
    ctx.mixed = T.mixed_params(x, weight, bias)
    _setup_options(ctx, inputs, 4)
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(x, weight, output[1], output[2])


def _layer_kernel_backward(ctx, dy):
    x, weight, mean, rstd = ctx.saved_tensors
    grads = iter(layer_norm_backward(dy, x, weight, ctx.has_bias, mean, rstd, ctx.axes,
                                     ctx.zero_centered, ctx.mixed))
    return next(grads), (next(grads) if weight is not None else None), (
        next(grads) if ctx.has_bias else None)


def _layer_backward(ctx, dy, _dmean, _drstd):
    return composite.gradients(ctx, dy, True, _layer_kernel_backward)


layer_norm.register_autograd(_layer_backward, setup_context=_layer_setup)


# --------------------------------------------------------------------------- gated RMSNorm

@torch.library.custom_op("resnorm::gated_rms_norm", mutates_args=(), device_types="cpu")
def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor | None,
                   eps: float | None, group_size: int,
                   norm_before_gate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated RMSNorm's y and rstd (float64, one value per group of each row)."""
    x = T.input_tensor(x)
    if gate is not None:
        T.partner(gate, "gate", x)
    T.param_tensor(weight, "weight", x)
    y, cache = kernels.gated_rms_norm_forward(x, gate, weight, T.eps_for(eps, x), group_size,
                                              norm_before_gate)
    return y, T.tensor(cache.rstd).reshape(-1)


@gated_rms_norm.register_fake
def _(x, gate, weight, eps, group_size, norm_before_gate=False):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty((T.row_count(x) * (x.shape[-1] // group_size),),
                        dtype=torch.float64))


@torch.library.custom_op("resnorm::gated_rms_norm_backward", mutates_args=(),
                         device_types="cpu")
def gated_rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, gate: torch.Tensor | None,
                            weight: torch.Tensor | None, rstd: torch.Tensor, group_size: int,
                            norm_before_gate: bool = False) -> list[torch.Tensor]:
    """[dx], then dgate (with a gate), then dweight (with a weight)."""
    cache = kernels.gated_rms_norm_cache(x, gate, weight, rstd, group_size, norm_before_gate)
    return [t for t in kernels.gated_rms_norm_backward(dy, cache) if t is not None]


@gated_rms_norm_backward.register_fake
def _(dy, x, gate, weight, rstd, group_size, norm_before_gate=False):
    grads = [torch.empty_like(x, memory_format=torch.contiguous_format)]
    if gate is not None:
        grads.append(torch.empty_like(gate, memory_format=torch.contiguous_format))
    if weight is not None:
        grads.append(torch.empty_like(weight))
    return grads


def _gated_setup(ctx, inputs, output):
    x, gate, weight, eps, group_size, norm_before_gate = inputs
    ctx.eps = T.eps_for(eps, x)
    ctx.group_size, ctx.norm_before_gate = group_size, norm_before_gate
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, gate, weight, output[1])


def _gated_kernel_backward(ctx, dy):
    x, gate, weight, rstd = ctx.saved_tensors
    grads = iter(gated_rms_norm_backward(dy, x, gate, weight, rstd, ctx.group_size,
                                         ctx.norm_before_gate))
    return next(grads), (next(grads) if gate is not None else None), (
        next(grads) if weight is not None else None)


def _gated_backward(ctx, dy, _drstd):
    return composite.gated_gradients(ctx, dy, _gated_kernel_backward)


gated_rms_norm.register_autograd(_gated_backward, setup_context=_gated_setup)


# --------------------------------------------------------------------------- dropout

@torch.library.custom_op("resnorm::dropout", mutates_args=(), device_types="cpu")
def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """y = x * keep / (1 - p), the mask a function of (seed, element index)."""
    return kernels.dropout(T.input_tensor(x), p, seed % _SEED_WRAP)


@dropout.register_fake
def _(x, p, seed):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _dropout_setup(ctx, inputs, output):
    _, ctx.p, ctx.seed = inputs


def _dropout_backward(ctx, dy):
    return dropout(dy, ctx.p, ctx.seed), None, None


dropout.register_autograd(_dropout_backward, setup_context=_dropout_setup)


@torch.library.custom_op("resnorm::seeded_dropout", mutates_args=(), device_types="cpu")
def seeded_dropout(x: torch.Tensor, p: float,
                   seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """resnorm::dropout with the seed held by a 0-d int64 tensor (tensor_seed): y, and a
    copy of the seed it read, which its backward reads.  The copy is an output, not the
    input saved, because a graph may advance the seed's tensor in place (a module's
    buffer) before backward runs, and a compiler may drop a copy made in the graph."""
    return kernels.dropout(T.input_tensor(x), p, tensor_seed(seed)), seed.clone()


@seeded_dropout.register_fake
def _(x, p, seed):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(seed)


def _seeded_dropout_setup(ctx, inputs, output):
    ctx.p = inputs[1]
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])


def _seeded_dropout_backward(ctx, dy, _dseed):
    (seed,) = ctx.saved_tensors
    return seeded_dropout(dy, ctx.p, seed)[0], None, None


seeded_dropout.register_autograd(_seeded_dropout_backward, setup_context=_seeded_dropout_setup)


def checked_seed_tensor(seed):
    """seed checked as a dropout seed's tensor form: a 0-d torch.int64 tensor."""
    if not (isinstance(seed, torch.Tensor) and seed.dim() == 0 and seed.dtype == torch.int64):
        got = (f"a tensor of shape {tuple(seed.shape)} and dtype {seed.dtype}"
               if isinstance(seed, torch.Tensor) else type(seed).__name__)
        raise TypeError(f"seed must be an int or a 0-d torch.int64 tensor, got {got}")
    return seed


def tensor_seed(seed):
    """The dropout seed in [0, 2**64) a 0-d int64 tensor holds (its bits: a seed in
    [2**63, 2**64) is held as the negative int64 with the same bits).  Reads the tensor's
    value: eager code, and the operator's own implementation."""
    return int(checked_seed_tensor(seed)) % _SEED_WRAP


def dropout_seed(seed):
    """A dropout seed in [0, 2**64) as the operator's signed 64-bit int (same bits).  The
    range is checked here because two's complement would turn a negative seed into a
    valid one; resnorm checks everything else when the operator runs."""
    if isinstance(seed, int) and not 0 <= seed < _SEED_WRAP:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return seed - _SEED_WRAP if isinstance(seed, int) and seed >= 2 ** 63 else seed
