"""The residual kernels give the same bits on every SIMD dispatch level (RESNORM_CPU caps it)."""
import os
import subprocess
import sys

import resnorm as rn
from resnorm import _core

# Computes every residual op, forward and backward, and prints a digest of all the bits.
SCRIPT = r"""
import hashlib
import numpy as np
import resnorm as rn

digest = hashlib.sha256()
for dtype in (np.float32, np.float64):
    rng = np.random.default_rng(0)
    shape = (37, 515)                       # odd sizes: vector heads and tails everywhere
    x, r, dy, dh = (rng.standard_normal(shape).astype(dtype) for _ in range(4))
    w = rng.standard_normal(shape[1]).astype(dtype)
    alpha = rng.standard_normal(shape[1]).astype(dtype)
    outs = []
    y, c = rn.dropout_forward(x, 0.3, seed=5, return_mask=True)
    outs += [y, c.mask, rn.dropout_backward(dy, c)]
    (y, h), c = rn.add_rms_norm_forward(x, r, w, alpha=alpha, p=0.2, seed=9)
    outs += [y, h, *rn.add_rms_norm_backward(dy, dh, c)]
    y, c = rn.add_layer_norm_post_forward(x, r, w, w, alpha=alpha, p=0.2, seed=9)
    outs += [y, *rn.add_layer_norm_post_backward(dy, c)]
    h, c = rn.scaled_residual_forward(x, r, alpha)
    outs += [h, *rn.scaled_residual_backward(dy, c)]
    h, c = rn.gated_residual_forward(x, r, dh)
    outs += [h, *rn.gated_residual_backward(dy, c)]
    for a in outs:
        digest.update(np.ascontiguousarray(a).tobytes())
print(rn.simd_level(), digest.hexdigest())
"""


def _run(level):
    env = {**os.environ, "RESNORM_CPU": level}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], out[1]


def test_every_dispatch_level_gives_the_same_bits():
    results = {level: _run(level) for level in _core.simd_levels()}
    digests = {digest for _, digest in results.values()}
    assert len(digests) == 1, results
    # the cap only lowers the level: at least the levels this machine has were compared
    assert results["sse2"][0] in ("sse2", "portable")
    assert rn.simd_level() in {level for level, _ in results.values()}
