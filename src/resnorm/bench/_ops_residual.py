"""The residual ops of the benchmark: fused add + norm (Pre-Norm and Post-Norm), dropout,
scaled and gated residual, inference and training forms, forward and backward.

Traffic in units of one (N, D) array: Pre-Norm forward reads x, r and writes h, y (4);
Post-Norm forward does not write h (3); their backward reads dy, dh, h (Post-Norm: dy, x,
r) and writes dx, dresidual (5).  The NumPy versions keep what a NumPy user would keep
(h, the dropout mask).  Random ops (dropout): every library draws its own mask, so their
outputs are checked with the mask read back from the output (Case.keep).
"""
import numpy as np

from .. import (add_layer_norm, add_layer_norm_backward, add_layer_norm_forward,
                add_layer_norm_post, add_layer_norm_post_backward,
                add_layer_norm_post_forward, add_rms_norm, add_rms_norm_backward,
                add_rms_norm_forward, add_rms_norm_post, add_rms_norm_post_backward,
                add_rms_norm_post_forward, dropout, dropout_backward, dropout_forward,
                gated_residual, gated_residual_backward, gated_residual_forward, reference,
                scaled_residual, scaled_residual_backward, scaled_residual_forward)
from . import _peers_numba as nb
from . import _peers_onnx as onnx
from ._cases import (BACKWARD, FORWARD, FUSED, Case, arrays, bound, column, f64_sum, fixed,
                     numpy_layer, numpy_layer_backward, numpy_rms, numpy_rms_backward, parts,
                     register)
from ._ops_norms import LAYER_EPS, RMS_EPS
from ._peers_torch import TorchSpec

P_DROP = 0.1
SEED = 7


def _numpy_dropout(x, p, rng):
    keep = rng.random(x.shape, dtype=np.float32) >= p
    return x * (keep / x.dtype.type(1 - p)).astype(x.dtype)


def _dropped(x, keep, p):
    """float64 dropout(x) with the given mask (x itself for p = 0)."""
    return x.astype(np.float64) if keep is None else reference.dropout_backward(x, keep, p)


def _norm_reference(h, w, b, layer):
    """(y, [mean,] rstd) of the float64 reference at h."""
    if layer:
        return reference.layer_norm_forward(h, w, b, LAYER_EPS)
    return reference.rms_norm_forward(h, w, RMS_EPS)


def _with_stats(training, layer):
    """resnorm's result -> outputs: training forms add the cache's row statistics."""
    if not training:
        return parts

    def flat(res):
        out, cache = res
        stats = (cache.mean, cache.rstd) if layer else (cache.rstd,)
        return parts(out) + stats
    return flat


# --------------------------------------------------------------------------- forward

