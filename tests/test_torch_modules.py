"""resnorm.torch.RMSNorm / LayerNorm as drop-ins for torch's modules, and patch(model)."""
import inspect

import pytest

torch = pytest.importorskip("torch")

import resnorm.torch as rt  # noqa: E402

nn = torch.nn
PAIRS = [(nn.RMSNorm, rt.RMSNorm), (nn.LayerNorm, rt.LayerNorm)]
CONFIGS = {
    nn.RMSNorm: [{}, {"eps": 1e-3}, {"elementwise_affine": False}],
    nn.LayerNorm: [{}, {"eps": 1e-3}, {"bias": False}, {"elementwise_affine": False}],
}


# --------------------------------------------------------------------------- drop-in modules

@pytest.mark.parametrize("torch_cls,ours", PAIRS)
def test_same_constructor_signature(torch_cls, ours):
    def params(cls):   # names, kinds and defaults (torch's type annotations aside)
        return [(p.name, p.kind, p.default)
                for p in inspect.signature(cls.__init__).parameters.values()]
    assert params(ours) == params(torch_cls)


@pytest.mark.parametrize("torch_cls,ours", PAIRS)
def test_state_dict_loads_both_ways(torch_cls, ours):
    for kwargs in CONFIGS[torch_cls]:
        theirs, mine = torch_cls(16, **kwargs), ours(16, **kwargs)
        assert list(theirs.state_dict()) == list(mine.state_dict())
        for p in theirs.parameters():
            torch.nn.init.normal_(p)
        mine.load_state_dict(theirs.state_dict())
        back = torch_cls(16, **kwargs)
        back.load_state_dict(mine.state_dict())
        for a, b in zip(theirs.state_dict().values(), back.state_dict().values()):
            assert torch.equal(a, b)
        assert repr(mine) == repr(theirs) and isinstance(mine, torch_cls)


@pytest.mark.parametrize("torch_cls,ours", PAIRS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_module_matches_torch(torch_cls, ours, dtype):
    for kwargs in CONFIGS[torch_cls]:
        theirs = torch_cls(24, dtype=dtype, **kwargs)
        for p in theirs.parameters():
            torch.nn.init.normal_(p)
        mine = ours(24, dtype=dtype, **kwargs)
        mine.load_state_dict(theirs.state_dict())
        x = torch.randn(3, 5, 24, dtype=dtype, requires_grad=True)
        dy = torch.randn(3, 5, 24, dtype=dtype)
        tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
        y, ref = mine(x), theirs(x)
        torch.testing.assert_close(y, ref, **tol)
        got = torch.autograd.grad(y, [x, *mine.parameters()], dy)
        want = torch.autograd.grad(ref, [x, *theirs.parameters()], dy)
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_default_eps_is_the_dtype_epsilon(dtype):
    """eps=None means torch.finfo(dtype).eps, as in torch; rows of tiny values show it."""
    x = torch.full((2, 4), 1e-4, dtype=dtype) * torch.tensor([[1.0], [1e-3]], dtype=dtype)
    mine, theirs = rt.RMSNorm(4, dtype=dtype), nn.RMSNorm(4, dtype=dtype)
    torch.testing.assert_close(mine(x), theirs(x), rtol=1e-5, atol=0)
    assert not torch.allclose(mine(x), rt.RMSNorm(4, eps=1e-6, dtype=dtype)(x))


@pytest.mark.parametrize("torch_cls,ours", PAIRS)
@pytest.mark.parametrize("shape", [(4, 8), (1, 2, 3), [8]], ids=str)
def test_multi_axis_normalized_shape_matches_torch(torch_cls, ours, shape):
    """normalized_shape over several trailing axes (torch's OpInfo samples use (1, 2, 3)):
    the outputs and every gradient are torch's; the state_dict is interchangeable."""
    theirs = torch_cls(shape, dtype=torch.float64)
    for p in theirs.parameters():
        torch.nn.init.normal_(p)
    mine = ours(shape, dtype=torch.float64)
    mine.load_state_dict(theirs.state_dict())
    assert repr(mine) == repr(theirs)
    x = torch.randn((5,) + tuple(shape), dtype=torch.float64, requires_grad=True)
    dy = torch.randn(x.shape, dtype=torch.float64)
    y, ref = mine(x), theirs(x)
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(torch.autograd.grad(y, [x, *mine.parameters()], dy),
                               torch.autograd.grad(ref, [x, *theirs.parameters()], dy))
    with torch.no_grad():
        torch.testing.assert_close(mine(x), ref)
    with pytest.raises(ValueError, match=r"input must have shape \(\.\.\., "):
        mine(torch.ones(2, 7))


@pytest.mark.parametrize("torch_cls,ours", PAIRS)
def test_wrong_last_axis_raises(torch_cls, ours):
    for kwargs in CONFIGS[torch_cls]:
        with pytest.raises(ValueError, match=r"input must have shape \(\.\.\., 8\)"):
            ours(8, **kwargs)(torch.ones(2, 7))


def test_module_rejects_other_dtypes():
    with pytest.raises(TypeError, match="torch.float32, torch.float64"):
        rt.RMSNorm(8, dtype=torch.complex64)(torch.ones(2, 8, dtype=torch.complex64))


@pytest.mark.parametrize("module_dtype,input_dtype", [(torch.float32, torch.float64),
                                                      (torch.float64, torch.float32)])
def test_rms_norm_module_follows_the_input_dtype_as_torchs(module_dtype, input_dtype):
    mine, theirs = rt.RMSNorm(6, dtype=module_dtype), nn.RMSNorm(6, dtype=module_dtype)
    _randomise(theirs)
    mine.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 6, dtype=input_dtype, requires_grad=True)
    y, ref = mine(x), theirs(x)
    assert y.dtype == ref.dtype == input_dtype
    torch.testing.assert_close(y, ref)
    # One of the two dtypes is float32 and both libraries compute with it, so a float64
    # weight's gradient carries float32 rounding (placed differently by each): compared at
    # float32's default tolerance, not at that of the float64 tensor holding it.
    torch.testing.assert_close(torch.autograd.grad(y.sum(), (x, mine.weight)),
                               torch.autograd.grad(ref.sum(), (x, theirs.weight)),
                               rtol=1.3e-6, atol=1e-5)


