"""The residual ops of the benchmark runner (resnorm.bench): fused add + norm, dropout, scaled
residual, each with what a NumPy user would write and, when installed, PyTorch CPU.

setup() follows bench._setup: (resnorm fn, numpy fn, torch fn or None, output array, minimum
traffic in bytes: every input read once, every output written once).
"""
import numpy as np

from . import inverted_dropout
from . import residual

P_DROP = 0.1
OPS = ["add_rms_norm", "add_rms_norm_dropout", "add_layer_norm", "add_rms_norm_post",
       "add_rms_norm_backward", "dropout", "scaled_residual"]


def _numpy_dropout(x, p, rng):
    keep = rng.random(x.shape, dtype=np.float32) >= p
    return x * (keep / x.dtype.type(1 - p)).astype(x.dtype)


def setup(op, shape, dtype, threads, torch):
    from .bench import _numpy_layer, _numpy_rms  # bench imports this module

    rng = np.random.default_rng(0)
    d = shape[1]
    x = rng.standard_normal(shape).astype(dtype)
    r = rng.standard_normal(shape).astype(dtype)
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
    b = (0.1 * rng.standard_normal(d)).astype(dtype)
    y, h = np.empty_like(x), np.empty_like(x)
    nbytes = x.nbytes
    F = tx = tr = tw = tb = None
    if torch is not None:
        F = torch.nn.functional
        tx, tr, tw, tb = (torch.from_numpy(a) for a in (x, r, w, b))
    np_rng = np.random.default_rng(1)

    if op in ("add_rms_norm", "add_rms_norm_dropout"):
        p = P_DROP if op == "add_rms_norm_dropout" else 0.0
        fn = lambda: residual.add_rms_norm(x, r, w, p=p, seed=7, out=y, residual_out=h,
                                           n_threads=threads)
        if p:
            ref = lambda: _numpy_rms(r + _numpy_dropout(x, p, np_rng), w, 1e-6)
            tfn = None if torch is None else (
                lambda: F.rms_norm(tr + F.dropout(tx, p), (d,), tw, 1e-6))
        else:
            ref = lambda: _numpy_rms(x + r, w, 1e-6)
            tfn = None if torch is None else (lambda: F.rms_norm(tx + tr, (d,), tw, 1e-6))
        return fn, ref, tfn, y, 4 * nbytes + w.nbytes
    if op == "add_layer_norm":
        fn = lambda: residual.add_layer_norm(x, r, w, b, out=y, residual_out=h,
                                             n_threads=threads)
        ref = lambda: _numpy_layer(x + r, w, b, 1e-5)
        tfn = None if torch is None else (lambda: F.layer_norm(tx + tr, (d,), tw, tb, 1e-5))
        return fn, ref, tfn, y, 4 * nbytes + 2 * w.nbytes
    if op == "add_rms_norm_post":
        fn = lambda: residual.add_rms_norm_post(x, r, w, out=y, n_threads=threads)
        ref = lambda: _numpy_rms(x + r, w, 1e-6)
        tfn = None if torch is None else (lambda: F.rms_norm(tx + tr, (d,), tw, 1e-6))
        return fn, ref, tfn, y, 3 * nbytes + w.nbytes
    if op == "add_rms_norm_backward":
        dy, dh = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
        (_, hh), cache = residual.add_rms_norm_forward(x, r, w)
        fn = lambda: residual.add_rms_norm_backward(dy, dh, cache, n_threads=threads)

        def ref():
            rstd = cache.rstd.astype(dtype)[:, None]
            hn = hh * rstd
            g = dy * w
            gh = rstd * (g - hn * np.mean(g * hn, axis=-1, keepdims=True)) + dh
            return gh, gh.copy(), (dy * hn).sum(axis=0)

        tfn = None
        if torch is not None:
            txg, trg, twg = (t.clone().requires_grad_(True) for t in (tx, tr, tw))
            th = txg + trg
            ty = F.rms_norm(th, (d,), twg, 1e-6)
            tdy, tdh = torch.from_numpy(dy), torch.from_numpy(dh)
            tfn = lambda: torch.autograd.grad((ty, th), (txg, trg, twg), (tdy, tdh),
                                              retain_graph=True)
        # reads dy, dh, h; writes dx, dresidual
        return fn, ref, tfn, y, 5 * nbytes + 2 * w.nbytes + shape[0] * 8
    if op == "dropout":
        fn = lambda: inverted_dropout.dropout(x, P_DROP, seed=7, out=y, n_threads=threads)
        ref = lambda: _numpy_dropout(x, P_DROP, np_rng)
        tfn = None if torch is None else (lambda: F.dropout(tx, P_DROP))
        return fn, ref, tfn, y, 2 * nbytes
    if op == "scaled_residual":
        alpha = np.linspace(0.5, 1.5, d).astype(dtype)
        fn = lambda: residual.scaled_residual(x, r, alpha, out=y, n_threads=threads)
        ref = lambda: x + alpha * r
        ta = None if torch is None else torch.from_numpy(alpha)
        tfn = None if torch is None else (lambda: tx + ta * tr)
        return fn, ref, tfn, y, 3 * nbytes + alpha.nbytes
    raise ValueError(f"unknown op {op!r}")
