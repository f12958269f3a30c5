"""Causal attention that skips the masked half, and dropout on the attention probabilities:
kernels against the float64 reference for every row-block size, the mask against
resnorm.dropout's, thread counts, p = 0, and the module's gradients by finite differences."""
import numpy as np
import pytest

import resnorm
from nn_helpers import check_gradients, replay
from resnorm import _layers
from resnorm.inverted_dropout import dropout_spec
from resnorm.nn import reference as ref
from resnorm.nn._blas import single_threaded_blas
from resnorm import nn

TOL = {np.float32: dict(rtol=3e-5, atol=3e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def spec(p, seed):
    return dropout_spec(p, seed, True).kernel_arg()


def run(qkv, dout, h, causal, block, dropout=None, threads=2):
    """Kernel forward + backward: (out, att, dqkv)."""
    b, t, d3 = qkv.shape
    out = np.empty((b, t, d3 // 3), qkv.dtype)
    att = np.empty((b, h, t, t), qkv.dtype)
    dqkv = np.empty_like(qkv)
    with single_threaded_blas() as parallel_gemm:
        _layers.attention_forward(out, att, qkv, causal, threads, parallel_gemm, block, dropout)
        _layers.attention_backward(dqkv, np.empty_like(att), dout, qkv, att, causal, threads,
                                   parallel_gemm, block, dropout)
    return out, att, dqkv


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", [0, 1, 5, 32, 1000])
@pytest.mark.parametrize("b, t, d, h", [(1, 1, 4, 1), (2, 17, 12, 3), (2, 70, 16, 2)])
def test_row_blocks_match_reference(dtype, causal, block, b, t, d, h):
    rng = np.random.default_rng(t + block)
    qkv, dout = rand(rng, (b, t, 3 * d), dtype), rand(rng, (b, t, d), dtype)
    out, att, dqkv = run(qkv, dout, h, causal, block)
    rout, ratt = ref.attention_forward(qkv, h, causal)
    np.testing.assert_allclose(att, ratt, **TOL[dtype])
    np.testing.assert_allclose(out, rout, **TOL[dtype])
    np.testing.assert_allclose(dqkv, ref.attention_backward(dout, qkv, ratt, h), **TOL[dtype])
    if causal:
        assert np.all(att[..., np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", [0, 7, 32])
@pytest.mark.parametrize("p", [0.1, 0.5, 1.0])
def test_dropout_matches_reference(dtype, causal, block, p):
    rng = np.random.default_rng(11)
    b, t, d, h, seed = 2, 45, 12, 3, 2**40 + 12345
    qkv, dout = rand(rng, (b, t, 3 * d), dtype), rand(rng, (b, t, d), dtype)
    out, att, dqkv = run(qkv, dout, h, causal, block, spec(p, seed))
    rout, ratt = ref.attention_forward(qkv, h, causal, p, seed)
    np.testing.assert_allclose(att, ratt, **TOL[dtype])             # P, before dropout
    np.testing.assert_allclose(out, rout, **TOL[dtype])
    np.testing.assert_allclose(dqkv, ref.attention_backward(dout, qkv, ratt, h, p, seed),
                               **TOL[dtype])
    plain, _, _ = run(qkv, dout, h, causal, block)
    assert not np.allclose(out, plain)                              # dropout did something


def test_mask_is_resnorm_dropout_mask_of_the_probabilities():
    """With v = the identity, each head's output row is its dropped probability row: the
    kept entries are exactly those of resnorm.dropout_forward's mask for (B, H, T, T)."""
    b, t, h, p, seed = 2, 8, 2, 0.3, 99
    d = h * t
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((b, t, 3 * d))
    for head in range(h):
        qkv[:, :, 2 * d + head * t:2 * d + (head + 1) * t] = np.eye(t)
    out, att, _ = run(qkv, np.zeros((b, t, d)), h, False, 0, spec(p, seed))
    dropped = out.reshape(b, t, h, t).transpose(0, 2, 1, 3)
    _, cache = resnorm.dropout_forward(np.ones(att.shape), p, seed=seed, return_mask=True)
    assert np.all(att > 0)
    np.testing.assert_array_equal(dropped != 0, cache.mask)
    np.testing.assert_allclose(dropped[cache.mask], att[cache.mask] / (1 - p), rtol=1e-14)


@pytest.mark.parametrize("causal", [True, False])
def test_dropout_bitwise_across_thread_counts(causal):
    rng = np.random.default_rng(3)
    qkv, dout = rand(rng, (3, 40, 48), np.float32), rand(rng, (3, 40, 16), np.float32)
    results = {threads: b"".join(a.tobytes() for a in run(qkv, dout, 4, causal, 32,
                                                           spec(0.2, 7), threads))
               for threads in (1, 2, 4)}
    assert results[1] == results[2] == results[4]


def test_p0_and_no_dropout_are_identical():
    rng = np.random.default_rng(4)
    qkv, dout = rand(rng, (2, 33, 24), np.float32), rand(rng, (2, 33, 8), np.float32)
    expected = [a.tobytes() for a in run(qkv, dout, 2, True, 32)]
    for arg in (spec(0.0, 5), dropout_spec(0.3, 5, False).kernel_arg()):
        assert [a.tobytes() for a in run(qkv, dout, 2, True, 32, arg)] == expected


# --------------------------------------------------------------------------- the module

def attention(dropout, causal=True, seed=2, dtype=np.float64):
    m = nn.CausalSelfAttention(8, 2, causal=causal, dropout=dropout, dtype=dtype, seed=seed)
    rng = np.random.default_rng(seed + 1)
    m.out_proj.bias[:] = rng.standard_normal(8)      # torch starts these at 0: make them matter
    m.in_proj_bias[:] = rng.standard_normal(24)
    return m


@pytest.mark.parametrize("causal", [True, False])
def test_module_dropout_gradients(causal):
    m = attention(0.3, causal)
    x = np.random.default_rng(5).standard_normal((2, 5, 8))
    n = check_gradients(m, [x], before_forward=replay(m.attn_dropout))
    assert n == x.size + m.num_params()


def test_module_dropout_matches_reference_with_its_seed():
    m = attention(0.25)
    x = np.random.default_rng(6).standard_normal((2, 37, 8))
    state = m.attn_dropout._rng.bit_generator.state
    seed = m.attn_dropout.next_seed()                # the seed the next forward draws
    m.attn_dropout._rng.bit_generator.state = state
    y = m.forward(x)
    qkv = ref.linear_forward(x, m.in_proj_weight, m.in_proj_bias)
    heads, _ = ref.attention_forward(qkv, 2, True, 0.25, seed)
    np.testing.assert_allclose(y, ref.linear_forward(heads, m.out_proj.weight, m.out_proj.bias),
                               rtol=1e-12, atol=1e-12)


def test_module_masks_change_per_call_and_eval_and_p0_are_plain():
    m, plain = attention(0.5, dtype=np.float32), attention(0.0, dtype=np.float32)
    assert all(np.array_equal(v, plain.params()[k]) for k, v in m.params().items())
    x = np.random.default_rng(7).standard_normal((2, 9, 8)).astype(np.float32)
    assert not np.array_equal(m.forward(x), m.forward(x))
    m.eval()
    np.testing.assert_array_equal(m.forward(x), plain.forward(x))
    m.train()
    dy = np.ones((2, 9, 8), np.float32)
    m.forward(x)
    plain.forward(x)
    assert not np.array_equal(m.backward(dy), plain.backward(dy))


def test_module_bitwise_across_thread_counts_with_dropout():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    x = np.random.default_rng(8).standard_normal((3, 50, 8)).astype(np.float32)
    results = []
    for threads in (1, 2, 4):
        m = attention(0.2, dtype=np.float32)
        with threadpoolctl.threadpool_limits(limits=threads):
            y = m.forward(x)
            dx = m.backward(np.cos(y))
        results.append([y.tobytes(), dx.tobytes()] + [g.tobytes() for g in m.grads().values()])
    assert results[0] == results[1] == results[2]


def test_full_scores_and_skipped_half_agree():
    """causal_block = 0 computes the full products (the benchmark's comparison)."""
    x = np.random.default_rng(9).standard_normal((2, 100, 8))
    m, full = attention(0.0), attention(0.0)
    full.causal_block = 0
    dy = np.sin(np.arange(x.size)).reshape(x.shape)
    np.testing.assert_allclose(m.forward(x), full.forward(x), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(m.backward(dy), full.backward(dy), rtol=1e-12, atol=1e-12)
    for k, g in m.grads().items():
        np.testing.assert_allclose(g, full.grads()[k], rtol=1e-12, atol=1e-12, err_msg=k)


def test_module_dropout_checks():
    with pytest.raises(ValueError, match="dropout must be"):
        nn.CausalSelfAttention(8, 2, dropout=1.5)
    with pytest.raises(TypeError, match="dropout must be"):
        nn.CausalSelfAttention(8, 2, dropout="0.1")
    with pytest.raises(ValueError, match="attn_dropout must be"):
        nn.PreNormBlock(8, 2, attn_dropout=-0.1)
