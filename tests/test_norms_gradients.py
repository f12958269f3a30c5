"""Backward passes against central finite differences (float64) of L = sum(y * R).

With a fixed random R, dL/dy = R, so the backward called with dy = R must return dL/dx,
dL/dweight and dL/dbias, which are checked here without the NumPy reference.
"""
import numpy as np
import pytest

import resnorm
from conftest import central_diff

RTOL = 1e-6
SHAPES = [(3, 5), (2, 1), (4, 7)]


def assert_grad_close(analytic, numeric, scale, what):
    err = np.max(np.abs(analytic - numeric), initial=0.0)
    assert err <= RTOL * scale, f"{what}: max error {err:.3g} > {RTOL} * {scale:.3g}"


def _inputs(rng, shape, has_w, has_b):
    d = shape[-1]
    x = rng.standard_normal(shape)
    w = 1.0 + 0.5 * rng.standard_normal(d) if has_w else None
    b = rng.standard_normal(d) if has_b else None
    r = rng.standard_normal(shape)
    return x, w, b, r


def _scales(x, r, w, rstd, mean=None):
    """Size of the terms of (dx, dweight, dbias): rstd*|R*w|, sum_rows |R*xhat|, sum_rows |R|."""
    rstd = rstd.reshape(x.shape[:-1] + (1,))
    xhat = (x - (0.0 if mean is None else mean.reshape(rstd.shape))) * rstd
    wmax = 1.0 if w is None else np.max(np.abs(w))
    n = x.shape[0]
    return (np.max(np.abs(r)) * wmax * np.max(rstd),
            n * np.max(np.abs(r)) * max(np.max(np.abs(xhat)), 1.0),
            n * np.max(np.abs(r)))


@pytest.mark.parametrize("eps", [None, 0.5], ids=["default_eps", "eps0.5"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("has_w", [True, False], ids=["w", "no_w"])
def test_rms_norm_backward_matches_finite_differences(rng, shape, has_w, eps):
    x, w, _, r = _inputs(rng, shape, has_w, False)
    kw = {} if eps is None else {"eps": eps}

    def loss():
        return float(np.sum(resnorm.rms_norm(x, w, **kw) * r))

    _, cache = resnorm.rms_norm_forward(x, w, **kw)
    dx, dw = resnorm.rms_norm_backward(r, cache)
    sdx, sdw, _ = _scales(x, r, w, cache.rstd)
    assert_grad_close(dx, central_diff(loss, x), sdx, "dx")
    if has_w:
        assert_grad_close(dw, central_diff(loss, w), sdw, "dweight")
    else:
        assert dw is None


@pytest.mark.parametrize("eps", [None, 0.5], ids=["default_eps", "eps0.5"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("has_w", [True, False], ids=["w", "no_w"])
@pytest.mark.parametrize("has_b", [True, False], ids=["b", "no_b"])
def test_layer_norm_backward_matches_finite_differences(rng, shape, has_w, has_b, eps):
    x, w, b, r = _inputs(rng, shape, has_w, has_b)
    kw = {} if eps is None else {"eps": eps}

    def loss():
        return float(np.sum(resnorm.layer_norm(x, w, b, **kw) * r))

    _, cache = resnorm.layer_norm_forward(x, w, b, **kw)
    dx, dw, db = resnorm.layer_norm_backward(r, cache)
    sdx, sdw, sdb = _scales(x, r, w, cache.rstd, cache.mean)
    assert_grad_close(dx, central_diff(loss, x), sdx, "dx")
    if has_w:
        assert_grad_close(dw, central_diff(loss, w), sdw, "dweight")
    else:
        assert dw is None
    if has_b:
        assert_grad_close(db, central_diff(loss, b), sdb, "dbias")
    else:
        assert db is None


@pytest.mark.parametrize("norm", ["rms", "ln"])
def test_finite_difference_check_detects_a_wrong_gradient(rng, norm):
    """The checker itself can fail: a gradient off by 1e-4 in one element is caught."""
    x, w, b, r = _inputs(rng, (3, 5), True, True)
    if norm == "rms":
        _, cache = resnorm.rms_norm_forward(x, w)
        dx = resnorm.rms_norm_backward(r, cache)[0]
        loss = lambda: float(np.sum(resnorm.rms_norm(x, w) * r))  # noqa: E731
    else:
        _, cache = resnorm.layer_norm_forward(x, w, b)
        dx = resnorm.layer_norm_backward(r, cache)[0]
        loss = lambda: float(np.sum(resnorm.layer_norm(x, w, b) * r))  # noqa: E731
    numeric = central_diff(loss, x)
    scale = _scales(x, r, w, cache.rstd)[0]
    assert_grad_close(dx, numeric, scale, "dx")
    dx[1, 2] += 1e-4
    with pytest.raises(AssertionError):
        assert_grad_close(dx, numeric, scale, "dx")
