"""The public kernel functions are the compiled functions their Python declarations name
(resnorm._compiled): same signature, the declaration's docstring, module and type hints,
and a declaration that disagrees with its compiled function stops the import."""
import inspect
import pickle
import typing

import numpy as np
import pytest

import resnorm
from resnorm import _api, gated_norm, inverted_dropout, norms, residual
from resnorm._compiled import compiled

FACES = [(module, name) for module in (norms, residual, gated_norm, inverted_dropout)
         for name in module.__all__ if inspect.isfunction(inspect.unwrap(getattr(module, name)))
         and getattr(module, name).__module__ == module.__name__]


def test_every_kernel_function_is_declared():
    names = {name for _, name in FACES}
    assert len(names) == 30
    assert {"rms_norm", "add_layer_norm_post_backward", "dropout_forward"} <= names


@pytest.mark.parametrize("module, name", FACES, ids=[n for _, n in FACES])
def test_the_public_function_is_the_compiled_one(module, name):
    fn = getattr(module, name)
    assert fn is getattr(_api, name) is getattr(resnorm, name)
    face = fn.__wrapped__
    assert inspect.isfunction(face) and face.__name__ == name
    assert fn.__doc__ is face.__doc__ and fn.__module__ == module.__name__
    assert fn.__qualname__ == name
    plain = [(p.name, p.kind, p.default) for p in inspect.signature(face).parameters.values()]
    compiled_plain = [(p.name, p.kind, p.default) for p in
                      inspect.signature(fn, follow_wrapped=False).parameters.values()]
    assert plain == compiled_plain
    assert inspect.signature(fn) == inspect.signature(face)   # with the type hints
    assert typing.get_type_hints(fn) == typing.get_type_hints(face)
    assert pickle.loads(pickle.dumps(fn)) is fn   # by reference, as a Python function


def _declare(signature_source):
    namespace = {}
    exec(signature_source, namespace)
    return namespace["rms_norm"]


@pytest.mark.parametrize("source", [
    "def rms_norm(x, weight=None, eps=1e-5, *, normalized_shape=None,\n"
    "             zero_centered_weight=False, out=None, n_threads=None): ...",
    "def rms_norm(x, weight=None, eps=1e-6, normalized_shape=None,\n"
    "             zero_centered_weight=False, out=None, n_threads=None): ...",
    "def rms_norm(x, weight=None, eps=1e-6, *, normalized_shape=None,\n"
    "             zero_centered_weight=False, out=None): ...",
    "def rms_norm(x, w=None, eps=1e-6, *, normalized_shape=None,\n"
    "             zero_centered_weight=False, out=None, n_threads=None): ...",
], ids=["default", "kind", "missing", "name"])
def test_a_declaration_unlike_its_compiled_function_is_refused(source):
    doc = _api.rms_norm.__doc__
    with pytest.raises(TypeError, match=r"resnorm\._api\.rms_norm takes"):
        compiled(_declare(source))
    assert _api.rms_norm.__doc__ is doc   # refused before anything was changed


def test_keywords_are_parsed_like_the_declaration():
    x = np.arange(1.0, 9.0).reshape(2, 4)
    w = np.linspace(0.5, 2.0, 4)
    expected = resnorm.rms_norm(x, w, 1e-5)
    np.testing.assert_array_equal(resnorm.rms_norm(x, weight=w, eps=1e-5), expected)
    np.testing.assert_array_equal(resnorm.rms_norm(eps=1e-5, x=x, weight=w), expected)
    with pytest.raises(TypeError):
        resnorm.rms_norm(x, w, 1e-5, None)   # normalized_shape is keyword-only
    with pytest.raises(TypeError, match="epsilon"):
        resnorm.rms_norm(x, epsilon=1e-5)
    with pytest.raises(TypeError, match="seed"):
        resnorm.dropout(x, 0.5)               # seed is keyword-only and required
