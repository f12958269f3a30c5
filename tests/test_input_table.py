"""One test per row of docs/input-checks.md, run against every public function it applies to.

test_<id> tests the row `<id>` (dashes as underscores).  The first two tests keep the
table, these tests and the public API in step: a new public function, argument or table
row without a test fails here.
"""
import dataclasses
import functools
import inspect
import math
import re
from pathlib import Path

import numpy as np
import pytest

import resnorm
from resnorm import _checks
from api_table import (BACKWARDS, DTYPES, ELEMENTWISE_OUTPUTS, FORWARDS, INFERENCE,
                       NO_ARRAY_FUNCTIONS, OPS, ROW_OUTPUTS, TRAINING, assert_matches_reference,
                       assert_same_bits, layouts, make_inputs, public_functions, with_data)

TABLE = Path(__file__).resolve().parents[1] / "docs" / "input-checks.md"
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
    "residual": "partner-", "dh": "partner-", "F": "partner-", "g": "partner-",
    "gate": "partner-", "group_size": "group-size-", "norm_before_gate": "flag-",
    "alpha": "alpha-", "p": "dropout-p", "seed": "seed-", "training": "flag-",
    "return_mask": "flag-", "residual_out": "out-", "dresidual_out": "out-",
    "dbranch_out": "out-", "dgate_out": "out-", "normalized_shape": "normalized-shape-",
    "zero_centered_weight": "zero-centered-weight",
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

def good(dtype=np.float32, shape=(4, D), seed=0, **kw):
    return make_inputs(np.random.default_rng(seed), shape, dtype, **kw)


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


def taking(arg):
    """The ops with this argument."""
    return [name for name, op in OPS.items() if arg in op.parameters]


def with_buffers(names):
    """The ops of names that take an output buffer (out, residual_out)."""
    return [n for n in names if OPS[n].buffers]


def foreign_byte_order(a):
    return a.astype(a.dtype.newbyteorder())


def assert_same_outputs(got, want, what):
    for name, value in want.items():
        assert_same_bits(got[name], value, f"{what}: {name}")


# --------------------------------------------------------------------------- x

# the families whose kernels take float16 and bfloat16 (tests/test_half.py checks them)
HALF_FAMILIES = ("rms", "ln", "add_rms", "add_ln", "add_rms_post", "add_ln_post", "scaled",
                 "gated", "gated_rms", "dropout")


@each(FORWARDS)
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_, np.float16,
                                   np.complex64, np.complex128, object, "U3"],
                         ids=lambda t: np.dtype(t).name)
def test_x_dtype(op, dtype):
    inp = good()
    args = [a for a in op.partners + ("weight", "bias") if a in op.args]
    if dtype is np.float16 and op.family in ("rms", "ln"):
        # the norms take float32 weight and bias beside 16-bit x (mixed precision)
        y = op.run(inp, x=inp.x.astype(dtype))[op.returns[0]]
        assert y.dtype == np.float16
    elif dtype is np.float16 and op.family in HALF_FAMILIES and args:
        # an element type of these: then the first float32 partner or parameter is named
        raises(op, TypeError, args[0], inp, x=inp.x.astype(dtype))
    elif dtype is np.float16 and op.family in HALF_FAMILIES:   # x alone: it is taken
        y = op.run(inp, x=inp.x.astype(dtype))[op.returns[0]]
        assert y.dtype == np.float16
    else:
        raises(op, TypeError, "x", inp, x=inp.x.astype(dtype))


