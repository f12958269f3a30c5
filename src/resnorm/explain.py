"""Explain mode: one kernel on a small input, step by step, as data and as text.

``resnorm.explain("rms", [1, 2, 3, 4], dy=[1, 0, 0, 0])`` runs the compiled kernels
(forward, and backward when a gradient is given) and records every step of the
computation.  Kinds: "rms" (RMSNorm), "layer" (LayerNorm), the fused residual add + norm
"add-rms" and "add-layer" (Pre-Norm: h = residual + alpha * dropout(x), y = norm(h)) and
"add-rms-post" and "add-layer-post" (Post-Norm: y = norm(residual + alpha * dropout(x))),
"dropout" (inverted dropout), "scaled" (h = x + alpha * F), "gated"
(h = x + sigmoid(g) * F) and "gated-rms" (the gated RMSNorm of hybrid Mamba models:
y = rms_norm(x * silu(gate)) * w, or with norm_before_gate y = rms_norm(x) * w * silu(gate),
per group of group_size elements).  alpha is fixed (a real number), a learnable scalar (a
0-d array) or learnable per channel (D values: LayerScale); a learnable alpha gets its
dalpha.

* the outputs (y, h, rstd, mean, the keep-mask, and every gradient) are the numbers the
  compiled kernels returned (``source == "kernel"``);
* the intermediate values are computed in float64 NumPy exactly as ``resnorm.reference``
  computes them, from the inputs and the reference's own row statistics, never from kernel
  outputs (``source == "reference"``);
* each kernel output is compared with its ``resnorm.reference`` twin (``.checks``);
* each gradient is also compared with central finite differences of the forward kernel run
  in float64 (``.gradient_checks``): an independent check, which needs no backward formula;
* the properties any correct output has, checked on the kernel's outputs
  (``.forward_invariants``: a norm's y does not change when its input is scaled, nor,
  LayerNorm's, shifted; its normalised row has root mean square 1 up to eps; dropout keeps
  or zeroes each element; a residual add is linear in its branch), most of them
  independent of the kernel's formula (``Invariant.independent``);
* for the norms, with a gradient: the Jacobian dy/dx of each short row in closed form,
  checked by finite differences (``.jacobians``), and the identities the gradient obeys
  (``.invariants``: LayerNorm sum dx = 0 and dx . xhat = 0, RMSNorm dx . x = 0, up to eps;
  for "gated-rms" per group);
* what the forward's cache keeps for backward, and why (``.cache``, ``.cache_why``);
* with dropout: how each element index becomes a Philox counter and output word
  (``.philox``).

``print(explanation)`` renders all of it (``python -m resnorm explain`` prints the same
text).  The page docs/explain.md walks through examples.
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from . import _explain_steps
from ._docstrings import complete_parameters, parameter_entries

Kind = Literal["rms", "layer", "add-rms", "add-layer", "add-rms-post", "add-layer-post",
               "dropout", "scaled", "gated", "gated-rms"]
KINDS = get_args(Kind)
KIND_TITLES = {"rms": "RMSNorm", "layer": "LayerNorm",
               "add-rms": "Residual add + RMSNorm (Pre-Norm)",
               "add-layer": "Residual add + LayerNorm (Pre-Norm)",
               "add-rms-post": "Residual add + RMSNorm (Post-Norm)",
               "add-layer-post": "Residual add + LayerNorm (Post-Norm)",
               "dropout": "Inverted dropout", "scaled": "Scaled residual",
               "gated": "Gated residual", "gated-rms": "Gated RMSNorm"}
DEFAULT_EPS = {"rms": 1e-6, "layer": 1e-5, "add-rms": 1e-6, "add-layer": 1e-5,
               "add-rms-post": 1e-6, "add-layer-post": 1e-5,
               "gated-rms": 1e-6}   # the library's defaults

# Kernel and reference agree when every max |difference| <= TOLERANCE_ULPS * eps(dtype) *
# max(1, max |reference value|): a few rounding errors per operation on a short row.
TOLERANCE_ULPS = 128
# A 16-bit output is computed in float32 and rounded once: within HALF_TOLERANCE_ULPS unit
# in the last place of its dtype at the largest value (half a unit from the rounding, the
# rest from float32 arithmetic).  The float64 row statistics of a 16-bit run come from
# float32 values: they are held to the float32 rule.
HALF_TOLERANCE_ULPS = 1
# The kinds explained in float16 and bfloat16: one rounding at each output.  (The fused
# kinds are explained in float32 and float64: in 16 bits they are h rounded, then the
# norm of that h, which the rms and layer kinds explain.)
HALF_KINDS = ("rms", "layer", "dropout", "scaled", "gated", "gated-rms")
# Finite differences: central differences of the float64 forward kernel at the steps
# FD_STEP * spread, / 2, ..., / 2^(FD_LEVELS - 1), Richardson-extrapolated (error of order
# step^(2 FD_LEVELS)).  spread is the row's: sqrt(var + eps) or sqrt(ms + eps) for what a norm
# normalises (so a constant or zero row keeps eps's scale, where y bends), the root mean
# square of the row for any other input (1 for a zero row).
FD_STEP = 0.1
FD_LEVELS = 3
# A gradient component agrees with its finite difference when they differ by at most
# FD_RELATIVE of its scale, plus the kernel's rounding at that scale, plus the resolution of
# the finite difference.  The scale is the size of the terms it sums, sum_j |d(loss term j) /
# d value|: the component itself, unless it is (nearly) zero because its terms cancel.
FD_RELATIVE = 1e-6

@dataclass(frozen=True)
class Step:
    """One named value of an explained computation (an element of `Explanation.steps`).

    Parameters
    ----------
    name : str
        The value's name, e.g. ``"rstd"``.
    value : ndarray
        The value: shape (N, D) per element, (N,) per row, (N, G) per group (G groups of
        D / G consecutive elements of each row: "gated-rms"), (D,) per column, or 0-d.
    per : {"element", "row", "group", "column", "scalar"}
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
    >>> step = resnorm.explain("rms", [1, 2, 3, 4]).step("rstd")
    >>> step.formula, step.per, step.source, step.phase
    ('rstd = 1 / sqrt(ms + eps)', 'row', 'kernel', 'forward')
    >>> step.value.round(6), step.note
    (array([0.365148]), 'cached for backward (float64)')
    """
    name: str
    value: NDArray[Any]
    per: str
    source: str
    phase: str
    formula: str
    expr: str = ""
    reduce: str = ""
    note: str = ""


@dataclass(frozen=True)
class Check:
    """A kernel output against its float64 `resnorm.reference` twin (in
    `Explanation.checks`).

    They agree when max_abs_diff <= tolerance, ``TOLERANCE_ULPS * eps(dtype) * max(1,
    max |reference|)``: a few rounding errors per operation on a short row.  ("gated-rms":
    for dx and dgate, max |reference| is raised to the size of the numbers the kernel forms
    them from, ``rstd * (|g| + |un| * mean |g un|)`` times the chain rule's factor, as they
    may be nearly 0 by cancellation.)

    Parameters
    ----------
    name : str
        The name of the step checked, e.g. ``"y"`` or ``"dx"``.
    max_abs_diff : float
        The largest absolute difference between the two sides.
    tolerance : float
        The largest difference that counts as agreement.

    Examples
    --------
    >>> import resnorm
    >>> check = resnorm.explain("layer", [1, 2, 3, 4]).checks[0]
    >>> check.name, check.agree, check.max_abs_diff <= check.tolerance
    ('y', True, True)
    """
    name: str
    max_abs_diff: float
    tolerance: float

    @property
    def agree(self) -> bool:
        """True when max_abs_diff <= tolerance."""
        return self.max_abs_diff <= self.tolerance


# The record classes below document only their own fields; those of Check are filled in.
_check_fields = complete_parameters(parameter_entries(Check.__doc__))


@_check_fields
@dataclass(frozen=True)
class GradientCheck(Check):
    """A kernel gradient against finite differences of the float64 forward kernel, component
    by component (in `Explanation.gradient_checks`).

    The finite differences differentiate the loss `Explanation.gradient_loss`
    (``sum(dy * y)``, plus ``sum(dh * h)`` where h has a gradient): central differences at a
    step scaled to the row's spread, Richardson-extrapolated; no backward formula is
    involved.  Each component is held to its own tolerance, relative to its scale (the size
    of the terms it sums, so a component that is zero because its terms cancel is judged at
    their size, not at its own).

    Parameters
    ----------
    max_abs_diff : float
        The largest |kernel - finite difference| of a component.
    tolerance : float
        The relative tolerance: ``FD_RELATIVE`` plus the kernel's rounding (``TOLERANCE_ULPS *
        eps(dtype)``, or the 16-bit rule), as a fraction of each component's scale.
    wrt : str, default ""
        The input the gradient belongs to, e.g. ``"x"`` for dx.
    kernel : ndarray, optional
        The kernel's gradient (float64).
    finite_difference : ndarray, optional
        Its finite-difference twin, the same shape.
    scale : ndarray, optional
        The scale of each component: ``sum_j |d(loss term j) / d value|``, by the same
        finite differences.
    resolution : ndarray, optional
        The smallest change the finite difference of each component can show: eps(float64)
        times the loss's terms, over the finest step.
    rounding : ndarray, optional
        "rms", "layer" and "gated-rms": the kernel's rounding beyond ``tolerance * scale``,
        per component: its rounding at the size of the numbers it forms the component from
        (a component that the norm makes nearly 0, as in a group with one nonzero element,
        is the difference of numbers of the size rstd * |g|), and half the output dtype's
        smallest subnormal (a 16-bit gradient below it rounds to 0).
    truncation : ndarray, optional
        "rms", "layer" and "gated-rms": the error of the finite difference itself, per
        component, estimated as the difference of its last two Richardson levels (it matters
        where the loss is nearly stationary, as at a gate z where silu'(z) = 0).

    Examples
    --------
    >>> import resnorm
    >>> e = resnorm.explain("rms", [1.0, 2.0, 3.0], weight=[1.0, 0.5, 2.0], dy=[1.0, 0.0, 0.0])
    >>> [(c.name, c.wrt, c.agree) for c in e.gradient_checks]
    [('dx', 'x', True), ('dw', 'w', True)]
    >>> c = e.gradient_checks[0]
    >>> bool((abs(c.kernel - c.finite_difference) < 1e-8 * c.scale).all()), c.worst < 1
    (True, True)
    """
    wrt: str = ""
    kernel: NDArray[np.float64] | None = None
    finite_difference: NDArray[np.float64] | None = None
    scale: NDArray[np.float64] | None = None
    resolution: NDArray[np.float64] | None = None
    rounding: NDArray[np.float64] | None = None
    truncation: NDArray[np.float64] | None = None

    @property
    def allowed(self) -> NDArray[np.float64]:
        """The tolerance of each component: ``tolerance * scale + resolution`` (plus
        rounding and truncation, when given)."""
        allowed = self.tolerance * self.scale + self.resolution
        for extra in (self.rounding, self.truncation):
            if extra is not None:
                allowed = allowed + extra
        return allowed

    @property
    def worst(self) -> float:
        """The largest |kernel - finite difference| / allowed of a component (0 when both
        are exactly equal): at most 1 when the check agrees."""
        diff = np.abs(self.kernel - self.finite_difference)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(diff == 0, 0.0, diff / self.allowed)
        return float(np.max(ratio, initial=0.0))

    @property
    def agree(self) -> bool:
        """True when every component is within its own tolerance."""
        return self.worst <= 1.0


@_check_fields
@dataclass(frozen=True)
class Jacobian(Check):
    """The Jacobian of one row of a norm (in `Explanation.jacobians`): d y / d v with
    v = x, or h for the fused kinds.

    The closed form, from the reference's row statistics, is checked two ways: against
    its finite-difference twin (the finite differences of `GradientCheck`),
    and, as ``J^T dy``, against the kernel's gradient through the norm.

    Parameters
    ----------
    name : str
        ``"J row r"``.
    max_abs_diff : float
        The larger of max_abs_diff_fd and max_abs_diff_backward.
    tolerance : float
        ``FD_RELATIVE * max |J|`` plus the kernel's rounding tolerance.
    row : int, default 0
        The row r.
    of : str, default "y"
        The output differentiated.
    wrt : str, default "x"
        The value it is differentiated by: ``"x"``, or ``"h"`` for the fused kinds.
    formula : str, default ""
        The closed form of element (i, j).
    closed_form : ndarray, optional
        J, shape (D, D), ``J[i, j] = d y_i / d v_j``.
    max_abs_diff_fd : float, default 0.0
        max |J - its finite-difference twin|.
    max_abs_diff_backward : float, default 0.0
        max |J^T dy - the kernel's gradient through the norm|.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> e = resnorm.explain("layer", [1.0, 2.0, 6.0], dy=[1.0, 0.0, 0.0])
    >>> j = e.jacobians[0]
    >>> j.name, j.formula
    ('J row 0', 'J_ij = w_i * rstd * ([i == j] - 1/D - xhat_i * xhat_j / D)')
    >>> bool(np.allclose(j.closed_form.sum(axis=1), 0)), j.agree   # a shift of x: no change
    (True, True)
    """
    row: int = 0
    of: str = "y"
    wrt: str = "x"
    formula: str = ""
    closed_form: NDArray[np.float64] | None = None
    max_abs_diff_fd: float = 0.0
    max_abs_diff_backward: float = 0.0


@dataclass(frozen=True)
class Invariant:
    """An identity a kernel's results obey, per row (or per group of a row): of a norm's
    gradient (in `Explanation.invariants`) or of the forward output (in
    `Explanation.forward_invariants`); the kernel's value against the value exact
    arithmetic gives (0, or a term of eps).  Most hold for any correct kernel of the kind,
    so they check the kernel without its formula (``independent``); the others compare it
    with the formula's definition or another kernel of the library.

    Parameters
    ----------
    name : str
        E.g. ``"sum dx"``.
    formula : str
        What is computed per row, e.g. ``"sum_i dx_i"``.
    value : ndarray
        Its value from the kernel's outputs, one per row (N,), or one per group of each
        row (N, G) for "gated-rms" (float64).
    exact : ndarray
        The value exact arithmetic gives, the same shape.
    note : str
        Why the identity holds.
    tolerance : float
        The largest difference that counts as agreement: the kernel's rounding tolerance,
        as `Check`'s (twice it where two kernel outputs are compared), and for the shift of
        a LayerNorm the effect of rounding x + c; for a value the kernel forms from several
        inputs (h of the fused kinds), the bound on its rounding of them.
    independent : bool, default True
        True when the expectation needs no coding of the kernel's formula (of the forward's,
        for a forward invariant; of the backward's, for a gradient's); False when it is the
        formula's definition coded again, or another kernel of the library.

    Examples
    --------
    >>> import resnorm
    >>> e = resnorm.explain("layer", [1.0, 2.0, 6.0], dy=[1.0, 0.0, 0.0])
    >>> inv = e.invariants[0]
    >>> inv.formula, inv.exact, inv.agree
    ('sum_i dx_i', array([0.]), True)
    >>> inv.note
    'exact: 0; y does not change when a constant is added to x'
    """
    name: str
    formula: str
    value: NDArray[np.float64]
    exact: NDArray[np.float64]
    note: str
    tolerance: float
    independent: bool = True

    @property
    def agree(self) -> bool:
        """True when every row's value is within tolerance of the exact value."""
        return bool(np.all(np.abs(self.value - self.exact) <= self.tolerance))


