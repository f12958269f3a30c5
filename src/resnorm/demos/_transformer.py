"""The single-layer Transformer of Qin, Zhou, Jiang, Zhu (2025), forward and hand-written
backward, in NumPy (float64), for R independent runs at once:

    Z    = Attn(X) + beta * X,   Attn(X) = softmax(X Wq (X Wk)^T / sqrt(d) + M) X Wv
    F(X) = (FFN(Z) + Z) Wu,      FFN(Z)  = relu(Z W1) W2
    loss = 1/2 * sum over samples of ||F(X) - Y||_F^2

X: (S, n, d), S samples of n tokens with d features, shared by every run; Y: (S, n, d_out).
Every weight has a leading run axis (R, ., .) and beta is an (R,) array: the R runs (for
example every beta x step size x seed of an experiment) are R separate models trained side
by side, batched only to share NumPy's per-call overhead.  M is 0 (the paper's model: every
token attends to every token) or, with causal=True, -inf above the diagonal (token t sees
tokens 0..t only).  beta is a fixed number per run, not trained.  This module only
computes; the experiment is in convergence.py.
"""
import numpy as np

PARAMS = ("wq", "wk", "wv", "w1", "w2", "wu")


def init(rng, runs, d, d_ff, d_out):
    """Gaussian weights for `runs` models, scaled so that each layer roughly keeps the size
    of its input."""
    scales = {"wq": (d, d, 1 / np.sqrt(d)), "wk": (d, d, 1 / np.sqrt(d)),
              "wv": (d, d, 1 / np.sqrt(d)), "w1": (d, d_ff, np.sqrt(2.0 / d)),
              "w2": (d_ff, d, 1 / np.sqrt(d_ff)), "wu": (d, d_out, 1 / np.sqrt(d))}
    return {k: rng.standard_normal((runs, a, b)) * s for k, (a, b, s) in scales.items()}


# exp(-60) is below float64's rounding of a row sum >= 1: clamping the shifted scores
# there changes nothing but keeps exp off its slow underflow path.
EXP_FLOOR = -60.0


def _row_max(s):
    """max over the last (short) axis, column by column: NumPy's reduction over a trailing
    axis of length n is far slower than n - 1 elementwise maxima."""
    m = s[..., 0].copy()
    for j in range(1, s.shape[-1]):
        np.maximum(m, s[..., j], out=m)
    return m[..., None]


def _row_sum(a):
    return np.einsum("...i->...", a)[..., None]


def _softmax(s, keep=None):
    """Row softmax; keep: (n, n) bool, False where a score is masked out (probability 0)."""
    shifted = s - _row_max(s if keep is None else np.where(keep, s, -np.inf))
    e = np.exp(np.maximum(shifted, EXP_FLOOR, out=shifted), out=shifted)
    if keep is not None:
        e *= keep
    return e / _row_sum(e)


def _flat(a):
    """(R, S, n, m) -> (R, S*n, m): every token of every sample as a row."""
    return a.reshape(a.shape[0], -1, a.shape[-1])


def _t(a):
    return np.swapaxes(a, -1, -2)


def attention(p, x, causal):
    """The attention probabilities (R, S, n, n) and q, k, v (R, S, n, d)."""
    d = x.shape[-1]
    q, k, v = (x @ p[name][:, None] for name in ("wq", "wk", "wv"))
    keep = np.tril(np.ones((x.shape[-2],) * 2, dtype=bool)) if causal else None
    return _softmax(q @ _t(k) / np.sqrt(d), keep), q, k, v


def forward(p, x, beta, causal=False):
    """Returns (F(X) of shape (R, S, n, d_out), cache); the cache holds Z and what backward
    needs."""
    attn, q, k, v = attention(p, x, causal)
    z = attn @ v + np.asarray(beta)[:, None, None, None] * x
    pre = z @ p["w1"][:, None]
    hidden = np.maximum(pre, 0.0)
    h = hidden @ p["w2"][:, None] + z
    cache = {"x": x, "q": q, "k": k, "v": v, "attn": attn, "z": z, "pre": pre,
             "hidden": hidden, "h": h}
    return h @ p["wu"][:, None], cache


def backward(p, cache, dout):
    """Gradients of the loss for every weight (R, ., .), given dout = dloss/dF(X)."""
    x, d = cache["x"], cache["x"].shape[-1]
    xt = _t(x.reshape(-1, d))                                   # (d, S*n), shared by all runs
    g = {"wu": _t(_flat(cache["h"])) @ _flat(dout)}
    dh = dout @ _t(p["wu"])[:, None]
    g["w2"] = _t(_flat(cache["hidden"])) @ _flat(dh)
    dpre = (dh @ _t(p["w2"])[:, None]) * (cache["pre"] > 0)
    g["w1"] = _t(_flat(cache["z"])) @ _flat(dpre)
    dz = dh + dpre @ _t(p["w1"])[:, None]                       # FFN branch + skip around it
    attn = cache["attn"]
    g["wv"] = xt @ _flat(_t(attn) @ dz)
    dattn = dz @ _t(cache["v"])
    dscores = attn * (dattn - _row_sum(dattn * attn)) / np.sqrt(d)
    g["wq"] = xt @ _flat(dscores @ cache["k"])
    g["wk"] = xt @ _flat(_t(dscores) @ cache["q"])
    return g


def loss_and_grads(p, x, y, beta, causal=False):
    """(loss (R,), gradients, Z) for the squared loss 1/2 ||F(X) - Y||_F^2 of every run."""
    out, cache = forward(p, x, beta, causal)
    r = out - y
    r2 = (r * r).reshape(len(r), -1)
    return 0.5 * r2.sum(axis=1), backward(p, cache, r), cache["z"]


def condition_ratio(z):
    """sigma_min / sigma_max of Z with all samples' tokens stacked as rows (S*n, d), per run."""
    s = np.linalg.svd(_flat(z), compute_uv=False)
    return s[:, -1] / s[:, 0]
