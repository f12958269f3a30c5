"""resnorm.torch's Post-Norm functions, scaled and gated residual functions, and the modules
of the residual family (AddRMSNorm, AddLayerNorm, their Post-Norm forms, ScaledResidual,
GatedResidual): gradcheck in float64 and agreement with torch's own composition."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import resnorm  # noqa: E402
import resnorm.torch as rt  # noqa: E402

F = torch.nn.functional
nn = torch.nn
MODULES = [(rt.AddRMSNorm, False, True), (rt.AddLayerNorm, True, True),
           (rt.AddRMSNormPost, False, False), (rt.AddLayerNormPost, True, False)]


def _randn(shape, seed, dtype=torch.float64, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (shift + scale * torch.randn(shape, generator=g, dtype=dtype)).requires_grad_()


def _keep(shape, p, seed, dtype):
    """resnorm's dropout keep-mask for an array of this shape, as a tensor."""
    _, cache = resnorm.dropout_forward(np.ones(shape), p, seed=seed, return_mask=True)
    return torch.from_numpy(cache.mask).to(dtype)


def _composite(layer, prenorm, x, r, w, b, alpha, p, seed, ns, zero_centered, eps):
    """The fused add + norm from torch's own operations (dropout with resnorm's mask)."""
    d = x * _keep(x.shape, p, seed, x.dtype) / (1 - p) if p > 0 else x
    h = r + alpha * d
    gain = None if w is None else (1 + w if zero_centered else w)
    y = F.layer_norm(h, ns, gain, b, eps) if layer else F.rms_norm(h, ns, gain, eps)
    return (y, h) if prenorm else y


def _fused(layer, prenorm, *args, **kw):
    name = ("add_layer_norm" if layer else "add_rms_norm") + ("" if prenorm else "_post")
    return getattr(rt, name)(*args, **kw)


# --------------------------------------------------------------------------- Post-Norm functions

@pytest.mark.parametrize("layer", [False, True])
@pytest.mark.parametrize("alpha_kind", ["fixed", "scalar", "channel"])
def test_post_norm_gradcheck_and_gradgradcheck_float64(layer, alpha_kind):
    x, r = _randn((3, 2, 5), 0), _randn((3, 2, 5), 1, scale=2, shift=0.5)
    w, b = _randn(5, 2, scale=0.3, shift=1), _randn(5, 3, scale=0.2)
    alpha = {"fixed": 0.7, "scalar": _randn((), 4, scale=0.1, shift=0.6),
             "channel": _randn(5, 5, scale=0.2, shift=0.8)}[alpha_kind]
    tensors = (x, r, w, b) + ((alpha,) if alpha_kind != "fixed" else ())

    def f(x, r, w, b, *a):
        args = (x, r, w, b) if layer else (x, r, w)
        return _fused(layer, False, *args, 1e-4, alpha=a[0] if a else alpha, p=0.25, seed=9)
    assert torch.autograd.gradcheck(f, tensors)
    assert torch.autograd.gradgradcheck(f, tensors)


@pytest.mark.parametrize("layer", [False, True])
@pytest.mark.parametrize("prenorm", [True, False])
def test_fused_over_several_axes_zero_centered_matches_torch(layer, prenorm):
    """normalized_shape (4, 3), a zero-centred weight, a per-element alpha of the row's
    shape and dropout: the outputs and every gradient are torch's composition's."""
    shape, ns = (2, 3, 4, 3), (4, 3)
    x, r = _randn(shape, 0), _randn(shape, 1)
    w, b, alpha = _randn(ns, 2, scale=0.3), _randn(ns, 3, scale=0.2), _randn(ns, 4, shift=0.7)
    args = (x, r, w, b) if layer else (x, r, w)
    options = dict(normalized_shape=ns, zero_centered_weight=True, alpha=alpha, p=0.2, seed=5)
    out = _fused(layer, prenorm, *args, 1e-5, **options)
    ref = _composite(layer, prenorm, x, r, w, b if layer else None, alpha, 0.2, 5, ns, True,
                     1e-5)
    outs, refs = (out, ref) if prenorm else ((out,), (ref,))
    for o, e in zip(outs, refs):
        torch.testing.assert_close(o, e)
    params = list(args) + [alpha]
    cot = [torch.randn(shape, dtype=torch.float64) for _ in outs]
    for g, e in zip(torch.autograd.grad(outs, params, cot), torch.autograd.grad(refs, params, cot)):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e)