@each(FORWARDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_x_byteorder(op, dtype):
    inp = good(dtype)
    raises(op, TypeError, "x", inp, x=foreign_byte_order(inp.x))


@each(FORWARDS)
@pytest.mark.parametrize("bad", [None, {"a": 1.0}, [[1.0, 2.0], [3.0]], "tensor"],
                         ids=["None", "dict", "ragged", "torch_tensor_requiring_grad"])
def test_x_not_array_like(op, bad):
    if bad == "tensor":   # its conversion raises torch's RuntimeError, which must not leak
        torch = pytest.importorskip("torch")
        bad = torch.ones(good().x.shape, requires_grad=True)
    raises(op, TypeError, "x", good(), x=bad)


@each(FORWARDS)
def test_x_python_sequence(op):
    inp = good(np.float64)
    want = op.run(inp)
    for seq in (inp.x.tolist(), tuple(map(tuple, inp.x))):
        assert_same_outputs(op.run(dataclasses.replace(inp, x=seq)), want, op.name)


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
        if name in ELEMENTWISE_OUTPUTS or value.shape == shape:
            assert value.shape == shape and value.dtype == dtype, name
        elif name in ROW_OUTPUTS:
            assert value.shape == shape[:-1] and value.dtype == np.float64, name
        else:  # the sum over no rows: dweight, dbias, dalpha, a per-channel dg
            assert value.dtype == dtype and value.shape == (D,), name
            assert np.array_equal(value, np.zeros(D)), name


@functools.lru_cache(maxsize=2)
def _huge_d_inputs(dtype):
    """One set of inputs per dtype for every function (they leave them unchanged)."""
    return make_inputs(np.random.default_rng(3), (2, 2**20), dtype)


@each(list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_x_huge_d(op, dtype):
    inp = _huge_d_inputs(dtype)
    assert_matches_reference(op, inp, op.run(inp))


@each(list(OPS), args_of=lambda op: op.arrays)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layout(op, arg, dtype):
    inp = make_inputs(np.random.default_rng(5), (5, 13), dtype)
    want = op.run(inp)
    for layout, view in layouts(getattr(inp, arg)).items():
        before = view.copy()
        got = op.run(dataclasses.replace(inp, **{arg: view}))
        assert_same_outputs(got, want, f"{op.name}, {arg} {layout}")
        assert_same_bits(view, before, f"{arg} {layout} modified")


@each(list(OPS), args_of=lambda op: op.arrays + tuple(op.buffers))
def test_masked(op, arg):
    inp = good()
    value = getattr(inp, arg) if arg in op.arrays else np.zeros_like(inp.x)
    mask = np.zeros(value.shape, bool)
    mask.flat[0] = True
    raises(op, TypeError, arg, inp, **{arg: np.ma.array(value, mask=mask)})


# --------------------------------------------------------------------------- partners

@each(list(OPS), args_of=lambda op: op.partners)
@pytest.mark.parametrize("x_dtype, dtype", [
    (np.float32, np.float64), (np.float64, np.float32), (np.float32, np.float16),
    (np.float32, np.int32), (np.float32, np.bool_), (np.float64, np.complex128),
], ids=lambda t: np.dtype(t).name)
def test_partner_dtype(op, arg, x_dtype, dtype):
    inp = good(x_dtype)
    raises(op, TypeError, arg, inp, **{arg: getattr(inp, arg).astype(dtype)})


@each(list(OPS), args_of=lambda op: op.partners)
@pytest.mark.parametrize("dtype", DTYPES)
def test_partner_byteorder(op, arg, dtype):
    inp = good(dtype)
    raises(op, TypeError, arg, inp, **{arg: foreign_byte_order(getattr(inp, arg))})


@each(list(OPS), args_of=lambda op: op.partners)
def test_partner_shape(op, arg):
    inp = good()
    if getattr(inp, arg).shape == inp.x.shape:   # residual, F, g, dy, dh
        shapes = [(4, D + 1), (D, 4), (4 * D,), (1, 4, D), (3, D)]
    else:                                        # weight, bias, alpha (which may be 0-d)
        shapes = [(D + 1,), (D - 1,), (1, D), (D, 1), (4, D)] + ([()] if arg != "alpha" else [])
    for shape in shapes:
        raises(op, ValueError, arg, inp, **{arg: np.ones(shape, np.float32)})


@each(list(OPS), args_of=lambda op: [a for a in op.partners if a != "alpha"])
def test_partner_python(op, arg):
    inp64 = good(np.float64)
    value = getattr(inp64, arg)
    want = op.outputs(op.call(inp64))
    got = op.outputs(op.fn(**{**op.kwargs(inp64), arg: value.tolist()}))
    assert_same_outputs(got, want, f"{op.name} with {arg} as a list")
    inp32 = good(np.float32)
    raises(op, TypeError, arg, inp32, **{arg: getattr(inp32, arg).tolist()})
    raises(op, TypeError, arg, inp32, **{arg: 1.0})
    raises(op, ValueError, arg, inp64, **{arg: 1.0})


# --------------------------------------------------------------------------- alpha, gate

def _alpha_cases(dtype):
    """(alpha as passed, the same values as a (D,) array, learnable)."""
    return [(0.5, np.full(D, 0.5, dtype), False), (np.float32(-2.0), np.full(D, -2.0, dtype), False),
            (np.array(0.25, dtype), np.full(D, 0.25, dtype), True)]


@each(taking("alpha"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_alpha_kind(op, dtype):
    """A real number is a fixed scale and a 0-d array a learnable scalar: both compute what
    the (D,) array of their value computes; backward's dalpha is None, shape () or (D,)."""
    inp = good(dtype)
    backward = [OPS[n] for n in BACKWARDS if OPS[n].forward == op.name]
    for alpha, vector, learnable in _alpha_cases(dtype):
        got = op.run(dataclasses.replace(inp, alpha=alpha))
        assert_same_outputs(got, op.run(dataclasses.replace(inp, alpha=vector)),
                            f"{op.name} alpha={alpha!r}")
        for b in backward:
            case = dataclasses.replace(inp, alpha=alpha)
            grads = b.run(case)
            assert (grads["dalpha"] is not None) == learnable
            if learnable:
                assert grads["dalpha"].shape == () and grads["dalpha"].dtype == dtype
            assert_matches_reference(b, case, grads)
    for bad in ([0.5] * D, None, "0.5", True, np.bool_(True), 1j):
        raises(op, TypeError, "alpha", inp, alpha=bad)


@each(taking("alpha"))
@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -float("inf"), np.float64("nan")],
                         ids=repr)
def test_alpha_value(op, alpha):
    raises(op, ValueError, "alpha", good(), alpha=alpha)


@each([n for n in OPS if OPS[n].family == "gated"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gate_per_channel(op, dtype):
    inp = good(dtype, gate="channel")
    assert inp.g.shape == (D,)
    got = op.run(inp)
    assert_matches_reference(op, inp, got)
    if "dg" in got:
        assert got["dg"].shape == (D,)


# --------------------------------------------------------------------------- norm options

def _with_backward(names):
    """names and the backward functions of those that are training forms."""
    return list(names) + [n for n in BACKWARDS if OPS[n].forward in names]


@each(taking("normalized_shape"))
@pytest.mark.parametrize("bad", [6.0, "6", True, np.bool_(True), (6.0,), (True,), [4, "6"],
                                 np.array([6]), {6: 1}], ids=repr)
def test_normalized_shape_type(op, bad):
    raises(op, TypeError, "normalized_shape", good(), normalized_shape=bad)


@each(taking("normalized_shape"))
@pytest.mark.parametrize("bad", [(), (0,), (-D,), (D + 1,), (3, D), (2, 4, D), [5]], ids=repr)
def test_normalized_shape_value(op, bad):
    raises(op, ValueError, "normalized_shape", good(), normalized_shape=bad)


# (x's shape, normalized axes): torch's OpInfo samples normalise (1, 2, 3); all axes; one
NORMALIZED = [((4, 1, 2, 3), 3), ((3, 5, 8), 2), ((2, 3, 4, 5), 2), ((5, D), 2), ((2, 7), 1)]


@each(_with_backward(taking("normalized_shape")))
@pytest.mark.parametrize("shape, axes", NORMALIZED, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_normalized_shape_axes(op, shape, axes, dtype):
    """A row is the normalised axes' elements together: the outputs match the reference,
    have the shapes of torch's (statistics over the leading axes, parameter gradients of
    normalized_shape), and are bitwise those of the same rows flattened to (..., D)."""
    inp = make_inputs(np.random.default_rng(11), shape, dtype, axes=axes)
    if axes == 1:   # an int is the last axis, as None is
        inp = dataclasses.replace(inp, normalized_shape=shape[-1])
    got = op.run(inp)
    assert_matches_reference(op, dataclasses.replace(inp, normalized_shape=shape[-axes:]), got)
    lead, row = shape[:-axes], shape[-axes:]
    d = math.prod(row)
    flat = {name: a.reshape(a.shape[:a.ndim - axes] + (d,)) if a.ndim >= axes else a
            for name, a in inp.arrays().items() if name not in ("g", "F")}
    want = op.run(dataclasses.replace(inp, **flat, normalized_shape=None))
    for name, value in got.items():
        if value is None:
            assert want[name] is None, name
            continue
        if name in ROW_OUTPUTS:
            assert value.shape == lead, name
        elif name in ("dweight", "dbias") or (name == "dalpha" and value.ndim):
            assert value.shape == row, name
        else:
            assert value.shape == shape, name
        assert_same_bits(value.reshape(want[name].shape), want[name], f"{op.name} {name}")
    if "weight" in op.args and axes > 1:  # parameters must have the normalised shape
        raises(op, ValueError, "weight", inp, weight=inp.weight.reshape(-1))


@each(_with_backward(taking("zero_centered_weight")))
@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_centered_weight(op, dtype):
    """The gain is 1 + weight, rounded once in x's dtype: bitwise the outputs of passing
    that gain as the weight (dweight too: the same sums); the reference agrees; without a
    weight the flag changes nothing."""
    inp = good(dtype, zero_centered_weight=True)
    got = op.run(inp)
    assert_matches_reference(op, inp, got)
    plain = dataclasses.replace(inp, weight=(1 + inp.weight).astype(dtype),
                                zero_centered_weight=False)
    assert_same_outputs(got, op.run(plain), f"{op.name} zero-centred")
    none = dataclasses.replace(inp, weight=None)
    assert_same_outputs(op.run(none), op.run(dataclasses.replace(none, zero_centered_weight=False)),
                        f"{op.name} zero-centred without a weight")


# --------------------------------------------------------------------------- group_size, gate

@each(taking("group_size"))
@pytest.mark.parametrize("bad", [2.0, np.float64(3.0), "2", True, np.bool_(True),
                                 np.array(2), (2,), [3]], ids=repr)
def test_group_size_type(op, bad):
    raises(op, TypeError, "group_size", good(), group_size=bad)


@each(taking("group_size"))
@pytest.mark.parametrize("bad", [0, -1, -D, 4, 5, D + 1, 2 * D, np.int64(4), 2**70], ids=repr)
def test_group_size_value(op, bad):
    raises(op, ValueError, "group_size", good(), group_size=bad)


@each(_with_backward(taking("group_size")))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_before_gate", [False, True], ids=["gate_first", "norm_first"])
def test_group_size_groups(op, dtype, norm_before_gate):
    """Each group of group_size consecutive elements is normalised on its own, with its
    slice of the weight: the reference agrees for every divisor of D, with one rstd per
    group; group_size=D is bitwise None, and a NumPy integer is the Python int."""
    inp = dataclasses.replace(good(dtype, (3, 2, D)), norm_before_gate=norm_before_gate)
    for gs in (1, 2, 3, D):
        case = dataclasses.replace(inp, group_size=gs)
        got = op.run(case)
        assert_matches_reference(op, case, got)
        if "rstd" in got:
            assert got["rstd"].shape == (3, 2) + ((D // gs,) if gs < D else ())
        assert_same_outputs(op.run(dataclasses.replace(inp, group_size=np.int64(gs))), got,
                            f"{op.name} group_size=np.int64({gs})")
    assert_same_outputs(op.run(dataclasses.replace(inp, group_size=D)), op.run(inp),
                        f"{op.name} group_size=D")


@each(_with_backward(taking("gate")))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_before_gate", [False, True], ids=["gate_first", "norm_first"])
def test_gate_none(op, dtype, norm_before_gate):
    """No gate: the (grouped) RMSNorm of x, whichever norm_before_gate; dgate is None, and
    a dgate_out is refused."""
    inp = dataclasses.replace(good(dtype), gate=None, norm_before_gate=norm_before_gate)
    got = op.run(inp)
    assert_matches_reference(op, inp, got)
    assert_same_outputs(got, op.run(dataclasses.replace(inp, norm_before_gate=False)), op.name)
    if "dgate" in got:
        assert got["dgate"] is None
        raises(op, ValueError, "dgate_out", inp, dgate_out=np.zeros_like(inp.x))


# --------------------------------------------------------------------------- eps, n_threads

@each(taking("eps"))
@pytest.mark.parametrize("eps", [True, np.bool_(False), "1e-5", None, 1j, np.array(1e-5),
                                 [1e-5]], ids=repr)
def test_eps_type(op, eps):
    raises(op, TypeError, "eps", good(), eps=eps)


@each(taking("eps"))
@pytest.mark.parametrize("eps", [0, 0.0, -0.0, -1e-5, float("nan"), float("inf"),
                                 -float("inf"), np.float32(0)], ids=repr)
def test_eps_value(op, eps):
    raises(op, ValueError, "eps", good(), eps=eps)


@each(taking("eps"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_eps_tiny(op, dtype):
    tiny = float(np.finfo(dtype).tiny)
    raises(op, ValueError, "eps", good(dtype), eps=tiny / 2)
    raises(op, ValueError, "eps", good(dtype), eps=5e-324)
    # the smallest accepted eps keeps an all-zero row finite, forward and backward:
    # rstd = 1/sqrt(eps) fits the dtype
    inp = dataclasses.replace(with_data(op, good(dtype), np.zeros((4, D), dtype)), eps=tiny)
    backward = [b for b in OPS.values() if b.forward == op.name]
    for each_op in [op] + backward:
        for name, value in each_op.run(inp).items():
            assert value is None or np.all(np.isfinite(value)), f"{each_op.name} {name}"


@each(list(OPS))
@pytest.mark.parametrize("nt", [1.5, 2.0, True, np.bool_(True), "2"], ids=repr)
def test_n_threads_type(op, nt):
    raises(op, TypeError, "n_threads", good(), n_threads=nt)


@each(list(OPS))
@pytest.mark.parametrize("nt", [0, -2, np.int64(0), _checks.MAX_THREADS + 1, 2**40, -2**70],
                         ids=repr)
def test_n_threads_value(op, nt):
    raises(op, ValueError, "n_threads", good(), n_threads=nt)
    # the bounds themselves are accepted (this input is too small to start threads), and
    # -1 means every core
    for ok in (1, _checks.MAX_THREADS, np.int32(2), -1, np.int64(-1)):
        op.call(good(), n_threads=ok)


# --------------------------------------------------------------------------- p, seed, flags

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


@each(taking("seed"))
@pytest.mark.parametrize("seed", [1.5, np.float64(1.0), True, np.bool_(False), "1", None, 1j],
                         ids=repr)
def test_seed_type(op, seed):
    raises(op, TypeError, "seed", good(), seed=seed)


@each(taking("seed"))
def test_seed_required(op):
    """No default seed where a mask is drawn: one seed would drop the same elements on
    every call.  Where none is drawn (p = 0, eval mode) the seed may be left out."""
    inp = good()
    kw = {k: v for k, v in op.kwargs(inp).items() if k != "seed"}
    if op.name != "dropout" and op.name != "dropout_forward":   # seed is keyword-only there
        with pytest.raises(TypeError, match="seed is required when p > 0 in training"):
            op.fn(**kw)
    with pytest.raises(TypeError, match="seed is required when p > 0 in training"):
        op.fn(**kw, seed=None)
    off = [dict(p=0.0), dict(training=False)]
    for change in off:
        assert_same_outputs(op.outputs(op.fn(**{**kw, **change, "seed": None})),
                            op.run(dataclasses.replace(inp, **change)), op.name)


@each(taking("seed"))
def test_seed_value(op):
    for seed in (-1, 2**64, -2**70, np.int64(-1)):
        raises(op, ValueError, "seed", good(), seed=seed)
    # the bounds are accepted, and NumPy integers are the same seed as Python ints
    for seed in (0, 2**64 - 1):
        op.call(good(), seed=seed)
    assert_same_outputs(op.run(dataclasses.replace(good(), seed=np.uint64(2**63 + 5))),
                        op.run(dataclasses.replace(good(), seed=2**63 + 5)), op.name)


@each(FORWARDS, args_of=lambda op: [a for a in ("training", "return_mask",
                                              "zero_centered_weight", "norm_before_gate")
                                    if a in op.parameters])
def test_flag_type(op, arg):
    for bad in (1, 0, None, "yes", 1.0, np.array(True)):
        raises(op, TypeError, arg, good(), **{arg: bad})
    assert_same_outputs(op.run(good(), **{arg: np.bool_(False)}),
                        op.run(good(), **{arg: False}), op.name)


# --------------------------------------------------------------------------- out

def _buffers(names):
    """(op, buffer) pairs: every output buffer argument of every op in names."""
    return [n for n in names if OPS[n].buffers], lambda op: list(op.buffers)


@each(*_buffers(OPS))
def test_out_type(op, arg):
    inp = good()
    raises(op, TypeError, arg, inp, **{arg: np.empty_like(inp.x).tolist()})


@each(*_buffers(OPS))
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32,
                                   np.dtype(np.float32).newbyteorder()],
                         ids=lambda t: np.dtype(t).str)
def test_out_dtype(op, arg, dtype):
    inp = good()
    raises(op, TypeError, arg, inp, **{arg: np.empty(inp.x.shape, dtype)})


@each(*_buffers(OPS))
@pytest.mark.parametrize("shape", [(4, D + 1), (D, 4), (4 * D,), (1, 4, D)], ids=str)
def test_out_shape(op, arg, shape):
    raises(op, ValueError, arg, good(), **{arg: np.empty(shape, np.float32)})


@each(*_buffers(OPS))
def test_out_read_only(op, arg):
    inp = good()
    out = np.zeros_like(inp.x)
    out.setflags(write=False)
    raises(op, ValueError, arg, inp, **{arg: out})


def _overlap_cases():
    for name in with_buffers(OPS):
        op = OPS[name]
        for buffer in op.buffers:
            for arg in op.arrays + tuple(b for b in op.buffers if b != buffer):
                yield pytest.param(op, buffer, arg, id=f"{name}-{buffer}-{arg}")


@pytest.mark.parametrize("op, buffer, arg", list(_overlap_cases()))
def test_out_overlap(op, buffer, arg):
    """Rank-1 inputs, so that out can overlap a (D,) weight too; arg may also be the other
    output buffer."""
    rng = np.random.default_rng(7)
    inp = make_inputs(rng, (D,), np.float32)
    buf = rng.standard_normal(2 * D).astype(np.float32)
    buf0 = buf.copy()
    if arg in op.buffers:
        kw = {**op.kwargs(inp), arg: buf[:D]}
    else:
        kw = op.kwargs(dataclasses.replace(inp, **{arg: buf[:D]}))
    with pytest.raises(ValueError, match=rf"\b{buffer}\b"):
        op.fn(**kw, **{buffer: buf[D // 2: D // 2 + D]})
    assert_same_bits(buf, buf0, "written before the error")


def _in_place_cases():
    """(op, buffer, argument, shape): inference forms and backward may write over exactly
    one of their array arguments; a (D,) weight, bias or alpha has the shape of out only
    for rank-1 input."""
    for name in with_buffers(INFERENCE + BACKWARDS):
        op = OPS[name]
        for buffer in op.buffers:
            for arg in op.arrays:
                for shape in [(D,), (5, D), (2, 3, D)]:
                    if arg not in ("weight", "bias", "alpha") or len(shape) == 1:
                        yield pytest.param(op, buffer, arg, shape,
                                           id=f"{name}-{buffer}={arg}-{shape}")


@pytest.mark.parametrize("op, buffer, arg, shape", list(_in_place_cases()))
def test_out_in_place(op, buffer, arg, shape):
    inp = make_inputs(np.random.default_rng(9), shape, np.float64)
    want = op.run(inp)
    target = getattr(inp, arg).copy()
    got = op.outputs(op.fn(**{**op.kwargs(inp), arg: target}, **{buffer: target}))
    assert got[op.buffers[buffer]] is target
    assert_same_outputs(got, want, f"{op.name} with {buffer}={arg}")


@each(with_buffers(TRAINING), args_of=lambda op: [(b, a) for b in op.buffers for a in op.kept])
def test_out_training(op, arg):
    buffer, kept = arg
    inp = good(np.float64, (D,))
    target = getattr(inp, kept)
    before = target.copy()
    raises(op, ValueError, buffer, inp, **{buffer: target})
    # also a view of it: any shared memory is refused
    raises(op, ValueError, buffer, inp, **{buffer: np.lib.stride_tricks.as_strided(
        target, shape=(D,), strides=(0,))})
    assert_same_bits(target, before, f"{kept} modified")


def _elementwise_cache_arrays(op, inp):
    """(kwargs of a valid call on inp, name -> the arrays its cache holds, as views of the
    gradients' shape where they have their size): the scaled and gated residual backward."""
    shape = inp.x.shape
    kw = op.kwargs(inp)
    cache = kw["cache"]
    if op.family == "scaled":
        arrays = {"F": cache.branch, "alpha": cache.alpha.vector}
    else:
        arrays = {"F": cache.branch, "g": cache.gate, "s": cache.s, "ds": cache.ds}
    return kw, {name: a.reshape(shape) if a.size == math.prod(shape) else a
                for name, a in arrays.items() if a is not None}


def _out_cache_elementwise(op):
    """Every buffer of the scaled / gated backward against every array its cache holds of
    its shape: F and a full gate; with rank-1 input the (D,) alpha; a per-channel gate's s
    and ds, which dgate_out has the shape of."""
    checked = set()
    for shape, gate in (((4, D), "full"), ((D,), "full"), ((4, D), "channel")):
        inp = good(np.float64, shape, gate=gate)
        kw, arrays = _elementwise_cache_arrays(op, inp)
        grads = op.run(inp)
        for buffer in op.buffers:
            for name, view in arrays.items():
                if view.shape != grads[op.buffers[buffer]].shape:
                    continue
                before = view.copy()
                with pytest.raises(ValueError, match=rf"\b{buffer}\b.*\b{name}\b"):
                    op.fn(**kw, **{buffer: view})
                assert_same_bits(view, before, f"cache {name} modified")
                checked.add((buffer, name))
    names = {"scaled": ("F", "alpha"), "gated": ("F", "g", "s", "ds")}[op.family]
    assert {n for _, n in checked} == set(names)
    assert {b for b, _ in checked} == set(op.buffers)


def _out_cache_gated_rms(op):
    """Both buffers of the gated RMSNorm backward against every array its cache holds:
    x, the gate and rstd (rows of one element: rstd has dx's size), and with rank-1 input
    the (D,) weight."""
    for buffer in op.buffers:
        kw = op.kwargs(good(np.float64, (4, 1)))
        cache = kw["cache"]
        views = {"x": cache.x.reshape(4, 1), "gate": cache.gate.reshape(4, 1),
                 "rstd": cache.rstd.reshape(4, 1)}
        one = op.kwargs(good(np.float64, (D,)))
        for name, (call, view) in {**{n: (kw, v) for n, v in views.items()},
                                   "weight": (one, one["cache"].weight)}.items():
            before = view.copy()
            with pytest.raises(ValueError, match=rf"\b{buffer}\b.*\b{name}\b"):
                op.fn(**call, **{buffer: view})
            assert_same_bits(view, before, f"cache {name} modified")


@each([n for n in BACKWARDS if OPS[n].family in ("rms", "ln", "scaled", "gated", "gated_rms")])
def test_out_cache(op):
    if op.family in ("scaled", "gated"):
        _out_cache_elementwise(op)
        return
    if op.family == "gated_rms":
        _out_cache_gated_rms(op)
        return
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


@each(*_buffers(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_out_layout(op, arg, dtype):
    inp = good(dtype, (5, 13))
    name = op.buffers[arg]
    want = op.run(inp)[name]
    buf = np.full((5, 2 * 13), -7.0, dtype)
    raw = np.zeros(want.nbytes + 1, np.uint8)
    outs = {"strided": buf[:, ::2], "fortran": np.asfortranarray(np.zeros_like(want)),
            "misaligned": np.frombuffer(raw.data, dtype, want.size, offset=1).reshape(want.shape)}
    for layout, out in outs.items():
        got = op.run(inp, **{arg: out})[name]
        assert got is out
        assert_same_bits(np.ascontiguousarray(out), want, f"{op.name} {arg} {layout}")
    assert np.all(buf[:, 1::2] == -7.0), "wrote outside the out view"
    assert raw[0] == 0, "wrote before the misaligned out"


# --------------------------------------------------------------------------- cache

@each(BACKWARDS)
def test_cache_type(op):
    inp = good()
    other = TRAINING[(TRAINING.index(op.forward) + 1) % len(TRAINING)]
    _, wrong = OPS[other].call(inp)
    for bad in (wrong, None, (inp.x, inp.weight), {"x": inp.x}):
        raises(op, TypeError, "cache", inp, cache=bad)


def _edits(obj, path=()):
    """(what, path, value): edits that make one field of a cache (or of the dataclasses it
    holds: alpha, the dropout site) inconsistent with the rest."""
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        where = path + (field.name,)
        if dataclasses.is_dataclass(value):
            yield from _edits(value, where)
        elif isinstance(value, np.ndarray) and value.dtype != bool:
            other = np.float32 if value.dtype == np.float64 else np.float64
            yield "short", where, value[:-1]
            yield "float16", where, value.astype(np.float16)
            yield "other float", where, value.astype(other)
            yield "strided", where, np.repeat(value, 2, axis=-1)[..., ::2]
            yield "list", where, value.tolist()
            if value.ndim == 2:
                yield "narrow", where, np.ascontiguousarray(value[:, :-1])
                yield "rank 1", where, value.ravel()
    names = {f.name for f in dataclasses.fields(obj)}
    if "dtype" in names:
        yield "dtype", path + ("dtype",), np.dtype(np.complex64)
    if "kind" in names:
        yield "kind", path + ("kind",), "vector"
    if "p" in names:
        yield "p", path + ("p",), 2.0
        yield "seed", path + ("seed",), -1
        yield "training", path + ("training",), "yes"


def _replace(obj, path, value):
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: _replace(getattr(obj, path[0]), path[1:], value)})


@each(BACKWARDS)
def test_cache_edited(op):
    inp = good()
    kw = op.kwargs(inp)
    cache = kw.pop("cache")
    edits = list(_edits(cache))
    holds_arrays = any(isinstance(getattr(cache, f.name), np.ndarray)
                       for f in dataclasses.fields(cache))
    if holds_arrays:  # (a cache without arrays is defined by its shape: dy must match it)
        edits += [("shape", ("shape",), (99, D)), ("shape list", ("shape",), [4, D])]
    assert edits
    for what, path, value in edits:
        try:
            op.fn(**kw, cache=_replace(cache, path, value))
        except ValueError as e:
            assert "cache" in str(e), (what, path)
        else:
            pytest.fail(f"a cache with {'.'.join(path)} {what} was accepted")
