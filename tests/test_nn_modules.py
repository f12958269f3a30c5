"""Each nn module: forward against the NumPy reference, backward against central finite
differences (float64, every input and parameter), float32 against float64, and the Module
API (names, grads, state_dict, modes)."""
import numpy as np
import pytest

from nn_helpers import check_gradients, replay
from resnorm import nn
from resnorm import reference as norm_ref
from resnorm.nn import reference as ref
from resnorm.nn._residual import Residual


def rand(shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5), (1, 5)])
def test_linear_gradients(bias, shape):
    m = nn.Linear(5, 3, bias, dtype=np.float64, seed=1)
    x = rand(shape)
    np.testing.assert_allclose(m.forward(x), ref.linear_forward(x, m.weight, m.bias),
                               rtol=1e-13)
    assert check_gradients(m, [x]) == x.size + 15 + (3 if bias else 0)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradients(approximate):
    m = nn.GELU(approximate)
    x = rand((3, 7)) * 2
    np.testing.assert_allclose(m.forward(x), ref.gelu(x, approximate), rtol=1e-13)
    check_gradients(m, [x])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_heads", [1, 2])
def test_attention_gradients(causal, n_heads):
    m = nn.CausalSelfAttention(4, n_heads, causal=causal, dtype=np.float64, seed=2)
    m.out_proj.bias[:] = rand(4, 7)           # torch starts these at 0: make them matter
    m.in_proj_bias[:] = rand(12, 8)
    x = rand((2, 3, 4))
    np.testing.assert_allclose(m.forward(x), ref.self_attention(x, m.params(), n_heads,
                                                                causal, prefix=""),
                               rtol=1e-12, atol=1e-14)
    check_gradients(m, [x])


def test_feedforward_gradients():
    for activation in ("gelu", "gelu_tanh"):
        m = nn.FeedForward(4, 6, activation=activation, dtype=np.float64, seed=3)
        x = rand((2, 3, 4))
        np.testing.assert_allclose(m.forward(x), ref.feed_forward(x, m.params(), activation),
                                   rtol=1e-12, atol=1e-14)
        check_gradients(m, [x])


@pytest.mark.parametrize("cls, kw", [(nn.RMSNorm, {}), (nn.LayerNorm, {}),
                                     (nn.LayerNorm, {"bias": False})])
def test_norm_gradients(cls, kw):
    m = cls(6, dtype=np.float64, **kw)
    for p in m.params().values():
        p += rand(p.shape, 4) * 0.3
    x = rand((2, 3, 6))
    if cls is nn.RMSNorm:
        expected = norm_ref.rms_norm_forward(x, m.weight, m.eps)[0]
    else:
        expected = norm_ref.layer_norm_forward(x, m.weight, m.bias, m.eps)[0]
    np.testing.assert_allclose(m.forward(x), expected, rtol=1e-12)
    check_gradients(m, [x])


@pytest.mark.parametrize("cls", [nn.RMSNorm, nn.LayerNorm])
def test_zero_centered_norm_gradients(cls):
    """zero_centered_weight: the weight starts at 0 (the identity gain 1 + 0), forward is
    the reference's with gain 1 + weight, and every gradient matches finite differences."""
    m = cls(6, zero_centered_weight=True, dtype=np.float64)
    assert np.array_equal(m.weight, np.zeros(6))
    x = rand((2, 3, 6))
    plain = cls(6, dtype=np.float64)
    np.testing.assert_array_equal(m.forward(x), plain.forward(x))
    for p in m.params().values():
        p += rand(p.shape, 4) * 0.3
    bias = getattr(m, "bias", None)
    if cls is nn.RMSNorm:
        expected = norm_ref.rms_norm_forward(x, m.weight, m.eps, zero_centered_weight=True)[0]
    else:
        expected = norm_ref.layer_norm_forward(x, m.weight, bias, m.eps,
                                               zero_centered_weight=True)[0]
    np.testing.assert_allclose(m.forward(x), expected, rtol=1e-12)
    check_gradients(m, [x])


def test_dropout_gradients_with_a_fixed_mask():
    m = nn.Dropout(0.4, seed=5)
    check_gradients(m, [rand((3, 8))], before_forward=replay(m))


