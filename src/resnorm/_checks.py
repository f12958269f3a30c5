"""Argument checks for Python code: those of the public kernel functions, which live in the
compiled call path (resnorm_c/checks.pxi) and are re-exported here for resnorm.nn and
explain, and the checks of resnorm.nn's modules.

One error style: TypeError for a wrong kind or dtype, ValueError for a wrong value or shape;
the message names the argument and says what was expected (docs/input-checks.md).
"""
import math
import numbers

import numpy as np

from ._api import (FLOAT_DTYPES, MAX_THREADS, eps_value, flag, float_array, gate_array,
                   is_element_dtype, like_array, n_threads_value, not_masked, optional_param,
                   out_array, probability, residual_scale, same_memory, seed_value)

__all__ = ["FLOAT_DTYPES", "MAX_THREADS", "eps_value", "flag", "float_array", "float_dtype",
           "gate_array", "like_array", "module_input", "n_threads_value", "not_masked",
           "one_of", "optional_param", "out_array", "positive_int", "probability",
           "real_value", "residual_scale", "same_memory", "seed_value"]


# --------------------------------------------------------------------------- nn modules

def positive_int(v, name):
    """v as an int >= 1 (bool is not an int here)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 1, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v}")
    return int(v)


def one_of(v, name, options):
    """v, which must be one of the strings in options."""
    if not isinstance(v, str) or v not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}; got {v!r}")
    return v


def float_dtype(dtype, name="dtype", halves=False):
    """dtype as np.dtype float32 or float64 (halves: float16 and bfloat16 too, the dtypes of
    the modules that run only resnorm's kernels: norms, dropout, residual connections)."""
    want = "float32, float64, float16 or bfloat16" if halves else "float32 or float64"
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"{name} must be {want}, got {dtype!r}") from e
    if not (dt in FLOAT_DTYPES or (halves and is_element_dtype(dt))):
        raise TypeError(f"{name} must be {want}, got {dt}")
    return dt


def real_value(v, name):
    """v as a finite float."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v!r}")
    return v


def module_input(x, name, dtype, last, ndim=None):
    """x as an array of the module's dtype with last axis `last` (and exactly ndim axes when
    ndim is given, e.g. 3 for (B, T, D)).  No silent casts: a float64 array given to a float32
    module is a TypeError."""
    x = float_array(x, name, dtype not in FLOAT_DTYPES)
    if x.dtype != dtype:
        raise TypeError(f"{name} must have the module's dtype {dtype}, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        want = "(B, T, D)" if ndim == 3 else f"{ndim} axes"
        raise ValueError(f"{name} must have shape {want} with D = {last}, got shape {x.shape}")
    if x.shape[-1] != last:
        raise ValueError(f"{name} must have last axis {last}, got shape {x.shape}")
    return x
