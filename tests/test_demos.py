"""Every demo at its tiny size: output structure and the qualitative claim it makes; the
hand-written backward passes against finite differences; the CLI and its PNG.

The tests of the real time series and of the PNG need the 'demos' (statsmodels) and 'plot'
(matplotlib) extras, which README's test command installs; without one, they skip, naming
it."""
import functools
import re
import socket

import numpy as np
import pytest

from resnorm import demos, nn
from resnorm.__main__ import main
from resnorm.demos import _stacks, _transformer, convergence, gradients, rms_vs_layer


@functools.lru_cache(maxsize=None)
def tiny(name, seed=0):
    return demos.run(name, size="tiny", seed=seed)


def _structure(res, name, n_tables):
    assert res.name == name and res.size == "tiny"
    assert len(res.tables) == n_tables
    for caption, table in res.tables:
        assert caption and table.startswith("| ") and "|---|" in table
    assert res.findings
    text = res.text()
    assert text.startswith(f"# {res.title}") and "Measured:" in text


# --------------------------------------------------------------------------- depth

def test_depth():
    res = tiny("depth")
    _structure(res, "depth", 1)
    norms, growth, k = res.data["norms"], res.data["growth"], res.data["exponents"]
    names = list(norms)
    plain, post, deep, pre1, pre_s, shared = names
    assert norms[pre1].shape == (res.data["seeds"], res.data["depth"] + 1) == (4, 31)
    # no residual: orders of magnitude above the Pre-Norm stream at depth 30
    assert np.median(growth[plain]) > 1e3 * np.median(growth[pre1])
    # Post-Norm and DeepNorm: every layer ends with the norm
    for name in (post, deep):
        np.testing.assert_allclose(norms[name][:, 1:], np.sqrt(4 * 16), rtol=1e-5)
    # Pre-Norm: ||x_L|| ~ sqrt(1 + L g^2) ||x_0||: the closed form, within the seeds' spread
    assert np.median(growth[pre1]) == pytest.approx(np.sqrt(31), rel=0.25)
    assert np.median(growth[pre_s]) == pytest.approx(np.sqrt(1.5), rel=0.1)
    # the square grows linearly for independent branches, the norm linearly for a shared W
    assert 0.35 < np.median(k[pre1]) < 0.65 < 0.8 < np.median(k[shared])
    assert "closed form" in res.tables[0][1] and "layer 30" in res.tables[0][1]


def test_depth_is_seeded():
    assert demos.run("depth", "tiny", seed=3).text() == demos.run("depth", "tiny", seed=3).text()
    assert demos.run("depth", "tiny", seed=3).text() != tiny("depth").text()


def test_deepnorm_constants():
    alpha, beta = _stacks.deepnorm_constants(30)
    assert alpha == pytest.approx(60 ** 0.25) and beta == pytest.approx(240 ** -0.25)


# --------------------------------------------------------------------------- gradients

def test_gradients():
    res = tiny("gradients")
    _structure(res, "gradients", 4)
    ratio = {name: np.median(v) for name, v in res.data["ratio"].items()}
    depth = res.data["depth"]
    assert res.data["reach"]["Pre-Norm, gain 1"].shape == (3, 100)
    assert ratio["no residual, gain 0.9"] < 1e-3          # vanishes
    assert ratio["no residual, gain 1.1"] > 1e2           # explodes
    # Pre-Norm: layer 1 / layer L ~ sqrt(1 + L g^2)
    assert ratio["Pre-Norm, gain 1"] == pytest.approx(np.sqrt(1 + depth), rel=0.5)
    assert ratio["Pre-Norm, gain 1/sqrt(2L)"] == pytest.approx(np.sqrt(1.5), rel=0.15)
    assert 0.8 < ratio["DeepNorm"] < 1.25
    # one step: Post-Norm's output moves far more than Pre-Norm's or DeepNorm's, per unit lr
    sens = {name: np.median(v) for name, v in res.data["sensitivity"].items()}
    assert sens["Post-Norm"] > 5 * sens["Pre-Norm, gain 1"]
    assert sens["Post-Norm"] > 5 * sens["DeepNorm"]
    # ... and that measurement is in the linear range, for the gradient and the sign step
    assert len(res.data["linearity"]) == 2 * len(sens)
    for v in res.data["linearity"].values():
        np.testing.assert_allclose(v, 1.0, atol=0.02)
    # the Adam-like step: Post-Norm still moves the output furthest, in every seed, but
    # against Pre-Norm by less than the gradient step does (its gradients are larger)
    sign = res.data["sign_sensitivity"]
    for other in ("Pre-Norm, gain 1", "DeepNorm"):
        assert np.all(sign["Post-Norm"] > 2 * sign[other])
    assert (np.median(sign["Post-Norm"] / sign["Pre-Norm, gain 1"])
            < np.median(res.data["sensitivity"]["Post-Norm"]
                        / res.data["sensitivity"]["Pre-Norm, gain 1"]))
    spread = re.search(r"Post-Norm moves the output \S+x as far as Pre-Norm with gain 1 "
                       r"\((\S+)\.\.(\S+) over the seeds\) and \S+x as far as DeepNorm "
                       r"\((\S+)\.\.(\S+)\)", next(f for f in res.findings
                                                    if f.startswith("one Adam-like step")))
    ratio = sign["Post-Norm"] / sign["DeepNorm"]
    assert float(spread.group(3)) == pytest.approx(ratio.min(), rel=2e-3)
    assert float(spread.group(4)) == pytest.approx(ratio.max(), rel=2e-3)
    scalar = res.data["scalar"]
    assert scalar["median"] == pytest.approx(scalar["closed_median"], rel=0.1)
    assert scalar["one_row"] == pytest.approx(scalar["one_row_closed"], rel=0.3)
    assert "2.66e-05" in res.tables[3][1] and "1.38e+04" in res.tables[3][1]


