"""Scaled (fixed, learnable scalar, LayerScale) and gated residuals, forward and backward."""
import numpy as np
import pytest

import resnorm as rn
from resnorm import reference
from _residual_testing import (THREADED_SHAPE, THREADS, assert_grad, numeric_grad, read_only,
                               strided)

DTYPES = (np.float32, np.float64)


def make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype),
            rng.standard_normal(shape).astype(dtype))


def alpha_of(kind, d, dtype):
    return {"fixed": 0.3, "one": 1.0, "scalar": np.asarray(-1.5, dtype=dtype),
            "channel": np.linspace(-1, 2, d).astype(dtype)}[kind]


def tolerance(dtype):
    return (2e-6, 2e-6) if dtype == np.float32 else (1e-13, 1e-13)


# --------------------------------------------------------------------------- scaled residual

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["one", "fixed", "scalar", "channel"])
@pytest.mark.parametrize("shape", [(3, 7), (1,), (2, 3, 1), (40, 65)])
def test_scaled_matches_reference(dtype, kind, shape):
    x, F, dh = make(shape, dtype)
    alpha = alpha_of(kind, shape[-1], dtype)
    h, cache = rn.scaled_residual_forward(x, F, alpha)
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(h, reference.scaled_residual_forward(x, F, alpha), rtol=rtol,
                               atol=atol)
    assert h.dtype == dtype and h.shape == shape
    dx, dF, dalpha = rn.scaled_residual_backward(dh, cache)
    dx_ref, dF_ref, da_ref = reference.scaled_residual_backward(dh, F, alpha)
    assert np.array_equal(dx, dh) and not np.may_share_memory(dx, dh)
    np.testing.assert_allclose(dF, dF_ref, rtol=rtol, atol=atol)
    if kind in ("one", "fixed"):
        assert dalpha is None
    else:
        assert dalpha.shape == np.shape(alpha) and dalpha.dtype == dtype
        np.testing.assert_allclose(dalpha, da_ref, rtol=rtol * 10, atol=atol * 10 * x.size)


def test_plain_add_is_exact():
    x, F, _ = make((5, 9), np.float32)
    assert np.array_equal(rn.scaled_residual(x, F, 1.0), x + F)
    alpha = np.linspace(0.1, 0.9, 9).astype(np.float32)
    assert np.array_equal(rn.scaled_residual(x, F, alpha), x + alpha * F)


@pytest.mark.parametrize("kind", ["fixed", "scalar", "channel"])
def test_scaled_gradients_by_finite_differences(kind):
    x, F, dh = make((3, 5), np.float64, seed=1)
    args = {"x": x, "F": F, "alpha": alpha_of(kind, 5, np.float64)}
    fn = lambda x, F, alpha: (rn.scaled_residual(x, F, alpha),)  # noqa: E731
    _, cache = rn.scaled_residual_forward(**args)
    dx, dF, dalpha = rn.scaled_residual_backward(dh, cache)
    checks = {"x": dx, "F": dF}
    if kind != "fixed":
        checks["alpha"] = dalpha
    for name, analytic in checks.items():
        assert_grad(analytic, numeric_grad(fn, args, name, [dh]), name)


# --------------------------------------------------------------------------- gated residual

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 1), (40, 65), (9,)])
def test_gated_matches_reference(dtype, per_channel, shape):
    x, F, dh = make(shape, dtype)
    rng = np.random.default_rng(3)
    g = (3 * rng.standard_normal(shape[-1:] if per_channel else shape)).astype(dtype)
    h, cache = rn.gated_residual_forward(x, F, g)
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(h, reference.gated_residual_forward(x, F, g), rtol=rtol, atol=atol)
    dx, dF, dg = rn.gated_residual_backward(dh, cache)
    dx_ref, dF_ref, dg_ref = reference.gated_residual_backward(dh, F, g)
    assert np.array_equal(dx, dh)
    np.testing.assert_allclose(dF, dF_ref, rtol=rtol, atol=atol)
    assert dg.shape == g.shape and dg.dtype == dtype
    np.testing.assert_allclose(dg, dg_ref, rtol=rtol * 10, atol=atol * 10 * x.size)


