"""Explain mode: one kernel on a small input, step by step, as data and as text.

``resnorm.explain("rms", [1, 2, 3, 4], dy=[1, 0, 0, 0])`` runs the compiled kernels
(forward, and backward when ``dy`` is given) and records every step of the computation:

* the outputs (y, rstd, mean, dx, dweight, dbias) are the numbers the compiled kernels
  returned (``source == "kernel"``);
* the intermediate values (squares, centred values, the row reductions of backward...)
  are computed in float64 NumPy exactly as ``resnorm.reference`` computes them, from the
  inputs and the reference's own row statistics, never from kernel outputs
  (``source == "reference"``);
* each kernel output is compared with its ``resnorm.reference`` twin; the result says
  whether they agree (max |difference| against a tolerance scaled to the dtype).

``print(explanation)`` renders the steps element by element (``python -m resnorm explain``
prints the same text).  The page docs/explain.md walks through an example.
"""
from dataclasses import dataclass

import numpy as np

from . import _checks, norms, reference

KINDS = ("rms", "layer")
KIND_TITLES = {"rms": "RMSNorm", "layer": "LayerNorm"}
DEFAULT_EPS = {"rms": 1e-6, "layer": 1e-5}   # the library's defaults for each norm

# Kernel and reference agree when every max |difference| <= TOLERANCE_ULPS * eps(dtype) *
# max(1, max |reference value|): a few rounding errors per operation on a short row.
TOLERANCE_ULPS = 128


@dataclass(frozen=True)
class Step:
    """One named value of the computation.

    per: what one value belongs to: "element" (shape (N, D)), "row" (N,), "column" (D,) or
    "scalar".  source: "input", "reference" (float64 NumPy) or "kernel" (compiled).
    formula: the general form, e.g. "y_i = x_i * rstd * w_i".  expr: the right-hand side
    with {operand} slots naming earlier steps (used to print each element with its numbers);
    for a reduction (reduce = "sum" or "mean") expr is the summand.
    """
    name: str
    value: np.ndarray
    per: str
    source: str
    phase: str
    formula: str
    expr: str = ""
    reduce: str = ""
    note: str = ""


@dataclass(frozen=True)
class Check:
    """A kernel output against its float64 reference twin."""
    name: str
    max_abs_diff: float
    tolerance: float

    @property
    def agree(self):
        return self.max_abs_diff <= self.tolerance


@dataclass(frozen=True)
class Explanation:
    kind: str
    dtype: np.dtype
    eps: float
    steps: tuple
    checks: tuple

    @property
    def agree(self):
        """True when every kernel output matches the reference within tolerance."""
        return all(c.agree for c in self.checks)

    @property
    def names(self):
        return [s.name for s in self.steps]

    def step(self, name):
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step named {name!r}; steps are {self.names}")

    def __getitem__(self, name):
        return self.step(name).value

    def render(self, digits=None):
        from ._explain_text import render
        return render(self, digits)

    def __str__(self):
        return self.render()


# --------------------------------------------------------------------------- building

class _Trace:
    """Collects steps; writes each formula from the kinds of the operands it names."""

    SYMBOL = {"element": "{}_i", "column": "{}_i", "row": "{}", "scalar": "{}"}

    def __init__(self):
        self.steps = []
        self.per = {}

    def add(self, name, value, per, source, phase, expr="", reduce="", note=""):
        self.per[name] = per
        rhs = self.symbolic(expr)
        if reduce:
            over = "rows" if per == "column" else "i"
            rhs = f"{reduce}_{over} {rhs}"
        lhs = self.SYMBOL[per].format(name)
        formula = f"{lhs} = {rhs}" if rhs else lhs
        self.steps.append(Step(name, np.asarray(value), per, source, phase, formula, expr,
                               reduce, note))

    def symbolic(self, expr):
        return expr.format(**{n: self.SYMBOL[p].format(n) for n, p in self.per.items()})


def _as_float(a, name, dtype):
    """a (array-like of real numbers) in the requested dtype; None stays None."""
    if a is None:
        return None
    arr = np.asarray(a)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr.astype(dtype, copy=False)


