"""Docstring text that several functions or classes share, written once and filled in.

`complete_parameters` writes a numpydoc Parameters section in signature order: the
entries a docstring writes itself, and for every other parameter the shared entry of that
name (a class's options, a record's inherited fields).  Sections a docstring does not have
can be added the same way (a shared Raises).  Docstrings are cleaned first
(inspect.cleandoc), so the result does not depend on whether the compiler kept their
indentation (Python 3.13 strips it, older versions keep it).
"""
from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T", bound=Callable[..., Any])

# numpydoc's sections, in numpydoc's order
SECTIONS = ("Parameters", "Attributes", "Returns", "Yields", "Other Parameters", "Raises",
            "Warns", "Warnings", "See Also", "Notes", "References", "Examples")


def _split(doc: str) -> tuple[str, dict[str, str]]:
    """(the text before the first section, {section title: its body}) of a docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    head, sections, title = [], {}, None
    i = 0
    while i < len(lines):
        if lines[i].strip() in SECTIONS and i + 1 < len(lines) \
                and re.fullmatch(r"-{3,}", lines[i + 1].strip()):
            title = lines[i].strip()
            sections[title] = []
            i += 2
            continue
        (head if title is None else sections[title]).append(lines[i])
        i += 1
    return "\n".join(head).rstrip(), {t: "\n".join(b).strip("\n") for t, b in sections.items()}


def parameter_entries(doc: str | None) -> dict[str, str]:
    """{parameter name: its entry} of a docstring's Parameters section.

    An entry is its ``name : type`` line and the indented lines below it; ``a, b : float``
    is the entry of both a and b, and ``**options`` the entry of options.
    """
    if not doc:
        return {}
    entries, current = {}, None
    for line in _split(doc)[1].get("Parameters", "").splitlines():
        if line and not line[0].isspace():
            current = [line]
            for name in line.split(":")[0].split(","):
                entries[name.strip().lstrip("*")] = current
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).rstrip() for name, lines in entries.items()}


def complete_parameters(shared: Mapping[str, str],
                        sections: Mapping[str, str] | None = None) -> Callable[[T], T]:
    """A decorator that completes a function's or class's docstring from shared text.

    Parameters
    ----------
    shared : mapping of str to str
        Parameter name -> numpydoc entry (its ``name : type`` line and its description),
        used for every parameter of the signature (a class's ``__init__``) whose entry the
        docstring does not write itself.
    sections : mapping of str to str, optional
        Section title -> body, added when the docstring has no section of that title.

    Returns
    -------
    callable
        The decorator; it raises KeyError for a parameter documented nowhere.
    """
    def decorate(obj: T) -> T:
        # python -OO strips docstrings (a dataclass then makes up one from its signature)
        if obj.__doc__ is None or sys.flags.optimize >= 2:
            return obj
        head, found = _split(obj.__doc__)
        own = parameter_entries(obj.__doc__)
        target = obj.__init__ if inspect.isclass(obj) else obj
        entries = []
        for p in inspect.signature(target).parameters.values():
            if p.name in ("self", "cls") or p.kind is p.VAR_POSITIONAL:
                continue
            entry = own[p.name] if p.name in own else shared[p.name]
            if entry not in entries:   # an entry naming several parameters stands once
                entries.append(entry)
        found = {**(sections or {}), **found}
        if entries:
            found["Parameters"] = "\n".join(entries)
        body = [f"{t}\n{'-' * len(t)}\n{found[t]}" for t in SECTIONS if t in found]
        obj.__doc__ = "\n\n".join([head, *body]) + "\n"
        return obj
    return decorate
