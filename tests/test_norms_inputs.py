"""Input handling: layouts, read-only and list inputs, inputs left untouched, out=."""
import numpy as np
import pytest

import resnorm
from conftest import (DTYPES, assert_bitwise_equal, assert_scaled_close, make_inputs, ref_ln,
                      ref_rms, rtol_for, run_ln, run_rms)


def _check_all(x, w, b, dy, dtype):
    """Forward and backward of both norms on x (any layout) against the reference."""
    rtol = rtol_for(dtype)
    for got, want in [(run_rms(x, w, dy), ref_rms(x, w, dy)), (run_ln(x, w, b, dy), ref_ln(x, w, b, dy))]:
        for key in ("y", "dx", "dw", "db"):
            if key in got:
                assert_scaled_close(got[key], want[key], want["scales"][key], rtol, key)
        assert got["y"].shape == np.shape(x) and got["dx"].shape == np.shape(x)
    s = ref_ln(x, w, b, dy)["scales"]["y"]
    assert_scaled_close(resnorm.layer_norm(x, w, b), ref_ln(x, w, b, dy)["y"], s, rtol, "ln")
    s = ref_rms(x, w, dy)["scales"]["y"]
    assert_scaled_close(resnorm.rms_norm(x, w), ref_rms(x, w, dy)["y"], s, rtol, "rms")


def _views(rng, dtype):
    base = rng.standard_normal((6, 40)).astype(dtype)
    base3 = rng.standard_normal((4, 5, 24)).astype(dtype)
    return {
        "every_other_column": base[:, ::2],
        "transposed": base.T,
        "reversed_rows": base[::-1],
        "column_block": base[1:5, 3:30],
        "rank3_sliced": base3[1:3, ::2, 1:20],
        "rank3_transposed": base3.transpose(1, 0, 2),
        "rank1_strided": base[2, ::3],
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("view", list(_views(np.random.default_rng(0), np.float64)))
def test_non_contiguous_input(rng, dtype, view):
    x = _views(rng, dtype)[view]
    assert not x.flags.c_contiguous
    _, w, b, dy = make_inputs(rng, x.shape, dtype)
    dy_view = np.asfortranarray(dy) if dy.ndim > 1 else dy
    _check_all(x, w, b, dy_view, dtype)
    # same results as from a contiguous copy, bit for bit
    xc = np.ascontiguousarray(x)
    for k, v in run_ln(xc, w, b, dy).items():
        assert_bitwise_equal(run_ln(x, w, b, dy_view)[k], v, k)
    for k, v in run_rms(xc, w, dy).items():
        assert_bitwise_equal(run_rms(x, w, dy_view)[k], v, k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_weight_and_bias(rng, dtype):
    x, _, _, dy = make_inputs(rng, (5, 13), dtype)
    wb = rng.standard_normal((2, 26)).astype(dtype)
    w, b = wb[0, ::2], wb[1, 1::2]
    assert not w.flags.c_contiguous
    _check_all(x, w, b, dy, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_input_and_out(rng, dtype):
    itemsize = np.dtype(dtype).itemsize
    shape = (7, 45)
    n = int(np.prod(shape))
    raw = np.zeros(n * itemsize + 1, np.uint8)
    x = np.frombuffer(raw.data, dtype, n, offset=1).reshape(shape)
    x[...] = rng.standard_normal(shape)
    assert not x.flags.aligned
    _, w, b, dy = make_inputs(rng, shape, dtype)
    _check_all(x, w, b, dy, dtype)
    raw_out = np.zeros(n * itemsize + 1, np.uint8)
    out = np.frombuffer(raw_out.data, dtype, n, offset=1).reshape(shape)
    assert not out.flags.aligned
    expected = resnorm.layer_norm(np.array(x), w, b)
    assert resnorm.layer_norm(x, w, b, out=out) is out
    assert_bitwise_equal(out, expected, "misaligned out")


@pytest.mark.parametrize("dtype", DTYPES)
def test_read_only_inputs(rng, dtype):
    x, w, b, dy = make_inputs(rng, (6, 33), dtype)
    for a in (x, w, b, dy):
        a.setflags(write=False)
    _check_all(x, w, b, dy, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 33), (33,), (2, 3, 17), (1000, 97)], ids=str)
def test_inputs_never_modified(rng, dtype, shape):
    x, w, b, dy = make_inputs(rng, shape, dtype)
    before = [a.copy() for a in (x, w, b, dy)]
    run_rms(x, w, dy)
    run_ln(x, w, b, dy)
    resnorm.rms_norm(x, w)
    resnorm.layer_norm(x, w, b)
    resnorm.rms_norm(x, w, out=np.empty_like(x))
    resnorm.layer_norm(x, w, b, out=np.empty_like(x))
    for a, a0, name in zip((x, w, b, dy), before, ("x", "weight", "bias", "dy")):
        assert_bitwise_equal(a, a0, f"{name} was modified")


def test_lists_accepted_for_x(rng):
    x = rng.standard_normal((3, 5))
    xl = x.tolist()
    assert_bitwise_equal(resnorm.rms_norm(xl), resnorm.rms_norm(x), "rms list")
    assert_bitwise_equal(resnorm.layer_norm(xl), resnorm.layer_norm(x), "ln list")
    y, cache = resnorm.layer_norm_forward(xl)
    assert y.dtype == np.float64 and y.shape == (3, 5)
    dx, _, _ = resnorm.layer_norm_backward(np.ones((3, 5)), cache)
    assert_bitwise_equal(dx, resnorm.layer_norm_backward(np.ones((3, 5)),
                                                         resnorm.layer_norm_forward(x)[1])[0], "dx")
    assert_bitwise_equal(resnorm.rms_norm([1.0, 2.0, 3.0]),
                         resnorm.rms_norm(np.array([1.0, 2.0, 3.0])), "rank-1 list")


# --------------------------------------------------------------------------- out=

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 33), (33,), (2, 3, 17)], ids=str)
def test_out_preallocated(rng, dtype, shape):
    x, w, b, _ = make_inputs(rng, shape, dtype)
    calls = [
        (lambda o: resnorm.rms_norm(x, w, out=o), resnorm.rms_norm(x, w)),
        (lambda o: resnorm.layer_norm(x, w, b, out=o), resnorm.layer_norm(x, w, b)),
        (lambda o: resnorm.rms_norm_forward(x, w, out=o)[0], resnorm.rms_norm(x, w)),
        (lambda o: resnorm.layer_norm_forward(x, w, b, out=o)[0], resnorm.layer_norm(x, w, b)),
    ]
    for call, expected in calls:
        out = np.full(shape, np.nan, dtype)
        assert call(out) is out
        assert_bitwise_equal(out, expected, "out")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 33), (33,), (2, 3, 17), (600, 97)], ids=str)
