"""The compiled layer kernels (resnorm._layers) against their float64 NumPy twins."""
import numpy as np
import pytest

from resnorm import _layers
from resnorm.nn import reference as ref
from resnorm.nn._blas import single_threaded_blas

DTYPES = [np.float32, np.float64]


@pytest.fixture(params=[True, False], ids=["parallel_gemm", "blas_threads"])
def parallel_gemm(request):
    """Both ways of running the matrix products; BLAS held at one thread for the first."""
    with single_threaded_blas() as possible:
        if request.param and not possible:
            pytest.skip("threadpoolctl cannot hold BLAS at one thread here")
        yield request.param
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def sum_tol(dtype, k):
    """Tolerance for sums of k products of O(1) terms: rounding grows with k."""
    eps = np.finfo(dtype).eps
    return dict(rtol=50 * eps, atol=4 * eps * max(k, 1))


def rand(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


# --------------------------------------------------------------------------- Linear

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, d_in, d_out", [(1, 1, 1), (7, 5, 3), (3, 16, 33), (0, 4, 2),
                                             (130, 9, 70), (600, 300, 700)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward_backward(dtype, n, d_in, d_out, bias, parallel_gemm):
    rng = np.random.default_rng(n + d_in)
    x, w = rand(rng, (n, d_in), dtype), rand(rng, (d_out, d_in), dtype)
    b = rand(rng, d_out, dtype) if bias else None
    y = np.empty((n, d_out), dtype)
    _layers.linear_forward(y, x, w, b, 2, parallel_gemm)
    np.testing.assert_allclose(y, ref.linear_forward(x, w, b), **sum_tol(dtype, d_in))

    dy = rand(rng, (n, d_out), dtype)
    dx = np.empty_like(x)
    dw0, db0 = rand(rng, w.shape, dtype), rand(rng, d_out, dtype)
    dw, db = dw0.copy(), (db0.copy() if bias else None)
    _layers.linear_backward(dx, dw, db, dy, x, w, 2, parallel_gemm)
    rdx, rdw, rdb = ref.linear_backward(dy, x, w)
    np.testing.assert_allclose(dx, rdx, **sum_tol(dtype, d_out))
    np.testing.assert_allclose(dw, dw0 + rdw, **sum_tol(dtype, n))   # gradients accumulate
    if bias:
        np.testing.assert_allclose(db, db0 + rdb, **sum_tol(dtype, n))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_bitwise_across_threads(dtype):
    """Tasks depend on the shapes only, and dbias sums rows in a fixed order."""
    rng = np.random.default_rng(3)
    x, w, b = rand(rng, (1000, 300), dtype), rand(rng, (600, 300), dtype), rand(rng, 600, dtype)
    dy = rand(rng, (1000, 600), dtype, scale=100.0)
    results = []
    with single_threaded_blas() as parallel_gemm:
        for t in (1, 2, 4):
            y, dx = np.empty((1000, 600), dtype), np.empty_like(x)
            dw, db = np.zeros_like(w), np.zeros_like(b)
            _layers.linear_forward(y, x, w, b, t, parallel_gemm)
            _layers.linear_backward(dx, dw, db, dy, x, w, t, parallel_gemm)
            results.append(b"".join(a.tobytes() for a in (y, dx, dw, db)))
    assert results[0] == results[1] == results[2]
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(axis=0), rtol=1e-6)


# --------------------------------------------------------------------------- GELU

@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_matches_reference(approximate, dtype):
    rng = np.random.default_rng(0)
    # a dense sweep including the tails, plus odd lengths around the chunk size
    x = np.concatenate([np.linspace(-30, 30, 60001), rng.standard_normal(4099) * 3,
                        [0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30]]).astype(dtype)
    a = approximate == "tanh"
    y = np.empty_like(x)
    _layers.gelu_forward(y, x, a, 2)
    dy = rand(rng, x.shape, dtype)
    dx = np.empty_like(x)
    _layers.gelu_backward(dx, dy, x, a, 2)
    ry, rdx = ref.gelu(x, approximate), ref.gelu_backward(dy, x, approximate)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(dx))
    if dtype == np.float64:
        # rtol 1e-12: in the far tail (x = -30) the rounding of x/sqrt(2) is amplified by
        # d log erfc(z) / dz = -2z (about 40 there)
        np.testing.assert_allclose(y, ry, rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(dx, rdx, rtol=1e-12, atol=1e-15)
    else:
        # absolute error at float32 resolution of values of order |x| + 1
        scale = np.abs(x.astype(np.float64)) + 1
        assert np.max(np.abs(y - ry) / scale) < 2e-7
        assert np.max(np.abs(dx - rdx) / (np.abs(dy) * scale + 1e-30)) < 5e-7
        # and relative accuracy wherever the output is not tiny (no tail cancellation)
        big = np.abs(ry) > 1e-6
        assert np.max(np.abs(y - ry)[big] / np.abs(ry[big])) < 1e-5


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_in_place_and_thread_counts(approximate):
    rng = np.random.default_rng(1)
    x = rand(rng, 10007, np.float32)
    dy = rand(rng, 10007, np.float32)
    outs = []
    for t in (1, 2, 4):
        y = np.empty_like(x)
        _layers.gelu_forward(y, x, approximate, t)
        dx = dy.copy()
        _layers.gelu_backward(dx, dx, x, approximate, t)   # in place over dy
        outs.append((y.tobytes(), dx.tobytes()))
    assert outs[0] == outs[1] == outs[2]
    expected = np.empty_like(x)
    _layers.gelu_backward(expected, dy, x, approximate, 1)
    assert expected.tobytes() == outs[0][1]


# --------------------------------------------------------------------------- softmax

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [1, 5, 64])
def test_softmax_forward_backward(dtype, causal, t):
    rng = np.random.default_rng(t)
    s = rand(rng, (3 * t, t), dtype, scale=5.0)
    p = np.empty_like(s)
    _layers.softmax_forward(p, s, 0.7, causal, 2)
    rp = ref.softmax(s.reshape(3, t, t), 0.7, causal).reshape(s.shape)
    np.testing.assert_allclose(p, rp, **TOL[dtype])
    dp = rand(rng, s.shape, dtype)
    ds = np.empty_like(s)
    _layers.softmax_backward(ds, dp, p, 0.7, causal, 2)
    np.testing.assert_allclose(ds, ref.softmax_backward(dp, rp, 0.7), **TOL[dtype])


