"""The gated RMSNorm (resnorm.gated_rms_norm, _forward, _backward) against its float64 NumPy
twin (resnorm.reference.gated_rms_norm_*), and the twin against finite differences and
against the Hugging Face modules' formulas run by torch's autograd.

Both gate orders, with and without gate and weight, group sizes None / 1 / a middle
divisor / D, odd sizes, no rows, ranks 1 to 3; float32 and float64 within the term-scaled
tolerances of tests/api_table.py, float16 and bfloat16 as the float32 kernel on the widened
inputs rounded once (and within one unit in the last place of float64 forward); thread
counts, layouts, output buffers, rows near the double range, extreme gate logits and bad
arguments.  The table-driven tests (test_input_table, test_properties, ...) run the three
functions too, through their entries in api_table.OPS.
"""
import dataclasses

import numpy as np
import pytest

import resnorm
from resnorm import reference as ref
from api_table import (OPS, RTOL, assert_close, assert_matches_reference, assert_same_bits,
                       make_inputs)
from conftest import central_diff
from test_half import HALVES, half, ulps

FORWARD, BACKWARD = OPS["gated_rms_norm_forward"], OPS["gated_rms_norm_backward"]
INFERENCE = OPS["gated_rms_norm"]
ORDERS = [pytest.param(False, id="gate_first"), pytest.param(True, id="norm_first")]
DBL_MAX = np.finfo(np.float64).max