def test_sign_step_is_adams_first_update():
    # what the gradients demo calls the Adam-like step: Adam's first, bias-corrected update
    # moves every weight by lr against the sign of its gradient, whatever its size
    layer = nn.Linear(3, 2, bias=False, seed=0, dtype=np.float64)
    start = layer.weight.copy()
    layer.dweight[...] = np.array([[1e-3, -5.0, 0.2], [-0.01, 3.0, -100.0]])
    nn.Adam(layer, lr=1e-3, betas=(0.9, 0.98)).step()
    np.testing.assert_allclose(layer.weight - start, -1e-3 * np.sign(layer.dweight),
                               rtol=1e-4)


def test_one_row_drift_is_the_chi_square_log_mean():
    # E[log(chi2_D / D)] = psi(D/2) - ln(D/2): by Monte Carlo, independently of the formula
    rng = np.random.default_rng(5)
    d, layers = 16, 9
    draws = np.log(rng.chisquare(d, size=(200000, layers)) / d).sum(axis=1) / 2
    assert np.exp(draws.mean()) == pytest.approx(gradients.one_row_drift(layers + 1, d),
                                                 rel=0.01)


@pytest.mark.parametrize("kind, alpha", [("plain", 1.0), ("post-norm", 1.0),
                                         ("post-norm", 1.7), ("pre-norm", 1.0)])
