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
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

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
    """One named value of an explained computation (an element of `Explanation.steps`).

    Parameters
    ----------
    name : str
        The value's name, e.g. ``"rstd"``.
    value : ndarray
        The value: shape (N, D) per element, (N,) per row, (D,) per column, or 0-d.
    per : {"element", "row", "column", "scalar"}
        What one value belongs to.
    source : {"input", "reference", "kernel"}
        Where the value comes from: an input, float64 NumPy (as `resnorm.reference`
        computes it), or the compiled kernels.
    phase : {"input", "forward", "backward"}
        The part of the computation it belongs to.
    formula : str
        The general form, e.g. ``"y_i = x_i * rstd * w_i"``.
    expr : str, default ""
        The right-hand side with ``{operand}`` slots naming earlier steps (used to print
        every element with its numbers); for a reduction, the summand.
    reduce : {"", "sum", "mean"}, default ""
        The reduction over the row (or over rows, for a column), if any.
    note : str, default ""
        A short remark printed with the step.

    Examples
    --------
    >>> import resnorm
    >>> step = resnorm.explain("rms", [1, 2, 3, 4]).step("y")
    >>> step.formula, step.per, step.source, step.phase
    ('y_i = x_i * rstd', 'element', 'kernel', 'forward')
    """
    name: str
    value: NDArray[np.floating]
    per: str
    source: str
    phase: str
    formula: str
    expr: str = ""
    reduce: str = ""
    note: str = ""


@dataclass(frozen=True)
class Check:
    """A kernel output against its float64 reference twin (in `Explanation.checks`).

    Parameters
    ----------
    name : str
        The output's step name.
    max_abs_diff : float
        max |kernel - reference| over the output.
    tolerance : float
        ``128 * eps(dtype) * max(1, max |reference|)``: a few rounding errors per
        operation on a short row.

    Examples
    --------
    >>> import resnorm
    >>> check = resnorm.explain("layer", [1, 2, 3, 4]).checks[0]
    >>> check.name, check.agree
    ('y', True)
    """
    name: str
    max_abs_diff: float
    tolerance: float

    @property
    def agree(self) -> bool:
        """True when max_abs_diff <= tolerance."""
        return self.max_abs_diff <= self.tolerance


