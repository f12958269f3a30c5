"""resnorm.torch's gated RMSNorm: gated_rms_norm, GatedRMSNormFunction, the custom operator
and GatedRMSNorm, checked against torch's own composition (gradcheck, gradgradcheck,
forward mode, vmap, torch.compile), against Hugging Face's gated norm classes built
directly, and inside tiny hybrid Mamba models (built in code, nothing downloaded) that
patch() now swaps: the gated norms on resnorm, the logits as before, a training step's
gradients as before, undo exact."""
import copy
import importlib
import os
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing may come from the network
torch = pytest.importorskip("torch")

import resnorm  # noqa: E402
import resnorm.torch as rt  # noqa: E402
from resnorm.torch import composite  # noqa: E402

F = torch.nn.functional
FORMS = [pytest.param(False, id="gate_first"), pytest.param(True, id="norm_first")]


def _make(shape, dtype, seed=0, requires_grad=True):
    """x, gate, weight: rows with an offset, gate logits about N(0, 4), a weight about 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5
    z = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    w = 1 + 0.3 * torch.randn(shape[-1], generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_(requires_grad) for t in (x, z, w)]


def _torch_gated(x, gate, weight, eps, group_size, norm_before_gate):
    """The gated RMSNorm in torch operations, in float64, as Hugging Face writes it."""
    x64 = x.double()
    silu = None if gate is None else F.silu(gate.double())
    v = x64 * silu if silu is not None and not norm_before_gate else x64
    groups = v.reshape(*v.shape[:-1], -1, group_size or v.shape[-1])
    y = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + eps)).reshape(v.shape)
    if weight is not None:
        y = y * weight.double()
    return y * silu if silu is not None and norm_before_gate else y


def _hf(module, name):
    """A class of transformers' model module (the test skips without it)."""
    pytest.importorskip("transformers")
    try:
        return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"),
                       name)
    except (ImportError, AttributeError):
        pytest.skip(f"this transformers has no {module}.{name}")


# --------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("norm_before_gate", FORMS)
@pytest.mark.parametrize("group_size", [None, 4])
@pytest.mark.parametrize("with_gate,with_weight", [(True, True), (True, False), (False, True)])
def test_gradcheck_and_gradgradcheck_float64(norm_before_gate, group_size, with_gate,
                                             with_weight):
    x, z, w = _make((3, 2, 8), torch.float64)
    args = [x] + ([z] if with_gate else []) + ([w] if with_weight else [])

    def f(*a):
        it = iter(a)
        x = next(it)
        z = next(it) if with_gate else None
        w = next(it) if with_weight else None
        return rt.gated_rms_norm(x, z, w, 1e-5, group_size=group_size,
                                 norm_before_gate=norm_before_gate)
    torch.testing.assert_close(f(*args), _torch_gated(*([x, z if with_gate else None,
                                                         w if with_weight else None]),
                                                      1e-5, group_size, norm_before_gate))
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


@pytest.mark.parametrize("norm_before_gate", FORMS)
def test_forward_mode_and_batched_gradients_float64(norm_before_gate):
    x, z, w = _make((2, 3, 6), torch.float64)
    f = lambda x, z, w: rt.gated_rms_norm(x, z, w, 1e-5, group_size=3,  # noqa: E731
                                          norm_before_gate=norm_before_gate)
    assert torch.autograd.gradcheck(f, (x, z, w), check_forward_ad=True,
                                    check_batched_grad=True, check_batched_forward_grad=True)


def test_gradients_match_torchs_composition_float32():
    # the kernels' float32 gradients against torch's own graph of the same formula
    for nbg in (False, True):
        x, z, w = _make((4, 5, 32), torch.float32, seed=1)
        dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
        y = rt.gated_rms_norm(x, z, w, group_size=8, norm_before_gate=nbg)
        grads = torch.autograd.grad(y, (x, z, w), dy)
        ref = _torch_gated(x, z, w, 1e-6, 8, nbg)
        ref_grads = torch.autograd.grad(ref, (x, z, w), dy.double())
        torch.testing.assert_close(y, ref.float(), rtol=1e-5, atol=1e-6)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r.float(), rtol=1e-4, atol=1e-5)