def _prenorm(name, layer, p, training=False):
    @register(name, FUSED, table=not training)
    def setup(shape, dtype, torch):
        x, r, w, b = arrays(shape, dtype, ["x", "r", "w", "b"])
        y, h = np.empty_like(x), np.empty_like(x)
        eps = LAYER_EPS if layer else RMS_EPS
        params = (w, b) if layer else (w,)
        if training:
            fn = add_layer_norm_forward if layer else add_rms_norm_forward
        else:
            fn = add_layer_norm if layer else add_rms_norm
        add = bound(fn, x, r, *params)

        def ref(rows, keep):
            hr = f64_sum(r[rows], _dropped(x[rows], None if keep is None else keep[rows], p))
            y_ref, *stats = _norm_reference(hr, w, b, layer)
            return (y_ref, hr, *stats) if training else (y_ref, hr)

        peers = {}
        if not p:
            peers["numba"] = (nb.layer_norm(x, w, b, eps, training, res=r, prenorm=True)
                              if layer else nb.rms_norm(x, w, eps, training, res=r, prenorm=True))
        if not training:
            np_rng = np.random.default_rng(1)
            drop = (lambda a: _numpy_dropout(a, p, np_rng)) if p else (lambda a: a)
            norm = (lambda a: numpy_layer(a, w, b, eps)) if layer else (lambda a: numpy_rms(a, w, eps))

            def numpy_add():
                hn = r + drop(x)
                return norm(hn), hn
            peers["numpy"] = fixed(numpy_add)
            if not p:
                peers["onnxruntime"] = (onnx.add_layer_norm(x, r, w, b, eps) if layer
                                        else onnx.add_rms_norm(x, r, w, eps))
        spec = None
        if torch is not None and not training:
            F = torch.nn.functional

            def torch_add(tx, tr, tw, tb=None):
                th = tr + (F.dropout(tx, p) if p else tx)
                ty = (F.layer_norm(th, (shape[1],), tw, tb, eps) if layer
                      else F.rms_norm(th, (shape[1],), tw, eps))
                return ty, th
            spec = TorchSpec(torch_add, [x, r, *params])
        n_stats = (2 if layer else 1) if training else 0
        return Case(
            4 * x.nbytes + len(params) * w.nbytes + n_stats * shape[0] * 8,
            out=lambda n: add(p=p, seed=SEED, out=y, residual_out=h, n_threads=n),
            alloc=lambda n: add(p=p, seed=SEED, n_threads=n),
            reference=ref, flat=_with_stats(training, layer), peers=peers, torch=spec,
            p=p, keep=(lambda outputs: outputs[1] != r) if p else None)


_prenorm("add_rms_norm", layer=False, p=0.0)
_prenorm("add_rms_norm_forward", layer=False, p=0.0, training=True)
_prenorm("add_rms_norm_dropout", layer=False, p=P_DROP)
_prenorm("add_layer_norm", layer=True, p=0.0)
_prenorm("add_layer_norm_forward", layer=True, p=0.0, training=True)


def _postnorm(name, layer, training=False):
    @register(name, FUSED, table=not training)
    def setup(shape, dtype, torch):
        x, r, w, b = arrays(shape, dtype, ["x", "r", "w", "b"])
        y = np.empty_like(x)
        eps = LAYER_EPS if layer else RMS_EPS
        params = (w, b) if layer else (w,)
        if training:
            fn = add_layer_norm_post_forward if layer else add_rms_norm_post_forward
        else:
            fn = add_layer_norm_post if layer else add_rms_norm_post
        add = bound(fn, x, r, *params)

        def ref(rows, keep):
            return _norm_reference(f64_sum(x[rows], r[rows]), w, b, layer)[
                :None if training else 1]

        peers = {"numba": (nb.layer_norm(x, w, b, eps, training, res=r) if layer
                           else nb.rms_norm(x, w, eps, training, res=r))}
        spec = None
        if not training:
            peers["numpy"] = fixed((lambda: numpy_layer(x + r, w, b, eps)) if layer
                                   else (lambda: numpy_rms(x + r, w, eps)))
            peers["onnxruntime"] = (onnx.add_layer_norm(x, r, w, b, eps, prenorm=False) if layer
                                    else onnx.add_rms_norm(x, r, w, eps, prenorm=False))
            if torch is not None:
                F = torch.nn.functional
                spec = TorchSpec(
                    (lambda tx, tr, tw, tb: F.layer_norm(tx + tr, (shape[1],), tw, tb, eps))
                    if layer else (lambda tx, tr, tw: F.rms_norm(tx + tr, (shape[1],), tw, eps)),
                    [x, r, *params])
        n_stats = (2 if layer else 1) if training else 0
        return Case(3 * x.nbytes + len(params) * w.nbytes + n_stats * shape[0] * 8,
                    out=lambda n: add(out=y, n_threads=n),
                    alloc=lambda n: add(n_threads=n), reference=ref,
                    flat=_with_stats(training, layer), peers=peers, torch=spec)


