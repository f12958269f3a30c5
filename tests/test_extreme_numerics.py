"""Extreme numerics for every public function: the whole floating-point range, rows whose
statistics leave the double range, constant rows at any magnitude, inf/NaN confined to
their row, and rare rows next to ordinary ones.

The reference is valid over the whole float64 range (api_table.norm_reference rescales
rows beyond 2**400 exactly by powers of two).  The data of an op is its computation's
input: the norms' x, the fused ops' h = residual + alpha * dropout(x), the scaled and
gated residuals' h, dropout's x (api_table.with_data sets it).
"""
import dataclasses

import numpy as np
import pytest

import resnorm
from resnorm import reference as ref
from api_table import (BACKWARDS, DTYPES, ELEMENTWISE_OUTPUTS, OPS, TRAINING, assert_close,
                       assert_same_bits, make_inputs, with_data)
from test_norms_gradients import central_diff

ALL = pytest.mark.parametrize("op", list(OPS.values()), ids=list(OPS))
NORMED = [op for op in OPS.values() if op.norm]   # the ops with row statistics
LN_OPS = [op for op in NORMED if op.norm == "ln"]
DBL_MAX = np.finfo(np.float64).max
FLT_MAX = float(np.finfo(np.float32).max)


def forward_of(op):
    return OPS[op.forward] if op.form == "backward" else op


def _id(v, fmt):
    return np.dtype(v).name if isinstance(v, type) else fmt.format(v)


def check(op, inp, **kw):
    """op on inp: finite, and within tolerance of the full-range reference."""
    got = op.run(inp, **kw)
    for name, (value, tol) in op.reference(inp).items():
        if value is None:
            assert got[name] is None
            continue
        assert np.all(np.isfinite(got[name])), f"{op.name} {name} not finite"
        assert_close(got[name], value, tol, f"{op.name} {name}")
    return got


# --------------------------------------------------------------------------- magnitudes

MAGNITUDES = {
    np.float64: [1e-310, 1e-300, 1e-150, 1e-30, 1.0, 1e30, 1e150, 1e160, 1e200, 1e300, 1e307],
    np.float32: [1e-40, 1e-30, 1.0, 1e19, 1e30, 1e37, 3e37],
}


@ALL
@pytest.mark.parametrize("dtype, magnitude", [(t, m) for t in DTYPES for m in MAGNITUDES[t]],
                         ids=lambda v: _id(v, "{:.0e}"))
@pytest.mark.parametrize("offset", [0.0, 5.0], ids=["centred", "offset"])
def test_magnitude_sweep(op, dtype, magnitude, offset):
    """Data of magnitude * (offset + N(0, 1)), rows 7 and 37 wide (shared between x and
    residual / F, so that h stays within that range), parameters and dy O(1), dh
    O(1 / magnitude) above 1 (a sum over rows of dh times data must fit the range)."""
    rng = np.random.default_rng(int(-np.log10(magnitude) * 10) % 1000)
    for d in (7, 37):
        base = make_inputs(rng, (4, d), dtype)
        values = (magnitude * (offset + rng.standard_normal((4, d)))).astype(dtype)
        assert np.all(np.isfinite(values))
        inp = with_data(forward_of(op), base, values, split=True)
        inp.dh = (base.dh / max(1.0, magnitude)).astype(dtype)
        check(op, inp)