@pytest.mark.parametrize("kind", ["plain", "scaled", "gated", "none"])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_residual_gradients(kind, p):
    m = Residual(kind, 5, p=p, alpha=0.7, gate=0.4, dtype=np.float64, seed=6)
    if kind == "gated":
        m.gate[:] = rand(5, 9)
    x, f = rand((2, 3, 5), 1), rand((2, 3, 5), 2)
    if p == 0.0:
        params = {f"res.{name}": v for name, v in m.params().items()}
        np.testing.assert_allclose(m.forward(x, f), ref.residual(x, f, params, "res", kind),
                                   rtol=1e-14)
    check_gradients(m, [x, f], before_forward=replay(m.dropout))


# --------------------------------------------------------------------------- dtypes, layouts

def test_float32_modules_follow_float64_ones():
    x = rand((2, 9, 8), 3)
    for build in (lambda dt: nn.Linear(8, 5, dtype=dt, seed=4),
                  lambda dt: nn.CausalSelfAttention(8, 2, dtype=dt, seed=4),
                  lambda dt: nn.FeedForward(8, 16, dtype=dt, seed=4)):
        m64, m32 = build(np.float64), build(np.float32)
        for name, p in m32.params().items():      # the same seed gives the same numbers
            np.testing.assert_array_equal(p, m64.params()[name].astype(np.float32))
        y64, y32 = m64.forward(x), m32.forward(x.astype(np.float32))
        assert y32.dtype == np.float32
        np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-5)
        dy = rand(y64.shape, 5)
        dx64, dx32 = m64.backward(dy), m32.backward(dy.astype(np.float32))
        np.testing.assert_allclose(dx32, dx64, rtol=1e-4, atol=1e-5)
        for name, g in m32.grads().items():
            np.testing.assert_allclose(g, m64.grads()[name], rtol=1e-4, atol=1e-4)


def test_read_only_and_non_contiguous_inputs():
    m = nn.CausalSelfAttention(4, 2, dtype=np.float64, seed=0)
    base = rand((2, 6, 8))
    x = base[:, ::2, ::2]                         # (2, 3, 4), strided
    x_ro = np.ascontiguousarray(x)
    x_ro.flags.writeable = False
    before = base.copy()
    y1 = m.forward(x)
    dx1 = m.backward(np.ones_like(y1))
    y2 = m.forward(x_ro)
    dx2 = m.backward(np.ones_like(y2))
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(dx1, dx2)
    np.testing.assert_array_equal(base, before)   # inputs never modified


def test_linear_zero_rows():
    m = nn.Linear(3, 2)
    y = m.forward(np.zeros((0, 3), np.float32))
    assert y.shape == (0, 2)
    assert m.backward(np.zeros((0, 2), np.float32)).shape == (0, 3)
    assert not m.grads()["weight"].any()


# --------------------------------------------------------------------------- dropout modes

def test_dropout_train_and_eval():
    x = np.ones((200, 500), np.float32)
    m = nn.Dropout(0.25, seed=0)
    y1, y2 = m.forward(x), m.forward(x)
    assert not np.array_equal(y1, y2)             # a fresh mask every call
    kept = np.count_nonzero(y1) / y1.size
    sigma = np.sqrt(0.75 * 0.25 / y1.size)
    assert abs(kept - 0.75) < 5 * sigma
    assert set(np.unique(y1)) == {0.0, np.float32(1 / 0.75)}
    assert abs(y1.mean() - 1.0) < 0.01            # inverted scaling keeps the mean
    assert np.array_equal(nn.Dropout(0.25, seed=0).forward(x), y1)   # seeded
    m.eval()
    assert m.forward(x) is x and m.backward(x) is x
    assert not nn.Dropout(1.0).forward(x).any()
    assert nn.Dropout(0.0).forward(x) is x


# --------------------------------------------------------------------------- Module API

