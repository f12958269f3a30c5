"""Inverted dropout: the Philox mask, against the NumPy reference, statistics, threads, checks."""
import numpy as np
import pytest

import resnorm as rn
from resnorm import _api, reference
from _residual_testing import (THREADED_SHAPE, THREADS, assert_grad, numeric_grad, read_only,
                               strided)

DTYPES = (np.float32, np.float64)


# --------------------------------------------------------------------------- the generator

# Random123's published known-answer vectors for Philox-4x32-10: (counter, key, output).
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", PHILOX_KAT)
def test_reference_philox_known_answers(counter, key, expected):
    assert tuple(reference.philox4x32_10(counter, key)) == expected


def test_kernel_block_zero_is_the_known_answer():
    # elements 0, 16, 32, 48 are the four words of block 0 (counter 0) under key 0
    u = np.empty(64, np.uint32)
    _api.philox_uniforms(u, 0, 0)
    assert tuple(u[[0, 16, 32, 48]]) == PHILOX_KAT[0][2]


@pytest.mark.parametrize("seed", [0, 1, 0xDEADBEEF, (1 << 64) - 1, (1 << 63) + 12345])
@pytest.mark.parametrize("start, n", [(0, 1), (0, 200), (5, 123), (63, 2), (1 << 40, 300),
                                      ((1 << 38) * 64 - 10, 40)])
def test_kernel_uniforms_match_reference(seed, start, n):
    # starts inside a group, crossing groups, and counters past 2**32 (high counter word)
    u = np.empty(n, np.uint32)
    _api.philox_uniforms(u, seed, start)
    np.testing.assert_array_equal(u, reference.dropout_uniforms(seed, n, start))