_postnorm("add_rms_norm_post", layer=False)
_postnorm("add_rms_norm_post_forward", layer=False, training=True)
_postnorm("add_layer_norm_post", layer=True)
_postnorm("add_layer_norm_post_forward", layer=True, training=True)


def _dropout(name, training):
    @register(name, FORWARD, table=not training)
    def setup(shape, dtype, torch):
        (x,) = arrays(shape, dtype, ["x"])
        y = np.empty_like(x)
        fn = dropout_forward if training else dropout
        peers, spec = {}, None
        if not training:
            np_rng = np.random.default_rng(1)
            peers["numpy"] = fixed(lambda: _numpy_dropout(x, P_DROP, np_rng))
            if torch is not None:
                spec = TorchSpec(lambda tx: torch.nn.functional.dropout(tx, P_DROP), [x])
        return Case(
            2 * x.nbytes,
            out=lambda n: fn(x, P_DROP, seed=SEED, out=y, n_threads=n),
            alloc=lambda n: fn(x, P_DROP, seed=SEED, n_threads=n),
            reference=lambda rows, keep: (reference.dropout_backward(x[rows], keep[rows],
                                                                     P_DROP),),
            flat=(lambda res: (res[0],)) if training else parts, peers=peers, torch=spec,
            p=P_DROP, keep=lambda outputs: outputs[0] != 0)


_dropout("dropout", training=False)
_dropout("dropout_forward", training=True)


def _scaled(name, training):
    """LayerScale: h = x + alpha * F with a per-channel alpha."""
    @register(name, FORWARD, table=not training)
    def setup(shape, dtype, torch):
        x, f = arrays(shape, dtype, ["x", "F"])
        alpha = np.linspace(0.5, 1.5, shape[1]).astype(dtype)
        h = np.empty_like(x)
        fn = scaled_residual_forward if training else scaled_residual
        peers, spec = {"numba": nb.scaled_residual(x, f, alpha)}, None
        if not training:
            peers["numpy"] = fixed(lambda: x + alpha * f)
            if torch is not None:
                spec = TorchSpec(lambda tx, tf, ta: tx + ta * tf, [x, f, alpha])
        return Case(
            3 * x.nbytes + alpha.nbytes,
            out=lambda n: fn(x, f, alpha, out=h, n_threads=n),
            alloc=lambda n: fn(x, f, alpha, n_threads=n),
            reference=lambda rows, keep: (reference.scaled_residual_forward(
                x[rows], f[rows], alpha),),
            flat=(lambda res: (res[0],)) if training else parts, peers=peers, torch=spec)


_scaled("scaled_residual", training=False)
_scaled("scaled_residual_forward", training=True)


def _gated(name, training):
    """h = x + sigmoid(g) * F with a full-shape gate g."""
    @register(name, FORWARD, table=not training)
    def setup(shape, dtype, torch):
        x, f, g = arrays(shape, dtype, ["x", "F", "g"])
        h = np.empty_like(x)
        fn = gated_residual_forward if training else gated_residual
        peers, spec = {"numba": nb.gated_residual(x, f, g)}, None
        if not training:
            peers["numpy"] = fixed(lambda: x + f / (1 + np.exp(-g)))
            if torch is not None:
                spec = TorchSpec(lambda tx, tf, tg: tx + torch.sigmoid(tg) * tf, [x, f, g])
        return Case(
            4 * x.nbytes,
            out=lambda n: fn(x, f, g, out=h, n_threads=n),
            alloc=lambda n: fn(x, f, g, n_threads=n),
            reference=lambda rows, keep: (reference.gated_residual_forward(
                x[rows], f[rows], g[rows]),),
            flat=(lambda res: (res[0],)) if training else parts, peers=peers, torch=spec)


_gated("gated_residual", training=False)
_gated("gated_residual_forward", training=True)


# --------------------------------------------------------------------------- backward

