"""LayerNorm's row statistics in one pass about a shift c (the mean of a row's first 32
elements), and the two-pass rows, whose c lies more than half a standard deviation from the
mean: both as accurate as the float64 reference, the same in every kernel that forms them
(layer_norm, and add_layer_norm in and out of cache), for every thread count."""
import numpy as np
import pytest

import resnorm as rn
from resnorm import reference
from conftest import DTYPES, assert_stats_close, rtol_for

WIDTHS = [1, 31, 32, 33, 64, 255, 1000]


def rows(d, dtype, n=24, seed=0):
    """n rows of width d, alternating: every third row plain N(0, 1) (c near the mean), one
    offset by 1e4 (c near the mean, a large mean), one whose first 32 elements sit 50
    standard deviations above the rest (c far from the mean: the two-pass rows), and the
    last row constant."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    x[1::3] += 1e4
    x[2::3, :32] += 50.0
    x[-1] = 3.25
    return x.astype(dtype)


def shift_is_near(x):
    """Whether a row takes the one-pass statistics: (mean - c)^2 <= var / 4, in float64."""
    x = np.asarray(x, np.float64)
    c = x[:, :32].mean(axis=1)
    return (x.mean(axis=1) - c) ** 2 <= x.var(axis=1) / 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", WIDTHS)
def test_statistics_match_the_float64_reference_in_both_forms(dtype, d):
    x = rows(d, dtype)
    w = np.linspace(0.5, 1.5, d).astype(dtype)
    b = np.linspace(-1.0, 1.0, d).astype(dtype)
    y, cache = rn.layer_norm_forward(x, w, b)
    y_ref, mean_ref, rstd_ref = reference.layer_norm_forward(x, w, b, 1e-5)
    assert_stats_close(cache.mean, mean_ref, "mean",
                       scale=np.mean(np.abs(np.asarray(x, np.float64)), axis=1), lanes=dtype)
    assert_stats_close(cache.rstd, rstd_ref, "rstd", lanes=dtype)
    # y's terms, with the reference's xhat shifted by a few double ulps of the mean (the
    # summation order differs), as conftest.ref_ln scales them
    x64 = np.asarray(x, np.float64)
    xhat = (x64 - mean_ref[:, None]) * rstd_ref[:, None]
    shift = 1e-3 * rstd_ref[:, None] * np.mean(np.abs(x64), axis=1, keepdims=True)
    scale = (np.abs(xhat) + shift) * np.abs(np.asarray(w, np.float64)) + np.abs(b)
    assert np.all(np.abs(y - y_ref) <= rtol_for(dtype) * scale)
    if d >= 64:   # both forms are exercised: rows with c near the mean, and the others
        near = shift_is_near(x)
        assert near.any() and not near.all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(24, 255), (24, 1000), (2200, 1024)])
def test_fused_forward_has_the_norms_bits(dtype, shape):
    # (2200, 1024): outputs of 8 MiB and more take the streamed path, which reduces h
    # without storing it first
    n, d = shape
    x = rows(d, dtype, n=n, seed=1)
    residual = rows(d, dtype, n=n, seed=2)
    w = np.linspace(0.5, 1.5, d).astype(dtype)
    b = np.linspace(-1.0, 1.0, d).astype(dtype)
    y, h = rn.add_layer_norm(x, residual, w, b)
    assert np.array_equal(h, residual + x)
    assert np.array_equal(y, rn.layer_norm(residual + x, w, b))
    y_post = rn.add_layer_norm_post(x, residual, w, b)
    assert np.array_equal(y_post, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_thread_count_gives_the_same_bits(dtype):
    x = rows(1000, dtype, n=37, seed=3)
    y1, c1 = rn.layer_norm_forward(x, n_threads=1)
    for t in (2, 4):
        y, c = rn.layer_norm_forward(x, n_threads=t)
        assert np.array_equal(y, y1)
        assert np.array_equal(c.mean, c1.mean) and np.array_equal(c.rstd, c1.rstd)


def test_constant_rows_keep_their_value_as_the_mean():
    x = np.full((3, 100), 0.1, np.float32)
    _, cache = rn.layer_norm_forward(x)
    assert np.all(cache.mean == np.float64(np.float32(0.1)))
    assert np.all(cache.rstd == 1.0 / np.sqrt(1e-5))


@pytest.mark.parametrize("scale", [1e20, 1e-17])
@pytest.mark.parametrize("fused", [False, True])
def test_rows_float32_lanes_cannot_carry_take_the_double_statistics(scale, fused):
    # |x - c| ~ 1e20: float32 squares overflow; ~1e-17: their squares (1e-34) lose
    # their precision in the subnormals (a mean square under 2**-100).  Such rows take the
    # two-pass statistics in double, and are as accurate as any other.
    rng = np.random.default_rng(4)
    x = (scale * rng.standard_normal((8, 1000))).astype(np.float32)
    if fused:
        (y, h), cache = rn.add_layer_norm_forward(x, np.zeros_like(x), eps=2e-38)
    else:
        y, cache = rn.layer_norm_forward(x, eps=2e-38)
    y_ref, mean_ref, rstd_ref = reference.layer_norm_forward(x, None, None, 2e-38)
    assert_stats_close(cache.rstd, rstd_ref, "rstd", lanes=np.float32)
    assert np.all(np.abs(y - y_ref) <= 4 * 2.0 ** -24 * (np.abs(y_ref) + 1))


def test_the_shift_leaves_no_bias_in_the_mean():
    # float32 lanes form x - c in float32.  With c = the mean of the first 32 elements to
    # all of its bits, every x - c of one binade rounded the same way: on N(0.1, 1) rows of
    # 4096 that biased the mean by up to 0.27 float32 ulps of the spread.  c on a coarser
    # grid leaves only the sums' random rounding (measured: 0.07).
    rng = np.random.default_rng(5)
    x = (0.1 + rng.standard_normal((64, 4096))).astype(np.float32)
    _, cache = rn.layer_norm_forward(x)
    x64 = x.astype(np.float64)
    err = np.abs(cache.mean - x64.mean(axis=1)) / x64.std(axis=1)
    assert err.max() <= 0.15 * 2.0 ** -24