def divisors(d):
    """None, 1, a middle divisor of d (if any) and d."""
    middle = [k for k in range(2, d) if d % k == 0]
    return list(dict.fromkeys([None, 1] + middle[len(middle) // 2:][:1] + [d]))


def inputs(rng, shape, dtype, gate=True, weight=True, group_size=None, norm_before_gate=False,
           gate_scale=3.0):
    """api_table inputs for the gated RMSNorm: gate logits of scale gate_scale (or None)."""
    inp = make_inputs(rng, shape, dtype, weight=weight)
    gz = (gate_scale * rng.standard_normal(shape)).astype(dtype) if gate else None
    return dataclasses.replace(inp, gate=gz, group_size=group_size,
                               norm_before_gate=norm_before_gate)


def run_all(inp, **kw):
    """{name: array} of the forward and backward (with dy) on inp, one call of each form;
    the inference form's y is checked to be the training form's, bit for bit."""
    got = {**FORWARD.run(inp, **kw), **BACKWARD.run(inp, **kw)}
    assert_same_bits(INFERENCE.run(inp, **kw)["y"], got["y"], "inference y")
    return got


# --------------------------------------------------------------------------- the reference

@pytest.mark.parametrize("norm_before_gate", ORDERS)
@pytest.mark.parametrize("shape, group_size", [((3, 6), None), ((3, 6), 1), ((3, 6), 2),
                                               ((2, 1), None), ((4,), 2), ((2, 2, 6), 3)],
                         ids=str)
@pytest.mark.parametrize("gate, weight", [(True, True), (True, False), (False, True)],
                         ids=["gate_w", "gate", "w"])
def test_reference_matches_finite_differences(rng, shape, group_size, norm_before_gate, gate,
                                              weight):
    """The reference's backward is dL/d(x, gate, weight) of L = sum(y * R), by central
    differences in float64 (eps 0.1: every group's rstd well conditioned)."""
    d = shape[-1]
    x, r = rng.standard_normal(shape), rng.standard_normal(shape)
    z = 2 * rng.standard_normal(shape) if gate else None
    w = 1 + 0.5 * rng.standard_normal(d) if weight else None

    def loss():
        return float(np.sum(ref.gated_rms_norm_forward(x, z, w, 0.1, group_size,
                                                       norm_before_gate)[0] * r))

    _, cache = ref.gated_rms_norm_forward(x, z, w, 0.1, group_size, norm_before_gate)
    grads = ref.gated_rms_norm_backward(r, cache)
    for name, a, got in zip(("dx", "dgate", "dweight"), (x, z, w), grads):
        if a is None:
            assert got is None, name
            continue
        numeric = central_diff(loss, a)
        assert got.shape == a.shape
        assert np.max(np.abs(got - numeric)) <= 1e-8 * max(1.0, np.max(np.abs(numeric))), name


@pytest.mark.parametrize("norm_before_gate", ORDERS)
@pytest.mark.parametrize("group_size", [None, 4])
def test_reference_matches_the_hugging_face_modules(rng, norm_before_gate, group_size):
    """float64 forward and autograd backward of the modules' formulas agree with the
    reference (and so, through the other tests, with the kernels): Mamba2RMSNormGated,
    Zamba2RMSNormGated and the like (gate first, in groups), Qwen3NextRMSNormGated (norm
    first; grouped here too, as FalconH1RMSNormGated may be)."""
    torch = pytest.importorskip("torch")
    silu = torch.nn.functional.silu
    x, z, dy = (rng.standard_normal((5, 12)) for _ in range(3))
    w = 1 + 0.5 * rng.standard_normal(12)
    tx, tz, tw = (torch.tensor(a, requires_grad=True) for a in (x, z, w))
    gs = group_size or 12
    h = tx if norm_before_gate else tx * silu(tz)
    groups = h.view(5, 12 // gs, gs)
    normed = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + 1e-6)).view(5, 12)
    ty = tw * normed * (silu(tz) if norm_before_gate else 1.0)
    ty.backward(torch.tensor(dy))
    y, cache = ref.gated_rms_norm_forward(x, z, w, 1e-6, group_size, norm_before_gate)
    want = (ty.detach(), tx.grad, tz.grad, tw.grad)
    for name, got, expected in zip(("y", "dx", "dgate", "dweight"),
                                   (y, *ref.gated_rms_norm_backward(dy, cache)), want):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)


def test_reference_cache_and_no_gate():
    x = np.arange(1.0, 7.0).reshape(1, 6)
    y, cache = ref.gated_rms_norm_forward(x, group_size=3)
    assert cache["rstd"].shape == (1, 2) and cache["group_size"] == 3
    assert cache["gate"] is None and cache["weight"] is None
    for k in (0, 3):   # without a gate: each group's RMSNorm
        np.testing.assert_allclose(y[:, k:k + 3], ref.rms_norm_forward(x[:, k:k + 3])[0])
    dx, dgate, dw = ref.gated_rms_norm_backward(np.ones_like(x), cache)
    assert dgate is None and dw is None and dx.shape == x.shape


# --------------------------------------------------------------------------- float32, float64

SHAPES = [(4, 1), (3, 3), (5, 7), (2, 33), (2, 12), (2, 4099), (0, 8), (2, 0, 6), (12,),
          (2, 3, 12)]
PARTS = [(True, True), (True, False), (False, True), (False, False)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm_before_gate", ORDERS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(rng, dtype, norm_before_gate, shape):
    """Every output (y, rstd per group, dx, dgate, dweight) within the term-scaled
    tolerance of the float64 reference: 1e-12 (float64) or 4e-6 (float32) of the size of
    the terms each is made of; None where the gate / weight is None; the shapes and dtypes
    of the cache's fields."""
    d = shape[-1]
    n = int(np.prod(shape[:-1]))
    for gate, weight in PARTS:
        for gs in divisors(d):
            inp = inputs(rng, shape, dtype, gate, weight, gs, norm_before_gate)
            got = run_all(inp)
            assert_matches_reference(FORWARD, inp, got)
            assert_matches_reference(BACKWARD, inp, got)
            assert (got["dgate"] is None) == (not gate) and (got["dweight"] is None) == (not weight)
            _, cache = FORWARD.call(inp)
            g = d // (gs or d)
            assert cache.x.shape == (n, d) and cache.x.dtype == dtype
            assert cache.gate is None if not gate else cache.gate.shape == (n, d)
            assert cache.rstd.dtype == np.float64 and cache.rstd.shape == (n * g,)
            assert type(cache.group_size) is int and cache.group_size == (gs or d)
            assert cache.norm_before_gate is norm_before_gate
            assert tuple(cache.shape) == shape and cache.param_dtype is None


@pytest.mark.parametrize("norm_before_gate", ORDERS)
def test_without_a_gate_it_is_rms_norm(rng, norm_before_gate):
    """gate None: resnorm.rms_norm's y and gradients (per group: of each group's slice)."""
    x, w, dy = rng.standard_normal((6, 40)), 1 + rng.standard_normal(40), rng.standard_normal((6, 40))
    y, cache = resnorm.gated_rms_norm_forward(x, None, w, norm_before_gate=norm_before_gate)
    dx, dgate, dw = resnorm.gated_rms_norm_backward(dy, cache)
    y0, c0 = resnorm.rms_norm_forward(x, w)
    dx0, dw0 = resnorm.rms_norm_backward(dy, c0)
    assert dgate is None
    for got, want in ((y, y0), (cache.rstd, c0.rstd), (dx, dx0), (dw, dw0)):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    y = resnorm.gated_rms_norm(x, None, w, group_size=8, norm_before_gate=norm_before_gate)
    for k in range(0, 40, 8):
        np.testing.assert_allclose(y[:, k:k + 8], resnorm.rms_norm(x[:, k:k + 8], w[k:k + 8]),
                                   rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm_before_gate", ORDERS)
def test_extreme_gate_logits(rng, dtype, norm_before_gate):
    """Gate logits up to +-100 (sigmoid rounds to 1, or to a subnormal): finite outputs,
    within the reference's tolerance normwise per row (an element whose silu is subnormal
    carries few significant bits, but is negligible beside its row)."""
    shape = (6, 33)
    inp = inputs(rng, shape, dtype, norm_before_gate=norm_before_gate)
    z = np.where(rng.random(shape) < 0.5, 1.0, -1.0) * rng.choice([0.0, 20.0, 40.0, 100.0], shape)
    inp = dataclasses.replace(inp, gate=(z + rng.standard_normal(shape)).astype(dtype))
    got = run_all(inp)
    want = {**FORWARD.reference(inp), **BACKWARD.reference(inp)}
    for name in ("y", "dx", "dgate"):
        value, tol = want[name]
        rowtol = (np.max(tol, axis=-1, keepdims=True)
                  + RTOL[np.dtype(dtype)] * np.max(np.abs(value), axis=-1, keepdims=True))
        assert np.all(np.isfinite(got[name])), name
        assert_close(got[name], value, rowtol, name)
    assert_close(got["dweight"], *want["dweight"], "dweight")


@pytest.mark.parametrize("norm_before_gate", ORDERS)
@pytest.mark.parametrize("scale", [1e200, 1e300, 0.2 * DBL_MAX], ids=lambda s: f"{s:.0e}")
def test_huge_float64_rows(rng, norm_before_gate, scale):
    """float64 rows whose squares leave the double range: rstd is neither 0 nor inf, and
    every output is the reference's on the rows scaled by an exact power of two:
    y(x, eps) = y(x 2^-e, eps 2^-2e), rstd(x) = 2^-e rstd(x 2^-e), dx(x) = 2^-e dx(x 2^-e),
    dgate and dweight unchanged (dgate = du * x * silu'(z): du scales by 2^-e)."""
    shape, e = (3, 24), int(np.frexp(scale)[1])
    x = scale * rng.uniform(-1, 1, shape)
    z, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    w = 1 + 0.5 * rng.standard_normal(24)
    xs = np.ldexp(x, -e)
    for gs in (None, 6):
        y, cache = resnorm.gated_rms_norm_forward(x, z, w, group_size=gs,
                                                  norm_before_gate=norm_before_gate)
        dx, dgate, dw = resnorm.gated_rms_norm_backward(dy, cache)
        assert np.all((cache.rstd > 0) & np.isfinite(cache.rstd))
        want_y, c = ref.gated_rms_norm_forward(xs, z, w, np.ldexp(1e-6, -2 * e), gs,
                                               norm_before_gate)
        want_dx, want_dgate, want_dw = ref.gated_rms_norm_backward(dy, c)
        np.testing.assert_allclose(np.ldexp(cache.rstd, e), c["rstd"].ravel(), rtol=1e-13)
        for got, want in ((y, want_y), (np.ldexp(dx, e), want_dx), (dgate, want_dgate),
                          (dw, want_dw)):
            assert np.all(np.isfinite(got))
            np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11 * np.max(np.abs(want)))


@pytest.mark.parametrize("group_size", [None, 8])
def test_float32_rows_of_subnormal_products(rng, group_size):
    """Gate first, x subnormal: the float32 products u = x * silu(gate) keep only the
    subnormals' absolute precision; such groups are normalised from the exact products in
    double, so y is within a few float32 ulps of the reference (hundreds before) and the
    gradients within the contract, in place and with threads alike.  Rows of normal
    values beside them are untouched."""
    tiny = float(np.finfo(np.float32).smallest_subnormal)
    x = (rng.integers(1, 2 ** 20, (6, 64)) * tiny * rng.choice([-1, 1], (6, 64)))
    x[3:] = rng.standard_normal((3, 64))          # normal rows keep the float path
    x = x.astype(np.float32)
    z = rng.standard_normal((6, 64)).astype(np.float32)
    dy = rng.standard_normal((6, 64)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
    y, cache = resnorm.gated_rms_norm_forward(x, z, w, group_size=group_size)
    want_y, c = ref.gated_rms_norm_forward(x, z, w, 1e-6, group_size, False)
    assert ulps(y, want_y).max() <= 17
    dx, dgate, dw = resnorm.gated_rms_norm_backward(dy, cache)
    want_dx, want_dgate, want_dw = ref.gated_rms_norm_backward(dy, c)
    assert np.abs(dw - want_dw).max() <= 3 * np.spacing(np.float32(np.abs(want_dw).max()))
    for got, want in ((dx, want_dx), (dgate, want_dgate)):
        assert np.abs(got - want).max() <= 64 * np.spacing(np.float32(np.abs(want).max()))
    inplace = x.copy()
    resnorm.gated_rms_norm(inplace, z, w, group_size=group_size, out=inplace)
    assert_same_bits(inplace, y, "out=x")
    assert_same_bits(resnorm.gated_rms_norm(x, z, w, group_size=group_size, n_threads=2), y,
                     "two threads")


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"], ids=["f32", "bf16"])
@pytest.mark.parametrize("norm_before_gate", ORDERS)
def test_streamed_output(rng, dtype, norm_before_gate):
    """Outputs of 8 MiB and more are written with streaming stores (odd D: rows start
    anywhere in a vector): the reference's values, within its tolerance for float32, the
    float32 function's rounded once for bfloat16."""
    if dtype == "bfloat16":
        dt = pytest.importorskip("ml_dtypes").bfloat16
        inp = inputs(rng, (2100, 2047), np.float32, group_size=89,
                     norm_before_gate=norm_before_gate)
        x, z, w = (a.astype(dt) for a in (inp.x, inp.gate, inp.weight))
        y = resnorm.gated_rms_norm(x, z, w, group_size=89, norm_before_gate=norm_before_gate)
        wide = resnorm.gated_rms_norm(*(a.astype(np.float32) for a in (x, z, w)),
                                      group_size=89, norm_before_gate=norm_before_gate)
        assert_same_bits(y, wide.astype(dt), "bfloat16 y")
        return
    inp = inputs(rng, (1100, 2047), np.float32, group_size=89, norm_before_gate=norm_before_gate)
    inp.dy = None
    assert_matches_reference(FORWARD, inp, FORWARD.run(inp))
    assert_matches_reference(INFERENCE, inp, INFERENCE.run(inp))


# --------------------------------------------------------------------------- threads, layouts

@pytest.mark.parametrize("dtype", [np.float32, np.float64, *HALVES],
                         ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("norm_before_gate", ORDERS)
def test_threads_give_the_same_bits(rng, dtype, norm_before_gate):
    """(257, 96): enough elements for several threads; 1, 2 and 4 threads, every output."""
    dt = half(dtype) if not isinstance(dtype, type) else np.dtype(dtype)
    for gs in (None, 32):
        inp = inputs(rng, (257, 96), np.float32, group_size=gs, norm_before_gate=norm_before_gate)
        inp = dataclasses.replace(inp, **{k: a.astype(dt) for k, a in inp.arrays().items()})
        one = run_all(inp, n_threads=1)
        for nt in (2, 4):
            for name, value in run_all(inp, n_threads=nt).items():
                assert_same_bits(value, one[name], f"{name}, n_threads={nt}, group_size={gs}")


def _views(a):
    """Views of a's values: strided, negative strides, Fortran order, read-only."""
    ro = a.copy()
    ro.setflags(write=False)
    return {"strided": np.repeat(a, 2, axis=-1)[..., ::2], "reversed": a[::-1].copy()[::-1],
            "fortran": np.asfortranarray(a), "read_only": ro}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, *HALVES],
                         ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("norm_before_gate", ORDERS)
def test_non_contiguous_and_read_only_inputs(rng, dtype, norm_before_gate):
    """The same bits as from C-contiguous copies, and the inputs unchanged."""
    dt = half(dtype) if not isinstance(dtype, type) else np.dtype(dtype)
    inp = inputs(rng, (5, 12), np.float32, group_size=4, norm_before_gate=norm_before_gate)
    inp = dataclasses.replace(inp, **{k: a.astype(dt) for k, a in inp.arrays().items()})
    want = run_all(inp)
    for arg in ("x", "gate", "weight", "dy"):
        for layout, view in _views(getattr(inp, arg)).items():
            if view.ndim == 1 and layout == "fortran":
                continue
            before = view.copy()
            got = run_all(dataclasses.replace(inp, **{arg: view}))
            for name, value in want.items():
                assert_same_bits(got[name], value, f"{name}, {arg} {layout}")
            assert_same_bits(view, before, f"{arg} {layout} modified")


# --------------------------------------------------------------------------- output buffers

@pytest.mark.parametrize("dtype", [np.float32, np.float64, *HALVES],
                         ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("norm_before_gate", ORDERS)
def test_output_buffers(rng, dtype, norm_before_gate):
    """out= and dgate_out= receive the results (returned as themselves), contiguous or
    not; the inference form may write over x or the gate, the backward over dy (dx or
    dgate): the same bits every way."""
    dt = half(dtype) if not isinstance(dtype, type) else np.dtype(dtype)
    inp = inputs(rng, (4, 12), np.float32, group_size=6, norm_before_gate=norm_before_gate)
    x, z, w, dy = (a.astype(dt) for a in (inp.x, inp.gate, inp.weight, inp.dy))
    kw = dict(group_size=6, norm_before_gate=norm_before_gate)
    y, cache = resnorm.gated_rms_norm_forward(x, z, w, **kw)
    dx, dgate, dw = resnorm.gated_rms_norm_backward(dy, cache)
    for out in (np.empty_like(x), np.empty((4, 24), dt)[:, ::2]):
        assert resnorm.gated_rms_norm(x, z, w, **kw, out=out) is out
        assert_same_bits(np.ascontiguousarray(out), y, "out")
        got, _ = resnorm.gated_rms_norm_forward(x, z, w, **kw, out=out)
        assert got is out
        assert_same_bits(np.ascontiguousarray(out), y, "forward out")
    for name in ("x", "gate"):     # in place, over either input
        xx, zz = x.copy(), z.copy()
        target = xx if name == "x" else zz
        assert resnorm.gated_rms_norm(xx, zz, w, **kw, out=target) is target
        assert_same_bits(target, y, f"out={name}")
    out, dgate_out = np.empty_like(dy), np.empty((4, 24), dt)[:, 1::2]
    got = resnorm.gated_rms_norm_backward(dy, cache, out=out, dgate_out=dgate_out)
    assert got[0] is out and got[1] is dgate_out
    assert_same_bits(out, dx, "out")
    assert_same_bits(np.ascontiguousarray(dgate_out), dgate, "dgate_out")
    assert_same_bits(got[2], dw, "dweight")
    for buffer, i in (("out", 0), ("dgate_out", 1)):   # over dy
        d = dy.copy()
        got = resnorm.gated_rms_norm_backward(d, cache, **{buffer: d})
        assert got[i] is d
        for value, want in zip(got, (dx, dgate, dw)):
            assert_same_bits(value, want, f"{buffer}=dy")


# --------------------------------------------------------------------------- 16 bits

@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("norm_before_gate", ORDERS)
@pytest.mark.parametrize("d", [1, 7, 33, 4099])
def test_half_is_the_float32_kernel_rounded_once(rng, name, norm_before_gate, d):
    """float16 / bfloat16 rows are widened, computed in float32 and rounded once: y, dx and
    dgate are bitwise the float32 function's on the widened inputs, rounded; rstd is its
    rstd; dweight its float64 sum rounded once to the weight's dtype (the float32 dweight
    rounded again may differ by one unit of a tie: within one unit).  A float32 weight
    (mixed precision) gives the float32 dweight itself.  The forward is within one unit in
    the last place of the float64 reference."""
    dt = half(name)
    gs = None if d in (1, 4099) else d if d == 7 else 11
    inp = inputs(rng, (9, d), np.float32, group_size=gs, norm_before_gate=norm_before_gate)
    x, z, w, dy = (a.astype(dt) for a in (inp.x, inp.gate, inp.weight, inp.dy))
    wide = [a.astype(np.float32) for a in (x, z, w, dy)]
    kw = dict(group_size=gs, norm_before_gate=norm_before_gate)
    y32, c32 = resnorm.gated_rms_norm_forward(*wide[:3], **kw)
    dx32, dz32, dw32 = resnorm.gated_rms_norm_backward(wide[3], c32)
    for weight in (w, wide[2]):         # the 16-bit weight, and the float32 one (mixed)
        y, cache = resnorm.gated_rms_norm_forward(x, z, weight, **kw)
        dx, dz, dw = resnorm.gated_rms_norm_backward(dy, cache)
        assert y.dtype == dx.dtype == dz.dtype == dt and dw.dtype == weight.dtype
        assert cache.param_dtype == (np.float32 if weight.dtype == np.float32 else None)
        for got, want in ((y, y32), (dx, dx32), (dz, dz32)):
            assert_same_bits(got, want.astype(dt), "rounded once")
        assert_same_bits(cache.rstd, c32.rstd, "rstd")
        if weight.dtype == np.float32:
            assert_same_bits(dw, dw32, "float32 dweight")
        else:
            assert ulps(dw, dw32.astype(np.float64)).max() <= 1
        want_y, _ = ref.gated_rms_norm_forward(*(a.astype(np.float64) for a in (x, z, weight)),
                                               1e-6, gs, norm_before_gate)
        assert ulps(y, want_y).max() <= 1


def test_half_weight_dtypes():
    """Beside 16-bit x, the weight is of x's dtype or float32; the gate always of x's."""
    x = np.ones((2, 4), np.float16)
    for bad, arg in ((dict(weight=np.ones(4)), "weight"),
                     (dict(gate=np.ones((2, 4), np.float32)), "gate")):
        with pytest.raises(TypeError, match=rf"\b{arg}\b"):
            resnorm.gated_rms_norm(x, **{"gate": np.ones_like(x), **bad})


# --------------------------------------------------------------------------- bad arguments

X = np.ones((3, 6), np.float32)
BAD = [
    (dict(gate=np.ones((3, 5), np.float32)), ValueError, "gate"),
    (dict(gate=np.ones((6,), np.float32)), ValueError, "gate"),
    (dict(gate=np.ones((3, 6), np.float64)), TypeError, "gate"),
    (dict(gate=np.ones((3, 6), np.int32)), TypeError, "gate"),
    (dict(weight=np.ones(5, np.float32)), ValueError, "weight"),
    (dict(weight=np.ones((1, 6), np.float32)), ValueError, "weight"),
    (dict(weight=np.ones(6, np.float64)), TypeError, "weight"),
    (dict(group_size=4), ValueError, "group_size"),
    (dict(group_size=12), ValueError, "group_size"),
    (dict(group_size=0), ValueError, "group_size"),
    (dict(group_size=-3), ValueError, "group_size"),
    (dict(group_size=2.0), TypeError, "group_size"),
    (dict(group_size="2"), TypeError, "group_size"),
    (dict(group_size=True), TypeError, "group_size"),
    (dict(norm_before_gate=1), TypeError, "norm_before_gate"),
    (dict(eps=0.0), ValueError, "eps"),
    (dict(out=np.empty((3, 6), np.float64)), TypeError, "out"),
]


@pytest.mark.parametrize("form", ["gated_rms_norm", "gated_rms_norm_forward"])
@pytest.mark.parametrize("kw, exc, arg", BAD, ids=[f"{a}-{i}" for i, (_, _, a) in enumerate(BAD)])
def test_bad_arguments_are_named(form, kw, exc, arg):
    with pytest.raises(exc, match=rf"\b{arg}\b"):
        getattr(resnorm, form)(X, **{"gate": np.ones_like(X), **kw})


def test_bad_backward_arguments_are_named():
    _, cache = resnorm.gated_rms_norm_forward(X, np.ones_like(X), np.ones(6, np.float32))
    _, plain = resnorm.gated_rms_norm_forward(X)
    _, rms = resnorm.rms_norm_forward(X)
    cases = [(dict(dy=np.ones((3, 5), np.float32)), ValueError, "dy"),
             (dict(dy=np.ones((6, 3), np.float32)), ValueError, "dy"),
             (dict(dy=np.ones((3, 6), np.float64)), TypeError, "dy"),
             (dict(cache=rms), TypeError, "cache"),
             (dict(cache=(X, None)), TypeError, "cache"),
             (dict(cache=dataclasses.replace(cache, group_size=4)), ValueError, "cache"),
             (dict(cache=dataclasses.replace(cache, rstd=cache.rstd[:-1])), ValueError, "cache"),
             (dict(cache=plain, dgate_out=np.empty_like(X)), ValueError, "dgate_out"),
             (dict(out=np.empty((3, 6), np.float16)), TypeError, "out"),
             (dict(dgate_out=np.empty((3, 5), np.float32)), ValueError, "dgate_out")]
    for kw, exc, arg in cases:
        kw = {"dy": np.ones_like(X), "cache": cache, **kw}
        with pytest.raises(exc, match=rf"\b{arg}\b"):
            resnorm.gated_rms_norm_backward(kw.pop("dy"), kw.pop("cache"), **kw)
