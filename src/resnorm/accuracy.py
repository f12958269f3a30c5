"""How accurate resnorm's kernels are, in units in the last place (ulp) of each output's dtype.

The measuring instrument of the accuracy contract (docs/accuracy.md): seeded inputs of every
case, the float64 formula (:mod:`resnorm.reference`) rounded to the output's dtype, the
scales ulp(ref) and ulp(S2), per-output statistics (max, p99.99, mean, share equal to the
rounded reference), the contract's bounds, and the same measurement of the installed peers
(torch eager, a numba fastmath row loop, ONNX Runtime) on the same inputs.

Scales, for an output o of dtype T with float64 reference r:

* ``ulp(ref)``: the ulp in T of r rounded to T; errors are ``|o - T(r)| / ulp(T(r))``.
* ``ulp(S2)``: the ulp in T of the sum S2 of the magnitudes of the terms an output is built
  from, for outputs that cancel to near zero (LayerNorm y, dx, dresidual, the gated
  RMSNorm's dx and dgate).
* ``normwise``: the ulp in T of ``max |r|`` over the output (dweight, dbias, dalpha).
* ``formula``: h = residual + alpha * dropout(x) (and the other one-product outputs: dropout,
  the scaled residual) against the same formula evaluated in float32 (float64 for float64)
  and rounded once to T.

``python -m resnorm accuracy`` prints the table; :func:`run` and :func:`report` are its
parts.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

import resnorm
from resnorm import reference as ref

__all__ = ["BOUNDS", "CASES", "FULL_SIZES", "FUNCTIONS", "PEERS", "QUICK_SIZES", "SPECIALS",
           "Bound", "Measurement", "bias", "bound_failures", "case_rows", "dtypes",
           "errors", "formula_h", "gated_rms_norm_s2", "inputs", "layer_norm_dx_s2",
           "layer_norm_y_s2", "measure", "normwise_ulp", "peer_wins", "peers_installed",
           "report", "rms_norm_dx_s2", "row_count", "run", "special_rows", "specials_stay",
           "statistics", "ulp", "upstream", "weight"]

CASES = ("normal", "offset 1e2", "offset 1e4", "student-t 2", "log-uniform",
         "float16 squares overflow", "subnormal", "zero")
SPECIALS = (math.nan, math.inf)     # checked apart: one in a row stays in its row
QUICK_SIZES = (1, 3, 16, 17, 255, 768, 4096)
FULL_SIZES = QUICK_SIZES + (65536,)
PEERS = ("torch", "numba", "onnxruntime")
P = 0.1                             # the fused forms' dropout probability
SEED = 7                            # their dropout seed
EPS = {"rms": 1e-6, "layer": 1e-5}  # the documented defaults (the gated RMSNorm: "rms")
GROUPS = 8                          # the grouped gated RMSNorm's groups per row, where D allows


# --------------------------------------------------------------------------- dtypes

def dtypes() -> list[np.dtype]:
    """The output dtypes measured here: float32, float64, float16, and bfloat16 when
    ml_dtypes is installed.

    Returns
    -------
    dtypes : list of numpy.dtype

    Examples
    --------
    >>> from resnorm import accuracy
    >>> [dt.name for dt in accuracy.dtypes()][:3]
    ['float32', 'float64', 'float16']
    """
    found = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)]
    try:
        import ml_dtypes
    except ImportError:   # bfloat16 is measured only with ml_dtypes
        return found
    return found + [np.dtype(ml_dtypes.bfloat16)]


def _finfo(dtype: np.dtype) -> Any:
    """finfo of a NumPy float or of ml_dtypes' bfloat16 (NumPy's finfo does not know it)."""
    if dtype.name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def _working(dtype: np.dtype) -> type:
    """The arithmetic the kernels use for dtype: float64 for float64, else float32 (16-bit
    values are widened to float32 and each output rounded once)."""
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


# --------------------------------------------------------------------------- cases

def _magnitudes(rng: np.random.Generator, shape: tuple[int, ...], lo: float,
                hi: float) -> NDArray[np.float64]:
    """Log-uniform magnitudes in [lo, hi) with random signs."""
    mag = np.exp(rng.uniform(math.log(lo), math.log(hi), shape))
    return np.where(rng.random(shape) < 0.5, -mag, mag)


def case_rows(case: str, shape: tuple[int, ...], dtype: np.dtype,
              seed: int = 0) -> NDArray[Any] | None:
    """Seeded rows of one of the contract's cases, of dtype.

    Parameters
    ----------
    case : str
        One of `CASES`: "normal" (standard normal), "offset 1e2" / "offset 1e4" (normal
        with that mean, in units of its standard deviation), "student-t 2" (heavy tails:
        one square can dominate a long row), "log-uniform" (magnitudes log-uniform over
        1e-20..1e20, clipped to what dtype holds, random signs), "float16 squares overflow"
        (float16 values whose squares overflow float16), "subnormal" (dtype's subnormal
        numbers), "zero".
    shape : tuple of int
        The shape of the rows, (n, D).
    dtype : numpy.dtype
        Their dtype.
    seed : int, default 0
        The generator's seed: the same seed gives the same rows.

    Returns
    -------
    rows : ndarray or None
        None where the case does not apply (float16 squares overflow, for any dtype but
        float16).

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> accuracy.case_rows("offset 1e4", (1, 3), np.dtype(np.float32)).round(0)
    array([[10000., 10000., 10001.]], dtype=float32)
    >>> accuracy.case_rows("float16 squares overflow", (1, 3), np.dtype(np.float32)) is None
    True
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    info = _finfo(dtype)
    if case == "normal":
        x = rng.standard_normal(shape)
    elif case.startswith("offset "):
        x = float(case.split()[1]) + rng.standard_normal(shape)
    elif case == "student-t 2":
        x = rng.standard_t(2, shape)
    elif case == "log-uniform":
        # clipped so that a fused sum of two of them stays finite in dtype
        x = _magnitudes(rng, shape, max(1e-20, float(info.smallest_subnormal)),
                        min(1e20, float(info.max) / 4))
    elif case == "float16 squares overflow":
        if dtype != np.float16:
            return None
        x = _magnitudes(rng, shape, 256.0, 4096.0)   # 256**2 > 65504, sums stay finite
    elif case == "subnormal":
        steps = rng.integers(1, 2 ** info.nmant, shape)
        x = np.where(rng.random(shape) < 0.5, -1, 1) * steps * float(info.smallest_subnormal)
    elif case == "zero":
        x = np.zeros(shape)
    else:
        raise ValueError(f"unknown case {case!r}; known: {', '.join(CASES)}")
    return x.astype(dtype)


def special_rows(value: float, shape: tuple[int, ...], dtype: np.dtype,
                 seed: int = 0) -> tuple[NDArray[Any], NDArray[Any], int]:
    """Standard normal rows, and the same rows with one NaN or inf in one of them.

    Parameters
    ----------
    value : float
        The value put in: nan, inf or -inf.
    shape : tuple of int
        (n, D), n >= 2.
    dtype : numpy.dtype
        The rows' dtype.
    seed : int, default 0
        Seeds the rows and where the value goes.

    Returns
    -------
    clean, special : ndarray
        The rows without and with the value.
    row : int
        The row it is in.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> clean, special, row = accuracy.special_rows(np.nan, (4, 8), np.dtype(np.float32))
    >>> int(np.isnan(special).sum()), bool(np.isnan(special[row]).any())
    (1, True)
    """
    clean = case_rows("normal", shape, dtype, seed)
    rng = np.random.default_rng(seed + 1)
    row, col = int(rng.integers(shape[0])), int(rng.integers(shape[1]))
    special = clean.copy()
    special[row, col] = value
    return clean, special, row


def weight(d: int, dtype: np.dtype, seed: int = 0) -> NDArray[Any]:
    """The norms' weight: N(1, 0.1) per channel (also the learnable residual scale alpha).

    Parameters
    ----------
    d : int
        Channels.
    dtype : numpy.dtype
    seed : int, default 0

    Returns
    -------
    weight : ndarray, shape (d,)

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> bool(abs(accuracy.weight(4096, np.dtype(np.float64)).mean() - 1) < 0.01)
    True
    """
    return (1.0 + 0.1 * np.random.default_rng(seed).standard_normal(d)).astype(dtype)


