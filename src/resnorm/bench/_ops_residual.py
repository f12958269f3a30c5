"""The residual ops of the benchmark: fused add + norm (Pre-Norm and Post-Norm), dropout,
scaled and gated residual, forward and backward.

Traffic in units of one (N, D) array: Pre-Norm forward reads x, r and writes h, y (4);
Post-Norm forward does not write h (3); their backward reads dy, dh, h (Post-Norm: dy, x,
r) and writes dx, dresidual (5).  Fused backward ops have no ``out`` argument: they always
allocate.  The NumPy versions keep what a NumPy user would keep (h, the dropout mask).
"""
import numpy as np

from .. import inverted_dropout, residual
from ._cases import (BACKWARD, FORWARD, FUSED_PRENORM, Case, arrays, autograd, column,
                     numpy_layer, numpy_layer_backward, numpy_rms, numpy_rms_backward,
                     register, tensors)

P_DROP = 0.1


def _numpy_dropout(x, p, rng):
    keep = rng.random(x.shape, dtype=np.float32) >= p
    return x * (keep / x.dtype.type(1 - p)).astype(x.dtype)


# --------------------------------------------------------------------------- forward

def _prenorm(name, layer, p):
    @register(name, FUSED_PRENORM)
    def setup(shape, dtype, torch):
        x, r, w, b = arrays(shape, dtype, ["x", "r", "w", "b"])
        y, h = np.empty_like(x), np.empty_like(x)
        np_rng = np.random.default_rng(1)
        add = residual.add_layer_norm if layer else residual.add_rms_norm
        params = (w, b) if layer else (w,)
        F = None if torch is None else torch.nn.functional
        tx, tr, tw, tb = tensors(torch, [x, r, w, b])
        drop = (lambda a: _numpy_dropout(a, p, np_rng)) if p else (lambda a: a)
        tdrop = (lambda a: F.dropout(a, p)) if p else (lambda a: a)
        if layer:
            ref = lambda: numpy_layer(r + drop(x), w, b)
            tfn = torch and (lambda: F.layer_norm(tr + tdrop(tx), (shape[1],), tw, tb, 1e-5))
        else:
            ref = lambda: numpy_rms(r + drop(x), w)
            tfn = torch and (lambda: F.rms_norm(tr + tdrop(tx), (shape[1],), tw, 1e-6))
        return Case(
            4 * x.nbytes + len(params) * w.nbytes,
            out=lambda n: add(x, r, *params, p=p, seed=7, out=y, residual_out=h, n_threads=n),
            alloc=lambda n: add(x, r, *params, p=p, seed=7, n_threads=n),
            numpy=ref, torch=tfn)


_prenorm("add_rms_norm", layer=False, p=0.0)
_prenorm("add_rms_norm_dropout", layer=False, p=P_DROP)
_prenorm("add_layer_norm", layer=True, p=0.0)


def _postnorm(name, layer):
    @register(name, FORWARD)
    def setup(shape, dtype, torch):
        x, r, w, b = arrays(shape, dtype, ["x", "r", "w", "b"])
        y = np.empty_like(x)
        add = residual.add_layer_norm_post if layer else residual.add_rms_norm_post
        params = (w, b) if layer else (w,)
        F = None if torch is None else torch.nn.functional
        tx, tr, tw, tb = tensors(torch, [x, r, w, b])
        if layer:
            ref = lambda: numpy_layer(x + r, w, b)
            tfn = torch and (lambda: F.layer_norm(tx + tr, (shape[1],), tw, tb, 1e-5))
        else:
            ref = lambda: numpy_rms(x + r, w)
            tfn = torch and (lambda: F.rms_norm(tx + tr, (shape[1],), tw, 1e-6))
        return Case(3 * x.nbytes + len(params) * w.nbytes,
                    out=lambda n: add(x, r, *params, out=y, n_threads=n),
                    alloc=lambda n: add(x, r, *params, n_threads=n), numpy=ref, torch=tfn)


_postnorm("add_rms_norm_post", layer=False)
_postnorm("add_layer_norm_post", layer=True)