def _add_norm_backward(name, layer, prenorm):
    @register(name, BACKWARD)
    def setup(shape, dtype, torch):
        x, r, w, b, dy, dh = arrays(shape, dtype, ["x", "r", "w", "b", "dy", "dh"])
        params = (w, b) if layer else (w,)
        dx, dres = np.empty_like(x), np.empty_like(x)
        if prenorm:
            forward = add_layer_norm_forward if layer else add_rms_norm_forward
            (_, h), cache = forward(x, r, *params)
            backward = bound(add_layer_norm_backward if layer else add_rms_norm_backward,
                             dy, dh, cache)
        else:
            forward = add_layer_norm_post_forward if layer else add_rms_norm_post_forward
            _, cache = forward(x, r, *params)
            h = x + r   # a NumPy user keeps h; resnorm recomputes it from x and r
            backward = bound(add_layer_norm_post_backward if layer
                             else add_rms_norm_post_backward, dy, cache)
        rstd = column(cache.rstd, dtype)
        mean = column(cache.mean, dtype) if layer else None

        def ref(rows, keep):
            # alpha = 1 and no dropout: the mask keeps everything (keep=True, p=0)
            hr = h[rows] if prenorm else f64_sum(x[rows], r[rows])
            stats = ((cache.mean[rows],) if layer else ()) + (cache.rstd[rows],)
            if prenorm:
                fn = reference.add_layer_norm_backward if layer else reference.add_rms_norm_backward
                return fn(dy[rows], dh[rows], x[rows], hr, w, *stats, 1.0, True, 0.0)
            fn = (reference.add_layer_norm_post_backward if layer
                  else reference.add_rms_norm_post_backward)
            return fn(dy[rows], x[rows], hr, w, *stats, 1.0, True, 0.0)

        def numpy_backward():
            gh, *dparams = (numpy_layer_backward(dy, h, w, mean, rstd) if layer
                            else numpy_rms_backward(dy, h, w, rstd))
            if prenorm:
                gh = gh + dh
            return (gh, gh, *dparams)   # dx = dresidual = gh (alpha = 1, no dropout)

        stats32 = ((cache.mean.astype(dtype),) if layer else ()) + (cache.rstd.astype(dtype),)
        loop = nb.layer_norm_backward if layer else nb.rms_norm_backward
        # Pre-Norm: the norm's backward at the stored h, plus dh; Post-Norm: at x + r
        numba_peer = (loop(dy, h, w, *stats32, dh=dh, fused=True) if prenorm
                      else loop(dy, x, w, *stats32, res=r, fused=True))
        spec = None
        if torch is not None:
            F = torch.nn.functional

            def torch_add(tx, tr, tw, tb=None):
                th = tx + tr
                ty = (F.layer_norm(th, (shape[1],), tw, tb, LAYER_EPS) if layer
                      else F.rms_norm(th, (shape[1],), tw, RMS_EPS))
                return (ty, th) if prenorm else ty
            spec = TorchSpec(torch_add, [x, r, *params], grads=[dy, dh] if prenorm else [dy])
        # reads dy, dh, h (Post-Norm: dy, x, r), w; writes dx, dresidual, the parameter
        # gradients; reads the float64 row statistics
        n_stats = 2 if layer else 1
        traffic = 5 * x.nbytes + (1 + len(params)) * w.nbytes + n_stats * shape[0] * 8
        return Case(traffic,
                    out=lambda n: backward(out=dx, dresidual_out=dres, n_threads=n),
                    alloc=lambda n: backward(n_threads=n),
                    reference=ref, summed=(2, 3, 4) if layer else (2, 3),
                    peers={"numpy": fixed(numpy_backward), "numba": numba_peer}, torch=spec)


_add_norm_backward("add_rms_norm_backward", layer=False, prenorm=True)
_add_norm_backward("add_layer_norm_backward", layer=True, prenorm=True)
_add_norm_backward("add_rms_norm_post_backward", layer=False, prenorm=False)
_add_norm_backward("add_layer_norm_post_backward", layer=True, prenorm=False)