@dataclass(frozen=True)
class Explanation:
    """Every step of one explained computation and its checks, as `explain` returns it.

    ``e[name]`` is the value of the step called name; ``print(e)`` renders every step
    element by element and every check (the text of ``python -m resnorm explain``).

    Parameters
    ----------
    kind : str
        What was explained: one of `resnorm.explain.KINDS`.
    dtype : numpy.dtype
        float32, float64, float16 or bfloat16: the dtype the kernels ran in.
    eps : float or None
        The norm's eps (None for "dropout", "scaled" and "gated").
    steps : tuple of Step
        Inputs, reference intermediates and kernel outputs, in computation order.
    checks : tuple of Check
        Every kernel output against its reference twin.
    gradient_checks : tuple of GradientCheck, default ()
        Every gradient against finite differences (with a gradient given).
    jacobians : tuple of Jacobian, default ()
        The norm's Jacobian of each row (the norm kinds, with a gradient given).
    invariants : tuple of Invariant, default ()
        The identities the norm's gradient obeys (the norm kinds, with a gradient given).
    forward_invariants : tuple of Invariant, default ()
        The properties the forward output has, whatever its formula (every kind): for a
        norm, xhat's mean 0 (LayerNorm) and root mean square sqrt(s2 / (s2 + eps)),
        y(2x) = y(x) up to eps's effect, LayerNorm's y(x + c) = y(x) (per group for
        "gated-rms"; for the fused kinds of h = residual + alpha * dropout(x), with x and
        residual scaled and residual shifted, and Pre-Norm's h against its definition);
        for "dropout", kept elements scaled by 1 / (1 - p), dropped ones 0 and y(2x) =
        2 y(x); for "scaled" and "gated", h(x, 0) = x, h linear in F and h(2x, 2F) = 2h,
        and "gated"'s h(g) + h(-g) = 2x + F.  ``.independent`` says which need no coding of
        the formula.
    cache : tuple of (str, str), default ()
        (field, what it holds) of the forward's cache.
    cache_why : str, default ""
        Why the cache holds what it holds.
    philox : dict or None, default None
        With dropout: the element index k, Philox counter, output word, key, block and
        uniform u of every element.
    gradient_loss : str, default ""
        The scalar the finite differences differentiate, e.g. ``"sum(dy * y)"``.
    param_dtype : numpy.dtype or None, default None
        float32 when a 16-bit run was given float32 weight or bias (mixed precision: the
        float32 norm of the widened rows, its parameter gradients float32); else None.

    Examples
    --------
    >>> import resnorm
    >>> e = resnorm.explain("rms", [1, 2, 3, 4], dy=[1, 0, 0, 0])
    >>> e.names
    ['x', 'eps', 'D', 'dy', 'squares', 'sum_sq', 'ms', 'rstd', 'xn', 'y', 'g', 'g_xn', 'm', 'dx']
    >>> e["rstd"]
    array([0.36514835])
    >>> e.agree, e.gradient_loss, [i.name for i in e.invariants]
    (True, 'sum(dy * y)', ['dx . x'])
    >>> str(e).splitlines()[0]
    'RMSNorm (float64), 1 row of D = 4, eps = 1e-06'
    """
    kind: str
    dtype: np.dtype
    eps: float | None
    steps: tuple[Step, ...]
    checks: tuple[Check, ...]
    gradient_checks: tuple[GradientCheck, ...] = ()
    jacobians: tuple[Jacobian, ...] = ()
    invariants: tuple[Invariant, ...] = ()
    forward_invariants: tuple[Invariant, ...] = ()
    cache: tuple[tuple[str, str], ...] = ()
    cache_why: str = ""
    philox: dict[str, Any] | None = None
    gradient_loss: str = ""
    param_dtype: np.dtype | None = None

    @property
    def agree(self) -> bool:
        """True when every kernel output matches the reference, every gradient matches
        finite differences, and every Jacobian and invariant holds, within tolerance."""
        return all(c.agree for c in (*self.checks, *self.forward_invariants,
                                     *self.gradient_checks, *self.jacobians, *self.invariants))

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

    def __getitem__(self, name: str) -> NDArray[Any]:
        return self.step(name).value

    def render(self, digits: int | None = None) -> str:
        """The explanation as text: every step, element by element, with its numbers, then
        the cache and every check with its verdict.

        Parameters
        ----------
        digits : int, optional
            Significant digits of the numbers (default 6 for float16 and bfloat16, 8 for
            float32, 10 for float64).

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

    SYMBOL = {"element": "{}_i", "column": "{}_i", "row": "{}", "group": "{}_k",
              "scalar": "{}"}
    OVER = {"column": "rows", "row": "i", "group": "{i in k}", "element": "i",
            "scalar": "rows,i"}

    def __init__(self):
        self.steps = []
        self.per = {}

    def add(self, name, value, per, source, phase, expr="", reduce="", note=""):
        assert name not in self.per, f"step {name!r} recorded twice"
        self.per[name] = per
        rhs = self.symbolic(expr)
        if reduce:
            rhs = f"{reduce}_{self.OVER[per]} {rhs}"
        lhs = self.SYMBOL[per].format(name)
        formula = f"{lhs} = {rhs}" if rhs else lhs
        self.steps.append(Step(name, np.asarray(value), per, source, phase, formula, expr,
                               reduce, note))

    def symbolic(self, expr):
        return expr.format(**{n: self.SYMBOL[p].format(n) for n, p in self.per.items()})


_FUSED = {"residual", "weight", "eps", "alpha", "p", "seed", "training"}
# The arguments each kind takes besides x, dy and dtype (anything else must stay None).
ARGUMENTS = {"rms": {"weight", "eps"}, "layer": {"weight", "bias", "eps"},
             "add-rms": _FUSED | {"dh"}, "add-layer": _FUSED | {"bias", "dh"},
             "add-rms-post": _FUSED, "add-layer-post": _FUSED | {"bias"},
             "dropout": {"p", "seed", "training"}, "scaled": {"F", "alpha", "dh"},
             "gated": {"F", "g", "dh"},
             "gated-rms": {"gate", "weight", "eps", "group_size", "norm_before_gate"}}
REQUIRED = {"add-rms": ("residual", "the stream x is added to"),
            "add-layer": ("residual", "the stream x is added to"),
            "add-rms-post": ("residual", "the stream x is added to"),
            "add-layer-post": ("residual", "the stream x is added to"),
            "dropout": ("p", "the drop probability"),
            "scaled": ("F", "the branch output added to x"),
            "gated": ("F", "the branch output added to x")}
OUTPUT_GRADIENT = {"scaled": "dh", "gated": "dh"}    # kinds whose output is h, not y


@dataclass(frozen=True)
class _Inputs:
    """Arrays as 2-D rows (N, D) of one float dtype (weight and bias: param_dtype); scalars
    as given (the library's functions check them when the builder calls them)."""
    kind: str
    dtype: np.dtype
    param_dtype: np.dtype
    x: np.ndarray
    residual: np.ndarray | None
    weight: np.ndarray | None
    bias: np.ndarray | None
    F: np.ndarray | None
    g: np.ndarray | None
    dy: np.ndarray | None
    dh: np.ndarray | None
    eps: object
    alpha: object               # a real number (fixed) or an array of dtype (learnable)
    p: object
    seed: object
    training: object
    gate: np.ndarray | None = None      # "gated-rms": the gate z, as rows
    group_size: object = None           # "gated-rms": as given (None: D)
    norm_before_gate: object = False    # "gated-rms"


def _as_float(a, name, dtype):
    """a (array-like of real numbers) in the requested dtype; None stays None."""
    if a is None:
        return None
    arr = np.asarray(a)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr.astype(dtype, copy=False)


def _param_dtype(dtype, given):
    """The dtype of weight and bias: float32 when a 16-bit run is given a float32 array for
    either (mixed precision, as the functions take it), else the run's dtype."""
    if _is_half(dtype) and any(isinstance(given[k], np.ndarray)
                               and given[k].dtype == np.float32 for k in ("weight", "bias")):
        return np.dtype(np.float32)
    return dtype


def _alpha(alpha, dtype):
    if alpha is None:
        return 1.0
    if isinstance(alpha, (list, tuple, np.ndarray)):
        return _as_float(alpha, "alpha", dtype)
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a real number (fixed), a 0-d array (learnable scalar) "
                        f"or D values (learnable per channel), got {type(alpha).__name__}")
    return float(alpha)


