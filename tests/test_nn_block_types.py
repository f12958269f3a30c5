"""Parallel-residual, DeepNorm and sandwich blocks (and stacks of them): against the NumPy
reference blocks in float64 and float32, backward against central finite differences for
every input and parameter, dropout, thread counts, DeepNorm's constants and initialisation."""
import itertools

import numpy as np
import pytest

from nn_helpers import check_gradients, replay
from resnorm import nn
from resnorm.nn import reference as ref

RESIDUALS = ["plain", "scaled", "gated", "none"]
# (name, constructor, reference) for every block type and variant; residual "any" blocks
# take the residual option, DeepNorm always adds plainly
TYPES = {
    "parallel-shared": (lambda **kw: nn.ParallelBlock(8, 2, 12, shared_norm=True, **kw),
                        lambda x, p, **kw: ref.parallel_block(x, p, 2, shared_norm=True, **kw)),
    "parallel-two": (lambda **kw: nn.ParallelBlock(8, 2, 12, shared_norm=False, **kw),
                     lambda x, p, **kw: ref.parallel_block(x, p, 2, shared_norm=False, **kw)),
    "sandwich": (lambda **kw: nn.SandwichBlock(8, 2, 12, **kw),
                 lambda x, p, **kw: ref.sandwich_block(x, p, 2, **kw)),
}
CASES = ([(t, n, r) for t, n, r in itertools.product(TYPES, ["layer", "rms"], RESIDUALS)]
         + [("deepnorm", n, "plain") for n in ["layer", "rms"]])


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def perturb(m, seed, dtype):
    """Makes every parameter matter: no zero biases, gates away from 0, norms not 1/0."""
    rng = np.random.default_rng(seed + 100)
    for name, p in m.params().items():
        if name.endswith(("bias", "gate")) or name.startswith("norm"):
            p += (0.2 * rng.standard_normal(p.shape)).astype(dtype)
    return m


def make(kind, norm, residual, dtype=np.float64, seed=0, **kw):
    if kind == "deepnorm":
        m = nn.DeepNormBlock(8, 2, 12, n_layers=6, norm=norm, dtype=dtype, seed=seed, **kw)
    else:
        m = TYPES[kind][0](norm=norm, residual=residual, alpha=0.8, gate=0.5, dtype=dtype,
                           seed=seed, **kw)
    return perturb(m, seed, dtype)


def reference(kind, m, x, norm, residual, causal=True):
    if kind == "deepnorm":
        return ref.deepnorm_block(x, m.params(), 2, m.alpha, norm, causal, "gelu", 1e-5)
    return TYPES[kind][1](x, m.params(), norm_kind=norm, residual_kind=residual,
                          causal=causal, activation="gelu", eps=1e-5)


