"""The residual connection of a block, and its composition with the norm that follows it.

This file is the one place where a block's residual, dropout and norm arithmetic lives, on
resnorm's fused residual kernels (resnorm/residual.py, resnorm/inverted_dropout.py):

* ``pre_add_norm_forward/backward``: h = x + alpha * dropout(f), y = norm(h), returning y
  and h, in one pass over memory: resnorm.add_rms_norm_forward / add_layer_norm_forward;
* ``post_add_norm_forward/backward``: y = norm(x + alpha * dropout(f)), and DeepNorm's
  y = norm(skip * x + dropout(f)): resnorm.add_rms_norm_post_forward /
  add_layer_norm_post_forward;
* ``Residual.forward/backward`` (an add with no norm after it, and the gated and "none"
  connections, which have no fused add + norm kernel): resnorm.dropout,
  resnorm.scaled_residual, resnorm.gated_residual, then the norm module.

Fused calls keep their cache in the Residual module and add the norm's parameter gradients
into the norm module directly: the norm module's own forward is not called.
"""
from contextlib import contextmanager

import numpy as np

from .. import _checks
from ..residual import (add_layer_norm_backward, add_layer_norm_forward,
                        add_layer_norm_post_backward, add_layer_norm_post_forward,
                        add_rms_norm_backward, add_rms_norm_forward,
                        add_rms_norm_post_backward, add_rms_norm_post_forward,
                        gated_residual_backward, gated_residual_forward,
                        scaled_residual_backward, scaled_residual_forward)
from .dropout import Dropout
from .module import Module
from .norms import RMSNorm

RESIDUAL_KINDS = ("plain", "scaled", "gated", "none")


class Residual(Module):
    """h = x + r(dropout(f)) for the residual stream x and a sublayer output f:

    plain:  h = x + dropout(f)
    scaled: h = x + alpha * dropout(f),          alpha a learnable scalar (shape (1,))
    gated:  h = x + sigmoid(gate) * dropout(f),  gate learnable per-channel logits (D,)
    none:   h = dropout(f)                       (no skip connection, for experiments)

    Backward: dx = dh (none: no dx);  df = dropout'(r'(dh));  dalpha += sum(dh * dropout(f));
    dgate += sum over rows of dh * dropout(f) * s * (1 - s), s = sigmoid(gate).
    Caches: the kernels' caches (dropout(f) by reference for scaled and gated; the dropout
    seed, never the mask).
    """

    def __init__(self, kind, d, *, p=0.0, alpha=1.0, gate=0.0, dtype=np.float32, seed=0):
        super().__init__()
        self.kind = _checks.one_of(kind, "residual", RESIDUAL_KINDS)
        self.dtype = _checks.float_dtype(dtype, halves=True)
        self.dropout = self.add_module("dropout", Dropout(p, seed=seed))
        if self.kind == "scaled":
            a = np.full(1, _checks.real_value(alpha, "alpha"), self.dtype)
            self.alpha, self.dalpha = self.add_param("alpha", a)
        if self.kind == "gated":
            g = np.full(_checks.positive_int(d, "d"), _checks.real_value(gate, "gate"),
                        self.dtype)
            self.gate, self.dgate = self.add_param("gate", g)
        self._cache = None

    @property
    def fusable(self):
        """plain and scaled have fused add + norm kernels (gated and none do not)."""
        return self.kind in ("plain", "scaled")

    def alpha_arg(self):
        """alpha as the kernels take it: 1.0 (fixed) or a 0-d view of the learnable alpha."""
        return self.alpha.reshape(()) if self.kind == "scaled" else 1.0

    def dropout_args(self):
        """p, seed and training for a fused kernel's own dropout (a fresh seed when active)."""
        d = self.dropout
        return dict(p=d.p, seed=d.next_seed() if d.active else 0, training=d.training)

    def add_alpha_grad(self, dalpha):
        if dalpha is not None:
            self.dalpha += dalpha

    def forward(self, x, f):
        fd = self.dropout.forward(f)
        if self.kind == "none":
            self._cache = ("none", None)
            return fd
        if self.kind == "gated":
            h, cache = gated_residual_forward(x, fd, self.gate)
        else:
            h, cache = scaled_residual_forward(x, fd, self.alpha_arg())
        self._cache = ("add", cache)
        return h

    def backward(self, dh):
        """(dx, df); dx is None for kind "none"."""
        with self._backward_cache() as (form, cache):
            if form == "none":
                return None, self.dropout.backward(dh)
            if self.kind == "gated":
                dx, dfd, dgate = gated_residual_backward(dh, cache)
                self.dgate += dgate
            else:
                dx, dfd, dalpha = scaled_residual_backward(dh, cache)
                self.add_alpha_grad(dalpha)
        return dx, self.dropout.backward(dfd)

    @contextmanager
    def fused_cache(self):
        """The cache of a fused add + norm forward (see the functions below), for the
        backward inside the ``with`` block (kept if it raises, as _backward_cache's)."""
        with self._backward_cache() as (form, cache):
            assert form == "fused", "the residual's forward was not a fused add + norm"
            yield cache