def test_per_channel_gate_equals_the_broadcast_full_gate_bitwise():
    x, F, dh = make((6, 11), np.float32)
    g = np.linspace(-4, 4, 11).astype(np.float32)
    h1, c1 = rn.gated_residual_forward(x, F, g)
    h2, c2 = rn.gated_residual_forward(x, F, np.broadcast_to(g, x.shape).copy())
    assert np.array_equal(h1, h2)
    dx1, dF1, dg1 = rn.gated_residual_backward(dh, c1)
    dx2, dF2, dg2 = rn.gated_residual_backward(dh, c2)
    assert np.array_equal(dx1, dx2) and np.array_equal(dF1, dF2)
    np.testing.assert_allclose(dg1, dg2.sum(axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_misaligned_per_channel_gate_gives_the_aligned_bits(dtype):
    # a gate one byte off its alignment is copied before a kernel reads it (the
    # sanitizer build checks that no kernel ever loads it misaligned)
    x, F, dh = make((5, 9), dtype)
    g = np.linspace(-3, 3, 9).astype(dtype)
    raw = np.zeros(g.nbytes + 1, np.uint8)
    off = np.frombuffer(raw[1:], dtype)
    off[:] = g
    assert not off.flags.aligned
    h1, c1 = rn.gated_residual_forward(x, F, g)
    h2, c2 = rn.gated_residual_forward(x, F, off)
    assert np.array_equal(h1, h2)
    for a, b in zip(rn.gated_residual_backward(dh, c1), rn.gated_residual_backward(dh, c2)):
        assert np.array_equal(a, b)


def test_extreme_gate_logits_stay_finite_and_accurate():
    x = np.zeros((1, 6))
    F = np.ones((1, 6))
    g = np.array([[-800.0, -40.0, -1e-3, 0.0, 40.0, 800.0]])
    h, cache = rn.gated_residual_forward(x, F, g)
    assert np.all(np.isfinite(h))
    np.testing.assert_allclose(h, reference.sigmoid(g), rtol=1e-15, atol=0)
    _, _, dg = rn.gated_residual_backward(np.ones((1, 6)), cache)
    np.testing.assert_allclose(dg, reference.sigmoid_grad(g), rtol=1e-12, atol=0)
    # s(1-s) = e^-40 / (1 + e^-40)^2 survives at g = +-40: not 1 - s rounded to 0
    np.testing.assert_allclose(dg[0, [1, 4]], np.exp(-40.0), rtol=1e-15)


def _ulps_f32(got, want):
    """|got - want| in units of the last place of want rounded to float32 (the subnormal
    step below the normal range)."""
    step = np.maximum(np.spacing(np.abs(want.astype(np.float32))).astype(np.float64), 2.0**-149)
    return np.abs(got.astype(np.float64) - want) / step


def _sigmoid_f32(g):
    """(s, ds) of float32 logits, as the gated residual computes them (x = 0, F = dh = 1)."""
    g = np.asarray(g, np.float32).reshape(1, -1)
    one = np.ones_like(g)
    s, cache = rn.gated_residual_forward(np.zeros_like(g), one, g)
    return s.ravel(), rn.gated_residual_backward(one, cache)[2].ravel()


def test_float32_sigmoid_is_within_3_ulp_of_float64():
    """float32 s and ds come from resnorm's vectorised exp: s within 3 ulp of the float64
    sigmoid, ds = s(1-s) within 5 ulp, over every 4099th float32 in [-120, 120] (where both
    reach 0 or 1), and exactly 0 / 1 / 0 at the infinities."""
    top = np.float32(120).view(np.uint32)
    g = np.arange(0, top, 4099, dtype=np.uint32).view(np.float32)
    g = np.concatenate([g, -g, [np.inf, -np.inf]]).astype(np.float32)
    s, ds = _sigmoid_f32(g)
    assert np.max(_ulps_f32(s, reference.sigmoid(g))) <= 3
    assert np.max(_ulps_f32(ds, reference.sigmoid_grad(g))) <= 5
    assert s[-2] == 1 and s[-1] == 0 and ds[-2] == 0 and ds[-1] == 0


def test_float32_sigmoid_tail_reaches_the_subnormals():
    """Below g = -87 (exp(g) under the smallest normal float) s = e/(1+e) and ds go on
    through the subnormals to 0, as exp does; at g = +-17 (s rounds to 1) ds keeps its
    precision: e^-17, not 1 - s."""
    g = np.array([-87.0, -90.0, -95.0, -100.0, -103.0, -104.0, -110.0, -200.0, 17.0, -17.0])
    s, ds = _sigmoid_f32(g)
    want = reference.sigmoid(g.astype(np.float32))
    assert np.all(_ulps_f32(s, want) <= 3)
    assert s[3] > 0 and s[6] == 0 and s[7] == 0
    assert s[8] == 1 and abs(ds[8] / np.exp(-17.0) - 1) < 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_vector_and_scalar_code_give_the_same_bits(dtype):
    """Rows of one element run the kernels' scalar code, one long row their vector code: the
    same values give the same bits (extreme logits included)."""
    rng = np.random.default_rng(8)
    g = np.concatenate([rng.uniform(-120, 120, 3000), 4 * rng.standard_normal(3000),
                        [np.inf, -np.inf, 0.0, -0.0, -87.3, -110.0, 1e-40]]).astype(dtype)
    x, F, dh = (rng.standard_normal(g.size).astype(dtype) for _ in range(3))
    results = []
    for shape in ((1, -1), (-1, 1)):
        h, cache = rn.gated_residual_forward(x.reshape(shape), F.reshape(shape), g.reshape(shape))
        results.append([h, *rn.gated_residual_backward(dh.reshape(shape), cache)])
    for a, b in zip(*results):
        assert a.ravel().tobytes() == b.ravel().tobytes()


@pytest.mark.parametrize("per_channel", [False, True])
def test_gated_gradients_by_finite_differences(per_channel):
    x, F, dh = make((3, 5), np.float64, seed=2)
    g = np.random.default_rng(4).standard_normal(5 if per_channel else (3, 5))
    args = {"x": x, "F": F, "g": g}
    fn = lambda x, F, g: (rn.gated_residual(x, F, g),)  # noqa: E731
    _, cache = rn.gated_residual_forward(**args)
    for name, analytic in zip(("x", "F", "g"), rn.gated_residual_backward(dh, cache)):
        assert_grad(analytic, numeric_grad(fn, args, name, [dh]), name)


# --------------------------------------------------------------------------- threads, layouts

@pytest.mark.parametrize("dtype", DTYPES)
def test_bitwise_identical_across_thread_counts(dtype):
    x, F, dh = make(THREADED_SHAPE, dtype)
    alpha = alpha_of("channel", x.shape[-1], dtype)
    g_full = np.random.default_rng(5).standard_normal(x.shape).astype(dtype)
    results = []
    for t in THREADS:
        h, c = rn.scaled_residual_forward(x, F, alpha, n_threads=t)
        hg, cg = rn.gated_residual_forward(x, F, g_full, n_threads=t)
        hc, cc = rn.gated_residual_forward(x, F, alpha, n_threads=t)
        results.append([h, hg, hc, *rn.scaled_residual_backward(dh, c, n_threads=t),
                        *rn.gated_residual_backward(dh, cg, n_threads=t),
                        *rn.gated_residual_backward(dh, cc, n_threads=t)])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


def test_non_contiguous_and_read_only_inputs_unchanged():
    x, F, dh = make((8, 30), np.float64)
    alpha = alpha_of("channel", 30, np.float64)
    g = np.random.default_rng(6).standard_normal((8, 30))
    expected = (rn.scaled_residual(x, F, alpha), rn.gated_residual(x, F, g))
    for variant in (strided, read_only, np.asfortranarray):
        args = [variant(a) for a in (x, F, alpha, g)]
        before = [a.copy() for a in args]
        got = (rn.scaled_residual(*args[:3]), rn.gated_residual(args[0], args[1], args[3]))
        assert all(np.array_equal(a, b) for a, b in zip(got, expected))
        assert all(np.array_equal(a, b) for a, b in zip(args, before))


def test_out_buffers():
    x, F, _ = make((4, 8), np.float32)
    out = np.empty_like(x)
    assert rn.scaled_residual(x, F, 2.0, out=out) is out and np.array_equal(out, x + 2 * F)
    xx = x.copy()
    rn.gated_residual(xx, F, np.zeros(8, np.float32), out=xx)
    assert np.array_equal(xx, x + np.float32(0.5) * F)
    with pytest.raises(ValueError, match="out must not overlap F"):
        rn.scaled_residual_forward(x, F, np.ones(8, np.float32), out=F)
    with pytest.raises(ValueError, match="out must not overlap g"):
        g = np.zeros((4, 8), np.float32)
        rn.gated_residual_forward(x, F, g, out=g)


# --------------------------------------------------------------------------- bad input

def test_bad_input_names_the_argument():
    x, F, _ = make((4, 6), np.float32)
    with pytest.raises(ValueError, match="F"):
        rn.scaled_residual(x, F[:, :5], 1.0)
    with pytest.raises(TypeError, match="F"):
        rn.gated_residual(x, F.astype(np.float64), np.zeros(6, np.float32))
    with pytest.raises(ValueError, match="alpha"):
        rn.scaled_residual(x, F, np.ones(4, np.float32))
    with pytest.raises(TypeError, match="alpha"):
        rn.scaled_residual(x, F, None)
    with pytest.raises(ValueError, match="g"):
        rn.gated_residual(x, F, np.zeros((4, 1), np.float32))
    with pytest.raises(ValueError, match="g"):
        rn.gated_residual(x, F, np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="g"):
        rn.gated_residual(x, F, np.zeros(6, np.float64))
    _, cache = rn.scaled_residual_forward(x, F, np.asarray(1.0, np.float32))
    with pytest.raises(TypeError, match="ScaledResidualCache"):
        rn.gated_residual_backward(x, cache)
    with pytest.raises(ValueError, match="dh"):
        rn.scaled_residual_backward(x[:2], cache)
