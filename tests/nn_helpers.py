"""Shared helpers of the nn tests: central finite differences and a gradient check."""
import numpy as np

from conftest import central_diff


def check_gradients(module, inputs, *, before_forward=lambda: None, rtol=1e-6, atol=1e-8,
                    seed=0):
    """Compares module.backward with central differences of loss = sum(forward(*inputs) * w)
    for every input and every parameter (w fixed random).  before_forward() is called before
    each forward (to replay a dropout mask).  Returns the number of values compared."""
    rng = np.random.default_rng(seed)
    before_forward()
    y = module.forward(*inputs)
    w = rng.standard_normal(y.shape)
    module.zero_grad()
    dx = module.backward(w.copy())
    dx = dx if isinstance(dx, tuple) else (dx,)
    analytic = {f"input {i}": g for i, g in enumerate(dx)}
    analytic.update(module.grads())

    def loss():
        before_forward()
        return float(np.sum(module.forward(*inputs) * w))

    targets = {f"input {i}": a for i, a in enumerate(inputs)}
    targets.update(module.params())
    count = 0
    for name, a in targets.items():
        numeric = central_diff(loss, a)
        got = analytic[name]
        if got is None:   # no path from this input to the output (residual "none")
            got = np.zeros_like(numeric)
        np.testing.assert_allclose(got, numeric, rtol=rtol, atol=atol, err_msg=name)
        count += a.size
    return count


def replay(*dropouts):
    """A before_forward callback that resets each Dropout's generator to its current state,
    so every forward draws the same masks."""
    states = [d._rng.bit_generator.state for d in dropouts]

    def reset():
        for d, s in zip(dropouts, states):
            d._rng.bit_generator.state = s

    return reset
