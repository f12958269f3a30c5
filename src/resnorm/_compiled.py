"""Binds each public kernel function to its readable face.

resnorm.norms, resnorm.residual and resnorm.inverted_dropout declare the public kernel
functions in Python: signature, type hints and docstring.  ``@compiled`` turns each
declaration into the function of the same name in resnorm._api, which takes the same
signature, so a call goes straight into compiled code: keywords and defaults are parsed
in C, with no Python frame between the caller and the call path (a Python function in
between cost 100-270 ns per call at (1, 16) float32, about a third of a small call).  The
declaration's body never runs; its signature is checked equal to the compiled one here,
at import, so the two cannot drift apart.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from . import _api

F = TypeVar("F", bound=Callable[..., Any])


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter: the signature without its type hints."""
    return [(p.name, p.kind, p.default)
            for p in inspect.signature(fn, follow_wrapped=False).parameters.values()]


def compiled(face: F) -> F:
    """The compiled function named like ``face``, carrying its docstring, module and type
    hints; ``inspect.signature`` and ``typing.get_type_hints`` read them from ``face``."""
    fn = getattr(_api, face.__name__)
    if _parameters(fn) != _parameters(face):
        raise TypeError(f"resnorm._api.{face.__name__} takes {_parameters(fn)}, its "
                        f"declaration {_parameters(face)}")
    fn.__doc__ = face.__doc__
    fn.__module__ = face.__module__
    fn.__qualname__ = face.__qualname__
    fn.__annotations__ = face.__annotations__
    fn.__wrapped__ = face
    return fn
