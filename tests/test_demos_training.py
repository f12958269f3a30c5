"""The training demos (warmup, deepnorm) at their tiny size: the qualitative claim each one
reports, checked on its numbers; the character-level model's backward against finite
differences; the data split; the message when the bundled text is missing.

The PNG test needs the 'plot' (matplotlib) extra and skips without it, like tests/test_demos.py."""
import functools

import numpy as np
import pytest

from conftest import central_diff
from resnorm import demos
from resnorm.__main__ import main
from resnorm.demos import _charlm

MATTERS, STALLED = _charlm.MATTERS, _charlm.STALLED


@functools.lru_cache(maxsize=None)
def tiny(name):
    return demos.run(name, size="tiny", seed=0)


def _structure(res, name, n_tables):
    assert res.name == name and not res.missing, res.missing
    assert len(res.tables) == n_tables and res.findings
    for caption, table in res.tables:
        assert caption and table.startswith("| ") and "|---|" in table
    assert res.text().startswith(f"# {res.title}")


def test_warmup_post_ln_needs_warmup_and_pre_ln_does_not():
    res = tiny("warmup")
    _structure(res, "warmup", 2)
    runs, unigram, w = res.data["runs"], res.data["unigram"], res.data["warmup"]
    lr = max(res.data["lrs"])
    post = runs["post", lr, 0]["held_out"], runs["post", lr, w]["held_out"]
    pre = runs["pre", lr, 0]["held_out"], runs["pre", lr, w]["held_out"]
    assert not any(r["diverged"] for r in runs.values())
    assert post[0] - post[1] > MATTERS                    # warm-up rescues Post-LN
    assert abs(pre[0] - pre[1]) < MATTERS                 # Pre-LN does not need it
    assert pre[0] < post[0] - 3 * MATTERS                 # and trains without it
    assert _charlm.stalled(post[0], unigram) and not _charlm.stalled(post[1], unigram)
    assert "claim (Post-LN needs warm-up, Pre-LN does not) holds here" in res.findings[0]
    grads = res.data["grads"]
    assert grads["post"].shape == (res.data["layers"],) and np.all(grads["post"] > 0)
    # Xiong et al.: the last layer's W^2 gradient is larger in Post-LN than in Pre-LN
    assert grads["post"][-1] > grads["pre"][-1]


def test_deepnorm_trains_where_post_ln_stalls():
    res = tiny("deepnorm")
    _structure(res, "deepnorm", 1)
    depth = max(res.data["depths"])
    post, deep = res.data["runs"]["post", depth], res.data["runs"]["deepnorm", depth]
    unigram = res.data["unigram"]
    assert not post["diverged"] and not deep["diverged"]
    assert _charlm.stalled(post["held_out"], unigram)
    assert deep["held_out"] < unigram - 3 * STALLED
    assert deep["update"][1] < 0.5 * post["update"][1]    # DeepNorm's bounded early update
    assert "holds here; the failure is a stall" in res.findings[1]
    assert "2.213 / 0.319" in res.tables[0][1]           # (2N)^(1/4), (8N)^(-1/4), N = 12


@pytest.mark.parametrize("name", ["warmup", "deepnorm"])
def test_png(name, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / f"{name}.png"
    assert demos.save_png(tiny(name), path), "matplotlib is missing: pip install 'resnorm[plot]'"
    assert path.stat().st_size > 10_000


@pytest.mark.parametrize("name", ["warmup", "deepnorm"])
def test_says_when_the_text_is_missing(name, monkeypatch, tmp_path, capsys):
    def missing():
        raise ImportError("No module named 'pydoc_data'")
    monkeypatch.setattr(_charlm, "corpus", missing)
    res = demos.run(name, "tiny")
    assert "pydoc_data.topics" in res.missing and not res.tables
    assert main(["demo", name, "--size", "tiny", "--png", str(tmp_path / "x.png")]) == 1
    assert "NOT RUN" in capsys.readouterr().out


def test_corpus_split_and_unigram_level():
    train, held_out, vocab = _charlm.corpus()
    assert len(train) > 30 * len(held_out) > 0 and vocab > 50
    assert train.max() < vocab and held_out.max() < vocab
    # the unigram level is the entropy of the character frequencies: between 1 and log(vocab)
    assert 1.0 < _charlm.unigram_loss(train, held_out, vocab) < np.log(vocab)


def test_warmup_schedule():
    assert [_charlm.warmup_lr(s, 1.0, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1, 1, 1]
    assert _charlm.warmup_lr(0, 0.3, 0) == 0.3


def test_cross_entropy_and_model_backward_match_finite_differences():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 3, 5))
    targets = rng.integers(0, 5, (2, 3))
    loss, grad = _charlm.cross_entropy(logits, targets)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert loss == pytest.approx(-np.mean(np.log(np.take_along_axis(p, targets[..., None], -1))))
    np.testing.assert_allclose(
        grad, central_diff(lambda: _charlm.cross_entropy(logits, targets)[0], logits),
        rtol=1e-7, atol=1e-10)
    for block in ("post", "deepnorm"):
        model = _charlm.CharLM(7, 4, block, 2, 8, 2, seed=1, dtype=np.float64)
        tokens, nxt = rng.integers(0, 7, (2, 4)), rng.integers(0, 7, (2, 4))
        model.zero_grad()
        model.backward(_charlm.cross_entropy(model.forward(tokens), nxt)[1])
        loss = lambda: _charlm.cross_entropy(model.forward(tokens), nxt)[0]
        for name in ("embedding.weight", "head.weight", "stack.layers.0.linear1.weight"):
            np.testing.assert_allclose(model.grads()[name],
                                       central_diff(loss, model.params()[name]),
                                       rtol=1e-6, atol=1e-9, err_msg=name)


def test_training_is_seeded():
    train, _, vocab = _charlm.corpus()
    runs = [_charlm.train(_charlm.CharLM(vocab, 16, "pre", 1, 8, 2, seed=3), train, 5, 1e-2, 2,
                          4, 16, seed=4) for _ in range(2)]
    np.testing.assert_array_equal(runs[0], runs[1])
    other = _charlm.train(_charlm.CharLM(vocab, 16, "pre", 1, 8, 2, seed=3), train, 5, 1e-2, 2,
                          4, 16, seed=5)
    assert not np.array_equal(runs[0], other)
