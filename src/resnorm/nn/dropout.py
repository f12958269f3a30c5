"""Inverted dropout as a module, on resnorm's counter-based dropout kernel."""
import numpy as np

from .. import _checks
from ..inverted_dropout import dropout_backward, dropout_forward
from . import init
from .module import Module


class Dropout(Module):
    """y = x * keep / (1 - p) in training, y = x in eval mode (and for p = 0).

    keep is a pure function of (seed, element index) (resnorm.dropout_forward, Philox), with a
    fresh seed for every forward drawn from a generator seeded at construction: the same
    sequence of masks for the same seed, on any machine and thread count.
    Backward: dx = dy * keep / (1 - p), the mask regenerated from the seed.  p = 1 gives zeros.
    Caches: the seed only (no mask).   NumPy reference: resnorm.reference.dropout_forward.
    """

    def __init__(self, p=0.1, *, seed=0):
        super().__init__()
        self.p = _checks.probability(p, "p")
        self._rng = init.generator(seed)
        self._cache = None

    @property
    def active(self):
        return self.training and self.p > 0.0

    def next_seed(self):
        """The seed of the next mask (advances the generator)."""
        return int(self._rng.integers(0, 2**64, dtype=np.uint64))

    def forward(self, x):
        x = _checks.float_array(x, "x")
        if not self.active:
            self._cache = (None, x.shape, x.dtype)
            return x
        y, cache = dropout_forward(x, self.p, seed=self.next_seed())
        self._cache = (cache, x.shape, x.dtype)
        return y

    def backward(self, dy):
        cache, shape, dtype = self._take_cache()
        dy = _checks.like_array(dy, "dy", shape, dtype)
        return dy if cache is None else dropout_backward(dy, cache)