def test_layer_norm_module_requires_its_dtype_as_torchs():
    x = torch.randn(3, 6, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        nn.LayerNorm(6)(x)
    with pytest.raises(TypeError, match="weight must have the input's dtype torch.float64"):
        rt.LayerNorm(6)(x)


def test_module_sees_new_parameter_tensors_and_values():
    """The cached NumPy views follow in-place updates, new .data and model.double()."""
    norm, ref = rt.LayerNorm(6), nn.LayerNorm(6)
    x = torch.randn(2, 6)
    with torch.no_grad():
        for change in (lambda m: m.weight.mul_(3), lambda m: setattr(m.bias, "data",
                                                                     torch.randn(6).abs())):
            change(norm)
            ref.load_state_dict(norm.state_dict())
            torch.testing.assert_close(norm(x), ref(x))
        norm.double()
        ref.double()
        torch.testing.assert_close(norm(x.double()), ref(x.double()))


def _views(module):
    return next(v for k, v in vars(module).items() if "views" in k)


INFER_CASES = [(rt.LayerNorm, (24,), {}), (rt.LayerNorm, (24,), {"bias": False}),
               (rt.LayerNorm, (24,), {"elementwise_affine": False}),
               (rt.LayerNorm, (4, 6), {}), (rt.RMSNorm, (24,), {}),
               (rt.RMSNorm, (24,), {"eps": None}),
               (rt.RMSNorm, (24,), {"elementwise_affine": False}),
               (rt.RMSNorm, (4, 6), {})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cls,shape,kwargs", INFER_CASES)
def test_inference_call_runs_in_c_with_the_functions_bits(cls, shape, kwargs, dtype):
    """A module's no-grad call takes the compiled path (ParamViews.infer) and gives the bits
    of resnorm.torch's function form, in a fresh tensor; x is left as it was."""
    if dtype is torch.bfloat16:
        pytest.importorskip("ml_dtypes")
    torch.manual_seed(0)
    norm = cls(shape, dtype=dtype, **kwargs)
    for p in norm.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(3, 5, *shape).to(dtype)
    before = x.clone()
    with torch.no_grad():
        y = norm(x)
        fast = _views(norm).infer(norm._parameters, x, norm.eps, False)
        if cls is rt.LayerNorm:
            ref = rt.layer_norm(x, norm.weight, norm.bias, norm.eps, normalized_shape=shape)
        else:
            ref = rt.rms_norm(x, norm.weight, norm.eps, normalized_shape=shape)
    assert fast is not None and fast.data_ptr() != x.data_ptr()
    for out in (y, fast):
        assert out.dtype is dtype and out.shape == x.shape and out.is_contiguous()
        assert torch.equal(out.view(torch.int16 if dtype.itemsize == 2 else dtype),
                           ref.view(torch.int16 if dtype.itemsize == 2 else dtype))
    assert torch.equal(x, before)


def test_zero_centred_inference_call_runs_in_c():
    norm = rt.GemmaRMSNorm(16)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(2, 16)
    with torch.no_grad():
        y = norm(x)
        fast = _views(norm).infer(norm._parameters, x, norm.eps, True)
        want = rt.rms_norm(x, norm.weight + 1, norm.eps)
    assert fast is not None and torch.equal(fast, want) and torch.equal(y, want)


def test_inference_path_hands_other_calls_to_the_general_path():
    """infer() declines (None) what it must not take; the module still computes each."""
    norm, ref = rt.LayerNorm(8), nn.LayerNorm(8)
    with torch.no_grad():
        torch.nn.init.normal_(norm.weight)
        ref.load_state_dict(norm.state_dict())
        x = torch.randn(4, 8)
        norm(x)
    views = _views(norm)

    class Sub(torch.Tensor):
        pass

    declined = {"strided": torch.randn(8, 4).t(), "subclass": x.as_subclass(Sub),
                "float64": x.double(), "negated": torch.complex(x, x).conj().imag,
                "scalar": torch.tensor(1.0), "other axis": torch.randn(4, 7)}
    with torch.no_grad():
        for name, t in declined.items():
            assert views.infer(norm._parameters, t, 1e-5, False) is None, name
        torch.testing.assert_close(norm(declined["strided"]), ref(declined["strided"]))
        torch.testing.assert_close(norm(declined["negated"]), ref(declined["negated"]))
    # autograd recording, a forward-mode dual level and a transform: the general path
    xg = x.clone().requires_grad_()
    assert views.infer(norm._parameters, xg, 1e-5, False) is None
    with torch.autograd.forward_ad.dual_level():
        assert views.infer(norm._parameters, x, 1e-5, False) is None
    with torch.no_grad():
        assert views.infer(norm._parameters, xg, 1e-5, False) is not None
        # a parameter given new memory: the views no longer hold
        norm.bias.data = torch.randn(8)
        assert views.infer(norm._parameters, x, 1e-5, False) is None
        ref.bias.copy_(norm.bias)
        torch.testing.assert_close(norm(x), ref(x))


def test_module_pickles_without_its_cached_views(tmp_path):
    import pickle
    norm = rt.RMSNorm(6)
    with torch.no_grad():
        norm(torch.randn(2, 6))
    assert any("views" in k for k in vars(norm))
    copy = pickle.loads(pickle.dumps(norm))
    assert not any("views" in k for k in vars(copy)) and type(copy) is rt.RMSNorm
    x = torch.randn(2, 6)
    torch.testing.assert_close(copy(x), norm(x))


@pytest.mark.parametrize("torch_cls,ours", PAIRS)
def test_inference_tensor_beside_a_weight_requiring_grad_as_torchs(torch_cls, ours):
    # torch's RMSNorm saves no tensor of x's (x needs no gradient) and takes an inference
    # tensor; torch's LayerNorm saves x, which autograd refuses for one
    with torch.inference_mode():
        x = torch.randn(3, 8)
    theirs, mine = torch_cls(8), ours(8)
    if torch_cls is nn.LayerNorm:
        for module in (theirs, mine):
            with pytest.raises(RuntimeError, match="Inference tensors cannot be saved"):
                module(x)
        return
    y_ref, y = theirs(x), mine(x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(torch.autograd.grad(y.square().sum(), mine.weight),
                               torch.autograd.grad(y_ref.square().sum(), theirs.weight))


def _patched_layer_norm(d, dtype):
    norm = nn.LayerNorm(d, dtype=dtype)
    rt.patch(norm)
    return norm


@pytest.mark.parametrize("make,torch_cls", [
    (rt.RMSNorm, nn.RMSNorm), (rt.LayerNorm, nn.LayerNorm), (_patched_layer_norm, nn.LayerNorm)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_per_sample_gradients_of_the_parameters_as_torchs(make, torch_cls, dtype):
    # torch.func's recipe: the parameters are the transformed input (functional_call)
    g = torch.Generator().manual_seed(5)
    theirs, mine = torch_cls(6, dtype=dtype), make(6, dtype=dtype)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
    mine.load_state_dict(theirs.state_dict())
    params = {name: p.detach() for name, p in theirs.named_parameters()}
    xb = torch.randn(4, 3, 6, generator=g, dtype=dtype)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}

    def per_sample(module):
        def loss(params, x):
            return torch.func.functional_call(module, params, (x,)).square().sum()
        return (torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, xb),
                torch.func.grad(loss)(params, xb))
    for got, want in zip(per_sample(mine), per_sample(theirs)):
        assert got.keys() == want.keys() == params.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], **tol)
    assert type(mine).forward is not torch_cls.forward   # resnorm computed them


# --------------------------------------------------------------------------- patch

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.rms = nn.RMSNorm(d)
        self.shared = self.ln                 # one module reachable under two names
        self.wide = nn.LayerNorm(d, dtype=torch.complex64)   # complex: stays on torch
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return self.rms(self.fc(self.shared(x)))


def test_patch_swaps_in_place_and_undo_restores():
    model = Block(8)
    ln, rms, weight = model.ln, model.rms, model.ln.weight
    with pytest.warns(UserWarning, match=r"left 1 norm module\(s\) on torch: wide"):
        handle = rt.patch(model)
    assert type(model.ln) is rt.LayerNorm and type(model.rms) is rt.RMSNorm
    assert model.ln is ln and model.shared is ln and model.ln.weight is weight
    assert [name for name, _ in handle.swapped] == ["ln", "rms"]
    assert [name for name, _ in handle.skipped] == ["wide"]
    assert type(model.wide) is nn.LayerNorm and type(model.fc) is nn.Linear
    handle.undo()
    assert type(model.ln) is nn.LayerNorm and type(model.rms) is nn.RMSNorm
    handle.undo()                             # a second undo changes nothing
    assert type(model.ln) is nn.LayerNorm


def test_patched_model_computes_the_same_and_uses_resnorm(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.RMSNorm(8))
    x = torch.randn(4, 8)
    ref = model(x)
    calls = []
    apply = rt.LayerNormFunction.apply
    monkeypatch.setattr(rt.LayerNormFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    with rt.patch(model) as handle:
        torch.testing.assert_close(model(x), ref)
        assert len(handle.swapped) == 2
    assert calls == [1]
    assert type(model[1]) is nn.LayerNorm


def test_patch_takes_a_bare_norm():
    bare = nn.RMSNorm(4)
    rt.patch(bare)
    assert type(bare) is rt.RMSNorm


# Norm classes as models define them (written here the way Hugging Face's are).

class LlamaStyleRMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, h):
        variance = h.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon)).to(h.dtype)