def _inputs(kind, x, weight, bias, dy, eps, dtype):
    """Checked inputs as 2-D rows (N, D) of one float dtype."""
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, one of {KINDS}, got {type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if dtype is None:
        dtype = x.dtype if isinstance(x, np.ndarray) and x.dtype.kind == "f" else np.float64
    dtype = np.dtype(dtype)
    if dtype not in _checks.FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    x = _checks.float_array(_as_float(x, "x", dtype), "x")
    if x.ndim > 2:
        raise ValueError(f"x must be one row (D,) or a few rows (N, D), got shape {x.shape}")
    if kind == "rms" and bias is not None:
        raise ValueError("bias is not part of RMSNorm; pass bias only with kind='layer'")
    eps = DEFAULT_EPS[kind] if eps is None else _checks.eps_value(eps)
    rows = x.reshape(-1, x.shape[-1])
    w, b = _as_float(weight, "weight", dtype), _as_float(bias, "bias", dtype)
    dy = _as_float(dy, "dy", dtype)
    if dy is not None:
        dy = _checks.like_array(dy, "dy", x.shape, dtype).reshape(rows.shape)
    return rows, w, b, dy, eps, dtype


def _check(name, kernel_value, reference_value, dtype):
    ref = np.asarray(reference_value, dtype=np.float64)
    diff = float(np.max(np.abs(np.asarray(kernel_value, dtype=np.float64) - ref)))
    scale = max(1.0, float(np.max(np.abs(ref))))
    return Check(name, diff, TOLERANCE_ULPS * float(np.finfo(dtype).eps) * scale)


def _add_inputs(t, x, w, b, dy, eps):
    t.add("x", x, "element", "input", "input")
    if w is not None:
        t.add("w", w, "column", "input", "input", note="weight")
    if b is not None:
        t.add("b", b, "column", "input", "input", note="bias")
    t.add("eps", eps, "scalar", "input", "input")
    t.add("D", x.shape[1], "scalar", "input", "input", note="row length")
    if dy is not None:
        t.add("dy", dy, "element", "input", "input", note="gradient arriving at y")


def _explain_rms(t, x, w, dy, eps, dtype):
    x64 = x.astype(np.float64)
    y, cache = norms.rms_norm_forward(x, w, eps)
    y_ref, rstd_ref = reference.rms_norm_forward(x, w, eps)
    checks = [_check("y", y, y_ref, dtype), _check("rstd", cache.rstd, rstd_ref, dtype)]

    squares = x64 * x64
    sum_sq = squares.sum(axis=1)
    xn = x64 * rstd_ref[:, None]
    t.add("squares", squares, "element", "reference", "forward", "{x}^2")
    t.add("sum_sq", sum_sq, "row", "reference", "forward", "{squares}", "sum",
          note="the one row reduction (the kernel accumulates it in double)")
    t.add("ms", sum_sq / x.shape[1], "row", "reference", "forward", "{sum_sq} / {D}",
          note="mean square")
    t.add("rstd", cache.rstd, "row", "kernel", "forward", "1 / sqrt({ms} + {eps})",
          note="cached for backward (float64)")
    t.add("xn", xn, "element", "reference", "forward", "{x} * {rstd}",
          note="the normalised row: root mean square 1")
    t.add("y", y, "element", "kernel", "forward",
          "{x} * {rstd}" if w is None else "{x} * {rstd} * {w}")
    if dy is None:
        return checks

    dx, dw = norms.rms_norm_backward(dy, cache)
    dx_ref, dw_ref = reference.rms_norm_backward(dy, x, w, rstd_ref)
    checks.append(_check("dx", dx, dx_ref, dtype))
    dy64 = dy.astype(np.float64)
    g = dy64 if w is None else dy64 * w
    t.add("g", g, "element", "reference", "backward", "{dy}" if w is None else "{dy} * {w}",
          note="the gradient reaching xn")
    t.add("g_xn", g * xn, "element", "reference", "backward", "{g} * {xn}")
    m = (g * xn).mean(axis=1)
    t.add("m", m, "row", "reference", "backward", "{g_xn}", "mean",
          note="the one row reduction of backward")
    t.add("dx", dx, "element", "kernel", "backward", "{rstd} * ({g} - {xn} * {m})")
    if w is not None:
        checks.append(_check("dw", dw, dw_ref, dtype))
        t.add("dw", dw, "column", "kernel", "backward", "{dy} * {xn}", "sum",
              note="summed over rows in fixed row blocks")
    return checks


def _explain_layer(t, x, w, b, dy, eps, dtype):
    x64 = x.astype(np.float64)
    d = x.shape[1]
    y, cache = norms.layer_norm_forward(x, w, b, eps)
    y_ref, mean_ref, rstd_ref = reference.layer_norm_forward(x, w, b, eps)
    checks = [_check("y", y, y_ref, dtype), _check("mean", cache.mean, mean_ref, dtype),
              _check("rstd", cache.rstd, rstd_ref, dtype)]

    t.add("sum_x", x64.sum(axis=1), "row", "reference", "forward", "{x}", "sum",
          note="reduction 1")
    t.add("mean", cache.mean, "row", "kernel", "forward", "{sum_x} / {D}",
          note="cached for backward (float64)")
    centred = x64 - mean_ref[:, None]
    t.add("centred", centred, "element", "reference", "forward", "{x} - {mean}")
    t.add("sq_dev", centred * centred, "element", "reference", "forward", "{centred}^2")
    var = (centred * centred).mean(axis=1)
    t.add("var", var, "row", "reference", "forward", "{sq_dev}", "mean",
          note="reduction 2: biased variance (divide by D), two-pass")
    t.add("rstd", cache.rstd, "row", "kernel", "forward", "1 / sqrt({var} + {eps})",
          note="cached for backward (float64)")
    xhat = centred * rstd_ref[:, None]
    t.add("xhat", xhat, "element", "reference", "forward", "{centred} * {rstd}",
          note="mean 0, variance 1 (up to eps)")
    expr = "{xhat}" + ("" if w is None else " * {w}") + ("" if b is None else " + {b}")
    t.add("y", y, "element", "kernel", "forward", expr)
    if dy is None:
        return checks

    dx, dw, db = norms.layer_norm_backward(dy, cache)
    dx_ref, dw_ref, db_ref = reference.layer_norm_backward(dy, x, w, mean_ref, rstd_ref)
    checks.append(_check("dx", dx, dx_ref, dtype))
    dy64 = dy.astype(np.float64)
    g = dy64 if w is None else dy64 * w
    t.add("g", g, "element", "reference", "backward", "{dy}" if w is None else "{dy} * {w}",
          note="the gradient reaching xhat")
    t.add("mean_g", g.mean(axis=1), "row", "reference", "backward", "{g}", "mean",
          note="backward reduction 1")
    t.add("g_xhat", g * xhat, "element", "reference", "backward", "{g} * {xhat}")
    t.add("mean_g_xhat", (g * xhat).mean(axis=1), "row", "reference", "backward", "{g_xhat}",
          "mean", note="backward reduction 2 (computed in the same pass as reduction 1)")
    t.add("dx", dx, "element", "kernel", "backward",
          "{rstd} * ({g} - {mean_g} - {xhat} * {mean_g_xhat})")
    if w is not None:
        checks.append(_check("dw", dw, dw_ref, dtype))
        t.add("dw", dw, "column", "kernel", "backward", "{dy} * {xhat}", "sum")
    if b is not None:
        checks.append(_check("db", db, db_ref, dtype))
        t.add("db", db, "column", "kernel", "backward", "{dy}", "sum")
    return checks


def explain(kind, x, weight=None, bias=None, eps=None, dy=None, *, dtype=None):
    """Runs one norm's compiled kernels on a small input and returns every step.

    kind: "rms" (RMSNorm) or "layer" (LayerNorm).  x: one row (D,) or a few rows (N, D)
    of real numbers.  weight, bias: (D,) or None (bias only for "layer").  eps: None for
    the library default (rms 1e-6, layer 1e-5).  dy: gradient of y (same shape as x) to
    also explain backward.  dtype: float32 or float64 (None: x's float dtype, else float64);
    every input is converted to it.

    Returns an Explanation: ``.steps`` (named values: inputs, reference intermediates,
    kernel outputs), ``.checks`` (kernel vs resnorm.reference, max |difference|) and
    ``.agree``; ``e["rstd"]`` gives a step's value; ``print(e)`` renders it.  Values are
    per row: an (N, D) array per element, (N,) per row statistic, even for one row.
    """
    rows, w, b, dy, eps, dtype = _inputs(kind, x, weight, bias, dy, eps, dtype)
    t = _Trace()
    _add_inputs(t, rows, w, b, dy, eps)
    if kind == "rms":
        checks = _explain_rms(t, rows, w, dy, eps, dtype)
    else:
        checks = _explain_layer(t, rows, w, b, dy, eps, dtype)
    return Explanation(kind, dtype, eps, tuple(t.steps), tuple(checks))