def test_absent_inputs_get_no_gradient_and_frozen_ones_none():
    x, z, w = _make((3, 8), torch.float32)
    y = rt.gated_rms_norm(x, None, w)
    dx, dw = torch.autograd.grad(y.sum(), (x, w))
    assert dx.shape == x.shape and dw.shape == w.shape
    z.requires_grad_(False)
    y = rt.gated_rms_norm(x, z, w)
    y.sum().backward()
    assert z.grad is None and x.grad is not None and w.grad is not None


def test_vmap_and_per_sample_gradients():
    x, z, w = _make((5, 3, 8), torch.float64, requires_grad=False)
    ws = torch.stack([w * (1 + 0.1 * i) for i in range(5)])   # one weight per sample
    for nbg in (False, True):
        def f(x, z, w):
            return rt.gated_rms_norm(x, z, w, 1e-5, group_size=4, norm_before_gate=nbg)

        def ref(x, z, w):
            return composite.gated_norm(x, z, w, 1e-5, 4, nbg)
        torch.testing.assert_close(torch.func.vmap(f)(x, z, ws), torch.func.vmap(ref)(x, z, ws))
        torch.testing.assert_close(torch.func.vmap(f, in_dims=(None, 0, None))(x[0], z, w),
                                   torch.func.vmap(ref, in_dims=(None, 0, None))(x[0], z, w))
        per_sample = torch.func.vmap(torch.func.grad(lambda *a: f(*a).square().sum(),
                                                     argnums=(0, 1, 2)))(x, z, ws)
        expected = torch.func.vmap(torch.func.grad(lambda *a: ref(*a).square().sum(),
                                                   argnums=(0, 1, 2)))(x, z, ws)
        for g, r in zip(per_sample, expected):
            torch.testing.assert_close(g, r)


# --------------------------------------------------------------------------- paths

def test_no_gradient_is_one_inference_call_without_autograd(monkeypatch):
    calls = []
    for name in ("gated_rms_norm", "gated_rms_norm_forward"):
        real = getattr(resnorm, name)
        monkeypatch.setattr(resnorm, name, lambda *a, _r=real, _n=name, **k:
                            calls.append(_n) or _r(*a, **k))
    x, z, w = _make((3, 16), torch.float32)
    with torch.no_grad():
        y = rt.gated_rms_norm(x, z, w, group_size=8)
    assert y.grad_fn is None and calls == ["gated_rms_norm"]
    y = rt.gated_rms_norm(x, z, w, group_size=8)
    assert type(y.grad_fn).__name__ == "GatedRMSNormFunctionBackward"
    assert calls == ["gated_rms_norm", "gated_rms_norm_forward"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_rows_and_float32_weight_beside_them(dtype):
    pytest.importorskip("ml_dtypes")
    x, z, w = _make((6, 32), torch.float32, seed=3)
    xh, zh = (t.detach().to(dtype).requires_grad_() for t in (x, z))
    eps = torch.finfo(dtype).eps
    for nbg in (False, True):
        for weight in (w.detach().to(dtype).requires_grad_(), w):   # 16-bit, then float32
            y = rt.gated_rms_norm(xh, zh, weight, group_size=16, norm_before_gate=nbg)
            ref = _torch_gated(xh, zh, weight, 1e-6, 16, nbg)
            assert y.dtype == dtype
            # computed in float32 and rounded once
            assert ((y.double() - ref).abs() <= eps * ref.abs() + 1e-30).all()
            grads = torch.autograd.grad(y.float().sum(), (xh, zh, weight))
            assert [g.dtype for g in grads] == [dtype, dtype, weight.dtype]


def test_bad_arguments_raise_clear_errors():
    x, z, w = _make((3, 8), torch.float32, requires_grad=False)
    with pytest.raises(ValueError, match="group_size must be a positive divisor of the "
                                         "last axis \\(8\\), got 3"):
        rt.gated_rms_norm(x, z, w, group_size=3)
    with pytest.raises(ValueError, match="gate must have the input's shape"):
        rt.gated_rms_norm(x, z[:2], w)
    with pytest.raises(TypeError, match="gate must have the input's dtype"):
        rt.gated_rms_norm(x, z.double(), w)
    with pytest.raises(ValueError, match="weight must have shape \\(8,\\)"):
        rt.gated_rms_norm(x, z, w[:4])
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        rt.gated_rms_norm(x.numpy(), z)
    with pytest.raises(ValueError, match="group_size must be a positive divisor"):
        rt.GatedRMSNorm(8, group_size=5)


def test_module_state_dict_repr_pickle_and_the_call_without_a_gate():
    norm = rt.GatedRMSNorm(8, eps=1e-5, group_size=4)
    assert list(norm.state_dict()) == ["weight"] and torch.equal(norm.weight, torch.ones(8))
    assert repr(norm) == "GatedRMSNorm(8, eps=1e-05, group_size=4, norm_before_gate=False)"
    x, z, w = _make((2, 3, 8), torch.float32)
    with torch.no_grad():
        norm.weight.copy_(w)
    torch.testing.assert_close(norm(x), rt.gated_rms_norm(x, None, norm.weight, 1e-5,
                                                          group_size=4))
    torch.testing.assert_close(norm(x, gate=z), rt.gated_rms_norm(x, z, w, 1e-5, group_size=4))
    torch.testing.assert_close(copy.deepcopy(norm)(x, z), norm(x, z))
    # float64 input: the module follows it, as torch.nn.RMSNorm does
    assert norm(x.double(), z.double()).dtype == torch.float64


# --------------------------------------------------------------------------- graphs

class _Net(torch.nn.Module):
    def __init__(self, norm_before_gate):
        super().__init__()
        self.proj = torch.nn.Linear(8, 16)
        self.norm = rt.GatedRMSNorm(8, group_size=4, norm_before_gate=norm_before_gate)
        with torch.no_grad():
            self.norm.weight.add_(0.3 * torch.randn(8))

    def forward(self, x):
        h, z = self.proj(x).chunk(2, -1)
        return self.norm(h.contiguous(), z.contiguous()).sum(-1)


@pytest.mark.parametrize("norm_before_gate", FORMS)
def test_torch_compile_fullgraph_without_graph_breaks(norm_before_gate):
    torch.manual_seed(0)
    net, x = _Net(norm_before_gate), torch.randn(3, 5, 8, requires_grad=True)
    explanation = torch._dynamo.explain(net)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    y = net(x)
    grads = torch.autograd.grad(y.square().sum(), [x, *net.parameters()])
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    cy = compiled(x)
    cgrads = torch.autograd.grad(cy.square().sum(), [x, *net.parameters()])
    torch.testing.assert_close(cy, y)
    for g, r in zip(cgrads, grads):
        torch.testing.assert_close(g, r)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(net, fullgraph=True)(x), y)
    torch._dynamo.reset()


