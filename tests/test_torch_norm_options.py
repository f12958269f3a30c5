"""resnorm.torch's norms over several trailing axes (normalized_shape, as torch's) and with a
zero-centred weight (1 + w, Gemma): functions, every autograd path (first and second order,
forward mode, vmap, torch.compile), GemmaRMSNorm, and patch() of such norms."""
import warnings

import pytest

torch = pytest.importorskip("torch")

import resnorm  # noqa: E402
import resnorm.torch as rt  # noqa: E402
from test_torch_modules import GemmaStyleRMSNorm  # noqa: E402  (Gemma's, as HF writes it)

F = torch.nn.functional
nn = torch.nn
# (x's shape, normalized_shape): torch's OpInfo samples normalise (1, 2, 3)
SHAPES = [((2, 1, 2, 3), (1, 2, 3)), ((3, 5, 4), (5, 4)), ((2, 3, 4), 4)]


def _tensors(shape, ns, dtype=torch.float64, seed=0, zero_centered=False):
    g = torch.Generator().manual_seed(seed)
    row = (ns,) if isinstance(ns, int) else ns
    x = torch.randn(shape, generator=g, dtype=dtype).requires_grad_()
    w = ((0.0 if zero_centered else 1.0) + 0.3 * torch.randn(row, generator=g, dtype=dtype))
    b = 0.2 * torch.randn(row, generator=g, dtype=dtype)
    return x, w.requires_grad_(), b.requires_grad_()


def _theirs(layer, x, w, b, ns, zero_centered, eps):
    """torch's own norm, with the gain 1 + w for a zero-centred weight."""
    ns = (ns,) if isinstance(ns, int) else ns
    gain = 1 + w if zero_centered else w
    return F.layer_norm(x, ns, gain, b, eps) if layer else F.rms_norm(x, ns, gain, eps)


def _ours(layer, x, w, b, ns, zero_centered, eps):
    options = dict(normalized_shape=ns, zero_centered_weight=zero_centered)
    return (rt.layer_norm(x, w, b, eps, **options) if layer
            else rt.rms_norm(x, w, eps, **options))


@pytest.mark.parametrize("layer", [False, True])
@pytest.mark.parametrize("shape, ns", SHAPES, ids=str)
@pytest.mark.parametrize("zero_centered", [False, True])
def test_matches_torch_forward_and_backward(layer, shape, ns, zero_centered):
    x, w, b = _tensors(shape, ns, zero_centered=zero_centered)
    params = [x, w] + ([b] if layer else [])
    y = _ours(layer, x, w, b, ns, zero_centered, 1e-5)
    ref = _theirs(layer, x, w, b if layer else None, ns, zero_centered, 1e-5)
    torch.testing.assert_close(y, ref)
    dy = torch.randn(shape, dtype=torch.float64)
    got = torch.autograd.grad(y, params, dy)
    for g, want in zip(got, torch.autograd.grad(ref, params, dy)):
        assert g.shape == want.shape
        torch.testing.assert_close(g, want)
    with torch.no_grad():   # the inference path
        torch.testing.assert_close(_ours(layer, x, w, b, ns, zero_centered, 1e-5), ref)


@pytest.mark.parametrize("layer", [False, True])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_gradcheck_gradgradcheck_forward_ad_and_batched_float64(layer, zero_centered):
    """Backward (the kernel's), double backward (torch expressions), forward-mode AD (the
    jvp rule) and batched gradients (the vmap rule), over (1, 2, 3)."""
    x, w, b = _tensors((2, 1, 2, 3), (1, 2, 3), zero_centered=zero_centered)

    def f(x, w, b):
        return _ours(layer, x, w, b if layer else None, (1, 2, 3), zero_centered, 1e-3)
    args = (x, w, b)
    assert torch.autograd.gradcheck(f, args, check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(f, args)


def test_vmap_over_samples_and_over_the_weight():
    x, w, b = _tensors((4, 3, 2, 5), (2, 5))
    ws = torch.randn(4, 2, 5, dtype=torch.float64)
    options = dict(normalized_shape=(2, 5), zero_centered_weight=True)
    got = torch.func.vmap(lambda xi, wi: rt.layer_norm(xi, wi, b, **options))(x, ws)
    want = torch.stack([rt.layer_norm(x[i], ws[i], b, **options) for i in range(4)])
    torch.testing.assert_close(got, want)


def test_torch_compile_records_the_options():
    x, w, b = _tensors((3, 5, 4), (5, 4), dtype=torch.float32, zero_centered=True)
    f = torch.compile(lambda x, w: rt.rms_norm(x, w, 1e-5, normalized_shape=(5, 4),
                                               zero_centered_weight=True), fullgraph=True)
    y = f(x, w)
    torch.testing.assert_close(y, _theirs(False, x, w, None, (5, 4), True, 1e-5))
    dx, dw = torch.autograd.grad(y.sum(), (x, w))
    want = torch.autograd.grad(_theirs(False, x, w, None, (5, 4), True, 1e-5).sum(), (x, w))
    torch.testing.assert_close(dx, want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dw, want[1], rtol=1e-4, atol=1e-5)


def test_bad_normalized_shape_and_parameter_shapes_are_named():
    x = torch.randn(3, 5, 4)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 5, 3\)"):
        rt.rms_norm(x, normalized_shape=(5, 3))
    with pytest.raises(ValueError, match=r"weight must have shape \(5, 4\)"):
        rt.rms_norm(x, torch.ones(20), normalized_shape=(5, 4))
    with pytest.raises(TypeError, match="normalized_shape"):
        resnorm.rms_norm(x.numpy(), normalized_shape=(5.0, 4))
    with pytest.raises(TypeError, match="normalized_shape"):
        rt.layer_norm(x, normalized_shape=(5.0, 4))
    with pytest.raises(TypeError, match="zero_centered_weight"):
        rt.rms_norm(x, torch.ones(4), zero_centered_weight=1)