@register("dropout", FORWARD)
def _dropout(shape, dtype, torch):
    (x,) = arrays(shape, dtype, ["x"])
    y = np.empty_like(x)
    np_rng = np.random.default_rng(1)
    (tx,) = tensors(torch, [x])
    return Case(
        2 * x.nbytes,
        out=lambda n: inverted_dropout.dropout(x, P_DROP, seed=7, out=y, n_threads=n),
        alloc=lambda n: inverted_dropout.dropout(x, P_DROP, seed=7, n_threads=n),
        numpy=lambda: _numpy_dropout(x, P_DROP, np_rng),
        torch=torch and (lambda: torch.nn.functional.dropout(tx, P_DROP)))


@register("scaled_residual", FORWARD)
def _scaled_residual(shape, dtype, torch):
    """LayerScale: h = x + alpha * F with a per-channel alpha."""
    x, f = arrays(shape, dtype, ["x", "F"])
    alpha = np.linspace(0.5, 1.5, shape[1]).astype(dtype)
    h = np.empty_like(x)
    tx, tf, ta = tensors(torch, [x, f, alpha])
    return Case(
        3 * x.nbytes + alpha.nbytes,
        out=lambda n: residual.scaled_residual(x, f, alpha, out=h, n_threads=n),
        alloc=lambda n: residual.scaled_residual(x, f, alpha, n_threads=n),
        numpy=lambda: x + alpha * f, torch=torch and (lambda: tx + ta * tf))


@register("gated_residual", FORWARD)
def _gated_residual(shape, dtype, torch):
    """h = x + sigmoid(g) * F with a full-shape gate g."""
    x, f, g = arrays(shape, dtype, ["x", "F", "g"])
    h = np.empty_like(x)
    tx, tf, tg = tensors(torch, [x, f, g])
    return Case(
        4 * x.nbytes,
        out=lambda n: residual.gated_residual(x, f, g, out=h, n_threads=n),
        alloc=lambda n: residual.gated_residual(x, f, g, n_threads=n),
        numpy=lambda: x + f / (1 + np.exp(-g)),
        torch=torch and (lambda: tx + torch.sigmoid(tg) * tf))


# --------------------------------------------------------------------------- backward

def _add_norm_backward(name, layer, prenorm):
    @register(name, BACKWARD)
    def setup(shape, dtype, torch):
        x, r, w, b, dy, dh = arrays(shape, dtype, ["x", "r", "w", "b", "dy", "dh"])
        params = (w, b) if layer else (w,)
        dx, dres = np.empty_like(x), np.empty_like(x)
        if prenorm:
            forward = residual.add_layer_norm_forward if layer else residual.add_rms_norm_forward
            (_, h), cache = forward(x, r, *params)
            backward = residual.add_layer_norm_backward if layer else residual.add_rms_norm_backward
            call = lambda n, **buf: backward(dy, dh, cache, n_threads=n, **buf)
        else:
            forward = (residual.add_layer_norm_post_forward if layer
                       else residual.add_rms_norm_post_forward)
            _, cache = forward(x, r, *params)
            h = x + r   # a NumPy user keeps h; resnorm recomputes it from x and r
            backward = (residual.add_layer_norm_post_backward if layer
                        else residual.add_rms_norm_post_backward)
            call = lambda n, **buf: backward(dy, cache, n_threads=n, **buf)
        rstd = column(cache.rstd, dtype)
        if layer:
            mean = column(cache.mean, dtype)
            norm_backward = lambda: numpy_layer_backward(dy, h, w, mean, rstd)
        else:
            norm_backward = lambda: numpy_rms_backward(dy, h, w, rstd)

        def ref():
            gh, *dparams = norm_backward()
            if prenorm:
                gh = gh + dh
            return (gh, gh, *dparams)   # dx = dresidual = gh (alpha = 1, no dropout)

        tfn = None
        if torch is not None:
            F = torch.nn.functional
            tx, tr, tw, tb = tensors(torch, [x, r, w, b], grad=True)
            th = tx + tr
            if layer:
                ty, leaves = F.layer_norm(th, (shape[1],), tw, tb, 1e-5), (tx, tr, tw, tb)
            else:
                ty, leaves = F.rms_norm(th, (shape[1],), tw, 1e-6), (tx, tr, tw)
            tdy, tdh = torch.from_numpy(dy), torch.from_numpy(dh)
            tfn = (autograd(torch, (ty, th), leaves, (tdy, tdh)) if prenorm
                   else autograd(torch, ty, leaves, tdy))
        # reads dy, dh, h (Post-Norm: dy, x, r), w; writes dx, dresidual, the parameter
        # gradients; reads the float64 row statistics
        n_stats = 2 if layer else 1
        traffic = 5 * x.nbytes + (1 + len(params)) * w.nbytes + n_stats * shape[0] * 8
        return Case(traffic, out=lambda n: call(n, out=dx, dresidual_out=dres), alloc=call,
                    numpy=ref, torch=tfn)


