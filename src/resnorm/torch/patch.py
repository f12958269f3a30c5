"""patch(model): run a model's norm layers on resnorm's kernels, in place and reversibly.

Every norm-like module (recognise.norm_like) is checked by what it computes
(recognise.recognise: a probe run against resnorm's formulas) and, when resnorm computes
the same, switched in place to a subclass of its own class whose forward calls resnorm
(the way torch.nn.utils.parametrize injects its subclasses): the module object, its
parameters, buffers, hooks, state_dict keys and every reference to it stay as they were,
so an optimizer built before the patch keeps training the same tensors.
torch.nn.RMSNorm / LayerNorm become resnorm.torch.RMSNorm / LayerNorm; any other class C
becomes a subclass of C made once per class (same name, isinstance(m, C) still true).
undo() switches the classes back.  Gated RMSNorms (forward(hidden_states, gate=None), the
norms of hybrid Mamba models) are recognised the same way, with a gate, and become a
subclass whose forward takes the gate too.  Modules that do not match, that resnorm cannot
run (complex or integer parameters, CUDA, ...), or whose forward takes other arguments,
stay on torch and are listed in Patch.skipped with the reason, and a warning says so.
Norms over several trailing axes (normalized_shape (5, 64)) are swapped like the others;
Gemma's (1 + w) RMSNorm runs with resnorm's zero-centred weight.
float16/bfloat16 models are patched like the others.  Half-precision input to float32
parameters (torch.autocast): torch.nn's norms run on resnorm (resnorm.torch's modules
compute that case as torch does); any other patched class runs on resnorm the way the probe
found it computes that case (where it rounds, which dtype it returns: recognise.MIXED), and
its own forward where none of those matched.
"""
import warnings

import torch
from torch import nn

from . import _tensors as T
from .gated import gated_norm
from .modules import LayerNorm, RMSNorm, follows_input, forget_views, module_norm, parameter
from .residual_modules import OWN_MODULES
from .recognise import mixed_gated_output, mixed_output, norm_like, recognise

_RESNORM_CLASS = {nn.RMSNorm: RMSNorm, nn.LayerNorm: LayerNorm}
_TORCH_CLASS = {v: k for k, v in _RESNORM_CLASS.items()}
_SPEC = "_resnorm_spec"
_SUBCLASSES = {}   # original class -> its patched subclass


class _Patched:
    """The methods every patched subclass puts before its original class's."""

    def forward(self, x):
        if torch.jit.is_scripting():
            raise RuntimeError("resnorm.torch.patch: a patched module cannot run under "
                               "TorchScript; undo() the patch before torch.jit.script, or "
                               "use torch.compile or torch.jit.trace, which record "
                               "resnorm's custom operators")
        return _forward(self, x)

    def extra_repr(self):
        # print(model) shows which norms resnorm computes (the class keeps its name)
        own = super().extra_repr()
        return f"{own}, computed by resnorm" if own else "computed by resnorm"

    def __reduce_ex__(self, protocol):
        # pickles (and deep-copies) as a patched instance of the original class
        state = self.__dict__.copy()
        forget_views(state)
        return _unpickle, (type(self)._resnorm_original, isinstance(self, _PatchedGated)), \
            state


class _PatchedGated(_Patched):
    """The forward of a patched gated RMSNorm: (input, gate), the gate also by the name
    its class's forward gives it."""

    def forward(self, hidden_states, gate=None, **named):
        if torch.jit.is_scripting():
            raise RuntimeError("resnorm.torch.patch: a patched module cannot run under "
                               "TorchScript; undo() the patch before torch.jit.script, or "
                               "use torch.compile or torch.jit.trace, which record "
                               "resnorm's custom operators")
        if named:
            name = self.__dict__[_SPEC].gate
            if gate is not None or set(named) != {name}:
                raise TypeError(f"{type(self).__name__}.forward() takes the input and "
                                f"{name}, got the arguments {sorted(named)}"
                                + (" and a gate" if gate is not None else ""))
            gate = named[name]
        return _forward_gated(self, hidden_states, gate)


