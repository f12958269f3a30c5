"""Explain mode: the steps, their numbers (kernel outputs and reference intermediates),
the agreement verdict, the CLI text, and bad input."""
import re

import numpy as np
import pytest

import resnorm
from resnorm import norms, reference
from resnorm.__main__ import main
from resnorm.explain import Explanation, explain

X = [1.0, 2.0, 3.0, 4.0]
W = [1.0, 0.5, 2.0, -1.0]
B = [0.0, 0.5, -1.0, 2.0]
DY = [1.0, 0.0, -2.0, 0.5]


def test_public_name_is_the_function():
    assert resnorm.explain is explain
    assert isinstance(resnorm.explain("rms", X), Explanation)


# --------------------------------------------------------------------------- steps present

def test_rms_steps_in_order():
    e = explain("rms", X, weight=W, dy=DY)
    assert e.names == ["x", "w", "eps", "D", "dy", "squares", "sum_sq", "ms", "rstd", "xn",
                       "y", "g", "g_xn", "m", "dx", "dw"]
    assert [s.phase for s in e.steps].count("backward") == 5
    sources = {s.name: s.source for s in e.steps}
    assert [n for n, src in sources.items() if src == "kernel"] == ["rstd", "y", "dx", "dw"]


def test_layer_steps_in_order():
    e = explain("layer", X, weight=W, bias=B, dy=DY)
    assert e.names == ["x", "w", "b", "eps", "D", "dy", "sum_x", "mean", "centred", "sq_dev",
                       "var", "rstd", "xhat", "y", "g", "mean_g", "g_xhat", "mean_g_xhat",
                       "dx", "dw", "db"]
    assert [s.name for s in e.steps if s.source == "kernel"] == [
        "mean", "rstd", "y", "dx", "dw", "db"]


def test_optional_parts_are_left_out():
    e = explain("rms", X)
    assert "w" not in e.names and "dx" not in e.names and "dw" not in e.names
    assert [c.name for c in e.checks] == ["y", "rstd"]
    e = explain("layer", X, dy=DY)
    assert "dw" not in e.names and "db" not in e.names and "dx" in e.names
    assert e.step("y").formula == "y_i = xhat_i"


def test_formulas_are_written_from_the_operands():
    e = explain("rms", X, weight=W, dy=DY)
    assert e.step("y").formula == "y_i = x_i * rstd * w_i"
    assert e.step("rstd").formula == "rstd = 1 / sqrt(ms + eps)"
    assert e.step("sum_sq").formula == "sum_sq = sum_i squares_i"
    assert e.step("dw").formula == "dw_i = sum_rows dy_i * xn_i"
    assert e.step("dx").formula == "dx_i = rstd * (g_i - xn_i * m)"