def gemma_rms_norm(x, weight, eps=1e-6):
    """Gemma's RMSNorm as Hugging Face writes it: in float32 whatever x's dtype, the gain
    1 + weight formed in float32, the output rounded once to x's dtype."""
    out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(x)


class GemmaStyleRMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return gemma_rms_norm(x, self.weight, self.eps)


class EpsOutsideNorm(LlamaStyleRMSNorm):
    def forward(self, h):       # eps added to the root, not inside it: another formula
        return self.weight * h / (h.pow(2).mean(-1, keepdim=True).sqrt() + self.variance_epsilon)


class CastingLayerNorm(nn.LayerNorm):
    def forward(self, x):       # CLIP / Whisper style: computes in float32
        return super().forward(x.float()).type(x.dtype)


class ScaledLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return 2 * super().forward(x)


class Normalizer(nn.Module):    # norm-like by name, but no eps to pass on
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x / x.norm(dim=-1, keepdim=True) * self.weight


def _randomise(model):
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def test_patch_recognises_norms_by_what_they_compute():
    model = nn.Sequential(LlamaStyleRMSNorm(16), GemmaStyleRMSNorm(16), CastingLayerNorm(16),
                          nn.Linear(16, 16), EpsOutsideNorm(16), ScaledLayerNorm(16),
                          Normalizer(16), nn.BatchNorm1d(16))
    _randomise(model)
    x = torch.randn(5, 16)
    model.eval()
    with torch.no_grad():
        ref = model(x)
    with pytest.warns(UserWarning, match="left 4 norm module"):
        handle = rt.patch(model)
    assert [name for name, _ in handle.swapped] == ["0", "1", "2"]
    reasons = dict(handle.skipped)
    assert "differs from resnorm's 'rms' formula" in reasons["4"]
    assert "differs from resnorm's 'layer' formula" in reasons["5"]
    assert "no eps attribute" in reasons["6"]
    assert "keeps buffers (running_mean, running_var, num_batches_tracked)" in reasons["7"]
    for i, cls in enumerate((LlamaStyleRMSNorm, GemmaStyleRMSNorm, CastingLayerNorm)):
        assert isinstance(model[i], cls) and type(model[i]) is not cls
        assert type(model[i]).__name__ == cls.__name__
        own = repr(cls(16))[len(cls.__name__) + 1:-1]          # its extra_repr
        assert repr(model[i]) == f"{cls.__name__}({own}{', ' if own else ''}computed by resnorm)"
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-6)
    handle.undo()
    assert [type(m) for m in model[:3]] == [LlamaStyleRMSNorm, GemmaStyleRMSNorm,
                                            CastingLayerNorm]
    with torch.no_grad():
        assert torch.equal(model(x), ref)