def test_uniforms_look_uniform():
    n = 1 << 20
    u = np.empty(n, np.uint32)
    _api.philox_uniforms(u, 7, 0)
    v = u / 2.0**32
    assert abs(v.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
    # each of the 16 lanes and 4 words of a group (the map's structure) is unbiased too
    by_slot = v.reshape(-1, 64).mean(axis=0)
    assert np.all(np.abs(by_slot - 0.5) < 5 * np.sqrt(1 / 12 / (n // 64)))
    # no correlation between neighbours, or between the slots a group shares
    for lag in (1, 16, 64):
        c = np.corrcoef(v[:-lag], v[lag:])[0, 1]
        assert abs(c) < 5 / np.sqrt(n)


# --------------------------------------------------------------------------- against the reference

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (4, 1), (2, 3, 65), (300, 70)])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_forward_and_backward_match_reference(dtype, shape, p):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y, cache = rn.dropout_forward(x, p, seed=42, return_mask=True)
    y_ref, keep = reference.dropout_forward(x, p, 42)
    np.testing.assert_array_equal(cache.mask, keep)
    assert y.dtype == dtype and y.shape == shape
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(y, y_ref, rtol=tol, atol=0)
    np.testing.assert_array_equal(y == 0, ~keep | (x == 0))
    dx = rn.dropout_backward(dy, cache)
    np.testing.assert_allclose(dx, reference.dropout_backward(dy, keep, p), rtol=tol, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_is_x_times_the_float_multiplier_exactly(dtype):
    # y = x * m with m = (dtype)(1/(1-p)) or 0: what the fused kernels add onto the residual
    x = np.random.default_rng(1).standard_normal((50, 33)).astype(dtype)
    y, cache = rn.dropout_forward(x, 0.3, seed=3, return_mask=True)
    m = np.where(cache.mask, dtype(1 / 0.7), dtype(0))
    np.testing.assert_array_equal(y, x * m)


def test_mask_depends_on_flat_index_only():
    # the same elements in any shape get the same mask; dropout of a slice of rows is not
    # the same as the rows of a dropout (the index counts from the array's start)
    x = np.ones(6 * 40)
    a = rn.dropout(x, 0.5, seed=9)
    b = rn.dropout(x.reshape(6, 40), 0.5, seed=9)
    c = rn.dropout(x.reshape(2, 3, 40), 0.5, seed=9)
    np.testing.assert_array_equal(a, b.ravel())
    np.testing.assert_array_equal(a, c.ravel())


@pytest.mark.parametrize("dtype", DTYPES)
def test_p_zero_and_eval_are_exactly_the_identity(dtype):
    x = np.random.default_rng(2).standard_normal((9, 31)).astype(dtype)
    for y in (rn.dropout(x, 0.0, seed=1), rn.dropout(x, 0.7, seed=1, training=False)):
        assert np.array_equal(y, x) and y is not x and not np.may_share_memory(y, x)
    y, cache = rn.dropout_forward(x, 0.7, seed=1, training=False, return_mask=True)
    assert cache.mask.all()
    dy = x[::-1].copy()
    assert np.array_equal(rn.dropout_backward(dy, cache), dy)


@pytest.mark.parametrize("dtype", DTYPES)
def test_p_one_gives_zeros(dtype):
    x = np.random.default_rng(3).standard_normal((5, 40)).astype(dtype)
    y, cache = rn.dropout_forward(x, 1.0, seed=1, return_mask=True)
    assert np.array_equal(y, np.zeros_like(x)) and not cache.mask.any()
    assert np.array_equal(rn.dropout_backward(x, cache), np.zeros_like(x))
    np.testing.assert_array_equal(reference.dropout_forward(x, 1.0, 1)[0], 0.0)


def test_gradient_by_finite_differences():
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    _, cache = rn.dropout_forward(x, 0.4, seed=5)
    numeric = numeric_grad(lambda x: (rn.dropout(x, 0.4, seed=5),), {"x": x}, "x", [dy])
    assert_grad(rn.dropout_backward(dy, cache), numeric, "x")


# --------------------------------------------------------------------------- statistics

@pytest.mark.parametrize("p", [0.05, 0.1, 0.5, 0.9])
def test_kept_fraction_and_mean_within_binomial_interval(p):
    n = 1 << 20
    y = rn.dropout(np.ones(n), p, seed=11)
    kept = np.count_nonzero(y)
    assert abs(kept - n * (1 - p)) < 5 * np.sqrt(n * p * (1 - p))
    # inverted scaling preserves the mean: E[y] = 1, sd of the mean sqrt(p/(1-p)/n)
    assert abs(y.mean() - 1.0) < 5 * np.sqrt(p / (1 - p) / n)


def test_masks_differ_between_seeds_and_between_rows():
    p, shape = 0.5, (64, 4096)
    x = np.ones(shape)
    a = rn.dropout_forward(x, p, seed=1, return_mask=True)[1].mask
    b = rn.dropout_forward(x, p, seed=2, return_mask=True)[1].mask
    n = a.size
    disagree = np.count_nonzero(a != b)            # independent masks: 2p(1-p) of elements
    assert abs(disagree - n * 2 * p * (1 - p)) < 5 * np.sqrt(n * 0.25)
    rows_equal = [np.array_equal(a[i], a[j]) for i in range(8) for j in range(i + 1, 8)]
    assert not any(rows_equal)
    row_agreement = np.mean(a[:-1] == a[1:])        # p^2 + (1-p)^2 = 0.5 for independent rows
    assert abs(row_agreement - 0.5) < 5 * np.sqrt(0.25 / a[1:].size)


def test_seeds_that_differ_by_one_bit_in_either_half_give_unrelated_masks():
    x = np.ones(1 << 16)
    base = rn.dropout_forward(x, 0.5, seed=1 << 40, return_mask=True)[1].mask
    for seed in ((1 << 40) + 1, (1 << 40) | (1 << 33), 0):
        other = rn.dropout_forward(x, 0.5, seed=seed, return_mask=True)[1].mask
        assert abs(np.mean(base != other) - 0.5) < 5 * np.sqrt(0.25 / x.size)


# --------------------------------------------------------------------------- threads, layouts

@pytest.mark.parametrize("dtype", DTYPES)
def test_bitwise_identical_across_thread_counts(dtype):
    x = np.random.default_rng(5).standard_normal((40, 2049)).astype(dtype)  # > 8 chunks
    outs = [rn.dropout_forward(x, 0.3, seed=8, n_threads=t, return_mask=True) for t in THREADS]
    for y, cache in outs[1:]:
        assert np.array_equal(y, outs[0][0])
        assert np.array_equal(cache.mask, outs[0][1].mask)
        assert np.array_equal(rn.dropout_backward(x, cache, n_threads=4),
                              rn.dropout_backward(x, outs[0][1], n_threads=1))


def test_non_contiguous_and_read_only_inputs_unchanged():
    rng = np.random.default_rng(6)
    x = rng.standard_normal(THREADED_SHAPE)
    expected = rn.dropout(x, 0.2, seed=4)
    for variant in (strided(x), read_only(x), np.asfortranarray(x)):
        before = variant.copy()
        assert np.array_equal(rn.dropout(variant, 0.2, seed=4), expected)
        assert np.array_equal(variant, before)


def test_out_buffers_and_in_place():
    x = np.random.default_rng(7).standard_normal((10, 20))
    expected = rn.dropout(x, 0.25, seed=3)
    out = np.empty_like(x)
    assert rn.dropout(x, 0.25, seed=3, out=out) is out and np.array_equal(out, expected)
    strided_out = np.zeros((10, 40))[:, ::2]
    rn.dropout(x, 0.25, seed=3, out=strided_out)
    assert np.array_equal(strided_out, expected)
    y = x.copy()
    rn.dropout(y, 0.25, seed=3, out=y)
    assert np.array_equal(y, expected)
    _, cache = rn.dropout_forward(x, 0.25, seed=3)
    dy = x.copy()
    assert rn.dropout_backward(dy, cache, out=dy) is dy and np.array_equal(dy, expected)


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("p, error", [(-0.1, ValueError), (1.01, ValueError),
                                      (float("nan"), ValueError), ("0.5", TypeError),
                                      (True, TypeError), (None, TypeError)])
def test_bad_p(p, error):
    with pytest.raises(error, match=r"\bp\b"):
        rn.dropout(np.ones(3), p, seed=0)


@pytest.mark.parametrize("seed, error", [(-1, ValueError), (1 << 64, ValueError),
                                         (1.5, TypeError), (True, TypeError), ("1", TypeError)])
def test_bad_seed(seed, error):
    with pytest.raises(error, match="seed"):
        rn.dropout(np.ones(3), 0.5, seed=seed)


def test_seed_is_required_and_numpy_integers_work():
    with pytest.raises(TypeError):
        rn.dropout(np.ones(3), 0.5)
    assert np.array_equal(rn.dropout(np.ones(99), 0.5, seed=np.uint64(5)),
                          rn.dropout(np.ones(99), 0.5, seed=5))


def test_bad_arrays_and_flags():
    with pytest.raises(TypeError, match="x"):
        rn.dropout(np.ones(3, dtype=np.int64), 0.5, seed=0)
    with pytest.raises(TypeError, match="x"):
        rn.dropout(np.ones(3, dtype=np.complex64), 0.5, seed=0)
    with pytest.raises(TypeError, match="training"):
        rn.dropout(np.ones(3), 0.5, seed=0, training="yes")
    with pytest.raises(TypeError, match="return_mask"):
        rn.dropout_forward(np.ones(3), 0.5, seed=0, return_mask=1)
    _, cache = rn.dropout_forward(np.ones((2, 3)), 0.5, seed=0)
    with pytest.raises(ValueError, match="dy"):
        rn.dropout_backward(np.ones((3, 2)), cache)
    with pytest.raises(TypeError, match="dy"):
        rn.dropout_backward(np.ones((2, 3), dtype=np.float32), cache)
    with pytest.raises(TypeError, match="cache"):
        rn.dropout_backward(np.ones((2, 3)), object())
    with pytest.raises(ValueError, match="out"):
        rn.dropout(np.ones((2, 3)), 0.5, seed=0, out=np.empty((3, 2)))