def _half_dtype(name):
    """np.dtype of "float16" or "bfloat16" (ml_dtypes'), or None for another name."""
    if name == "float16":
        return np.dtype(np.float16)
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("dtype bfloat16 needs ml_dtypes (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    return None


def _run_dtype(kind, x, dtype):
    """The dtype the kernels run in: dtype, else x's (a float array), else float64."""
    if dtype is None:
        floating = isinstance(x, np.ndarray) and (x.dtype.kind == "f"
                                                  or x.dtype.name == "bfloat16")
        dtype = x.dtype if floating else np.float64
    half = _half_dtype(dtype) if isinstance(dtype, str) else None
    try:
        dtype = half or np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be float32, float64, float16 or bfloat16, "
                        f"got {dtype!r}") from None
    if dtype.name in ("float16", "bfloat16"):
        if kind not in HALF_KINDS:
            raise TypeError(f"dtype {dtype.name} is explained for the kinds "
                            f"{', '.join(HALF_KINDS)}, not kind={kind!r}; explain it in "
                            f"float32 or float64")
        return dtype
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"dtype must be float32, float64, float16 or bfloat16, got {dtype}")
    return dtype


def _inputs(kind, x, dy, dtype, given):
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, one of {KINDS}, got {type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    for name, value in given.items():
        if value is not None and name not in ARGUMENTS[kind]:
            users = [repr(k) for k in KINDS if name in ARGUMENTS[k]]
            listed = users[0] if len(users) == 1 else f"{', '.join(users[:-1])} or {users[-1]}"
            raise ValueError(f"{name} is used only with kind {listed}, not with kind={kind!r}")
    if kind in OUTPUT_GRADIENT and dy is not None:
        raise ValueError(f"kind={kind!r} outputs h: give its gradient as dh, not dy")
    if kind in REQUIRED and given[REQUIRED[kind][0]] is None:
        name, what = REQUIRED[kind]
        raise ValueError(f"kind={kind!r} needs {name} ({what})")
    if kind == "gated" and given["g"] is None:
        raise ValueError("kind='gated' needs g (the gate logits)")
    if kind == "scaled" and given["alpha"] is None:
        raise ValueError("kind='scaled' needs alpha (the residual scale)")
    if given.get("dh") is not None and dy is None and kind not in OUTPUT_GRADIENT:
        raise ValueError("dh (the gradient along the residual stream) needs dy as well")
    dtype = _run_dtype(kind, x, dtype)
    x = _as_float(x, "x", dtype)
    if x.ndim == 0 or x.ndim > 2:
        raise ValueError(f"x must be one row (D,) or a few rows (N, D), got shape {x.shape}")
    if x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last axis, got shape {x.shape}")
    d = x.shape[-1]

    def partner(a, name):
        """An array of x's shape (residual, F, dy, dh), as rows."""
        a = _as_float(a, name, dtype)
        if a is None:
            return None
        if a.shape != x.shape:
            raise ValueError(f"{name} must have shape {x.shape}, got {a.shape}")
        return a.reshape(-1, d)

    g = _as_float(given["g"], "g", dtype)
    if g is not None and g.shape not in (x.shape, (d,)):
        raise ValueError(f"g must have the shape of x {x.shape} (one gate per element) or "
                         f"({d},) (per channel), got {g.shape}")
    if g is not None and g.shape != (d,):
        g = g.reshape(-1, d)
    eps = given["eps"]
    pdt = _param_dtype(dtype, given)
    return _Inputs(
        kind=kind, dtype=dtype, param_dtype=pdt, x=x.reshape(-1, d),
        residual=partner(given["residual"], "residual"),
        weight=_as_float(given["weight"], "weight", pdt),
        bias=_as_float(given["bias"], "bias", pdt),
        F=partner(given["F"], "F"), g=g,
        dy=partner(dy, "dy"), dh=partner(given["dh"], "dh"),
        gate=partner(given["gate"], "gate"), group_size=given["group_size"],
        norm_before_gate=(False if given["norm_before_gate"] is None
                          else given["norm_before_gate"]),
        eps=DEFAULT_EPS.get(kind) if eps is None else eps,
        alpha=_alpha(given["alpha"], dtype),
        p=0.0 if given["p"] is None else given["p"],
        seed=0 if given["seed"] is None else given["seed"],
        training=True if given["training"] is None else given["training"])


def _is_half(dtype):
    """True for float16 and bfloat16."""
    return np.dtype(dtype).itemsize == 2


def _eps(dtype):
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return 2.0 ** -7     # 8 significant bits (ml_dtypes.finfo(bfloat16).eps)
    return float(np.finfo(dtype).eps)


def _tolerance(reference_value, dtype):
    scale = max(1.0, float(np.max(np.abs(reference_value), initial=0.0)))
    ulps = HALF_TOLERANCE_ULPS if _is_half(dtype) else TOLERANCE_ULPS
    return ulps * _eps(dtype) * scale


def _rule(value, dtype):
    """The dtype whose rule a kernel value is held to: its own for a 16-bit output, float32
    for the float64 statistics of a 16-bit run, else the run's dtype."""
    if not _is_half(dtype):
        return dtype
    own = np.asarray(value).dtype
    return own if _is_half(own) else np.dtype(np.float32)


def tolerance_rule(dtype: DTypeLike, param_dtype: DTypeLike | None = None) -> str:
    """The rule `Check.tolerance` follows for a run in dtype, in words (what ``print`` of an
    explanation states under its checks).

    Parameters
    ----------
    dtype : {"float32", "float64", "float16", "bfloat16"}
        The dtype the kernels ran in (`Explanation.dtype`).
    param_dtype : "float32" or None, optional
        float32 parameters beside a 16-bit dtype (`Explanation.param_dtype`).

    Returns
    -------
    str
        The rule: ``TOLERANCE_ULPS`` units of eps(dtype) at the largest value, and for
        float16 and bfloat16 ``HALF_TOLERANCE_ULPS`` for the 16-bit outputs and float32's
        rule for the float64 row statistics (and the float32 parameters' gradients).

    Examples
    --------
    >>> from resnorm.explain import tolerance_rule
    >>> tolerance_rule("float32")
    '128 * eps(float32) * max(1, max |reference value|)'
    """
    dtype = np.dtype(dtype)
    if not _is_half(dtype):
        return f"{TOLERANCE_ULPS} * eps({dtype.name}) * max(1, max |reference value|)"
    params = "" if param_dtype is None else " and the float32 parameters' gradients"
    return (f"{HALF_TOLERANCE_ULPS} * eps({dtype.name}) * max(1, max |reference value|) for "
            f"the {dtype.name} outputs (computed in float32, rounded once); "
            f"{TOLERANCE_ULPS} * eps(float32) * ... for the float64 row statistics{params}")


def _check(name, kernel_value, reference_value, dtype, size=None):
    """size: the size of the numbers the kernel forms the value from, when it exceeds the
    value's (a difference that cancels), else None."""
    ref = np.asarray(reference_value, dtype=np.float64)
    diff = float(np.max(np.abs(np.asarray(kernel_value, dtype=np.float64) - ref)))
    scale = ref if size is None else np.append(np.ravel(ref), np.ravel(size))
    return Check(name, diff, _tolerance(scale, _rule(kernel_value, dtype)))


def _with_rounding(steps, comparisons, dtype):
    """The steps of a 16-bit run with each 16-bit kernel output shown as its rounding: the
    exact value first (float64, from the reference, with the output's formula), then the
    output as round(exact), rounded once to dtype from the kernel's float32 result."""
    exact = {name: ref for name, kernel, ref in comparisons
             if _is_half(np.asarray(kernel).dtype)}
    out = []
    for s in steps:
        if s.source != "kernel" or s.name not in exact:
            out.append(s)
            continue
        lhs = _Trace.SYMBOL[s.per].format
        name = f"{s.name}_exact"
        value = np.asarray(exact[s.name], dtype=np.float64).reshape(np.shape(s.value))
        out.append(Step(name, value, s.per, "reference", s.phase,
                        s.formula.replace(lhs(s.name), lhs(name), 1), s.expr, s.reduce,
                        "float64: the exact value, before rounding"))
        out.append(Step(s.name, s.value, s.per, "kernel", s.phase,
                        f"{lhs(s.name)} = round({lhs(name)})", f"round({{{name}}})", "",
                        f"computed in float32, rounded once (to nearest even) to {dtype.name}"
                        + (f"; {s.note}" if s.note else "")))
    return out


def _spread(values):
    """The spread a finite-difference step is scaled to, when the builder gives none: the
    root mean square of each row ((N, 1) for rows, one number for a vector or a scalar), 1
    where it is 0 (a zero row has no scale of its own)."""
    v = np.abs(np.asarray(values, dtype=np.float64))
    rms = np.sqrt(np.mean(v * v, axis=-1, keepdims=True)) if v.ndim == 2 else \
        np.sqrt(np.mean(v * v))
    return np.where(rms > 0, rms, 1.0)


def _derivative(f, base, idx, step):
    """d f(base) / d base[idx], every output of f at once: central differences at step,
    step / 2, ..., Richardson-extrapolated (each level removes the next even power of the
    step from the error).  Returns it, the finest step and an estimate of its truncation
    error (|the last level - the one before|, every output)."""
    table = []
    for level in range(FD_LEVELS):
        hi, lo = base.copy(), base.copy()
        hi[idx] += step / 2**level
        lo[idx] -= step / 2**level
        # divide by the step as represented: base +- step may round
        row = [(f(hi) - f(lo)) / (hi[idx] - lo[idx])]
        for m in range(1, level + 1):
            row.append(row[m - 1] + (row[m - 1] - table[-1][m - 1]) / (4**m - 1))
        table.append(row)
    return table[-1][-1], step / 2**(FD_LEVELS - 1), np.abs(table[-1][-1] - table[-1][-2])


def _loss_terms(built, values):
    """Every term of the loss, upstream gradient times output, as one flat array (kept apart,
    so that a difference of two losses is taken term by term, without the rounding of the
    terms a step does not move)."""
    out = built.forward64(values)
    return np.concatenate([np.ravel(built.upstream[k] * out[k]) for k in built.upstream])


def _finite_difference(built, wrt):
    """d loss / d values[wrt], component by component; with the scale of each component
    (the size of the terms it sums), the resolution of its finite difference and the
    estimate of its truncation error."""
    base = np.array(built.inputs64[wrt], dtype=np.float64)
    spread = np.broadcast_to(built.fd_spread.get(wrt, _spread(base)), base.shape)
    # the loss is known to about eps(float64) of the size of its terms
    rounding = np.finfo(np.float64).eps * np.sum(np.abs(_loss_terms(built, built.inputs64)))
    grad, scale, resolution, truncation = (np.empty(base.shape) for _ in range(4))
    for idx in np.ndindex(base.shape):
        terms, finest, error = _derivative(
            lambda v: _loss_terms(built, {**built.inputs64, wrt: v}), base, idx,
            FD_STEP * float(spread[idx]))
        grad[idx] = np.sum(terms)
        scale[idx] = np.sum(np.abs(terms))
        resolution[idx] = rounding / finest
        truncation[idx] = np.sum(error)
    return grad, scale, resolution, truncation


def _smallest_subnormal(dtype):
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return 2.0 ** -133
    return float(np.finfo(dtype).smallest_subnormal)


def _gradient_checks(built, dtype):
    checks = []
    for name, wrt, kernel in built.gradients:
        fd, scale, resolution, truncation = _finite_difference(built, wrt)
        k = np.asarray(kernel, dtype=np.float64).reshape(fd.shape)
        rule = _rule(kernel, dtype)
        ulps = HALF_TOLERANCE_ULPS if _is_half(rule) else TOLERANCE_ULPS
        rounding = None
        if built.fd_limits:
            rounding = np.full(fd.shape, _smallest_subnormal(np.asarray(kernel).dtype) / 2)
            if name in built.fd_rounding_scale:
                size = np.reshape(built.fd_rounding_scale[name], fd.shape)
                rounding += ulps * _eps(rule) * np.maximum(size - scale, 0.0)
        checks.append(GradientCheck(name, float(np.max(np.abs(k - fd))),
                                    FD_RELATIVE + ulps * _eps(rule), wrt, k, fd, scale,
                                    resolution, rounding,
                                    truncation if built.fd_limits else None))
    return tuple(checks)


def _jacobians(built, dtype):
    jac = built.jacobian
    if jac is None:
        return ()
    out = []
    for r, (closed, v) in enumerate(zip(jac["closed"], jac["rows"])):
        fd = np.empty_like(closed)
        # the row's spread, or each element's ("gated-rms": x reaches the norm times the gate)
        spread = np.broadcast_to(jac["spread"][r], (len(v),))
        for j in range(len(v)):
            fd[:, j], _, _ = _derivative(lambda row: jac["norm_row"](row[None], r)[0], v,
                                         j, FD_STEP * float(spread[j]))
        backward = jac["dy"][r] @ closed
        # a 16-bit gradient through the norm is rounded at its own scale, which can pass J's
        rounded = np.concatenate([closed.ravel(), backward]) if _is_half(dtype) else closed
        if jac.get("size") is not None:
            # "rms", "layer", "gated-rms": the kernel's gradient is formed from numbers of this size
            rounded = np.append(np.ravel(rounded), np.ravel(jac["size"][r]))
        tol = FD_RELATIVE * float(np.max(np.abs(closed))) + _tolerance(rounded, dtype)
        diff_fd = float(np.max(np.abs(fd - closed)))
        diff_backward = float(np.max(np.abs(backward - jac["through_norm"][r])))
        out.append(Jacobian(f"J row {r}", max(diff_fd, diff_backward), tol, r, jac["of"],
                            jac["wrt"], jac["formula"], closed, diff_fd, diff_backward))
    return tuple(out)


def _invariants(built, dtype):
    out = []
    for name, formula, value, exact, note, scale in built.invariants:
        out.append(Invariant(name, formula, np.asarray(value, dtype=np.float64),
                             np.asarray(exact, dtype=np.float64), note,
                             _tolerance(scale, dtype)))
    return tuple(out)


def _forward_invariants(built, dtype):
    out = []
    for f in built.forward_invariants:
        # each side is a kernel output, rounded on its own: twice the rounding of one
        tolerance = f.allowance if f.compared is None else \
            2 * _tolerance(f.compared, _rule(f.compared, dtype)) + f.allowance
        out.append(Invariant(f.name, f.formula, np.asarray(f.value, dtype=np.float64),
                             np.asarray(f.exact, dtype=np.float64), f.note, tolerance,
                             f.independent))
    return tuple(out)


def _describe(value, arrays):
    """What a cache field holds: an array's shape, dtype and whether it is one of the
    named arrays (kept by reference), a nested record's fields, or a plain value."""
    if isinstance(value, np.ndarray):
        refs = [n for n, a in arrays.items()
                if isinstance(a, np.ndarray) and a.size and np.shares_memory(value, a)]
        where = f"a reference to {refs[0]}" if refs else "its own array"
        return f"{value.dtype.name} array of shape {value.shape}, {where}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = [f"{f.name}: {_describe(getattr(value, f.name), arrays)}"
                 for f in dataclasses.fields(value) if getattr(value, f.name) is not None]
        return "(" + "; ".join(parts) + ")"
    if isinstance(value, np.dtype):
        return value.name
    return repr(value)


