"""RMSNorm forward and backward, checked against the float64 reference formulas.

resnorm.rms_norm_forward returns y and a cache holding what the backward reads (a
reference to x and the float64 rstd of each row); resnorm.rms_norm_backward turns the
gradient of y into the gradients of x and of the weight.  resnorm.reference writes the
same formulas in plain NumPy float64: the float32 kernels agree with it to float32
rounding.
"""
import numpy as np

import resnorm
from resnorm import reference

rng = np.random.default_rng(0)
x = rng.standard_normal((4, 16, 768), dtype=np.float32)   # (batch, tokens, D)
weight = (1 + 0.1 * rng.standard_normal(768)).astype(np.float32)
dy = rng.standard_normal(x.shape, dtype=np.float32)        # the gradient arriving at y

y, cache = resnorm.rms_norm_forward(x, weight, eps=1e-6)
dx, dweight = resnorm.rms_norm_backward(dy, cache)
# the inference form computes the same y without keeping a cache
assert np.array_equal(resnorm.rms_norm(x, weight, eps=1e-6), y)

y_ref, rstd_ref = reference.rms_norm_forward(x, weight, eps=1e-6)
dx_ref, dweight_ref = reference.rms_norm_backward(dy, x, weight, rstd_ref)

for name, got, want in [("y", y, y_ref), ("dx", dx, dx_ref), ("dweight", dweight, dweight_ref)]:
    error = np.max(np.abs(got - want)) / np.max(np.abs(want))
    print(f"{name:8} {got.dtype} {got.shape}: max error / max |reference| = {error:.1e}")
    assert error < 1e-5, name   # float32 keeps about 7 significant digits
print(f"rstd of the first row: {cache.rstd.ravel()[0]:.9f} (reference {rstd_ref.ravel()[0]:.9f})")
