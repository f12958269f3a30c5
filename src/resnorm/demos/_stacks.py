"""Deep stacks of linear sublayers F_l(x) = x @ W_l, three ways, forward and backward.

    plain      x_{l+1} = x_l @ W_l                          no residual, no norm
    post-norm  x_{l+1} = RMSNorm(alpha * x_l + x_l @ W_l)   norm after the residual add
    pre-norm   x_{l+1} = x_l + RMSNorm(x_l) @ W_l           norm inside the branch;
               output  = RMSNorm(x_L)                       plus one final norm

Each W_l is Gaussian with ||x @ W|| ~ gain * ||x||: the gain is the branch scaling (GPT-2
scales its residual branches by 1/sqrt(number of branches); DeepNorm keeps Post-Norm and
scales the residual by alpha and the branch weights by beta).  The norms are the library's
compiled kernels (resnorm.rms_norm_forward / rms_norm_backward, no weight); the matmuls
are NumPy with hand-written backward.  Rows of x are tokens.
"""
from dataclasses import dataclass

import numpy as np

import resnorm

KINDS = ("plain", "post-norm", "pre-norm")


@dataclass(frozen=True)
class Stack:
    """One way to wire the layers: kind, branch gain, residual scale alpha (Post-Norm)."""
    name: str
    kind: str
    gain: float
    alpha: float = 1.0
    shared: bool = False          # one W for every layer


def deepnorm_constants(depth):
    """DeepNorm's alpha = (2N)^(1/4) and beta = (8N)^(-1/4) for an N-layer encoder-only
    model (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers"), N = depth."""
    return (2.0 * depth) ** 0.25, (8.0 * depth) ** -0.25


def branch_scalings(depth):
    """The four normalised stacks of the branch-scaling sweep."""
    alpha, beta = deepnorm_constants(depth)
    return [Stack("Post-Norm", "post-norm", 1.0),
            Stack("DeepNorm", "post-norm", beta, alpha),
            Stack("Pre-Norm, gain 1", "pre-norm", 1.0),
            Stack("Pre-Norm, gain 1/sqrt(2L)", "pre-norm", 1.0 / np.sqrt(2.0 * depth))]


def describe(stacks, depth):
    """One line per stack: its formula and constants, for a table's caption."""
    alpha, beta = deepnorm_constants(depth)
    words = {"DeepNorm": f"DeepNorm = Post-Norm with alpha = (2L)^(1/4) = {alpha:.3g} and "
                         f"branch gain beta = (8L)^(-1/4) = {beta:.3g}",
             "Pre-Norm, gain 1/sqrt(2L)": f"gain 1/sqrt(2L) = {1 / np.sqrt(2.0 * depth):.3g} "
                                          "(GPT-2's 1/sqrt(N) for N = 2L branches)"}
    return "; ".join(words[s.name] for s in stacks if s.name in words)


def random_weights(rng, depth, d, gain):
    """depth independent Gaussian (d, d) matrices scaled so that ||x @ W|| ~ gain * ||x||."""
    return [rng.standard_normal((d, d)) * (gain / np.sqrt(d)) for _ in range(depth)]


def weights_for(stack, rng, depth, d):
    if stack.shared:
        return random_weights(rng, 1, d, stack.gain) * depth
    return random_weights(rng, depth, d, stack.gain)


def forward(kind, x, weights, alpha=1.0, eps=1e-6, final_norm=True):
    """Runs the stack.  Returns (output, tape): tape["streams"][l] is the input of layer l
    (streams[0] is x, streams[L] the last residual stream) plus what backward needs."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    streams, caches = [x], []
    for w in weights:
        if kind == "plain":
            x, cache = x @ w, None
        elif kind == "post-norm":
            x, cache = resnorm.rms_norm_forward(alpha * x + x @ w, None, eps)
        else:
            normed, norm_cache = resnorm.rms_norm_forward(x, None, eps)
            x, cache = x + normed @ w, (normed, norm_cache)
        streams.append(x)
        caches.append(cache)
    final = None
    if kind == "pre-norm" and final_norm:
        x, final = resnorm.rms_norm_forward(x, None, eps)
    return x, {"kind": kind, "alpha": alpha, "streams": streams, "caches": caches,
               "final": final}


def backward(dout, weights, tape):
    """Backpropagates dout = dloss/doutput through the stack.

    Returns (dstreams, dweights): dstreams[l] = dloss/dx_l, the gradient reaching layer l's
    input (dstreams[L] is the gradient at the last residual stream), dweights[l] = dloss/dW_l.
    """
    kind, streams, caches = tape["kind"], tape["streams"], tape["caches"]
    dx = dout if tape["final"] is None else resnorm.rms_norm_backward(dout, tape["final"])[0]
    depth = len(weights)
    dstreams, dweights = [None] * (depth + 1), [None] * depth
    dstreams[depth] = dx
    for l in reversed(range(depth)):
        w = weights[l]
        if kind == "plain":
            dweights[l] = streams[l].T @ dx
            dx = dx @ w.T
        elif kind == "post-norm":
            dsum, _ = resnorm.rms_norm_backward(dx, caches[l])       # through the norm first
            dweights[l] = streams[l].T @ dsum
            dx = tape["alpha"] * dsum + dsum @ w.T                   # skip path + branch
        else:
            normed, norm_cache = caches[l]
            dweights[l] = normed.T @ dx
            dnormed = dx @ w.T
            dx = dx + resnorm.rms_norm_backward(dnormed, norm_cache)[0]   # skip path + branch
        dstreams[l] = dx
    return dstreams, dweights
