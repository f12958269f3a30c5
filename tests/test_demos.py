"""Every demo at its tiny size: output structure and the qualitative claim it makes; the
hand-written backward passes against finite differences; the CLI and its PNG.

Needs the 'demos' (statsmodels) and 'plot' (matplotlib) extras: these tests do not skip
without them, they fail, because the demos they check would not run."""
import functools
import socket

import numpy as np
import pytest

from resnorm import demos
from resnorm.__main__ import main
from resnorm.demos import _stacks, _transformer, convergence


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
    norms = res.data["norms"]
    plain, post, pre, shared = norms.values()
    assert len(plain) == res.data["depth"] + 1 == 31
    # no residual: orders of magnitude above the Pre-Norm stream at depth 30
    assert plain[-1] > 1e3 * pre[-1]
    # Pre-Norm: finite, and growing (not constant); aligned branches grow it faster
    assert np.all(np.isfinite(pre)) and pre[-1] > 2 * pre[0]
    assert pre[10] < pre[20] < pre[30]     # on average: a random walk need not rise every layer
    k = list(res.data["exponents"].values())
    assert k[2] < 0.75 < k[3]
    # Post-Norm: every layer ends with the norm
    np.testing.assert_allclose(post[1:], np.sqrt(4 * 16), rtol=1e-5)
    assert "layer 30" in res.tables[0][1]


def test_depth_is_seeded():
    assert demos.run("depth", "tiny", seed=3).text() == demos.run("depth", "tiny", seed=3).text()
    assert demos.run("depth", "tiny", seed=3).text() != tiny("depth").text()


# --------------------------------------------------------------------------- gradients

def test_gradients():
    res = tiny("gradients")
    _structure(res, "gradients", 4)
    reach = res.data["reach"]
    ratio = {name: v[0] / v[-1] for name, v in reach.items()}
    assert len(reach["Pre-Norm"]) == 100
    assert ratio["no residual, gain 0.9"] < 1e-3          # vanishes
    assert ratio["no residual, gain 1.1"] > 1e2           # explodes
    assert 1 / 30 < ratio["Pre-Norm"] < 30                # a small factor
    assert 1 / 30 < ratio["Post-Norm"] < 30
    i = res.data["step_sizes"].index(1e-3)
    assert res.data["moves"]["Post-Norm"][i] > 5 * res.data["moves"]["Pre-Norm"][i]
    assert "2.66e-05" in res.tables[3][1] and "1.38e+04" in res.tables[3][1]
    assert 0.1 < res.data["scalar"]["median"] < 10


@pytest.mark.parametrize("kind", _stacks.KINDS)
def test_stack_backward_matches_finite_differences(kind):
    """The real backward passes (RMSNorm kernels + matmul backward) of each stack."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5))
    weights = _stacks.random_weights(rng, 3, 5, 1.0)
    g = rng.standard_normal((3, 5))
    loss = lambda xx, ws: float(np.sum(g * _stacks.forward(kind, xx, ws)[0]))
    _, tape = _stacks.forward(kind, x, weights)
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
    for pass_ in ("forward", "backward"):
        assert all(np.isfinite(r) and r > 0 for r in res.data["ratios"][pass_])
    assert "LayerNorm / RMSNorm" in res.tables[1][1]


# --------------------------------------------------------------------------- convergence

def test_transformer_backward_matches_finite_differences():
    rng = np.random.default_rng(2)
    p = _transformer.init(rng, 5, 7, 3)
    x, y = rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 4, 3))
    for beta in (0.0, 0.5):
        _, grads, _ = _transformer.loss_and_grads(p, x, y, beta)
        for name in _transformer.PARAMS:
            for idx in [(0, 0), (p[name].shape[0] - 1, p[name].shape[1] - 1)]:
                old = p[name][idx]
                p[name][idx] = old + 1e-6
                up = _transformer.loss_and_grads(p, x, y, beta)[0]
                p[name][idx] = old - 1e-6
                down = _transformer.loss_and_grads(p, x, y, beta)[0]
                p[name][idx] = old
                assert grads[name][idx] == pytest.approx((up - down) / 2e-6, rel=1e-5, abs=1e-7)


def test_convergence():
    res = tiny("convergence")
    assert not res.missing, res.missing
    _structure(res, "convergence", 2)
    for task in ("synthetic", "sunspots"):
        t = res.data[task]
        assert t["common_lr"] is not None
        # conditioning of Z improves with beta (the paper's mechanism)
        assert all(b > a for a, b in zip(t["cond_start"], t["cond_start"][1:]))
        # gradient descent decreases the loss for every beta ...
        assert all(f < 0.5 for f in t["final_common"])
        # ... and the residual (beta = 1) beats no residual (beta = 0)
        assert t["final_common"][-1] < t["final_common"][0]
    assert "sunspots" in res.tables[1][0]


def test_sunspots_load_from_the_installed_package_without_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the dataset must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    series = convergence.sunspots_series()
    assert series.shape == (309,) and np.all(np.isfinite(series))
    x, y = convergence.sunspots_task(series, tokens=4, lags=8)
    assert x.shape[1:] == (4, 8) and y.shape[1:] == (4, 1)
    # token t holds the last 8 values; its target is the next one
    v = (series - series.mean()) / series.std()
    np.testing.assert_allclose(x[0, 0], v[:8])
    assert y[0, 0, 0] == pytest.approx(v[8])


def test_convergence_says_when_statsmodels_is_missing(monkeypatch, capsys, tmp_path):
    def missing():
        raise ImportError("No module named 'statsmodels'")

    monkeypatch.setattr(convergence, "sunspots_series", missing)
    res = demos.run("convergence", "tiny")
    assert "statsmodels is not installed" in res.missing
    assert res.data["sunspots"] is None and len(res.tables) == 1     # no silent substitute
    assert main(["demo", "convergence", "--size", "tiny", "--no-png"]) == 1
    assert "NOT RUN: the real time series part" in capsys.readouterr().out


# --------------------------------------------------------------------------- CLI and PNG

@pytest.mark.parametrize("name", sorted(demos.DEMOS))
def test_png(name, tmp_path):
    path = tmp_path / f"{name}.png"
    assert demos.save_png(tiny(name), path), "matplotlib is missing: pip install 'resnorm[plot]'"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_demo(tmp_path, capsys):
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