@register("dropout_backward", BACKWARD)
def _dropout_backward(shape, dtype, torch):
    x, dy = arrays(shape, dtype, ["x", "dy"])
    dx = np.empty_like(x)
    _, cache = dropout_forward(x, P_DROP, seed=SEED)
    keep = np.random.default_rng(1).random(shape, dtype=np.float32) >= P_DROP
    scaled_mask = (keep / dtype.type(1 - P_DROP)).astype(dtype)   # kept from NumPy's forward
    spec = None
    if torch is not None:
        spec = TorchSpec(lambda tx: torch.nn.functional.dropout(tx, P_DROP), [x], grads=[dy])
    return Case(
        2 * x.nbytes,
        out=lambda n: dropout_backward(dy, cache, out=dx, n_threads=n),
        alloc=lambda n: dropout_backward(dy, cache, n_threads=n),
        reference=lambda rows, keep: (reference.dropout_backward(dy[rows], keep[rows],
                                                                 P_DROP),),
        peers={"numpy": fixed(lambda: dy * scaled_mask)}, torch=spec,
        p=P_DROP, keep=lambda outputs: outputs[0] != 0)


@register("scaled_residual_backward", BACKWARD)
def _scaled_residual_backward(shape, dtype, torch):
    """LayerScale backward: dx = dh, dF = alpha * dh, dalpha = sum_rows dh * F."""
    x, f, dh = arrays(shape, dtype, ["x", "F", "dh"])
    dx, df = np.empty_like(x), np.empty_like(x)
    alpha = np.linspace(0.5, 1.5, shape[1]).astype(dtype)
    _, cache = scaled_residual_forward(x, f, alpha)
    spec = None
    if torch is not None:
        spec = TorchSpec(lambda tx, tf, ta: tx + ta * tf, [x, f, alpha], grads=[dh])
    # reads dh, F, alpha; writes dx, dF and the float64 dalpha
    return Case(
        4 * x.nbytes + alpha.nbytes + shape[1] * 8,
        out=lambda n: scaled_residual_backward(dh, cache, out=dx, dbranch_out=df, n_threads=n),
        alloc=lambda n: scaled_residual_backward(dh, cache, n_threads=n),
        reference=lambda rows, keep: reference.scaled_residual_backward(dh[rows], f[rows],
                                                                        alpha),
        summed=(2,),
        peers={"numpy": fixed(lambda: (dh, alpha * dh, (dh * f).sum(axis=0))),
               "numba": nb.scaled_residual_backward(dh, f, alpha)},
        torch=spec)


@register("gated_residual_backward", BACKWARD)
def _gated_residual_backward(shape, dtype, torch):
    """dx = dh, dF = s * dh, dg = dh * F * s * (1 - s), s = sigmoid(g) (full-shape gate)."""
    x, f, g, dh = arrays(shape, dtype, ["x", "F", "g", "dh"])
    dx, df, dg = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    _, cache = gated_residual_forward(x, f, g)

    def numpy_backward():
        s = 1 / (1 + np.exp(-g))
        return dh, s * dh, dh * f * s * (1 - s)

    spec = None
    if torch is not None:
        spec = TorchSpec(lambda tx, tf, tg: tx + torch.sigmoid(tg) * tf, [x, f, g], grads=[dh])
    # reads dh, F, g; writes dx, dF, dg
    return Case(6 * x.nbytes,
                out=lambda n: gated_residual_backward(dh, cache, out=dx, dbranch_out=df,
                                                      dgate_out=dg, n_threads=n),
                alloc=lambda n: gated_residual_backward(dh, cache, n_threads=n),
                reference=lambda rows, keep: reference.gated_residual_backward(
                    dh[rows], f[rows], g[rows]),
                peers={"numpy": fixed(numpy_backward),
                       "numba": nb.gated_residual_backward(dh, f, g)},
                torch=spec)