def test_softmax_is_stable_for_huge_scores():
    s = np.array([[1e30, 1e30 - 1e24, -1e30], [-1e30, -1e30, -1e30]], dtype=np.float32)
    p = np.empty_like(s)
    _layers.softmax_forward(p, s, 1.0, False, 1)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-6)


# --------------------------------------------------------------------------- attention

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, t, d, h", [(1, 1, 4, 1), (2, 5, 6, 2), (3, 17, 12, 3),
                                         (2, 33, 16, 4)])
def test_attention_forward_backward(dtype, causal, b, t, d, h, parallel_gemm):
    rng = np.random.default_rng(b * t + d)
    qkv = rand(rng, (b, t, 3 * d), dtype)
    out = np.empty((b, t, d), dtype)
    att = np.empty((b, h, t, t), dtype)
    _layers.attention_forward(out, att, qkv, causal, 2, parallel_gemm)
    rout, ratt = ref.attention_forward(qkv, h, causal)
    np.testing.assert_allclose(att, ratt, **TOL[dtype])
    np.testing.assert_allclose(out, rout, **TOL[dtype])

    dout = rand(rng, out.shape, dtype)
    dqkv = np.empty_like(qkv)
    _layers.attention_backward(dqkv, np.empty_like(att), dout, qkv, att, causal, 2,
                               parallel_gemm)
    np.testing.assert_allclose(dqkv, ref.attention_backward(dout, qkv, ratt, h), **TOL[dtype])


def test_attention_bitwise_across_thread_counts():
    rng = np.random.default_rng(5)
    qkv = rand(rng, (2, 40, 48), np.float32)
    dout = rand(rng, (2, 40, 16), np.float32)
    results = []
    with single_threaded_blas() as parallel_gemm:
        for threads in (1, 2, 4):
            out = np.empty((2, 40, 16), np.float32)
            att = np.empty((2, 4, 40, 40), np.float32)
            _layers.attention_forward(out, att, qkv, True, threads, parallel_gemm)
            dqkv = np.empty_like(qkv)
            _layers.attention_backward(dqkv, np.empty_like(att), dout, qkv, att, True, threads,
                                       parallel_gemm)
            results.append(out.tobytes() + att.tobytes() + dqkv.tobytes())
    assert results[0] == results[1] == results[2]


def test_attention_gradient_by_finite_differences():
    """The reference attention backward itself, against central differences."""
    from conftest import central_diff
    rng = np.random.default_rng(9)
    qkv = rng.standard_normal((2, 4, 12))
    w = rng.standard_normal((2, 4, 4))
    out, att = ref.attention_forward(qkv, 2, True)
    dqkv = ref.attention_backward(w, qkv, att, 2)
    num = central_diff(lambda: float(np.sum(ref.attention_forward(qkv, 2, True)[0] * w)), qkv)
    np.testing.assert_allclose(dqkv, num, rtol=1e-6, atol=1e-9)


def test_blas_timer_counts_only_when_enabled():
    rng = np.random.default_rng(0)
    x, w = rand(rng, (64, 64), np.float64), rand(rng, (64, 64), np.float64)
    y = np.empty((64, 64))
    _layers.blas_seconds(reset=True)
    _layers.linear_forward(y, x, w, None, 1, False)
    assert _layers.blas_seconds() == 0.0
    _layers.blas_timer(True)
    try:
        _layers.linear_forward(y, x, w, None, 1, False)
    finally:
        _layers.blas_timer(False)
    assert _layers.blas_seconds(reset=True) > 0.0
    assert _layers.blas_seconds() == 0.0