_add_norm_backward("add_rms_norm_backward", layer=False, prenorm=True)
_add_norm_backward("add_layer_norm_backward", layer=True, prenorm=True)
_add_norm_backward("add_rms_norm_post_backward", layer=False, prenorm=False)
_add_norm_backward("add_layer_norm_post_backward", layer=True, prenorm=False)


@register("dropout_backward", BACKWARD)
def _dropout_backward(shape, dtype, torch):
    x, dy = arrays(shape, dtype, ["x", "dy"])
    dx = np.empty_like(x)
    _, cache = inverted_dropout.dropout_forward(x, P_DROP, seed=7)
    keep = np.random.default_rng(1).random(shape, dtype=np.float32) >= P_DROP
    scaled_mask = (keep / dtype.type(1 - P_DROP)).astype(dtype)   # kept from NumPy's forward
    tfn = None
    if torch is not None:
        (tx,) = tensors(torch, [x], grad=True)
        tfn = autograd(torch, torch.nn.functional.dropout(tx, P_DROP), tx, torch.from_numpy(dy))
    return Case(
        2 * x.nbytes,
        out=lambda n: inverted_dropout.dropout_backward(dy, cache, out=dx, n_threads=n),
        alloc=lambda n: inverted_dropout.dropout_backward(dy, cache, n_threads=n),
        numpy=lambda: dy * scaled_mask, torch=tfn)


@register("scaled_residual_backward", BACKWARD)
def _scaled_residual_backward(shape, dtype, torch):
    """LayerScale backward: dx = dh, dF = alpha * dh, dalpha = sum_rows dh * F."""
    x, f, dh = arrays(shape, dtype, ["x", "F", "dh"])
    alpha = np.linspace(0.5, 1.5, shape[1]).astype(dtype)
    _, cache = residual.scaled_residual_forward(x, f, alpha)
    tfn = None
    if torch is not None:
        tx, tf, ta = tensors(torch, [x, f, alpha], grad=True)
        tfn = autograd(torch, tx + ta * tf, (tx, tf, ta), torch.from_numpy(dh))
    # reads dh, F, alpha; writes dx, dF and the float64 dalpha
    return Case(
        4 * x.nbytes + alpha.nbytes + shape[1] * 8,
        alloc=lambda n: residual.scaled_residual_backward(dh, cache, n_threads=n),
        numpy=lambda: (dh, alpha * dh, (dh * f).sum(axis=0)), torch=tfn)


@register("gated_residual_backward", BACKWARD)
def _gated_residual_backward(shape, dtype, torch):
    """dx = dh, dF = s * dh, dg = dh * F * s * (1 - s), s = sigmoid(g) (full-shape gate)."""
    x, f, g, dh = arrays(shape, dtype, ["x", "F", "g", "dh"])
    _, cache = residual.gated_residual_forward(x, f, g)

    def ref():
        s = 1 / (1 + np.exp(-g))
        return dh, s * dh, dh * f * s * (1 - s)

    tfn = None
    if torch is not None:
        tx, tf, tg = tensors(torch, [x, f, g], grad=True)
        tfn = autograd(torch, tx + torch.sigmoid(tg) * tf, (tx, tf, tg), torch.from_numpy(dh))
    # reads dh, F, g; writes dx, dF, dg
    return Case(6 * x.nbytes,
                alloc=lambda n: residual.gated_residual_backward(dh, cache, n_threads=n),
                numpy=ref, torch=tfn)