@pytest.mark.parametrize("op", NORMED, ids=[op.name for op in NORMED])
@pytest.mark.parametrize("case", ["dbl_max", "span_dbl_max", "span_flt_max", "flt_max"])
def test_rows_at_the_edge_of_the_range(op, case):
    """Rows reaching DBL_MAX / FLT_MAX, and rows whose span (max - min) exceeds it, so that
    x - mean overflows the element type unless it is rescaled (the fused ops: as h)."""
    rng = np.random.default_rng(11)
    if case in ("dbl_max", "span_dbl_max"):
        dtype, top = np.float64, DBL_MAX
    else:
        dtype, top = np.float32, FLT_MAX
    if case.startswith("span"):
        rows = [[0.9 * top, -0.9 * top, -0.9 * top, 1.0, 0.0],
                [top, -top, 0.5 * top, -0.25 * top, top]]
    else:
        rows = [[top, top * 0.999, -top, top, top * 0.5],
                [top, top, top, top, top * (1 - 2**-20)]]
    x = np.array(rows, dtype)
    assert np.all(np.isfinite(x))
    check(op, with_data(forward_of(op), make_inputs(rng, x.shape, dtype), x))


@pytest.mark.parametrize("name", [n for n in TRAINING if OPS[n].norm])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rescaled_rows_cache_correct_statistics(name, dtype):
    """The statistics of a row beyond the double range, as cached for backward."""
    x = np.array([[3e300, -1e300, 2e300, 5e299]]) if dtype == np.float64 else \
        np.array([[3e38, -3e38, -3e38, 1.0]], np.float32)
    x = x.astype(dtype)
    op = OPS[name]
    inp = with_data(op, make_inputs(np.random.default_rng(2), x.shape, dtype), x)
    _, cache = op.call(inp)
    xs = x.astype(np.float64) / 2.0**1000 if dtype == np.float64 else x.astype(np.float64)
    rtol = 1e-15
    if op.family == "gated_rms":
        # the statistics of u = x * silu(gate), which the kernel rounds in x's dtype
        xs, rtol = xs * ref.silu(inp.gate), 8 * float(np.finfo(dtype).eps)
    k = 2.0**1000 if dtype == np.float64 else 1.0
    if op.norm == "rms":
        np.testing.assert_allclose(cache.rstd * k, 1 / np.sqrt(np.mean(xs**2)), rtol=rtol)
    else:
        np.testing.assert_allclose(cache.mean / k, np.mean(xs), rtol=1e-15)
        np.testing.assert_allclose(cache.rstd * k, 1 / np.sqrt(np.var(xs)), rtol=1e-15)


# --------------------------------------------------------------------------- constant rows

CONSTANTS = {
    np.float64: [0.0, 5e-324, 1e-310, 0.1, 1 / 3, -3.7, 1e4 + 0.1, 1e12 + 0.3, 1e30, -1e200,
                 1e300, DBL_MAX, -DBL_MAX],
    np.float32: [0.0, 1e-45, 1e-40, 0.1, -3.7, 1e4 + 0.1, 1e30, 3e38, FLT_MAX, -FLT_MAX],
}


@pytest.mark.parametrize("op", LN_OPS, ids=[op.name for op in LN_OPS])
@pytest.mark.parametrize("dtype, value", [(t, v) for t in DTYPES for v in CONSTANTS[t]],
                         ids=lambda v: _id(v, "{:.3g}"))
