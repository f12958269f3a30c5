"""Pre-Norm / Post-Norm blocks and stacks: against the NumPy reference blocks, backward
against central finite differences for every option, modes and thread counts."""
import itertools

import numpy as np
import pytest

from nn_helpers import check_gradients, replay
from resnorm import nn
from resnorm.nn import reference as ref

BLOCKS = {"pre": (nn.PreNormBlock, ref.pre_norm_block),
          "post": (nn.PostNormBlock, ref.post_norm_block)}
OPTIONS = list(itertools.product(["pre", "post"], ["layer", "rms"],
                                 ["plain", "scaled", "gated", "none"]))


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def make_block(kind, norm, residual, dtype=np.float64, seed=0, **kw):
    """A small block whose every parameter matters (no zero biases, gates away from 0)."""
    cls = BLOCKS[kind][0]
    m = cls(8, 2, 12, norm=norm, residual=residual, alpha=0.8, gate=0.5, dtype=dtype,
            seed=seed, **kw)
    rng = np.random.default_rng(seed + 100)
    for name, p in m.params().items():
        if name.endswith("bias") or name.endswith("gate") or name.startswith("norm"):
            p += (0.2 * rng.standard_normal(p.shape)).astype(dtype)
    return m


@pytest.mark.parametrize("kind, norm, residual", OPTIONS)
@pytest.mark.parametrize("causal", [True, False])
def test_block_matches_reference(kind, norm, residual, causal):
    m = make_block(kind, norm, residual, causal=causal)
    x = rand((2, 5, 8), 1)
    expected = BLOCKS[kind][1](x, m.params(), 2, norm, residual, causal, "gelu", 1e-5)
    np.testing.assert_allclose(m.forward(x), expected, rtol=1e-11, atol=1e-12)

    m32 = make_block(kind, norm, residual, dtype=np.float32, causal=causal)
    y32 = m32.forward(x.astype(np.float32))
    expected32 = BLOCKS[kind][1](x, m32.params(), 2, norm, residual, causal, "gelu", 1e-5)
    np.testing.assert_allclose(y32, expected32, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind, norm, residual", OPTIONS)
def test_block_gradients(kind, norm, residual):
    m = make_block(kind, norm, residual)
    n = check_gradients(m, [rand((2, 3, 8), 2)])
    assert n == 2 * 3 * 8 + m.num_params()


@pytest.mark.parametrize("kind", ["pre", "post"])
def test_block_gradients_with_dropout_and_tanh_gelu(kind):
    m = make_block(kind, "rms", "scaled", dropout=0.3, activation="gelu_tanh", causal=False)
    check_gradients(m, [rand((2, 3, 8), 3)], before_forward=replay(m.res1.dropout,
                                                                    m.res2.dropout))


@pytest.mark.parametrize("block, final_norm", [("pre", None), ("post", None), ("post", True)])
def test_stack_gradients_and_reference(block, final_norm):
    m = nn.TransformerStack(2, 8, 2, 12, block=block, final_norm=final_norm, norm="layer",
                            dtype=np.float64, seed=4)
    rng = np.random.default_rng(5)
    for name, p in m.params().items():
        if name.endswith("bias"):
            p += 0.2 * rng.standard_normal(p.shape)
    x = rand((2, 3, 8), 6)
    params = m.params()
    y = x
    for i in range(2):
        layer = {k[len(f"layers.{i}."):]: v for k, v in params.items()
                 if k.startswith(f"layers.{i}.")}
        y = BLOCKS[block][1](y, layer, 2)
    if m.norm is not None:
        y = ref.norm(y, params, "norm")
    np.testing.assert_allclose(m.forward(x), y, rtol=1e-11, atol=1e-12)
    check_gradients(m, [x])


def test_stack_names_follow_torch_transformer_encoder():
    m = nn.TransformerStack(2, 8, 2, seed=0)
    names = list(m.params())
    assert names[:12] == [
        "layers.0.self_attn.in_proj_weight", "layers.0.self_attn.in_proj_bias",
        "layers.0.self_attn.out_proj.weight", "layers.0.self_attn.out_proj.bias",
        "layers.0.linear1.weight", "layers.0.linear1.bias", "layers.0.linear2.weight",
        "layers.0.linear2.bias", "layers.0.norm1.weight", "layers.0.norm1.bias",
        "layers.0.norm2.weight", "layers.0.norm2.bias"]
    assert names[-2:] == ["norm.weight", "norm.bias"] and len(names) == 26
    assert m.params()["layers.1.self_attn.in_proj_weight"].shape == (24, 8)
    assert m.params()["layers.1.linear1.weight"].shape == (32, 8)     # d_ff = 4 D
    assert "norm.weight" not in nn.TransformerStack(2, 8, 2, block="post").params()
    rms = nn.PreNormBlock(8, 2, norm="rms", residual="gated").params()
    assert "norm1.bias" not in rms and rms["res1.gate"].shape == (8,)
    assert nn.PreNormBlock(8, 2, residual="scaled").params()["res2.alpha"].shape == (1,)


def test_dropout_train_eval_in_a_block():
    m = nn.PreNormBlock(8, 2, dropout=0.5, seed=0)
    plain = nn.PreNormBlock(8, 2, dropout=0.0, seed=0)
    x = rand((2, 4, 8), 7).astype(np.float32)
    y1, y2 = m.forward(x), m.forward(x)
    assert not np.allclose(y1, y2)                       # masks differ between calls
    m.eval()
    np.testing.assert_array_equal(m.forward(x), m.forward(x))
    np.testing.assert_array_equal(m.forward(x), plain.forward(x))   # eval = no dropout


def test_block_is_bitwise_reproducible_across_thread_counts():
    """Matrix products run as fixed tasks on a single-threaded BLAS (resnorm.nn._blas), our
    own reductions in a fixed order: the same bits for 1, 2 and 4 threads."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    m = nn.PreNormBlock(32, 4, dropout=0.0, seed=1)
    x = rand((4, 64, 32), 8).astype(np.float32)
    dy = rand(x.shape, 9).astype(np.float32)
    results = []
    for threads in (1, 2, 4):
        with threadpoolctl.threadpool_limits(limits=threads):
            m.zero_grad()
            y = m.forward(x)
            dx = m.backward(dy)
            results.append([y.tobytes(), dx.tobytes()]
                           + [g.tobytes() for g in m.grads().values()])
    assert results[0] == results[1] == results[2]


def test_blas_thread_count_is_restored():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        m = nn.PreNormBlock(8, 2)
        y = m.forward(np.ones((2, 3, 8), np.float32))
        m.backward(np.ones_like(y))
        counts = [i["num_threads"] for i in threadpoolctl.threadpool_info()
                  if i["user_api"] == "blas"]
    assert counts and all(c == 2 for c in counts)


def test_block_input_checks():
    m = nn.PostNormBlock(8, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\) with D = 8"):
        m.forward(np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="last axis 8"):
        m.forward(np.zeros((2, 4, 6), np.float32))
    with pytest.raises(TypeError, match="dtype float32"):
        m.forward(np.zeros((2, 4, 8)))


def test_block_without_threadpoolctl_falls_back_to_blas_threads(monkeypatch):
    """No BLAS that we can hold at one thread: each product is one gemm call from one thread
    (parallel_gemm=False).  Same results up to rounding."""
    from resnorm.nn import _blas
    m = nn.PreNormBlock(32, 4, seed=2)
    x = rand((2, 300, 32), 10).astype(np.float32)
    y = m.forward(x)
    dx = m.backward(np.ones_like(y))
    grads = {k: g.copy() for k, g in m.grads().items()}
    monkeypatch.setattr(_blas, "_libraries", [])
    with _blas.single_threaded_blas() as parallel_gemm:
        assert parallel_gemm is False
    m.zero_grad()
    np.testing.assert_allclose(m.forward(x), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.backward(np.ones_like(y)), dx, rtol=1e-4, atol=1e-4)
    for k, g in m.grads().items():
        np.testing.assert_allclose(g, grads[k], rtol=1e-4, atol=1e-3, err_msg=k)
