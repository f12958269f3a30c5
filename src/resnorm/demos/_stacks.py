"""Deep stacks of linear sublayers F_l(x) = x @ W_l, three ways, forward and backward.

    plain      x_{l+1} = x_l @ W_l                        no residual, no norm
    post-norm  x_{l+1} = RMSNorm(x_l + x_l @ W_l)         norm after the residual add
    pre-norm   x_{l+1} = x_l + RMSNorm(x_l) @ W_l         norm inside the branch;
               output  = RMSNorm(x_L)                     plus one final norm

The norms are the library's compiled kernels (resnorm.rms_norm_forward / backward, no
weight); the matmuls are NumPy with hand-written backward.  Rows of x are tokens.
"""
import numpy as np

from .. import norms

KINDS = ("plain", "post-norm", "pre-norm")


def random_weights(rng, depth, d, gain):
    """depth independent Gaussian (d, d) matrices scaled so that ||x @ W|| ~ gain * ||x||."""
    return [rng.standard_normal((d, d)) * (gain / np.sqrt(d)) for _ in range(depth)]


def forward(kind, x, weights, eps=1e-6, final_norm=True):
    """Runs the stack.  Returns (output, tape): tape[l] is the input of layer l (tape[0] is
    x, tape[L] the last residual stream) plus what backward needs."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    streams, caches = [x], []
    for w in weights:
        if kind == "plain":
            x, cache = x @ w, None
        elif kind == "post-norm":
            x, cache = norms.rms_norm_forward(x + x @ w, None, eps)
        else:
            normed, norm_cache = norms.rms_norm_forward(x, None, eps)
            x, cache = x + normed @ w, (normed, norm_cache)
        streams.append(x)
        caches.append(cache)
    final = None
    if kind == "pre-norm" and final_norm:
        x, final = norms.rms_norm_forward(x, None, eps)
    return x, {"kind": kind, "streams": streams, "caches": caches, "final": final}


def backward(dout, weights, tape):
    """Backpropagates dout = dloss/doutput through the stack.

    Returns (dstreams, dweights): dstreams[l] = dloss/dx_l, the gradient reaching layer l's
    input (dstreams[L] is the gradient at the last residual stream), dweights[l] = dloss/dW_l.
    """
    kind, streams, caches = tape["kind"], tape["streams"], tape["caches"]
    dx = dout if tape["final"] is None else norms.rms_norm_backward(dout, tape["final"])[0]
    depth = len(weights)
    dstreams, dweights = [None] * (depth + 1), [None] * depth
    dstreams[depth] = dx
    for l in reversed(range(depth)):
        w = weights[l]
        if kind == "plain":
            dweights[l] = streams[l].T @ dx
            dx = dx @ w.T
        elif kind == "post-norm":
            dsum, _ = norms.rms_norm_backward(dx, caches[l])      # through the norm first
            dweights[l] = streams[l].T @ dsum
            dx = dsum + dsum @ w.T                                 # skip path + branch
        else:
            normed, norm_cache = caches[l]
            dweights[l] = normed.T @ dx
            dnormed = dx @ w.T
            dx = dx + norms.rms_norm_backward(dnormed, norm_cache)[0]   # skip path + branch
        dstreams[l] = dx
    return dstreams, dweights
