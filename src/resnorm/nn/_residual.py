"""The residual connection of a block, and its composition with the norm that follows it.

This file is the ONE place where a block's residual/dropout/norm arithmetic lives, so that
moving to resnorm's fused residual kernels (add + dropout + norm in one pass over memory)
changes this file only:

* ``Residual.forward/backward``  -> resnorm.dropout / scaled_residual / gated_residual,
* ``pre_add_norm_forward/backward`` -> resnorm.add_rms_norm(_forward/_backward) and
  add_layer_norm (h = residual + alpha * dropout(f), y = norm(h), returning y and h),
* ``post_add_norm_forward/backward`` -> their post-norm variants.

Today they are written with NumPy and resnorm's own norm kernels; see docs/blocks.md.
"""
import numpy as np

from .. import _checks
from .dropout import Dropout
from .module import Module

RESIDUAL_KINDS = ("plain", "scaled", "gated", "none")


class Residual(Module):
    """h = x + r(dropout(f)) for the residual stream x and a sublayer output f:

    plain:  h = x + dropout(f)
    scaled: h = x + alpha * dropout(f),          alpha a learnable scalar (shape (1,))
    gated:  h = x + sigmoid(gate) * dropout(f),  gate learnable per-channel logits (D,)
    none:   h = dropout(f)                       (no skip connection, for experiments)

    Backward: dx = dh (none: no dx);  df = dropout'(r'(dh));  dalpha += sum(dh * dropout(f));
    dgate += sum over rows of dh * dropout(f) * s * (1 - s), s = sigmoid(gate).
    Caches: dropout(f) for scaled/gated (plus the dropout mask inside Dropout).
    """

    def __init__(self, kind, d, *, p=0.0, alpha=1.0, gate=0.0, dtype=np.float32, seed=0):
        super().__init__()
        self.kind = _checks.one_of(kind, "residual", RESIDUAL_KINDS)
        self.dtype = _checks.float_dtype(dtype)
        self.dropout = self.add_module("dropout", Dropout(p, seed=seed))
        if self.kind == "scaled":
            a = np.full(1, _checks.real_value(alpha, "alpha"), self.dtype)
            self.alpha, self.dalpha = self.add_param("alpha", a)
        if self.kind == "gated":
            g = np.full(_checks.positive_int(d, "d"), _checks.real_value(gate, "gate"),
                        self.dtype)
            self.gate, self.dgate = self.add_param("gate", g)
        self._cache = None

    def forward(self, x, f):
        fd = self.dropout.forward(f)
        if self.kind == "plain":
            self._cache = (None, None)
            return x + fd
        if self.kind == "none":
            self._cache = (None, None)
            return fd
        if self.kind == "scaled":
            self._cache = (fd, None)
            return x + self.alpha[0] * fd
        s = 1.0 / (1.0 + np.exp(-self.gate))
        self._cache = (fd, s)
        return x + s * fd

    def backward(self, dh):
        """(dx, df); dx is None for kind "none".  dx may be dh itself: treat it as read-only."""
        fd, s = self._take_cache()
        if self.kind in ("plain", "none"):
            df = self.dropout.backward(dh)
        elif self.kind == "scaled":
            self.dalpha += np.sum(dh * fd, dtype=np.float64)
            df = self.dropout.backward(self.alpha[0] * dh)
        else:
            d = dh.shape[-1]
            self.dgate += (np.sum((dh * fd).reshape(-1, d), axis=0, dtype=np.float64)
                           * (s * (1.0 - s)))
            df = self.dropout.backward(s * dh)
        return (None if self.kind == "none" else dh), df


def pre_add_norm_forward(residual, norm, x, f):
    """h = residual(x, f);  y = norm(h).  Returns (y, h): y feeds the next sublayer, h is the
    new residual stream (Pre-Norm)."""
    h = residual.forward(x, f)
    return norm.forward(h), h


def pre_add_norm_backward(residual, norm, dy, dh):
    """Gradients of pre_add_norm_forward given dy and the gradient dh arriving along the
    residual stream (None: zero).  Returns (dx, df); dx is None without a skip connection."""
    g = norm.backward(dy)      # a fresh array: safe to add into
    if dh is not None:
        g += dh
    return residual.backward(g)


def post_add_norm_forward(residual, norm, x, f):
    """y = norm(residual(x, f))  (Post-Norm)."""
    return norm.forward(residual.forward(x, f))


def post_add_norm_backward(residual, norm, dy):
    """(dx, df) of post_add_norm_forward; dx is None without a skip connection."""
    return residual.backward(norm.backward(dy))
