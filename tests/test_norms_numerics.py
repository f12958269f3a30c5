"""Numerically hard inputs: large mean, huge and tiny magnitudes, constant rows, NaN/Inf,
subnormals."""
import numpy as np
import pytest

import resnorm
from resnorm import reference as ref
from conftest import (DTYPES, LANE_STAT_RTOL, assert_bitwise_equal, assert_scaled_close,
                      make_inputs, ref_ln, ref_rms, rtol_for, run_ln, run_rms)

# --------------------------------------------------------------------------- large mean

# x = 1e4 + N(0,1) in float32: a one-pass E[x^2] - E[x]^2 variance, or x - mean with the
# mean rounded to float32, loses most digits; a two-pass double variance plus a split mean
# does not (a naive float32 E[x^2] - E[x]^2 LayerNorm is off by ~1e3 here).  Observed
# max |y - reference| with the suite's seed on (64, 1024): 2.74e-7 without weight/bias
# (about half an ulp of |y| ~ 4.7: the output rounding itself; up to 6e-7 over other seeds
# and shapes), 8.3e-7 with weight and bias (|y| up to ~10), 9.8e-7 for dx.
# Bounds: ~4x the observed.
LARGE_MEAN_SHAPE = (64, 1024)
LARGE_MEAN_BOUND = 1.2e-6
LARGE_MEAN_BOUND_WB = 4e-6
LARGE_MEAN_DX_BOUND = 4e-6  # |dx| up to ~9


def _large_mean_input(rng):
    x = (1e4 + rng.standard_normal(LARGE_MEAN_SHAPE)).astype(np.float32)
    d = LARGE_MEAN_SHAPE[-1]
    w = (1 + 0.5 * rng.standard_normal(d)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    dy = rng.standard_normal(LARGE_MEAN_SHAPE).astype(np.float32)
    return x, w, b, dy


def _max_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)))


def test_large_mean_float32_layer_norm_error_is_small(rng):
    x, w, b, dy = _large_mean_input(rng)
    err = _max_err(resnorm.layer_norm(x), ref.layer_norm_forward(x)[0])
    assert err < LARGE_MEAN_BOUND, f"max |y - ref| = {err:.3g}"
    err = _max_err(resnorm.layer_norm(x, w, b), ref.layer_norm_forward(x, w, b)[0])
    assert err < LARGE_MEAN_BOUND_WB, f"max |y - ref| with weight, bias = {err:.3g}"
    got, want = run_ln(x, w, b, dy), ref_ln(x, w, b, dy)
    err = _max_err(got["dx"], want["dx"])
    assert err < LARGE_MEAN_DX_BOUND, f"max |dx - ref| = {err:.3g}"
    # the row statistics: the mean to the float32 lanes' rounding of the spread (x - c is
    # exact here: c, near 1e4, within a factor 2 of every x), rstd to their relative bound
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=0, atol=LANE_STAT_RTOL)
    np.testing.assert_allclose(got["rstd"], want["rstd"], rtol=LANE_STAT_RTOL)


def test_large_mean_float32_layer_norm_no_worse_than_torch(rng):
    torch = pytest.importorskip("torch")
    x, w, b, _ = _large_mean_input(rng)
    for args in [(), (w, b)]:
        want = ref.layer_norm_forward(x, *args)[0]
        ours = _max_err(resnorm.layer_norm(x, *args, eps=1e-5), want)
        targs = [torch.from_numpy(a) for a in args] or [None, None]
        theirs = torch.nn.functional.layer_norm(torch.from_numpy(x), (x.shape[-1],), *targs,
                                                eps=1e-5).numpy()
        torch_err = _max_err(theirs, want)
        # no worse, up to one float32 ulp of the output (both may be at rounding level)
        ulp = float(np.spacing(np.float32(np.max(np.abs(want)))))
        assert ours <= torch_err + ulp, f"resnorm {ours:.3g} vs torch {torch_err:.3g}"


# --------------------------------------------------------------------------- magnitudes

def _check_against_reference(x, w, b, dy, dtype, atol=0.0):
    for got, want, has_b in [(run_rms(x, w, dy), ref_rms(x, w, dy), False),
                             (run_ln(x, w, b, dy), ref_ln(x, w, b, dy), b is not None)]:
        for key in ("y", "dx", "dw", "db"):
            if key not in got or (key == "db" and not has_b):
                continue
            assert np.all(np.isfinite(got[key])), f"{key} not finite"
            scale = want["scales"][key] + atol / rtol_for(dtype)
            assert_scaled_close(got[key], want[key], scale, rtol_for(dtype), key)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("magnitude", [1e30, 1e-30])
@pytest.mark.parametrize("has_b", [True, False], ids=["b", "no_b"])
def test_huge_and_tiny_magnitudes_match_reference(rng, dtype, magnitude, has_b):
    x, w, b, dy = make_inputs(rng, (4, 37), dtype, bias=has_b, scale=magnitude)
    _check_against_reference(x, w, b, dy, dtype)
    # an offset row as well: |mean| >> std at a huge / tiny scale
    x2 = (magnitude * (5.0 + rng.standard_normal((3, 40)))).astype(dtype)
    w2, b2, dy2 = make_inputs(rng, (3, 40), dtype, bias=has_b)[1:]
    _check_against_reference(x2, w2, b2, dy2, dtype)