def bias(d: int, dtype: np.dtype, seed: int = 0) -> NDArray[Any]:
    """LayerNorm's bias: N(0, 0.1) per channel.

    Parameters
    ----------
    d : int
        Channels.
    dtype : numpy.dtype
    seed : int, default 0

    Returns
    -------
    bias : ndarray, shape (d,)

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> accuracy.bias(3, np.dtype(np.float16)).dtype
    dtype('float16')
    """
    return (0.1 * np.random.default_rng(seed).standard_normal(d)).astype(dtype)


def upstream(shape: tuple[int, ...], dtype: np.dtype, seed: int = 0) -> NDArray[Any]:
    """A gradient arriving from above (dy, dh; and the gate logits g): N(0, 1).

    Parameters
    ----------
    shape : tuple of int
    dtype : numpy.dtype
    seed : int, default 0

    Returns
    -------
    grad : ndarray

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> accuracy.upstream((2, 3), np.dtype(np.float32)).shape
    (2, 3)
    """
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def inputs(case: str, shape: tuple[int, ...], dtype: np.dtype,
           seed: int = 0) -> dict[str, NDArray[Any]] | None:
    """Every array a measured function takes, for one case: x and residual (the case's
    rows, two seeds; residual is also the scaled and gated residuals' branch F), weight and
    alpha (`weight`), bias, dy, dh and the gate logits g of the gated residual and the gated
    RMSNorm (`upstream`).

    Parameters
    ----------
    case : str
        One of `CASES`.
    shape : tuple of int
        (n, D).
    dtype : numpy.dtype
    seed : int, default 0

    Returns
    -------
    arrays : dict of str to ndarray, or None
        None where the case does not apply to dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> sorted(accuracy.inputs("normal", (2, 3), np.dtype(np.float32)))
    ['alpha', 'bias', 'dh', 'dy', 'g', 'residual', 'weight', 'x']
    """
    x = case_rows(case, shape, dtype, seed)
    if x is None:
        return None
    d = shape[-1]
    return {"x": x, "residual": case_rows(case, shape, dtype, seed + 1),
            "weight": weight(d, dtype, seed + 2), "alpha": weight(d, dtype, seed + 3),
            "bias": bias(d, dtype, seed + 4), "dy": upstream(shape, dtype, seed + 5),
            "dh": upstream(shape, dtype, seed + 6), "g": upstream(shape, dtype, seed + 7)}


