"""The base class of every layer: named parameters with their gradients, children, modes.

A module is used as ``y = m.forward(x)`` then ``dx = m.backward(dy)``.  forward keeps in the
module exactly what backward needs (its cache); backward consumes the cache, adds the
parameter gradients into ``grads()`` (they accumulate until ``zero_grad()``, as in PyTorch)
and returns the gradient of the input.  One backward per forward.

Parameters are plain NumPy arrays updated in place (by optimizers and load_state_dict), so
references taken once (``w = m.params()["weight"]``) stay valid.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

ModuleT = TypeVar("ModuleT", bound="Module")

from .. import _checks


class Module:
    """The base class of every layer: named parameters and gradients, children, modes.

    A subclass registers its parameters with `add_param` and its sub-layers with
    `add_module`, and defines ``forward(x)`` (which keeps what backward needs) and
    ``backward(dy)`` (which returns the gradient of the input and adds the parameter
    gradients into `grads`).  ``module(x)`` is ``module.forward(x)``.

    Attributes
    ----------
    training : bool
        True (the default) in training mode, False after `eval`: dropout is active only
        in training mode.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> norm = nn.LayerNorm(4)
    >>> sorted(norm.params()), norm.num_params()
    (['bias', 'weight'], 8)
    >>> y = norm.forward(np.arange(8, dtype=np.float32).reshape(2, 4))
    >>> dx = norm.backward(np.ones_like(y))
    >>> norm.grads()["bias"]
    array([2., 2., 2., 2.], dtype=float32)
    >>> norm.zero_grad()
    >>> float(norm.grads()["bias"].sum())
    0.0
    """

    def __init__(self) -> None:
        self.training = True
        self._params = {}    # own parameters: name -> array
        self._grads = {}     # name -> gradient array of the same shape and dtype
        self._children = {}  # name -> Module; the name "" puts the child's names at our level

    # ---- building

    def add_param(self, name: str, value: ArrayLike) -> tuple[NDArray[Any], NDArray[Any]]:
        """Registers a parameter and a zero gradient of the same shape and dtype.

        Parameters
        ----------
        name : str
            The parameter's name inside this module (``"weight"``).
        value : array_like
            Its initial value; kept as a C-contiguous array (copied only if needed).

        Returns
        -------
        param, grad : ndarray
            The parameter array and its gradient array, both owned by the module.
        """
        value = np.ascontiguousarray(value)
        grad = np.zeros_like(value)
        self._params[name] = value
        self._grads[name] = grad
        return value, grad

    def add_module(self, name: str, module: ModuleT) -> ModuleT:
        """Registers a child module; its parameters are named ``"<name>.<its name>"``.

        Parameters
        ----------
        name : str
            The child's name; ``""`` puts the child's parameter names at this level.
        module : Module
            The child.

        Returns
        -------
        Module
            `module` itself.
        """
        self._children[name] = module
        return module

    # ---- parameters

    def _named(self, table: str, prefix: str = "") -> Iterator[tuple[str, NDArray[Any]]]:
        for name, a in getattr(self, table).items():
            yield prefix + name, a
        for name, child in self._children.items():
            yield from child._named(table, prefix + (name + "." if name else ""))

    def params(self) -> dict[str, NDArray[Any]]:
        """The parameters, by name.

        Returns
        -------
        dict of str to ndarray
            ``{name: parameter array}`` (the arrays themselves, not copies), named and
            ordered as torch's ``named_parameters()`` for the same layer.
        """
        return dict(self._named("_params"))

    def grads(self) -> dict[str, NDArray[Any]]:
        """The parameter gradients accumulated by backward since the last `zero_grad`.

        Returns
        -------
        dict of str to ndarray
            ``{name: gradient array}``, the same names as `params`.
        """
        return dict(self._named("_grads"))

    def num_params(self) -> int:
        """The number of parameter values.

        Returns
        -------
        int
            The total size of all parameter arrays, children included.
        """
        return sum(p.size for p in self.params().values())

    def zero_grad(self) -> None:
        """Sets every gradient array to zero, in place."""
        for g in self.grads().values():
            g.fill(0)

    def state_dict(self) -> dict[str, NDArray[Any]]:
        """Copies of the parameters, with torch's ``state_dict()`` names and layouts.

        Returns
        -------
        dict of str to ndarray
            ``{name: copy of the parameter}``.
        """
        return {name: p.copy() for name, p in self.params().items()}

    def load_state_dict(self, state: Mapping[str, ArrayLike],
                        strict: bool = True) -> tuple[list[str], list[str]]:
        """Copies arrays into the parameters, in place (all are checked before any is copied).

        Parameters
        ----------
        state : dict of str to array_like
            ``{name: array}``; each array of the parameter's shape and a float dtype
            (converted to the parameter's dtype), e.g. a torch ``state_dict()`` turned
            into NumPy arrays.
        strict : bool, default True
            The names must match exactly.  With False, unknown names are ignored and
            missing ones keep their values.

        Returns
        -------
        missing, unexpected : list of str
            The parameter names not in `state`, and the names in `state` that are not
            parameters.

        Raises
        ------
        TypeError
            If `state` is not a dict, or one of its values is not a float array.
        ValueError
            If `strict` and the names differ, or an array has the wrong shape.
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
            # a 16-bit state only for a 16-bit parameter (the modules that take halves)
            a = _checks.float_array(state[name], f"state[{name!r}]",
                                    params[name].dtype not in _checks.FLOAT_DTYPES)
            if a.shape != params[name].shape:
                raise ValueError(f"state[{name!r}] must have shape {params[name].shape}, "
                                 f"got {a.shape}")
            values[name] = a
        for name, a in values.items():
            np.copyto(params[name], a, casting="same_kind")
        return missing, unexpected

    # ---- modes

    def train(self, mode: bool = True) -> Module:
        """Sets training mode (dropout active) or, with ``mode=False``, evaluation mode.

        Parameters
        ----------
        mode : bool, default True
            The mode, for this module and all its children.

        Returns
        -------
        Module
            The module itself.
        """
        self.training = bool(mode)
        for child in self._children.values():
            child.train(mode)
        return self

    def eval(self) -> Module:
        """Sets evaluation mode (dropout off), as ``train(False)``.

        Returns
        -------
        Module
            The module itself.
        """
        return self.train(False)

    # ---- what every layer defines

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        """The module's output; keeps in the module what `backward` needs.

        Parameters
        ----------
        x : array_like
            Input of the module's dtype, its last axis the module's input width
            (attention and blocks take (B, T, D)).

        Returns
        -------
        ndarray
            The output, of the module's dtype.

        Raises
        ------
        TypeError
            If x is not an array of the module's dtype.
        ValueError
            If x's shape does not fit the module.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define forward")

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        """The gradient of the input; adds the parameter gradients into `grads`.

        Parameters
        ----------
        dy : array_like
            Gradient of the loss with respect to the last forward's output (its shape
            and dtype).

        Returns
        -------
        ndarray
            The gradient with respect to the last forward's input.

        Raises
        ------
        RuntimeError
            If there was no forward since the last backward (one backward per forward).
        TypeError, ValueError
            If dy does not have the last forward output's shape and dtype.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define backward")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # ---- the cache between forward and backward

    @contextmanager
    def _backward_cache(self) -> Iterator[Any]:
        """The forward cache, for the backward run inside the ``with`` block: removed from
        the module when that backward succeeds (one backward per forward), kept when it
        raises, so that a backward refused for a bad dy can be retried with the right one."""
        cache = getattr(self, "_cache", None)
        if cache is None:
            raise RuntimeError(f"{type(self).__name__}.backward called without a forward "
                               "before it (or twice for one forward)")
        yield cache
        self._cache = None