# --------------------------------------------------------------------------- the numbers

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_numbers(dtype):
    x, w, dy = (np.array(v, dtype=dtype) for v in (X, W, DY))
    e = explain("rms", x, weight=w, dy=dy, eps=1e-6)
    assert e.dtype == dtype
    # kernel outputs are exactly what the public kernels return
    y, cache = norms.rms_norm_forward(x, w, 1e-6)
    dx, dw = norms.rms_norm_backward(dy, cache)
    np.testing.assert_array_equal(e["y"], y.reshape(1, -1))
    np.testing.assert_array_equal(e["rstd"], cache.rstd)
    np.testing.assert_array_equal(e["dx"], dx.reshape(1, -1))
    np.testing.assert_array_equal(e["dw"], dw)
    assert e["y"].dtype == dtype
    # intermediates follow the float64 reference, computed by hand here
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(e["squares"][0], x64 ** 2)
    assert e["sum_sq"][0] == 30.0 and e["ms"][0] == 7.5
    _, rstd_ref = reference.rms_norm_forward(x, w, 1e-6)
    np.testing.assert_allclose(e["xn"][0], x64 * rstd_ref, rtol=1e-15)
    g = dy.astype(np.float64) * w
    np.testing.assert_allclose(e["m"][0], np.mean(g * x64 * rstd_ref), rtol=1e-14)
    # and the kernel agrees with the reference
    assert e.agree
    tol = {np.float32: 1e-5, np.float64: 1e-13}[dtype]
    np.testing.assert_allclose(e["y"][0], x64 / np.sqrt(7.5 + 1e-6) * w, rtol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_numbers(dtype):
    x = np.array([[1.0, 2.0, 3.0, 4.0], [-3.0, 0.5, 2.0, 7.0]], dtype=dtype)
    dy = np.array([DY, [0.5, -1.0, 0.0, 3.0]], dtype=dtype)
    w, b = np.array(W, dtype=dtype), np.array(B, dtype=dtype)
    e = explain("layer", x, weight=w, bias=b, dy=dy)
    assert e.eps == 1e-5
    y, cache = norms.layer_norm_forward(x, w, b, 1e-5)
    dx, dw, db = norms.layer_norm_backward(dy, cache)
    for name, value in (("y", y), ("mean", cache.mean), ("rstd", cache.rstd), ("dx", dx),
                        ("dw", dw), ("db", db)):
        np.testing.assert_array_equal(e[name], value)
    y_ref, mean_ref, rstd_ref = reference.layer_norm_forward(x, w, b, 1e-5)
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(e["sum_x"], x64.sum(axis=1))
    np.testing.assert_allclose(e["centred"], x64 - mean_ref[:, None], rtol=1e-15)
    np.testing.assert_allclose(e["var"], x64.var(axis=1), rtol=1e-14)
    np.testing.assert_allclose(e["xhat"], (x64 - mean_ref[:, None]) * rstd_ref[:, None],
                               rtol=1e-15)
    g = dy.astype(np.float64) * w
    np.testing.assert_allclose(e["mean_g"], g.mean(axis=1), rtol=1e-15)
    assert e.agree
    assert {c.name for c in e.checks} == {"y", "mean", "rstd", "dx", "dw", "db"}
    # dw sums over the two rows
    np.testing.assert_allclose(e["dw"], (dy.astype(np.float64) * e["xhat"]).sum(axis=0),
                               rtol={np.float32: 1e-5, np.float64: 1e-13}[dtype])


def test_checks_report_the_difference_to_the_reference():
    e = explain("layer", X, weight=W, bias=B, dy=DY, dtype="float32")
    y_ref, _, _ = reference.layer_norm_forward(np.float32(X), np.float32(W), np.float32(B))
    check = {c.name: c for c in e.checks}["y"]
    assert check.max_abs_diff == np.max(np.abs(e["y"].astype(np.float64) - y_ref))
    assert 0 < check.tolerance < 1e-4


def test_disagreement_is_reported(monkeypatch, capsys):
    """A kernel that returns a wrong y must give the verdict DISAGREE and exit status 1."""
    real = norms.rms_norm_forward

    def broken(x, weight=None, eps=1e-6, **kw):
        y, cache = real(x, weight, eps, **kw)
        return y * 1.001, cache

    monkeypatch.setattr(norms, "rms_norm_forward", broken)
    e = explain("rms", X)
    assert not e.agree
    assert not {c.name: c for c in e.checks}["y"].agree
    assert "DISAGREE" in str(e)
    assert main(["explain", "rms", "--x", "1,2,3,4"]) == 1
    assert "DISAGREE" in capsys.readouterr().out


def test_inputs_are_not_modified():
    x, w, dy = np.array(X), np.array(W), np.array(DY)
    before = x.copy(), w.copy(), dy.copy()
    explain("rms", x, weight=w, dy=dy)
    for a, b in zip((x, w, dy), before):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- text and CLI

def test_text_shows_every_element_with_its_numbers():
    text = str(explain("rms", X, dy=[1, 0, 0, 0]))
    for line in ("squares_0 = 1^2 = 1", "squares_3 = 4^2 = 16",
                 "sum_sq = 1 + 4 + 9 + 16 = 30", "ms = 30 / 4 = 7.5",
                 "rstd = 1 / sqrt(7.5 + 1e-06) = 0.3651483473",
                 "y_1 = 2 * 0.3651483473 = 0.7302966947",
                 "m = (0.3651483473 + 0 + 0 + 0) / 4 = 0.09128708683",
                 "verdict: AGREE"):
        assert line in text, line
    assert "[kernel]" in text and "[reference]" in text


def test_text_marks_rows_and_shortens_long_sums():
    text = explain("layer", np.arange(24.0).reshape(2, 12)).render()
    assert "row 1: mean = 210 / 12 = 17.5" in text
    assert "row 0: sum_x = 0 + 1 + 2 + ... + 11 = 66" in text


def test_negative_operands_are_parenthesised():
    text = explain("rms", [-1.0, 2.0]).render(digits=4)
    assert "squares_0 = (-1)^2 = 1" in text


def test_cli_rms(capsys):
    assert main(["explain", "rms", "--x", "1,2,3,4", "--weight", "1,0.5,2,-1",
                 "--dy", "1,0,-2,0.5"]) == 0
    out = capsys.readouterr().out
    assert "RMSNorm (float64), 1 row of D = 4, eps = 1e-06" in out
    for step in ("squares_i = x_i^2", "sum_sq = sum_i squares_i", "rstd = 1 / sqrt(ms + eps)",
                 "y_i = x_i * rstd * w_i", "m = mean_i g_xn_i", "dx_0 =", "dw_3 =",
                 "verdict: AGREE"):
        assert step in out, step


def test_cli_layer_rows_and_float32(capsys):
    assert main(["explain", "layer", "--x", "1,2,3;4,-5,6", "--bias", "0,1,2",
                 "--dy", "1,0,0;0,1,0", "--dtype", "float32", "--eps", "1e-3"]) == 0
    out = capsys.readouterr().out
    assert "LayerNorm (float32), 2 rows of D = 3, eps = 0.001" in out
    assert "row 1: centred_1 = (-5) - 1.6666667 = -6.6666667" in out
    assert "db_1 = 0 + 1 = 1" in out and "verdict: AGREE" in out


def test_cli_negative_first_value(capsys):
    assert main(["explain", "rms", "--x=-1,2"]) == 0
    assert "x = [-1, 2]" in capsys.readouterr().out


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs, error, words", [
    ({"kind": "batch"}, ValueError, "kind must be one of"),
    ({"kind": 3}, TypeError, "kind must be a str"),
    ({"x": ["a", "b"]}, TypeError, "x must hold real numbers"),
    ({"x": [1 + 2j, 3]}, TypeError, "x must hold real numbers"),
    ({"x": np.zeros((2, 2, 2))}, ValueError, "x must be one row"),
    ({"x": []}, ValueError, "non-empty last axis"),
    ({"weight": [1.0, 2.0]}, ValueError, "weight must have shape (4,)"),
    ({"dy": [1.0, 2.0]}, ValueError, "dy must have shape (4,)"),
    ({"bias": [0.0] * 4}, ValueError, "bias is used only with kind 'layer'"),
    ({"p": 0.5}, ValueError, "p is used only with kind 'add-rms' or 'dropout'"),
    ({"residual": X}, ValueError, "residual is used only with kind 'add-rms'"),
    ({"kind": "add-rms"}, ValueError, "kind='add-rms' needs residual"),
    ({"kind": "add-rms", "residual": [1.0]}, ValueError, "residual must have shape (4,)"),
    ({"kind": "add-rms", "residual": X, "dh": X}, ValueError, "dh (the gradient along the "),
    ({"kind": "add-rms", "residual": X, "alpha": np.ones(4)}, TypeError, "alpha must be a real"),
    ({"kind": "add-rms", "residual": X, "p": 1.5}, ValueError, "p must be in [0, 1]"),
    ({"kind": "dropout"}, ValueError, "kind='dropout' needs p"),
    ({"kind": "dropout", "p": 0.5, "weight": W}, ValueError, "weight is used only with kind"),
    ({"kind": "dropout", "p": 0.5, "seed": -1}, ValueError, "seed must be in [0, 2**64)"),
    ({"kind": "dropout", "p": 0.5, "training": 1}, TypeError, "training must be a bool"),
    ({"eps": -1.0}, ValueError, "eps must be finite and > 0"),
    ({"dtype": np.float16}, TypeError, "dtype must be float32 or float64"),
])
def test_bad_input(kwargs, error, words):
    args = {"kind": "rms", "x": X, **kwargs}
    with pytest.raises(error, match=re.escape(words)):
        explain(args.pop("kind"), args.pop("x"), **args)