@pytest.mark.parametrize("with_gate,with_weight", [(True, True), (False, False)])
def test_custom_operator_passes_opcheck_and_its_gradients_gradcheck(with_gate, with_weight):
    from resnorm.torch import ops
    x, z, w = _make((3, 2, 8), torch.float64)
    z, w = (z if with_gate else None), (w if with_weight else None)
    for nbg in (False, True):
        torch.library.opcheck(ops.gated_rms_norm, (x, z, w, 1e-5, 4, nbg))
        args = [t for t in (x, z, w) if t is not None]

        def f(*a):
            it = iter(a)
            return ops.gated_rms_norm(next(it), next(it) if with_gate else None,
                                      next(it) if with_weight else None, 1e-5, 4, nbg)[0]
        assert torch.autograd.gradgradcheck(f, args)


def test_torchscript_and_jit_trace_run_the_operator():
    norm = rt.GatedRMSNorm(8, group_size=2, norm_before_gate=True)
    x, z, _ = _make((3, 8), torch.float32, requires_grad=False)
    ref = norm(x, z)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's deprecation of script, trace's checks
        torch.testing.assert_close(torch.jit.script(norm)(x, z), ref)
        traced = torch.jit.trace(norm, (x, z))
    assert "resnorm::gated_rms_norm" in str(traced.graph)
    torch.testing.assert_close(traced(x, z), ref)


# --------------------------------------------------------------------------- Hugging Face's classes

