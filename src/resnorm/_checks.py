"""Every argument check of the public API, in one place and one error style.

Errors name the argument and say what was expected: TypeError for a wrong kind or dtype,
ValueError for a wrong value or shape.  The table of checks is docs/input-checks.md.
"""
import math
import numbers

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# More threads than this is a mistake, and one OpenMP cannot start ends the process
# (libgomp: "Thread creation failed"), so it is refused up front.
MAX_THREADS = 1024


def float_array(x, name):
    """x as an ndarray of float32/float64 with native byte order and at least one axis.

    Array-likes (lists, tuples) are converted with np.asarray; nothing is cast: integer,
    bool, complex, float16 or object data is a TypeError.
    """
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name} must be a float32 or float64 array, got {type(x).__name__}") from e
    not_masked(x, name)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float32 or float64, got {x.dtype}")
    if not x.dtype.isnative:
        raise TypeError(f"{name} must be in native byte order, got dtype {x.dtype.str!r}")
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (shape (..., D)), got a scalar")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last axis, got shape {x.shape}")
    return x


def like_array(a, name, shape, dtype):
    """a as an ndarray with exactly this shape and dtype (the partner of another argument)."""
    if not isinstance(a, np.ndarray):
        try:
            a = np.asarray(a)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name} must be a {dtype} array of shape {shape}, got {type(a).__name__}") from e
    not_masked(a, name)
    if a.dtype != dtype or not a.dtype.isnative:
        raise TypeError(f"{name} must have dtype {dtype} (native byte order), got {a.dtype.str!r}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    return a


def not_masked(a, name):
    """Masked arrays are refused: the kernels would read the masked values as data."""
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{name} must be a plain ndarray, got a masked array (its mask would "
                        f"be ignored); pass {name}.filled(...) or the unmasked rows")


def optional_param(p, name, d, dtype):
    """None, or a (D,) vector of the input's dtype (weight, bias)."""
    if p is None:
        return None
    return like_array(p, name, (d,), dtype)


def eps_value(eps, dtype):
    """eps as a float: a real number, finite and at least the smallest normal number of the
    input's dtype (float32: 1.2e-38), so that rstd <= 1/sqrt(eps) fits that dtype even for
    an all-zero row."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    eps = float(eps)
    if not (math.isfinite(eps) and eps > 0.0):
        raise ValueError(f"eps must be finite and > 0, got {eps!r}")
    tiny = float(np.finfo(dtype).tiny)
    if eps < tiny:
        raise ValueError(f"eps must be >= {tiny:.4g} (the smallest normal {np.dtype(dtype)}) "
                         f"for {np.dtype(dtype)} input, got {eps!r}")
    return eps


def n_threads_value(n_threads):
    """None (OpenMP default) or an int in [1, MAX_THREADS]."""
    if n_threads is None:
        return None
    if isinstance(n_threads, (bool, np.bool_)) or not isinstance(n_threads, numbers.Integral):
        raise TypeError(f"n_threads must be None or an int >= 1, got {type(n_threads).__name__}")
    if not 1 <= n_threads <= MAX_THREADS:
        raise ValueError(f"n_threads must be None or an int >= 1 and <= {MAX_THREADS}, "
                         f"got {n_threads}")
    return int(n_threads)


def out_array(out, shape, dtype, inputs):
    """The caller's output buffer: a writeable ndarray of this shape and dtype.

    It may be exactly one of the inputs (same memory, same strides: an in-place call), but it
    must not otherwise overlap any of them, as a partial overlap would be read after written.
    """
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"out must have dtype {dtype}, got {out.dtype.str!r}")
    if out.shape != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out must be writeable, got a read-only array")
    for name, a in inputs.items():
        if a is not None and np.may_share_memory(out, a) and not same_memory(out, a):
            raise ValueError(f"out overlaps {name} without being the same array; "
                             f"pass out={name} for an in-place call, or a separate buffer")
    return out


def same_memory(a, b):
    """True when a and b are views of exactly the same elements in the same layout."""
    return (a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def training_cache(cache, stat_names):
    """A training cache as its forward function made it.  The kernels trust its arrays'
    shapes, so a hand-built or edited cache with wrong ones would read out of bounds."""
    x = cache.x
    ok = (isinstance(x, np.ndarray) and x.ndim == 2 and x.dtype in FLOAT_DTYPES
          and x.flags.c_contiguous and x.flags.aligned
          and isinstance(cache.shape, tuple) and len(cache.shape) >= 1
          and cache.shape[-1] == x.shape[1] and math.prod(cache.shape) == x.size)
    for name in stat_names:
        a = getattr(cache, name)
        ok = ok and (isinstance(a, np.ndarray) and a.dtype == np.float64
                     and a.shape == (x.shape[0],) and a.flags.c_contiguous and a.flags.aligned)
    w = cache.weight
    ok = ok and (w is None or (isinstance(w, np.ndarray) and w.dtype == x.dtype
                               and w.shape == (x.shape[1],) and w.flags.c_contiguous
                               and w.flags.aligned))
    if not ok:
        raise ValueError(f"cache is not as the forward function returned it: its arrays "
                         f"have inconsistent shapes, dtypes or layouts ({type(cache).__name__} "
                         f"must not be built or edited by hand)")