@pytest.mark.parametrize("argv, words", [
    (["explain", "rms", "--x", "1,a"], "expected numbers separated by ','"),
    (["explain", "rms", "--x", "1,2;3"], "every row must have the same length"),
    (["explain", "rms", "--x", "1,2", "--dy", "1"], "dy must have shape (2,)"),
    (["explain", "cube", "--x", "1,2"], "invalid choice"),
])
def test_cli_bad_input(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err


# --------------------------------------------------------------------------- add-rms, dropout

RES = [0.5, -1.0, 0.0, 2.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_rms_numbers(dtype):
    x, res, w, dy, dh = (np.array(v, dtype=dtype) for v in (X, RES, W, DY, [0, 1, 0, 0]))
    e = explain("add-rms", x, residual=res, weight=w, dy=dy, dh=dh, alpha=0.5, p=0.25, seed=3)
    assert e.names == ["x", "residual", "w", "alpha", "p", "seed", "training", "eps", "D", "k",
                       "dy", "dh", "threshold", "u", "keep", "scale", "d", "h", "squares",
                       "sum_sq", "ms", "rstd", "hn", "y", "g", "g_hn", "m", "gh", "dresidual",
                       "dx", "dw"]
    kw = dict(alpha=0.5, p=0.25, seed=3)
    (y, h), cache = resnorm.add_rms_norm_forward(x, res, w, 1e-6, **kw)
    dx, dres, dw, _ = resnorm.add_rms_norm_backward(dy, dh, cache)
    for name, value in (("y", y), ("h", h), ("rstd", cache.rstd), ("dx", dx),
                        ("dresidual", dres), ("dw", dw)):
        np.testing.assert_array_equal(e[name].reshape(np.shape(value)), value)
    keep = reference.dropout_mask((1, 4), 0.25, 3)
    np.testing.assert_array_equal(e["keep"], keep)
    np.testing.assert_array_equal(e["u"] >= np.floor(0.25 * 2**32), keep)
    np.testing.assert_allclose(e["d"], np.float64(X) * keep / 0.75, rtol=1e-15)
    # the gradient reaching h: along the stream (dh) plus through the norm
    h64 = np.float64(res) + 0.5 * e["d"][0]
    rstd = 1 / np.sqrt(np.mean(h64 ** 2) + 1e-6)
    g = np.float64(dy) * np.float64(w)
    hn = h64 * rstd
    np.testing.assert_allclose(e["gh"][0], [0, 1, 0, 0] + rstd * (g - hn * np.mean(g * hn)),
                               rtol=1e-12)
    assert e.agree and {c.name for c in e.checks} == {
        "y", "h", "rstd", "keep", "dx", "dresidual", "dw"}


def test_add_rms_without_dropout_or_in_eval():
    for kwargs in ({}, {"p": 0.5, "training": False}):
        e = explain("add-rms", X, residual=RES, dy=DY, **kwargs)
        assert "keep" not in e.names and "u" not in e.names and "k" not in e.names
        np.testing.assert_array_equal(e["d"][0], X)
        np.testing.assert_allclose(e["h"][0], np.add(X, RES))
        assert e.step("dx").formula == "dx_i = gh_i * alpha"
        assert e.agree


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_numbers(dtype):
    x = np.arange(1.0, 13.0, dtype=dtype).reshape(2, 6)
    dy = np.ones_like(x)
    e = explain("dropout", x, dy=dy, p=0.5, seed=7)
    y, cache = resnorm.dropout_forward(x, 0.5, seed=7, return_mask=True)
    np.testing.assert_array_equal(e["y"], y)
    np.testing.assert_array_equal(e["keep"], cache.mask)
    np.testing.assert_array_equal(e["dx"], resnorm.dropout_backward(dy, cache))
    np.testing.assert_array_equal(e["k"], np.arange(12).reshape(2, 6))
    np.testing.assert_array_equal(e["u"].ravel(), reference.dropout_uniforms(7, 12))
    assert e["threshold"] == 2**31 and e["scale"] == 2.0
    assert 0 < cache.mask.sum() < 12
    assert e.agree and e.eps is None


def test_dropout_eval_and_extremes():
    e = explain("dropout", X, p=0.5, training=False, dy=DY)
    assert e.names == ["x", "p", "seed", "training", "dy", "y", "dx"]
    np.testing.assert_array_equal(e["y"][0], X)
    e = explain("dropout", X, p=1.0)
    np.testing.assert_array_equal(e["y"][0], 0.0)
    assert "threshold" not in e.names and e.agree


def test_cli_add_rms_and_dropout(capsys):
    assert main(["explain", "add-rms", "--x", "1,2,3,4", "--residual=-1,0,1,2", "--p", "0.25",
                 "--seed", "3", "--alpha", "0.5", "--dy", "1,0,0,-1", "--dh", "0,1,0,0"]) == 0
    out = capsys.readouterr().out
    assert "Residual add + RMSNorm (Pre-Norm) (float64), 1 row of D = 4, eps = 1e-06" in out
    for line in ("threshold = floor(0.25 * 2^32) = 1073741824",
                 "keep_3 = [595191321 >= 1073741824] = 0",
                 "h_i = residual_i + alpha * d_i", "gh_i = dh_i + rstd * (g_i - hn_i * m)",
                 "dx_3 = ", "verdict: AGREE"):
        assert line in out, line
    assert main(["explain", "dropout", "--x", "1,2", "--p", "0.5", "--eval"]) == 0
    out = capsys.readouterr().out
    assert "training = False" in out and "y_1 = 2" in out
