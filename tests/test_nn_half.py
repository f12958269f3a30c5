"""resnorm.nn's norms, dropout and residual connections in float16 and bfloat16: each module
gives the bits of resnorm's functions, accumulates its gradients in its dtype, trains and
saves; the layers with matmuls (Linear, attention, blocks) stay float32 / float64."""
import numpy as np
import pytest

import resnorm
from resnorm import nn
from resnorm.nn._residual import Residual

F16 = np.dtype(np.float16)
try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is an optional extra
    BF16 = None
HALVES = [F16, pytest.param(BF16, marks=pytest.mark.skipif(BF16 is None, reason="needs ml_dtypes"),
                            id="bfloat16")]


def bits(a):
    return np.asarray(a).view(np.uint16)


def data(rng, shape, dt):
    return rng.standard_normal(shape).astype(dt)


@pytest.mark.parametrize("dt", HALVES, ids=str)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
def test_norm_modules_give_the_functions_bits(rng, dt, layer):
    x, dy = data(rng, (5, 24), dt), data(rng, (5, 24), dt)
    norm = nn.LayerNorm(24, dtype=dt) if layer else nn.RMSNorm(24, dtype=dt)
    norm.weight[...] = data(rng, 24, dt)
    assert norm.weight.dtype == dt and norm.dweight.dtype == dt
    y = norm(x)
    dx = norm.backward(dy)
    if layer:
        want_y, cache = resnorm.layer_norm_forward(x, norm.weight, norm.bias)
        want_dx, want_dw, want_db = resnorm.layer_norm_backward(dy, cache)
        assert np.array_equal(bits(norm.dbias), bits(want_db))
    else:
        want_y, cache = resnorm.rms_norm_forward(x, norm.weight)
        want_dx, want_dw = resnorm.rms_norm_backward(dy, cache)
    assert y.dtype == dx.dtype == dt
    for got, want in ((y, want_y), (dx, want_dx), (norm.dweight, want_dw)):
        assert np.array_equal(bits(got), bits(want))
    norm(x)
    norm.backward(dy)   # gradients accumulate in the parameter's dtype, as torch's do
    assert np.array_equal(bits(norm.dweight), bits(want_dw + want_dw))


@pytest.mark.parametrize("dt", HALVES, ids=str)
def test_norm_module_trains_and_saves(rng, dt):
    norm = nn.RMSNorm(16, dtype=dt)
    opt = nn.SGD(norm, lr=0.1)
    x = data(rng, (8, 16), dt)
    before = norm.weight.copy()
    norm(x)
    norm.backward(data(rng, (8, 16), dt))
    opt.step()
    assert norm.weight.dtype == dt and not np.array_equal(bits(norm.weight), bits(before))
    other = nn.RMSNorm(16, dtype=dt)
    other.load_state_dict(norm.state_dict())
    assert np.array_equal(bits(other(x)), bits(norm(x)))
    with pytest.raises(TypeError, match="x must have the module's dtype"):
        norm(x.astype(np.float32))


@pytest.mark.parametrize("dt", HALVES, ids=str)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
def test_norm_modules_with_float32_parameters(rng, dt, layer):
    # param_dtype=float32 beside 16-bit rows (mixed precision): the functions' bits with
    # float32 parameters, float32 gradients accumulated and trained, saved and loaded
    make = nn.LayerNorm if layer else nn.RMSNorm
    norm = make(24, dtype=dt, param_dtype=np.float32)
    assert norm.weight.dtype == norm.dweight.dtype == np.float32
    norm.weight[...] = rng.standard_normal(24)
    x, dy = data(rng, (5, 24), dt), data(rng, (5, 24), dt)
    y = norm(x)
    dx = norm.backward(dy)
    if layer:
        assert norm.bias.dtype == norm.dbias.dtype == np.float32
        want_y, cache = resnorm.layer_norm_forward(x, norm.weight, norm.bias)
        want_dx, want_dw, want_db = resnorm.layer_norm_backward(dy, cache)
        assert np.array_equal(norm.dbias, want_db)
    else:
        want_y, cache = resnorm.rms_norm_forward(x, norm.weight)
        want_dx, want_dw = resnorm.rms_norm_backward(dy, cache)
    assert y.dtype == dx.dtype == dt
    assert np.array_equal(bits(y), bits(want_y)) and np.array_equal(bits(dx), bits(want_dx))
    assert np.array_equal(norm.dweight, want_dw)
    before = norm.weight.copy()
    nn.SGD(norm, lr=0.1).step()
    assert np.array_equal(norm.weight, before - np.float32(0.1) * want_dw)
    other = make(24, dtype=dt, param_dtype=np.float32)
    other.load_state_dict(norm.state_dict())
    assert np.array_equal(bits(other(x)), bits(norm(x)))
    assert make(24, dtype=dt, param_dtype=dt).weight.dtype == dt
    for bad in (np.float64, np.float16 if dt == BF16 else BF16):
        if bad is not None:
            with pytest.raises(TypeError, match="param_dtype must be the module's dtype"):
                make(24, dtype=dt, param_dtype=bad)
    with pytest.raises(TypeError, match="param_dtype must be the module's dtype"):
        make(24, param_dtype=np.float64)   # float32 rows: float32 parameters only


@pytest.mark.parametrize("dt", HALVES, ids=str)
@pytest.mark.parametrize("kind", ["plain", "scaled", "gated"])
def test_dropout_and_residual_modules(rng, dt, kind):
    x, f, dh = (data(rng, (6, 20), dt) for _ in range(3))
    res = Residual(kind, 20, gate=0.5, alpha=0.75, dtype=dt)
    h = res.forward(x, f)
    dx, df = res.backward(dh)
    assert h.dtype == dx.dtype == df.dtype == dt
    if kind == "gated":
        want, cache = resnorm.gated_residual_forward(x, f, res.gate)
        _, want_df, want_dg = resnorm.gated_residual_backward(dh, cache)
        assert np.array_equal(bits(res.dgate), bits(want_dg))
    else:
        want = resnorm.scaled_residual(x, f, res.alpha_arg())
        want_df = resnorm.scaled_residual_backward(
            dh, resnorm.scaled_residual_forward(x, f, res.alpha_arg())[1])[1]
    assert np.array_equal(bits(h), bits(want)) and np.array_equal(bits(df), bits(want_df))


@pytest.mark.parametrize("dt", HALVES, ids=str)
def test_dropout_module_keeps_16_bits(rng, dt):
    x = data(rng, (4, 1000), dt)
    drop = nn.Dropout(0.5, seed=1)
    y = drop(x)
    kept = y != 0
    assert y.dtype == dt and np.array_equal(bits(y[kept]), bits((x[kept] * 2).astype(dt)))
    dx = drop.backward(np.ones_like(x))
    assert dx.dtype == dt and np.array_equal(dx != 0, kept)


@pytest.mark.parametrize("make", [lambda dt: nn.Linear(4, 4, dtype=dt),
                                  lambda dt: nn.CausalSelfAttention(4, 2, dtype=dt),
                                  lambda dt: nn.PreNormBlock(4, 2, dtype=dt)],
                         ids=["Linear", "CausalSelfAttention", "PreNormBlock"])
def test_layers_with_matmuls_refuse_halves(make):
    with pytest.raises(TypeError, match="dtype must be float32 or float64, got float16"):
        make(np.float16)