class ChannelsFirstRMSNorm(nn.Module):   # over axis 1 of (N, C, L): not the last axis
    def __init__(self, c, weight=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c)) if weight else None
        self.eps = 1e-6

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps)
        return y if self.weight is None else y * self.weight.reshape(-1, *[1] * (x.ndim - 2))


class AnyAxisRMSNorm(nn.Module):         # no parameters, no normalized_shape: the last axis
    eps = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def test_patch_tells_the_normalised_axis_apart():
    # the probe rows have two leading axes, so a norm over axis 1 is not taken for one
    # over the last axis, with or without a weight to tell the size
    model = nn.Sequential(ChannelsFirstRMSNorm(16), ChannelsFirstRMSNorm(16, weight=False),
                          AnyAxisRMSNorm())
    with pytest.warns(UserWarning, match="left 2 norm module"):
        handle = rt.patch(model)
    assert [name for name, _ in handle.swapped] == ["2"]
    for name, reason in handle.skipped:
        assert "differs from resnorm's" in reason or "failed" in reason, (name, reason)
    x = torch.randn(2, 16, 5)
    with torch.no_grad():
        torch.testing.assert_close(model(x), AnyAxisRMSNorm()(
            ChannelsFirstRMSNorm(16, weight=False)(ChannelsFirstRMSNorm(16)(x))))