def _forward(self, x):
    """A patched module's forward: its recognised formula on resnorm."""
    spec = self.__dict__[_SPEC]
    weight, bias = parameter(self, "weight"), parameter(self, "bias")
    if isinstance(x, torch.Tensor) and T.mixed_params(x, weight, bias):
        # half-precision input, float32 parameters (torch.autocast): as the probe found
        # this class computes that case, else the module's own forward, on torch
        how = dict(spec.mixed).get(x.dtype)
        if how is None:
            return type(self)._resnorm_original.forward(self, x)
        return mixed_output(spec.kind, how, x, weight, bias, spec.eps(self),
                            spec.normalized_shape)
    if isinstance(x, torch.Tensor) and x.dtype not in spec.dtypes:
        if weight is None and bias is None:
            # no parameters fix its dtype: where the probe did not match (OLMo's LayerNorm
            # computes float64 input in float32), the module's own forward
            return type(self)._resnorm_original.forward(self, x)
        raise TypeError(
            f"resnorm.torch.patch checked this {type(self).__name__} against resnorm for "
            f"{' and '.join(map(str, spec.dtypes))} input, got {x.dtype}; call "
            f"patch(model) again after changing the model's dtype, or undo() the patch")
    # Gemma's y = rms_norm(x) * (1 + w) (Nemotron's LayerNorm likewise): resnorm's
    # zero-centred weight (its gain formed as each of them forms it: T.float32_gain)
    return module_norm(self, x, spec.layer, spec.eps(self), spec.normalized_shape,
                       spec.zero_centered)


def _widens(dtype, to):
    """Whether every value of dtype is exactly a value of `to` (a wider float type)."""
    return dtype is not to and torch.finfo(dtype).bits < torch.finfo(to).bits and (
        dtype is not torch.bfloat16 or to is not torch.float16)


def _forward_gated(self, x, gate):
    """A patched gated RMSNorm's forward: its recognised order and grouping on resnorm.
    Calls resnorm does not compute as the class does run the class's own forward: one
    without a gate where the probe found that the class does not compute the ungated norm
    (or fails), a gate of another shape than the input, or wider than it (the class
    computes with the gate's precision), float32 weight beside 16-bit input where no way
    of MIXED matched.  A gate narrower than the input is widened (exactly), as the
    classes widen it to float32 themselves."""
    spec = self.__dict__[_SPEC]
    original = type(self)._resnorm_original.forward
    if gate is None and not spec.gate_optional:
        return original(self, x)
    if not isinstance(x, torch.Tensor) or not (gate is None or isinstance(gate, torch.Tensor)):
        return original(self, x, gate)   # its own error, or what it makes of them
    if gate is not None and gate.shape != x.shape:
        return original(self, x, gate)   # a gate it broadcasts (or refuses) itself
    if gate is not None and gate.dtype is not x.dtype:
        if not (gate.is_floating_point() and x.is_floating_point()
                and _widens(gate.dtype, x.dtype)):
            return original(self, x, gate)
        gate = gate.to(x.dtype)   # exact: each class widens the gate to float32 itself
    weight = parameter(self, "weight")
    gs = spec.group_size(self, x.shape[-1]) if x.dim() else None   # (a scalar: refused)
    if T.mixed_params(x, weight, None):
        how = dict(spec.mixed).get(x.dtype)
        if how is None:
            return original(self, x, gate)
        return mixed_gated_output(spec.kind, how, x, gate, weight, spec.eps(self), gs)
    if x.dtype not in spec.dtypes:
        if weight is None:
            return original(self, x, gate)
        raise TypeError(
            f"resnorm.torch.patch checked this {type(self).__name__} against resnorm for "
            f"{' and '.join(map(str, spec.dtypes))} input, got {x.dtype}; call "
            f"patch(model) again after changing the model's dtype, or undo() the patch")
    if follows_input(False, x, weight):   # a 16-bit model's weight beside float32 input
        weight = weight.to(x.dtype)
    return gated_norm(x, gate, weight, spec.eps(self), gs, spec.norm_before_gate)


