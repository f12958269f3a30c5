"""patch(model): run every torch.nn.RMSNorm / LayerNorm of a model on resnorm's kernels.

Each norm module is switched in place to resnorm's subclass of its own class (the way
torch.nn.utils.parametrize injects its subclasses): the module object, its parameters,
buffers, hooks, state_dict keys and every reference to it stay exactly as they were, so an
optimizer built before the patch keeps training the same tensors.  undo() switches the
classes back.  Only modules whose type is exactly torch.nn.RMSNorm or torch.nn.LayerNorm
are touched (a user subclass may have its own forward); configurations resnorm does not
support are left on torch and listed in Patch.skipped, with a warning.
"""
import warnings

from torch import nn

from .modules import LayerNorm, RMSNorm, unsupported_reason

_RESNORM_CLASS = {nn.RMSNorm: RMSNorm, nn.LayerNorm: LayerNorm}


class Patch:
    """The result of patch(): .swapped = [(name, module)], .skipped = [(name, reason)].

    undo() restores torch's classes (again calls are no-ops).  As a context manager,
    ``with patch(model): ...`` undoes on exit.
    """

    def __init__(self, swapped, skipped):
        self.swapped = swapped
        self.skipped = skipped

    def undo(self):
        for _, module in self.swapped:
            for torch_class, resnorm_class in _RESNORM_CLASS.items():
                if type(module) is resnorm_class:
                    module.__class__ = torch_class

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.undo()

    def __repr__(self):
        return f"<resnorm.torch.Patch: {len(self.swapped)} swapped, {len(self.skipped)} skipped>"


def patch(model):
    """Make every torch.nn.RMSNorm / torch.nn.LayerNorm in model (model itself included)
    compute with resnorm's kernels, in place.  Returns a Patch; Patch.undo() reverts.

    Norms with a multi-axis normalized_shape, or with parameters that are not float32 /
    float64 on the CPU, stay on torch and are listed in Patch.skipped (with a warning).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    swapped, skipped = [], []
    for name, module in model.named_modules():
        resnorm_class = _RESNORM_CLASS.get(type(module))
        if resnorm_class is None:
            continue
        reason = unsupported_reason(module)
        if reason is None:
            module.__class__ = resnorm_class
            swapped.append((name, module))
        else:
            skipped.append((name, reason))
    if skipped:
        listing = "; ".join(f"{name or '<model>'}: {why}" for name, why in skipped)
        warnings.warn(f"resnorm.torch.patch left {len(skipped)} norm module(s) on torch: "
                      f"{listing}", stacklevel=2)
    return Patch(swapped, skipped)