def _cache(built):
    if built.cache is None:
        return ()
    return tuple((f.name, _describe(getattr(built.cache, f.name), built.cache_arrays))
                 for f in dataclasses.fields(built.cache)
                 if getattr(built.cache, f.name) is not None)


def explain(kind: Kind, x: ArrayLike, weight: ArrayLike | None = None,
            bias: ArrayLike | None = None, eps: float | None = None, dy: ArrayLike | None = None,
            *, dtype: DTypeLike | None = None, residual: ArrayLike | None = None,
            dh: ArrayLike | None = None, alpha: float | ArrayLike | None = None,
            p: float | None = None, seed: int | None = None, training: bool | None = None,
            F: ArrayLike | None = None, g: ArrayLike | None = None,
            gate: ArrayLike | None = None, group_size: int | None = None,
            norm_before_gate: bool | None = None) -> Explanation:
    """Runs one kernel on a small input and returns every step of its computation.

    Parameters
    ----------
    kind : {"rms", "layer", "add-rms", "add-layer", "add-rms-post", "add-layer-post", \
"dropout", "scaled", "gated", "gated-rms"}
        "rms" (RMSNorm), "layer" (LayerNorm), "add-rms" / "add-layer" (Pre-Norm:
        h = residual + alpha * dropout(x), y = norm(h)), "add-rms-post" / "add-layer-post"
        (Post-Norm: y = norm(residual + alpha * dropout(x))), "dropout" (inverted
        dropout), "scaled" (h = x + alpha * F), "gated" (h = x + sigmoid(g) * F) or
        "gated-rms" (the gated RMSNorm, `resnorm.gated_rms_norm`: y = rms_norm(x *
        silu(gate)) * w per group, or rms_norm(x) * w * silu(gate) with norm_before_gate).
    x : array_like
        One row (D,) or a few rows (N, D) of real numbers (for "scaled" and "gated": the
        residual stream; for the fused kinds: the branch output added to it).
    weight, bias : array_like of shape (D,), optional
        The norm's gain and bias (bias only for the LayerNorm kinds), cast to the run's
        dtype; a float32 ndarray beside a float16 or bfloat16 run stays float32 (mixed
        precision, as the functions take it: `Explanation.param_dtype`).
    eps : float, optional
        None for the library default (1e-6 for RMSNorm and the gated RMSNorm, 1e-5 for
        LayerNorm).
    dy : array_like, optional
        Gradient of y (x's shape): explains backward too (not for "scaled" and "gated",
        whose output is h: give dh).
    dtype : {"float32", "float64", "float16", "bfloat16"}, optional
        Every input is converted to it; None: x's float dtype, else float64.  float16 and
        bfloat16 (ml_dtypes'; kinds "rms", "layer", "dropout", "scaled", "gated" and
        "gated-rms"): the kernels compute in float32 and round each output once; every such
        output is shown as ``round(<name>_exact)`` after its exact float64 value.
    residual : array_like, optional
        The fused kinds (required): the stream x is added to.
    dh : array_like, optional
        Pre-Norm fused kinds: the gradient arriving along the stream h (None: 0).
        "scaled" and "gated": the gradient of the output h (explains backward).
    alpha : float or array_like, optional
        Fused kinds and "scaled" (required there): a real number is a fixed scale; a 0-d
        array a learnable scalar; D values a learnable per-channel scale (LayerScale).
        Learnable scales get dalpha.  Default 1 for the fused kinds.
    p : float, optional
        Fused kinds and "dropout": the drop probability of x (required for "dropout";
        default 0).
    seed : int, optional
        Fused kinds and "dropout": the mask seed, in [0, 2**64) (default 0).
    training : bool, optional
        Fused kinds and "dropout": default True; False: dropout is the identity.
    F : array_like, optional
        "scaled" and "gated" (required): the branch output, x's shape.
    g : array_like, optional
        "gated" (required): gate logits, x's shape or (D,) (per channel).
    gate : array_like, optional
        "gated-rms": the gate z, x's shape (shown as the step "z"); None: no gate (the
        grouped RMSNorm of x).
    group_size : int, optional
        "gated-rms": the elements of each normalised group, a divisor of D; None: D (one
        group per row).
    norm_before_gate : bool, optional
        "gated-rms": False (default) gates x before the norm (Mamba2); True normalises x,
        then gates (Qwen3-Next).

    Returns
    -------
    Explanation
        ``.steps`` (inputs, reference intermediates, kernel outputs), ``.checks`` (kernel
        vs resnorm.reference), ``.gradient_checks`` (kernel gradients vs finite
        differences), ``.jacobians``, ``.invariants``, ``.cache`` / ``.cache_why``,
        ``.philox`` and ``.agree``; ``e["rstd"]`` gives a step's value; ``print(e)``
        renders it.  Values are per row: an (N, D) array per element, (N,) per row
        statistic, even for one row.

    Raises
    ------
    TypeError
        For an argument of the wrong type (kind, x, alpha, dtype, ...).
    ValueError
        For a wrong value or shape, an argument the kind does not take, or a missing one.

    Examples
    --------
    >>> import resnorm
    >>> e = resnorm.explain("rms", [1.0, 2.0, 3.0, 4.0], dy=[1.0, 0.0, 0.0, 0.0])
    >>> float(e["ms"][0]), e.agree
    (7.5, True)
    >>> [c.name for c in e.gradient_checks]
    ['dx']

    A learnable residual scale (a 0-d alpha) gets its gradient, checked like every other:

    >>> import numpy as np
    >>> s = resnorm.explain("scaled", [1.0, 2.0], F=[3.0, 4.0], alpha=np.array(0.5),
    ...                     dh=[1.0, 1.0])
    >>> s["h"], s["dalpha"], [c.name for c in s.gradient_checks], s.agree
    (array([[2.5, 4. ]]), array(7.), ['dx', 'dF', 'dalpha'], True)

    In float16 each output is computed in float32 and rounded once, and shown so:

    >>> h = resnorm.explain("rms", [1.0, 2.0, 3.0], dtype="float16")
    >>> h.step("y").formula, float(h["y_exact"][0, 0]), float(h["y"][0, 0]), h.agree
    ('y_i = round(y_exact_i)', 0.4629100002887783, 0.462890625, True)

    The gated RMSNorm keeps one rstd per group of each row (shape (N, G)):

    >>> m = resnorm.explain("gated-rms", [3.0, 4.0, 1.0, -1.0], gate=[0.0, 1.0, 2.0, 2.0],
    ...                     group_size=2, dy=[1.0, 0.0, 0.0, 1.0])
    >>> m.step("rstd").formula, m["rstd"].shape, m.step("dgate").formula, m.agree
    ('rstd_k = 1 / sqrt(ms_k + eps)', (1, 2), 'dgate_i = du_i * x_i * da_dz_i', True)
    """
    given = {"weight": weight, "bias": bias, "eps": eps, "residual": residual, "dh": dh,
             "alpha": alpha, "p": p, "seed": seed, "training": training, "F": F, "g": g,
             "gate": gate, "group_size": group_size, "norm_before_gate": norm_before_gate}
    inp = _inputs(kind, x, dy, dtype, given)
    t = _Trace()
    built = _explain_steps.BUILDERS[kind](t, inp)
    checks = tuple(_check(name, k, r, inp.dtype, built.fd_rounding_scale.get(name))
                   for name, k, r in built.comparisons)
    backward = bool(built.gradients)
    steps = _with_rounding(t.steps, built.comparisons, inp.dtype) if _is_half(inp.dtype) \
        else t.steps
    return Explanation(
        kind, inp.dtype, None if inp.eps is None else float(inp.eps), tuple(steps), checks,
        gradient_checks=_gradient_checks(built, inp.dtype) if backward else (),
        jacobians=_jacobians(built, inp.dtype) if backward else (),
        invariants=_invariants(built, inp.dtype) if backward else (),
        forward_invariants=_forward_invariants(built, inp.dtype),
        cache=_cache(built), cache_why=built.cache_why, philox=built.philox,
        gradient_loss=" + ".join(f"sum(d{k} * {k})" for k in built.upstream),
        param_dtype=None if inp.param_dtype == inp.dtype else inp.param_dtype)