@pytest.mark.parametrize("dtype, magnitude", [(np.float32, 1e-40), (np.float64, 1e-310)])
@pytest.mark.parametrize("has_b", [True, False], ids=["b", "no_b"])
def test_subnormal_inputs_match_reference(rng, dtype, magnitude, has_b):
    x, w, b, dy = make_inputs(rng, (4, 37), dtype, bias=has_b, scale=magnitude)
    tiny = np.finfo(dtype).smallest_subnormal
    assert np.count_nonzero(np.abs(x) < np.finfo(dtype).smallest_normal) > 100
    assert np.count_nonzero(x) > 100
    # Inputs on the subnormal grid: x - mean and the products in backward are only known to
    # ~1 grid step, amplified by rstd (<= 1/sqrt(eps)), |w|, |dy| and summed over rows.
    rstd_max = 1.0 / np.sqrt(1e-6)
    atol = 2 * x.shape[0] * rstd_max * np.max(np.abs(w)) * np.max(np.abs(dy)) * tiny
    _check_against_reference(x, w, b, dy, dtype, atol=atol)
    # and the outputs are real numbers, not flushed to zero (no FTZ/DAZ)
    y = resnorm.rms_norm(x)
    assert np.count_nonzero(y) == np.count_nonzero(x)


# --------------------------------------------------------------------------- constant rows

@pytest.mark.parametrize("value", [0.0, 3.0, -2.5, 0.1, 1e4 + 0.1, 1e30, -1e-30])
@pytest.mark.parametrize("d", [1, 7, 33, 100])
def test_constant_row_float32_gives_exactly_bias(rng, value, d):
    # float32 values sum exactly in double, so the mean is exactly the value and x - mean
    # is exactly 0: the output is exactly the bias (zeros without bias)
    dtype = np.float32
    x = np.full((3, d), value, dtype)
    w, b, dy = make_inputs(rng, (3, d), dtype)[1:]
    for args, expected in [((w, b), np.broadcast_to(b, x.shape)), ((w, None), 0),
                           ((None, b), np.broadcast_to(b, x.shape)), ((None, None), 0)]:
        y = resnorm.layer_norm(x, *args)
        assert not np.any(np.isnan(y))
        assert np.array_equal(y, np.broadcast_to(expected, x.shape)), args
    got, want = run_ln(x, w, b, dy), ref_ln(x, w, b, dy)
    for key in ("dx", "dw", "db"):
        assert np.all(np.isfinite(got[key])), key
        assert_scaled_close(got[key], want[key], want["scales"][key], rtol_for(dtype), key)


@pytest.mark.parametrize("value", [0.0, 3.0, -2.5, 1e4, 0.1, 1.0 / 3.0, 1e4 + 0.1])
@pytest.mark.parametrize("d", [1, 7, 33, 100])
def test_constant_row_float64_gives_bias(rng, value, d):
    dtype = np.float64
    x = np.full((3, d), value, dtype)
    w, b, dy = make_inputs(rng, (3, d), dtype)[1:]
    y = resnorm.layer_norm(x, w, b)
    assert not np.any(np.isnan(y))
    if value in (0.0, 3.0, -2.5, 1e4):
        # sums of these are exact in double: exactly the bias
        assert np.array_equal(y, np.broadcast_to(b, x.shape))
        assert np.array_equal(resnorm.layer_norm(x), np.zeros_like(x))
    else:
        # the double mean of a constant row may be off by an ulp or so of the value,
        # which rstd = 1/sqrt(eps) amplifies: |y - b| <= a few ulps(value) * rstd * |w|
        bound = 8 * np.spacing(value) / np.sqrt(1e-5) * np.max(np.abs(w))
        assert np.max(np.abs(y - b)) <= bound
    got, want = run_ln(x, w, b, dy), ref_ln(x, w, b, dy)
    for key in ("dx", "dw", "db"):
        assert np.all(np.isfinite(got[key])), key
        assert_scaled_close(got[key], want[key], want["scales"][key], rtol_for(dtype), key)


# --------------------------------------------------------------------------- NaN / Inf

@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("shape", [(5, 9), (600, 97)], ids=str)
def test_non_finite_value_only_affects_its_row(rng, dtype, bad, shape):
    x, w, b, dy = make_inputs(rng, shape, dtype)
    row = 2
    xbad = x.copy()
    xbad[row, 3] = bad
    clean = {"rms": run_rms(x, w, dy), "ln": run_ln(x, w, b, dy)}
    dirty = {"rms": run_rms(xbad, w, dy), "ln": run_ln(xbad, w, b, dy)}
    refs = {"rms": ref_rms(xbad, w, dy), "ln": ref_ln(xbad, w, b, dy)}
    others = np.arange(shape[0]) != row
    for norm in ("rms", "ln"):
        got, good, want = dirty[norm], clean[norm], refs[norm]
        for key in ("y", "dx"):
            assert not np.all(np.isfinite(got[key][row])), f"{norm} {key}: bad row all finite"
            assert np.all(np.isfinite(got[key][others])), f"{norm} {key}: other rows hit"
            # other rows: exactly what they are without the bad row ...
            assert_bitwise_equal(got[key][others], good[key][others], f"{norm} {key}")
            # ... and as close to the reference as in the normal case
            assert_scaled_close(got[key][others], want[key][others],
                                want["scales"][key][others], rtol_for(dtype), f"{norm} {key}")
            # the bad row is non-finite where the reference's is
            assert np.array_equal(np.isfinite(got[key][row]), np.isfinite(want[key][row]))
    # dbias does not depend on x at all
    assert_bitwise_equal(dirty["ln"]["db"], clean["ln"]["db"], "dbias")
