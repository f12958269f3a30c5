"""resnorm.torch.patch inside real Hugging Face models (tiny configs built here, nothing
downloaded): every norm swapped, logits and gradients as unpatched, generate's tokens the
same, training with gradient checkpointing, save/load, undo, torch.compile without graph
breaks, bfloat16 models patched.  (The hybrid Mamba models' gated norms:
tests/test_torch_gated_norm.py.)"""
import os
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing may come from the network
torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

import resnorm  # noqa: E402
import resnorm.torch as rt  # noqa: E402
from _spy import spy_norms  # noqa: E402

VOCAB = 64
_DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
# name: (model class, config, norm classes, norm modules in the model)
MODELS = {
    "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(**_DECODER), "LlamaRMSNorm", 5),
    "mistral": (tf.MistralForCausalLM, tf.MistralConfig(**_DECODER), "MistralRMSNorm", 5),
    "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(**_DECODER), "Qwen2RMSNorm", 5),
    "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config(**_DECODER, head_dim=8), "Qwen3RMSNorm", 9),
    "gemma": (tf.GemmaForCausalLM, tf.GemmaConfig(**_DECODER, head_dim=8), "GemmaRMSNorm", 5),
    "phi3": (tf.Phi3ForCausalLM, tf.Phi3Config(**_DECODER), "Phi3RMSNorm", 5),
    # OLMo's LayerNorm has no parameters and no eps attribute (1e-5, found by the probe)
    "olmo": (tf.OlmoForCausalLM, tf.OlmoConfig(**_DECODER), "OlmoLayerNorm", 5),
    # Nemotron's LayerNorm computes with 1 + weight
    "nemotron": (tf.NemotronForCausalLM, tf.NemotronConfig(**_DECODER), "NemotronLayerNorm1P",
                 5),
    "t5": (tf.T5ForConditionalGeneration,
           tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                       decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
           "T5LayerNorm", 12),
    "gpt2": (tf.GPT2LMHeadModel,
             tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                           bos_token_id=1, eos_token_id=2),
             "LayerNorm", 5),
    "bert": (tf.BertForMaskedLM,
             tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=64),
             "LayerNorm", 6),
}
NAMES = list(MODELS)


def _model(name, seed=0):
    """A freshly initialised tiny model; its norm weights randomised (they start at 1 / 0)."""
    cls, config, _, _ = MODELS[name]
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for module_name, p in model.named_parameters():
            if "norm" in module_name.lower() or "ln" in module_name.split(".")[-2]:
                p.add_(0.2 * torch.randn_like(p))
    return model


def _batch(name):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 7), generator=g)
    if name == "t5":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :4]}
    return {"input_ids": ids}


def _norms(model, cls_name):
    return [m for m in model.modules() if type(m).__name__ == cls_name]


def _patch(model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # no norm may be left on torch
        return rt.patch(model)


# --------------------------------------------------------------------------- swapped, same results

@pytest.mark.parametrize("name", NAMES)
def test_every_norm_is_swapped_and_logits_and_gradients_match(name):
    model = _model(name)
    cls_name, count = MODELS[name][2], MODELS[name][3]
    assert len(_norms(model, cls_name)) == count
    batch = _batch(name)
    ref = model(**batch).logits
    ref_grads = torch.autograd.grad(ref.square().mean(), list(model.parameters()),
                                    allow_unused=True)
    handle = _patch(model)
    assert len(handle.swapped) == count and handle.skipped == []
    assert all(type(m).__name__ == cls_name for _, m in handle.swapped)   # names kept
    out = model(**batch).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.square().mean(), list(model.parameters()),
                                allow_unused=True)
    for (pname, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        if r is None:
            assert g is None, pname
        else:
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6, msg=pname)