def test_constant_rows_give_exactly_the_bias(op, dtype, value):
    """LayerNorm of a constant row (the fused ops: a constant h): mean = the value,
    variance 0, rstd = 1/sqrt(eps): y is exactly the bias (zeros without), with no
    division by zero; backward gives the gradient reaching the row rstd * (g - mean(g))
    (+ dh; the fused ops' dresidual, and dx = alpha * m times it) and dweight = 0 exactly."""
    rng = np.random.default_rng(13)
    eps = forward_of(op).default_eps()
    for d in (1, 2, 7, 33, 100, 1000):
        base = make_inputs(rng, (3, d), dtype)
        x = np.full((3, d), value, dtype)
        for w, b in ((base.weight, base.bias), (None, None)):
            inp = with_data(forward_of(op), dataclasses.replace(base, weight=w, bias=b), x)
            got = op.run(inp)
            if "y" in got:
                want_y = np.zeros_like(x) if b is None else np.broadcast_to(b, x.shape)
                assert_same_bits(np.ascontiguousarray(got["y"]), np.ascontiguousarray(want_y),
                                 f"y, d={d}")
            if "h" in got:
                assert_same_bits(got["h"], x, f"h, d={d}")
            if "mean" in got:
                assert np.all(got["mean"] == np.float64(x[0, 0]))
                assert np.all(got["rstd"] == 1.0 / np.sqrt(eps))
            if "dx" in got:
                g = base.dy.astype(np.float64) * (1.0 if w is None else w.astype(np.float64))
                want = (g - g.mean(axis=-1, keepdims=True)) / np.sqrt(eps)
                scale = 4e-6 if dtype == np.float32 else 1e-12
                tol = scale * np.max(np.abs(g)) / np.sqrt(eps)
                if op.fused:
                    if not op.post:
                        want, tol = want + base.dh, tol + scale * np.abs(base.dh)
                    assert_close(got["dresidual"], want, tol, "dresidual")
                    m = resnorm.dropout(np.ones(x.shape), inp.p, seed=inp.seed)
                    a = np.abs(inp.alpha.astype(np.float64)) * m
                    want, tol = want * inp.alpha.astype(np.float64) * m, tol * a
                assert_close(got["dx"], want, tol, "dx")
                if w is not None:
                    assert np.all(got["dweight"] == 0)


@pytest.mark.parametrize("op", [op for op in NORMED if op.norm == "rms"],
                         ids=lambda op: op.name)
@pytest.mark.parametrize("dtype, value", [(t, v) for t in DTYPES for v in CONSTANTS[t]
                                          if v != 0.0],
                         ids=lambda v: _id(v, "{:.3g}"))
def test_constant_rows_rms_norm(op, dtype, value):
    rng = np.random.default_rng(17)
    base = make_inputs(rng, (3, 33), dtype)
    check(op, with_data(forward_of(op), base, np.full((3, 33), value, dtype)))


# --------------------------------------------------------------------------- inf and NaN

# what the backward of an op without a norm reads, besides its cache's scalars
BACKWARD_READS = {"scaled": ("dh",), "gated": ("F", "g", "dh"), "dropout": ("dy",)}


