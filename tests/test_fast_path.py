"""The compiled fast paths of the inference forms (resnorm._norms.rms_norm_ready /
layer_norm_ready): they run only when every argument is already final, return None for
anything else (so the full checks run and raise), and compute exactly what the checked
path computes."""
import numpy as np
import pytest

import resnorm
from resnorm import _norms
from resnorm.norms import _fast_limits


def _inputs(dtype=np.float32, shape=(3, 40)):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(shape[-1]).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype)
    return x, w, b


def rms_ready(x, w=None, eps=1e-6, out=None, n_threads=None):
    return _norms.rms_norm_ready(x, w, eps, out, n_threads, _fast_limits())


def layer_ready(x, w=None, b=None, eps=1e-5, out=None, n_threads=None):
    return _norms.layer_norm_ready(x, w, b, eps, out, n_threads, _fast_limits())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 4096), (3, 40), (2, 3, 7), (5,), (1, 1)])
def test_fast_path_equals_checked_path_bitwise(dtype, shape):
    x, w, b = _inputs(dtype, shape)
    y_fast = rms_ready(x, w)
    y_checked, _ = resnorm.rms_norm_forward(x, w)        # the training form never takes it
    assert y_fast is not None and np.array_equal(y_fast, y_checked)
    z_fast = layer_ready(x, w, b)
    z_checked, _ = resnorm.layer_norm_forward(x, w, b)
    assert z_fast is not None and np.array_equal(z_fast, z_checked)
    assert np.array_equal(layer_ready(x, None, b), resnorm.layer_norm_forward(x, None, b)[0])
    assert np.array_equal(rms_ready(x), resnorm.rms_norm_forward(x)[0])


def test_fast_path_writes_out_and_in_place():
    x, w, b = _inputs()
    out = np.empty_like(x)
    assert rms_ready(x, w, out=out) is out
    assert np.array_equal(out, resnorm.rms_norm_forward(x, w)[0])
    want = resnorm.layer_norm_forward(x, w, b)[0]
    assert layer_ready(x, w, b, out=x) is x          # in place
    assert np.array_equal(x, want)


def test_fast_path_large_input_threads_and_streaming():
    x, w, b = _inputs(np.float32, (1100, 2048))      # above the parallel and streaming limits
    for nt in (1, 2, 4, None):
        assert np.array_equal(rms_ready(x, w, n_threads=nt), resnorm.rms_norm_forward(x, w)[0])
        assert np.array_equal(layer_ready(x, w, b, n_threads=nt),
                              resnorm.layer_norm_forward(x, w, b)[0])


def _not_ready_cases():
    x, w, b = _inputs()
    shifted = np.zeros(3 * 40 + 1, np.float32)    # two views of it overlap by all but one
    return {
        "list input": dict(x=x.tolist()),
        "float16 input": dict(x=x.astype(np.float16)),
        "int input": dict(x=x.astype(np.int64)),
        "big-endian input": dict(x=x.astype(">f4")),
        "strided input": dict(x=np.zeros((3, 80), np.float32)[:, ::2]),
        "masked input": dict(x=np.ma.masked_array(x)),
        "0-d input": dict(x=np.float32(1.0)),
        "empty input": dict(x=np.zeros((0, 40), np.float32)),
        "empty last axis": dict(x=np.zeros((3, 0), np.float32)),
        "weight of other dtype": dict(x=x, w=w.astype(np.float64)),
        "weight of wrong length": dict(x=x, w=np.ones(41, np.float32)),
        "weight as list": dict(x=x, w=w.tolist()),
        "2-d weight": dict(x=x, w=w[None, :]),
        "eps numpy scalar": dict(x=x, eps=np.float64(1e-6)),
        "eps int": dict(x=x, eps=1),
        "eps zero": dict(x=x, eps=0.0),
        "eps nan": dict(x=x, eps=float("nan")),
        "eps below float32 tiny": dict(x=x, eps=1e-40),
        "n_threads zero": dict(x=x, n_threads=0),
        "n_threads bool": dict(x=x, n_threads=True),
        "n_threads too many": dict(x=x, n_threads=10**6),
        "n_threads beyond C long": dict(x=x, n_threads=-(2**70)),
        "n_threads float": dict(x=x, n_threads=2.0),
        "read-only out": dict(x=x, out=np.frombuffer(bytes(x.nbytes), np.float32).reshape(x.shape)),
        "out of wrong shape": dict(x=x, out=np.empty((3, 41), np.float32)),
        "out of wrong dtype": dict(x=x, out=np.empty(x.shape)),
        "strided out": dict(x=x, out=np.empty((3, 80), np.float32)[:, ::2]),
        "out overlapping x": dict(x=shifted[:-1].reshape(3, 40), out=shifted[1:].reshape(3, 40)),
        "out is the weight": dict(x=x[0], w=w, out=w),
    }


@pytest.mark.parametrize("case", sorted(_not_ready_cases()))
def test_fast_path_declines_anything_not_final(case):
    kw = _not_ready_cases()[case]
    assert rms_ready(**kw) is None
    assert layer_ready(**kw) is None


def test_fast_path_declines_bias_problems_and_out_on_bias():
    x, w, b = _inputs()
    assert layer_ready(x, w, b.astype(np.float64)) is None
    assert layer_ready(x, w, np.ones(41, np.float32)) is None
    assert layer_ready(x[0], w, b, out=b) is None


def test_declined_calls_still_raise_through_the_checked_path():
    x, w, _ = _inputs()
    with pytest.raises(TypeError, match="weight"):
        resnorm.rms_norm(x, w.astype(np.float64))
    with pytest.raises(ValueError, match="eps"):
        resnorm.layer_norm(x, eps=0.0)
    with pytest.raises(ValueError, match="n_threads"):
        resnorm.rms_norm(x, n_threads=0)


def test_fast_path_follows_the_parallel_limits_at_call_time(monkeypatch):
    """Tests (and users) that change resnorm._parallel's limits change the fast path too."""
    from resnorm import _parallel
    x, w, _ = _inputs(np.float32, (4, 8))
    seen = []
    real = _norms.rms_norm_ready
    monkeypatch.setattr(_norms, "rms_norm_ready", lambda *a: seen.append(a[-1]) or real(*a))
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_ELEMENTS", 0)
    resnorm.rms_norm(x, w)
    assert seen and seen[-1][0] == 0