# --------------------------------------------------------------------------- scaled, gated

@pytest.mark.parametrize("alpha_kind", ["fixed", "scalar", "channel"])
def test_scaled_residual_gradcheck_and_matches_torch(alpha_kind):
    x, f = _randn((4, 3, 6), 0), _randn((4, 3, 6), 1)
    alpha = {"fixed": 0.3, "scalar": _randn((), 2), "channel": _randn(6, 3)}[alpha_kind]
    tensors = (x, f) + ((alpha,) if alpha_kind != "fixed" else ())

    def fn(x, f, *a):
        return rt.scaled_residual(x, f, a[0] if a else alpha)
    assert torch.autograd.gradcheck(fn, tensors)
    assert torch.autograd.gradgradcheck(fn, tensors)
    h = fn(*tensors)
    ref = x + alpha * f
    torch.testing.assert_close(h, ref)
    dh = torch.randn(h.shape, dtype=torch.float64)
    for g, e in zip(torch.autograd.grad(h, tensors, dh), torch.autograd.grad(ref, tensors, dh)):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("per_channel", [False, True])
def test_gated_residual_gradcheck_and_matches_torch(per_channel):
    x, f = _randn((4, 3, 6), 0), _randn((4, 3, 6), 1)
    g = _randn(6 if per_channel else (4, 3, 6), 2, scale=2)
    assert torch.autograd.gradcheck(rt.gated_residual, (x, f, g))
    assert torch.autograd.gradgradcheck(rt.gated_residual, (x, f, g))
    h, ref = rt.gated_residual(x, f, g), x + torch.sigmoid(g) * f
    torch.testing.assert_close(h, ref)
    dh = torch.randn(h.shape, dtype=torch.float64)
    for a, e in zip(torch.autograd.grad(h, (x, f, g), dh), torch.autograd.grad(ref, (x, f, g), dh)):
        torch.testing.assert_close(a, e)


def test_scaled_and_gated_under_torch_func_and_in_float32():
    """Inside torch.func transforms they are torch's composition; in float32 the kernels
    agree with it to float32 rounding."""
    x, f, g = torch.randn(3, 5), torch.randn(3, 5), torch.randn(5)
    grads = torch.func.grad(lambda a: rt.gated_residual(x, f, a).sum())(g)
    torch.testing.assert_close(grads, (f * torch.sigmoid(g) * (1 - torch.sigmoid(g))).sum(0))
    per_sample = torch.func.vmap(lambda xi, fi: rt.scaled_residual(xi, fi, 0.5))(x, f)
    torch.testing.assert_close(per_sample, x + 0.5 * f)
    torch.testing.assert_close(rt.gated_residual(x, f, g), x + torch.sigmoid(g) * f,
                               rtol=1e-6, atol=1e-6)


