"""Explain mode: the steps, their numbers (kernel outputs and reference intermediates),
the agreement verdict, the CLI text, and bad input."""
import re
from pathlib import Path

import numpy as np
import pytest

import resnorm
from resnorm import reference
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
    y, cache = resnorm.rms_norm_forward(x, w, 1e-6)
    dx, dw = resnorm.rms_norm_backward(dy, cache)
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
    y, cache = resnorm.layer_norm_forward(x, w, b, 1e-5)
    dx, dw, db = resnorm.layer_norm_backward(dy, cache)
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
    real = resnorm.rms_norm_forward

    def broken(x, weight=None, eps=1e-6, **kw):
        y, cache = real(x, weight, eps, **kw)
        return y * 1.001, cache

    monkeypatch.setattr(resnorm, "rms_norm_forward", broken)
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
    ({"p": 0.5}, ValueError, "p is used only with kind 'add-rms', 'add-layer', 'add-rms-post', "
                             "'add-layer-post' or 'dropout'"),
    ({"residual": X}, ValueError, "residual is used only with kind 'add-rms'"),
    ({"kind": "add-rms"}, ValueError, "kind='add-rms' needs residual"),
    ({"kind": "add-rms", "residual": [1.0]}, ValueError, "residual must have shape (4,)"),
    ({"kind": "add-rms", "residual": X, "dh": X}, ValueError, "dh (the gradient along the "),
    ({"kind": "add-rms", "residual": X, "alpha": "a"}, TypeError, "alpha must be a real"),
    ({"kind": "add-rms", "residual": X, "alpha": np.ones(3)}, ValueError,
     "alpha must have shape () (learnable scalar) or (4,)"),
    ({"kind": "add-rms", "residual": X, "p": 1.5}, ValueError, "p must be in [0, 1]"),
    ({"kind": "dropout"}, ValueError, "kind='dropout' needs p"),
    ({"kind": "dropout", "p": 0.5, "weight": W}, ValueError, "weight is used only with kind"),
    ({"kind": "dropout", "p": 0.5, "seed": -1}, ValueError, "seed must be in [0, 2**64)"),
    ({"kind": "dropout", "p": 0.5, "training": 1}, TypeError, "training must be a bool"),
    ({"eps": -1.0}, ValueError, "eps must be finite and > 0"),
    ({"dtype": np.int32}, TypeError, "dtype must be float32, float64, float16 or bfloat16"),
    ({"dtype": "float8"}, TypeError, "dtype must be float32, float64, float16 or bfloat16"),
    ({"kind": "add-rms", "residual": X, "dtype": np.float16}, TypeError,
     "dtype float16 is explained for the kinds rms, layer, dropout, scaled, gated, gated-rms, "
     "not kind='add-rms'; explain it in float32 or float64"),
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


# --------------------------------------------------------------------------- the other kinds

