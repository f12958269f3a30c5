"""The norms' options, in the norms and the fused add + norm: normalisation over several
trailing axes (normalized_shape, as in torch) and the zero-centred weight (y = xhat (1 + w),
Gemma).  The table-driven tests (test_input_table, test_properties) cover the checks, the
reference and the layouts; here: finite differences of every gradient with a per-element
alpha over several axes, bitwise equality across thread counts, and the reference against
torch's own multi-axis norms."""
import numpy as np
import pytest

import resnorm as rn
from resnorm import reference as ref
from _residual_testing import THREADS, assert_grad, numeric_grad

DTYPES = (np.float32, np.float64)


def _inputs(shape, axes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    row = shape[len(shape) - axes:]
    return {"x": rng.standard_normal(shape).astype(dtype),
            "residual": rng.standard_normal(shape).astype(dtype),
            "weight": (0.3 * rng.standard_normal(row)).astype(dtype),
            "bias": rng.standard_normal(row).astype(dtype),
            "alpha": (0.5 + rng.uniform(size=row)).astype(dtype)}


@pytest.mark.parametrize("layer", [False, True])
@pytest.mark.parametrize("prenorm", [True, False])
def test_fused_gradients_over_several_axes_by_finite_differences(layer, prenorm):
    """Every gradient of the fused add + norm over (2, 3) rows with a zero-centred weight and
    an alpha of the row's shape, against central differences of sum(y dy) + sum(h dh)."""
    shape, ns = (3, 2, 3), (2, 3)
    args = _inputs(shape, 2, np.float64, seed=1)
    if not layer:
        del args["bias"]
    rng = np.random.default_rng(2)
    dy, dh = rng.standard_normal(shape), rng.standard_normal(shape)
    name = ("add_layer_norm" if layer else "add_rms_norm") + ("" if prenorm else "_post")
    forward, backward = getattr(rn, name + "_forward"), getattr(rn, name + "_backward")
    options = dict(normalized_shape=ns, zero_centered_weight=True, p=0.3, seed=5)

    def fn(**a):
        out, _ = forward(**a, **options)
        return out if prenorm else (out,)

    _, cache = forward(**args, **options)
    grads = backward(dy, dh, cache) if prenorm else backward(dy, cache)
    names = ("x", "residual", "weight") + (("bias",) if layer else ()) + ("alpha",)
    cotangents = [dy, dh] if prenorm else [dy]
    for arg, analytic in zip(names, grads):
        assert analytic.shape == np.shape(args[arg])
        assert_grad(analytic, numeric_grad(fn, args, arg, cotangents), arg)


@pytest.mark.parametrize("layer", [False, True])
def test_norm_gradients_over_several_axes_by_finite_differences(layer):
    shape, ns = (2, 1, 2, 3), (1, 2, 3)   # torch's OpInfo samples normalise (1, 2, 3)
    a = _inputs(shape, 3, np.float64, seed=3)
    args = {"x": a["x"], "weight": a["weight"]} | ({"bias": a["bias"]} if layer else {})
    dy = np.random.default_rng(4).standard_normal(shape)
    forward = rn.layer_norm_forward if layer else rn.rms_norm_forward
    backward = rn.layer_norm_backward if layer else rn.rms_norm_backward
    options = dict(normalized_shape=ns, zero_centered_weight=True)
    fn = lambda **kw: (forward(**kw, **options)[0],)  # noqa: E731
    grads = backward(dy, forward(**args, **options)[1])
    for arg, analytic in zip(args, grads):
        assert_grad(analytic, numeric_grad(fn, args, arg, [dy]), arg)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bitwise_identical_across_thread_counts(dtype):
    """Rows over two axes with a zero-centred weight, for every norm and fused form: the
    same bits on 1, 2 and 4 threads (enough rows for the parameter sums to use every row
    block)."""
    shape, ns = (600, 8, 65), (8, 65)
    a = _inputs(shape, 2, dtype, seed=6)
    dy = np.random.default_rng(7).standard_normal(shape).astype(dtype)
    options = dict(normalized_shape=ns, zero_centered_weight=True)
    results = []
    for nt in THREADS:
        out = []
        y, c = rn.rms_norm_forward(a["x"], a["weight"], **options, n_threads=nt)
        out += [y, *rn.rms_norm_backward(dy, c, n_threads=nt)]
        y, c = rn.layer_norm_forward(a["x"], a["weight"], a["bias"], **options, n_threads=nt)
        out += [y, *rn.layer_norm_backward(dy, c, n_threads=nt)]
        (y, h), c = rn.add_layer_norm_forward(a["x"], a["residual"], a["weight"], a["bias"],
                                              **options, alpha=a["alpha"], p=0.1, seed=3,
                                              n_threads=nt)
        out += [y, h, *rn.add_layer_norm_backward(dy, dy, c, n_threads=nt)]
        y, c = rn.add_rms_norm_post_forward(a["x"], a["residual"], a["weight"], **options,
                                            alpha=a["alpha"], n_threads=nt)
        out += [y, *rn.add_rms_norm_post_backward(dy, c, n_threads=nt)]
        results.append(out)
    for other in results[1:]:
        for u, v in zip(results[0], other):
            assert u.tobytes() == v.tobytes()


def test_reference_matches_torch_over_several_axes():
    """resnorm.reference's norms over (1, 2, 3) and (5, 4) are torch's (float64), forward
    and the gradients autograd gives; the zero-centred weight is torch's with 1 + w."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for shape, ns in (((4, 1, 2, 3), (1, 2, 3)), ((3, 5, 4), (5, 4))):
        a = _inputs(shape, len(ns), np.float64, seed=8)
        dy = np.random.default_rng(9).standard_normal(shape)
        tx, tw, tb = (torch.tensor(a[k], requires_grad=True) for k in ("x", "weight", "bias"))
        y_ln = F.layer_norm(tx, ns, 1 + tw, tb, 1e-5)
        y_rms = F.rms_norm(tx, ns, 1 + tw, 1e-6)
        want = [t.numpy() for t in torch.autograd.grad(y_ln, (tx, tw, tb), torch.tensor(dy))]
        y, mean, rstd = ref.layer_norm_forward(a["x"], a["weight"], a["bias"], 1e-5,
                                               normalized_shape=ns, zero_centered_weight=True)
        np.testing.assert_allclose(y, y_ln.detach().numpy(), rtol=1e-12, atol=1e-12)
        got = ref.layer_norm_backward(dy, a["x"], a["weight"], mean, rstd, normalized_shape=ns,
                                      zero_centered_weight=True)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-11)
        want = [t.numpy() for t in torch.autograd.grad(y_rms, (tx, tw), torch.tensor(dy))]
        y, rstd = ref.rms_norm_forward(a["x"], a["weight"], 1e-6, normalized_shape=ns,
                                       zero_centered_weight=True)
        np.testing.assert_allclose(y, y_rms.detach().numpy(), rtol=1e-12, atol=1e-12)
        got = ref.rms_norm_backward(dy, a["x"], a["weight"], rstd, normalized_shape=ns,
                                    zero_centered_weight=True)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-11)
        assert rstd.shape == shape[:len(shape) - len(ns)]


def test_zero_centered_weight_is_computed_as_gemma_does():
    """float32: the gain is float32(1 + w), rounded once (Gemma's module computes 1 + w in
    float32 too), then y = xhat * gain; a weight of zeros is the norm without a weight."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((5, 16)).astype(np.float32)
    w = (0.1 * rng.standard_normal(16)).astype(np.float32)
    plain = rn.rms_norm(x, np.float32(1) + w)
    assert rn.rms_norm(x, w, zero_centered_weight=True).tobytes() == plain.tobytes()
    zeros = rn.rms_norm(x, np.zeros(16, np.float32), zero_centered_weight=True)
    assert zeros.tobytes() == rn.rms_norm(x).tobytes()