def _unpickle(original, gated=False):
    return object.__new__(_subclass(original, gated))


def _subclass(original, gated=False):
    """The patched subclass of a norm class (made once, named as the original); gated: a
    gated RMSNorm's, whose forward takes the gate."""
    if original not in _SUBCLASSES:
        _SUBCLASSES[original] = type(original.__name__,
                                     (_PatchedGated if gated else _Patched, original),
                                     {"_resnorm_original": original,
                                      "__qualname__": original.__qualname__,
                                      "__doc__": f"{original.__qualname__}, computed by "
                                                 f"resnorm (resnorm.torch.patch)."})
    return _SUBCLASSES[original]


def _is_patched(module):
    return type(module) in _TORCH_CLASS or isinstance(module, _Patched)


def _on_resnorm(module):
    """Patched already, or one of resnorm.torch's own modules (left as they are)."""
    return _is_patched(module) or type(module) in OWN_MODULES


def _original(module):
    cls = type(module)
    return _TORCH_CLASS.get(cls) or cls._resnorm_original


class Patch:
    """The result of patch(): .swapped = [(name, module)], .skipped = [(name, reason)].

    undo() restores the modules' original classes (again calls are no-ops).  As a context
    manager, ``with patch(model): ...`` undoes on exit.
    """

    def __init__(self, swapped, skipped):
        self.swapped = swapped
        self.skipped = skipped

    def undo(self):
        """Switch every swapped module back to its original class."""
        for _, module in self.swapped:
            if _is_patched(module):
                module.__class__ = _original(module)
                module.__dict__.pop(_SPEC, None)
                forget_views(module)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.undo()

    def __repr__(self):
        return f"<resnorm.torch.Patch: {len(self.swapped)} swapped, {len(self.skipped)} skipped>"


def _swap(module, spec):
    cls = type(module)
    if cls in _RESNORM_CLASS:
        module.__class__ = _RESNORM_CLASS[cls]
    else:
        module.__dict__[_SPEC] = spec
        module.__class__ = _subclass(cls, spec.gate is not None)


def _warning(swapped, skipped):
    """One line per reason, with up to three module names."""
    by_reason = {}
    for name, reason in skipped:
        by_reason.setdefault(reason, []).append(name or "<model>")
    parts = []
    for reason, names in by_reason.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{shown}: {reason}")
    head = "swapped none of the model's norm layers; " if not swapped else ""
    return (f"resnorm.torch.patch {head}left {len(skipped)} norm module(s) on torch: "
            + "; ".join(parts))


def patch(model):
    """Make the norm layers of model (model itself included) compute with resnorm.

    Parameters
    ----------
    model : torch.nn.Module
        Patched in place.  Its norm-like modules (leaf modules whose class name contains
        "norm", and torch's norms) whose forward takes the input alone are run on a probe
        input (their class's forward, so that none of their hooks fires) and compared
        with resnorm's RMSNorm, (1 + w) RMSNorm and LayerNorm, over their normalised axes
        (one or several); those whose forward takes the input and a gate, with resnorm's
        gated RMSNorm (the gate before or after the norm, by groups); those that match
        are switched to resnorm.

    Returns
    -------
    Patch
        .swapped: [(name, module)]; .skipped: [(name, reason)]; .undo() reverts.

    Raises
    ------
    TypeError
        model is not a torch.nn.Module.

    Warns
    -----
    UserWarning
        When norm-like modules stay on torch (the message gives each reason).

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    >>> handle = rt.patch(model)
    >>> handle
    <resnorm.torch.Patch: 1 swapped, 0 skipped>
    >>> handle.undo()
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    swapped, skipped = [], []
    for name, module in model.named_modules():
        if _on_resnorm(module) or not norm_like(module):
            continue
        spec, reason = recognise(module)
        if spec is None:
            skipped.append((name, reason))
        else:
            _swap(module, spec)
            swapped.append((name, module))
    if skipped:
        warnings.warn(_warning(swapped, skipped), stacklevel=2)
    return Patch(swapped, skipped)
