"""Prints a digest of kernel outputs on fixed inputs, one line per function and dtype.

tools/check_platforms.sh compares these lines between builds (gcc and clang, x86-64 and
aarch64): the kernels' reductions have one fixed lane structure and no contracted FMAs, so
the norms, the fused residual kernels and the dropout mask give the same bits everywhere.
The inputs are small integers times powers of two, so they too are the same bits
everywhere (no platform's libm is involved in making them).
"""
import hashlib

import numpy as np

import resnorm


def inputs(shape, dtype, seed):
    """Values k / 64 for integers k in [-256, 256): exact in float32 and float64."""
    k = np.random.default_rng(seed).integers(-256, 256, size=shape)
    return (k / 64.0).astype(dtype)


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:  # None: a gradient that was not asked for
        h.update(b"None" if a is None else np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def lines(shape=(37, 1031)):
    d = shape[-1]
    for dtype in (np.float32, np.float64):
        x, f, dy = (inputs(shape, dtype, s) for s in (1, 2, 3))
        w, b = inputs((d,), dtype, 4) + dtype(1), inputs((d,), dtype, 5)
        name = np.dtype(dtype).name

        y, cache = resnorm.rms_norm_forward(x, w)
        yield f"rms_norm {name}", digest(y, *resnorm.rms_norm_backward(dy, cache))
        y, cache = resnorm.layer_norm_forward(x, w, b)
        yield f"layer_norm {name}", digest(y, *resnorm.layer_norm_backward(dy, cache))
        (y, h), cache = resnorm.add_rms_norm_forward(f, x, w, alpha=0.5, p=0.25, seed=7)
        grads = resnorm.add_rms_norm_backward(dy, dy, cache)
        yield f"add_rms_norm {name}", digest(y, h, *grads)
        y, cache = resnorm.add_layer_norm_post_forward(f, x, w, b, p=0.25, seed=8)
        yield f"add_layer_norm_post {name}", digest(
            y, *resnorm.add_layer_norm_post_backward(dy, cache))
        yield f"dropout {name}", digest(resnorm.dropout(x, 0.25, seed=9))
        h, cache = resnorm.gated_residual_forward(x, f, b)
        yield f"gated_residual {name}", digest(h, *resnorm.gated_residual_backward(dy, cache))


if __name__ == "__main__":
    for what, value in lines():
        print(f"{what:26s} {value}")
