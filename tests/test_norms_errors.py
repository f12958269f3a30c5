"""Bad arguments raise TypeError (wrong kind/dtype) or ValueError (wrong value/shape) with a
message naming the argument."""
import numpy as np
import pytest

import resnorm

D = 6


@pytest.fixture
def good(rng):
    x = rng.standard_normal((4, D)).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    b = rng.standard_normal(D).astype(np.float32)
    return x, w, b


# Every public forward function, called as f(x, weight, bias, **kw) (RMSNorm has no bias).
FORWARDS = {
    "rms_norm": lambda x, w=None, b=None, **kw: resnorm.rms_norm(x, w, **kw),
    "rms_norm_forward": lambda x, w=None, b=None, **kw: resnorm.rms_norm_forward(x, w, **kw),
    "layer_norm": lambda x, w=None, b=None, **kw: resnorm.layer_norm(x, w, b, **kw),
    "layer_norm_forward": lambda x, w=None, b=None, **kw: resnorm.layer_norm_forward(x, w, b, **kw),
}
LAYER_NORMS = ["layer_norm", "layer_norm_forward"]
fwd = pytest.mark.parametrize("f", list(FORWARDS))


# --------------------------------------------------------------------------- x

# (float16 and bfloat16 are element types of the norms: tests/test_half.py)
BAD_X_DTYPES = [np.int64, np.int32, np.bool_, np.complex64, np.complex128, object]


@fwd
@pytest.mark.parametrize("dtype", BAD_X_DTYPES, ids=lambda t: np.dtype(t).name)
def test_x_bad_dtype_is_type_error(good, f, dtype):
    x = good[0].astype(dtype)
    with pytest.raises(TypeError, match=r"\bx\b"):
        FORWARDS[f](x)


@fwd
@pytest.mark.parametrize("bad", [[[1, 2], [3, 4]], [[1.0, 2.0], [3.0]], ["a", "b"], "abc",
                                 None, {"a": 1}],
                         ids=["int_list", "ragged_list", "str_list", "str", "None", "dict"])
def test_x_bad_array_like_is_type_error(f, bad):
    with pytest.raises(TypeError, match=r"\bx\b"):
        FORWARDS[f](bad)


@fwd
@pytest.mark.parametrize("dtype", ["f4", "f8"])
def test_x_non_native_byte_order_is_type_error(good, f, dtype):
    x = good[0].astype(">" + dtype if np.little_endian else "<" + dtype)
    assert not x.dtype.isnative
    with pytest.raises(TypeError, match=r"\bx\b"):
        FORWARDS[f](x)


@fwd
@pytest.mark.parametrize("shape", [(3, 0), (0,), (2, 3, 0)], ids=str)
def test_x_empty_last_axis_is_value_error(f, shape):
    with pytest.raises(ValueError, match=r"\bx\b"):
        FORWARDS[f](np.zeros(shape, np.float32))


@fwd
@pytest.mark.parametrize("x", [np.array(1.0), np.array(1.0, np.float32), np.float64(2.0), 3.0],
                         ids=["0d_f8", "0d_f4", "np_scalar", "py_float"])
def test_x_scalar_is_value_error(f, x):
    with pytest.raises(ValueError, match=r"\bx\b"):
        FORWARDS[f](x)


# --------------------------------------------------------------------------- weight / bias

def _bad_param_call(f, name, value, good):
    x, w, b = good
    if name == "weight":
        return FORWARDS[f](x, value, b)
    return FORWARDS[f](x, w, value)


PARAMS = [("rms_norm", "weight"), ("rms_norm_forward", "weight"), ("layer_norm", "weight"),
          ("layer_norm_forward", "weight"), ("layer_norm", "bias"), ("layer_norm_forward", "bias")]
param = pytest.mark.parametrize("f, name", PARAMS)


@param
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.bool_, np.complex64],
                         ids=lambda t: np.dtype(t).name)
def test_param_wrong_dtype_is_type_error(good, f, name, dtype):
    with pytest.raises(TypeError, match=name):
        _bad_param_call(f, name, np.ones(D, dtype), good)


