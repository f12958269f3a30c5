"""What one benchmark case is, and the registry the op modules fill.

A case is one op at one shape and dtype, with its data allocated once.  It holds:

* ``out(n)`` / ``alloc(n)``: resnorm on n threads writing into preallocated outputs / into
  outputs it allocates;
* ``reference(rows, keep)``: the float64 reference (resnorm.reference) of the op's outputs
  for a slice of rows, in the order resnorm returns them; the outputs listed in ``summed``
  are sums over rows (parameter gradients), the others have one row per input row.
  ``keep`` is the dropout mask of the output being checked (random ops only, else None);
* ``peers``: name -> bind(threads, used) -> call(): the same computation as another library
  runs it (``used``: the threads resnorm's call runs on), each returning outputs in
  resnorm's order (None where it has no such output);
* ``torch``: the PyTorch computation (a _peers_torch.TorchSpec), from which torch eager and
  torch.compile are made; None without torch;
* ``traffic``: the op's minimum memory traffic in bytes: every input read once, every
  output written once (the resnorm API's outputs, parameter gradients included).
"""
import zlib
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable

import numpy as np

# fused: add + norm forward (Pre-Norm and Post-Norm)
FORWARD, BACKWARD, FUSED = "forward", "backward", "fused"


def parts(result):
    """A call's outputs as a tuple (one array -> a tuple of one)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


@dataclass
class Case:
    traffic: int                         # bytes
    out: Callable[[int], object]         # resnorm's call into preallocated outputs
    alloc: Callable[[int], object]       # the same call, allocating its outputs
    reference: Callable[[slice, object], tuple]
    peers: dict = field(default_factory=dict)
    torch: object = None                 # a _peers_torch.TorchSpec, or None
    summed: tuple = ()                   # indices of outputs that are sums over rows
    flat: Callable[[object], tuple] = parts   # resnorm's result -> its outputs in order
    p: float = 0.0                       # random ops: the dropout probability
    keep: Callable[[tuple], np.ndarray] | None = None   # random ops: outputs -> kept mask
    op: str = ""                         # op, kind, shape, dtype: filled in by setup()
    kind: str = ""                       # FORWARD, BACKWARD or FUSED
    shape: tuple = ()
    dtype: np.dtype = None
    memo: dict = field(default_factory=dict, repr=False)   # the checker's cached reference

    def resnorm(self, n_threads, preallocated=True):
        """resnorm's call bound to n_threads, into preallocated outputs or allocating."""
        return partial(self.out if preallocated else self.alloc, n_threads)

    def variants(self):
        """[(preallocated, fn(n))]: both forms."""
        return [(True, self.out), (False, self.alloc)]


def bound(fn, *args):
    """fn with its leading positional arguments bound: a case's call then passes only
    keywords, as a user's call does.  (A call spelled ``fn(x, *params, out=y)`` builds a
    keyword dict on every call: about 0.9 us of a 2 us fused call on this machine, time
    the user does not pay; a partial of positional arguments passes keywords on as they
    are.)"""
    return partial(fn, *args)


def fixed(fn):
    """A peer whose call does not depend on the thread count (NumPy runs on one thread)."""
    return lambda threads, used: fn


_REGISTRY = {}


def register(name, kind, table=True):
    """Decorator: setup(shape, dtype, torch) -> Case of kind, listed under name in
    resnorm.bench.OPS.  table=False: left out of the default table (the training forms,
    which run the inference form's kernel and also return its statistics)."""
    def deco(setup):
        _REGISTRY[name] = (kind, table, setup)
        return setup
    return deco


def dtype_of(name):
    """The NumPy dtype of a --dtype name; bfloat16 is ml_dtypes' (imported here, on
    request)."""
    if name != "bfloat16":
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError as e:
        raise ValueError("the bfloat16 benchmark needs ml_dtypes (pip install ml_dtypes)") from e
    return np.dtype(ml_dtypes.bfloat16)


def ops():
    return list(_REGISTRY)


def table_ops():
    """The ops of the default table: every op but the training forms."""
    return [op for op, (_, table, _) in _REGISTRY.items() if table]


def kind(op):
    return _REGISTRY[op][0]


def setup(op, shape, dtype, torch=None):
    """The Case of op at shape (N, D) and dtype; torch is the torch module or None."""
    if op not in _REGISTRY:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(_REGISTRY)}")
    kind, _, make = _REGISTRY[op]
    shape, dtype = tuple(shape), dtype_of(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    return replace(make(shape, dtype, torch), op=op, kind=kind, shape=shape, dtype=dtype)


# --------------------------------------------------------------------------- data

_data = {"key": None, "arrays": {}}


def arrays(shape, dtype, names):
    """Seeded inputs, one generator per name: (N, D) standard normal arrays, and (D,)
    vectors for 'w' (around 1) and 'b' (around 0).

    The arrays of the latest (shape, dtype) are kept and shared by the cases that ask for
    the same name (ops never write their inputs): drawing 8192 x 4096 normals costs more
    than timing many of the ops."""
    key = (tuple(shape), dtype.str)
    if _data["key"] != key:
        _data["key"], _data["arrays"] = key, {}
    made = _data["arrays"]
    for name in names:
        if name not in made:
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            if name == "w":
                made[name] = (1.0 + 0.1 * rng.standard_normal(shape[1])).astype(dtype)
            elif name == "b":
                made[name] = (0.1 * rng.standard_normal(shape[1])).astype(dtype)
            elif dtype.itemsize == 2:   # drawn in float32, rounded to the 16-bit dtype
                made[name] = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
            else:
                made[name] = rng.standard_normal(shape, dtype=dtype)
    return [made[name] for name in names]


def f64_sum(a, b):
    """a + b in float64 (the reference's h of a Post-Norm block, which resnorm recomputes)."""
    return a.astype(np.float64) + b


# --------------------------------------------------------------------------- NumPy versions

def numpy_rms(x, w, eps=1e-6):
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)).astype(x.dtype) * w


def numpy_layer(x, w, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    c = x - mean
    return c * (1.0 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)).astype(x.dtype) * w + b


def numpy_rms_backward(dy, x, w, rstd):
    """(dx, dweight) from the cached rstd (a (N, 1) column in x's dtype)."""
    xn = x * rstd
    g = dy * w
    dx = rstd * (g - xn * np.mean(g * xn, axis=-1, keepdims=True))
    return dx, (dy * xn).sum(axis=0)


def numpy_layer_backward(dy, x, w, mean, rstd):
    """(dx, dweight, dbias) from the cached mean and rstd ((N, 1) columns in x's dtype)."""
    xhat = (x - mean) * rstd
    g = dy * w
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def column(stat, dtype):
    """A cached float64 row statistic as the (N, 1) column a NumPy user would keep."""
    return stat.astype(dtype)[:, None]