def test_llama4_weightless_qk_norms_are_swapped_and_agree():
    # Llama 4's q/k norm has no parameters and no normalized_shape: an RMSNorm of whatever
    # last axis it is given (the head dimension), probed on rows of another size
    config = tf.Llama4TextConfig(**_DECODER, head_dim=8, intermediate_size_mlp=64,
                                 num_local_experts=2)
    torch.manual_seed(0)
    model = tf.Llama4TextModel(config).eval()
    batch = _batch("llama")
    ref = model(**batch).last_hidden_state
    ref_grads = torch.autograd.grad(ref.square().mean(), list(model.parameters()),
                                    allow_unused=True)
    handle = _patch(model)
    swapped = sorted({type(m).__name__ for _, m in handle.swapped})
    assert swapped == ["Llama4TextRMSNorm", "Llama4TextWeightlessRMSNorm"]
    assert len(handle.swapped) == 7 and handle.skipped == []
    out = model(**batch).last_hidden_state
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.square().mean(), list(model.parameters()),
                                allow_unused=True)
    for (pname, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6, msg=pname)


def test_olmo_norm_keeps_its_own_forward_for_float64_input():
    # OLMo's LayerNorm computes in float32 whatever the input: resnorm in float64 would not
    # compute the same, and with no parameters to fix a dtype the module stays usable
    model = _model("olmo")
    _patch(model)
    norm = _norms(model, "OlmoLayerNorm")[0]
    x = torch.randn(3, 32, dtype=torch.float64)
    calls = []
    with torch.no_grad(), spy_norms(resnorm, calls):
        got = norm(x)
        assert calls == []
        norm(x.float())
        assert len(calls) == 1
    assert got.dtype == torch.float64
    assert torch.equal(got, torch.nn.functional.layer_norm(x.float(), (32,), eps=1e-5).double())


# More architectures, forward only: every norm-like module swapped, the logits unchanged
# (name: the Config's prefix; the model class is <name>ForCausalLM)
MORE = ["Gemma2", "Gemma3Text", "Cohere", "Cohere2", "Mixtral", "Granite", "Qwen2Moe",
        "Qwen3Moe", "Olmo2", "Olmo3", "StableLm", "GPTNeoX", "Phi", "Bloom", "Starcoder2",
        "FalconH1", "Exaone4", "GptOss", "Apertus", "Arcee", "Ernie4_5", "Doge", "Lfm2",
        "Mamba", "DiffLlama", "Persimmon", "BioGpt", "Mpt"]


@pytest.mark.parametrize("name", MORE)
def test_more_architectures_have_every_norm_swapped(name):
    from resnorm.torch.recognise import norm_like
    model_cls = (getattr(tf, f"{name}ForCausalLM", None)
                 or getattr(tf, f"{name.replace('Text', '')}ForCausalLM"))
    torch.manual_seed(0)
    model = model_cls(getattr(tf, f"{name}Config")(**_DECODER)).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname.lower() or "ln" in pname.split("."):
                p.add_(0.2 * torch.randn_like(p))
        batch = _batch(name)
        ref = model(**batch).logits
        handle = _patch(model)
        assert len(handle.swapped) == sum(map(norm_like, model.modules())) > 0
        torch.testing.assert_close(model(**batch).logits, ref, rtol=1e-5, atol=1e-5)


# Hybrid models whose Mamba-2 mixer ends in a gated RMSNorm, forward(hidden_states,
# gate=None) (Mamba 2, Bamba, GraniteMoeHybrid, Falcon-H1, Zamba 2, Nemotron-H, Qwen3-Next):
# tests/test_torch_gated_norm.py patches them, the gated norms swapped too.


def test_falcon_mamba_weightless_norms_are_skipped_for_their_buffer():
    # its mixer's weightless RMSNorms keep an unused weight of ones as a buffer
    config = tf.FalconMambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8,
                                  num_hidden_layers=2, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=0)
    torch.manual_seed(0)
    model = tf.FalconMambaForCausalLM(config).eval()
    batch = _batch("falcon_mamba")
    with torch.no_grad():
        ref = model(**batch).logits
        with pytest.warns(UserWarning, match=r"keeps buffers \(weight\)"):
            handle = rt.patch(model)
        skipped = {type(model.get_submodule(n)).__name__ for n, _ in handle.skipped}
        assert skipped == {"FalconMambaWeightlessRMSNorm"}
        assert not any("batch norm" in reason for _, reason in handle.skipped)
        torch.testing.assert_close(model(**batch).logits, ref, rtol=1e-5, atol=1e-5)


