"""What one benchmark case is, and the registry the op modules fill.

A case is one op at one shape and dtype, with its data allocated once.  It holds:

* ``out(n)`` / ``alloc(n)``: resnorm on n threads writing into preallocated outputs / into
  outputs it allocates (``out`` is None for ops whose API always allocates);
* ``numpy()``: the same computation as a NumPy user would write it, in the same dtype;
* ``torch()``: PyTorch CPU (None when torch is not installed or has no equivalent);
* ``traffic``: the op's minimum memory traffic in bytes: every input read once, every
  output written once (the resnorm API's outputs, parameter gradients included).
"""
import zlib
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import numpy as np

FORWARD, BACKWARD, FUSED_PRENORM = "forward", "backward", "fused Pre-Norm"


@dataclass
class Case:
    traffic: int                         # bytes
    alloc: Callable[[int], object]
    numpy: Callable[[], object]
    out: Callable[[int], object] | None = None
    torch: Callable[[], object] | None = None
    op: str = ""                         # filled in by setup() from the registry
    kind: str = ""                       # FORWARD, BACKWARD or FUSED_PRENORM

    def resnorm(self, n_threads, preallocated=True):
        """resnorm's call bound to n_threads (preallocated outputs when the op takes them)."""
        fn = self.out if preallocated and self.out is not None else self.alloc
        return partial(fn, n_threads)

    def variants(self):
        """[(preallocated, fn(n))]: both forms when the op takes an output, else allocating."""
        return ([(True, self.out)] if self.out is not None else []) + [(False, self.alloc)]


_REGISTRY = {}


def register(name, kind):
    """Decorator: setup(shape, dtype, torch) -> Case of kind, listed under name in
    resnorm.bench.OPS."""
    def deco(setup):
        _REGISTRY[name] = (kind, setup)
        return setup
    return deco


def ops():
    return list(_REGISTRY)


def kind(op):
    return _REGISTRY[op][0]


def setup(op, shape, dtype, torch=None):
    """The Case of op at shape (N, D) and dtype; torch is the torch module or None."""
    if op not in _REGISTRY:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(_REGISTRY)}")
    kind, make = _REGISTRY[op]
    return replace(make(tuple(shape), np.dtype(dtype), torch), op=op, kind=kind)


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
            else:
                made[name] = rng.standard_normal(shape, dtype=dtype)
    return [made[name] for name in names]


def tensors(torch, arrays, grad=False):
    """torch views of numpy arrays (None without torch); leaves that require grad if asked."""
    if torch is None:
        return [None] * len(arrays)
    return [torch.from_numpy(a).requires_grad_(grad) for a in arrays]


def autograd(torch, outputs, inputs, grads):
    """A call of torch's backward through a graph built once (what a training step pays)."""
    return lambda: torch.autograd.grad(outputs, inputs, grads, retain_graph=True)


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