@param
def test_param_non_native_byte_order_is_type_error(good, f, name):
    with pytest.raises(TypeError, match=name):
        _bad_param_call(f, name, np.ones(D, np.float32).astype(np.dtype("f4").newbyteorder()),
                        good)


@param
@pytest.mark.parametrize("shape", [(D + 1,), (D - 1,), (1, D), (D, 1), (), (4, D)], ids=str)
def test_param_wrong_shape_is_value_error(good, f, name, shape):
    with pytest.raises(ValueError, match=name):
        _bad_param_call(f, name, np.ones(shape, np.float32), good)


@param
def test_param_python_scalar_is_rejected(good, f, name):
    # a Python float is not a (D,) vector of x's dtype: either complaint is fine, but it
    # must name the argument
    with pytest.raises((TypeError, ValueError), match=name):
        _bad_param_call(f, name, 1.0, good)


# --------------------------------------------------------------------------- eps, n_threads

@fwd
@pytest.mark.parametrize("eps", [0, 0.0, -1, -1e-5, float("nan"), float("inf"), -float("inf"),
                                 np.float32(0)], ids=repr)
def test_eps_bad_value_is_value_error(good, f, eps):
    with pytest.raises(ValueError, match="eps"):
        FORWARDS[f](good[0], eps=eps)


@fwd
@pytest.mark.parametrize("eps", [True, False, "a", "1e-5", None, np.bool_(True), [1e-5], 1j],
                         ids=repr)
def test_eps_bad_type_is_type_error(good, f, eps):
    with pytest.raises(TypeError, match="eps"):
        FORWARDS[f](good[0], eps=eps)


@fwd
@pytest.mark.parametrize("nt", [0, -2, np.int64(0)], ids=repr)
def test_n_threads_bad_value_is_value_error(good, f, nt):
    with pytest.raises(ValueError, match="n_threads"):
        FORWARDS[f](good[0], n_threads=nt)


@fwd
@pytest.mark.parametrize("nt", [1.5, 2.0, True, False, "2", np.bool_(True)], ids=repr)
def test_n_threads_bad_type_is_type_error(good, f, nt):
    with pytest.raises(TypeError, match="n_threads"):
        FORWARDS[f](good[0], n_threads=nt)


@pytest.mark.parametrize("nt, exc", [(0, ValueError), (-2, ValueError), (1.5, TypeError),
                                     (True, TypeError), ("2", TypeError)], ids=repr)
def test_backward_n_threads_checked(good, nt, exc):
    x, w, b = good
    _, rc = resnorm.rms_norm_forward(x, w)
    _, lc = resnorm.layer_norm_forward(x, w, b)
    with pytest.raises(exc, match="n_threads"):
        resnorm.rms_norm_backward(np.ones_like(x), rc, n_threads=nt)
    with pytest.raises(exc, match="n_threads"):
        resnorm.layer_norm_backward(np.ones_like(x), lc, n_threads=nt)


# --------------------------------------------------------------------------- out

@fwd
def test_out_read_only_is_value_error(good, f):
    out = np.empty_like(good[0])
    out.setflags(write=False)
    with pytest.raises(ValueError, match="out"):
        FORWARDS[f](good[0], out=out)


@fwd
@pytest.mark.parametrize("shape", [(4, D + 1), (D, 4), (4 * D,), (1, 4, D)], ids=str)
def test_out_wrong_shape_is_value_error(good, f, shape):
    with pytest.raises(ValueError, match="out"):
        FORWARDS[f](good[0], out=np.empty(shape, np.float32))


@fwd
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32], ids=lambda t: np.dtype(t).name)
def test_out_wrong_dtype_is_type_error(good, f, dtype):
    with pytest.raises(TypeError, match="out"):
        FORWARDS[f](good[0], out=np.empty(good[0].shape, dtype))


@fwd
def test_out_not_an_ndarray_is_type_error(good, f):
    with pytest.raises(TypeError, match="out"):
        FORWARDS[f](good[0], out=np.empty_like(good[0]).tolist())