def test_the_swapped_modules_run_resnorm(monkeypatch):
    """The patched model calls resnorm's functions (and not torch's norm) for every norm."""
    import resnorm
    model = _model("qwen3")
    _patch(model)
    calls = []
    real = resnorm.rms_norm
    monkeypatch.setattr(resnorm, "rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        model(**_batch("qwen3"))
    assert len(calls) == MODELS["qwen3"][3]    # 9 norms (q/k norms included), one call each


@pytest.mark.parametrize("name", [n for n in NAMES if n != "bert"])
def test_greedy_generate_gives_the_same_tokens(name):
    model = _model(name)
    batch = _batch(name)
    batch.pop("decoder_input_ids", None)
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    ref = model.generate(**batch, **kwargs)
    _patch(model)
    assert torch.equal(model.generate(**batch, **kwargs), ref)


def _checkpointing(model):
    """Activation (gradient) checkpointing on, by the name this transformers has."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@pytest.mark.parametrize("name,first_norm", [("llama", "model.layers.0.input_layernorm"),
                                             ("gpt2", "transformer.h.0.ln_1")])
def test_training_step_with_gradient_checkpointing(name, first_norm):
    def step(model):
        model.train()
        _checkpointing(model)
        calls = []
        model.get_submodule(first_norm).register_forward_hook(lambda *a: calls.append(1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batch = _batch(name)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = model(**batch, labels=batch["input_ids"]).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert len(calls) == 6        # forward, then again in backward: checkpointing is on
        return losses, [p.detach().clone() for p in model.parameters()]
    ref_losses, ref_params = step(_model(name))
    model = _model(name)
    _patch(model)
    losses, params = step(model)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for p, r in zip(params, ref_params):
        torch.testing.assert_close(p, r, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- save, load, undo

def test_save_pretrained_and_load_both_ways(tmp_path):
    model = _model("llama")
    batch = _batch("llama")
    _patch(model)
    with torch.no_grad():
        out = model(**batch).logits
    model.save_pretrained(tmp_path / "patched")
    plain = tf.LlamaForCausalLM.from_pretrained(tmp_path / "patched").eval()  # a local dir
    assert not any(type(m).__module__.startswith("resnorm") for m in plain.modules())
    with torch.no_grad():
        torch.testing.assert_close(plain(**batch).logits, out, rtol=1e-5, atol=1e-5)
    _patch(plain)
    with torch.no_grad():
        assert torch.equal(plain(**batch).logits, out)


def test_pickle_and_deepcopy_keep_the_patch(tmp_path):
    import copy
    model = _model("gemma")
    _patch(model)
    batch = _batch("gemma")
    with torch.no_grad():
        out = model(**batch).logits
    torch.save(model, tmp_path / "model.pt")
    for other in (torch.load(tmp_path / "model.pt", weights_only=False), copy.deepcopy(model)):
        norms = _norms(other, "GemmaRMSNorm")
        assert norms and all(isinstance(m, tf.models.gemma.modeling_gemma.GemmaRMSNorm)
                             and type(m) is not tf.models.gemma.modeling_gemma.GemmaRMSNorm
                             for m in norms)
        with torch.no_grad():
            assert torch.equal(other(**batch).logits, out)


@pytest.mark.parametrize("name", ["llama", "t5", "bert"])
def test_undo_restores_bit_identical_outputs(name):
    model = _model(name)
    batch = _batch(name)
    with torch.no_grad():
        ref = model(**batch).logits
    classes = [type(m) for m in model.modules()]
    handle = _patch(model)
    handle.undo()
    assert [type(m) for m in model.modules()] == classes
    assert not any("_resnorm" in k for m in model.modules() for k in vars(m))
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, ref)


# --------------------------------------------------------------------------- torch.compile

@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_no_graph_break_from_resnorm(name):
    model = _model(name)
    _patch(model)
    batch = _batch(name)
    explanation = torch._dynamo.explain(lambda: model(**batch).logits)()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()


def test_fullgraph_compile_of_a_patched_model_trains_like_eager():
    model = _model("llama")
    _patch(model)
    model.train()
    batch = _batch("llama")
    loss = model(**batch, labels=batch["input_ids"]).loss
    grads = torch.autograd.grad(loss, list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    closs = compiled(**batch, labels=batch["input_ids"]).loss
    cgrads = torch.autograd.grad(closs, list(model.parameters()))
    torch.testing.assert_close(closs, loss)
    for g, r in zip(cgrads, grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7)
    torch._dynamo.reset()


# --------------------------------------------------------------------------- precision

@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_models_are_patched_and_agree(name):
    # Every norm of a bfloat16 model is swapped.  resnorm rounds each norm's output once;
    # Llama-style modules round the normalised value before the weight multiply too, so
    # outputs differ by about one unit in the last place per norm, which the layers carry
    # to the logits: within 2 bfloat16 epsilons (2^-7 each) of the logits' largest size.
    model = _model(name).to(torch.bfloat16)
    batch = _batch(name)
    with torch.no_grad():
        ref = model(**batch).logits
    handle = rt.patch(model)
    assert handle.skipped == [] and len(handle.swapped) == MODELS[name][3]
    with torch.no_grad():
        got = model(**batch).logits
    assert got.dtype == torch.bfloat16
    tol = 2 * torch.finfo(torch.bfloat16).eps * ref.float().abs().max()
    assert (got.float() - ref.float()).abs().max() <= tol
    handle.undo()


def test_float64_llama_is_skipped_because_it_computes_in_float32():
    """LlamaRMSNorm casts to float32 inside: resnorm in float64 would not compute the same."""
    model = _model("llama").double()
    with pytest.warns(UserWarning, match="differs from resnorm's 'rms' formula"):
        handle = rt.patch(model)
    assert handle.swapped == []


def test_float64_gpt2_layer_norm_double_backward():
    model = _model("gpt2").double()
    _patch(model)
    ln = model.transformer.ln_f
    x = torch.randn(2, 3, 32, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(ln, (x,))


def test_patched_model_refuses_another_input_dtype_clearly():
    model = _model("llama")
    _patch(model)
    norm = model.model.norm
    with pytest.raises(TypeError, match="checked this LlamaRMSNorm against resnorm for "
                                        "torch.float32 input, got torch.float64"):
        norm(torch.ones(2, 32, dtype=torch.float64))


# --------------------------------------------------------------------------- 16-bit input

# Under torch.autocast a float32 norm can receive float16/bfloat16 input (Qwen3's q/k norms
# get a Linear's output).  The classes differ in where they round and in the dtype they
# return: Llama-style rounds x * rstd to the input's dtype, then multiplies by the float32
# weight (float32 out); Gemma computes in float32 and rounds once (input's dtype out); T5
# multiplies the widened rows in float32 (float32 out).
MIXED = {"llama": torch.float32, "qwen3": torch.float32, "gemma": None, "t5": torch.float32}
HALVES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("name", list(MIXED))
def test_float32_norm_given_16_bit_input_runs_resnorm_as_its_class_computes(name, dtype):
    pytest.importorskip("ml_dtypes")   # torch.bfloat16 tensors are viewed as ml_dtypes arrays
    model = _model(name)
    norm = _norms(model, MODELS[name][2])[-1]
    g = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(6, 32, generator=g)).to(dtype).requires_grad_()
    ref = norm(x)
    dy = torch.randn(ref.shape, generator=g).to(ref.dtype)
    ref_dx, ref_dw = torch.autograd.grad(ref, (x, norm.weight), dy)
    _patch(model)
    calls = []
    with spy_norms(resnorm, calls):
        got = norm(x)
    dx, dw = torch.autograd.grad(got, (x, norm.weight), dy)
    assert len(calls) == 1                                  # on resnorm, not its own forward
    assert got.dtype == ref.dtype == (MIXED[name] or dtype)
    # y: Llama rounds x * rstd to the 16-bit dtype before its weight and Gemma rounds its
    # output: one rounding of that dtype; T5 stays in float32 (rstd from torch's float32
    # mean of squares, then two products): a few float32 roundings.  dx: one rounding of
    # the input's dtype.  dweight sums 6 float32 products per column in another order.
    eps32 = torch.finfo(torch.float32).eps
    tol = 4 * eps32 if name == "t5" else torch.finfo(dtype).eps
    assert ((got - ref).abs() <= tol * ref.abs()).all()
    assert (dx - ref_dx).abs().max() <= torch.finfo(dtype).eps * ref_dx.abs().max()
    assert (dw - ref_dw).abs().max() <= 4 * eps32 * ref_dw.abs().max()


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_16_bit_gemma_norm_computes_as_gemmas(dtype):
    # A float16 / bfloat16 Gemma: resnorm forms the gain 1 + weight in float32 as Gemma
    # does (docs/torch.md); both compute in float32 and round the output once, so the
    # outputs are Gemma's wherever the float32 statistics round alike, the rest within one
    # unit in the last place.  (With the gain rounded to the module's dtype, 18-22% of
    # these outputs were a unit apart.)
    pytest.importorskip("ml_dtypes")
    model = _model("gemma").to(dtype)
    norm = _norms(model, "GemmaRMSNorm")[-1]
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        norm.weight.copy_(0.3 * torch.randn(norm.weight.shape, generator=g))
    x = (3 * torch.randn(64, 32, generator=g)).to(dtype)
    with torch.no_grad():
        ref = norm(x).float()
        _patch(model)
        calls = []
        # (an inference call with its float32 gain reaches resnorm's functions from C)
        with spy_norms(resnorm._api, calls):
            got = norm(x).float()
    assert len(calls) == 1 and got.shape == ref.shape
    _, exponent = torch.frexp(ref)
    ulp = torch.ldexp(torch.full_like(ref, torch.finfo(dtype).eps), exponent - 1)
    assert ((got - ref).abs() <= ulp).all()
    assert (got == ref).float().mean() >= 0.999


class _EpsPerDtypeRMSNorm(torch.nn.Module):
    """An RMSNorm that adds a larger eps to 16-bit input: no formula of resnorm's for it."""

    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.2 * torch.randn(d))
        self.eps = 1e-6

    def forward(self, x):
        eps = self.eps if x.dtype == torch.float32 else 1e-2
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_a_class_computing_16_bit_input_otherwise_keeps_its_own_forward_there(dtype):
    pytest.importorskip("ml_dtypes")
    torch.manual_seed(0)
    norm = _EpsPerDtypeRMSNorm(32)
    x = (0.05 * torch.randn(6, 32)).to(dtype)
    with torch.no_grad():
        ref = norm(x)
    handle = _patch(norm)
    assert len(handle.swapped) == 1   # float32 input: recognised and on resnorm
    calls = []
    with torch.no_grad(), spy_norms(resnorm, calls):
        assert torch.equal(norm(x), ref)   # 16-bit input: its own forward, on torch
        norm(x.float())
    assert len(calls) == 1


def test_qwen3_under_autocast_runs_every_norm_on_resnorm():
    # 5 norms receive the float32 residual stream, the 4 q/k norms a Linear's bfloat16 output
    pytest.importorskip("ml_dtypes")
    model = _model("qwen3")
    batch = _batch("qwen3")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(**batch).logits
    _patch(model)
    calls = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with spy_norms(resnorm, calls):
            got = model(**batch).logits   # parameters want gradients: one call per norm
        assert len(calls) == MODELS["qwen3"][3]
        explanation = torch._dynamo.explain(lambda: model(**batch).logits)()
    torch._dynamo.reset()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert got.dtype == ref.dtype
    # a q/k norm's x * rstd may round to the neighbouring bfloat16 value (resnorm's rstd
    # is the float64 one): within 2 bfloat16 epsilons of the logits' largest size
    tol = 2 * torch.finfo(torch.bfloat16).eps * ref.float().abs().max()
    assert (got.float() - ref.float()).abs().max() <= tol
