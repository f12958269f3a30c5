"""One test per row of docs/input-checks.md, run against every public function it applies to.

test_<id> tests the row `<id>` (dashes as underscores).  The first two tests keep the
table, these tests and the public API in step: a new public function, argument or table
row without a test fails here.
"""
import dataclasses
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import resnorm
from resnorm import _checks
from api_table import (BACKWARDS, DTYPES, FORWARDS, NO_ARRAY_FUNCTIONS, OPS, TRAINING,
                       assert_matches_reference, assert_same_bits, layouts, make_inputs,
                       public_functions)

TABLE = Path(__file__).resolve().parents[1] / "docs" / "input-checks.md"
INFERENCE = [name for name, op in OPS.items() if op.form == "inference"]
D = 6


def documented_rows():
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", TABLE.read_text(), flags=re.M)
    assert len(rows) == len(set(rows)), "duplicate row ids"
    return rows


def test_every_documented_check_has_a_test():
    tests = {name[len("test_"):] for name, f in globals().items()
             if name.startswith("test_") and inspect.isfunction(f)}
    meta = {"every_documented_check_has_a_test", "every_public_function_and_argument_is_covered"}
    rows = {row.replace("-", "_") for row in documented_rows()}
    assert rows - tests == set(), "documented rows without a test"
    assert tests - meta - rows == set(), "tests without a documented row"


# Every argument name of a public function, and the rows that check it.
ARGUMENT_ROWS = {
    "x": "x-", "weight": "partner-", "bias": "partner-", "dy": "partner-", "eps": "eps-",
    "n_threads": "n-threads-", "out": "out-", "cache": "cache-",
}


def not_yet_covered():
    """The public functions the table lists as not yet in OPS."""
    text = TABLE.read_text()
    block = text[text.index("<!-- not-yet-covered -->"):text.index("<!-- /not-yet-covered -->")]
    return set(re.findall(r"`(\w+)`", block))


def test_every_public_function_and_argument_is_covered():
    """Every public function is in OPS or listed as not yet covered, never both; every
    argument of the functions in OPS has rows in the table."""
    listed = not_yet_covered()
    assert listed.isdisjoint(OPS), "in OPS and listed as not yet covered"
    assert public_functions() - NO_ARRAY_FUNCTIONS == set(OPS) | listed
    rows = documented_rows()
    for name in OPS:
        for arg in inspect.signature(getattr(resnorm, name)).parameters:
            assert arg in ARGUMENT_ROWS, f"{name}({arg}=...) has no rows in {TABLE.name}"
            assert any(r.startswith(ARGUMENT_ROWS[arg]) for r in rows), arg


# --------------------------------------------------------------------------- helpers

def good(dtype=np.float32, shape=(4, D), seed=0):
    return make_inputs(np.random.default_rng(seed), shape, dtype)


def partners(op):
    """The array arguments that must match x: weight / bias, or dy in backward."""
    return ("dy",) if op.form == "backward" else op.params


def raises(op, exc, arg, inp, **override):
    """op called on inp with some arguments replaced raises exc naming arg."""
    kw = {**op.kwargs(inp), **override}
    with pytest.raises(exc, match=rf"\b{arg}\b"):
        op.fn(**kw)


def each(names, args_of=None):
    """Parametrize over ops (and, with args_of, over (op, argument) pairs)."""
    if args_of is None:
        return pytest.mark.parametrize("op", [OPS[n] for n in names], ids=list(names))
    pairs = [(OPS[n], a) for n in names for a in args_of(OPS[n])]
    return pytest.mark.parametrize("op, arg", pairs, ids=[f"{o.name}-{a}" for o, a in pairs])


def foreign_byte_order(a):
    return a.astype(a.dtype.newbyteorder())


# --------------------------------------------------------------------------- x

@each(FORWARDS)
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_, np.float16,
                                   np.complex64, np.complex128, object, "U3"],
                         ids=lambda t: np.dtype(t).name)
def test_x_dtype(op, dtype):
    inp = good()
    raises(op, TypeError, "x", inp, x=inp.x.astype(dtype))


