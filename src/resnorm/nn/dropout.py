"""Inverted dropout as a module, on resnorm's counter-based dropout kernel."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _checks
from ..inverted_dropout import dropout_backward, dropout_forward
from . import init
from .init import Seed
from .module import Module


class Dropout(Module):
    """Inverted dropout: ``y = x * keep / (1 - p)`` in training, ``y = x`` in eval mode.

    keep is a pure function of (seed, element index) (`resnorm.dropout_forward`,
    Philox-4x32-10), with a fresh seed for every forward drawn from a generator seeded at
    construction: the same sequence of masks for the same seed, on any machine and thread
    count.  Backward: ``dx = dy * keep / (1 - p)``, the mask regenerated from the seed;
    p = 1 gives zeros.  When not `active`, forward returns x itself (no copy) and backward dy
    itself.  Caches the seed only, never the mask.  NumPy twin:
    `resnorm.reference.dropout_forward`.

    Parameters
    ----------
    p : float, default 0.1
        The probability of dropping an element, in [0, 1].
    seed : int, numpy.random.SeedSequence or numpy.random.Generator, default 0
        Seeds the generator the masks' seeds are drawn from.

    Raises
    ------
    TypeError, ValueError
        If p is not a number in [0, 1], or seed is of another type.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> drop = nn.Dropout(0.5, seed=0)
    >>> y = drop.forward(np.ones(10000, np.float32))
    >>> sorted(set(y.tolist()))            # dropped, or kept and scaled by 1/(1-p)
    [0.0, 2.0]
    >>> bool(abs(y.mean() - 1) < 0.05)
    True
    >>> bool(np.array_equal(drop.backward(np.ones_like(y)), y))
    True
    >>> drop.eval().forward(np.ones(3))     # the identity in eval mode
    array([1., 1., 1.])
    """

    def __init__(self, p: float = 0.1, *, seed: Seed = 0) -> None:
        super().__init__()
        self.p = _checks.probability(p, "p")
        self._rng = init.generator(seed)
        self._cache = None

    @property
    def active(self) -> bool:
        """True when forward drops elements: in training mode with p > 0."""
        return self.training and self.p > 0.0

    def next_seed(self) -> int:
        """Draws the seed of the next mask (advances the generator).

        Returns
        -------
        int
            A 64-bit seed.
        """
        return int(self._rng.integers(0, 2**64, dtype=np.uint64))

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = _checks.float_array(x, "x", True)
        if not self.active:
            self._cache = (None, x.shape, x.dtype)
            return x
        y, cache = dropout_forward(x, self.p, seed=self.next_seed())
        self._cache = (cache, x.shape, x.dtype)
        return y

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        with self._backward_cache() as (cache, shape, dtype):
            dy = _checks.like_array(dy, "dy", shape, dtype)
            return dy if cache is None else dropout_backward(dy, cache)