def test_patched_custom_norm_trains_like_the_original():
    def run(patch):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), GemmaStyleRMSNorm(8), nn.Linear(8, 8),
                              LlamaStyleRMSNorm(8))
        if patch:
            assert len(rt.patch(model).swapped) == 2
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
        for _ in range(4):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        return [p.detach() for p in model.parameters()]
    for a, b in zip(run(True), run(False)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_patch_changes_no_state_of_the_model_or_torch():
    model = nn.Sequential(LlamaStyleRMSNorm(8), nn.LayerNorm(8))
    _randomise(model)
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    rt.patch(model)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(m.training for m in model.modules())
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_patch_twice_changes_nothing_and_warns_when_none_was_swapped():
    model = nn.Sequential(nn.LayerNorm(8), LlamaStyleRMSNorm(8))
    first = rt.patch(model)
    second = rt.patch(model)
    assert len(first.swapped) == 2 and second.swapped == second.skipped == []
    with pytest.warns(UserWarning, match="swapped none of the model's norm layers"):
        rt.patch(nn.Sequential(EpsOutsideNorm(8)))


def test_patched_module_reads_eps_at_call_time():
    norm = LlamaStyleRMSNorm(4)
    rt.patch(norm)
    x = torch.full((1, 4), 1e-3)
    before = norm(x)
    norm.variance_epsilon = 1.0
    torch.testing.assert_close(norm(x), torch.full((1, 4), 1e-3) / (1e-6 + 1.0) ** 0.5)
    assert not torch.allclose(before, norm(x))


def test_patched_custom_norm_refuses_torchscript_clearly():
    norm = LlamaStyleRMSNorm(4)
    rt.patch(norm)
    with pytest.raises((RuntimeError, torch.jit.Error),
                       match="patched module cannot run under TorchScript"):
        torch.jit.script(norm)(torch.ones(2, 4))


def test_patch_skips_parameters_resnorm_cannot_use():
    model = nn.Sequential(nn.LayerNorm(4, dtype=torch.complex64))
    with pytest.warns(UserWarning, match="complex64"):
        handle = rt.patch(model)
    assert handle.swapped == [] and type(model[0]) is nn.LayerNorm


class GatedRMSNorm(LlamaStyleRMSNorm):
    """Mamba-2's gated RMSNorm: without a gate, an RMSNorm; with one, x * silu(gate) first."""

    def forward(self, h, gate=None):
        if gate is not None:
            h = h * nn.functional.silu(gate)
        return super().forward(h)


class ResidualGatedRMSNorm(LlamaStyleRMSNorm):
    """A norm whose forward takes a gate and a residual: not resnorm's."""

    def forward(self, h, gate=None, residual=None):
        if residual is not None:
            h = h + residual
        return super().forward(h if gate is None else h * torch.sigmoid(gate))


class GatedBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gate = nn.Linear(d, d)
        self.norm = GatedRMSNorm(d)
        self.other = ResidualGatedRMSNorm(d)
        self.final_norm = LlamaStyleRMSNorm(d)

    def forward(self, x):
        return self.final_norm(self.other(self.norm(x, self.gate(x)), self.gate(x), x))


def test_patch_swaps_a_gated_norm_and_leaves_a_norm_whose_forward_takes_more():
    model = GatedBlock(8)
    _randomise(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        ref = model(x)
    with pytest.warns(UserWarning, match=r"other: its forward takes gate, residual besides "
                                         r"the input"):
        handle = rt.patch(model)
    assert [name for name, _ in handle.swapped] == ["norm", "final_norm"]
    assert isinstance(model.norm, GatedRMSNorm) and type(model.norm) is not GatedRMSNorm
    assert [name for name, _ in handle.skipped] == ["other"]
    assert type(model.other) is ResidualGatedRMSNorm
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref)
    handle.undo()
    assert type(model.norm) is GatedRMSNorm


def test_patch_fires_no_hook_of_the_model():
    model = nn.Sequential(nn.LayerNorm(8), LlamaStyleRMSNorm(8))
    calls = []
    for m in model:
        m.register_forward_pre_hook(lambda *a: calls.append("pre"))
        m.register_forward_hook(lambda *a: calls.append("post"))
    with nn.modules.module.register_module_forward_hook(lambda *a: calls.append("global")):
        assert len(rt.patch(model).swapped) == 2
    assert calls == []
    model(torch.ones(2, 8))
    assert calls == ["pre", "post"] * 2      # the patched modules keep their hooks


def test_patched_norm_takes_an_inference_tensor_as_its_own_forward():
    with torch.inference_mode():
        x = torch.randn(3, 8)
    norm = LlamaStyleRMSNorm(8)
    _randomise(norm)
    y_ref = norm(x)
    ref = torch.autograd.grad(y_ref.square().sum(), norm.weight)
    rt.patch(norm)
    y = norm(x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(torch.autograd.grad(y.square().sum(), norm.weight), ref)


def test_patch_rejects_non_modules():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        rt.patch([nn.LayerNorm(4)])


# --------------------------------------------------------------------------- training

def _transformer(norm):
    """A 2-layer Pre-Norm Transformer encoder with a final norm and a linear head."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True,
                                       norm_first=True)
    encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(32), enable_nested_tensor=False)
    if norm == "rms":
        for m in list(encoder.modules()):
            for name in ("norm1", "norm2", "norm"):
                if isinstance(getattr(m, name, None), nn.LayerNorm):
                    setattr(m, name, nn.RMSNorm(32))
    return nn.Sequential(encoder, nn.Linear(32, 8))


def _train(model, steps=15):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 10, 32, generator=g)
    target = torch.randn(4, 10, 8, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_transformer_trains_the_same_with_resnorm_norms(norm):
    reference = _train(_transformer(norm))
    model = _transformer(norm)
    handle = rt.patch(model)
    assert len(handle.swapped) == 5           # 2 layers x 2 norms + the final norm
    losses = _train(model)
    assert losses[-1] < 0.8 * losses[0]       # it did learn
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference), rtol=1e-5, atol=0)


def test_patch_shows_no_warning_of_the_probe():
    """The probe's own inputs may make a module warn (torch.nn.RMSNorm on a dtype its weight
    does not have): those warnings are not the user's."""
    import warnings

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8),
                                torch.nn.LayerNorm(8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt.patch(model)
    assert [str(w.message) for w in caught] == []


def test_a_patched_module_says_so_when_printed():
    """A patched model's own norm class keeps its name: its repr says resnorm computes it
    (torch's norm classes become resnorm.torch's, whose repr is torch's)."""
    model = torch.nn.Sequential(LlamaStyleRMSNorm(8), torch.nn.Linear(8, 8))
    before = repr(model)
    patch = rt.patch(model)
    assert "(0): LlamaStyleRMSNorm(computed by resnorm)" in repr(model)
    patch.undo()
    assert repr(model) == before
