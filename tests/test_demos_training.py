"""The training demos (warmup, deepnorm) at their tiny size: every arm's tuning and every
"holds in k of n seeds" verdict recomputed from the per-seed runs, and the qualitative
result the tiny model shows; the tuning and verdict helpers on made-up data; the
character-level model's backward against finite differences; the data split; the message
when the bundled text is missing.

The PNG test needs the 'plot' (matplotlib) extra and skips without it, like tests/test_demos.py."""
import functools
import re

import numpy as np
import pytest

from conftest import central_diff
from resnorm import demos
from resnorm.__main__ import main
from resnorm.demos import _charlm, deepnorm, warmup
from resnorm.demos._common import decimals, majority, seeds_verdict, spread_text

@functools.lru_cache(maxsize=None)
def tiny(name):
    return demos.run(name, size="tiny", seed=0)


def _structure(res, name, n_tables):
    assert res.name == name and not res.missing, res.missing
    assert len(res.tables) == n_tables and res.findings
    for caption, table in res.tables:
        assert caption and table.startswith("| ") and "|---|" in table
    assert res.text().startswith(f"# {res.title}")


def _verdict_count(findings, claim):
    """(k, n) of the finding 'claim: holds in k of n seeds'."""
    line = next(f for f in findings if f.startswith(claim + ": holds in "))
    k, n = re.match(r"(\d+) of (\d+) seeds", line[len(claim) + len(": holds in "):]).groups()
    return int(k), int(n)


def _check_tuning(res):
    """Every arm's best lr, recomputed from the raw runs: per seed the lr of the lowest
    held-out loss, and the number of lrs that neither diverged nor stalled."""
    runs, unigram = res.data["runs"], res.data["unigram"]
    for arm, grid in res.data["grids"].items():
        t = res.data["tuned"][arm]
        for k, s in enumerate(res.data["seeds"]):
            held = [runs[arm, lr, s]["held_out"] for lr in grid]
            assert t["best_loss"][k] == min(held) == held[t["best"][k]]
            assert t["n_stable"][k] == sum(not runs[arm, lr, s]["diverged"]
                                           and not _charlm.stalled(runs[arm, lr, s]["held_out"],
                                                                   unigram) for lr in grid)


def test_warmup_tunes_every_arm_and_counts_seeds():
    res = tiny("warmup")
    _structure(res, "warmup", 3)
    w, seeds = res.data["warmup"], res.data["seeds"]
    assert len(seeds) >= 3 and len(res.data["lrs"]) >= 4
    assert set(res.data["grids"]) == {("post", 0), ("post", w), ("pre", 0), ("pre", w)}
    _check_tuning(res)
    claims, noise = warmup.warmup_claims(res.data["tuned"], w)
    post0, postw = res.data["tuned"]["post", 0], res.data["tuned"]["post", w]
    np.testing.assert_array_equal(claims["post_wider"], postw["n_stable"] > post0["n_stable"])
    np.testing.assert_array_equal(claims["post_worse"],
                                  post0["best_loss"] - postw["best_loss"] > noise)
    for text, key in (("warm-up widens Post-LN's stable lr range", "post_wider"),
                      ("warm-up widens Pre-LN's stable lr range", "pre_wider")):
        claim = next(f for f in res.findings if f.startswith(text)).split(": holds in")[0]
        assert _verdict_count(res.findings, claim) == (claims[key].sum(), len(seeds))
    worse = (f"each at its best lr, Post-LN without warm-up ends worse than with it by more "
             f"than the seed spread ({noise:.2f})")
    assert _verdict_count(res.findings, worse) == (claims["post_worse"].sum(), len(seeds))
    # the tiny model shows the narrower stable range: without warm-up Pre-LN trains at more
    # of the grid than Post-LN, in every seed
    assert np.all(res.data["tuned"]["pre", 0]["n_stable"] > post0["n_stable"])
    grads = res.data["grads"]
    assert grads["post"].shape == (len(seeds), res.data["layers"]) and np.all(grads["post"] > 0)
    # Xiong et al.: the last layer's W^2 gradient is larger in Post-LN than in Pre-LN
    assert np.all(grads["post"][:, -1] > grads["pre"][:, -1])
    assert _verdict_count(res.findings, "in the last layer Post-LN's linear2.weight gradient "
                          "is larger than Pre-LN's") == (len(seeds), len(seeds))


