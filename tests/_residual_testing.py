"""Helpers shared by the residual and dropout tests: finite differences, thread counts."""
import numpy as np

THREADS = (1, 2, 4)
# enough elements that calls really run on several threads (resnorm._parallel), odd D
THREADED_SHAPE = (67, 513)


def inner(outputs, cotangents):
    """sum_k <outputs[k], cotangents[k]> in float64: the scalar whose gradient backward gives."""
    return sum(float(np.sum(np.asarray(o, dtype=np.float64) * c))
               for o, c in zip(outputs, cotangents) if c is not None)


def numeric_grad(fn, inputs, name, cotangents, eps=1e-6):
    """Central finite differences of inner(fn(**inputs), cotangents) with respect to
    inputs[name] (an array, possibly 0-d)."""
    base = np.asarray(inputs[name], dtype=np.float64)
    grad = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        values = []
        for step in (eps, -eps):
            shifted = base.copy()
            shifted[idx] += step
            values.append(inner(fn(**{**inputs, name: shifted}), cotangents))
        grad[idx] = (values[0] - values[1]) / (2 * eps)
    return grad


def assert_grad(analytic, numeric, name):
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7, err_msg=f"d{name}")


def read_only(a):
    a = np.array(a)
    a.setflags(write=False)
    return a


def strided(a):
    """A non-contiguous view holding a's values (every other column of a wider array)."""
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    wide[..., ::2] = a
    view = wide[..., ::2]
    assert not view.flags.c_contiguous
    return view
