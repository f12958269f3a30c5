"""A Pre-Norm residual stream through several layers with the fused add + RMSNorm.

Each layer of a Pre-Norm Transformer adds its sublayer's output f to the residual stream h
and normalises the new stream for the next sublayer.  resnorm.add_rms_norm does both in one
pass over memory; residual_out=h updates the stream in place and out=y writes the
normalised rows into one preallocated buffer, so the loop allocates no stream-sized array
for them.  The check beside it computes the same thing unfused.
"""
import numpy as np

import resnorm

rng = np.random.default_rng(0)
tokens, d, layers = 256, 512, 6
weight = np.ones(d, np.float32)
h = rng.standard_normal((tokens, d), dtype=np.float32)          # the residual stream
sublayers = [rng.standard_normal((d, d), dtype=np.float32) / d**0.5 for _ in range(layers)]

y = resnorm.rms_norm(h, weight)                                 # the first sublayer's input
for i, w in enumerate(sublayers):
    f = y @ w                                                   # a stand-in sublayer
    unfused_h = h + f
    y_out, h_out = resnorm.add_rms_norm(f, h, weight, out=y, residual_out=h)
    assert y_out is y and h_out is h                            # written into the buffers
    assert np.array_equal(h, unfused_h)                         # the same float32 sum
    np.testing.assert_allclose(y, resnorm.rms_norm(unfused_h, weight), rtol=1e-5, atol=1e-6)
    print(f"layer {i}: RMS of the stream {np.sqrt(np.mean(h.astype(np.float64) ** 2)):.3f}")

# In training, dropout on f costs no extra pass; its mask is a function of (seed, element
# index), so the same seed gives the same mask: use a fresh seed per step and layer.
first, _ = resnorm.add_rms_norm(f, h, weight, p=0.1, seed=1234)
again, _ = resnorm.add_rms_norm(f, h, weight, p=0.1, seed=1234)
assert np.array_equal(first, again)
print("dropout with seed 1234 gives the same output twice")