def _add_norm_grads(norm, dweight, dbias=None):
    if dweight is not None:
        norm.dweight += dweight
    if dbias is not None:
        norm.dbias += dbias


def pre_add_norm_forward(residual, norm, x, f):
    """h = residual(x, f);  y = norm(h).  Returns (y, h): y feeds the next sublayer, h is the
    new residual stream (Pre-Norm)."""
    if not residual.fusable:
        h = residual.forward(x, f)
        return norm.forward(h), h
    kw = dict(alpha=residual.alpha_arg(), **residual.dropout_args())
    if isinstance(norm, RMSNorm):
        (y, h), cache = add_rms_norm_forward(f, x, norm.weight, norm.eps, **kw)
    else:
        (y, h), cache = add_layer_norm_forward(f, x, norm.weight, norm.bias, norm.eps, **kw)
    residual._cache = ("fused", cache)
    return y, h


def pre_add_norm_backward(residual, norm, dy, dh):
    """Gradients of pre_add_norm_forward given dy and the gradient dh arriving along the
    residual stream (None: zero).  Returns (dx, df); dx is None without a skip connection."""
    if not residual.fusable:
        g = norm.backward(dy)      # a fresh array: safe to add into
        if dh is not None:
            g += dh
        return residual.backward(g)
    with residual.fused_cache() as cache:
        if isinstance(norm, RMSNorm):
            df, dx, dweight, dalpha = add_rms_norm_backward(dy, dh, cache)
            _add_norm_grads(norm, dweight)
        else:
            df, dx, dweight, dbias, dalpha = add_layer_norm_backward(dy, dh, cache)
            _add_norm_grads(norm, dweight, dbias)
    residual.add_alpha_grad(dalpha)
    return dx, df


def post_add_norm_forward(residual, norm, x, f, skip=1.0):
    """y = norm(residual(x, f))  (Post-Norm), or with skip != 1 (DeepNorm, plain residual
    only) y = norm(skip * x + dropout(f)).

    The skip scale costs no pass of its own: a norm is scale invariant up to its eps,
    norm(skip * h') = norm(h') with eps / skip^2 (mean and deviation scale by skip, the
    variance by skip^2), so y = norm(x + dropout(f) / skip) with eps / skip^2: the fused
    kernel with alpha = 1/skip.  The same function, forward and backward.
    """
    if skip != 1.0 and residual.kind != "plain":
        raise ValueError(f"a skip scale needs the plain residual, got {residual.kind!r}")
    if not residual.fusable:
        return norm.forward(residual.forward(x, f))
    alpha = 1.0 / skip if residual.kind == "plain" else residual.alpha_arg()
    kw = dict(alpha=alpha, **residual.dropout_args())
    eps = norm.eps / (skip * skip)
    if isinstance(norm, RMSNorm):
        y, cache = add_rms_norm_post_forward(f, x, norm.weight, eps, **kw)
    else:
        y, cache = add_layer_norm_post_forward(f, x, norm.weight, norm.bias, eps, **kw)
    residual._cache = ("fused", cache)
    return y


def post_add_norm_backward(residual, norm, dy):
    """(dx, df) of post_add_norm_forward; dx is None without a skip connection."""
    if not residual.fusable:
        return residual.backward(norm.backward(dy))
    with residual.fused_cache() as cache:
        if isinstance(norm, RMSNorm):
            df, dx, dweight, dalpha = add_rms_norm_post_backward(dy, cache)
            _add_norm_grads(norm, dweight)
        else:
            df, dx, dweight, dbias, dalpha = add_layer_norm_post_backward(dy, cache)
            _add_norm_grads(norm, dweight, dbias)
    residual.add_alpha_grad(dalpha)
    return dx, df
