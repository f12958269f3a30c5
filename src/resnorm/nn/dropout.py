"""Inverted dropout as a module: keep with probability 1 - p, scale kept values by 1/(1-p)."""
import numpy as np

from .. import _checks
from . import init
from .module import Module


class Dropout(Module):
    """y = x * mask / (1 - p), mask_i ~ Bernoulli(1 - p), in training;  y = x in eval (or p = 0).

    Backward: dx = dy * mask / (1 - p).  p = 1 gives zeros.
    Caches: the mask (bool, one byte per element) when dropout is active.
    The mask comes from a numpy Generator seeded at construction: a fresh mask on every
    forward, the same sequence of masks for the same seed.
    NumPy reference: resnorm.nn.reference.dropout.
    """

    def __init__(self, p=0.1, *, seed=0):
        super().__init__()
        self.p = _checks.probability(p, "p")
        self._rng = init.generator(seed)
        self._cache = None

    @property
    def active(self):
        return self.training and self.p > 0.0

    def forward(self, x):
        x = _checks.float_array(x, "x")
        if not self.active:
            self._cache = (None, x.shape, x.dtype)
            return x
        keep = self._rng.random(x.shape, dtype=np.float32) >= self.p
        scale = x.dtype.type(0.0 if self.p == 1.0 else 1.0 / (1.0 - self.p))
        self._cache = (keep, x.shape, x.dtype)
        return np.where(keep, x * scale, x.dtype.type(0))

    def backward(self, dy):
        keep, shape, dtype = self._take_cache()
        dy = _checks.like_array(dy, "dy", shape, dtype)
        if keep is None:
            return dy
        scale = dtype.type(0.0 if self.p == 1.0 else 1.0 / (1.0 - self.p))
        return np.where(keep, dy * scale, dtype.type(0))