def test_out_is_x_normalises_in_place(rng, dtype, shape):
    x, w, b, _ = make_inputs(rng, shape, dtype)
    expected = resnorm.layer_norm(x, w, b)
    xi = x.copy()
    assert resnorm.layer_norm(xi, w, b, out=xi) is xi
    assert_bitwise_equal(xi, expected, "layer_norm in place")
    expected = resnorm.rms_norm(x, w)
    xi = x.copy()
    assert resnorm.rms_norm(xi, w, out=xi) is xi
    assert_bitwise_equal(xi, expected, "rms_norm in place")


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_is_non_contiguous_x_in_place(rng, dtype):
    buf = rng.standard_normal((6, 40)).astype(dtype)
    buf0 = buf.copy()
    x = buf[:, ::2]
    expected = resnorm.layer_norm(x.copy())
    assert resnorm.layer_norm(x, out=x) is x
    assert_bitwise_equal(buf[:, ::2], expected, "in-place strided")
    assert_bitwise_equal(buf[:, 1::2], buf0[:, 1::2], "untouched columns")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 33), (2, 3, 17)], ids=str)
def test_out_non_contiguous(rng, dtype, shape):
    x, w, b, _ = make_inputs(rng, shape, dtype)
    for call, expected in [(lambda o: resnorm.rms_norm(x, w, out=o), resnorm.rms_norm(x, w)),
                           (lambda o: resnorm.layer_norm_forward(x, w, b, out=o)[0],
                            resnorm.layer_norm(x, w, b))]:
        buf = np.full(shape[:-1] + (2 * shape[-1],), -7.0, dtype)
        out = buf[..., ::2]
        assert call(out) is out
        assert_bitwise_equal(out, expected, "strided out")
        assert np.all(buf[..., 1::2] == -7.0), "wrote outside the out view"
        tout = np.full(shape[::-1], np.nan, dtype).T
        assert call(tout) is tout
        assert_bitwise_equal(tout, expected, "transposed out")


def test_training_form_out_then_backward(rng):
    """out= in the training form does not disturb what backward sees."""
    x, w, b, dy = make_inputs(rng, (5, 9), np.float64)
    out = np.empty_like(x)
    y, cache = resnorm.layer_norm_forward(x, w, b, out=out)
    want = run_ln(x, w, b, dy)
    dx, dw, db = resnorm.layer_norm_backward(dy, cache)
    assert_bitwise_equal(dx, want["dx"], "dx")
    assert_bitwise_equal(dw, want["dw"], "dw")
    out = np.empty_like(x)
    y, cache = resnorm.rms_norm_forward(x, w, out=out)
    assert_bitwise_equal(resnorm.rms_norm_backward(dy, cache)[0], run_rms(x, w, dy)["dx"], "dx")


@pytest.mark.parametrize("dtype", DTYPES)
def test_training_form_out_is_weight_keeps_backward_right(rng, dtype):
    """Rank-1 x: out may be the weight vector itself (same shape).  The training form must
    then either refuse (ValueError naming out) or still give the right gradients: backward
    needs the weight as it was, like it needs x (out=x is refused for that reason)."""
    x, w, b, dy = make_inputs(rng, (16,), dtype)
    w0 = w.copy()
    want_rms, want_ln = run_rms(x, w0, dy), run_ln(x, w0, b, dy)
    for norm in ("rms", "ln"):
        wk = w0.copy()
        try:
            if norm == "rms":
                y, cache = resnorm.rms_norm_forward(x, wk, out=wk)
                dx, dw = resnorm.rms_norm_backward(dy, cache)
                want = want_rms
            else:
                y, cache = resnorm.layer_norm_forward(x, wk, b, out=wk)
                dx, dw, _ = resnorm.layer_norm_backward(dy, cache)
                want = want_ln
        except ValueError as e:
            assert "out" in str(e)
            continue
        assert_bitwise_equal(y, want["y"], f"{norm} y")
        assert_bitwise_equal(dx, want["dx"], f"{norm} dx after out=weight")
        assert_bitwise_equal(dw, want["dw"], f"{norm} dweight after out=weight")