@pytest.mark.parametrize("kind, norm, residual", CASES)
@pytest.mark.parametrize("causal", [True, False])
def test_block_matches_reference(kind, norm, residual, causal):
    x = rand((2, 5, 8), 1)
    m = make(kind, norm, residual, causal=causal)
    np.testing.assert_allclose(m.forward(x), reference(kind, m, x, norm, residual, causal),
                               rtol=1e-11, atol=1e-12)
    m32 = make(kind, norm, residual, dtype=np.float32, causal=causal)
    np.testing.assert_allclose(m32.forward(x.astype(np.float32)),
                               reference(kind, m32, x, norm, residual, causal),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind, norm, residual", CASES)
def test_block_gradients(kind, norm, residual):
    m = make(kind, norm, residual)
    assert check_gradients(m, [rand((2, 3, 8), 2)]) == 2 * 3 * 8 + m.num_params()


@pytest.mark.parametrize("kind", list(TYPES) + ["deepnorm"])
def test_block_gradients_with_dropout_and_tanh_gelu(kind):
    m = make(kind, "rms", "scaled", dropout=0.3, attn_dropout=0.2, activation="gelu_tanh",
             causal=False)
    check_gradients(m, [rand((2, 4, 8), 3)],
                    before_forward=replay(m.res1.dropout, m.res2.dropout,
                                          m.self_attn.attn_dropout))


@pytest.mark.parametrize("kind", list(TYPES) + ["deepnorm"])
def test_eval_is_no_dropout_and_training_masks_change(kind):
    m = make(kind, "layer", "plain", dtype=np.float32, dropout=0.4, attn_dropout=0.4)
    plain = make(kind, "layer", "plain", dtype=np.float32)
    x = rand((2, 6, 8), 4).astype(np.float32)
    assert not np.array_equal(m.forward(x), m.forward(x))
    m.eval()
    np.testing.assert_array_equal(m.forward(x), plain.forward(x))


@pytest.mark.parametrize("kind", list(TYPES) + ["deepnorm"])
def test_block_is_bitwise_reproducible_across_thread_counts(kind):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    x = rand((3, 40, 8), 5).astype(np.float32)
    results = []
    for threads in (1, 2, 4):
        m = make(kind, "layer", "gated" if kind != "deepnorm" else "plain", dtype=np.float32,
                 dropout=0.1, attn_dropout=0.1)
        with threadpoolctl.threadpool_limits(limits=threads):
            y = m.forward(x)
            dx = m.backward(np.cos(y))
        results.append([y.tobytes(), dx.tobytes()] + [g.tobytes() for g in m.grads().values()])
    assert results[0] == results[1] == results[2]


# --------------------------------------------------------------------------- stacks

@pytest.mark.parametrize("block, has_final", [("parallel", True), ("sandwich", True),
                                              ("deepnorm", False)])
def test_stack_gradients_and_reference(block, has_final):
    m = nn.TransformerStack(3, 8, 2, 12, block=block, norm="layer", dtype=np.float64, seed=4)
    perturb(m, 4, np.float64)
    assert (m.norm is not None) == has_final
    x = rand((2, 3, 8), 6)
    params = m.params()
    y = x
    for i, layer in enumerate(m.layers):
        p = {k[len(f"layers.{i}."):]: v for k, v in params.items()
             if k.startswith(f"layers.{i}.")}
        if block == "deepnorm":
            assert layer.alpha == pytest.approx(6 ** 0.25)       # (2N)^(1/4), N = 3
            y = ref.deepnorm_block(y, p, 2, layer.alpha)
        else:
            y = {"parallel": ref.parallel_block, "sandwich": ref.sandwich_block}[block](y, p, 2)
    if has_final:
        y = ref.norm(y, params, "norm")
    np.testing.assert_allclose(m.forward(x), y, rtol=1e-11, atol=1e-12)
    check_gradients(m, [x])


def test_parameter_names():
    shared = nn.ParallelBlock(8, 2).params()
    assert [n for n in shared if n.startswith("norm")] == ["norm1.weight", "norm1.bias"]
    two = nn.ParallelBlock(8, 2, shared_norm=False, residual="scaled").params()
    assert [n for n in two if n.startswith(("norm", "res"))] == [
        "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "res1.alpha", "res2.alpha"]
    # without a skip connection the branches are still summed: res2 has nothing to learn
    gated = nn.ParallelBlock(8, 2, residual="gated").params()
    assert "res2.gate" in gated and "res2.gate" not in nn.ParallelBlock(8, 2,
                                                                      residual="none").params()
    sandwich = list(nn.SandwichBlock(8, 2).params())
    assert sandwich[:8] == list(nn.PreNormBlock(8, 2).params())[:8]
    assert [n for n in sandwich if n.startswith("norm")] == [
        "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "norm1_out.weight",
        "norm1_out.bias", "norm2_out.weight", "norm2_out.bias"]
    assert list(nn.DeepNormBlock(8, 2, n_layers=4).params()) == list(
        nn.PostNormBlock(8, 2).params())
    assert list(nn.TransformerStack(2, 8, 2, block="parallel").params())[-2:] == [
        "norm.weight", "norm.bias"]


def test_same_seed_same_weights_with_and_without_attention_dropout():
    a = nn.PreNormBlock(8, 2, seed=3).state_dict()
    b = nn.PreNormBlock(8, 2, attn_dropout=0.3, seed=3).state_dict()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- DeepNorm

@pytest.mark.parametrize("n", [1, 6, 18, 100, 1000])
def test_deepnorm_constants_are_the_papers_encoder_only_formulas(n):
    alpha, beta = nn.deepnorm_constants(n)
    assert alpha == pytest.approx((2 * n) ** 0.25, rel=1e-15)
    assert beta == pytest.approx((8 * n) ** -0.25, rel=1e-15)
    assert alpha ** 4 == pytest.approx(2 * n) and beta ** -4 == pytest.approx(8 * n)


def test_deepnorm_initialisation():
    d, f, n = 64, 256, 50
    m = nn.DeepNormBlock(d, 4, f, n_layers=n, dtype=np.float64, seed=1)
    beta = (8 * n) ** -0.25
    w = m.self_attn.in_proj_weight
    expected = {"q": (w[:d], 1 / np.sqrt(d)), "k": (w[d:2 * d], 1 / np.sqrt(d)),
                "v": (w[2 * d:], beta / np.sqrt(d)),
                "out_proj": (m.self_attn.out_proj.weight, beta / np.sqrt(d)),
                "linear1": (m.ffn.linear1.weight, beta * np.sqrt(2 / (d + f))),
                "linear2": (m.ffn.linear2.weight, beta * np.sqrt(2 / (d + f)))}
    for name, (a, std) in expected.items():
        # Xavier-normal: mean 0, the std within 5 standard errors (std / sqrt(2 size))
        assert abs(a.mean()) < 5 * std / np.sqrt(a.size), name
        assert abs(a.std() / std - 1) < 5 / np.sqrt(2 * a.size), name
    for name, p in m.params().items():
        if name.endswith("bias") and not name.startswith("norm"):
            assert np.all(p == 0), name
    assert m.skip_scale == m.alpha == pytest.approx((2 * n) ** 0.25)
    custom = nn.DeepNormBlock(8, 2, n_layers=3, alpha=1.0, beta=1.0)
    assert (custom.alpha, custom.beta) == (1.0, 1.0)


def test_deepnorm_skip_scale_equals_the_scaled_sum_at_large_alpha():
    """Norm(alpha x + f) runs as Norm(x + f/alpha) with eps/alpha^2: the same function even
    where eps matters (rows of tiny variance)."""
    m = nn.DeepNormBlock(8, 2, n_layers=3, alpha=40.0, dtype=np.float64, seed=2)
    x = 1e-3 * rand((1, 4, 8), 3)
    np.testing.assert_allclose(m.forward(x), ref.deepnorm_block(x, m.params(), 2, 40.0),
                               rtol=1e-11, atol=1e-12)


def test_block_option_checks():
    with pytest.raises(TypeError, match="n_layers"):
        nn.DeepNormBlock(8, 2)
    with pytest.raises(ValueError, match="n_layers must be an int >= 1"):
        nn.DeepNormBlock(8, 2, n_layers=0)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        nn.DeepNormBlock(8, 2, n_layers=2, alpha=0.0)
    with pytest.raises(TypeError, match="residual"):
        nn.DeepNormBlock(8, 2, n_layers=2, residual="scaled")
    with pytest.raises(ValueError, match="residual must be one of"):
        nn.ParallelBlock(8, 2, residual="middle")
    with pytest.raises(ValueError, match="block must be one of"):
        nn.TransformerStack(2, 8, 2, block="middle")
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\) with D = 8"):
        nn.SandwichBlock(8, 2).forward(np.zeros((4, 8), np.float32))
    with pytest.raises(TypeError, match="dtype float32"):
        nn.ParallelBlock(8, 2).forward(np.zeros((2, 4, 8)))


@pytest.mark.parametrize("name", ["parallel", "deepnorm", "sandwich"])
def test_docstring_examples_run(name):
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(f"resnorm.nn.{name}"))
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("kind", list(TYPES) + ["deepnorm"])
def test_read_only_inputs_and_gradients_are_not_written(kind):
    m = make(kind, "layer", "gated" if kind != "deepnorm" else "plain", dtype=np.float32,
             dropout=0.2, attn_dropout=0.2)
    x = rand((2, 5, 8), 7).astype(np.float32)
    dy = rand((2, 5, 8), 8).astype(np.float32)
    x0, dy0 = x.copy(), dy.copy()
    x.setflags(write=False)
    dy.setflags(write=False)
    m.forward(x)
    m.backward(dy)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dy, dy0)
    # non-contiguous input: the same result as its contiguous copy
    m2 = make(kind, "layer", "plain", dtype=np.float32)
    wide = np.repeat(x0, 2, axis=2)[:, :, ::2]
    np.testing.assert_array_equal(m2.forward(wide), m2.forward(np.ascontiguousarray(wide)))


def test_shared_norm_must_be_a_bool():
    with pytest.raises(TypeError, match="shared_norm must be a bool"):
        nn.ParallelBlock(8, 2, shared_norm="yes")