F_ = [0.5, -1.0, 0.0, 2.0]
CASES = [
    ("add-rms", dict(residual=RES, weight=W, dy=DY, dh=[0, 1, 0, 0], alpha=0.5, p=0.25, seed=3)),
    ("add-rms", dict(residual=RES, weight=W, dy=DY, alpha=np.array(0.5))),
    ("add-layer", dict(residual=RES, weight=W, bias=B, dy=DY, dh=[0, 1, 0, 0],
                       alpha=[0.5, 1.0, 2.0, 0.1], p=0.25, seed=3)),
    ("add-rms-post", dict(residual=RES, weight=W, dy=DY, p=0.5, seed=1)),
    ("add-layer-post", dict(residual=RES, bias=B, dy=DY, alpha=np.array(0.3))),
    ("scaled", dict(F=F_, alpha=0.7, dh=DY)),
    ("scaled", dict(F=F_, alpha=np.array(0.7), dh=DY)),
    ("scaled", dict(F=F_, alpha=[0.7, 1.0, 2.0, 3.0], dh=DY)),
    ("gated", dict(F=F_, g=[-40.0, 0.0, 1.0, 40.0], dh=DY)),
    ("gated-rms", dict(gate=[0.5, -1.0, 2.0, 0.0], weight=W, group_size=2, dy=DY)),
    ("gated-rms", dict(gate=[0.5, -1.0, 2.0, 0.0], weight=W, norm_before_gate=True, dy=DY)),
    ("gated-rms", dict(weight=W, group_size=2, dy=DY)),
    ("dropout", dict(p=0.5, seed=1, dy=DY)),
    ("rms", dict(weight=W, dy=DY)),
    ("layer", dict(weight=W, bias=B, dy=DY)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind, kwargs", CASES)
def test_every_kind_agrees_and_checks_every_gradient(kind, kwargs, dtype):
    e = explain(kind, X, dtype=dtype, **kwargs)
    assert e.agree, [c for c in (*e.checks, *e.gradient_checks) if not c.agree]
    gradients = [s.name for s in e.steps if s.phase == "backward" and s.source == "kernel"]
    assert sorted(c.name for c in e.gradient_checks) == sorted(gradients)
    for c in e.gradient_checks:
        np.testing.assert_array_equal(c.kernel.reshape(np.shape(e[c.name])), e[c.name])
    text = str(e)
    assert "finite differences: every gradient" in text and "verdict: AGREE" in text


def test_gradient_check_is_independent_of_the_reference(monkeypatch):
    """A backward that is wrong in the same way as its reference passes the reference
    check but not the finite differences."""
    real_kernel, real_ref = resnorm.rms_norm_backward, reference.rms_norm_backward
    monkeypatch.setattr(resnorm, "rms_norm_backward",
                        lambda dy, cache: tuple(None if v is None else v * 1.001
                                                for v in real_kernel(dy, cache)))
    monkeypatch.setattr(reference, "rms_norm_backward",
                        lambda *a: tuple(None if v is None else v * 1.001 for v in real_ref(*a)))
    e = explain("rms", X, dy=DY)
    assert all(c.agree for c in e.checks)
    assert not {c.name: c for c in e.gradient_checks}["dx"].agree and not e.agree
    assert "DISAGREE" in str(e)


def test_finite_differences_of_a_known_gradient():
    # y = x * rstd: d/dx of sum(dy * y) at dy = e_0, by hand: rstd * (e_0 - xn * xn_0 / D)
    e = explain("rms", X, dy=[1.0, 0.0, 0.0, 0.0], eps=1e-6)
    x = np.array(X)
    rstd = 1 / np.sqrt(np.mean(x * x) + 1e-6)
    xn = x * rstd
    expected = rstd * (np.eye(4)[0] - xn * xn[0] / 4)
    fd = {c.name: c for c in e.gradient_checks}["dx"].finite_difference
    np.testing.assert_allclose(fd[0], expected, rtol=1e-8, atol=1e-10)


def test_jacobians_of_the_norms():
    e = explain("rms", X, weight=W, dy=DY)
    (j,) = e.jacobians
    x, w = np.array(X), np.array(W)
    rstd = 1 / np.sqrt(np.mean(x * x) + 1e-6)
    xn = x * rstd
    np.testing.assert_allclose(j.closed_form, w[:, None] * rstd * (np.eye(4) - np.outer(xn, xn) / 4),
                               rtol=1e-14)
    # RMSNorm's Jacobian removes the direction of x (up to eps) ...
    assert np.max(np.abs(j.closed_form @ x)) < 1e-6
    # ... LayerNorm's removes the constant direction and the direction of xhat
    e = explain("layer", [[1.0, 2.0, 6.0], [0.5, -1.0, 3.0]], dy=[[1.0, 0, 0], [0, 1.0, 0]])
    assert len(e.jacobians) == 2 and e.agree
    for j in e.jacobians:
        np.testing.assert_allclose(j.closed_form @ np.ones(3), 0.0, atol=1e-15)
        assert j.max_abs_diff_fd < 1e-8 and j.max_abs_diff_backward < 1e-14
    assert "Jacobian dy/dx of each row" in str(e)
    # the fused kinds: dy/dh
    e = explain("add-layer", X, residual=RES, dy=DY, dh=[0, 1, 0, 0])
    assert e.jacobians[0].wrt == "h" and e.agree
    # none without a gradient, or for long rows
    assert explain("rms", X).jacobians == ()
    assert explain("rms", np.arange(1.0, 10.0), dy=np.ones(9)).jacobians == ()


def test_invariants_hold_with_the_eps_term():
    # a large eps makes the eps term of dx . x visible: it must match exactly what the
    # formula predicts, not 0
    e = explain("rms", X, dy=DY, eps=1.0)
    (inv,) = e.invariants
    x, dy = np.array(X), np.array(DY)
    ms = np.mean(x * x)
    rstd = 1 / np.sqrt(ms + 1.0)
    assert inv.exact[0] == pytest.approx(rstd * np.dot(dy, x) * 1.0 / (ms + 1.0), rel=1e-14)
    assert abs(inv.value[0]) > 0.1 and inv.value[0] == pytest.approx(inv.exact[0], rel=1e-12)
    dx = e["dx"][0]
    assert inv.value[0] == pytest.approx(np.dot(dx, x), rel=1e-12)
    e = explain("layer", [[1.0, 2.0, 6.0], [0.5, -1.0, 3.0]], dy=[[1.0, 0, 0], [0, 1.0, 0]])
    total, along = e.invariants
    assert total.name == "sum dx" and np.all(total.exact == 0) and np.all(np.abs(total.value) < 1e-15)
    assert along.name == "dx . xhat" and np.all(np.abs(along.value) < 1e-5) and e.agree
    e = explain("add-rms-post", X, residual=RES, dy=DY)
    assert [i.name for i in e.invariants] == ["dresidual . h"] and e.agree
    e = explain("add-rms", X, residual=RES, dy=DY, dh=[0, 1, 0, 0])
    assert [i.name for i in e.invariants] == ["(dresidual - dh) . h"] and e.agree


def test_cache_says_what_is_kept():
    cache = dict(explain("rms", X, weight=W, dy=DY).cache)
    assert cache["x"].endswith("a reference to x") and cache["weight"].endswith("a reference to w")
    assert "float64 array of shape (1,)" in cache["rstd"]
    post = dict(explain("add-rms-post", X, residual=RES).cache)
    assert post["x"].endswith("a reference to x")
    assert post["residual"].endswith("a reference to residual") and "h" not in post
    pre = dict(explain("add-rms", X, residual=RES).cache)
    assert pre["h"].endswith("a reference to h") and "x" not in pre
    assert dict(explain("add-rms", X, residual=RES, alpha=np.array(0.5)).cache)["x"].endswith(
        "a reference to x")
    drop = dict(explain("dropout", X, p=0.5).cache)
    assert "array" not in drop["spec"] and "seed: 0" in drop["spec"]
    assert "why: " in str(explain("layer", X))


def test_philox_counter_and_word_of_every_element():
    seed = 2**33 + 5
    x = np.ones((2, 70))
    e = explain("dropout", x, p=0.3, seed=seed)
    m = e.philox
    k = np.arange(140)
    np.testing.assert_array_equal(m["counter"], 16 * (k // 64) + k % 16)
    np.testing.assert_array_equal(m["word"], (k % 64) // 16)
    assert (m["counter"][16], m["word"][16]) == (0, 1)
    assert (m["counter"][64], m["word"][64]) == (16, 0)
    assert (m["counter"][127], m["word"][127]) == (31, 3)
    assert m["key"] == (5, 2)
    np.testing.assert_array_equal(m["u"], reference.dropout_uniforms(seed, 140))
    np.testing.assert_array_equal(e["keep"].ravel(), m["u"] >= np.floor(0.3 * 2**32))
    text = str(e)
    assert "key = (seed mod 2^32, seed div 2^32) = (5, 2)" in text
    assert f"k = 16: c = 0, w = 1: philox(key, (0, 0, 0, 0)) = [" in text
    assert explain("dropout", X, p=0.5, training=False).philox is None


@pytest.mark.parametrize("kind", ["add-layer", "add-rms-post", "add-layer-post"])
def test_fused_kinds_return_the_kernel_outputs(kind):
    alpha = np.array([0.5, 1.0, 2.0, 0.1])
    e = explain(kind, X, residual=RES, weight=W, dy=DY, alpha=alpha, p=0.25, seed=3,
                **({"bias": B} if "layer" in kind else {}))
    x, res, w, b, dy = (np.array(v) for v in (X, RES, W, B, DY))
    name = {"add-layer": "add_layer_norm", "add-rms-post": "add_rms_norm_post",
            "add-layer-post": "add_layer_norm_post"}[kind]
    fwd, bwd = getattr(resnorm, f"{name}_forward"), getattr(resnorm, f"{name}_backward")
    args = (x, res, w) + ((b,) if "layer" in kind else ())
    out, cache = fwd(*args, alpha=alpha, p=0.25, seed=3)
    grads = bwd(dy, None, cache) if "post" not in kind else bwd(dy, cache)
    y = out[0] if "post" not in kind else out
    np.testing.assert_array_equal(e["y"][0], y)
    np.testing.assert_array_equal(e["dx"][0], grads[0])
    np.testing.assert_array_equal(e["dresidual"][0], grads[1])
    np.testing.assert_array_equal(e["dalpha"], grads[-1])
    assert e.step("dalpha").per == "column" and e.step("alpha").per == "column"
    assert e.step("h").source == ("reference" if "post" in kind else "kernel")
    assert e.agree


def test_scaled_and_gated_return_the_kernel_outputs():
    x, f, dh = np.array(X), np.array(F_), np.array(DY)
    for alpha in (0.7, np.array(0.7), np.array([0.7, 1.0, 2.0, 3.0])):
        e = explain("scaled", x, F=f, alpha=alpha, dh=dh)
        h, cache = resnorm.scaled_residual_forward(x, f, alpha)
        dx, dF, dalpha = resnorm.scaled_residual_backward(dh, cache)
        np.testing.assert_array_equal(e["h"][0], h)
        np.testing.assert_array_equal(e["dF"][0], dF)
        assert ("dalpha" in e.names) == (dalpha is not None)
        if dalpha is not None:
            np.testing.assert_array_equal(e["dalpha"], dalpha)
    g = np.array([[-1.0, 0.0, 1.0, 2.0], [3.0, -2.0, 0.5, 0.0]])
    xx, ff = np.stack([x, f]), np.stack([f, x])
    e = explain("gated", xx, F=ff, g=g, dh=np.ones((2, 4)))
    h, cache = resnorm.gated_residual_forward(xx, ff, g)
    np.testing.assert_array_equal(e["h"], h)
    np.testing.assert_array_equal(e["dg"], resnorm.gated_residual_backward(np.ones((2, 4)),
                                                                          cache)[2])
    assert e.step("dg").per == "element" and e.agree
    e = explain("gated", xx, F=ff, g=g[0], dh=np.ones((2, 4)))
    assert e.step("dg").per == "column" and e.step("dg").reduce == "sum" and e.agree


def test_scalar_dalpha_sums_over_rows_and_channels():
    text = explain("scaled", X, F=F_, alpha=np.array(0.5), dh=[1.0, 1.0, 1.0, 1.0]).render()
    assert "dalpha = sum_rows,i dh_i * F_i" in text
    assert "dalpha = 1 * 0.5 + 1 * (-1) + 1 * 0 + 1 * 2 = 1.5" in text


@pytest.mark.parametrize("kwargs, error, words", [
    ({"kind": "scaled", "F": X, "alpha": 0.5, "dy": DY}, ValueError,
     "kind='scaled' outputs h: give its gradient as dh, not dy"),
    ({"kind": "scaled", "F": X}, ValueError, "kind='scaled' needs alpha"),
    ({"kind": "scaled", "alpha": 0.5}, ValueError, "kind='scaled' needs F"),
    ({"kind": "gated", "F": X}, ValueError, "kind='gated' needs g"),
    ({"kind": "gated", "F": X, "g": [1.0, 2.0]}, ValueError, "g must have the shape of x (4,)"),
    ({"kind": "gated", "F": [1.0], "g": X}, ValueError, "F must have shape (4,)"),
    ({"kind": "add-rms-post", "residual": X, "dy": DY, "dh": DY}, ValueError,
     "dh is used only with kind"),
    ({"kind": "add-layer"}, ValueError, "kind='add-layer' needs residual"),
    ({"kind": "rms", "F": X}, ValueError, "F is used only with kind 'scaled' or 'gated'"),
])
def test_bad_input_of_the_other_kinds(kwargs, error, words):
    args = {"x": X, **kwargs}
    with pytest.raises(error, match=re.escape(words)):
        explain(args.pop("kind"), args.pop("x"), **args)


def test_cli_other_kinds(capsys):
    assert main(["explain", "scaled", "--x", "1,2", "--F", "3,4", "--alpha", "0.5",
                 "--learnable-alpha", "--dh", "1,1"]) == 0
    out = capsys.readouterr().out
    assert "alpha = 0.5  -- residual scale (learnable scalar)" in out
    assert "dalpha (with respect to alpha): worst |kernel - finite difference|" in out
    assert main(["explain", "add-layer", "--x", "1,2,3", "--residual=-1,0,1", "--alpha",
                 "0.5,1,2", "--dy", "1,0,0", "--dh", "0,1,0"]) == 0
    out = capsys.readouterr().out
    assert "Residual add + LayerNorm (Pre-Norm)" in out and "dalpha_2 =" in out
    assert "Jacobian dy/dh of each row" in out and "verdict: AGREE" in out
    assert main(["explain", "gated", "--x", "1,2", "--F", "3,4", "--g=-1,1", "--dh", "1,1"]) == 0
    assert "dg_1 = " in capsys.readouterr().out
    assert main(["explain", "add-rms-post", "--x", "1,2", "--residual", "3,4", "--dy", "1,0",
                 "--p", "0.5", "--seed", "2"]) == 0
    assert "Post-Norm: not an output" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["explain", "scaled", "--x", "1,2", "--F", "3,4", "--learnable-alpha"])
    assert "--learnable-alpha needs --alpha" in capsys.readouterr().err


# --------------------------------------------------------------------------- float16, bfloat16

def _halves():
    names = ["float16"]
    try:
        import ml_dtypes  # noqa: F401
        names.append("bfloat16")
    except ImportError:
        pass
    return names


HALF_CASES = [("rms", dict(weight=W, dy=DY)), ("layer", dict(weight=W, bias=B, dy=DY)),
              ("dropout", dict(p=0.5, seed=1, dy=DY)), ("scaled", dict(F=F_, alpha=0.7, dh=DY)),
              ("scaled", dict(F=F_, alpha=[0.7, 1.0, 2.0, 3.0], dh=DY)),
              ("gated", dict(F=F_, g=[-3.0, 0.0, 1.0, 2.5], dh=DY)),
              ("gated-rms", dict(gate=[0.5, -1.0, 2.0, 1.0], weight=W, group_size=2, dy=DY)),
              ("gated-rms", dict(gate=[0.5, -1.0, 2.0, 1.0], weight=W, norm_before_gate=True,
                                 dy=DY))]


@pytest.mark.parametrize("name", _halves())
@pytest.mark.parametrize("kind, kwargs", HALF_CASES)
def test_half_outputs_are_shown_as_their_rounding_and_agree(kind, kwargs, name):
    e = explain(kind, [1.0, 2.1, 3.3, -4.7], dtype=name, **kwargs)
    assert e.dtype.name == name and e.agree
    rounded = [s for s in e.steps if s.source == "kernel" and s.value.dtype.itemsize == 2]
    assert rounded, "no 16-bit output"
    for s in rounded:
        exact = e.step(f"{s.name}_exact")
        assert exact.source == "reference" and exact.value.dtype == np.float64
        assert s.formula.endswith(f"round({exact.formula.split(' = ')[0]})")
        assert e.names.index(exact.name) == e.names.index(s.name) - 1
        # the kernel's value is the exact one rounded once: within half a unit in the last
        # place of the 16-bit value (plus float32 arithmetic, far below it)
        k = s.value.astype(np.float64)
        up = (s.value.view(np.uint16) + np.uint16(1)).view(s.value.dtype).astype(np.float64)
        assert np.all(np.abs(k - exact.value) <= np.abs(up - k) / 2
                      + 1e-6 * np.abs(exact.value)), s.name
    # 16-bit checks are held to one unit in the last place; float64 statistics to float32's
    for c in e.checks:
        value = e.step(c.name).value
        eps = 2.0 ** -7 if name == "bfloat16" else 2.0 ** -10
        ulps = 1 if value.dtype.itemsize == 2 else 128
        eps = eps if value.dtype.itemsize == 2 else 2.0 ** -23
        rule = ulps * eps * max(1.0, np.max(np.abs(
            e.step(f"{c.name}_exact").value if value.dtype.itemsize == 2 else value)))
        if kind in ("rms", "layer", "gated-rms") and c.name in ("dx", "dgate"):
            # held at the size of the numbers the kernel forms them from, at least their own
            assert c.tolerance >= rule * (1 - 1e-12), c.name
        else:
            assert c.tolerance == pytest.approx(rule), c.name
    text = str(e)
    assert f"({name})" in text.splitlines()[0] and "round(" in text and "verdict: AGREE" in text
    assert "round(-" in text and "round((" not in text   # a negative argument, unwrapped
    assert f"1 * eps({name})" in text


@pytest.mark.parametrize("name", _halves())
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "layer"])
def test_half_with_float32_parameters(name, layer):
    # float32 weight and bias arrays beside a 16-bit run: the mixed-precision kernels, as the
    # functions run them; the parameters' gradients float32, held to float32's rule
    w, b = np.array(W, np.float32), np.array(B, np.float32)
    kwargs = dict(weight=w, bias=b) if layer else dict(weight=w)
    e = explain("layer" if layer else "rms", [1.0, 2.1, 3.3, -4.7], dy=DY, dtype=name,
                **kwargs)
    assert e.param_dtype == np.float32 and e.agree
    x = np.array([[1.0, 2.1, 3.3, -4.7]]).astype(e.dtype)
    if layer:
        y, cache = resnorm.layer_norm_forward(x, w, b)
        dx, dw, db = resnorm.layer_norm_backward(np.array([DY]).astype(e.dtype), cache)
        assert e["db"].dtype == np.float32 and np.array_equal(e["db"], db)
    else:
        y, cache = resnorm.rms_norm_forward(x, w)
        dx, dw = resnorm.rms_norm_backward(np.array([DY]).astype(e.dtype), cache)
    assert np.array_equal(e["y"].view(np.uint16), y.view(np.uint16))
    assert np.array_equal(e["dx"].view(np.uint16), dx.view(np.uint16))
    assert e["dw"].dtype == np.float32 and np.array_equal(e["dw"], dw)
    assert {c.name: c.tolerance for c in e.checks}["dw"] == pytest.approx(
        128 * 2.0 ** -23 * max(1.0, np.max(np.abs(dw))))
    text = str(e)
    assert text.splitlines()[0].startswith(("LayerNorm" if layer else "RMSNorm")
                                           + f" ({name}, float32 parameters)")
    assert "and the float32 parameters' gradients" in text
    # a list (or a float64 array) is cast to the run's dtype, as before
    assert explain("rms", [1.0, 2.0], [1.0, 2.0], dtype=name).param_dtype is None


def test_half_check_catches_an_output_two_units_off(monkeypatch):
    real = resnorm.rms_norm_forward

    def off_by_one_ulp(x, *args, **kwargs):
        y, cache = real(x, *args, **kwargs)
        bits = y.view(np.uint16).copy()
        largest = np.unravel_index(np.argmax(np.abs(y.astype(np.float64))), y.shape)
        bits[largest] += 2       # two units in the last place of the largest value
        return bits.view(y.dtype), cache
    monkeypatch.setattr(resnorm, "rms_norm_forward", off_by_one_ulp)
    e = explain("rms", [1.0, 2.1, 3.3, -4.7], dtype="float16")
    assert not {c.name: c for c in e.checks}["y"].agree and not e.agree


def test_half_default_dtype_follows_x_and_cli(capsys):
    e = explain("rms", np.array([1.0, 2.0, 3.0], np.float16))
    assert e.dtype == np.float16 and "y_exact" in e.names
    assert main(["explain", "layer", "--x", "1,2,6", "--dy", "1,0,0", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("LayerNorm (float16)") and "y_0 = round(" in out


# ----------------------------------------------------------------- how strict the checks are

GATED_20 = dict(F=[3.0, -4.0], g=[-1.0, 20.0], dh=[1.0, 1.0])


def _wrong_in_both(monkeypatch, name, wrong):
    """The kernel's and the reference's function `name` both changed by wrong (a backward
    wrong in the same way as its reference: only the independent checks can see it)."""
    for module in (resnorm, reference):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real: wrong(_real(*a)))


def test_gradient_check_is_relative_per_component(monkeypatch):
    """dg at g = 20 is 8e-9: an error of 1e-5 of it must be caught, though it is far below
    any absolute tolerance taken at the scale of 1."""
    e = explain("gated", [1.0, 2.0], **GATED_20)
    check = {c.name: c for c in e.gradient_checks}["dg"]
    assert e.agree and abs(check.kernel[1]) < 1e-8
    assert abs(check.kernel[1] - check.finite_difference[1]) < 1e-6 * abs(check.kernel[1])

    def tiny_error(grads):
        dx, dF, dg = grads
        return dx, dF, dg * np.array([1.0, 1.0 + 1e-5])
    _wrong_in_both(monkeypatch, "gated_residual_backward", tiny_error)
    e = explain("gated", [1.0, 2.0], **GATED_20)
    assert all(c.agree for c in e.checks)
    assert not {c.name: c for c in e.gradient_checks}["dg"].agree and not e.agree


def test_components_zero_by_cancellation_are_judged_at_the_gradient_scale():
    # dy = 1 everywhere: LayerNorm's dx is 0 up to rounding (sum dx = 0 and dy is constant)
    e = explain("layer", [1.0, 2.0, 6.0], dy=[1.0, 1.0, 1.0])
    assert np.max(np.abs(e["dx"])) < 1e-12 and e.agree


@pytest.mark.parametrize("kind, x, dy", [("layer", [5.0, 5.0, 5.0, 5.0], [1.0, 0, 0, 0]),
                                         ("rms", [0.0, 0.0, 0.0], [1.0, 0, 0]),
                                         ("layer", [[5.0, 5.0, 5.0], [1.0, 2.0, 6.0]],
                                          [[1.0, 0, 0], [0, 1.0, 0]])])
def test_constant_and_zero_rows_agree(kind, x, dy, capsys):
    """The kernel is right on a constant row (var = 0) and a zero row (ms = 0): the checks
    must say so; the finite-difference step follows the row's spread sqrt(var + eps)."""
    e = explain(kind, x, dy=dy)
    assert e.agree, [c for c in (*e.gradient_checks, *e.jacobians) if not c.agree]
    rows = ";".join(",".join(str(v) for v in row) for row in np.atleast_2d(x))
    dys = ";".join(",".join(str(v) for v in row) for row in np.atleast_2d(dy))
    assert main(["explain", kind, "--x", rows]) == 0
    assert main(["explain", kind, "--x", rows, "--dy", dys]) == 0
    assert "verdict: AGREE" in capsys.readouterr().out


@pytest.mark.parametrize("kind, x, dy", [("rms", [3.0, 0.0], [1.0, 0.5]),
                                         ("layer", [3.0, 0.0], [1.0, 0.5]),
                                         ("layer", [1e4, 1e4 + 1.0, 1e4 - 1.0], [1.0, 0, 0])])
def test_float32_components_that_cancel_agree(kind, x, dy):
    """A float32 dx component the norm makes nearly 0 (dx_0 of the row (3, 0) is
    rstd * (1 - xn_0 * m), about 1e-7 of its terms) carries the rounding of its terms, not of
    itself: the kernel is right, and the checks must say so."""
    e = explain(kind, x, dy=dy, dtype="float32")
    assert e.agree, [c for c in (*e.checks, *e.gradient_checks, *e.jacobians) if not c.agree]


def test_a_wrong_float32_component_that_cancels_is_still_caught(monkeypatch):
    _wrong_in_both(monkeypatch, "rms_norm_backward",
                   lambda grads: (grads[0] + np.float32(1e-3), *grads[1:]))
    e = explain("rms", [3.0, 0.0], dy=[1.0, 0.5], dtype="float32")
    assert not {c.name: c for c in e.gradient_checks}["dx"].agree and not e.agree


def test_a_wrong_backward_on_a_constant_row_is_still_caught(monkeypatch):
    _wrong_in_both(monkeypatch, "layer_norm_backward",
                   lambda grads: (grads[0] * 1.0001, *grads[1:]))
    e = explain("layer", [5.0, 5.0, 5.0, 5.0], dy=[1.0, 0, 0, 0])
    assert all(c.agree for c in e.checks)
    assert not {c.name: c for c in e.gradient_checks}["dx"].agree and not e.agree


# --------------------------------------------------------------------------- forward invariants

@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_forward_invariants_hold(dtype):
    e = explain("layer", [[1.0, 2.0, 6.0], [5.0, 5.0, 5.0]], weight=[1.0, 0.5, 2.0],
                bias=[0.0, 1.0, -1.0], dtype=dtype)
    assert [i.name for i in e.forward_invariants] == ["mean xhat", "rms xhat", "y(2x) - y(x)",
                                                      "y(x + c) - y(x)"]
    assert e.agree and all(i.agree for i in e.forward_invariants)
    rms = {i.name: i for i in e.forward_invariants}["rms xhat"]
    # eps-aware: the constant row's xhat is 0, not of unit RMS
    assert rms.exact[1] == 0.0 and 0.999 < rms.exact[0] < 1.0
    e = explain("rms", [0.0, 0.0, 0.0], dtype=dtype)
    assert [i.name for i in e.forward_invariants] == ["rms xn", "y(2x) - y(x)"] and e.agree


def test_forward_invariants_catch_a_forward_wrong_like_its_reference(monkeypatch):
    """A y wrong in the same way in the kernel and the reference passes the comparison but
    not the invariants, which need neither."""
    for name in ("rms_norm_forward", "layer_norm_forward"):
        _wrong_in_both(monkeypatch, name, lambda out: (out[0] * 1.001, *out[1:]))
    for kind in ("rms", "layer"):
        e = explain(kind, [1.0, 2.0, 6.0])
        assert all(c.agree for c in e.checks)
        rms = {i.name: i for i in e.forward_invariants}[f"rms x{'n' if kind == 'rms' else 'hat'}"]
        assert not rms.agree and not e.agree


def test_forward_invariants_catch_a_norm_that_is_not_shift_invariant(monkeypatch):
    # a kernel (and reference) that forgets part of the mean: y changes when x is shifted
    def leaky(out):
        mean = out[1] if len(out) == 3 else out[1].mean      # the reference's, the kernel's
        return (out[0] + 1e-3 * mean[..., None], *out[1:])
    _wrong_in_both(monkeypatch, "layer_norm_forward", leaky)
    e = explain("layer", [1.0, 2.0, 6.0])
    shift = {i.name: i for i in e.forward_invariants}["y(x + c) - y(x)"]
    assert all(c.agree for c in e.checks) and not shift.agree and not e.agree


def test_forward_invariants_are_printed_and_their_independence_said(capsys):
    assert main(["explain", "layer", "--x", "1,2,6", "--dy", "1,0,0"]) == 0
    out = capsys.readouterr().out
    for line in ("mean_i xhat_i", "y(2x) - y(x)", "y(x + c) - y(x)",
                 "independent of the kernel's formula", "not independent"):
        assert line in out, line
    doc = (Path(__file__).resolve().parent.parent / "docs" / "explain.md").read_text()
    assert "independent of the kernel's formula" in doc and "y(2x)" in doc


def test_docs_do_not_say_the_sigmoid_of_20_rounds_to_1():
    e = explain("gated", [1.0, 2.0], **GATED_20)
    s = float(e["s"][1])
    assert s < 1.0 and 1.0 - s == pytest.approx(2.06e-9, rel=1e-2)
    doc = (Path(__file__).resolve().parent.parent / "docs" / "explain.md").read_text()
    assert "rounds to 1" not in doc
    assert "rounds to 1" not in str(e)


# --------------------------------------------------------------------------- gated RMSNorm

Z = [0.5, -1.0, 2.0, 1.0]


def test_gated_rms_steps_in_order():
    e = explain("gated-rms", X, gate=Z, weight=W, group_size=2, dy=DY)
    assert e.names == ["x", "z", "w", "eps", "group_size", "norm_before_gate", "D", "dy", "s",
                       "a", "u", "ms", "rstd", "un", "y", "g", "g_un", "m", "du", "dx", "ds",
                       "da_dz", "dgate", "dw"]
    assert [s.name for s in e.steps if s.source == "kernel"] == ["rstd", "y", "dx", "dgate",
                                                                   "dw"]
    assert {s.name: s.per for s in e.steps if s.per == "group"} == {
        "ms": "group", "rstd": "group", "m": "group"}
    assert e.step("ms").formula == "ms_k = mean_{i in k} u_i^2"
    assert e.step("rstd").formula == "rstd_k = 1 / sqrt(ms_k + eps)"
    assert e.step("du").formula == "du_i = rstd_k * (g_i - un_i * m_k)"
    assert e.step("dgate").formula == "dgate_i = du_i * x_i * da_dz_i"
    assert e.step("dw").formula == "dw_i = sum_rows dy_i * un_i"
    e = explain("gated-rms", X, gate=Z, weight=W, norm_before_gate=True, dy=DY)
    assert e.names[8:] == ["ms", "rstd", "xn", "s", "a", "y", "ds", "da_dz", "dgate", "dyn",
                           "g", "g_xn", "m", "dx", "dw"]
    assert e.step("y").formula == "y_i = xn_i * w_i * a_i"
    assert e.step("dw").formula == "dw_i = sum_rows dyn_i * xn_i"
    e = explain("gated-rms", X, dy=DY)
    assert e.names == ["x", "eps", "group_size", "norm_before_gate", "D", "dy", "ms", "rstd",
                       "xn", "y", "g", "g_xn", "m", "dx"]
    assert [c.name for c in e.checks] == ["y", "rstd", "dx"] and e.eps == 1e-6


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("before", [False, True], ids=["gate-first", "norm-first"])
def test_gated_rms_numbers(dtype, before):
    x = np.array([X, [-3.0, 0.5, 2.0, 7.0]], dtype=dtype)
    z = np.array([Z, [1.0, 1.0, -2.0, 3.0]], dtype=dtype)
    dy = np.array([DY, [0.0, 1.0, 1.0, -1.0]], dtype=dtype)
    w = np.array(W, dtype=dtype)
    e = explain("gated-rms", x, gate=z, weight=w, group_size=2, norm_before_gate=before, dy=dy)
    # kernel outputs are exactly what the public kernels return
    y, cache = resnorm.gated_rms_norm_forward(x, z, w, 1e-6, group_size=2,
                                              norm_before_gate=before)
    dx, dgate, dw = resnorm.gated_rms_norm_backward(dy, cache)
    for name, value in (("y", y), ("dx", dx), ("dgate", dgate), ("dw", dw)):
        np.testing.assert_array_equal(e[name], value)
    np.testing.assert_array_equal(e["rstd"], cache.rstd.reshape(2, 2))   # (N, G)
    # intermediates follow the definitions, computed by hand here
    x64, z64 = x.astype(np.float64), z.astype(np.float64)
    a = z64 / (1 + np.exp(-z64))
    np.testing.assert_allclose(e["a"], a, rtol=1e-15)
    v = x64 if before else x64 * a
    ms = (v * v).reshape(2, 2, 2).mean(axis=-1)
    np.testing.assert_allclose(e["ms"], ms, rtol=1e-15)
    vn = v * np.repeat(1 / np.sqrt(ms + 1e-6), 2, axis=1)
    np.testing.assert_allclose(e["xn" if before else "un"], vn, rtol=1e-14)
    s = 1 / (1 + np.exp(-z64))
    np.testing.assert_allclose(e["da_dz"], s + z64 * s * (1 - s), rtol=1e-14)
    assert e.agree
    assert {c.name for c in e.checks} == {"y", "rstd", "dx", "dgate", "dw"}
    assert [c.name for c in e.gradient_checks] == ["dx", "dgate", "dw"]
    assert [c.wrt for c in e.gradient_checks] == ["x", "z", "w"]
    assert [i.name for i in e.forward_invariants] == [
        f"rms {'xn' if before else 'un'}", "y(cx) - y(x)"]
    assert all(np.shape(i.value) == (2, 2) for i in (*e.forward_invariants, *e.invariants))
    assert len(e.jacobians) == 2 and all(j.agree for j in e.jacobians)


def test_gated_rms_without_gate_is_the_rms_kind_group_by_group():
    x = np.array([[1.0, 2.0, 3.0, 4.0, -1.0, 0.5], [0.3, -2.0, 5.0, 1.0, 1.0, 1.0]])
    w = np.array([1.0, 0.5, 2.0, 1.0, -1.0, 3.0])
    dy = np.array([[1.0, 0, 0, -1, 2, 1], [0, 1, 1, 1, -1, 0]])
    e = explain("gated-rms", x, weight=w, group_size=3, dy=dy)
    assert [i.name for i in e.forward_invariants] == ["rms xn", "y(cx) - y(x)", "y - rms_norm"]
    assert e.agree and "z" not in e.names and "dgate" not in e.names
    for k in range(2):
        cols = slice(3 * k, 3 * k + 3)
        r = explain("rms", x[:, cols], weight=w[cols], dy=dy[:, cols])
        np.testing.assert_array_equal(e["ms"][:, k], r["ms"])
        np.testing.assert_array_equal(e["xn"][:, cols], r["xn"])
        for name in ("y", "dx"):
            np.testing.assert_allclose(e[name][:, cols], r[name], rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(e["rstd"][:, k], r["rstd"], rtol=1e-14)
        np.testing.assert_allclose(e["dw"][cols], r["dw"], rtol=1e-14, atol=1e-15)
    text = str(e)
    assert text.startswith("Gated RMSNorm, no gate (float64), 2 rows of D = 6 in groups of 3")
    assert "row 1: ms_1 = (1^2 + 1^2 + 1^2) / 3 = 1" in text


def _wrong_gated(monkeypatch, name, wrong, modules=(resnorm, reference)):
    """Replace the function `name` of each module by wrong(its result) (keywords too)."""
    for module in modules:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, **kw: wrong(_real(*a, **kw)))


def test_gated_rms_a_wrong_kernel_value_is_caught(monkeypatch, capsys):
    _wrong_gated(monkeypatch, "gated_rms_norm_forward",
                 lambda out: (out[0] * 1.001, out[1]), modules=(resnorm,))
    e = explain("gated-rms", X, gate=Z, group_size=2)
    assert not {c.name: c for c in e.checks}["y"].agree and not e.agree
    assert main(["explain", "gated-rms", "--x", "1,2,3,4", "--gate", "0.5,-1,2,1"]) == 1
    assert "DISAGREE" in capsys.readouterr().out


def test_gated_rms_a_backward_wrong_like_its_reference_is_caught(monkeypatch):
    """dgate off by 1e-4 in the kernel and the reference alike: only the finite differences
    can see it."""
    _wrong_gated(monkeypatch, "gated_rms_norm_backward",
                 lambda grads: (grads[0], grads[1] * (1 + 1e-4), grads[2]))
    for before in (False, True):
        e = explain("gated-rms", X, gate=Z, weight=W, group_size=2, norm_before_gate=before,
                    dy=DY)
        assert all(c.agree for c in e.checks)
        assert not {c.name: c for c in e.gradient_checks}["dgate"].agree and not e.agree


def test_gated_rms_a_forward_that_mixes_the_groups_is_caught(monkeypatch):
    """A kernel and reference that normalise the whole row, not each group: they agree with
    each other, the per-group invariants do not hold."""
    for module in (resnorm, reference):
        real = module.gated_rms_norm_forward
        monkeypatch.setattr(module, "gated_rms_norm_forward",
                            lambda *a, _real=real, **kw: _real(*a, **{**kw, "group_size": None}))
    e = explain("gated-rms", [1.0, 2.0, 30.0, 40.0], gate=Z, group_size=2)
    failed = {i.name for i in e.forward_invariants if not i.agree}
    assert failed == {"rms un", "y(cx) - y(x)"} and not e.agree


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("x, gate", [
    ([0.0, 0.0, 0.0, 0.0], Z),                          # a zero row
    ([5.0, 5.0, 5.0, 5.0], [1.0, 1.0, 1.0, 1.0]),       # a constant row
    (X, [0.0, 0.0, 0.0, 0.0]),                          # silu(0) = 0: u is a zero row
    (X, [1.0, 1.0, 2.0, 0.0]),                          # a group with one nonzero u
    ([0.0, 0.0, 3.0, 4.0], Z),                          # a zero group
    (X, [-1.2784645, -1.2784645, 1.0, 1.0]),            # silu'(z) = 0: the loss is flat in z
    (X, [-40.0, 40.0, -20.0, 20.0]),                    # saturated gates
    ([0.0, 0.0, 0.0, 0.0], None),
])
@pytest.mark.parametrize("before", [False, True], ids=["gate-first", "norm-first"])
def test_gated_rms_constant_and_zero_rows_agree(x, gate, before, dtype):
    e = explain("gated-rms", x, gate=gate, weight=W, group_size=2, norm_before_gate=before,
                dy=DY, dtype=dtype)
    assert e.agree, [c for c in (*e.checks, *e.forward_invariants, *e.gradient_checks,
                                 *e.jacobians, *e.invariants) if not c.agree]


def test_gated_rms_zero_rows_on_the_command_line(capsys):
    for extra in ([], ["--norm-before-gate"]):
        assert main(["explain", "gated-rms", "--x", "0,0,0,0;1,2,3,4", "--gate", "1,1,1,1;0,0,0,0",
                     "--group-size", "2", "--dy", "1,0,0,1;1,1,0,0", *extra]) == 0
        out = capsys.readouterr().out
        assert "row 0: rstd_0 = 1 / sqrt(0 + 1e-06) = 1000" in out
        assert "row 1, group 1: dx . x" in out and "verdict: AGREE" in out


def test_gated_rms_half_with_float32_weight():
    w = np.array(W, np.float32)
    e = explain("gated-rms", [1.0, 2.1, 3.3, -4.7], gate=Z, weight=w, group_size=2, dy=DY,
                dtype="float16")
    assert e.param_dtype == np.float32 and e["dw"].dtype == np.float32 and e.agree
    assert e.names.index("dgate_exact") == e.names.index("dgate") - 1
    assert str(e).startswith("Gated RMSNorm, gate before the norm (float16, float32 "
                             "parameters), 1 row of D = 4 in groups of 2")


def test_gated_rms_cli(capsys):
    assert main(["explain", "gated-rms", "--x", "1,2,3,4", "--gate=-1,0.5,2,1", "--weight",
                 "1,0.5,2,1", "--group-size", "2", "--dy", "1,0,0,-1"]) == 0
    out = capsys.readouterr().out
    for line in ("Gated RMSNorm, gate before the norm (float64), 1 row of D = 4 in groups of 2,"
                 " eps = 1e-06", "z = [-1, 0.5, 2, 1]  -- the gate (gate=)",
                 "a_0 = (-1) * 0.2689414214 = -0.2689414214", "ms_k = mean_{i in k} u_i^2",
                 "rstd_1 = 1 / sqrt(", "du_i = rstd_k * (g_i - un_i * m_k)",
                 "dgate (with respect to z): worst", "group 1: rms un = 1",
                 "group 0: dx . x = ", "verdict: AGREE"):
        assert line in out, line
    assert main(["explain", "gated-rms", "--x", "1,2,3,4", "--gate", "1,1,1,1",
                 "--norm-before-gate", "--eps", "0.01"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Gated RMSNorm, norm before the gate (float64), 1 row of D = 4, "
                          "eps = 0.01")
    assert "norm_before_gate = True  -- True: x is normalised, then gated" in out


@pytest.mark.parametrize("argv, words", [
    (["--group-size", "3"], "group_size must be a positive divisor of x's last axis (4)"),
    (["--gate", "1,2"], "gate must have shape (4,), got (2,)"),
    (["--dh", "1,1,1,1"], "dh is used only with kind"),
])
def test_gated_rms_cli_bad_input(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "gated-rms", "--x", "1,2,3,4", *argv])
    assert exit_.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, error, words", [
    ({"kind": "rms", "gate": Z}, ValueError, "gate is used only with kind 'gated-rms'"),
    ({"kind": "gated", "F": X, "g": Z, "group_size": 2}, ValueError,
     "group_size is used only with kind 'gated-rms'"),
    ({"kind": "rms", "norm_before_gate": False}, ValueError,
     "norm_before_gate is used only with kind 'gated-rms'"),
    ({"gate": [1.0, 2.0]}, ValueError, "gate must have shape (4,)"),
    ({"gate": ["a"] * 4}, TypeError, "gate must hold real numbers"),
    ({"group_size": 3}, ValueError, "group_size must be a positive divisor"),
    ({"group_size": 2.0}, TypeError, "group_size must be None or an int"),
    ({"norm_before_gate": 1}, TypeError, "norm_before_gate must be a bool"),
    ({"dh": X}, ValueError, "dh is used only with kind"),
])
def test_gated_rms_bad_input(kwargs, error, words):
    args = {"kind": "gated-rms", "x": X, **kwargs}
    with pytest.raises(error, match=re.escape(words)):
        explain(args.pop("kind"), args.pop("x"), **args)


def test_gated_rms_docs_example_is_the_output(capsys):
    """The excerpt in docs/explain.md is the command's output, line by line ('...' marks
    what it leaves out)."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "explain.md").read_text()
    section = doc[doc.index("### Example: gated RMSNorm, in groups"):]
    command = re.search(r"`python -m resnorm (explain gated-rms [^`]*)`", section).group(1)
    excerpt = section.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert main(command.split()) == 0
    out = capsys.readouterr().out.splitlines()
    missing = [line for line in excerpt if line != "..." and line not in out]
    assert not missing and len(excerpt) > 100


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("before", [False, True], ids=["gate-first", "norm-first"])
def test_gated_rms_groups_of_one_element_agree(dtype, before):
    """Groups of one element: y_i = u_i / sqrt(u_i^2 + eps), about +-1, and dx, dgate the
    eps terms of a total cancellation, which the checks must allow at the kernel's size."""
    x = [[194.07, 23.92, -37.5, 0.02], [0.0, 5.0, 1e-3, -2.0]]
    gate = [[0.001, -1.79, 1.6, 30.0], [1.0, -40.0, 2.0, 0.5]]
    e = explain("gated-rms", x, gate=gate, weight=W, group_size=1, norm_before_gate=before,
                dy=[DY, DY], dtype=dtype)
    assert e["rstd"].shape == (2, 4)
    assert e.agree, [c for c in (*e.checks, *e.forward_invariants, *e.gradient_checks,
                                 *e.jacobians, *e.invariants) if not c.agree]


# --------------------------------------------------------------------------- forward invariants
#                                              of the fused, dropout and residual kinds

FUSED_KINDS = ["add-rms", "add-layer", "add-rms-post", "add-layer-post"]
RESIDUAL = [0.5, -1.0, 0.0, 2.0]


def _fused_forward_name(kind):
    norm = "rms" if "rms" in kind else "layer"
    return f"add_{norm}_norm{'_post' if kind.endswith('-post') else ''}_forward"


def _wrong_fused(monkeypatch, kind, wrong):
    """The fused forward of kind with its (y, h) replaced by wrong(y, h), in the kernel and
    the reference alike (h is None for a Post-Norm kernel, which does not return it)."""
    def kernel(out):
        outputs, cache = out
        if isinstance(outputs, tuple):
            return wrong(*outputs), cache
        return wrong(outputs, None)[0], cache

    name = _fused_forward_name(kind)
    _wrong_gated(monkeypatch, name, kernel, modules=(resnorm,))
    _wrong_gated(monkeypatch, name, lambda out: (*wrong(out[0], out[1]), *out[2:]),
                 modules=(reference,))


def _forward_invariant(e, name):
    return {i.name: i for i in e.forward_invariants}[name]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", FUSED_KINDS)
def test_fused_forward_invariants_hold(kind, dtype):
    e = explain(kind, [X, [3.0, -1.0, 0.5, 2.0]], residual=[RESIDUAL, [1.0, 1.0, 1.0, 1.0]],
                weight=W, alpha=0.5, p=0.25, seed=3, dy=[DY, DY], dtype=dtype)
    scaled, shifted = "y(2x, 2residual) - y(x, residual)", "y(x, residual + c) - y(x, residual)"
    names = {"add-rms": ["rms hn", scaled],
             "add-layer": ["mean hhat", "rms hhat", scaled, shifted]}[kind.removesuffix("-post")]
    prenorm = not kind.endswith("-post")
    assert [i.name for i in e.forward_invariants] == \
        ["h - (residual + alpha d)"] * prenorm + names
    # h against its definition is the formula coded again; the norm's properties are not
    assert [i.name for i in e.forward_invariants if not i.independent] == \
        ["h - (residual + alpha d)"] * prenorm
    assert e.agree and all(i.agree for i in e.forward_invariants)


@pytest.mark.parametrize("kind", FUSED_KINDS)
def test_fused_forward_invariants_catch_a_norm_wrong_like_its_reference(kind, monkeypatch):
    """y off by 0.1% in the kernel and the reference alike: the comparison passes, the
    normalised row's root mean square does not."""
    _wrong_fused(monkeypatch, kind, lambda y, h: (y * 1.001, h))
    e = explain(kind, X, residual=RESIDUAL, p=0.25, seed=3)
    assert all(c.agree for c in e.checks) and not e.agree
    failed = {i.name for i in e.forward_invariants if not i.agree}
    assert failed == {"rms hn" if "rms" in kind else "rms hhat"}


def test_fused_forward_invariants_catch_a_norm_that_is_not_scale_invariant(monkeypatch):
    _wrong_fused(monkeypatch, "add-rms", lambda y, h: (y + 1e-3 * h, h))
    e = explain("add-rms", X, residual=RESIDUAL)
    assert all(c.agree for c in e.checks) and not e.agree
    assert not _forward_invariant(e, "y(2x, 2residual) - y(x, residual)").agree


def test_fused_forward_invariants_catch_a_norm_that_is_not_shift_invariant(monkeypatch):
    # a LayerNorm that keeps a trace of the stream's mean: y moves when residual is shifted
    _wrong_fused(monkeypatch, "add-layer",
                 lambda y, h: (y + 1e-3 * h.mean(axis=1, keepdims=True), h))
    e = explain("add-layer", X, residual=RESIDUAL)
    assert all(c.agree for c in e.checks) and not e.agree
    assert not _forward_invariant(e, "y(x, residual + c) - y(x, residual)").agree


def test_fused_forward_invariants_catch_a_stream_wrong_like_its_reference(monkeypatch):
    _wrong_fused(monkeypatch, "add-layer", lambda y, h: (y, h + 1e-3))
    e = explain("add-layer", X, residual=RESIDUAL, alpha=0.5, p=0.25, seed=3)
    assert all(c.agree for c in e.checks) and not e.agree
    assert {i.name for i in e.forward_invariants if not i.agree} == {"h - (residual + alpha d)"}


def test_dropout_forward_invariants_catch_dropout_wrong_like_its_reference(monkeypatch):
    e = explain("dropout", X, p=0.5, seed=1)
    assert [i.name for i in e.forward_invariants] == ["kept", "dropped", "y(2x) - 2y(x)"]
    assert e.agree and all(i.independent for i in e.forward_invariants)
    # not inverted: the kept elements are not scaled up
    _wrong_gated(monkeypatch, "dropout_forward", lambda out: (out[0] * 0.5, out[1]))
    e = explain("dropout", X, p=0.5, seed=1)
    assert all(c.agree for c in e.checks) and not e.agree
    assert {i.name for i in e.forward_invariants if not i.agree} == {"kept"}


def test_dropout_forward_invariants_catch_a_mask_that_depends_on_the_values(monkeypatch):
    for module in (resnorm, reference):
        real = module.dropout_forward

        def big_dropped(x, *a, _real=real, **kw):
            y, rest = _real(x, *a, **kw)
            return np.where(np.abs(x) > 2.5, 0.0, y).astype(y.dtype), rest
        monkeypatch.setattr(module, "dropout_forward", big_dropped)
    e = explain("dropout", X, p=0.0)
    assert all(c.agree for c in e.checks) and not e.agree
    assert not _forward_invariant(e, "y(2x) - 2y(x)").agree


def test_scaled_forward_invariants_catch_a_skip_path_wrong_like_its_reference(monkeypatch):
    e = explain("scaled", X, F=RESIDUAL, alpha=0.5)
    assert [i.name for i in e.forward_invariants] == [
        "h(x, 0) - x", "h(x, 2F) - x - 2(h - x)", "h(2x, 2F) - 2h"] and e.agree
    _wrong_gated(monkeypatch, "scaled_residual_forward", lambda out: (out[0] + 1e-3, out[1]),
                 modules=(resnorm,))
    _wrong_gated(monkeypatch, "scaled_residual_forward", lambda h: h + 1e-3,
                 modules=(reference,))
    e = explain("scaled", X, F=RESIDUAL, alpha=0.5)
    assert all(c.agree for c in e.checks) and not e.agree
    # an offset is neither the identity at F = 0, nor linear, nor scaled with the inputs
    assert not any(i.agree for i in e.forward_invariants)


def test_gated_forward_invariants_catch_a_gate_that_is_not_a_sigmoid(monkeypatch):
    """sigmoid(g + 0.5) in the kernel and the reference alike: h is still x plus a gate
    times F, but the gate and its mirror no longer add up to 1."""
    for module in (resnorm, reference):
        real = module.gated_residual_forward
        monkeypatch.setattr(module, "gated_residual_forward",
                            lambda x, F, g, _real=real: _real(x, F, g + 0.5))
    e = explain("gated", X, F=RESIDUAL, g=Z)
    assert all(c.agree for c in e.checks) and not e.agree
    assert {i.name for i in e.forward_invariants if not i.agree} == {"h(g) + h(-g) - 2x - F"}


ZERO_AND_CONSTANT_ROWS = [[0.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]]


@pytest.mark.parametrize("kind, extra, dtype", [
    (kind, extra, dtype) for kind, extra in [
        *[(kind, {"residual": residual, **p}) for kind in FUSED_KINDS
          for residual, p in [(ZERO_AND_CONSTANT_ROWS, {}), (ZERO_AND_CONSTANT_ROWS, {"p": 0.25}),
                              ([[0.0] * 4, [-5.0] * 4], {})]],
        ("dropout", {"p": 0.5}), ("dropout", {"p": 0.5, "training": False}),
        ("scaled", {"F": ZERO_AND_CONSTANT_ROWS, "alpha": 0.5}),
        ("gated", {"F": ZERO_AND_CONSTANT_ROWS, "g": Z})]
    for dtype in ["float64", "float32", "float16"]
    if dtype != "float16" or kind not in FUSED_KINDS])     # the fused kinds: 32 and 64 bits
def test_forward_invariants_of_zero_and_constant_rows_agree(kind, extra, dtype):
    """No false DISAGREE: a zero row, a constant one, and (the fused kinds, with
    residual = -x) a stream h that is 0 though x and residual are not."""
    dy = {} if kind in ("scaled", "gated") else {"dy": [DY, DY]}
    dh = {"dh": [DY, DY]} if kind in ("scaled", "gated") else {}
    e = explain(kind, ZERO_AND_CONSTANT_ROWS, dtype=dtype, **extra, **dy, **dh)
    assert e.forward_invariants
    assert e.agree, [c for c in (*e.checks, *e.forward_invariants, *e.gradient_checks,
                                 *e.jacobians, *e.invariants) if not c.agree]


def test_every_kind_prints_whether_each_forward_invariant_is_independent(capsys):
    runs = {"rms": [], "layer": [], "add-rms": ["--residual=0.5,-1,0,2"],
            "add-layer": ["--residual=0.5,-1,0,2", "--p", "0.25"],
            "add-rms-post": ["--residual=0.5,-1,0,2"],
            "add-layer-post": ["--residual=0.5,-1,0,2", "--alpha", "0.5"],
            "dropout": ["--p", "0.5"], "scaled": ["--F", "1,1,2,2", "--alpha", "0.5"],
            "gated": ["--F", "1,1,2,2", "--g", "0,1,2,3"], "gated-rms": ["--gate", "0,1,2,3"]}
    from resnorm.explain import KINDS
    assert sorted(runs) == sorted(KINDS)
    for kind, args in runs.items():
        assert main(["explain", kind, "--x", "1,2,3,4", *args]) == 0
        out = capsys.readouterr().out
        block = out.split("invariants of the forward: ", 1)[1].split("\n\n", 1)[0]
        heads = [line for line in block.splitlines()[1:] if not line.startswith("    ")]
        assert heads and all("independent of the kernel's formula]" in h for h in heads), kind
        said = [h for h in heads if "[NOT independent" in h]
        assert len(said) == (kind in ("add-rms", "add-layer")), kind