def test_deepnorm_tunes_every_arm_and_counts_seeds():
    res = tiny("deepnorm")
    _structure(res, "deepnorm", 2)
    seeds, depths = res.data["seeds"], res.data["depths"]
    assert len(seeds) >= 3 and len(depths) == 2
    _check_tuning(res)
    for depth, blocks in depths.items():
        claims, noise = deepnorm.depth_claims(res.data["tuned"], res.data["updates"], depth,
                                              blocks)
        post, deep = res.data["tuned"]["post", depth], res.data["tuned"]["deepnorm", depth]
        np.testing.assert_array_equal(claims["post_fails"], post["n_stable"] == 0)
        below = f"at {depth} layers, each at its best lr, DeepNorm ends below plain Post-LN"
        assert _verdict_count(res.findings, below) == (
            np.sum(post["best_loss"] > deep["best_loss"]), len(seeds))
        better = f"{below} by more than the seed spread ({noise:.2f})"
        assert _verdict_count(res.findings, better) == (
            np.sum(post["best_loss"] - deep["best_loss"] > noise), len(seeds))
        assert noise == max(np.ptp(res.data["tuned"][b, depth]["best_loss"]) for b in blocks)
        narrower = f"at {depth} layers plain Post-LN trains at fewer grid lrs than DeepNorm"
        assert _verdict_count(res.findings, narrower) == (
            np.sum(post["n_stable"] < deep["n_stable"]), len(seeds))
    deepest = max(depths)
    updates = res.data["updates"]
    # the updates are those of the runs at the probe lr
    first = res.data["runs"][("post", deepest), res.data["probe_lr"], seeds[0]]["update"]
    np.testing.assert_array_equal(updates["post", deepest][0], first)
    # DeepNorm's bounded early update, in every seed, and tuned it ends below Post-LN
    assert np.all(updates["deepnorm", deepest][:, 1] < updates["post", deepest][:, 1])
    assert np.median(updates["deepnorm", deepest][:, 1] / updates["post", deepest][:, 1]) < 0.6
    assert np.all(res.data["tuned"]["deepnorm", deepest]["best_loss"]
                  < res.data["tuned"]["post", deepest]["best_loss"])
    assert "1.682 / 0.420" in res.tables[1][1]           # (2N)^(1/4), (8N)^(-1/4), N = 4


def _fake_runs(held, unigram=3.0):
    """runs of one arm 'a' over seeds 0, 1, ... and lrs 1, 2, ...: held[seed][lr] is the
    held-out loss, inf meaning diverged."""
    return {("a", lr + 1, s): {"held_out": v, "diverged": not np.isfinite(v)}
            for s, row in enumerate(held) for lr, v in enumerate(row)}


def test_tune_picks_each_seeds_argmin_and_marks_the_stability_edge():
    held = [[2.5, 2.4, 2.9, np.inf],     # 2.9 stalled (unigram 3.0): best 2.4, on the edge
            [2.5, 2.6, 2.45, 2.3],       # best at the top of the grid
            [2.6, 2.5, 2.55, 2.95]]      # best 2.5, and a larger lr still trained
    t = _charlm.tune(_fake_runs(held), "a", (1, 2, 3, 4), [0, 1, 2], unigram=3.0)
    np.testing.assert_array_equal(t["best"], [1, 3, 1])
    np.testing.assert_array_equal(t["best_loss"], [2.4, 2.3, 2.5])
    np.testing.assert_array_equal(t["n_stable"], [2, 4, 3])
    np.testing.assert_array_equal(t["edge"], [True, False, False])
    np.testing.assert_array_equal(t["top"], [False, True, False])
    lines = _charlm.edge_findings({"a": "arm A"}, {"a": (1, 2, 3, 4)}, {"a": t})
    assert lines[0].startswith("arm A: in 1 of 3 seeds the best lr is the largest grid lr")
    assert lines[1].startswith("arm A: in 1 of 3 seeds the best lr is the largest of the grid")


def test_verdict_counts_seeds_and_precision_follows_the_spread():
    assert seeds_verdict("it", [True, False, True, True]) == "it: holds in 3 of 4 seeds"
    assert seeds_verdict("it", np.array([0, 0])) == "it: holds in 0 of 2 seeds"
    assert majority([True, True, False]) and not majority([True, False])
    assert spread_text([2.55, 2.53, 2.58]) == "2.55 (2.53..2.58)"    # spread 0.05
    assert spread_text([2.5, 2.8, 2.6]) == "2.6 (2.5..2.8)"          # spread 0.3
    assert spread_text([2.5, np.inf, 2.6]) == "2.6 (2.5..inf)"
    assert spread_text([-0.001, -0.01, 0.01]) == "0.00 (-0.01..0.01)"   # no "-0.00"
    assert decimals([1.0, 1.0]) == 3 and decimals([1.0, 1.0004]) == 3


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