def test_stack_backward_matches_finite_differences(kind, alpha):
    """The real backward passes (RMSNorm kernels + matmul backward) of each stack."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5))
    weights = _stacks.random_weights(rng, 3, 5, 1.0)
    g = rng.standard_normal((3, 5))
    loss = lambda xx, ws: float(np.sum(g * _stacks.forward(kind, xx, ws, alpha)[0]))
    _, tape = _stacks.forward(kind, x, weights, alpha)
    dstreams, dweights = _stacks.backward(g, weights, tape)
    h = 1e-6
    for idx in [(0, 0), (2, 4), (1, 3)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        assert dstreams[0][idx] == pytest.approx((loss(xp, weights) - loss(xm, weights)) / (2 * h),
                                                 rel=1e-6, abs=1e-8)
        for layer in range(3):
            wp = [w.copy() for w in weights]
            wm = [w.copy() for w in weights]
            wp[layer][idx] += h
            wm[layer][idx] -= h
            numeric = (loss(x, wp) - loss(x, wm)) / (2 * h)
            assert dweights[layer][idx] == pytest.approx(numeric, rel=1e-6, abs=1e-8)


# --------------------------------------------------------------------------- batchnorm

def test_batchnorm():
    res = tiny("batchnorm")
    _structure(res, "batchnorm", 1)
    changes = res.data["changes"]
    padding_only = res.data["scenarios"][1]
    for label, by_norm in changes.items():
        for which in ("LayerNorm", "RMSNorm"):
            assert by_norm[which] == (0.0, True)          # bitwise identical
        assert by_norm["BatchNorm, pads counted"][0] > 0.1
        if label != padding_only:
            assert by_norm["BatchNorm, pads masked"][0] > 0.1
    assert changes[padding_only]["BatchNorm, pads masked"] == (0.0, True)
    single = res.data["single_token"]
    assert single["BatchNorm, pads counted"] == 0.0 and single["BatchNorm, pads masked"] == 0.0
    assert single["LayerNorm"] == pytest.approx(2.0, rel=1e-4)       # sqrt(D), D = 4
    assert single["RMSNorm"] == pytest.approx(2.0, rel=1e-4)
    assert "0 (bitwise identical)" in res.tables[0][1]


# --------------------------------------------------------------------------- rms-vs-layer

def test_rms_vs_layer():
    res = tiny("rms-vs-layer")
    _structure(res, "rms-vs-layer", 2)
    (_, centred), (_, shifted) = res.data["same_input"]
    assert centred < 1e-12 and shifted > 0.5
    for t in res.data["timings"]:
        q1, med, q3 = t["quartiles"]
        assert np.all(t["times"] > 0) and 0 < q1 <= med <= q3
        np.testing.assert_allclose(t["ratio"], t["times"][:, 1] / t["times"][:, 0])
    assert "LayerNorm / RMSNorm" in res.tables[1][1]


def test_paired_timing_has_no_neighbour_bias():
    """Every timed call follows an untimed call of the same function, the order of the
    functions changes between rounds, and each round times both."""
    calls = []
    fns = [lambda: calls.append(0), lambda: calls.append(1)]
    times = rms_vs_layer.time_paired(fns, rounds=40, calls=1, rng=np.random.default_rng(0))
    assert times.shape == (40, 2)
    rounds = [calls[i:i + 4] for i in range(0, len(calls), 4)]
    assert len(rounds) == 40 + rms_vs_layer.WARMUP_ROUNDS
    assert all(r[0] == r[1] and r[2] == r[3] and r[0] != r[2] for r in rounds)
    assert {r[0] for r in rounds} == {0, 1}


# --------------------------------------------------------------------------- convergence

@pytest.mark.parametrize("causal", [False, True])
def test_transformer_backward_matches_finite_differences(causal):
    rng = np.random.default_rng(2)
    p = _transformer.init(rng, 2, 5, 7, 3)          # two runs side by side
    x, y = rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 4, 3))
    beta = np.array([0.0, 0.5])
    _, grads, _ = _transformer.loss_and_grads(p, x, y, beta, causal)
    for name in _transformer.PARAMS:
        for idx in [(0, 0, 0), (1, p[name].shape[1] - 1, p[name].shape[2] - 1), (1, 1, 0)]:
            old = p[name][idx]
            p[name][idx] = old + 1e-6
            up = _transformer.loss_and_grads(p, x, y, beta, causal)[0][idx[0]]
            p[name][idx] = old - 1e-6
            down = _transformer.loss_and_grads(p, x, y, beta, causal)[0][idx[0]]
            p[name][idx] = old
            assert grads[name][idx] == pytest.approx((up - down) / 2e-6, rel=1e-5, abs=1e-7)


def test_causal_attention_does_not_see_the_future():
    """Token t's output must not change when a later token's input (which would hold
    token t's target in the sunspots windows) changes."""
    rng = np.random.default_rng(3)
    p = _transformer.init(rng, 1, 6, 12, 1)
    x = rng.standard_normal((2, 5, 6))
    later = x.copy()
    later[:, 3:] += 10.0
    for causal, same in ((True, True), (False, False)):
        a = _transformer.forward(p, x, np.array([0.5]), causal)[0][0, :, :3]
        b = _transformer.forward(p, later, np.array([0.5]), causal)[0][0, :, :3]
        assert np.array_equal(a, b) == same


def _verdict(findings, claim):
    """(k, n) of the finding 'claim: holds in k of n seeds'."""
    line = next(f for f in findings if f.startswith(claim + ": holds in "))
    k, n = re.match(r"(\d+) of (\d+) seeds", line[len(claim) + len(": holds in "):]).groups()
    return int(k), int(n)


def _check_tuning(task_data):
    """Every beta's tuning, recomputed per seed from the raw loss curves: a run trained
    when its losses stayed finite and ended below the first; the best lr has the lowest
    final / initial loss among those; the edge is a best lr whose next grid lr failed."""
    for beta, t in task_data["tuned"].items():
        grid = t["grid"]
        assert grid == task_data["tuned"][0.0]["grid"][:len(grid)]    # one smallest step
        for k, study in enumerate(task_data["studies"]):
            curves = [study.losses[:, study.index(beta, lr)] for lr in grid]
            trained = [bool(np.all(np.isfinite(c)) and c[-1] < c[0]) for c in curves]
            assert list(t["trained"][k]) == trained
            ratios = [c[-1] / c[0] if ok else np.inf for c, ok in zip(curves, trained)]
            best = int(np.argmin(ratios))
            assert t["best"][k] == best and t["best_ratio"][k] == ratios[best]
            assert t["best_lr"][k] == grid[best]
            last = max(i for i, ok in enumerate(trained) if ok)
            assert t["limit_lr"][k] == grid[last]
            assert t["edge"][k] == (best == last < len(grid) - 1)
            assert t["bracketed"][k] == (trained[0] and not trained[-1])
            assert t["monotone"][k][0] == bool(np.all(np.diff(curves[0]) <= 1e-12 * curves[0][:-1]))


def test_convergence():
    pytest.importorskip("statsmodels")   # the sunspot numbers of its real time series
    res = tiny("convergence")
    assert not res.missing, res.missing
    _structure(res, "convergence", 4)
    n = res.data["seeds"]
    for task in ("synthetic", "sunspots"):
        d = res.data[task]
        t, claims = d["tuned"], d["claims"]
        assert len(d["studies"]) == n >= 3
        assert all(len(t[b]["grid"]) >= 4 for b in convergence.BETAS)
        _check_tuning(d)
        # the claims, recomputed from the tuned numbers, and printed seed by seed
        col = lambda key: np.array([t[b][key] for b in convergence.BETAS]).T
        np.testing.assert_array_equal(claims["cond_up"], np.all(np.diff(col("cond0")) > 0, 1))
        np.testing.assert_array_equal(claims["tuned_final_down"],
                                      np.all(np.diff(col("best_final")) < 0, 1))
        np.testing.assert_array_equal(claims["bracketed"], np.all(col("bracketed"), 1))
        for claim, key in (
                (f"{task}: sigma_min/sigma_max of Z at initialisation increases with beta",
                 "cond_up"),
                (f"{task}, each beta at its own best lr: the absolute loss decreases with "
                 f"beta", "tuned_final_down"),
                (f"{task}, each beta at its own best lr: every step descends",
                 "tuned_monotone")):
            assert _verdict(res.findings, claim) == (claims[key].sum(), n)
        # what the tiny model shows in every seed: monotone descent at the smallest step,
        # where the residual improves the conditioning of Z and a one-ulp change of the
        # inputs does not matter; and every beta's grid brackets its stability limit
        assert np.all(claims["small_monotone"]) and np.all(claims["cond_up"])
        assert np.all(claims["bracketed"]) and not np.any(claims["small_sensitive"])
        for b in convergence.BETAS:
            np.testing.assert_allclose(d["moved"]["small"][b], 1.0, rtol=1e-3)
        assert any(f.startswith(f"what survives on the {task} task (majorities of {n} seeds)")
                   for f in res.findings)
    att = res.data["synthetic"]["attention"]
    assert all(a["max_weight"] > a["uniform"] for a in att)
    assert "sunspots" in res.tables[2][0] and "held-out MSE" in res.tables[3][1]
    assert "theorem's regime" not in res.text()
    # the full size: at least 10 seeds, every beta on a grid of at least 4 steps
    full = convergence.SIZES["full"]
    assert full["seeds"] >= 10
    assert all(len(g) >= 4 for task in ("synthetic", "sunspots")
               for g in full[task]["lrs"].values())


def test_a_run_does_not_depend_on_its_batch_and_the_nudge_is_one_ulp():
    # the rounding check repeats only some runs, in a smaller batch: that is only a
    # comparison of the inputs' last bit if a run's result does not depend on its batch
    task = convergence.synthetic_task(np.random.default_rng(5), 3, 4, 6, 2)
    init = convergence.init_weights(task, 0, 0)
    runs = [(b, lr) for b in convergence.BETAS for lr in (1e-3, 4e-3, 0.5)]
    batch = convergence.train(task, runs, init, 60, 20)
    alone = convergence.train(task, runs[4:6], init, 60, 20)
    np.testing.assert_array_equal(batch.losses[:, 4:6], alone.losses)
    assert np.isnan(batch.losses[-1, 2]) and np.isfinite(batch.losses[-1, 1])  # lr 0.5 diverged
    nudged = convergence._nudged(task)
    assert np.all(nudged.x > task.x) and np.all(np.nextafter(nudged.x, -np.inf) == task.x)
    assert nudged.y is task.y


def test_precision_follows_the_spread():
    sig, medians = convergence.sig_text, convergence.medians_text
    assert sig([0.1, 0.03, 0.2]) == "0.1 (0.03..0.2)"                  # spread 0.17: 1 digit
    assert sig([0.163, 0.135, 0.2]) == "0.16 (0.14..0.20)"             # spread 0.065: 2
    assert sig([6e-5, 1e-6, 1e-4]) == "6e-05 (1e-06..1e-04)"           # no 0.000
    assert sig([1.0, 1.0, 1.0]) == "1.00 (1.00..1.00)"
    assert sig([0.99999, 1.00001]) == "1.00 (1.00..1.00)"
    assert sig([np.nan, np.inf]) == "-" and sig([2.0, np.inf, 3.0]) == "2 (2..3)"
    # one digit count for the list (the most any column's spread supports: 2), so that 188 < 207 < 243 do not print as 190, 210, 200
    assert medians([[188, 169, 221], [207, 175, 247], [243, 215, 319]]) == "190, 210, 240"
    assert medians([[1.0], [np.nan]]) == "1.00, -"


def test_linear_baseline_is_least_squares():
    rng = np.random.default_rng(4)
    task = convergence.synthetic_task(rng, 3, 4, 5, 2)
    loss, mse, test = convergence.linear_baseline(task)
    a = np.hstack([task.x.reshape(-1, 5), np.ones((12, 1))])
    r = a @ np.linalg.pinv(a) @ task.y.reshape(-1, 2) - task.y.reshape(-1, 2)
    assert loss == pytest.approx(0.5 * np.sum(r * r)) and mse == pytest.approx(np.mean(r * r))
    assert test is None


def test_linear_rate_of_a_geometric_sequence():
    losses = 5.0 * 0.99 ** np.arange(50)[:, None] * np.array([1.0, 3.0])
    np.testing.assert_allclose(convergence.linear_rate(losses), -np.log(0.99))


def test_sunspots_load_from_the_installed_package_without_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the dataset must not touch the network")

    pytest.importorskip("statsmodels")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    series = convergence.sunspots_series()
    assert series.shape == (309,) and np.all(np.isfinite(series))
    task = convergence.sunspots_task(series, tokens=4, lags=8, held_out=0.2)
    assert task.x.shape[1:] == (4, 8) and task.y.shape[1:] == (4, 1) and task.causal
    assert len(task.x) + len(task.x_test) == (309 - 8) // 4 and len(task.x_test) == 15
    # token t holds the last 8 values; its target is the next one; standardised with the
    # years the training part sees
    seen = series[:len(task.x) * 4 + 8]
    v = (series - seen.mean()) / seen.std()
    np.testing.assert_allclose(task.x[0, 0], v[:8])
    assert task.y[0, 0, 0] == pytest.approx(v[8])
    np.testing.assert_allclose(task.x[1, 0], v[4:12])
    assert task.y_test[-1, -1, 0] == pytest.approx(v[len(task.x) * 4 + len(task.x_test) * 4 + 7])


def test_convergence_says_when_statsmodels_is_missing(monkeypatch, capsys, tmp_path):
    def missing():
        raise ImportError("No module named 'statsmodels'")

    monkeypatch.setattr(convergence, "sunspots_series", missing)
    res = demos.run("convergence", "tiny")
    assert "statsmodels is not installed" in res.missing
    assert res.data["sunspots"] is None and len(res.tables) == 2     # no silent substitute
    assert main(["demo", "convergence", "--size", "tiny", "--no-png"]) == 1
    assert "NOT RUN: the real time series part" in capsys.readouterr().out


# --------------------------------------------------------------------------- CLI and PNG

@pytest.mark.parametrize("name", sorted(demos.DEMOS))
def test_png(name, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / f"{name}.png"
    assert demos.save_png(tiny(name), path), "matplotlib is missing: pip install 'resnorm[plot]'"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_demo(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "depth.png"
    assert main(["demo", "depth", "--size", "tiny", "--png", str(path), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "# Activation norm through 30 layers" in out
    assert "(demo depth, size tiny, seed 1)" in out and f"figure: {path}" in out
    assert path.stat().st_size > 1000


def test_cli_demo_without_matplotlib(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("resnorm.demos._common.pyplot", lambda: None)
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "depth", "--size", "tiny"]) == 0
    assert "no figure: matplotlib is not installed" in capsys.readouterr().out
    assert main(["demo", "depth", "--size", "tiny", "--png", "x.png"]) == 1
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_unknown_demo():
    with pytest.raises(ValueError, match="demo must be one of"):
        demos.run("nope")
    with pytest.raises(ValueError, match="size must be one of"):
        demos.run("depth", size="huge")
    with pytest.raises(SystemExit):
        main(["demo", "nope"])
