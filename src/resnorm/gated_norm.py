"""The gated RMSNorm of hybrid Mamba models, over the last axis, in groups.

Two forms, as the Hugging Face models write them:

* gate before the norm (``norm_before_gate=False``: Mamba2, Bamba, Granite-4.0-H, Zamba2,
  NemotronH): ``u = x * silu(gate)``, ``y = u * rstd(u) * w``;
* norm before the gate (``norm_before_gate=True``: Qwen3-Next, and Falcon-H1 by default):
  ``y = x * rstd(x) * w * silu(gate)``;

with ``silu(z) = z * sigmoid(z)`` and ``rstd(v) = 1/sqrt(mean(v**2) + eps)`` over each
group of ``group_size`` consecutive elements of the last axis (None: the whole axis; a
grouped norm gives each group its own statistic and its slice of the weight).  Without a
gate both forms are the (grouped) RMSNorm.  One kernel pass per row: the gate's product is
formed once per element, in float32 for float32 and 16-bit rows (rounded once on the way
out) and in float64 for float64, with the row sums in float64.  docs/gated_rms_norm.md
derives the backward.

Each function here declares a compiled function of resnorm._api (``@compiled``).
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._api import GatedRMSNormCache
from ._compiled import compiled

__all__ = ["GatedRMSNormCache", "gated_rms_norm", "gated_rms_norm_backward",
           "gated_rms_norm_forward"]


@compiled
def gated_rms_norm_forward(x: ArrayLike, gate: ArrayLike | None = None,
                           weight: ArrayLike | None = None, eps: float = 1e-6, *,
                           group_size: int | None = None, norm_before_gate: bool = False,
                           out: NDArray[np.floating] | None = None,
                           n_threads: int | None = None
                           ) -> tuple[NDArray[np.floating], GatedRMSNormCache]:
    """The gated RMSNorm, keeping what backward needs.

    ``y = u * rstd(u) * w`` with ``u = x * silu(gate)`` (or, with ``norm_before_gate``,
    ``y = x * rstd(x) * w * silu(gate)``), ``rstd`` per group of ``group_size`` elements.

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16, shape (..., D)
        The rows to normalise.
    gate : array_like, optional
        The gate ``z``, x's shape and dtype; None: no gate (the grouped RMSNorm of x).
    weight : ndarray, shape (D,), optional
        The per-channel gain ``w``, of x's dtype (or float32 beside float16 / bfloat16 x:
        dweight is then float32); None means 1.
    eps : float, default 1e-6
        Added to each group's mean square; finite and at least the smallest normal float32
        (float64 x: float64).
    group_size : int, optional
        The elements of each normalised group, a divisor of D; None: D (one group per row).
    norm_before_gate : bool, default False
        False: the gate multiplies x before the norm (Mamba2).  True: it multiplies the
        normalised output (Qwen3-Next).
    out : ndarray, optional
        Buffer for y (x's shape and dtype); it must share no memory with x, gate or weight.
    n_threads : int, optional
        Threads of the kernel; None uses the OpenMP default (inputs under 16384 elements
        run on one thread).

    Returns
    -------
    y : ndarray
        x's shape and dtype (``out`` when given).
    cache : GatedRMSNormCache
        What :func:`gated_rms_norm_backward` needs: x's and the gate's rows (by reference),
        the weight and one rstd (float64) per group of each row.

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    See Also
    --------
    gated_rms_norm : the inference form.
    resnorm.reference.gated_rms_norm_forward : the NumPy twin.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> x = np.array([[3.0, 4.0]])
    >>> y, cache = resnorm.gated_rms_norm_forward(x, np.zeros((1, 2)), eps=1e-12)
    >>> y, cache.rstd          # silu(0) = 0: every u is 0, and so is y
    (array([[0., 0.]]), array([1000000.]))
    """


@compiled
def gated_rms_norm(x: ArrayLike, gate: ArrayLike | None = None,
                   weight: ArrayLike | None = None, eps: float = 1e-6, *,
                   group_size: int | None = None, norm_before_gate: bool = False,
                   out: NDArray[np.floating] | None = None,
                   n_threads: int | None = None) -> NDArray[np.floating]:
    """The gated RMSNorm: ``rms_norm(x * silu(gate)) * w`` per group of ``group_size``.

    The inference form of :func:`gated_rms_norm_forward` (same arguments; no cache);
    ``out=x`` normalises in place.

    Parameters
    ----------
    x : array_like of float32, float64, float16 or bfloat16, shape (..., D)
    gate : array_like, optional
    weight : ndarray, shape (D,), optional
    eps : float, default 1e-6
    group_size : int, optional
    norm_before_gate : bool, default False
        As in :func:`gated_rms_norm_forward`.
    out : ndarray, optional
        Buffer for y; it may be x itself.
    n_threads : int, optional

    Returns
    -------
    y : ndarray
        x's shape and dtype (``out`` when given).

    Raises
    ------
    TypeError, ValueError
        For bad arguments, naming the argument.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> x = np.array([[1.0, 2.0, 3.0, 4.0]])
    >>> gate = np.full((1, 4), 50.0)    # silu(50) = 50: the gate scales, the norm undoes it
    >>> resnorm.gated_rms_norm(x, gate, eps=1e-12).round(4)
    array([[0.3651, 0.7303, 1.0954, 1.4606]])

    Two groups of two, each normalised on its own:

    >>> resnorm.gated_rms_norm(x, group_size=2, eps=1e-12).round(4)
    array([[0.6325, 1.2649, 0.8485, 1.1314]])
    """


@compiled
def gated_rms_norm_backward(dy: ArrayLike, cache: GatedRMSNormCache, *,
                            out: NDArray[np.floating] | None = None,
                            dgate_out: NDArray[np.floating] | None = None,
                            n_threads: int | None = None
                            ) -> tuple[NDArray[np.floating], NDArray[np.floating] | None,
                                       NDArray[np.floating] | None]:
    """Gradients of :func:`gated_rms_norm_forward`.

    Gate first, per group: with ``g = dy * w``, ``un = u * rstd`` and ``m = mean(g * un)``,
    ``du = rstd * (g - un * m)``, ``dx = du * silu(z)``, ``dgate = du * x * silu'(z)``.
    Norm first: ``dgate = dy * (xn * w) * silu'(z)``, and the RMSNorm backward of
    ``da = dy * silu(z)`` gives dx.  ``silu'(z) = s + z * s * (1 - s)``, ``s = sigmoid(z)``;
    ``dweight`` sums ``dy * un`` (norm first: ``da * xn``) over rows.

    Parameters
    ----------
    dy : ndarray
        Gradient of y: the forward input's shape and dtype.
    cache : GatedRMSNormCache
        From :func:`gated_rms_norm_forward`.
    out : ndarray, optional
        Buffer for dx; it may be dy itself, never an array the cache holds.
    dgate_out : ndarray, optional
        Buffer for dgate (only when the forward had a gate); it may be dy itself.
    n_threads : int, optional

    Returns
    -------
    dx : ndarray
    dgate : ndarray or None
        None when the forward had no gate.
    dweight : ndarray or None
        Of the weight's shape and dtype; None when the forward had no weight.

    Raises
    ------
    TypeError, ValueError
        For bad arguments or a cache not made by :func:`gated_rms_norm_forward`.

    Examples
    --------
    >>> import numpy as np, resnorm
    >>> x, gate = np.array([[3.0, 4.0]]), np.array([[0.0, 0.0]])
    >>> y, cache = resnorm.gated_rms_norm_forward(x, gate, np.ones(2), eps=1e-12)
    >>> dx, dgate, dw = resnorm.gated_rms_norm_backward(np.ones((1, 2)), cache)
    >>> dx, dgate.round(4), dw
    (array([[0., 0.]]), array([[1500000., 2000000.]]), array([0., 0.]))
    """
