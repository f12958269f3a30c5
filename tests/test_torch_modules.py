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
def test_multi_axis_normalized_shape_is_refused(torch_cls, ours):
    with pytest.raises(ValueError, match="last axis only"):
        ours((4, 8))
    ours([8])   # a 1-element list is the last axis: fine


@pytest.mark.parametrize("torch_cls,ours", PAIRS)
def test_wrong_last_axis_raises(torch_cls, ours):
    for kwargs in CONFIGS[torch_cls]:
        with pytest.raises(ValueError, match=r"input must have shape \(\.\.\., 8\)"):
            ours(8, **kwargs)(torch.ones(2, 7))


def test_module_rejects_other_dtypes():
    with pytest.raises(TypeError, match="torch.float32 or torch.float64"):
        rt.RMSNorm(8, dtype=torch.bfloat16)(torch.ones(2, 8, dtype=torch.bfloat16))


# --------------------------------------------------------------------------- patch

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.rms = nn.RMSNorm(d)
        self.shared = self.ln                 # one module reachable under two names
        self.wide = nn.LayerNorm((2, d))      # multi-axis: stays on torch
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


def test_patch_leaves_subclasses_alone_and_takes_a_bare_norm():
    class MyNorm(nn.LayerNorm):
        pass
    model = nn.Sequential(MyNorm(4))
    assert rt.patch(model).swapped == []
    bare = nn.RMSNorm(4)
    rt.patch(bare)
    assert type(bare) is rt.RMSNorm


def test_patch_skips_parameters_resnorm_cannot_use():
    model = nn.Sequential(nn.LayerNorm(4, dtype=torch.bfloat16))
    with pytest.warns(UserWarning, match="bfloat16"):
        handle = rt.patch(model)
    assert handle.swapped == [] and type(model[0]) is nn.LayerNorm


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