def test_params_grads_and_state_dict():
    m = nn.FeedForward(4, 8, seed=0)
    assert list(m.params()) == ["linear1.weight", "linear1.bias", "linear2.weight",
                                "linear2.bias"]
    assert m.params()["linear1.weight"].shape == (8, 4)      # (out, in) as torch
    assert m.num_params() == 8 * 4 + 8 + 4 * 8 + 4
    x = rand((3, 4), dtype=np.float32)
    m.forward(x)
    m.backward(np.ones((3, 4), np.float32))
    g1 = {k: v.copy() for k, v in m.grads().items()}
    m.forward(x)
    m.backward(np.ones((3, 4), np.float32))
    for k, g in m.grads().items():                            # gradients accumulate
        np.testing.assert_allclose(g, 2 * g1[k], rtol=1e-6)
    m.zero_grad()
    assert not any(g.any() for g in m.grads().values())

    state = m.state_dict()
    state["linear1.weight"][:] = 0                            # a copy, not the parameters
    assert m.params()["linear1.weight"].any()
    w = m.params()["linear1.weight"]
    m.load_state_dict(state)
    assert m.params()["linear1.weight"] is w and not w.any()  # updated in place
    m.load_state_dict({k: v.astype(np.float64) for k, v in state.items()})  # casts

    other = nn.FeedForward(4, 8, seed=1)
    other.load_state_dict(nn.FeedForward(4, 8, seed=0).state_dict())
    y_other = other.forward(x)
    np.testing.assert_array_equal(y_other, nn.FeedForward(4, 8, seed=0).forward(x))


def test_load_state_dict_errors():
    m = nn.Linear(3, 2)
    state = m.state_dict()
    with pytest.raises(ValueError, match="missing"):
        m.load_state_dict({"weight": state["weight"]})
    with pytest.raises(ValueError, match="unexpected"):
        m.load_state_dict({**state, "extra": np.zeros(1)})
    assert m.load_state_dict({"weight": state["weight"]}, strict=False) == (["bias"], [])
    with pytest.raises(ValueError, match=r"state\['weight'\] must have shape \(2, 3\)"):
        m.load_state_dict({**state, "weight": np.zeros((3, 2))})
    with pytest.raises(TypeError, match="float32 or float64"):
        m.load_state_dict({**state, "weight": np.zeros((2, 3), int)})
    with pytest.raises(TypeError, match="dict"):
        m.load_state_dict([("weight", state["weight"])])


def test_seeded_initialisation():
    a = nn.CausalSelfAttention(8, 2, seed=7).state_dict()
    b = nn.CausalSelfAttention(8, 2, seed=7).state_dict()
    c = nn.CausalSelfAttention(8, 2, seed=8).state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["in_proj_weight"], c["in_proj_weight"])
    # torch's distributions: xavier bound for in_proj, zero biases
    assert np.abs(a["in_proj_weight"]).max() <= np.sqrt(6 / (8 + 24))
    assert not a["in_proj_bias"].any() and not a["out_proj.bias"].any()


def test_train_eval_propagates():
    m = nn.PreNormBlock(8, 2, dropout=0.1)
    assert all(c.training for c in [m, m.res1, m.res1.dropout, m.self_attn.out_proj])
    m.eval()
    assert not any(c.training for c in [m, m.res1, m.res1.dropout, m.self_attn.out_proj])
    assert m.train() is m and m.res2.dropout.training


# --------------------------------------------------------------------------- bad input

