"""The single-layer Transformer of Qin, Zhou, Jiang, Zhu (2025), forward and hand-written
backward, in NumPy (float64):

    Z    = Attn(X) + beta * X,   Attn(X) = softmax(X Wq (X Wk)^T / sqrt(d)) X Wv   (row softmax)
    F(X) = (FFN(Z) + Z) Wu,      FFN(Z)  = relu(Z W1) W2
    loss = 1/2 * sum over samples of ||F(X) - Y||_F^2

X: (S, n, d), S samples of n tokens with d features; Y: (S, n, d_out).  beta is a fixed
number, not trained.  The paper's analysis: gradient descent converges linearly, at a rate
set by sigma_min and sigma_max of Z; the residual term beta * X keeps Z well conditioned
when the softmax makes Attn(X) nearly low-rank.  This module only computes; the experiment
is in convergence.py.
"""
import numpy as np

PARAMS = ("wq", "wk", "wv", "w1", "w2", "wu")


def init(rng, d, d_ff, d_out):
    """Gaussian weights scaled so that each layer roughly keeps the size of its input."""
    return {
        "wq": rng.standard_normal((d, d)) / np.sqrt(d),
        "wk": rng.standard_normal((d, d)) / np.sqrt(d),
        "wv": rng.standard_normal((d, d)) / np.sqrt(d),
        "w1": rng.standard_normal((d, d_ff)) * np.sqrt(2.0 / d),
        "w2": rng.standard_normal((d_ff, d)) / np.sqrt(d_ff),
        "wu": rng.standard_normal((d, d_out)) / np.sqrt(d),
    }


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def forward(p, x, beta):
    """Returns (F(X), cache); cache holds what backward needs, including Z."""
    d = x.shape[-1]
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    attn = _softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d))      # (S, n, n), rows sum to 1
    z = attn @ v + beta * x
    pre = z @ p["w1"]
    hidden = np.maximum(pre, 0.0)
    h = hidden @ p["w2"] + z
    cache = {"x": x, "q": q, "k": k, "v": v, "attn": attn, "z": z, "pre": pre,
             "hidden": hidden, "h": h}
    return h @ p["wu"], cache


def backward(p, cache, dout):
    """Gradients of the loss for every weight, given dout = dloss/dF(X)."""
    x, d = cache["x"], cache["x"].shape[-1]
    flat = lambda a: a.reshape(-1, a.shape[-1])               # (S, n, m) -> (S*n, m)
    g = {"wu": flat(cache["h"]).T @ flat(dout)}
    dh = dout @ p["wu"].T
    g["w2"] = flat(cache["hidden"]).T @ flat(dh)
    dpre = (dh @ p["w2"].T) * (cache["pre"] > 0)
    g["w1"] = flat(cache["z"]).T @ flat(dpre)
    dz = dh + dpre @ p["w1"].T                                  # FFN branch + skip around it
    attn = cache["attn"]
    dv = attn.transpose(0, 2, 1) @ dz
    g["wv"] = flat(x).T @ flat(dv)
    dattn = dz @ cache["v"].transpose(0, 2, 1)
    dscores = attn * (dattn - (dattn * attn).sum(axis=-1, keepdims=True)) / np.sqrt(d)
    g["wq"] = flat(x).T @ flat(dscores @ cache["k"])
    g["wk"] = flat(x).T @ flat(dscores.transpose(0, 2, 1) @ cache["q"])
    return g


def loss_and_grads(p, x, y, beta):
    """(loss, gradients, Z) for the squared loss 1/2 ||F(X) - Y||_F^2."""
    out, cache = forward(p, x, beta)
    r = out - y
    return 0.5 * float(np.sum(r * r)), backward(p, cache, r), cache["z"]


def condition_ratio(z):
    """sigma_min / sigma_max of Z with all samples' tokens stacked as rows (S*n, d)."""
    s = np.linalg.svd(z.reshape(-1, z.shape[-1]), compute_uv=False)
    return float(s[-1] / s[0])
