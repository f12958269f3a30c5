"""Extreme numerics for every public function: the whole floating-point range, rows whose
statistics leave the double range, constant rows at any magnitude, inf/NaN confined to
their row, and rare rows next to ordinary ones.

The reference for float64 rows beyond ~1e154 (where the NumPy reference's x**2 overflows
too) uses scale invariance: with u = x * 2**-e, exactly,
    y(x, eps) = y(u, eps * 2**-2e),  rstd(x) = 2**-e rstd(u),  mean(x) = 2**e mean(u),
    dx(x) = 2**-e dx(u),  dweight and dbias unchanged.
"""
import dataclasses

import numpy as np
import pytest

from api_table import (BACKWARDS, DTYPES, OPS, Inputs, assert_close, assert_same_bits,
                       make_inputs)
from test_norms_gradients import central_diff

ALL = pytest.mark.parametrize("op", list(OPS.values()), ids=list(OPS))
LN_OPS = [op for op in OPS.values() if op.norm == "ln"]
DBL_MAX = np.finfo(np.float64).max
FLT_MAX = float(np.finfo(np.float32).max)

# how each output scales when the row is multiplied by 2**e
UNSCALE = {"y": 0, "rstd": -1, "mean": 1, "dx": -1}


def scaled_reference(op, inp):
    """op.reference(inp), valid over the whole float64 range: float64 rows with large
    values are computed on x * 2**-e, one row at a time, and scaled back."""
    if inp.dtype == np.float32:  # float32 squares never leave the double range
        return op.reference(inp)
    eps = op.default_eps() if inp.eps is None else inp.eps
    x = inp.x.reshape(-1, inp.x.shape[-1])
    dy = None if inp.dy is None else inp.dy.reshape(x.shape)
    rows = []
    for i in range(x.shape[0]):
        e = max(0, int(np.frexp(np.max(np.abs(x[i])))[1]))
        row = dataclasses.replace(inp, x=np.ldexp(x[i:i + 1], -e), eps=np.ldexp(eps, -2 * e),
                                  dy=None if dy is None else dy[i:i + 1])
        want = op.reference(row)
        rows.append({name: tuple(None if a is None else np.ldexp(a, UNSCALE[name] * e)
                                 if name in UNSCALE else a for a in pair)
                     for name, pair in want.items()})
    out = {}
    for name in rows[0]:
        value, tol = zip(*(r[name] for r in rows))
        if value[0] is None:
            out[name] = (None, None)
        elif name in UNSCALE:  # per row: stack the rows back into the input's shape
            shape = inp.x.shape if name in ("y", "dx") else inp.x.shape[:-1]
            out[name] = (np.concatenate(value).reshape(shape),
                         np.concatenate([np.broadcast_to(t, v.shape) for t, v in zip(tol, value)])
                         .reshape(shape))
        else:  # dweight, dbias: sums over rows, and so are their term sizes
            out[name] = (np.sum(value, axis=0), np.sum(tol, axis=0))
    return out


def _id(v, fmt):
    return np.dtype(v).name if isinstance(v, type) else fmt.format(v)


def check(op, inp, **kw):
    """op on inp: finite, and within tolerance of the full-range reference."""
    got = op.run(inp, **kw)
    for name, (value, tol) in scaled_reference(op, inp).items():
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
    """Rows of magnitude * (offset + N(0, 1)), 7 and 37 wide, weights and bias O(1)."""
    rng = np.random.default_rng(int(-np.log10(magnitude) * 10) % 1000)
    for d in (7, 37):
        base = make_inputs(rng, (4, d), np.float64, offset=offset)
        x = (magnitude * base.x).astype(dtype)
        inp = Inputs(x, *(None if a is None else a.astype(dtype)
                          for a in (base.weight, base.bias, base.dy)))
        assert np.all(np.isfinite(x))
        check(op, inp)