# (module, class, constructor arguments, GatedRMSNorm's arguments): D = 32
_CLASSES = {
    "mamba2": ("mamba2", "Mamba2RMSNormGated", dict(group_size=8), dict(group_size=8)),
    "bamba": ("bamba", "BambaRMSNormGated", dict(group_size=16), dict(group_size=16)),
    "granitemoehybrid": ("granitemoehybrid", "GraniteMoeHybridRMSNormGated",
                         dict(group_size=32), {}),
    "zamba2": ("zamba2", "Zamba2RMSNormGated", dict(group_size=16), dict(group_size=16)),
    "nemotron_h": ("nemotron_h", "NemotronHRMSNormGated", dict(group_size=8),
                   dict(group_size=8)),
    "falcon_h1": ("falcon_h1", "FalconH1RMSNormGated", dict(n_groups=2, norm_before_gate=True),
                  dict(group_size=16, norm_before_gate=True)),
    "falcon_h1_gate_first": ("falcon_h1", "FalconH1RMSNormGated",
                             dict(n_groups=4, norm_before_gate=False), dict(group_size=8)),
    "qwen3_next": ("qwen3_next", "Qwen3NextRMSNormGated", {}, dict(norm_before_gate=True)),
}


def _hf_norm(key, dtype):
    module, name, kwargs, _ = _CLASSES[key]
    cls = _hf(module, name)
    torch.manual_seed(0)
    norm = cls(32, eps=1e-6, **kwargs)
    with torch.no_grad():
        norm.weight.add_(0.3 * torch.randn(32))
    return norm.to(dtype)


@pytest.mark.parametrize("key", list(_CLASSES))
def test_the_module_computes_as_hugging_faces_classes_float32(key):
    hf = _hf_norm(key, torch.float32)
    ours = rt.GatedRMSNorm(32, eps=1e-6, **_CLASSES[key][3])
    ours.load_state_dict(hf.state_dict())
    x, z, _ = _make((2, 7, 32), torch.float32, seed=4)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    ref = hf(x, z)
    ref_grads = torch.autograd.grad(ref, (x, z, hf.weight), dy)
    y = ours(x, z)
    grads = torch.autograd.grad(y, (x, z, ours.weight), dy)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("key", list(_CLASSES))
def test_the_module_computes_as_hugging_faces_classes_bfloat16(key):
    # Hugging Face's classes compute in float32 and round to bfloat16 one to three times
    # (the normalised value, its product with the weight, the gated output); resnorm
    # rounds once: within 2 bfloat16 units in the last place of each output
    pytest.importorskip("ml_dtypes")
    hf = _hf_norm(key, torch.bfloat16)
    ours = rt.GatedRMSNorm(32, eps=1e-6, **_CLASSES[key][3], dtype=torch.bfloat16)
    ours.load_state_dict(hf.state_dict())
    x, z, _ = _make((4, 7, 32), torch.bfloat16, seed=6, requires_grad=False)
    with torch.no_grad():
        ref, y = hf(x, z), ours(x, z)
    assert y.dtype == ref.dtype == torch.bfloat16
    ulp = torch.finfo(torch.bfloat16).eps * ref.float().abs()
    assert ((y.float() - ref.float()).abs() <= 2 * ulp + 1e-30).all()
    assert (y == ref).float().mean() >= 0.6


def test_patch_recognises_each_class_alone_and_its_call_without_a_gate():
    from resnorm.torch.recognise import recognise
    x, z, _ = _make((3, 32), torch.float32, seed=7, requires_grad=False)
    for key, (_, _, kwargs, ours) in _CLASSES.items():
        hf = _hf_norm(key, torch.float32)
        spec, reason = recognise(hf)
        assert reason is None, (key, reason)
        assert spec.norm_before_gate == ours.get("norm_before_gate", False), key
        assert spec.group_size(hf, 32) == ours.get("group_size", 32), key
        with torch.no_grad():
            ref = hf(x, z)
            handle = rt.patch(hf)
            assert len(handle.swapped) == 1 and type(hf).__name__ == _CLASSES[key][1]
            torch.testing.assert_close(hf(x, z), ref, rtol=1e-5, atol=1e-6)
            if key == "qwen3_next":
                # its gate is required: without one, its own forward answers (it refuses)
                assert not spec.gate_optional
                with pytest.raises(TypeError, match="missing 1 required positional "
                                                    "argument: 'gate'"):
                    hf(x)
            else:
                assert spec.gate_optional
                torch.testing.assert_close(hf(x), rt.gated_rms_norm(
                    x, None, hf.weight, group_size=ours.get("group_size")))
            handle.undo()
            assert type(hf) is _hf(*_CLASSES[key][:2])
            assert torch.equal(hf(x, z), ref)


