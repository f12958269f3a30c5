"""Explain mode: one kernel on a small input, step by step, as data and as text.

``resnorm.explain("rms", [1, 2, 3, 4], dy=[1, 0, 0, 0])`` runs the compiled kernels
(forward, and backward when ``dy`` is given) and records every step of the computation.
Kinds: "rms" (RMSNorm), "layer" (LayerNorm), "add-rms" (h = residual + alpha *
dropout(x), y = RMSNorm(h): the fused Pre-Norm add) and "dropout" (inverted dropout).

* the outputs (y, h, rstd, mean, the keep-mask, dx, dresidual, dweight, dbias) are the
  numbers the compiled kernels returned (``source == "kernel"``);
* the intermediate values (squares, centred values, the row reductions of backward...)
  are computed in float64 NumPy exactly as ``resnorm.reference`` computes them, from the
  inputs and the reference's own row statistics, never from kernel outputs
  (``source == "reference"``);
* each kernel output is compared with its ``resnorm.reference`` twin; the result says
  whether they agree (max |difference| against a tolerance scaled to the dtype).

``print(explanation)`` renders the steps element by element (``python -m resnorm explain``
prints the same text).  The page docs/explain.md walks through an example.
"""
import numbers
from dataclasses import dataclass

import numpy as np

from . import _checks, _explain_steps

KINDS = ("rms", "layer", "add-rms", "dropout")
KIND_TITLES = {"rms": "RMSNorm", "layer": "LayerNorm",
               "add-rms": "Residual add + RMSNorm (Pre-Norm)", "dropout": "Inverted dropout"}
DEFAULT_EPS = {"rms": 1e-6, "layer": 1e-5, "add-rms": 1e-6}   # the library's defaults

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
    eps: float | None           # None for dropout
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
        assert name not in self.per, f"step {name!r} recorded twice"
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


# The arguments each kind takes besides x, dy and dtype (anything else must stay None).
ARGUMENTS = {"rms": {"weight", "eps"}, "layer": {"weight", "bias", "eps"},
             "add-rms": {"residual", "weight", "eps", "alpha", "p", "seed", "training", "dh"},
             "dropout": {"p", "seed", "training"}}


@dataclass(frozen=True)
class Inputs:
    """Checked inputs: arrays as 2-D rows (N, D) of one float dtype, scalars resolved."""
    kind: str
    dtype: np.dtype
    x: np.ndarray
    residual: np.ndarray | None
    weight: np.ndarray | None
    bias: np.ndarray | None
    dy: np.ndarray | None
    dh: np.ndarray | None
    eps: float | None
    alpha: float
    p: float
    seed: int
    training: bool


def _as_float(a, name, dtype):
    """a (array-like of real numbers) in the requested dtype; None stays None."""
    if a is None:
        return None
    arr = np.asarray(a)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr.astype(dtype, copy=False)


def _inputs(kind, x, dy, dtype, given):
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, one of {KINDS}, got {type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    for name, value in given.items():
        if value is not None and name not in ARGUMENTS[kind]:
            users = [k for k in KINDS if name in ARGUMENTS[k]]
            raise ValueError(f"{name} is used only with kind {' or '.join(map(repr, users))}, "
                             f"not with kind={kind!r}")
    if dtype is None:
        dtype = x.dtype if isinstance(x, np.ndarray) and x.dtype.kind == "f" else np.float64
    dtype = np.dtype(dtype)
    if dtype not in _checks.FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    x = _checks.float_array(_as_float(x, "x", dtype), "x")
    if x.ndim > 2:
        raise ValueError(f"x must be one row (D,) or a few rows (N, D), got shape {x.shape}")

    def partner(a, name):
        """An array of x's shape (residual, dy, dh), as rows."""
        a = _as_float(a, name, dtype)
        if a is None:
            return None
        return _checks.like_array(a, name, x.shape, dtype).reshape(-1, x.shape[-1])

    if kind == "add-rms" and given["residual"] is None:
        raise ValueError("kind='add-rms' needs residual (the stream x is added to)")
    if kind == "dropout" and given["p"] is None:
        raise ValueError("kind='dropout' needs p (the drop probability)")
    if given["dh"] is not None and dy is None:
        raise ValueError("dh (the gradient along the residual stream) needs dy as well")
    alpha = 1.0 if given["alpha"] is None else given["alpha"]
    if isinstance(alpha, (bool, np.bool_, np.ndarray)) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a real number (explain shows a fixed alpha), "
                        f"got {type(alpha).__name__}")
    return Inputs(
        kind=kind, dtype=dtype, x=x.reshape(-1, x.shape[-1]),
        residual=partner(given["residual"], "residual"),
        weight=_as_float(given["weight"], "weight", dtype),
        bias=_as_float(given["bias"], "bias", dtype),
        dy=partner(dy, "dy"), dh=partner(given["dh"], "dh"),
        eps=None if kind == "dropout" else (DEFAULT_EPS[kind] if given["eps"] is None
                                            else _checks.eps_value(given["eps"])),
        alpha=float(alpha),
        p=0.0 if given["p"] is None else _checks.probability(given["p"]),
        seed=0 if given["seed"] is None else _checks.seed_value(given["seed"]),
        training=True if given["training"] is None else _checks.flag(given["training"], "training"))


def _check(name, kernel_value, reference_value, dtype):
    ref = np.asarray(reference_value, dtype=np.float64)
    diff = float(np.max(np.abs(np.asarray(kernel_value, dtype=np.float64) - ref)))
    scale = max(1.0, float(np.max(np.abs(ref))))
    return Check(name, diff, TOLERANCE_ULPS * float(np.finfo(dtype).eps) * scale)


def explain(kind, x, weight=None, bias=None, eps=None, dy=None, *, dtype=None, residual=None,
            dh=None, alpha=None, p=None, seed=None, training=None):
    """Runs one kernel on a small input and returns every step of its computation.

    kind: "rms" (RMSNorm), "layer" (LayerNorm), "add-rms" (h = residual + alpha *
    dropout(x), y = RMSNorm(h): the fused Pre-Norm add) or "dropout" (inverted dropout).
    x: one row (D,) or a few rows (N, D) of real numbers.  weight, bias: (D,) or None
    (bias only for "layer"; neither for "dropout").  eps: None for the library default
    (1e-6 for RMSNorm, 1e-5 for LayerNorm).  dy: gradient of y (x's shape) to explain
    backward too.  dtype: float32 or float64 (None: x's float dtype, else float64); every
    input is converted to it.
    add-rms only: residual (x's shape, required), alpha (a real number, default 1), dh (the
    gradient arriving along the stream h; None: 0).  add-rms and dropout: p (drop
    probability; required for "dropout", default 0 for "add-rms"), seed (default 0),
    training (default True; False: dropout is the identity).

    Returns an Explanation: ``.steps`` (named values: inputs, reference intermediates,
    kernel outputs), ``.checks`` (kernel vs resnorm.reference, max |difference|) and
    ``.agree``; ``e["rstd"]`` gives a step's value; ``print(e)`` renders it.  Values are
    per row: an (N, D) array per element, (N,) per row statistic, even for one row.
    """
    given = {"weight": weight, "bias": bias, "eps": eps, "residual": residual, "dh": dh,
             "alpha": alpha, "p": p, "seed": seed, "training": training}
    inp = _inputs(kind, x, dy, dtype, given)
    t = _Trace()
    comparisons = _explain_steps.BUILDERS[kind](t, inp)
    checks = tuple(_check(name, k, r, inp.dtype) for name, k, r in comparisons)
    return Explanation(kind, inp.dtype, inp.eps, tuple(t.steps), checks)