def test_bad_inputs_raise_clear_errors():
    lin = nn.Linear(4, 3)
    with pytest.raises(TypeError, match="x must have the module's dtype float32"):
        lin.forward(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="x must have last axis 4"):
        lin.forward(np.zeros((2, 5), np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        lin.forward(np.zeros((2, 4), int))
    with pytest.raises(RuntimeError, match="backward called without a forward"):
        nn.Linear(4, 3).backward(np.zeros((2, 3), np.float32))
    lin.forward(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 3\)"):
        lin.backward(np.zeros((3, 3), np.float32))
    lin.forward(np.zeros((2, 4), np.float32))
    lin.backward(np.zeros((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="or twice"):
        lin.backward(np.zeros((2, 3), np.float32))

    att = nn.CausalSelfAttention(8, 2)
    with pytest.raises(ValueError, match=r"shape \(B, T, D\)"):
        att.forward(np.zeros((3, 8), np.float32))
    with pytest.raises(ValueError, match="multiple of n_heads"):
        nn.CausalSelfAttention(10, 3)
    with pytest.raises(ValueError, match="n_heads must be an int >= 1"):
        nn.CausalSelfAttention(8, 0)
    with pytest.raises(TypeError, match="d_model must be an int"):
        nn.CausalSelfAttention(8.0, 2)
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        nn.Linear(2, 2, dtype=np.float16)
    with pytest.raises(TypeError, match="seed must be"):
        nn.Linear(2, 2, seed="x")
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        nn.Dropout(1.5)
    with pytest.raises(ValueError, match="approximate must be one of"):
        nn.GELU("erf")
    with pytest.raises(ValueError, match="activation must be one of"):
        nn.FeedForward(4, 8, activation="relu")
    with pytest.raises(ValueError, match="eps must be finite and > 0"):
        nn.RMSNorm(4, eps=0.0)
    with pytest.raises(ValueError, match="norm must be one of 'rms', 'layer'"):
        nn.PreNormBlock(8, 2, norm="batch")
    with pytest.raises(ValueError, match="residual must be one of"):
        nn.PostNormBlock(8, 2, residual="dense")
    with pytest.raises(ValueError, match="block must be one of"):
        nn.TransformerStack(2, 8, 2, block="middle")
    with pytest.raises(ValueError, match="alpha must be finite"):
        nn.PreNormBlock(8, 2, residual="scaled", alpha=float("nan"))


MODULES = {
    "Linear": lambda: nn.Linear(4, 3, dtype=np.float64, seed=1),
    "GELU": lambda: nn.GELU(),
    "Dropout": lambda: nn.Dropout(0.3, seed=2),
    "RMSNorm": lambda: nn.RMSNorm(4, dtype=np.float64),
    "LayerNorm": lambda: nn.LayerNorm(4, dtype=np.float64),
    "CausalSelfAttention": lambda: nn.CausalSelfAttention(4, 2, dtype=np.float64, seed=3),
    "FeedForward": lambda: nn.FeedForward(4, 6, dtype=np.float64, seed=4),
    **{f"{block.__name__}-{norm}-{residual}": (
        lambda block=block, norm=norm, residual=residual: block(
            4, 2, norm=norm, residual=residual, dropout=0.2, dtype=np.float64, seed=5))
       for block in (nn.PreNormBlock, nn.PostNormBlock)
       for norm in ("rms", "layer") for residual in ("plain", "scaled", "gated")},
    "DeepNormBlock": lambda: nn.DeepNormBlock(4, 2, n_layers=3, dropout=0.2,
                                              dtype=np.float64, seed=6),
    "ParallelBlock": lambda: nn.ParallelBlock(4, 2, dropout=0.2, dtype=np.float64, seed=7),
    "SandwichBlock": lambda: nn.SandwichBlock(4, 2, dropout=0.2, dtype=np.float64, seed=8),
    "TransformerStack": lambda: nn.TransformerStack(2, 4, 2, dropout=0.2, dtype=np.float64,
                                                    seed=9),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_refused_backward_keeps_the_forward_for_a_retry(name):
    """A backward refused for a bad dy leaves the module as it was: the retry with the
    right dy gives what a module that never saw the bad dy gives."""
    x = rand((2, 3, 4), seed=10)
    refused, fresh = MODULES[name](), MODULES[name]()
    y = refused.forward(x)
    fresh.forward(x)
    dy = rand(y.shape, seed=11)
    for bad in (rand(y.shape[:-1] + (y.shape[-1] + 1,), seed=12), dy.astype(np.float32)):
        with pytest.raises((ValueError, TypeError), match="dy"):
            refused.backward(bad)
    np.testing.assert_array_equal(refused.backward(dy), fresh.backward(dy))
    for (key, g), (_, g_fresh) in zip(refused.grads().items(), fresh.grads().items()):
        np.testing.assert_array_equal(g, g_fresh, err_msg=key)
    with pytest.raises(RuntimeError, match="or twice"):
        refused.backward(dy)