def _bad_cases():
    for op in OPS.values():
        gates = {"gated": ("g",), "gated_rms": ("gate",)}
        reads = forward_of(op).data + gates.get(op.family, ())
        if op.form == "backward":
            reads = BACKWARD_READS.get(op.family, reads + op.args)
        for where in reads:
            for dtype in DTYPES:
                big = 1e300 if dtype == np.float64 else 3e37
                for magnitude in (1.0, big) if op.norm else (1.0,):
                    # sigmoid(+-inf) is 1 or 0: an infinite gate logit is not bad (the
                    # gated RMSNorm's silu(+-inf) is inf and NaN, as torch's)
                    for bad in ("nan",) if where == "g" else ("nan", "inf", "-inf"):
                        yield pytest.param(op, where, dtype, magnitude, float(bad),
                                           id=f"{op.name}-{where}-{np.dtype(dtype).name}-"
                                              f"{magnitude:.0e}-{bad}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("op, where, dtype, magnitude, bad", list(_bad_cases()))
@pytest.mark.parametrize("n_threads", [1, 2])
def test_non_finite_value_stays_in_its_row(op, where, dtype, magnitude, bad, n_threads):
    """Rows large enough to run in parallel (64 x 600), at ordinary and at rescued
    magnitudes: the other rows are bitwise what they are without the bad value; the bad
    row's output holds a NaN where the bad value enters a norm's statistics, else an
    output is non-finite at the bad element (and the elementwise ops' other elements of
    that row are unchanged too)."""
    rng = np.random.default_rng(19)
    base = make_inputs(rng, (64, 600), dtype)
    values = (magnitude * rng.standard_normal((64, 600))).astype(dtype)
    clean = with_data(forward_of(op), small_dh(base, values), values, split=True)
    arr = getattr(clean, where).copy()
    arr[5, 17] = bad
    dirty = dataclasses.replace(clean, **{where: arr})
    good, got = op.run(clean, n_threads=n_threads), op.run(dirty, n_threads=n_threads)
    others = np.arange(64) != 5
    normed = op.norm and where not in ("dh",)
    for name in got:
        if got[name] is None or got[name].shape[:1] != (64,):
            continue  # sums over rows (dweight, dbias, dalpha, per-channel dg)
        assert np.all(np.isfinite(good[name])), name
        assert_same_bits(got[name][others], good[name][others], f"{op.name} {name}, other rows")
        if not normed and name in ELEMENTWISE_OUTPUTS:
            row, kept = got[name][5], np.arange(600) != 17
            assert_same_bits(row[kept], good[name][5][kept], f"{op.name} {name}, bad row")
    if normed:
        assert np.any(np.isnan(got[op.output][5])), "the bad row's output holds no NaN"
    else:
        assert any(not np.isfinite(got[name][5, 17]) for name in got
                   if got[name] is not None and got[name].shape == arr.shape), \
            "every output is finite at the bad element"


# --------------------------------------------------------------------------- rare rows

def small_dh(inp, values):
    """inp with dh divided row by row by max(1, max|values|): sums over rows of dh times
    the data (dalpha, a per-channel dg) then stay within the range."""
    scale = np.maximum(1.0, np.max(np.abs(values.astype(np.float64)), axis=-1, keepdims=True))
    return dataclasses.replace(inp, dh=(inp.dh / scale).astype(inp.dh.dtype))


def _mixed_rows(dtype):
    """Ordinary rows around rows that take the kernels' rare paths."""
    rng = np.random.default_rng(23)
    d = 45
    rows = list(rng.standard_normal((4, d)))
    top = DBL_MAX if dtype == np.float64 else FLT_MAX
    rows += [np.full(d, 7.25), np.zeros(d),                       # constant rows
             0.3 * top * rng.uniform(-1, 1, d),                   # huge, spanning far
             np.where(np.arange(d) % 2, 0.9, -0.9) * top,         # span beyond the max
             np.full(d, top),                                     # the largest value
             1e-30 * rng.standard_normal(d)]
    if dtype == np.float64:
        rows += [1e200 * rng.standard_normal(d), 1e12 + np.full(d, 0.3)]
    rows += list(rng.standard_normal((3, d)))
    x = np.array(rows).astype(dtype)
    assert np.all(np.isfinite(x))
    return make_inputs(rng, x.shape, dtype), x


@ALL
@pytest.mark.parametrize("dtype", DTYPES)
def test_rare_rows_are_row_local_and_thread_count_independent(op, dtype):
    """Each row's result is the same bits for 1, 2 and 4 threads (the rows are padded to a
    size that runs in parallel), and computed alone or among the others (without dropout
    there: its mask depends on the element's index in the array); and right."""
    fwd = forward_of(op)
    base, values = _mixed_rows(dtype)
    base = small_dh(base, values)
    reps = 40  # 40 copies of the block: > 2**15 elements, so threads really start
    tile = {name: np.tile(a, (reps, 1)) for name, a in base.arrays().items() if a.ndim == 2}
    big = with_data(fwd, dataclasses.replace(base, **tile), np.tile(values, (reps, 1)),
                    split=True)
    one = op.run(big, n_threads=1)
    for nt in (2, 4):
        for name, value in op.run(big, n_threads=nt).items():
            assert_same_bits(value, one[name], f"{op.name} {name}, n_threads={nt}")
    plain = with_data(fwd, dataclasses.replace(base, p=0.0), values, split=True)
    block = op.run(plain)
    for i in range(values.shape[0]):
        alone = op.run(dataclasses.replace(plain, **{name: a[i:i + 1] for name, a
                                                     in plain.arrays().items() if a.ndim == 2}))
        for name in ELEMENTWISE_OUTPUTS:
            if name in block:
                assert_same_bits(block[name][i], alone[name][0], f"{op.name} {name} row {i}")
    # and right: constant rows are checked exactly in test_constant_rows_*; the NumPy
    # reference cannot do those (its mean of equal values is not exact either)
    varying = np.any(values != values[:, :1], axis=-1)
    rows = {name: a[varying] for name, a in base.arrays().items() if a.ndim == 2}
    check(op, with_data(fwd, dataclasses.replace(base, **rows), values[varying], split=True))


FUSED_FORWARD = [n for n in TRAINING if OPS[n].fused]


@pytest.mark.parametrize("name", FUSED_FORWARD)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_rare_rows_equal_the_separate_kernels(name, dtype):
    """On rare rows too, the fused ops' y is bitwise the norm kernel's y of their h (h =
    residual + alpha * dropout(x) from the separate kernels), and the gradient reaching h
    (dresidual) is bitwise the norm's backward of it (+ dh)."""
    op, backward = OPS[name], OPS[name.replace("_forward", "_backward")]
    base, values = _mixed_rows(dtype)
    inp = with_data(op, small_dh(base, values), values, split=True)
    got, grads = op.run(inp), backward.run(inp)
    h = inp.residual + inp.alpha * resnorm.dropout(inp.x, inp.p, seed=inp.seed)
    if op.norm == "rms":
        y, cache = resnorm.rms_norm_forward(h, inp.weight)
        dh_norm = resnorm.rms_norm_backward(inp.dy, cache)[0]
    else:
        y, cache = resnorm.layer_norm_forward(h, inp.weight, inp.bias)
        dh_norm = resnorm.layer_norm_backward(inp.dy, cache)[0]
    assert_same_bits(got["y"], y, "y")
    if "h" in got:
        assert_same_bits(got["h"], h, "h")
    assert_same_bits(grads["dresidual"], dh_norm if op.post else dh_norm + inp.dh, "dresidual")


@pytest.mark.parametrize("name", [n for n in OPS if OPS[n].form == "inference" and OPS[n].norm])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rare_rows_in_place(name, dtype):
    """A rank-1 rare row written over each of its same-shape inputs (x, residual, weight,
    bias, alpha): the same bits as out of place.  (The fused ops store a rare row's h
    before normalising it: not over weight or bias.)"""
    op = OPS[name]
    _, values = _mixed_rows(dtype)
    for row in values[4:10]:
        inp = with_data(op, make_inputs(np.random.default_rng(31), row.shape, dtype), row,
                        split=True)
        want = op.run(inp)
        for buffer in op.buffers:
            for arg in op.arrays:
                target = getattr(inp, arg).copy()
                got = op.outputs(op.fn(**{**op.kwargs(inp), arg: target}, **{buffer: target}))
                for out, value in want.items():
                    assert_same_bits(got[out], value, f"{name} {out}, {buffer}={arg}")


@pytest.mark.parametrize("name", [n for n in BACKWARDS if OPS[n].norm])
def test_backward_of_rescaled_rows_matches_finite_differences(name):
    """float64 rows near 1e300: dx (and dresidual) against central differences of
    L = sum(y * R), with steps relative to the rows' scale."""
    op = OPS[name]
    fwd = OPS[op.forward]
    rng = np.random.default_rng(29)
    grads = {"x": "dx", "residual": "dresidual"}
    for scale in (1e300, 1.0):
        inp = make_inputs(rng, (2, 5), np.float64, scale=scale)
        inp.dh = None
        got = op.run(inp)
        for arg in fwd.data:
            probe = dataclasses.replace(inp, **{arg: getattr(inp, arg).copy()})
            num = central_diff(lambda: np.sum(fwd.run(probe)["y"] * inp.dy), getattr(probe, arg),
                               1e-6 * scale)
            assert_close(got[grads[arg]] * scale, num * scale,
                         1e-6 * np.max(np.abs(num * scale)), f"{name} {grads[arg]}")
