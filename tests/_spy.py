"""A spy on resnorm's NumPy norm functions, for the torch tests that check a module runs
on resnorm (and not on torch)."""


class spy_norms:
    """Records the names of resnorm's NumPy norm functions called inside (resnorm.torch
    calls them through the module's attributes)."""

    NAMES = ("rms_norm", "layer_norm", "rms_norm_forward", "layer_norm_forward")

    def __init__(self, module, calls):
        self.module, self.calls, self.saved = module, calls, {}

    def __enter__(self):
        for name in self.NAMES:
            fn = self.saved[name] = getattr(self.module, name)
            setattr(self.module, name,
                    lambda *a, _fn=fn, _name=name, **k: (self.calls.append(_name), _fn(*a, **k))[1])
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(self.module, name, fn)
