"""The base class of every layer: named parameters with their gradients, children, modes.

A module is used as ``y = m.forward(x)`` then ``dx = m.backward(dy)``.  forward keeps in the
module exactly what backward needs (its cache); backward consumes the cache, adds the
parameter gradients into ``grads()`` (they accumulate until ``zero_grad()``, as in PyTorch)
and returns the gradient of the input.  One backward per forward.

Parameters are plain NumPy arrays updated in place (by optimizers and load_state_dict), so
references taken once (``w = m.params()["weight"]``) stay valid.
"""
import numpy as np

from .. import _checks


class Module:
    """Named parameters and gradients, child modules, train/eval mode."""

    def __init__(self):
        self.training = True
        self._params = {}    # own parameters: name -> array
        self._grads = {}     # name -> gradient array of the same shape and dtype
        self._children = {}  # name -> Module; the name "" puts the child's names at our level

    # ---- building

    def add_param(self, name, value):
        """Registers a parameter; returns (parameter array, its gradient array)."""
        value = np.ascontiguousarray(value)
        grad = np.zeros_like(value)
        self._params[name] = value
        self._grads[name] = grad
        return value, grad

    def add_module(self, name, module):
        """Registers a child; its parameters are named "<name>.<its name>"."""
        self._children[name] = module
        return module

    # ---- parameters

    def _named(self, table, prefix=""):
        for name, a in getattr(self, table).items():
            yield prefix + name, a
        for name, child in self._children.items():
            yield from child._named(table, prefix + (name + "." if name else ""))

    def params(self):
        """{name: parameter array}, names as in torch's named_parameters()."""
        return dict(self._named("_params"))

    def grads(self):
        """{name: gradient array}, the same names as params()."""
        return dict(self._named("_grads"))

    def num_params(self):
        return sum(p.size for p in self.params().values())

    def zero_grad(self):
        for g in self.grads().values():
            g.fill(0)

    def state_dict(self):
        """{name: copy of the parameter}: torch's state_dict() names and layouts."""
        return {name: p.copy() for name, p in self.params().items()}

    def load_state_dict(self, state, strict=True):
        """Copies arrays from state (name -> array, any float dtype) into the parameters.

        strict: the names must match exactly; otherwise unknown names are ignored and
        missing ones keep their values.  Returns (missing names, unexpected names).
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict of name -> array, got {type(state).__name__}")
        params = self.params()
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        if strict and (missing or unexpected):
            raise ValueError(f"state does not match the module's parameters: missing "
                             f"{missing}, unexpected {unexpected}")
        values = {}
        for name in params.keys() & state.keys():   # check everything before copying anything
            a = _checks.float_array(state[name], f"state[{name!r}]")
            if a.shape != params[name].shape:
                raise ValueError(f"state[{name!r}] must have shape {params[name].shape}, "
                                 f"got {a.shape}")
            values[name] = a
        for name, a in values.items():
            np.copyto(params[name], a, casting="same_kind")
        return missing, unexpected

    # ---- modes

    def train(self, mode=True):
        """Training mode (dropout active) or, with mode=False, evaluation mode."""
        self.training = bool(mode)
        for child in self._children.values():
            child.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- the cache between forward and backward

    def _take_cache(self):
        """The forward cache, removed from the module (one backward per forward)."""
        cache = getattr(self, "_cache", None)
        if cache is None:
            raise RuntimeError(f"{type(self).__name__}.backward called without a forward "
                               "before it (or twice for one forward)")
        self._cache = None
        return cache
