"""Kernels against the float64 NumPy reference (resnorm.reference), forward and backward."""
import numpy as np
import pytest

import resnorm
from conftest import (DTYPES, assert_bitwise_equal, assert_scaled_close, assert_stats_close,
                      make_inputs, ref_ln, ref_rms, rtol_for, run_ln, run_rms)

SHAPES = [
    (4, 1),       # D=1: LayerNorm output is the bias, dx a cancellation to ~0
    (3, 7),       # shorter than one vector / one 32-lane reduction block
    (5, 33),      # one full 32-lane block plus a tail of one
    (2, 4096),    # long rows
    (1, 64),      # N=1
    (1, 40000),   # N=1 but large enough to run parallel: fewer rows than threads
    (0, 8),       # no rows
    (33,),        # rank 1
    (2, 3, 17),   # rank 3
]
RMS_PARAMS = [pytest.param(True, id="w"), pytest.param(False, id="no_w")]
LN_PARAMS = [pytest.param(w, b, id=f"{'w' if w else 'no_w'}-{'b' if b else 'no_b'}")
             for w in (True, False) for b in (True, False)]


def _check_outputs(got, want, dtype, has_w, has_b, n_rows):
    rtol = rtol_for(dtype)
    s = want["scales"]
    assert got["y"].dtype == dtype and got["dx"].dtype == dtype
    assert_scaled_close(got["y"], want["y"], s["y"], rtol, "y")
    assert_scaled_close(got["dx"], want["dx"], s["dx"], rtol, "dx")
    if has_w:
        assert got["dw"].dtype == dtype and got["dw"].shape == want["dw"].shape
        assert_scaled_close(got["dw"], want["dw"], s["dw"], rtol, "dweight")
    else:
        assert got["dw"] is None
    if "db" in got:
        if has_b:
            assert got["db"].dtype == dtype and got["db"].shape == want["db"].shape
            assert_scaled_close(got["db"], want["db"], s["db"], rtol, "dbias")
        else:
            assert got["db"] is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("has_w", RMS_PARAMS)
def test_rms_norm_matches_reference(rng, dtype, shape, has_w):
    x, w, _, dy = make_inputs(rng, shape, dtype, weight=has_w, bias=False)
    got, want = run_rms(x, w, dy), ref_rms(x, w, dy)
    assert got["y"].shape == shape and got["dx"].shape == shape
    assert_stats_close(got["rstd"], want["rstd"], "rstd")
    _check_outputs(got, want, dtype, has_w, False, x.size // shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("has_w, has_b", LN_PARAMS)
def test_layer_norm_matches_reference(rng, dtype, shape, has_w, has_b):
    x, w, b, dy = make_inputs(rng, shape, dtype, weight=has_w, bias=has_b)
    got, want = run_ln(x, w, b, dy), ref_ln(x, w, b, dy)
    assert got["y"].shape == shape and got["dx"].shape == shape
    assert_stats_close(got["rstd"], want["rstd"], "rstd", lanes=dtype)
    mean_scale = np.mean(np.abs(np.asarray(x, np.float64)), axis=-1) if x.size else 0.0
    assert_stats_close(got["mean"], want["mean"], "mean", scale=mean_scale, lanes=dtype)
    _check_outputs(got, want, dtype, has_w, has_b, x.size // shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 8), (0, 1), (2, 0, 5)], ids=str)
def test_zero_rows_give_empty_results(dtype, shape):
    x = np.empty(shape, dtype)
    w, b = np.ones(shape[-1], dtype), np.ones(shape[-1], dtype)
    for y in (resnorm.rms_norm(x, w), resnorm.layer_norm(x, w, b)):
        assert y.shape == shape and y.dtype == dtype
    y, cache = resnorm.rms_norm_forward(x, w)
    assert y.shape == shape and cache.rstd.shape == (0,)
    dx, dw = resnorm.rms_norm_backward(np.empty(shape, dtype), cache)
    assert dx.shape == shape and dx.dtype == dtype
    # the sum over no rows is zero
    assert dw.dtype == dtype and np.array_equal(dw, np.zeros(shape[-1]))
    y, cache = resnorm.layer_norm_forward(x, w, b)
    assert y.shape == shape and cache.mean.shape == (0,) and cache.rstd.shape == (0,)
    dx, dw, db = resnorm.layer_norm_backward(np.empty(shape, dtype), cache)
    assert dx.shape == shape and dx.dtype == dtype
    assert np.array_equal(dw, np.zeros(shape[-1])) and np.array_equal(db, np.zeros(shape[-1]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_inference_form_equals_training_form(rng, dtype, shape):
    x, w, b, _ = make_inputs(rng, shape, dtype)
    y_train, _ = resnorm.rms_norm_forward(x, w)
    assert_bitwise_equal(resnorm.rms_norm(x, w), y_train, "rms_norm")
    y_train, _ = resnorm.rms_norm_forward(x)
    assert_bitwise_equal(resnorm.rms_norm(x), y_train, "rms_norm without weight")
    for wb in ((w, b), (w, None), (None, b), (None, None)):
        y_train, _ = resnorm.layer_norm_forward(x, *wb)
        assert_bitwise_equal(resnorm.layer_norm(x, *wb), y_train, f"layer_norm {wb is None}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-3, 0.5, 4.0])
def test_eps_is_used(rng, dtype, eps):
    # small-variance rows: the result depends strongly on eps
    x, w, b, dy = make_inputs(rng, (6, 19), dtype, scale=0.3)
    got, want = run_rms(x, w, dy, eps), ref_rms(x, w, dy, eps)
    assert_stats_close(got["rstd"], want["rstd"], "rms rstd")
    _check_outputs(got, want, dtype, True, False, 6)
    got, want = run_ln(x, w, b, dy, eps), ref_ln(x, w, b, dy, eps)
    assert_stats_close(got["rstd"], want["rstd"], "ln rstd", lanes=dtype)
    _check_outputs(got, want, dtype, True, True, 6)
    assert_scaled_close(resnorm.rms_norm(x, w, eps), ref_rms(x, w, dy, eps)["y"],
                        want["scales"]["y"], rtol_for(dtype), "rms_norm(eps)")
    assert_scaled_close(resnorm.layer_norm(x, w, b, eps), want["y"],
                        want["scales"]["y"], rtol_for(dtype), "layer_norm(eps)")


@pytest.mark.parametrize("dtype", DTYPES)
def test_streaming_sized_output_matches_reference(rng, dtype):
    # >= 8 MiB of output: written with non-temporal stores; odd D misaligns the rows
    d = 2047
    n = (8 << 20) // (d * np.dtype(dtype).itemsize) + 1
    x, w, b, dy = make_inputs(rng, (n, d), dtype)
    got, want = run_ln(x, w, b, dy), ref_ln(x, w, b, dy)
    _check_outputs(got, want, dtype, True, True, n)
    got, want = run_rms(x, w, dy), ref_rms(x, w, dy)
    _check_outputs(got, want, dtype, True, False, n)
