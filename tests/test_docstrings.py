"""The docstrings of the public API: their Examples run (as doctests) and print what they
show, and each is in numpydoc form, with its sections matching the signature.

DOCUMENTED lists the modules whose public names are held to this; a module joins it when
its docstrings are written.
"""
import builtins
import doctest
import importlib
import inspect
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import resnorm
from resnorm._docstrings import complete_parameters

DOCUMENTED = [
    "resnorm.nn.module",
    "resnorm.nn.linear",
    "resnorm.nn.activations",
    "resnorm.nn.attention",
    "resnorm.nn.dropout",
    "resnorm.nn.feedforward",
    "resnorm.nn.norms",
    "resnorm.nn.blocks",
    "resnorm.nn.parallel",
    "resnorm.nn.deepnorm",
    "resnorm.nn.sandwich",
    "resnorm.nn.stack",
    "resnorm.nn.optim",
    "resnorm.nn.losses",
    "resnorm.explain",
    "resnorm.reference",
    "resnorm.norms",
    "resnorm.residual",
    "resnorm.gated_norm",
    "resnorm.inverted_dropout",
    "resnorm.accuracy",
]
PUBLIC_PACKAGES = ["resnorm.nn"]  # whose __all__ must be covered by DOCUMENTED


def _public(module):
    """(qualified name, object) of the functions and classes a module defines publicly,
    and the public methods and properties of those classes.  A compiled function declared
    in the module (resnorm._compiled) counts as a function: it carries its declaration."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(inspect.unwrap(obj)):
            yield name, obj
        elif inspect.isclass(obj):
            yield name, obj
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if inspect.isfunction(member) or isinstance(member, property):
                    yield f"{name}.{attr}", member


def _items():
    for module_name in DOCUMENTED:
        module = importlib.import_module(module_name)
        for name, obj in _public(module):
            yield pytest.param(module, name, obj, id=f"{module_name}.{name}")


def _sections(doc):
    """{section title: its text} of a numpydoc docstring (titles underlined with dashes)."""
    lines = inspect.cleandoc(doc).splitlines()
    found, title = {}, None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[i + 1].strip()) \
                and line.strip() and len(lines[i + 1].strip()) == len(line.strip()):
            title = line.strip()
            found[title] = []
        elif title is not None and not re.fullmatch(r"-{3,}", line.strip()):
            found[title].append(line)
    return {t: "\n".join(body) for t, body in found.items()}


def _documented_names(section):
    """Parameter names of a Parameters section: 'a, b : int' documents a and b."""
    names = set()
    for line in section.splitlines():
        if line and not line[0].isspace():
            for part in line.split(":")[0].split(","):
                names.add(part.strip().lstrip("*"))
    return names


@pytest.mark.parametrize("module_name", DOCUMENTED)
def test_examples_run(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module) if t.examples]
    assert tests, f"{module_name} has no docstring examples"
    report = []   # doctest swaps sys.stdout while it runs: collect its report instead
    for test in tests:
        runner.run(test, out=report.append)
    failed, attempted = runner.failures, runner.tries
    assert failed == 0, f"{failed} of {attempted} examples of {module_name} failed:\n" \
                        + "".join(report)


@pytest.mark.parametrize("module, name, obj", list(_items()))
def test_numpydoc_sections(module, name, obj):
    doc = inspect.getdoc(obj) if not isinstance(obj, property) else obj.__doc__
    assert doc and doc.strip(), f"{name} has no docstring"
    if isinstance(obj, property):
        return  # a property is described by one sentence
    sections = _sections(doc)
    target = obj.__init__ if inspect.isclass(obj) else obj
    signature = inspect.signature(target)
    params = [p for p in signature.parameters.values()
              if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if params:
        assert "Parameters" in sections, f"{name}: no Parameters section"
        documented = _documented_names(sections["Parameters"])
        missing = [p.name for p in params if p.name not in documented]
        assert not missing, f"{name}: parameters not documented: {missing}"
        extra = documented - {p.name for p in signature.parameters.values()}
        assert not extra, f"{name}: documented parameters that do not exist: {sorted(extra)}"
    elif "Parameters" in sections:
        pytest.fail(f"{name}: a Parameters section without parameters")
    if inspect.isfunction(inspect.unwrap(obj)):
        hints = typing.get_type_hints(obj)
        returns_something = hints.get("return", None) not in (None, type(None))
        if returns_something:
            assert "Returns" in sections, f"{name}: no Returns section"
        unannotated = [p.name for p in params if p.name not in hints]
        assert not unannotated, f"{name}: parameters without a type hint: {unannotated}"
        assert "return" in hints, f"{name}: no return type hint"
    else:
        typing.get_type_hints(obj.__init__)  # hints resolve
    is_method = "." in name
    if not is_method:
        assert "Examples" in sections, f"{name}: no Examples section"
        assert ">>>" in sections["Examples"], f"{name}: its Examples section has no example"
    if "Raises" in sections:
        for line in sections["Raises"].splitlines():
            if line and not line[0].isspace():
                for exc in (e.strip() for e in line.split(",")):
                    assert isinstance(getattr(builtins, exc, None), type), \
                        f"{name}: Raises names {exc!r}, not a built-in exception"


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_every_public_name_is_documented(package):
    pkg = importlib.import_module(package)
    covered = {name for m in DOCUMENTED for name, _ in _public(importlib.import_module(m))}
    missing = sorted(set(pkg.__all__) - covered)
    assert not missing, f"{package}.__all__ names outside DOCUMENTED modules: {missing}"


def test_shared_entries_fill_the_parameters_in_signature_order():
    shared = {"a": "a : int\n    Shared a.", "b": "b : int\n    Shared b."}

    @complete_parameters(shared, {"Raises": "ValueError\n    Always."})
    def f(a: int, b: int, *, c: int) -> None:
        """Summary.

        Parameters
        ----------
        c : int
            Own c.
        b : int
            Own b.

        Examples
        --------
        >>> 1
        1
        """

    sections = _sections(f.__doc__)
    assert _documented_names(sections["Parameters"]) == {"a", "b", "c"}
    assert sections["Parameters"].split() == \
        "a : int Shared a. b : int Own b. c : int Own c.".split()
    assert list(sections) == ["Parameters", "Raises", "Examples"]

    def g(a: int, d: int) -> None:
        """Summary."""
    with pytest.raises(KeyError, match="d"):
        complete_parameters(shared)(g)


def test_the_package_imports_without_docstrings():
    """python -OO strips docstrings; the shared text is then not filled in, and nothing
    breaks."""
    # The resnorm this suite imported (the installed one, or src/ in a development build).
    src = Path(resnorm.__file__).resolve().parent.parent
    code = ("import resnorm, resnorm.nn as nn; assert nn.PreNormBlock.__doc__ is None; "
            "print(resnorm.explain('rms', [1.0, 2.0]).agree)")
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-OO", "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
