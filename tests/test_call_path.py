"""The one compiled call path of the public functions (resnorm._api): arguments already in
their final form (exact C-contiguous ndarrays, a Python float eps, ...) and arguments that
must be converted or copied first lead to the same kernel call and bitwise the same
results; arguments that are wrong raise whichever form they come in; the thread and
streaming limits are read at call time."""
import numpy as np
import pytest

import resnorm
from resnorm import _parallel


def _inputs(dtype=np.float32, shape=(3, 40)):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(shape[-1]).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype)
    return x, w, b


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 4096), (3, 40), (2, 3, 7), (5,), (1, 1)])
def test_inference_and_training_forms_compute_the_same_bits(dtype, shape):
    x, w, b = _inputs(dtype, shape)
    assert _same(resnorm.rms_norm(x, w), resnorm.rms_norm_forward(x, w)[0])
    assert _same(resnorm.layer_norm(x, w, b), resnorm.layer_norm_forward(x, w, b)[0])
    assert _same(resnorm.layer_norm(x, None, b), resnorm.layer_norm_forward(x, None, b)[0])
    assert _same(resnorm.rms_norm(x), resnorm.rms_norm_forward(x)[0])


def _convertible_cases(dtype):
    """(name, arguments that need converting or copying, the same arguments in final form)."""
    x, w, b = _inputs(dtype)
    strided = np.zeros((3, 80), dtype)
    strided[:, ::2] = x
    return [
        ("list input", dict(x=x.tolist()), dict(x=np.asarray(x.tolist()))),
        ("strided input", dict(x=strided[:, ::2], w=w), dict(x=x, w=w)),
        ("fortran input", dict(x=np.asfortranarray(x), w=w), dict(x=x, w=w)),
        ("strided weight", dict(x=x, w=np.repeat(w, 2)[::2]), dict(x=x, w=w)),
        ("eps as numpy scalar", dict(x=x, eps=np.float64(1e-3)), dict(x=x, eps=1e-3)),
        ("eps as int", dict(x=x, eps=1), dict(x=x, eps=1.0)),
        ("n_threads as numpy int", dict(x=x, n_threads=np.int32(2)), dict(x=x, n_threads=2)),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_arguments_that_need_converting_give_the_same_bits(dtype):
    for name, given, final in _convertible_cases(dtype):
        for f in (resnorm.rms_norm, lambda x, w=None, **kw: resnorm.layer_norm(x, w, **kw)):
            kw_given = {k: v for k, v in given.items() if k not in ("x", "w")}
            kw_final = {k: v for k, v in final.items() if k not in ("x", "w")}
            got = f(given["x"], given.get("w"), **kw_given)
            want = f(final["x"], final.get("w"), **kw_final)
            assert _same(got, want), name


def test_out_written_directly_through_a_temporary_and_in_place_agree():
    x, w, b = _inputs()
    want = resnorm.layer_norm(x, w, b)
    out = np.empty_like(x)
    assert resnorm.layer_norm(x, w, b, out=out) is out and _same(out, want)
    strided = np.zeros((3, 80), np.float32)[:, ::2]
    assert resnorm.layer_norm(x, w, b, out=strided) is strided and _same(strided.copy(), want)
    assert resnorm.layer_norm(x, w, b, out=x) is x and _same(x, want)


@pytest.mark.parametrize("case", ["complex64", "big-endian", "masked", "0-d", "empty last axis"])
def test_wrong_inputs_raise_in_any_form(case):
    x, _, _ = _inputs()
    bad = {"complex64": x.astype(np.complex64), "big-endian": x.astype(">f4"),
           "masked": np.ma.masked_array(x), "0-d": np.float32(1.0),
           "empty last axis": np.zeros((3, 0), np.float32)}[case]
    for f in (resnorm.rms_norm, resnorm.layer_norm, resnorm.rms_norm_forward):
        with pytest.raises((TypeError, ValueError), match=r"\bx\b"):
            f(bad)


def test_wrong_scalars_and_buffers_raise():
    x, w, b = _inputs()
    shifted = np.zeros(3 * 40 + 1, np.float32)
    for kw, error in [(dict(eps=0.0), ValueError), (dict(eps=float("nan")), ValueError),
                      (dict(eps=1e-40), ValueError), (dict(n_threads=0), ValueError),
                      (dict(n_threads=True), TypeError), (dict(n_threads=-(2**70)), ValueError),
                      (dict(n_threads=2.0), TypeError),
                      (dict(out=np.empty((3, 41), np.float32)), ValueError),
                      (dict(out=np.empty(x.shape)), TypeError)]:
        with pytest.raises(error):
            resnorm.rms_norm(x, w, **kw)
    with pytest.raises(ValueError, match="out may overlap x"):
        resnorm.rms_norm(shifted[:-1].reshape(3, 40), out=shifted[1:].reshape(3, 40))
    want = resnorm.layer_norm(x[0], w.copy(), b)
    assert _same(resnorm.layer_norm(x[0], w, b, out=w), want)   # out may be exactly an input


def test_limits_are_read_at_call_time():
    """Changing resnorm._parallel's limits changes the next call's launch decision."""
    saved = _parallel.PARALLEL_MIN_ELEMENTS, _parallel.STREAM_MIN_BYTES
    try:
        _parallel.PARALLEL_MIN_ELEMENTS = 0
        assert _parallel.threads_for(2, 8) == 2
        _parallel.PARALLEL_MIN_ELEMENTS = 1 << 20
        assert _parallel.threads_for(2, 8) == 1
        _parallel.STREAM_MIN_BYTES = 0
        assert _parallel.streams(1)
        x, w, _ = _inputs(np.float32, (4, 8))
        want = resnorm.rms_norm(x, w, n_threads=1)
        _parallel.PARALLEL_MIN_ELEMENTS = 0
        assert _same(resnorm.rms_norm(x, w, n_threads=2), want)   # streamed, on 2 threads
    finally:
        _parallel.PARALLEL_MIN_ELEMENTS, _parallel.STREAM_MIN_BYTES = saved
    assert (_parallel.PARALLEL_MIN_ELEMENTS, _parallel.STREAM_MIN_BYTES) == saved


def test_outputs_just_past_an_input_modulo_4_kib_are_stored_plainly():
    """An output starting 1 to 127 bytes past an input (modulo 4 KiB) takes plain stores:
    streamed, its stores kept the input's next loads waiting (4K aliasing).  At or before
    the input, or further past it, it streams; the answer is the same either way."""
    saved = _parallel.STREAM_MIN_BYTES
    buf = np.zeros(3 * 4096, np.uint8)
    base = -buf.ctypes.data % 4096
    x = buf[base:base + 1024].view(np.float32)
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((4, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    want = resnorm.rms_norm(rows, w)
    space = np.zeros(rows.nbytes + 8192, np.uint8)
    try:
        _parallel.STREAM_MIN_BYTES = 0
        for gap in (0, 4, 16, 64, 124, 128, 1024, 4092, 4096, 4096 + 16):
            out = buf[base + gap:base + gap + 1024].view(np.float32)
            assert _parallel.streams_over(out, x) == (not 0 < gap % 4096 < 128), gap
            start = (rows.ctypes.data - space.ctypes.data + gap) % 4096
            out = space[start:start + rows.nbytes].view(np.float32).reshape(rows.shape)
            assert _same(resnorm.rms_norm(rows, w, out=out), want), gap
        _parallel.STREAM_MIN_BYTES = 1 << 62
        assert not _parallel.streams_over(out, x)
    finally:
        _parallel.STREAM_MIN_BYTES = saved


def test_a_scalar_alpha_gives_each_call_its_own_value():
    """A scalar alpha's (D,) vector is kept for later calls with the same value, D and
    dtype.  A call never gets another value's vector: not -0.0's for 0.0 (h = -0 + alpha*x
    keeps the sign of alpha*x), not another D's or dtype's, nor after many values."""
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        for d in (7, 40):
            x = np.abs(rng.standard_normal((2, d))).astype(dtype) + 1
            r = np.full((2, d), -0.0, dtype)
            for alpha in [-0.0, 0.0, -0.0, 0.5, *np.linspace(-3, 3, 40), 0.5, 0.0, -0.0]:
                h = resnorm.scaled_residual(r, x, alpha)
                want = r + dtype(alpha) * x
                assert _same(h, want), (dtype, d, alpha)
                y, h2 = resnorm.add_rms_norm(x, r, alpha=alpha)
                assert _same(h2, want), (dtype, d, alpha)
                assert _same(y, resnorm.rms_norm(want)), (dtype, d, alpha)


def test_a_learnable_scalar_alpha_gives_each_call_its_own_value():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 9)).astype(np.float32)
    r = rng.standard_normal((3, 9)).astype(np.float32)
    for value in (0.25, -2.0, 0.25):
        alpha = np.asarray(value, np.float32)
        h, cache = resnorm.scaled_residual_forward(r, x, alpha)
        assert _same(h, r + alpha * x)
        dx, dF, dalpha = resnorm.scaled_residual_backward(np.ones_like(x), cache)
        assert _same(dF, np.full_like(x, value))