def test_other_silu_gated_classes_are_swapped_and_sigmoid_gated_ones_left_alone():
    pytest.importorskip("transformers")
    x, z, _ = _make((3, 16), torch.float32, seed=8, requires_grad=False)
    found = 0
    for module, name, swapped in [("qwen3_5", "Qwen3_5RMSNormGated", True),
                                  ("olmo_hybrid", "OlmoHybridRMSNormGated", True),
                                  ("kimi_linear", "KimiLinearRMSNormGated", False)]:
        try:
            cls = getattr(importlib.import_module(
                f"transformers.models.{module}.modeling_{module}"), name)
        except (ImportError, AttributeError):
            continue
        found += 1
        norm = cls(16, eps=1e-6)
        with torch.no_grad():
            ref = norm(x, z)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            handle = rt.patch(norm)
        assert bool(handle.swapped) == swapped, (name, handle.skipped)
        if not swapped:
            assert "its forward takes gate besides the input, and its output differs from " \
                   "resnorm's gated" in handle.skipped[0][1]
            assert any("left 1 norm module(s) on torch" in str(w.message) for w in caught)
        with torch.no_grad():
            torch.testing.assert_close(norm(x, z), ref, rtol=1e-5, atol=1e-6)
    if not found:
        pytest.skip("this transformers has none of these classes")


def test_patched_class_under_autocast_runs_resnorm_as_its_class_computes():
    # a float32 gated norm given bfloat16 rows and gate (torch.autocast's mixed case)
    pytest.importorskip("ml_dtypes")
    for key in ("mamba2", "qwen3_next"):
        hf = _hf_norm(key, torch.float32)
        x, z, _ = _make((5, 32), torch.bfloat16, seed=9, requires_grad=False)
        with torch.no_grad():
            ref = hf(x, z)
            rt.patch(hf)
            calls = []
            real = resnorm.gated_rms_norm
            resnorm.gated_rms_norm = lambda *a, **k: calls.append(1) or real(*a, **k)
            try:
                got = hf(x, z)
            finally:
                resnorm.gated_rms_norm = real
        assert calls and got.dtype == ref.dtype
        # Mamba-2 rounds the normalised value to bfloat16 before its float32 weight
        # (float32 out); Qwen3-Next rounds three times to bfloat16: within 2 units
        ulp = torch.finfo(torch.bfloat16).eps * ref.float().abs()
        assert ((got.float() - ref.float()).abs() <= 2 * ulp + 1e-30).all(), key


# --------------------------------------------------------------------------- hybrid models

VOCAB = 64
_DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
_MAMBA = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8,
              mamba_chunk_size=8)
# name: (Config's and ForCausalLM's prefix, the Config's arguments, gated norms, group size)
HYBRID = {
    "Mamba2": ("Mamba2", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                              num_heads=4, head_dim=16, state_size=8, n_groups=2, chunk_size=8,
                              bos_token_id=1, eos_token_id=2, pad_token_id=0), 2, 32),
    "Bamba": ("Bamba", dict(_DECODER, **_MAMBA, attn_layer_indices=[1]), 1, 32),
    "GraniteMoeHybrid": ("GraniteMoeHybrid",
                         dict(_DECODER, **_MAMBA, layer_types=["mamba", "attention"],
                              num_local_experts=2, num_experts_per_tok=1), 1, 32),
    "FalconH1": ("FalconH1", dict(_DECODER, **_MAMBA, mamba_d_ssm=64, mamba_rms_norm=True),
                 2, 32),
    "FalconH1-gate-first": ("FalconH1", dict(_DECODER, **_MAMBA, mamba_d_ssm=64,
                                             mamba_rms_norm=True,
                                             mamba_norm_before_gate=False), 2, 32),
    "Zamba2": ("Zamba2", dict(_DECODER, mamba_d_state=8, n_mamba_heads=4, mamba_ngroups=2,
                              layers_block_type=["mamba", "hybrid"]), 2, 32),
    "NemotronH": ("NemotronH", dict(_DECODER, layers_block_type=["mamba", "attention"],
                                    mamba_num_heads=4, mamba_head_dim=16, n_groups=2,
                                    ssm_state_size=8, chunk_size=8, head_dim=8), 1, 32),
    "Qwen3Next": ("Qwen3Next", dict(_DECODER, layer_types=["linear_attention",
                                                           "full_attention"],
                                    head_dim=8, linear_num_value_heads=4,
                                    linear_num_key_heads=2, linear_key_head_dim=8,
                                    linear_value_head_dim=8, num_experts=2,
                                    num_experts_per_tok=1, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=32), 1, 8),
}