@ALL
@pytest.mark.parametrize("case", ["dbl_max", "span_dbl_max", "span_flt_max", "flt_max"])
def test_rows_at_the_edge_of_the_range(op, case):
    """Rows reaching DBL_MAX / FLT_MAX, and rows whose span (max - min) exceeds it, so that
    x - mean overflows the element type unless it is rescaled."""
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
    base = make_inputs(rng, x.shape, dtype)
    check(op, dataclasses.replace(base, x=x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rescaled_rows_cache_correct_statistics(dtype):
    """The statistics of a row beyond the double range, as cached for backward."""
    x = np.array([[3e300, -1e300, 2e300, 5e299]]) if dtype == np.float64 else \
        np.array([[3e38, -3e38, -3e38, 1.0]], np.float32)
    x = x.astype(dtype)
    _, rc = OPS["rms_norm_forward"].call(Inputs(x))
    _, lc = OPS["layer_norm_forward"].call(Inputs(x))
    xs = x.astype(np.float64) / 2.0**1000 if dtype == np.float64 else x.astype(np.float64)
    k = 2.0**1000 if dtype == np.float64 else 1.0
    np.testing.assert_allclose(rc.rstd * k, 1 / np.sqrt(np.mean(xs**2)), rtol=1e-15)
    np.testing.assert_allclose(lc.mean / k, np.mean(xs), rtol=1e-15)
    np.testing.assert_allclose(lc.rstd * k, 1 / np.sqrt(np.var(xs)), rtol=1e-15)


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
    """LayerNorm of a constant row: mean = the value, variance 0, rstd = 1/sqrt(eps):
    y is exactly the bias (zeros without), with no division by zero; backward gives
    dx = rstd * (g - mean(g)) and dweight = 0 exactly."""
    rng = np.random.default_rng(13)
    eps = op.default_eps()
    for d in (1, 2, 7, 33, 100, 1000):
        base = make_inputs(rng, (3, d), dtype)
        x = np.full((3, d), value, dtype)
        for w, b in ((base.weight, base.bias), (None, None)):
            inp = Inputs(x, w, b, base.dy)
            got = op.run(inp)
            if "y" in got:
                want_y = np.zeros_like(x) if b is None else np.broadcast_to(b, x.shape)
                assert_same_bits(np.ascontiguousarray(got["y"]), np.ascontiguousarray(want_y),
                                 f"y, d={d}")
            if "mean" in got:
                assert np.all(got["mean"] == np.float64(x[0, 0]))
                assert np.all(got["rstd"] == 1.0 / np.sqrt(eps))
            if "dx" in got:
                g = base.dy.astype(np.float64) * (1.0 if w is None else w.astype(np.float64))
                want = (g - g.mean(axis=-1, keepdims=True)) / np.sqrt(eps)
                scale = 4e-6 if dtype == np.float32 else 1e-12
                assert_close(got["dx"], want, scale * np.max(np.abs(g)) / np.sqrt(eps), "dx")
                if w is not None:
                    assert np.all(got["dweight"] == 0)


@pytest.mark.parametrize("op", [op for op in OPS.values() if op.norm == "rms"],
                         ids=lambda op: op.name)
@pytest.mark.parametrize("dtype, value", [(t, v) for t in DTYPES for v in CONSTANTS[t]
                                          if v != 0.0],
                         ids=lambda v: _id(v, "{:.3g}"))
def test_constant_rows_rms_norm(op, dtype, value):
    rng = np.random.default_rng(17)
    base = make_inputs(rng, (3, 33), dtype)
    check(op, dataclasses.replace(base, x=np.full((3, 33), value, dtype)))


# --------------------------------------------------------------------------- inf and NaN

def _bad_cases():
    for op in OPS.values():
        for where in ("x", "dy") if op.form == "backward" else ("x",):
            for dtype in DTYPES:
                for magnitude in (1.0, 1e300 if dtype == np.float64 else 3e37):
                    yield pytest.param(op, where, dtype, magnitude,
                                       id=f"{op.name}-{where}-{np.dtype(dtype).name}-{magnitude:.0e}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("op, where, dtype, magnitude", list(_bad_cases()))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_non_finite_value_stays_in_its_row(op, where, dtype, magnitude, bad, n_threads):
    """Rows large enough to run in parallel (64 x 600), at ordinary and at rescued
    magnitudes: the other rows are bitwise what they are without the bad value, the bad
    row's output holds a NaN."""
    base = make_inputs(np.random.default_rng(19), (64, 600), dtype)
    clean = dataclasses.replace(base, x=(magnitude * base.x.astype(np.float64)).astype(dtype))
    arr = getattr(clean, where).copy()
    arr[5, 17] = bad
    dirty = dataclasses.replace(clean, **{where: arr})
    good, got = op.run(clean, n_threads=n_threads), op.run(dirty, n_threads=n_threads)
    out = op.output
    others = np.arange(64) != 5
    assert np.all(np.isfinite(good[out]))
    assert np.any(np.isnan(got[out][5])), "the bad row's output holds no NaN"
    assert_same_bits(got[out][others], good[out][others], f"{op.name} {out}, other rows")
    for name in ("mean", "rstd"):
        if name in got:
            assert_same_bits(got[name][others], good[name][others], name)


# --------------------------------------------------------------------------- rare rows

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
    """Each row's result is the same bits computed alone or among the others, and for
    1, 2 and 4 threads (the rows are padded to a size that runs in parallel)."""
    base, x = _mixed_rows(dtype)
    reps = 40  # 40 copies of the block: > 2**15 elements, so threads really start
    big = dataclasses.replace(base, x=np.tile(x, (reps, 1)), dy=np.tile(base.dy, (reps, 1)))
    one = op.run(big, n_threads=1)
    for nt in (2, 4):
        for name, value in op.run(big, n_threads=nt).items():
            assert_same_bits(value, one[name], f"{op.name} {name}, n_threads={nt}")
    out = op.output
    for i in range(x.shape[0]):
        alone = op.run(dataclasses.replace(base, x=x[i:i + 1], dy=base.dy[i:i + 1]))
        assert_same_bits(one[out][i], alone[out][0], f"{op.name} row {i}")
    # and right: constant rows are checked exactly in test_constant_rows_*; the NumPy
    # reference cannot do those (its mean of equal values is not exact either)
    varying = np.any(x != x[:, :1], axis=-1)
    check(op, dataclasses.replace(base, x=x[varying], dy=base.dy[varying]))


@pytest.mark.parametrize("name", BACKWARDS)
def test_backward_of_rescaled_rows_matches_finite_differences(name):
    """float64 rows near 1e300: dx against central differences of L = sum(y * R), with
    steps relative to the rows' scale."""
    op = OPS[name]
    fwd = OPS[op.forward]
    rng = np.random.default_rng(29)
    for scale in (1e300, 1.0):
        inp = make_inputs(rng, (2, 5), np.float64, scale=scale)
        dx = op.run(inp)["dx"]
        probe = dataclasses.replace(inp, x=inp.x.copy())
        num = central_diff(lambda: np.sum(fwd.run(probe)["y"] * inp.dy), probe.x, 1e-6 * scale)
        assert_close(dx * scale, num * scale, 1e-6 * np.max(np.abs(num * scale)), f"{name} dx")