@fwd
def test_out_partially_overlapping_x_is_value_error(rng, f):
    buf = rng.standard_normal((4, D + 1)).astype(np.float32)
    buf0 = buf.copy()
    x, out = buf[:, :-1], buf[:, 1:]
    with pytest.raises(ValueError, match="out"):
        FORWARDS[f](x, out=out)
    assert np.array_equal(buf, buf0), "nothing may be written before the error"


@pytest.mark.parametrize("f, name", PARAMS)
def test_out_partially_overlapping_param_is_value_error(rng, f, name):
    buf = rng.standard_normal(2 * D).astype(np.float32)
    x = rng.standard_normal(D).astype(np.float32)
    p, out = buf[:D], buf[D // 2: D // 2 + D]
    w = p if name == "weight" else None
    b = p if name == "bias" else None
    with pytest.raises(ValueError, match="out"):
        FORWARDS[f](x, w, b, out=out)


@pytest.mark.parametrize("f", ["rms_norm_forward", "layer_norm_forward"])
def test_training_form_out_is_x_is_value_error(good, f):
    x = good[0].copy()
    x0 = x.copy()
    with pytest.raises(ValueError, match="out"):
        FORWARDS[f](x, out=x)
    assert np.array_equal(x, x0)
    xs = np.random.default_rng(1).standard_normal((4, 2 * D)).astype(np.float32)[:, ::2]
    with pytest.raises(ValueError, match="out"):
        FORWARDS[f](xs, out=xs)


# --------------------------------------------------------------------------- backward

def test_backward_wrong_cache_type_is_type_error(good):
    x, w, b = good
    _, rc = resnorm.rms_norm_forward(x, w)
    _, lc = resnorm.layer_norm_forward(x, w, b)
    dy = np.ones_like(x)
    for bad in (lc, None, (x, w), {"x": x}):
        with pytest.raises(TypeError, match="cache"):
            resnorm.rms_norm_backward(dy, bad)
    for bad in (rc, None, (x, w)):
        with pytest.raises(TypeError, match="cache"):
            resnorm.layer_norm_backward(dy, bad)


@pytest.mark.parametrize("shape", [(4, D + 1), (D, 4), (4 * D,), (1, 4, D), (3, D)], ids=str)
def test_backward_dy_wrong_shape_is_value_error(good, shape):
    x, w, b = good
    _, rc = resnorm.rms_norm_forward(x, w)
    _, lc = resnorm.layer_norm_forward(x, w, b)
    dy = np.ones(shape, np.float32)
    with pytest.raises(ValueError, match="dy"):
        resnorm.rms_norm_backward(dy, rc)
    with pytest.raises(ValueError, match="dy"):
        resnorm.layer_norm_backward(dy, lc)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.dtype(">f4")],
                         ids=lambda t: np.dtype(t).str)
def test_backward_dy_wrong_dtype_is_type_error(good, dtype):
    x, w, b = good
    _, rc = resnorm.rms_norm_forward(x, w)
    _, lc = resnorm.layer_norm_forward(x, w, b)
    dy = np.ones(x.shape, dtype)
    with pytest.raises(TypeError, match="dy"):
        resnorm.rms_norm_backward(dy, rc)
    with pytest.raises(TypeError, match="dy"):
        resnorm.layer_norm_backward(dy, lc)


def test_dtypes_are_spelled_one_way_in_messages():
    """Every message names a dtype as NumPy names it (float64), with the byte order when it
    is not the machine's, whichever argument it is about."""
    x = np.ones((2, 4), np.float32)
    swapped = np.ones(4, np.dtype(np.float32).newbyteorder())
    for call, got in [
            (lambda: resnorm.rms_norm(x.astype(np.int64)), "got int64"),
            (lambda: resnorm.rms_norm(x, np.ones(4)), "got float64"),
            (lambda: resnorm.rms_norm(x, out=np.ones((2, 4))), "got float64"),
            (lambda: resnorm.scaled_residual(x, x, np.ones(4)), "got float64"),
            (lambda: resnorm.rms_norm(x, swapped), "got float32, big-endian '>f4'")]:
        with pytest.raises(TypeError) as error:
            call()
        assert str(error.value).endswith(got), error.value