def test_bad_arguments_are_named():
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match=r"\bF\b"):
        rt.scaled_residual(x, x.double(), 1.0)
    with pytest.raises(TypeError, match=r"\bg\b"):
        rt.gated_residual(x, x, [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"\bg\b"):
        rt.gated_residual(x, x, torch.zeros(2))
    with pytest.raises(ValueError, match=r"\balpha\b"):
        rt.scaled_residual(x, x, torch.ones(2))


# --------------------------------------------------------------------------- modules

@pytest.mark.parametrize("cls, layer, prenorm", MODULES)
def test_fused_modules_match_torch_and_gradcheck(cls, layer, prenorm):
    """The module against torch's own norm module after the add, with the same state_dict
    (it loads torch's norm's), and gradcheck of its forward in float64."""
    torch_norm = (nn.LayerNorm if layer else nn.RMSNorm)((2, 5), eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        for p in torch_norm.parameters():
            p.add_(0.3 * torch.randn(p.shape, dtype=torch.float64))
    module = cls((2, 5), eps=1e-5, alpha=0.5, dtype=torch.float64)
    module.load_state_dict(torch_norm.state_dict())
    assert list(module.state_dict()) == list(torch_norm.state_dict())
    x, r = _randn((3, 2, 5), 0), _randn((3, 2, 5), 1)
    out = module(x, r)
    h = r + 0.5 * x
    y = torch_norm(h)
    if prenorm:
        torch.testing.assert_close(out[0], y)
        torch.testing.assert_close(out[1], h)
    else:
        torch.testing.assert_close(out, y)
    params = tuple(module.parameters())

    def f(x, r, *ps):
        return torch.func.functional_call(module, dict(zip(("weight", "bias"), ps)), (x, r))
    assert torch.autograd.gradcheck(f, (x, r) + params)


@pytest.mark.parametrize("cls, layer, prenorm", MODULES)
def test_fused_modules_dropout_follows_torch_seed_and_mode(cls, layer, prenorm):
    x, r = torch.randn(4, 8), torch.randn(4, 8)
    first = (lambda o: o[0]) if prenorm else (lambda o: o)
    torch.manual_seed(3)
    module = cls(8, p=0.5)
    a = first(module(x, r))
    torch.manual_seed(3)
    again = cls(8, p=0.5)
    assert torch.equal(first(again(x, r)), a)               # torch.manual_seed: a repeat
    b = first(module(x, r))
    assert not torch.equal(a, b)                             # each call: another mask
    module.eval()
    want = (nn.LayerNorm if layer else nn.RMSNorm)(8)(r + x)
    torch.testing.assert_close(first(module(x, r)), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls, layer, prenorm", MODULES)
def test_checkpointing_recomputes_the_same_mask(cls, layer, prenorm):
    """torch.utils.checkpoint recomputes the forward in backward, after restoring torch's
    generator: the recomputed mask must be the first one, else the gradients are of
    another function."""
    first = (lambda o: o[0]) if prenorm else (lambda o: o)
    module = cls(8, p=0.5)
    x, r, dy = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8), torch.randn(4, 8)

    def grads(y):
        x.grad = module.weight.grad = None
        y.backward(dy)    # (the reentrant form refuses autograd.grad)
        return x.grad, module.weight.grad

    torch.manual_seed(3)
    want = grads(first(module(x, r)))
    for reentrant in (False, True):
        torch.manual_seed(3)
        y = torch.utils.checkpoint.checkpoint(lambda a, b: first(module(a, b)), x, r,
                                              use_reentrant=reentrant)
        for g, w in zip(grads(y), want):
            assert torch.equal(g, w), reentrant
    assert list(module.state_dict()) == list((nn.LayerNorm if layer else nn.RMSNorm)(8)
                                             .state_dict())


class _Block(nn.Module):
    """Two fused modules with dropout, as a Pre-Norm block and a Post-Norm one."""

    def __init__(self, d, p):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.pre = rt.AddRMSNorm(d, p=p)
        self.post = rt.AddLayerNormPost(d, p=p)

    def forward(self, x, h):
        y, h = self.pre(self.fc(x), h)
        return self.post(self.fc(y), h)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fused_modules_compile_fullgraph_with_the_eager_masks(backend):
    # inductor draws random numbers its own way unless told to call torch's (as eager does)
    from torch._inductor import config

    with config.patch(fallback_random=True):
        _compile_block_like_eager(backend)


def _compile_block_like_eager(backend):
    torch.manual_seed(0)
    eager = _Block(16, 0.3)
    block = copy.deepcopy(eager)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    x, h, dy = torch.randn(4, 16, requires_grad=True), torch.randn(4, 16), torch.randn(4, 16)
    outputs = []
    for step, training in enumerate((True, True, False)):
        eager.train(training), block.train(training)
        torch.manual_seed(step)
        want = eager(x, h)
        torch.manual_seed(step)
        got = compiled(x, h)
        # the same masks: another mask would move outputs by O(1); the norms of these
        # small rows are compiled as float64 expressions, within float32 rounding of eager
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for g, r in zip(torch.autograd.grad(got, [x, *block.parameters()], dy),
                        torch.autograd.grad(want, [x, *eager.parameters()], dy)):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
        outputs.append(want)
    assert not torch.equal(outputs[0], outputs[1])           # each step: other masks
    torch._dynamo.reset()


class _Everything(nn.Module):
    """Every module and function of resnorm.torch, dropout on; seed: the functions' (an
    int, or a 0-d int64 tensor)."""

    def __init__(self, d):
        super().__init__()
        self.norms = nn.ModuleList([rt.RMSNorm(d), rt.LayerNorm(d), rt.GemmaRMSNorm(d),
                                    nn.LayerNorm(d)])
        rt.patch(self.norms[3])
        self.fused = nn.ModuleList([cls(d, p=0.2) for cls, _, _ in MODULES])
        self.scaled = rt.ScaledResidual(d, alpha=0.5, learnable=True)
        self.gated = rt.GatedResidual(d)

    def forward(self, x, seed):
        h = x
        for norm in self.norms:
            x = norm(x)
        for module, (_, _, prenorm) in zip(self.fused, MODULES):
            if prenorm:
                x, h = module(x, h)
            else:
                x = module(x, h)
        x = self.gated(self.scaled(x, h), h)
        w, b, t = self.norms[1].weight, self.norms[1].bias, self.training
        x = rt.rms_norm(x, w) + rt.layer_norm(x, w, b)
        x, h = rt.add_rms_norm(x, h, w, p=0.2, seed=seed, training=t)
        x, h = rt.add_layer_norm(x, h, w, b, p=0.2, seed=seed + 1, training=t)
        x = rt.add_rms_norm_post(x, h, w, p=0.2, seed=seed + 2, training=t) + \
            rt.add_layer_norm_post(x, h, w, b, p=0.2, seed=seed + 3, training=t)
        x = rt.dropout(x, 0.2, seed=seed + 4, training=t)
        return rt.gated_residual(rt.scaled_residual(x, h, 0.5), h, self.gated.gate)


@pytest.mark.parametrize("seed", [7, torch.tensor(7)], ids=["int", "tensor"])
def test_every_module_and_function_records_one_graph(seed):
    model, x = _Everything(8), torch.randn(3, 8, requires_grad=True)
    for training in (True, False):
        model.train(training)
        explanation = torch._dynamo.explain(model)(x, seed)
        assert explanation.graph_break_count == 0 and explanation.graph_count == 1, \
            explanation.break_reasons
    torch._dynamo.reset()


def test_fused_module_zero_centered_weight_starts_at_the_identity():
    module = rt.AddRMSNorm((2, 4), eps=1e-6, zero_centered_weight=True)
    assert torch.equal(module.weight, torch.zeros(2, 4))
    x, r = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    y, h = module(x, r)
    torch.testing.assert_close(y, F.rms_norm(r + x, (2, 4), None, 1e-6))
    assert "zero_centered_weight=True" in repr(module)


@pytest.mark.parametrize("learnable, dim", [(False, None), (True, None), (True, 6)])
def test_scaled_residual_module(learnable, dim):
    module = rt.ScaledResidual(dim, alpha=0.25, learnable=learnable, dtype=torch.float64)
    assert (len(list(module.parameters())) == 1) == learnable
    x, f = _randn((2, 3, 6), 0), _randn((2, 3, 6), 1)
    torch.testing.assert_close(module(x, f), x + 0.25 * f)
    ps = tuple(module.parameters())

    def fn(x, f, *a):
        return torch.func.functional_call(module, dict(zip(("alpha",), a)), (x, f))
    assert torch.autograd.gradcheck(fn, (x, f) + ps)


def test_gated_residual_module():
    module = rt.GatedResidual(6, gate=1.5, dtype=torch.float64)
    x, f = _randn((2, 3, 6), 0), _randn((2, 3, 6), 1)
    torch.testing.assert_close(module(x, f), x + torch.sigmoid(torch.tensor(1.5)) * f)

    def fn(x, f, gate):
        return torch.func.functional_call(module, {"gate": gate}, (x, f))
    assert torch.autograd.gradcheck(fn, (x, f, module.gate))