def _hybrid(name):
    tf = pytest.importorskip("transformers")
    prefix, config, _, _ = HYBRID[name]
    if not hasattr(tf, f"{prefix}ForCausalLM"):
        pytest.skip(f"this transformers has no {prefix}ForCausalLM")
    torch.manual_seed(0)
    model = getattr(tf, f"{prefix}ForCausalLM")(getattr(tf, f"{prefix}Config")(**config))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname.lower():
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _gated_names(model):
    return [n for n, m in model.named_modules() if type(m).__name__.endswith("RMSNormGated")]


def _loss_and_grads(model, ids):
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    model.eval()
    return loss.detach(), grads


@pytest.mark.parametrize("name", list(HYBRID))
def test_hybrid_model_has_its_gated_norms_swapped(name):
    model = _hybrid(name)
    gated = _gated_names(model)
    assert len(gated) == HYBRID[name][2]
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    ref_loss, ref_grads = _loss_and_grads(model, ids)
    classes = [type(m) for m in model.modules()]
    twin = copy.deepcopy(model)           # unpatched
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # no norm may be left on torch
        handle = rt.patch(model)
    assert handle.skipped == []
    assert [n for n, _ in handle.swapped if n in gated] == gated
    for n in gated:
        norm = model.get_submodule(n)
        assert norm.extra_repr().endswith("computed by resnorm")
        assert norm.__dict__["_resnorm_spec"].group_size(norm, norm.weight.shape[0]) \
            == HYBRID[name][3]
    calls = []
    real = resnorm.gated_rms_norm
    resnorm.gated_rms_norm = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        with torch.no_grad():
            out = model(input_ids=ids).logits
    finally:
        resnorm.gated_rms_norm = real
    assert len(calls) == len(gated)       # each gated norm ran on resnorm once
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # a training step: the loss and every gradient as unpatched, then an optimizer step
    loss, grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for (pname, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        if r is None:
            assert g is None, pname
        else:
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6, msg=pname)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    opt.step()
    with torch.no_grad():
        stepped = model(input_ids=ids).logits
    assert torch.isfinite(stepped).all() and not torch.equal(stepped, out)
    # undo: the classes back, and the outputs bit-identical to the unpatched model's
    handle.undo()
    assert [type(m) for m in model.modules()] == classes
    assert not any("_resnorm" in k for m in model.modules() for k in vars(m))
    twin.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, twin(input_ids=ids).logits)


@pytest.mark.parametrize("name", ["Bamba", "Qwen3Next"])
def test_bfloat16_hybrid_model_is_patched_and_agrees(name):
    # in a bfloat16 model the Mamba mixers hand their gated norm float32 rows and a
    # bfloat16 gate (widened, exactly, as the classes widen it) and Qwen3-Next's bfloat16
    # rows: within 2 bfloat16 epsilons of the logits' largest size
    pytest.importorskip("ml_dtypes")
    model = _hybrid(name).to(torch.bfloat16)
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        handle = rt.patch(model)
        assert handle.skipped == [] and set(_gated_names(model)) <= {n for n, _ in
                                                                     handle.swapped}
        got = model(input_ids=ids).logits
    assert got.dtype == torch.bfloat16
    tol = 2 * torch.finfo(torch.bfloat16).eps * ref.float().abs().max()
    assert (got.float() - ref.float()).abs().max() <= tol
    handle.undo()


def test_patched_gated_norm_compiles_fullgraph_inside_a_model_layer():
    model = _hybrid("Bamba")
    rt.patch(model)
    norm = model.get_submodule(_gated_names(model)[0])
    x, z, _ = _make((2, 7, 64), torch.float32, seed=10)
    explanation = torch._dynamo.explain(lambda: norm(x, z))()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(norm, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, z), norm(x, z))
    torch._dynamo.reset()