# --------------------------------------------------------------------------- modules, patch

def test_gemma_rms_norm_loads_gemmas_weights_and_computes_the_same():
    theirs = GemmaStyleRMSNorm(16)
    mine = rt.GemmaRMSNorm(16)
    assert torch.equal(mine.weight, theirs.weight)   # both start at 0: the identity gain
    with torch.no_grad():
        theirs.weight.normal_(0, 0.3)
    mine.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 7, 16, requires_grad=True)
    y, ref = mine(x), theirs(x)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    dy = torch.randn(x.shape)
    for g, want in zip(torch.autograd.grad(y, (x, mine.weight), dy),
                       torch.autograd.grad(ref, (x, theirs.weight), dy)):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)
    assert isinstance(mine, nn.RMSNorm) and mine.eps == 1e-6
    mine.reset_parameters()
    assert torch.equal(mine.weight, torch.zeros(16))
    scripted = torch.jit.script(mine)
    torch.testing.assert_close(scripted(x), mine(x))


def test_patch_runs_gemmas_norm_with_the_zero_centered_weight(monkeypatch):
    """The recognised (1 + w) norm calls resnorm with zero_centered_weight=True on its own
    weight (no 1 + w tensor per call), and trains as the original."""
    calls = []
    real = resnorm.rms_norm_forward

    def spy(*args, **kwargs):
        calls.append(kwargs.get("zero_centered_weight"))
        return real(*args, **kwargs)
    monkeypatch.setattr(resnorm, "rms_norm_forward", spy)
    model = nn.Sequential(nn.Linear(8, 8), GemmaStyleRMSNorm(8))
    with torch.no_grad():
        model[1].weight.normal_(0, 0.3)
    x = torch.randn(5, 8)
    ref = model(x)
    handle = rt.patch(model)
    assert [n for n, _ in handle.swapped] == ["1"]
    torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-6)
    assert calls == [True]


class TwoAxisRMSNorm(nn.Module):
    """An RMSNorm over the last two axes, written by hand."""

    def __init__(self, shape, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(shape))

    def forward(self, x):
        ms = x.pow(2).mean((-2, -1), keepdim=True)
        return x * torch.rsqrt(ms + self.eps) * self.weight


def test_patch_swaps_norms_over_several_axes():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm((3, 4)), nn.RMSNorm((3, 4)),
                          TwoAxisRMSNorm((3, 4)), nn.LayerNorm((3, 4), elementwise_affine=False))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    x = torch.randn(2, 3, 4)
    ref = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing is left on torch
        handle = rt.patch(model)
    assert [n for n, _ in handle.swapped] == ["1", "2", "3", "4"]
    assert type(model[1]) is rt.LayerNorm and type(model[2]) is rt.RMSNorm
    torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-6)
    handle.undo()
    assert type(model[1]) is nn.LayerNorm and type(model[3]) is TwoAxisRMSNorm


def test_patch_leaves_resnorms_own_modules_alone():
    model = nn.Sequential(rt.GemmaRMSNorm(4), rt.AddRMSNorm(4), rt.GatedResidual(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle = rt.patch(model)
    assert handle.swapped == [] and handle.skipped == []