def row_count(d: int, quick: bool = False) -> int:
    """How many rows a case has at row length d: about 2**18 elements (2**12 when quick),
    at least 4 (2) rows and at most 32768 (256): the column sums (dweight) need many rows,
    the row statistics long rows.

    Parameters
    ----------
    d : int
        The row length.
    quick : bool, default False

    Returns
    -------
    n : int

    Examples
    --------
    >>> from resnorm import accuracy
    >>> accuracy.row_count(768), accuracy.row_count(768, quick=True)
    (341, 5)
    """
    total, least, most = (2 ** 12, 2, 256) if quick else (2 ** 18, 4, 32768)
    return max(least, min(most, total // d))


# --------------------------------------------------------------------------- scales

def ulp(values: ArrayLike, dtype: np.dtype) -> NDArray[np.float64]:
    """The unit in the last place, in dtype, of values (already of dtype, or rounded to it):
    the distance from ``|v|`` to the next larger number of dtype; the smallest subnormal at 0.

    Parameters
    ----------
    values : array_like
        Finite values.
    dtype : numpy.dtype
        float64, float32, float16 or bfloat16.

    Returns
    -------
    ulp : ndarray of float64

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> (accuracy.ulp([1.0, 1.5, 0.0], np.dtype(np.float16)) * 2 ** 24).tolist()
    [16384.0, 16384.0, 1.0]
    """
    info = _finfo(np.dtype(dtype))
    v = np.abs(np.asarray(values, np.float64))
    _, exponent = np.frexp(v)   # |v| = m 2**e, m in [0.5, 1); frexp(0) = (0, 0)
    tiny = float(info.smallest_subnormal)
    return np.where(v == 0, tiny, np.maximum(np.ldexp(1.0, exponent - 1 - int(info.nmant)), tiny))


def layer_norm_y_s2(xhat: ArrayLike, w: ArrayLike, b: ArrayLike | None) -> NDArray[np.float64]:
    """S2 of LayerNorm's y = xhat*w + b: ``|xhat*w| + |b| + |w|``.

    y cancels to near zero where xhat*w is near -b, and xhat = (x - mean)*rstd carries an
    error relative to the row's spread, not to itself: no implementation bounds the error
    in ulp of y there.

    Parameters
    ----------
    xhat : array_like, shape (..., D)
        The normalised rows, (x - mean)*rstd, in float64.
    w : array_like, shape (D,)
        The gain.
    b : array_like, shape (D,), or None
        The bias.

    Returns
    -------
    S2 : ndarray of float64, shape (..., D)

    Examples
    --------
    >>> from resnorm import accuracy
    >>> accuracy.layer_norm_y_s2([[1.0, -2.0]], [0.5, 1.0], [0.25, 0.25])
    array([[1.25, 3.25]])
    """
    xhat, w = np.asarray(xhat, np.float64), np.abs(np.asarray(w, np.float64))
    b = 0.0 if b is None else np.abs(np.asarray(b, np.float64))
    return np.abs(xhat) * w + b + w


def layer_norm_dx_s2(rstd: ArrayLike, g: ArrayLike, xhat: ArrayLike) -> NDArray[np.float64]:
    """S2 of LayerNorm's dx = rstd*(g - mean(g) - xhat*mean(g*xhat)), g = dy*w:
    ``rstd*(|g| + mean|g| + |xhat|*mean|g*xhat|)``.

    Parameters
    ----------
    rstd : array_like, shape (...,)
        The rows' 1/sqrt(var + eps).
    g : array_like, shape (..., D)
        dy*w.
    xhat : array_like, shape (..., D)
        The normalised rows.

    Returns
    -------
    S2 : ndarray of float64, shape (..., D)

    Examples
    --------
    >>> from resnorm import accuracy
    >>> accuracy.layer_norm_dx_s2([2.0], [[1.0, -1.0]], [[1.0, -1.0]])
    array([[6., 6.]])
    """
    g, xhat = np.asarray(g, np.float64), np.asarray(xhat, np.float64)
    terms = (np.abs(g) + np.mean(np.abs(g), axis=-1, keepdims=True)
             + np.abs(xhat) * np.mean(np.abs(g * xhat), axis=-1, keepdims=True))
    return np.asarray(rstd, np.float64)[..., None] * terms


def rms_norm_dx_s2(rstd: ArrayLike, g: ArrayLike, xn: ArrayLike) -> NDArray[np.float64]:
    """S2 of RMSNorm's dx = rstd*(g - xn*mean(g*xn)), g = dy*w:
    ``rstd*(|g| + |xn|*mean|g*xn|)`` (no mean to subtract: no mean|g| term).

    Parameters
    ----------
    rstd : array_like, shape (...,)
        The rows' 1/sqrt(mean(x**2) + eps).
    g : array_like, shape (..., D)
        dy*w.
    xn : array_like, shape (..., D)
        The normalised rows, x*rstd.

    Returns
    -------
    S2 : ndarray of float64, shape (..., D)

    Examples
    --------
    >>> from resnorm import accuracy
    >>> accuracy.rms_norm_dx_s2([2.0], [[1.0, -1.0]], [[1.0, -1.0]])
    array([[4., 4.]])
    """
    g, xn = np.asarray(g, np.float64), np.asarray(xn, np.float64)
    terms = np.abs(g) + np.abs(xn) * np.mean(np.abs(g * xn), axis=-1, keepdims=True)
    return np.asarray(rstd, np.float64)[..., None] * terms


def gated_rms_norm_s2(x: ArrayLike, gate: ArrayLike, weight: ArrayLike | None, dy: ArrayLike,
                      rstd: ArrayLike, group_size: int | None = None,
                      norm_before_gate: bool = False
                      ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """S2 of the gated RMSNorm's dx and dgate: the magnitudes of the terms its backward adds.

    With ``a = silu(z) = z*s``, ``s = sigmoid(z)``, and ``silu_grad(z) = s + z*s*(1 - s)``,
    whose two terms cancel near z = -1.28 (so its magnitude is counted as
    ``sp = s + |z|*s*(1 - s)``), per group of `group_size` elements (`rms_norm_dx_s2`
    within each group, with the group's rstd and means over the group):

    * gate before the norm: the norm's input gradient ``du = rstd*(g - un*mean(g*un))``,
      ``g = dy*w``, ``un = x*a*rstd``, has ``S2(du) = rstd*(|g| + |un|*mean|g*un|)``;
      ``dx = du*a``: ``S2 = |a|*S2(du)``; ``dgate = du*x*silu_grad(z)``:
      ``S2 = |x|*sp*S2(du)``;
    * norm before the gate: ``dx = rstd*(g - xn*mean(g*xn))`` with ``g = dy*a*w``,
      ``xn = x*rstd``: ``S2 = rstd*(|g| + |xn|*mean|g*xn|)``; ``dgate = dy*xn*w*silu_grad(z)``:
      ``S2 = |dy*xn*w|*sp``.

    Parameters
    ----------
    x, gate, dy : array_like, shape (..., D)
        The input, the gate logits z and the gradient arriving at y.
    weight : array_like, shape (D,), or None
        The gain w (None: 1).
    rstd : array_like, shape (..., G)
        Each group's 1/sqrt(mean(v**2) + eps), v = x*a (gate first) or x (norm first).
    group_size : int, optional
        The elements of a group (default D: one group per row).
    norm_before_gate : bool, default False
        The order of the gate and the norm.

    Returns
    -------
    dx_s2, dgate_s2 : ndarray of float64, shape (..., D)

    Examples
    --------
    >>> from resnorm import accuracy
    >>> x, z, dy = [[1.0, -2.0]], [[0.0, 0.0]], [[1.0, 1.0]]
    >>> accuracy.gated_rms_norm_s2(x, z, None, dy, [[0.5]])   # silu(0) = 0, silu_grad(0) = 1/2
    (array([[0., 0.]]), array([[0.25, 0.5 ]]))
    """
    x, z, dy = (np.asarray(v, np.float64) for v in (x, gate, dy))
    w = 1.0 if weight is None else np.asarray(weight, np.float64)
    rstd = np.asarray(rstd, np.float64)
    d = x.shape[-1]
    gs = d if group_size is None else int(group_size)

    def grouped(v):
        return v.reshape(v.shape[:-1] + (d // gs, gs))

    s = ref.sigmoid(z)
    a, sp = z * s, s + np.abs(z) * ref.sigmoid_grad(z)
    vn = grouped(x if norm_before_gate else x * a) * rstd[..., None]   # xn, or un
    g = dy * a * w if norm_before_gate else dy * w
    s2 = rms_norm_dx_s2(rstd, grouped(g), vn).reshape(x.shape)   # of dx, or of du
    if norm_before_gate:
        return s2, np.abs(dy * vn.reshape(x.shape) * w) * sp
    return np.abs(a) * s2, np.abs(x) * sp * s2


def normwise_ulp(reference: ArrayLike, dtype: np.dtype) -> NDArray[np.float64]:
    """The unit of dweight, dbias and dalpha: the ulp in dtype of ``max |reference|`` over the
    whole output (a column sum over many rows is accurate relative to the largest, not to
    each small one).

    Parameters
    ----------
    reference : array_like
        The float64 reference of the output.
    dtype : numpy.dtype
        The output's dtype.

    Returns
    -------
    unit : ndarray of float64, shape ()

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> float(accuracy.normwise_ulp([1e-3, -1.0], np.dtype(np.float32)))
    1.1920928955078125e-07
    >>> float(accuracy.normwise_ulp([1e5, 1.0], np.dtype(np.float16)))   # past 65504
    32.0
    """
    reference = np.abs(np.asarray(reference, np.float64))
    largest = reference[np.isfinite(reference)].max(initial=0.0)
    # a largest value past the dtype's range (a float16 column sum) rounds to inf, whose
    # own "ulp" would be meaningless: the unit is then that of the largest finite value
    largest = min(largest, float(_finfo(np.dtype(dtype)).max))
    return ulp(np.asarray(largest).astype(dtype), dtype)


# --------------------------------------------------------------------------- the float32 formula

def _dropped(x: NDArray[Any], keep: NDArray[np.bool_], p: float) -> NDArray[Any]:
    """dropout(x) as the kernels form it in their arithmetic: x times keep/(1-p), that
    factor rounded once (x*0 keeps x's sign)."""
    work = _working(x.dtype)
    return x.astype(work) * np.where(keep, work(1.0 / (1.0 - p)), work(0.0))


def formula_h(x: NDArray[Any], residual: NDArray[Any], alpha: ArrayLike,
              keep: NDArray[np.bool_], p: float) -> NDArray[Any]:
    """``h = residual + alpha*dropout(x)`` in float32 arithmetic (float64 for float64), each
    operation rounded once, not yet rounded to x's dtype: what the contract's h is held to
    (16-bit: this value rounded once).  resnorm.reference is the float64 twin of the
    kernels; this is the formula in their working precision.

    Parameters
    ----------
    x, residual : ndarray, shape (n, D)
        The branch and the stream, of one dtype.
    alpha : array_like
        The residual scale (a number or one per channel).
    keep : ndarray of bool, shape (n, D)
        The dropout keep-mask (`resnorm.reference.dropout_mask`).
    p : float
        The drop probability.

    Returns
    -------
    h : ndarray of float32 (float64 for float64 x)

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> x = np.array([[1.0, 2.0]], np.float16)
    >>> accuracy.formula_h(x, x, np.float16(0.5), np.array([[True, False]]), 0.5)
    array([[2., 2.]], dtype=float32)
    """
    work = _working(x.dtype)
    return residual.astype(work) + np.asarray(alpha).astype(work) * _dropped(x, keep, p)


# --------------------------------------------------------------------------- errors

def errors(got: ArrayLike, want: ArrayLike, unit: ArrayLike,
           dtype: np.dtype) -> NDArray[np.float64]:
    """``|got - dtype(want)| / unit`` elementwise: the error in units of a scale, against
    the reference rounded to the output's dtype.  Where either side is not finite: 0 when
    both are the same (NaN and NaN, inf and inf), else inf.

    Parameters
    ----------
    got : array_like
        The output, of dtype.
    want : array_like
        The float64 reference.
    unit : array_like
        The unit (`ulp` of something in dtype), broadcast to got.
    dtype : numpy.dtype
        The output's dtype.

    Returns
    -------
    errors : ndarray of float64, got's shape

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> f32 = np.dtype(np.float32)
    >>> got = np.array([1.0, 1.0 + 2 ** -22, np.nan], np.float32)
    >>> want = np.array([1.0, 1.0, np.nan])
    >>> accuracy.errors(got, want, accuracy.ulp(want.astype(f32), f32), f32)
    array([0., 2., 0.])
    """
    got = np.asarray(got).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.asarray(want, np.float64).astype(dtype).astype(np.float64)
        err = np.abs(got - rounded) / unit
    finite = np.isfinite(got) & np.isfinite(rounded)
    same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
    return np.where(finite, err, np.where(same, 0.0, np.inf))


STATISTICS = ("max", "p99.99", "mean", "equal")


def statistics(errs: Sequence[NDArray[np.float64]]) -> dict[str, float]:
    """max, p99.99 and mean of errors, and the share of them that are 0 (outputs equal to
    the rounded reference).

    Parameters
    ----------
    errs : sequence of ndarray
        Errors (`errors`) of one output, one array per row length.

    Returns
    -------
    stats : dict of str to float
        Keys `STATISTICS`.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> accuracy.statistics([np.array([0.0, 0.0, 0.0, 2.0])])
    {'max': 2.0, 'p99.99': 2.0, 'mean': 0.5, 'equal': 0.75}
    """
    e = np.concatenate([np.ravel(a) for a in errs])
    if e.size == 0:
        return dict.fromkeys(STATISTICS, 0.0)
    return {"max": float(e.max()), "p99.99": float(np.quantile(e, 0.9999, method="higher")),
            "mean": float(e.mean()), "equal": float(np.mean(e == 0))}


# --------------------------------------------------------------------------- bounds

class Bound(NamedTuple):
    """One bound of the contract: a statistic of the errors in a scale, and its limit
    (at most the limit; the share "equal" at least it).

    Attributes
    ----------
    scale : str
        "ref", "S2", "normwise" or "formula".
    stat : str
        One of `STATISTICS`.
    limit : float

    Examples
    --------
    >>> from resnorm import accuracy
    >>> b = accuracy.Bound("S2", "max", 3)
    >>> str(b), b.holds(2.5)
    ('max <= 3 ulp(S2)', True)
    """
    scale: str
    stat: str
    limit: float

    def holds(self, value: float) -> bool:
        """Whether a measured statistic meets the bound.

        Parameters
        ----------
        value : float
            The statistic, measured.

        Returns
        -------
        holds : bool
        """
        return value >= self.limit if self.stat == "equal" else value <= self.limit

    def __str__(self) -> str:
        if self.stat == "equal":
            return f"equal to ref >= {100 * self.limit:g}%"
        return f"{self.stat} <= {self.limit:.5g} {_SCALE_NAMES[self.scale]}"


_SCALE_NAMES = {"ref": "ulp(ref)", "S2": "ulp(S2)", "normwise": "ulp normwise",
                "formula": "ulp of the float32 formula"}

# The contract's columns: float32, 16-bit, and float64, which keeps float64 arithmetic and
# today's bounds: 1e-12 of the same scales (the test suite's float64 tolerance), in float64
# ulps.  The float64 reference is itself float64: no finer bound can be measured against it.
AS_TODAY = 1e-12 / float(np.finfo(np.float64).eps)


def _column(dtype: np.dtype) -> str:
    """The contract's column of bounds of dtype."""
    dtype = np.dtype(dtype)
    return "16-bit" if dtype.itemsize == 2 else dtype.name


# The contract's bounds, by kind of output and column.  The gated residual's h, dF and dg go
# through a vectorised sigmoid (within 3 ulp of float64's): the contract gives them no bound;
# they are reported only.
BOUNDS = {
    ("rms y", "float32"): (Bound("ref", "max", 3), Bound("ref", "mean", 0.5)),
    ("rms y", "16-bit"): (Bound("ref", "max", 1), Bound("ref", "equal", 0.998)),
    ("rms y", "float64"): (Bound("ref", "max", AS_TODAY),),
    ("layer y", "float32"): (Bound("S2", "max", 3), Bound("ref", "p99.99", 1000)),
    ("layer y", "16-bit"): (Bound("S2", "max", 1),),
    ("layer y", "float64"): (Bound("S2", "max", AS_TODAY),),
    ("grad", "float32"): (Bound("S2", "max", 5),),
    ("grad", "16-bit"): (Bound("S2", "max", 1),),
    ("grad", "float64"): (Bound("S2", "max", AS_TODAY),),
    ("param", "float32"): (Bound("normwise", "max", 3),),
    ("param", "16-bit"): (Bound("normwise", "max", 1),),
    ("param", "float64"): (Bound("normwise", "max", AS_TODAY),),
    **{("h", c): (Bound("formula", "max", 0),) for c in ("float32", "16-bit", "float64")},
    **{("gated", c): () for c in ("float32", "16-bit", "float64")},
}

# The gated RMSNorm (docs/gated_rms_norm.md).  Its dweight is a column sum like the other
# norms' ("param").  Its y, dx and dgate carry the float32 sigmoid (vmath.h), which the
# contract's rows do not cover: their float32 bounds are first-order worst cases of the
# kernel's float32 arithmetic (gated_norm_kernels.pxd), in units of u = 2**-24, an error of
# k*u*S being at most k ulp(S) (ulp(S) > u*S), plus 0.5 ulp for the reference's own
# rounding to float32 (|ref| <= S), rounded up:
#
#   exp(-|z|) within 9e-8 = 1.51u (vmath.h); s = 1/(1+e) (z >= 0) or e/(1+e) (z < 0): 2.76u
#   or 4.51u; s(1-s) = e*q*q, q = 1/(1+e): 7.51u; a = silu(z) = z*s: 5.51u; silu_grad =
#   s + z*(s(1-s)): 9.51u of its terms' magnitudes s + |z|*s(1-s) (gated_rms_norm_s2's sp);
#   the gated rows u = x*a: 6.51u (= E).
#   RMSNorm's own arithmetic on float32 rows v and gradient g_in (r = float(rstd), rstd in
#   double from double sums): y = (v*r)*w: 3u; m = float(sum((g_in*w)*(v*r)) / gs), terms
#   in float32 (4u) summed in float32 blocks of 8 (7u) into double, rounded (u): 12u of
#   mean|g*vn|; dv = r*(g_in*w - (v*r)*m): 4u of rstd*|g| + 17u of rstd*|vn|*mean|g*vn|,
#   at most 17u of S2.
#   Gate first, the norm of u instead of the exact x*a (u_j's relative error e_j <= E): y
#   moves by |e_i - mean_w(e)| <= 2E (weights u_j**2/sum u**2); du by <= E*rstd*|g| +
#   5E*rstd*|un|*mean|g*un| (rstd: E, un: 2E, mean(g*un): 2E).
#
#   gated y          (gate first)  3u + 2E                               = 16.02u -> 17 ulp(ref)
#   gated dx         (gate first)  du 17u + 5E = 49.55u; *a: 5.51u + u   = 56.06u -> 57 ulp(S2)
#   gated dgate      (gate first)  du 49.55u; *x: u; *silu_grad: 9.51u + u = 61.06u -> 62 ulp(S2)
#   gated y, norm first            (x*r)*w: 3u; *a: 5.51u + u           =  9.51u -> 11 ulp(ref)
#   gated dx, norm first           g_in = dy*a: 6.51u (linear in dx);  17u + 6.51u = 23.51u
#                                                                                -> 25 ulp(S2)
#   gated dgate, norm first        dy*((x*r)*w): 4u; *silu_grad: 9.51u + u = 14.51u -> 16 ulp(S2)
#
# Not covered: products that underflow into the subnormals (u = x*a keeps only the
# subnormals' absolute precision, which the norm scales up) or overflow.  The kernel
# normalises a group whose every |u| is under 2**-63 from the exact products x*a in double
# (y, and du and the dweight terms in backward: then at most 1 ulp from the rounding of
# each, and a's 5.51u), so rows of subnormal x are within the bounds; a group mixing
# subnormal products with large ones is not.
# 16-bit rows are these float32 numbers rounded once: an error of at most 61.06u of the
# scale is far below a 16-bit ulp (2**-11 of it at least), so the 16-bit output is the
# rounded reference or its neighbour, <= 1 ulp (the contract's 16-bit bound); for y it is
# not the rounded reference only where the reference lies within that error of a 16-bit
# rounding boundary, a share of at most 16.02u * 2**11 = 0.196% (float16, every error at its
# worst, the reference spread evenly between the boundaries): >= 99.8% equal, RMSNorm y's
# 16-bit bound.  float64 rows keep float64 arithmetic (libm exp): today's bounds.
_GATED_FLOAT32 = {"gated y": ("ref", 17), "gated dx": ("S2", 57), "gated dgate": ("S2", 62),
                  "gated y, norm first": ("ref", 11), "gated dx, norm first": ("S2", 25),
                  "gated dgate, norm first": ("S2", 16)}
for _kind, (_scale, _limit) in _GATED_FLOAT32.items():
    BOUNDS[_kind, "float32"] = (Bound(_scale, "max", _limit),)
    BOUNDS[_kind, "16-bit"] = BOUNDS["rms y" if _scale == "ref" else "grad", "16-bit"]
    BOUNDS[_kind, "float64"] = (Bound(_scale, "max", AS_TODAY),)
del _kind, _scale, _limit

# The scale a peer is compared in besides p99.99 ulp(ref): the contract's max ulp(S2)
# (for RMSNorm y, which does not cancel: ulp(ref); for h: the float32 formula).
PRIMARY = {"rms y": "ref", "layer y": "S2", "h": "formula", "grad": "S2",
           "param": "normwise", "gated": "ref",
           **{kind: scale for kind, (scale, _) in _GATED_FLOAT32.items()}}
# The kinds of y, which do not cancel: a peer is compared in p99.99 ulp(ref) too.
_Y_KINDS = ("rms y", "layer y", "gated y", "gated y, norm first")


@dataclasses.dataclass
class Measurement:
    """The errors of one output of one function on one case and dtype, over the row
    lengths measured: {scale: `statistics`} for resnorm and for each peer that computes
    the output.

    Parameters
    ----------
    function, output : str
        The function (a key of `FUNCTIONS`) and its output (y, h, dx, dweight, ...).
    kind : str
        Which row of the contract bounds it: "rms y", "layer y", "h", "grad", "param", the
        gated RMSNorm's "gated y", "gated dx", "gated dgate" (and the same ", norm first"),
        or "gated" (the gated residual: no bound).
    dtype, case : str
    resnorm : dict
        {scale: {statistic: value}} of resnorm's output.
    peers : dict, optional
        {peer: {scale: {statistic: value}}}.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> m = accuracy.measure("layer_norm", np.dtype(np.float32), "offset 1e4", [768])[0]
    >>> m.kind, sorted(m.resnorm), m.resnorm["S2"]["max"] <= 3
    ('layer y', ['S2', 'ref'], True)
    """
    function: str
    output: str
    kind: str
    dtype: str
    case: str
    resnorm: dict[str, dict[str, float]]
    peers: dict[str, dict[str, dict[str, float]]] = dataclasses.field(default_factory=dict)


def bound_failures(m: Measurement) -> list[str]:
    """The contract's bounds a measurement of resnorm misses, as text.

    Parameters
    ----------
    m : Measurement

    Returns
    -------
    failures : list of str
        Empty when every bound holds.

    Examples
    --------
    >>> from resnorm import accuracy
    >>> m = accuracy.Measurement("rms_norm", "y", "rms y", "float32", "normal",
    ...                          {"ref": {"max": 4.0, "p99.99": 1.0, "mean": 0.2, "equal": 0.9}})
    >>> accuracy.bound_failures(m)
    ['max 4 > 3 ulp(ref)']
    """
    out = []
    for bound in BOUNDS[m.kind, _column(m.dtype)]:
        value = m.resnorm[bound.scale][bound.stat]
        if bound.stat == "equal" and not bound.holds(value):
            out.append(f"{100 * value:.2f}% equal to ref < {100 * bound.limit:g}%")
        elif not bound.holds(value):
            out.append(f"{bound.stat} {value:.4g} > {bound.limit:.5g} "
                       f"{_SCALE_NAMES[bound.scale]}")
    return out


def peer_wins(m: Measurement, peer: str) -> bool:
    """Whether a peer is more accurate than resnorm on a measurement: a smaller max error in
    the output's primary scale (ulp(S2) where the contract defines one, normwise for
    dweight, dbias and dalpha) or, for y, a smaller p99.99 ulp(ref) (dx and dresidual
    cancel to near zero: their ulp(ref) is not a measure of accuracy, as the contract's
    bounds say).

    Parameters
    ----------
    m : Measurement
    peer : str
        One of m.peers.

    Returns
    -------
    wins : bool

    Examples
    --------
    >>> from resnorm import accuracy
    >>> s = lambda mx, p: {"ref": {"max": mx, "p99.99": p, "mean": 0.0, "equal": 1.0}}
    >>> m = accuracy.Measurement("rms_norm", "y", "rms y", "float32", "normal", s(1.0, 1.0),
    ...                          {"torch": s(4.0, 1.0)})
    >>> accuracy.peer_wins(m, "torch")
    False
    """
    theirs, ours, primary = m.peers[peer], m.resnorm, PRIMARY[m.kind]
    if theirs[primary]["max"] < ours[primary]["max"]:
        return True
    return m.kind in _Y_KINDS and theirs["ref"]["p99.99"] < ours["ref"]["p99.99"]


# --------------------------------------------------------------------------- the functions

def _norm_name(norm: str, form: str) -> str:
    """rms_norm, add_rms_norm (Pre-Norm), add_rms_norm_post (Post-Norm); layer likewise."""
    base = f"{norm}_norm"
    return {"plain": base, "pre": f"add_{base}", "post": f"add_{base}_post"}[form]


def _norm_outputs(norm: str, form: str) -> list[str]:
    """The measured outputs, in the order the forward then the backward return them."""
    forward = ["y", "h"] if form == "pre" else ["y"]
    params = ["dweight", "dbias"] if norm == "layer" else ["dweight"]
    if form == "plain":
        return forward + ["dx"] + params
    return forward + ["dx", "dresidual"] + params + ["dalpha"]


def _norm_kind(norm: str, output: str) -> str:
    if output == "y":
        return f"{norm} y"
    return {"h": "h", "dx": "grad", "dresidual": "grad"}.get(output, "param")


def _norm_resnorm(norm: str, form: str, a: dict[str, NDArray[Any]],
                  n_threads: int | None) -> dict[str, NDArray[Any]]:
    """resnorm's training forward and backward of one norm function."""
    name = _norm_name(norm, form)
    params = [a["weight"], a["bias"]] if norm == "layer" else [a["weight"]]
    fused = {} if form == "plain" else {"alpha": a["alpha"], "p": P, "seed": SEED}
    head = [a["x"]] if form == "plain" else [a["x"], a["residual"]]
    y, cache = getattr(resnorm, name + "_forward")(*head, *params, **fused,
                                                   n_threads=n_threads)
    forward = list(y) if form == "pre" else [y]
    dh = [a["dh"]] if form == "pre" else []
    backward = getattr(resnorm, name + "_backward")(a["dy"], *dh, cache, n_threads=n_threads)
    return dict(zip(_norm_outputs(norm, form), forward + list(backward)))


def _norm_reference(norm: str, form: str, a: dict[str, NDArray[Any]]
                    ) -> tuple[dict[str, NDArray[Any]], dict[str, NDArray[Any]],
                               dict[str, NDArray[Any]]]:
    """(float64 reference, S2, working-precision formula) of every output.  The fused
    forms' y (and their gradients) are those of the norm of the h the kernel normalises,
    the h the caller gets (the float32 formula, rounded once to a 16-bit dtype), not of the
    float64 h: h's own rounding is held by its bound."""
    x, w, dy, eps = a["x"], a["weight"], a["dy"], EPS[norm]
    params = [w, a["bias"]] if norm == "layer" else [w]
    keep = ref.dropout_mask(x.shape, P, SEED)
    h = x if form == "plain" else formula_h(x, a["residual"], a["alpha"], keep, P)
    if h.dtype != x.dtype:   # 16-bit: the h returned, which the kernel normalises
        h = h.astype(x.dtype)
    g = dy.astype(np.float64) * w
    if norm == "layer":
        y, *stats = ref.layer_norm_forward(h, *params, eps)
        xhat = ref.layer_norm_forward(h, None, None, eps)[0]
        s2 = {"y": layer_norm_y_s2(xhat, *params), "dx": layer_norm_dx_s2(stats[1], g, xhat)}
    else:
        y, *stats = ref.rms_norm_forward(h, w, eps)
        s2 = {"dx": rms_norm_dx_s2(stats[0], g, ref.rms_norm_forward(h, None, eps)[0])}
    if form == "plain":
        grads = getattr(ref, f"{norm}_norm_backward")(dy, h, w, *stats)
        return dict(zip(_norm_outputs(norm, form), [y, *grads])), s2, {}
    return _fused_reference(norm, form, a, y, s2, keep, h, stats)


def _fused_reference(norm, form, a, y, s2, keep, h, stats):
    """The rest of `_norm_reference` for the fused forms: resnorm.reference's Pre-Norm
    backward (dh None for Post-Norm) at the kernel's h; dresidual's S2 adds |dh|, and dx's
    is dresidual's through alpha and the dropout factor."""
    x, alpha = a["x"], a["alpha"]
    dh = a["dh"] if form == "pre" else None
    grads = getattr(ref, _norm_name(norm, "pre") + "_backward")(
        a["dy"], dh, x, h, a["weight"], *stats, alpha, keep, P)
    want = {"y": y, **dict(zip(_norm_outputs(norm, "pre")[2:], grads))}
    dres_s2 = s2["dx"] if dh is None else s2["dx"] + np.abs(dh.astype(np.float64))
    s2 = {**s2, "dresidual": dres_s2,
          "dx": ref.dropout_backward(np.abs(np.asarray(alpha, np.float64)) * dres_s2, keep, P)}
    formula = {}
    if form == "pre":
        want["h"] = ref.scaled_residual_forward(a["residual"],
                                                ref.dropout_forward(x, P, SEED)[0], alpha)
        formula["h"] = h
    return want, s2, formula


def _elementwise_resnorm(name: str, a: dict[str, NDArray[Any]],
                         n_threads: int | None) -> dict[str, NDArray[Any]]:
    """resnorm's forward and backward of dropout, the scaled or the gated residual."""
    if name == "dropout":
        y, cache = resnorm.dropout_forward(a["x"], P, seed=SEED, n_threads=n_threads)
        return {"y": y, "dx": resnorm.dropout_backward(a["dy"], cache, n_threads=n_threads)}
    third = a["alpha"] if name == "scaled_residual" else a["g"]
    h, cache = getattr(resnorm, name + "_forward")(a["x"], a["residual"], third,
                                                   n_threads=n_threads)
    grads = getattr(resnorm, name + "_backward")(a["dh"], cache, n_threads=n_threads)
    last = "dalpha" if name == "scaled_residual" else "dg"
    return dict(zip(["h", "dx", "dF", last], [h, *grads]))


def _elementwise_reference(name, a):
    """(float64 reference, S2 (none), working-precision formula) of dropout, the scaled
    or the gated residual."""
    x, dh, keep = a["x"], a["dh"], ref.dropout_mask(a["x"].shape, P, SEED)
    if name == "dropout":
        want = {"y": ref.dropout_forward(x, P, SEED)[0],
                "dx": ref.dropout_backward(a["dy"], keep, P)}
        return want, {}, {"y": _dropped(x, keep, P), "dx": _dropped(a["dy"], keep, P)}
    F = a["residual"]
    if name == "scaled_residual":
        alpha = a["alpha"]
        want = dict(zip(["h", "dx", "dF", "dalpha"],
                        [ref.scaled_residual_forward(x, F, alpha),
                         *ref.scaled_residual_backward(dh, F, alpha)]))
        no_drop = np.ones(x.shape, bool)
        formula = {"h": formula_h(F, x, alpha, no_drop, 0.0),
                   "dx": dh, "dF": formula_h(dh, np.zeros_like(dh), alpha, no_drop, 0.0)}
        return want, {}, formula
    want = dict(zip(["h", "dx", "dF", "dg"], [ref.gated_residual_forward(x, F, a["g"]),
                                               *ref.gated_residual_backward(dh, F, a["g"])]))
    return want, {}, {"dx": dh}


_ELEMENTWISE_KINDS = {
    "dropout": {"y": "h", "dx": "h"},
    "scaled_residual": {"h": "h", "dx": "h", "dF": "h", "dalpha": "param"},
    "gated_residual": {"h": "gated", "dx": "h", "dF": "gated", "dg": "gated"},
}

# The gated RMSNorm's measured forms: name -> (norm_before_gate, groups per row: None for
# one).  The gate is the inputs' g, N(0, 1) logits.
_GATED = {
    "gated_rms_norm": (False, None),              # Mamba2, Bamba, Zamba2, ... (the default)
    "gated_rms_norm_norm_first": (True, None),    # Qwen3-Next
    "gated_rms_norm_grouped": (False, GROUPS),    # Mamba2 with n_groups
}


def _gated_group_size(groups: int | None, d: int) -> int | None:
    """The group_size of a gated form at row length d: None (one group), or d / gcd(d,
    groups): `GROUPS` groups where d allows, fewer (one for odd d) where it does not."""
    return None if groups is None else d // math.gcd(d, groups)


def _gated_kinds(before: bool) -> dict[str, str]:
    suffix = ", norm first" if before else ""
    return {"y": "gated y" + suffix, "dx": "gated dx" + suffix,
            "dgate": "gated dgate" + suffix, "dweight": "param"}


def _gated_resnorm(name: str, a: dict[str, NDArray[Any]],
                   n_threads: int | None) -> dict[str, NDArray[Any]]:
    """resnorm's training forward and backward of a gated RMSNorm form."""
    before, groups = _GATED[name]
    gs = _gated_group_size(groups, a["x"].shape[-1])
    y, cache = resnorm.gated_rms_norm_forward(a["x"], a["g"], a["weight"], EPS["rms"],
                                              group_size=gs, norm_before_gate=before,
                                              n_threads=n_threads)
    grads = resnorm.gated_rms_norm_backward(a["dy"], cache, n_threads=n_threads)
    return dict(zip(["y", "dx", "dgate", "dweight"], [y, *grads]))


def _gated_reference(name, a):
    """(float64 reference, S2 (`gated_rms_norm_s2`), no formula) of a gated RMSNorm form."""
    before, groups = _GATED[name]
    x, z, w, dy = a["x"], a["g"], a["weight"], a["dy"]
    gs = _gated_group_size(groups, x.shape[-1])
    y, cache = ref.gated_rms_norm_forward(x, z, w, EPS["rms"], gs, before)
    grads = ref.gated_rms_norm_backward(dy, cache)
    s2 = gated_rms_norm_s2(x, z, w, dy, cache["rstd"], gs, before)
    return (dict(zip(["y", "dx", "dgate", "dweight"], [y, *grads])),
            dict(zip(["dx", "dgate"], s2)), {})


@dataclasses.dataclass(frozen=True)
class _Function:
    """A measured public function (its training forward and backward): how resnorm and the
    reference compute its outputs, and which kind of bound each output has."""
    name: str
    kinds: dict[str, str]
    resnorm: Callable[[dict, int | None], dict]
    reference: Callable[[dict], tuple[dict, dict, dict]]


def _functions() -> dict[str, _Function]:
    found = {}
    for norm in ("rms", "layer"):
        for form in ("plain", "pre", "post"):
            name = _norm_name(norm, form)
            kinds = {o: _norm_kind(norm, o) for o in _norm_outputs(norm, form)}
            found[name] = _Function(
                name, kinds,
                lambda a, nt, n=norm, f=form: _norm_resnorm(n, f, a, nt),
                lambda a, n=norm, f=form: _norm_reference(n, f, a))
    for name, kinds in _ELEMENTWISE_KINDS.items():
        found[name] = _Function(name, kinds,
                                lambda a, nt, n=name: _elementwise_resnorm(n, a, nt),
                                lambda a, n=name: _elementwise_reference(n, a))
    for name, (before, _) in _GATED.items():
        found[name] = _Function(name, _gated_kinds(before),
                                lambda a, nt, n=name: _gated_resnorm(n, a, nt),
                                lambda a, n=name: _gated_reference(n, a))
    return found


FUNCTIONS = _functions()


# --------------------------------------------------------------------------- peers

def peers_installed() -> list[str]:
    """The peers whose packages are installed (torch; numba; onnxruntime and onnx).

    Returns
    -------
    peers : list of str
        Among `PEERS`.

    Examples
    --------
    >>> from resnorm import accuracy
    >>> set(accuracy.peers_installed()) <= set(accuracy.PEERS)
    True
    """
    from .bench import _peers

    return [p for p in PEERS if _peers.installed(p)]


def _torch_spec(norm: str, form: str, a: dict[str, NDArray[Any]]):
    """The torch eager computation of a norm function (autograd gives its backward), on
    the arrays it takes: torch.nn.functional's norm of h = residual + alpha*(x*m), m the
    dropout factor of resnorm's mask (another mask could not be compared)."""
    import torch.nn.functional as F

    from .bench._peers_torch import TorchSpec

    x, d, eps = a["x"], a["x"].shape[-1], EPS[norm]
    params = [a["weight"], a["bias"]] if norm == "layer" else [a["weight"]]

    def normed(h, *p):
        return F.layer_norm(h, (d,), *p, eps) if norm == "layer" else F.rms_norm(h, (d,), *p, eps)

    if form == "plain":
        return TorchSpec(normed, [x, *params], [a["dy"]])
    m = np.where(ref.dropout_mask(x.shape, P, SEED), 1.0 / (1.0 - P), 0.0).astype(x.dtype)

    def fused(tx, tr, ta, tm, *p):
        h = tr + ta * (tx * tm)
        return (normed(h, *p), h) if form == "pre" else normed(h, *p)

    grads = [a["dy"], a["dh"]] if form == "pre" else [a["dy"]]
    return TorchSpec(fused, [x, a["residual"], a["alpha"], m, *params], grads)


def _torch_outputs(norm, form, a):
    """torch eager's outputs of a norm function, by resnorm's output names."""
    import torch

    from .bench._peers_torch import _tensor, eager

    spec = _torch_spec(norm, form, a)
    forward = spec.fn(*[_tensor(torch, v) for v in spec.inputs])
    forward = list(forward) if isinstance(forward, tuple) else [forward]
    grads = eager(spec)(1, 1)()     # plain: dx, dweight[, dbias]
    if form != "plain":   # leaves x, residual, alpha, m, weight[, bias]: m's is not an output
        grads = [grads[0], grads[1], *grads[4:], grads[2]]
    names = _norm_outputs(norm, form)
    return dict(zip(names, [_numpy(t, a["x"].dtype) for t in forward + list(grads)]))


def _numpy(t, dtype: np.dtype) -> NDArray[Any]:
    """A torch tensor's values as an array of dtype (bfloat16: bit-cast)."""
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtype)
    return t.numpy()


def _branch(a: dict[str, NDArray[Any]]) -> NDArray[Any]:
    """alpha*dropout(x) in x's dtype: the x of the numba loop and of ONNX Runtime (which
    have neither), so that their h is resnorm's."""
    keep = ref.dropout_mask(a["x"].shape, P, SEED)
    return (np.asarray(a["alpha"]) * _dropped(a["x"], keep, P)).astype(a["x"].dtype)


def _numba_outputs(norm, form, a):
    """The numba fastmath row loop's y (bench's loop, through its public entry points)."""
    from .bench import _peers_numba

    params = [a["weight"], a["bias"]] if norm == "layer" else [a["weight"]]
    fused = {} if form == "plain" else {"res": a["residual"]}
    x = a["x"] if form == "plain" else _branch(a)
    call = getattr(_peers_numba, f"{norm}_norm")(x, *params, EPS[norm], **fused)
    return {"y": call(1, 1)()[0]}


def _onnx_outputs(norm, form, a):
    """ONNX Runtime's y (bench's one-node models)."""
    from .bench import _peers_onnx

    params = [a["weight"], a["bias"]] if norm == "layer" else [a["weight"]]
    if form == "plain":
        call = getattr(_peers_onnx, f"{norm}_norm")(a["x"], *params, EPS[norm])
    else:
        call = getattr(_peers_onnx, f"add_{norm}_norm")(_branch(a), a["residual"], *params,
                                                        EPS[norm], prenorm=False)
    return {"y": call(1, 1)()[0]}


_PEER_OUTPUTS = {"torch": _torch_outputs, "numba": _numba_outputs, "onnxruntime": _onnx_outputs}
# the dtypes each peer computes in: numba and ONNX Runtime (as the bench builds them) have
# no 16-bit kernels
_PEER_DTYPES = {"torch": ("float32", "float64", "float16", "bfloat16"),
                "numba": ("float32", "float64"), "onnxruntime": ("float32", "float64")}


def _torch_gated_outputs(name: str, a: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    """torch eager's outputs of a gated RMSNorm form: Hugging Face's modules as written,
    autograd for the backward.  Gate first, MambaRMSNormGated (Mamba2's, with its groups):
    ``h = x.float() * silu(gate.float())``, per group ``h * rsqrt(h.pow(2).mean + eps)``,
    ``weight * h.to(dtype)``; norm first, Qwen3NextRMSNormGated: the norm of x.float(),
    ``weight * h.to(dtype)``, times silu(gate.float()), ``.to(dtype)``.  float64 inputs stay
    float64 (as the bench's peer: HF's .float() would round them to float32)."""
    import torch
    import torch.nn.functional as F

    from .bench._peers_torch import TorchSpec, _tensor, eager

    before, groups = _GATED[name]
    x, d = a["x"], a["x"].shape[-1]
    gs = _gated_group_size(groups, d) or d
    acc = torch.float64 if x.dtype == np.float64 else torch.float32

    def gated(tx, tg, tw):
        h = tx.to(acc)
        if not before:
            h = h * F.silu(tg.to(acc))
        hg = h.view(*h.shape[:-1], d // gs, gs)
        hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + EPS["rms"])
        y = tw * hg.view(h.shape).to(tx.dtype)
        return (y * F.silu(tg.to(acc))).to(tx.dtype) if before else y

    spec = TorchSpec(gated, [x, a["g"], a["weight"]], [a["dy"]])
    y = gated(*[_tensor(torch, v) for v in spec.inputs])
    grads = eager(spec)(1, 1)()    # dx, dgate, dweight
    return dict(zip(["y", "dx", "dgate", "dweight"],
                    [_numpy(t, x.dtype) for t in [y, *grads]]))


def _peer_outputs(peer: str, function: str, a: dict[str, NDArray[Any]]
                  ) -> dict[str, NDArray[Any]] | None:
    """A peer's outputs of a norm function, None where it has no such computation (the
    gated RMSNorm: torch only; the bench's numba loops have the gate-first form alone, and
    it has no ONNX Runtime peer for it)."""
    if function in _GATED:
        if peer != "torch" or a["x"].dtype.name not in _PEER_DTYPES[peer]:
            return None
        return _torch_gated_outputs(function, a)
    form = next((f for n in ("rms", "layer") for f in ("plain", "pre", "post")
                 if _norm_name(n, f) == function), None)
    if form is None or a["x"].dtype.name not in _PEER_DTYPES[peer]:
        return None
    norm = "layer" if "layer" in function else "rms"
    try:
        return _PEER_OUTPUTS[peer](norm, form, a)
    except RuntimeError:   # an onnxruntime without this op for this dtype
        return None


# --------------------------------------------------------------------------- measuring

def _output_errors(kind, got, want, s2, formula, dtype):
    """{scale: errors} of one output in every scale its kind has."""
    errs = {"ref": errors(got, want, ulp(want.astype(dtype), dtype), dtype)}
    if PRIMARY[kind] == "S2":
        errs["S2"] = errors(got, want, ulp(s2.astype(dtype), dtype), dtype)
    elif kind == "param":
        errs["normwise"] = errors(got, want, normwise_ulp(want, dtype), dtype)
    elif kind == "h":
        f = np.asarray(formula, np.float64)
        errs["formula"] = errors(got, f, ulp(f.astype(dtype), dtype), dtype)
    return errs


def measure(function: str, dtype: np.dtype, case: str, sizes: Iterable[int] = QUICK_SIZES,
            *, quick: bool = True, n_threads: Sequence[int | None] = (None,),
            peers: Sequence[str] = (), seed: int = 0) -> list[Measurement]:
    """The errors of every output of one function (its training forward and backward) on one
    case and dtype, over row lengths `sizes`, for resnorm at each thread count (the worst of
    them) and for each peer that computes the output.

    Parameters
    ----------
    function : str
        A key of `FUNCTIONS` (rms_norm, add_layer_norm_post, dropout, ...).
    dtype : numpy.dtype
    case : str
        One of `CASES`.
    sizes : iterable of int, default `QUICK_SIZES`
        Row lengths D.
    quick : bool, default True
        Fewer rows (`row_count`).
    n_threads : sequence of int or None, default (None,)
        resnorm's thread counts (None: its default).
    peers : sequence of str, default ()
        Installed peers to measure too.
    seed : int, default 0

    Returns
    -------
    measurements : list of Measurement
        One per output; empty where the case does not apply to dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> [m] = accuracy.measure("rms_norm", np.dtype(np.float32), "normal", [16])[:1]
    >>> m.output, m.resnorm["ref"]["max"] <= 3
    ('y', True)
    """
    dtype, spec = np.dtype(dtype), FUNCTIONS[function]
    with np.errstate(over="ignore", invalid="ignore"):   # the cases overflow on purpose
        return _measure(spec, dtype, case, sizes, quick, n_threads, peers, seed)


def _measure(spec, dtype, case, sizes, quick, n_threads, peers, seed):
    ours = {o: [] for o in spec.kinds}
    theirs = {p: {} for p in peers}
    for d in sizes:
        a = inputs(case, (row_count(d, quick), d), dtype, seed)
        if a is None:
            return []
        want, s2, formula = spec.reference(a)

        def add(into, got):
            for o, g in got.items():
                errs = _output_errors(spec.kinds[o], g, want[o], s2.get(o), formula.get(o),
                                      dtype)
                into.setdefault(o, []).append(errs)

        seen = []
        for nt in n_threads:
            got = spec.resnorm(a, nt)
            if not any(_same_bits(got, other) for other in seen):   # the same errors again
                add(ours, got)
                seen.append(got)
        for p in peers:
            got = _peer_outputs(p, spec.name, a)
            if got is not None:
                add(theirs[p], got)
    return [Measurement(spec.name, o, spec.kinds[o], dtype.name, case, _stats(ours[o]),
                        {p: _stats(theirs[p][o]) for p in peers if o in theirs[p]})
            for o in spec.kinds]


def _same_bits(a: dict[str, NDArray[Any]], b: dict[str, NDArray[Any]]) -> bool:
    """Whether two runs' outputs are bitwise equal (thread counts usually agree)."""
    return all(np.asarray(a[o]).tobytes() == np.asarray(b[o]).tobytes() for o in a)


def _stats(runs: list[dict[str, NDArray[np.float64]]]) -> dict[str, dict[str, float]]:
    """{scale: statistics} over the runs (row lengths, thread counts) of one output."""
    return {scale: statistics([r[scale] for r in runs]) for scale in runs[0]}


def specials_stay(function: str, dtype: np.dtype, value: float, d: int = 17,
                  n_threads: int | None = None) -> bool:
    """Whether one NaN or inf in x stays in its row: every other row of every per-row
    output (y, h, dx, dresidual, dF, dg, dgate) is bitwise what it is without it.

    Parameters
    ----------
    function : str
        A key of `FUNCTIONS`.
    dtype : numpy.dtype
    value : float
        nan, inf or -inf.
    d : int, default 17
        The row length.
    n_threads : int, optional

    Returns
    -------
    stays : bool

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import accuracy
    >>> accuracy.specials_stay("layer_norm", np.dtype(np.float32), np.inf)
    True
    """
    clean, special, row = special_rows(value, (5, d), np.dtype(dtype))
    a = inputs("normal", (5, d), np.dtype(dtype))
    spec = FUNCTIONS[function]
    before = spec.resnorm({**a, "x": clean}, n_threads)
    after = spec.resnorm({**a, "x": special}, n_threads)
    others = np.arange(5) != row
    return all(np.array_equal(before[o][others].view(np.uint8), after[o][others].view(np.uint8))
               for o in before if np.shape(before[o]) == clean.shape)


# --------------------------------------------------------------------------- the table

def run(functions: Sequence[str] | None = None, dtype_names: Sequence[str] | None = None,
        cases: Sequence[str] = CASES, *, quick: bool = False,
        n_threads: Sequence[int | None] = (None,), peers: Sequence[str] | None = None,
        progress: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Measures every function, dtype and case: what ``python -m resnorm accuracy`` prints.

    Parameters
    ----------
    functions : sequence of str, optional
        Keys of `FUNCTIONS` (default: all).
    dtype_names : sequence of str, optional
        Among float32, float64, float16, bfloat16 (default: every one of `dtypes`).
    cases : sequence of str, default `CASES`
    quick : bool, default False
        `QUICK_SIZES` and fewer rows, instead of `FULL_SIZES`.
    n_threads : sequence of int or None, default (None,)
        resnorm's thread counts.
    peers : sequence of str, optional
        Default: every installed one.
    progress : callable, optional
        Called with the name of each function as it starts.

    Returns
    -------
    results : dict
        "measurements" (list of dicts, one per `Measurement`), "specials" (list of
        [function, dtype, value, stays]), "machine" (``resnorm.bench.machine_info()``)
        and what was asked.

    Raises
    ------
    ValueError
        For an unknown function, dtype or peer.

    Examples
    --------
    >>> from resnorm import accuracy
    >>> r = accuracy.run(["dropout"], ["float32"], ["normal"], quick=True, peers=[])
    >>> [(m["output"], m["resnorm"]["formula"]["max"]) for m in r["measurements"]]
    [('y', 0.0), ('dx', 0.0)]
    """
    from .bench import machine_info

    functions = list(functions or FUNCTIONS)
    known = {dt.name: dt for dt in dtypes()}
    chosen = [known[n] if n in known else _unknown("dtype", n, known)
              for n in (dtype_names or known)]
    peers = peers_installed() if peers is None else list(peers)
    for n in functions:
        FUNCTIONS.get(n) or _unknown("function", n, FUNCTIONS)
    for p in peers:
        p in PEERS or _unknown("peer", p, PEERS)
    sizes = QUICK_SIZES if quick else FULL_SIZES
    measurements, specials = [], []
    for name in functions:
        if progress:
            progress(name)
        for dt in chosen:
            for case in cases:
                measurements += measure(name, dt, case, sizes, quick=quick,
                                        n_threads=n_threads, peers=peers)
            specials += [[name, dt.name, v, specials_stay(name, dt, v)]
                         for v in SPECIALS]
    return {"measurements": [dataclasses.asdict(m) for m in measurements],
            "specials": specials, "sizes": list(sizes), "quick": quick,
            "n_threads": list(n_threads), "peers": peers, "machine": machine_info()}


def _unknown(what, name, known):
    raise ValueError(f"unknown {what} {name!r}; known: {', '.join(known)}")


def _cell(stats: dict[str, dict[str, float]], primary: str) -> str:
    """max in the primary scale / p99.99 ulp(ref) / mean ulp(ref)."""
    r = stats["ref"]
    return f"{_num(stats[primary]['max'])} / {_num(r['p99.99'])} / {_num(r['mean'])}"


def _num(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.3g}"


def report(results: dict[str, Any]) -> str:
    """The Markdown tables of `run`'s results: per function, output and dtype, a row per
    case with resnorm's max (in the output's scale) / p99.99 / mean ulp(ref) beside each
    peer's; "FAILS" where resnorm misses a bound of the contract, "*" beside a peer more
    accurate than resnorm; then whether NaN and inf stay in their row.

    Parameters
    ----------
    results : dict
        What `run` returned (or its JSON, read back).

    Returns
    -------
    text : str

    Examples
    --------
    >>> from resnorm import accuracy
    >>> r = accuracy.run(["dropout"], ["float32"], ["normal"], quick=True, peers=[])
    >>> print(accuracy.report(r).splitlines()[0])
    ## Summary: the worst case
    """
    peers = results["peers"]
    lines, last_function = _summary_lines(results["measurements"], peers), None
    for group in _groups(results["measurements"]):
        first = group[0]
        m0 = Measurement(**first)
        if first["function"] != last_function:
            last_function = first["function"]
            lines += [f"## {last_function}", ""]
        bounds = "; ".join(str(b) for b in BOUNDS[m0.kind, _column(m0.dtype)]) \
            or "no bound in the contract: reported"
        scale = _SCALE_NAMES[PRIMARY[m0.kind]]
        lines += [f"### {m0.output}, {m0.dtype} (bound: {bounds})", "",
                  f"max {scale} / p99.99 ulp(ref) / mean ulp(ref)", "",
                  "| case | resnorm | " + " | ".join(peers) + " |" if peers else
                  "| case | resnorm |",
                  "|---|---|" + "---|" * len(peers)]
        for row in group:
            m = Measurement(**row)
            failed = bound_failures(m)
            cells = [m.case, _cell(m.resnorm, PRIMARY[m.kind])
                     + (" FAILS: " + ", ".join(failed) if failed else "")]
            for p in peers:
                cells.append(_cell(m.peers[p], PRIMARY[m.kind])
                             + (" *" if peer_wins(m, p) else "") if p in m.peers else "")
            if any(b.stat == "equal" for b in BOUNDS[m.kind, _column(m.dtype)]):
                cells[1] += f", {100 * m.resnorm['ref']['equal']:.2f}% equal"
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += _specials_lines(results["specials"])
    return "\n".join(lines)


def _summary_lines(rows, peers):
    """The worst case of every function, output and dtype: max in the output's scale for
    resnorm (FAILS: a bound missed on some case) and each peer."""
    lines = ["## Summary: the worst case", "",
             "max error over every case, in the scale of the output's bound", "",
             "| function | output | dtype | scale | resnorm | " + " | ".join(peers) + " |",
             "|---|---|---|---|---|" + "---|" * len(peers)]
    for group in _groups(rows):
        ms = [Measurement(**row) for row in group]
        primary = PRIMARY[ms[0].kind]
        ours = _num(max(m.resnorm[primary]["max"] for m in ms))
        if any(bound_failures(m) for m in ms):
            ours += " FAILS"
        cells = [max((m.peers[p][primary]["max"] for m in ms if p in m.peers), default=None)
                 for p in peers]
        lines.append(f"| {ms[0].function} | {ms[0].output} | {ms[0].dtype} | "
                     f"{_SCALE_NAMES[primary]} | {ours} | "
                     + " | ".join("" if c is None else _num(c) for c in cells) + " |")
    return lines + [""]


def _groups(rows):
    """The measurements grouped by (function, output, dtype), cases in order."""
    groups = {}
    for row in rows:
        groups.setdefault((row["function"], row["output"], row["dtype"]), []).append(row)
    return list(groups.values())


def _specials_lines(specials):
    bad = [f"{f} {dt} {v}" for f, dt, v, stays in specials if not stays]
    head = ["## NaN and inf", "",
            "One NaN or inf in a row of x: every other row of every per-row output is "
            "bitwise unchanged."]
    if not bad:
        return head + [f"Holds for all {len(specials)} function, dtype and value "
                       "combinations measured.", ""]
    return head + ["FAILS for: " + ", ".join(bad), ""]