@dataclass(frozen=True)
class Explanation:
    """Every step of one explained computation, as `explain` returns it.

    ``e[name]`` is the value of the step called name; ``print(e)`` renders every step
    element by element (the text of ``python -m resnorm explain``).

    Parameters
    ----------
    kind : {"rms", "layer", "add-rms", "dropout"}
        What was explained.
    dtype : numpy.dtype
        float32 or float64: the dtype the kernels ran in.
    eps : float or None
        The eps used (None for dropout).
    steps : tuple of Step
        Inputs, reference intermediates and kernel outputs, in computation order.
    checks : tuple of Check
        Every kernel output against its reference twin.

    Examples
    --------
    >>> import resnorm
    >>> e = resnorm.explain("rms", [1, 2, 3, 4], dy=[1, 0, 0, 0])
    >>> e.names
    ['x', 'eps', 'D', 'dy', 'squares', 'sum_sq', 'ms', 'rstd', 'xn', 'y', 'g', 'g_xn', 'm', 'dx']
    >>> e["rstd"]
    array([0.36514835])
    >>> e.agree
    True
    >>> str(e).splitlines()[0]
    'RMSNorm (float64), 1 row of D = 4, eps = 1e-06'
    """
    kind: str
    dtype: np.dtype
    eps: float | None           # None for dropout
    steps: tuple[Step, ...]
    checks: tuple[Check, ...]

    @property
    def agree(self) -> bool:
        """True when every kernel output matches the reference within tolerance."""
        return all(c.agree for c in self.checks)

    @property
    def names(self) -> list[str]:
        """The names of the steps, in order."""
        return [s.name for s in self.steps]

    def step(self, name: str) -> Step:
        """The step called name.

        Parameters
        ----------
        name : str
            One of `names`.

        Returns
        -------
        Step
            The step.

        Raises
        ------
        KeyError
            If there is no step of that name (the message lists the names).
        """
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step named {name!r}; steps are {self.names}")

    def __getitem__(self, name: str) -> NDArray[np.floating]:
        return self.step(name).value

    def render(self, digits: int | None = None) -> str:
        """The explanation as text: every step, element by element, with its numbers.

        Parameters
        ----------
        digits : int, optional
            Significant digits of the numbers (default 8 for float32, 10 for float64).

        Returns
        -------
        str
            The text ``print(e)`` shows.
        """
        from ._explain_text import render
        return render(self, digits)

    def __str__(self) -> str:
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
class _Inputs:
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
    return _Inputs(
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


def explain(kind: Literal["rms", "layer", "add-rms", "dropout"], x: ArrayLike,
            weight: ArrayLike | None = None, bias: ArrayLike | None = None,
            eps: float | None = None, dy: ArrayLike | None = None, *,
            dtype: DTypeLike | None = None, residual: ArrayLike | None = None,
            dh: ArrayLike | None = None, alpha: float | None = None, p: float | None = None,
            seed: int | None = None, training: bool | None = None) -> Explanation:
    """Runs one kernel on a small input and returns every step of its computation.

    The outputs are the compiled kernels' own numbers; the intermediate values are
    computed in float64 NumPy as `resnorm.reference` computes them, and every kernel
    output is checked against its reference twin.

    Parameters
    ----------
    kind : {"rms", "layer", "add-rms", "dropout"}
        RMSNorm, LayerNorm, the fused Pre-Norm add (``h = residual + alpha * dropout(x)``,
        ``y = RMSNorm(h)``) or inverted dropout.
    x : array_like, shape (D,) or (N, D)
        One row or a few rows of real numbers.
    weight : array_like, shape (D,), optional
        The per-channel gain (not for "dropout").
    bias : array_like, shape (D,), optional
        The per-channel bias ("layer" only).
    eps : float, optional
        Default: the library's (1e-6 for "rms" and "add-rms", 1e-5 for "layer").
    dy : array_like, optional
        The gradient arriving at y (x's shape): explains backward too.
    dtype : {numpy.float32, numpy.float64}, optional
        Every input is converted to it; default x's float dtype, else float64.
    residual : array_like, optional
        "add-rms" only, required: the stream x is added to (x's shape).
    dh : array_like, optional
        "add-rms" only: the gradient arriving along the stream h (default 0; needs dy).
    alpha : float, optional
        "add-rms" only: the residual scale (default 1).
    p : float, optional
        "add-rms" and "dropout": the drop probability (required for "dropout", default 0
        for "add-rms").
    seed : int, optional
        "add-rms" and "dropout": the mask seed (default 0).
    training : bool, optional
        "add-rms" and "dropout": default True; False makes dropout the identity.

    Returns
    -------
    Explanation
        ``.steps`` (named values: inputs, reference intermediates, kernel outputs),
        ``.checks`` and ``.agree``; ``e["rstd"]`` is a step's value, ``print(e)`` renders
        it.  Values are per row even for one row: (N, D) per element, (N,) per row.

    Raises
    ------
    TypeError
        If kind is not a str, an input does not hold real numbers, dtype is not float32
        or float64, or alpha is not a real number.
    ValueError
        If kind is unknown, an argument is given that the kind does not use, a required
        one is missing, or a shape, eps, p or seed is out of range.

    Examples
    --------
    >>> import resnorm
    >>> e = resnorm.explain("rms", [1, 2, 3, 4], dy=[1, 0, 0, 0])
    >>> e["y"]
    array([[0.36514835, 0.73029669, 1.09544504, 1.46059339]])
    >>> e["dx"]
    array([[ 0.35297674, -0.02434322, -0.03651483, -0.04868644]])
    >>> e.agree
    True
    """
    given = {"weight": weight, "bias": bias, "eps": eps, "residual": residual, "dh": dh,
             "alpha": alpha, "p": p, "seed": seed, "training": training}
    inp = _inputs(kind, x, dy, dtype, given)
    t = _Trace()
    comparisons = _explain_steps.BUILDERS[kind](t, inp)
    checks = tuple(_check(name, k, r, inp.dtype) for name, k, r in comparisons)
    return Explanation(kind, inp.dtype, inp.eps, tuple(t.steps), checks)
