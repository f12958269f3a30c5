"""Inverted dropout with a counter-based mask: checks, then one compiled kernel call.

Training:  y = x * keep / (1 - p), keep_k = 1 with probability 1 - p.   Eval: y = x.

keep_k is decided by the 32-bit Philox-4x32-10 uniform of (seed, k), k the element's flat
C-order index: element k is kept when uniform >= floor(p * 2**32).  The mask is therefore a
pure function of (seed, k): the same for any thread count and on any machine, and backward
regenerates it from the seed instead of storing it (docs/dropout.md).

Forms, as in resnorm.norms:

* ``y = dropout(x, p, seed=s)``
* ``y, cache = dropout_forward(x, p, seed=s)`` and ``dx = dropout_backward(dy, cache)``.
  With ``return_mask=True`` the boolean keep-mask is also computed, as ``cache.mask``.

Use a different seed for every dropout site and every step (for example a hash of (step,
layer)): the same seed gives the same mask for every array of the same size.
"""
from dataclasses import dataclass

import numpy as np

from . import _checks, _residual
from ._parallel import streams, threads_for
from .norms import _finish, _output_rows, _rows

_TWO_32 = 4294967296.0


@dataclass(frozen=True)
class DropoutSpec:
    """One dropout site: the probability p, the seed, and whether the call is training."""
    p: float
    seed: int
    training: bool

    @property
    def active(self):
        """False for eval mode and for p = 0: then dropout is exactly the identity."""
        return self.training and self.p > 0.0

    @property
    def threshold(self):
        """Elements whose uniform is below this are dropped: floor(p * 2**32), exact in
        double.  For p = 1 (all dropped) the multiplier is 0 instead: 2**32 would not fit."""
        return 0xFFFFFFFF if self.p == 1.0 else int(self.p * _TWO_32)

    @property
    def scale(self):
        """The multiplier of kept elements, 1/(1-p); 0 for p = 1."""
        return 0.0 if self.p == 1.0 else 1.0 / (1.0 - self.p)

    def kernel_arg(self):
        """The Dropout struct the kernels of resnorm_c/residual.pyx take."""
        if not self.active:
            return {"on": False, "seed": 0, "threshold": 0, "scale": 1.0}
        return {"on": True, "seed": self.seed, "threshold": self.threshold, "scale": self.scale}

    def mask(self, shape, n_threads):
        """The boolean keep-mask of an array of this shape (what the kernels apply)."""
        if not self.active:
            return np.ones(shape, dtype=bool)
        if self.p == 1.0:
            return np.zeros(shape, dtype=bool)
        keep = np.empty(int(np.prod(shape)), dtype=np.uint8)
        _residual.dropout_mask(keep, self.kernel_arg(), threads_for(n_threads, keep.size))
        return keep.view(bool).reshape(shape)


def dropout_spec(p, seed, training):
    """Checks p, seed and training; returns their DropoutSpec."""
    return DropoutSpec(_checks.probability(p), _checks.seed_value(seed),
                       _checks.flag(training, "training"))


def valid_spec(spec):
    """True for a DropoutSpec as dropout_spec makes it (caches keep one)."""
    try:
        return isinstance(spec, DropoutSpec) and dropout_spec(spec.p, spec.seed,
                                                              spec.training) == spec
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class DropoutCache:
    """What dropout_backward needs: the site (p, seed) and the shape, never the mask."""
    spec: DropoutSpec
    shape: tuple
    dtype: np.dtype
    mask: np.ndarray | None  # bool keep-mask, only with return_mask=True


def _apply(a, name, spec, out, n_threads):
    """a * multipliers of spec (a copy of a when dropout is inactive)."""
    rows = _rows(a)
    out_rows = _output_rows(out, rows, a.shape, {name: a})
    if not spec.active:
        np.copyto(out_rows, rows)
    else:
        _residual.dropout_forward(out_rows.reshape(-1), rows.reshape(-1), spec.kernel_arg(),
                                  threads_for(n_threads, rows.size), streams(out_rows.nbytes))
    return _finish(out, out_rows, a.shape)


def dropout_forward(x, p, *, seed, training=True, out=None, n_threads=None, return_mask=False):
    """y = x * keep / (1 - p) in training (keep_k = [uniform(seed, k) >= floor(p * 2**32)]),
    y = x in eval mode (training=False) and for p = 0 (a copy, bitwise equal).

    Training form: returns (y, cache) for dropout_backward.  Backward: dx = dy * keep / (1 - p),
    the mask regenerated from (seed, k).  NumPy reference: resnorm.reference.dropout_forward.

    x: float32/float64 array of any shape; p in [0, 1] (p = 1: y = x * 0); seed: int in
    [0, 2**64).  return_mask: also compute the boolean keep-mask, as cache.mask.
    out: optional output buffer (may be x itself).  n_threads: None = OpenMP default.
    """
    x = _checks.float_array(x, "x")
    spec = dropout_spec(p, seed, training)
    n_threads = _checks.n_threads_value(n_threads)
    mask = spec.mask(x.shape, n_threads) if _checks.flag(return_mask, "return_mask") else None
    y = _apply(x, "x", spec, out, n_threads)
    return y, DropoutCache(spec, x.shape, x.dtype, mask)


def dropout(x, p, *, seed, training=True, out=None, n_threads=None):
    """y = x * keep / (1 - p) in training, y = x in eval (see dropout_forward).

    Inference form of dropout_forward (same arguments, no cache).
    NumPy reference: resnorm.reference.dropout_forward.
    """
    return dropout_forward(x, p, seed=seed, training=training, out=out, n_threads=n_threads)[0]


def dropout_backward(dy, cache, *, out=None, n_threads=None):
    """dx = dy * keep / (1 - p): the same mask as forward, regenerated from (seed, k).

    dy: gradient of y (shape and dtype of the forward input).  cache: from dropout_forward.
    out: optional buffer for dx (may be dy itself).
    NumPy reference: resnorm.reference.dropout_backward.
    """
    if not isinstance(cache, DropoutCache):
        raise TypeError(f"cache must be the DropoutCache returned by dropout_forward, "
                        f"got {type(cache).__name__}")
    _checks.cache_arrays(cache, lambda n, d, dtype: [], valid_spec(cache.spec))  # no arrays read
    dy = _checks.like_array(dy, "dy", cache.shape, cache.dtype)
    return _apply(dy, "dy", cache.spec, out, _checks.n_threads_value(n_threads))