@each(FORWARDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_x_byteorder(op, dtype):
    inp = good(dtype)
    raises(op, TypeError, "x", inp, x=foreign_byte_order(inp.x))


@each(FORWARDS)
@pytest.mark.parametrize("bad", [None, {"a": 1.0}, [[1.0, 2.0], [3.0]]],
                         ids=["None", "dict", "ragged"])
def test_x_not_array_like(op, bad):
    raises(op, TypeError, "x", good(), x=bad)


@each(FORWARDS)
def test_x_python_sequence(op):
    inp = good(np.float64)
    for seq in (inp.x.tolist(), tuple(map(tuple, inp.x))):
        got = op.call(dataclasses.replace(inp, x=seq))
        want = op.call(inp)
        for name, value in op.outputs(want).items():
            assert_same_bits(op.outputs(got)[name], value, f"{op.name} {name}")


@each(FORWARDS)
@pytest.mark.parametrize("x", [3.0, np.float64(2.0), np.array(1.0), np.array(1.0, np.float32)],
                         ids=["py_float", "np_scalar", "0d_f8", "0d_f4"])
def test_x_scalar(op, x):
    raises(op, ValueError, "x", good(), x=x)


@each(FORWARDS)
@pytest.mark.parametrize("shape", [(3, 0), (0,), (2, 3, 0)], ids=str)
def test_x_empty_last_axis(op, shape):
    raises(op, ValueError, "x", good(), x=np.zeros(shape, np.float32))


@each(list(OPS))
@pytest.mark.parametrize("shape", [(0, D), (2, 0, D)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_x_no_rows(op, shape, dtype):
    inp = good(dtype, shape)
    got = op.run(inp)
    for name, value in got.items():
        if name in ("y", "dx"):
            assert value.shape == shape and value.dtype == dtype
        elif name in ("mean", "rstd"):
            assert value.shape == shape[:-1] and value.dtype == np.float64
        else:  # the sum over no rows
            assert value.dtype == dtype and np.array_equal(value, np.zeros(D))


@each(list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_x_huge_d(op, dtype):
    inp = make_inputs(np.random.default_rng(3), (2, 2**20), dtype)
    assert_matches_reference(op, inp, op.run(inp))


@each(list(OPS), args_of=lambda op: op.arrays)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layout(op, arg, dtype):
    inp = make_inputs(np.random.default_rng(5), (5, 13), dtype)
    want = op.run(inp)
    for layout, view in layouts(getattr(inp, arg)).items():
        before = view.copy()
        got = op.run(dataclasses.replace(inp, **{arg: view}))
        for name, value in want.items():
            assert_same_bits(got[name], value, f"{op.name} {name}, {arg} {layout}")
        assert_same_bits(view, before, f"{arg} {layout} modified")


@each(list(OPS), args_of=lambda op: op.arrays)
def test_masked(op, arg):
    inp = good()
    value = getattr(inp, arg)
    mask = np.zeros(value.shape, bool)
    mask.flat[0] = True
    raises(op, TypeError, arg, inp, **{arg: np.ma.array(value, mask=mask)})


# --------------------------------------------------------------------------- partners

@each(list(OPS), args_of=partners)
@pytest.mark.parametrize("x_dtype, dtype", [
    (np.float32, np.float64), (np.float64, np.float32), (np.float32, np.float16),
    (np.float32, np.int32), (np.float32, np.bool_), (np.float64, np.complex128),
], ids=lambda t: np.dtype(t).name)
def test_partner_dtype(op, arg, x_dtype, dtype):
    inp = good(x_dtype)
    raises(op, TypeError, arg, inp, **{arg: getattr(inp, arg).astype(dtype)})


@each(list(OPS), args_of=partners)
@pytest.mark.parametrize("dtype", DTYPES)
def test_partner_byteorder(op, arg, dtype):
    inp = good(dtype)
    raises(op, TypeError, arg, inp, **{arg: foreign_byte_order(getattr(inp, arg))})


@each(list(OPS), args_of=partners)
def test_partner_shape(op, arg):
    inp = good()
    shapes = ([(4, D + 1), (D, 4), (4 * D,), (1, 4, D), (3, D)] if arg == "dy"
              else [(D + 1,), (D - 1,), (1, D), (D, 1), (), (4, D)])
    for shape in shapes:
        raises(op, ValueError, arg, inp, **{arg: np.ones(shape, np.float32)})


@each(list(OPS), args_of=partners)
def test_partner_python(op, arg):
    inp64 = good(np.float64)
    value = getattr(inp64, arg)
    want = op.outputs(op.call(inp64))
    got = op.outputs(op.fn(**{**op.kwargs(inp64), arg: value.tolist()}))
    for name in want:
        assert_same_bits(got[name], want[name], f"{op.name} {name} with {arg} as a list")
    inp32 = good(np.float32)
    raises(op, TypeError, arg, inp32, **{arg: getattr(inp32, arg).tolist()})
    raises(op, TypeError, arg, inp32, **{arg: 1.0})
    raises(op, ValueError, arg, inp64, **{arg: 1.0})


# --------------------------------------------------------------------------- eps, n_threads

@each(FORWARDS)
@pytest.mark.parametrize("eps", [True, np.bool_(False), "1e-5", None, 1j, np.array(1e-5),
                                 [1e-5]], ids=repr)
def test_eps_type(op, eps):
    raises(op, TypeError, "eps", good(), eps=eps)


@each(FORWARDS)
@pytest.mark.parametrize("eps", [0, 0.0, -0.0, -1e-5, float("nan"), float("inf"),
                                 -float("inf"), np.float32(0)], ids=repr)
def test_eps_value(op, eps):
    raises(op, ValueError, "eps", good(), eps=eps)


@each(FORWARDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_eps_tiny(op, dtype):
    tiny = float(np.finfo(dtype).tiny)
    raises(op, ValueError, "eps", good(dtype), eps=tiny / 2)
    raises(op, ValueError, "eps", good(dtype), eps=5e-324)
    # the smallest accepted eps keeps an all-zero row finite, forward and backward:
    # rstd = 1/sqrt(eps) fits the dtype
    inp = dataclasses.replace(good(dtype), x=np.zeros((4, D), dtype), eps=tiny)
    backward = [b for b in OPS.values() if b.forward == op.name]
    for each_op in [op] + backward:
        for name, value in each_op.run(inp).items():
            assert np.all(np.isfinite(value)), f"{each_op.name} {name}"


@each(list(OPS))
@pytest.mark.parametrize("nt", [1.5, 2.0, True, np.bool_(True), "2"], ids=repr)
def test_n_threads_type(op, nt):
    raises(op, TypeError, "n_threads", good(), n_threads=nt)


@each(list(OPS))
@pytest.mark.parametrize("nt", [0, -1, np.int64(0), _checks.MAX_THREADS + 1, 2**40, -2**70],
                         ids=repr)
def test_n_threads_value(op, nt):
    raises(op, ValueError, "n_threads", good(), n_threads=nt)
    # the bounds themselves are accepted (this input is too small to start threads)
    for ok in (1, _checks.MAX_THREADS, np.int32(2)):
        op.call(good(), n_threads=ok)


# --------------------------------------------------------------------------- out

@each(list(OPS))
def test_out_type(op):
    inp = good()
    raises(op, TypeError, "out", inp, out=np.empty_like(inp.x).tolist())


@each(list(OPS))
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32,
                                   np.dtype(np.float32).newbyteorder()],
                         ids=lambda t: np.dtype(t).str)
def test_out_dtype(op, dtype):
    inp = good()
    raises(op, TypeError, "out", inp, out=np.empty(inp.x.shape, dtype))


@each(list(OPS))
@pytest.mark.parametrize("shape", [(4, D + 1), (D, 4), (4 * D,), (1, 4, D)], ids=str)
def test_out_shape(op, shape):
    raises(op, ValueError, "out", good(), out=np.empty(shape, np.float32))


@each(list(OPS))
def test_out_read_only(op):
    inp = good()
    out = np.zeros_like(inp.x)
    out.setflags(write=False)
    raises(op, ValueError, "out", inp, out=out)


@each(list(OPS), args_of=lambda op: op.arrays)
def test_out_overlap(op, arg):
    """Rank-1 inputs, so that out can overlap a (D,) weight too."""
    rng = np.random.default_rng(7)
    inp = make_inputs(rng, (D,), np.float32)
    buf = rng.standard_normal(2 * D).astype(np.float32)
    buf0 = buf.copy()
    kw = op.kwargs(dataclasses.replace(inp, **{arg: buf[:D]}))
    with pytest.raises(ValueError, match=r"\bout\b"):
        op.fn(**kw, out=buf[D // 2: D // 2 + D])
    assert_same_bits(buf, buf0, "written before the error")


def _in_place_cases():
    """(op, argument, shape): out may be exactly x, weight or bias (inference forms) or dy
    (backward); a (D,) weight or bias has the shape of out only for rank-1 input."""
    for name in INFERENCE + BACKWARDS:
        op = OPS[name]
        for arg in ("dy",) if op.form == "backward" else ("x",) + op.params:
            for shape in [(D,), (5, D), (2, 3, D)]:
                if arg == "x" or arg == "dy" or len(shape) == 1:
                    yield pytest.param(op, arg, shape, id=f"{name}-{arg}-{shape}")


@pytest.mark.parametrize("op, arg, shape", list(_in_place_cases()))
def test_out_in_place(op, arg, shape):
    inp = make_inputs(np.random.default_rng(9), shape, np.float64)
    want = op.outputs(op.call(inp))
    target = getattr(inp, arg).copy()
    got = op.outputs(op.fn(**{**op.kwargs(inp), arg: target}, out=target))
    assert got[op.output] is target
    for name, value in want.items():
        assert_same_bits(got[name], value, f"{op.name} {name} with out={arg}")


@each(TRAINING, args_of=lambda op: ("x",) + op.params)
def test_out_training(op, arg):
    inp = good(np.float64, (D,))
    target = getattr(inp, arg)
    before = target.copy()
    raises(op, ValueError, "out", inp, out=target)
    # also a view of it: any shared memory is refused
    raises(op, ValueError, "out", inp, out=np.lib.stride_tricks.as_strided(
        target, shape=(D,), strides=(0,)))
    assert_same_bits(target, before, f"{arg} modified")


@each(BACKWARDS)
def test_out_cache(op):
    inp = good(np.float64, (4, 1))
    kw = op.kwargs(inp)
    cache = kw["cache"]
    views = {"x": cache.x.reshape(4, 1), "rstd": cache.rstd.reshape(4, 1)}
    if op.norm == "ln":
        views["mean"] = cache.mean.reshape(4, 1)
    for name, view in views.items():
        before = view.copy()
        with pytest.raises(ValueError, match=rf"\bout\b.*\b{name}\b"):
            op.fn(**kw, out=view)
        assert_same_bits(view, before, f"cache {name} modified")
    one = op.kwargs(good(np.float64, (D,)))  # a single row: out may have the weight's shape
    with pytest.raises(ValueError, match=r"\bout\b.*\bweight\b"):
        op.fn(**one, out=one["cache"].weight)


@each(list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_out_layout(op, dtype):
    inp = good(dtype, (5, 13))
    want = op.outputs(op.call(inp))[op.output]
    buf = np.full((5, 2 * 13), -7.0, dtype)
    raw = np.zeros(want.nbytes + 1, np.uint8)
    outs = {"strided": buf[:, ::2], "fortran": np.asfortranarray(np.zeros_like(want)),
            "misaligned": np.frombuffer(raw.data, dtype, want.size, offset=1).reshape(want.shape)}
    for layout, out in outs.items():
        got = op.outputs(op.call(inp, out=out))[op.output]
        assert got is out
        assert_same_bits(np.ascontiguousarray(out), want, f"{op.name} out {layout}")
    assert np.all(buf[:, 1::2] == -7.0), "wrote outside the out view"
    assert raw[0] == 0, "wrote before the misaligned out"


# --------------------------------------------------------------------------- cache

@each(BACKWARDS)
def test_cache_type(op):
    inp = good()
    other = "layer_norm_forward" if op.norm == "rms" else "rms_norm_forward"
    _, wrong = OPS[other].call(inp)
    for bad in (wrong, None, (inp.x, inp.weight), {"x": inp.x}):
        raises(op, TypeError, "cache", inp, cache=bad)


@each(BACKWARDS)
def test_cache_edited(op):
    inp = good()
    cache = op.kwargs(inp)["cache"]
    edits = {
        "short rstd": {"rstd": cache.rstd[:-1]},
        "float32 rstd": {"rstd": cache.rstd.astype(np.float32)},
        "strided rstd": {"rstd": np.repeat(cache.rstd, 2)[::2]},
        "rstd list": {"rstd": cache.rstd.tolist()},
        "narrow x": {"x": np.ascontiguousarray(cache.x[:, :-1])},
        "x view": {"x": cache.x[:, :-1]},
        "x float16": {"x": cache.x.astype(np.float16)},
        "x rank 1": {"x": cache.x.ravel()},
        "short weight": {"weight": cache.weight[:-1]},
        "float64 weight": {"weight": cache.weight.astype(np.float64)},
        "shape": {"shape": (99, D)},
        "shape list": {"shape": [4, D]},
    }
    if op.norm == "ln":
        edits["short mean"] = {"mean": cache.mean[:-1]}
    for what, change in edits.items():
        try:
            op.fn(inp.dy, dataclasses.replace(cache, **change))
        except ValueError as e:
            assert "cache" in str(e), what
        else:
            pytest.fail(f"a cache with {what} was accepted")


# --------------------------------------------------------------------------- dropout

def _dropout_functions():
    """The public functions taking x and a dropout probability p."""
    for name in sorted(public_functions()):
        params = list(inspect.signature(getattr(resnorm, name)).parameters)
        if "p" in params and params[0] == "x":
            yield name


def test_dropout_p():
    names = list(_dropout_functions())
    assert names, "no public function takes p"
    x = good().x
    for name in names:
        fn = getattr(resnorm, name)
        params = inspect.signature(fn).parameters
        kw = {k: v for k, v in {"x": x, "residual": np.ones_like(x), "seed": 3}.items()
              if k in params}
        for p, exc in [(-0.1, ValueError), (1.5, ValueError), (float("nan"), ValueError),
                       (float("inf"), ValueError), ("0.1", TypeError), (None, TypeError),
                       (True, TypeError), (1j, TypeError)]:
            with pytest.raises(exc, match=r"\bp\b"):
                fn(**kw, p=p)
        for p in (0.0, 0.5, 1.0):  # p = 1 drops everything: finite outputs still
            result = fn(**kw, p=p)
            for a in result if isinstance(result, tuple) else (result,):
                if isinstance(a, np.ndarray):
                    assert np.all(np.isfinite(a)), f"{name}(p={p})"
