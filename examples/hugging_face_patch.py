"""A Hugging Face Llama with its norms switched to resnorm by resnorm.torch.patch.

The tiny model is built from a config in code (nothing is downloaded).  patch() swaps
every LlamaRMSNorm for resnorm's kernels in place, and undo() puts torch's back: the
logits agree to float32 rounding, and generation gives the same tokens.  Needs torch and
transformers.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing comes from the network
import torch  # noqa: E402
import transformers  # noqa: E402

import resnorm.torch as rt  # noqa: E402

torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, bos_token_id=1, eos_token_id=2)
model = transformers.LlamaForCausalLM(config).eval()
ids = torch.tensor([[1, 5, 9, 3, 7]])
with torch.no_grad():
    before = model(ids).logits
    handle = rt.patch(model)
    print(handle)                           # how many norms were swapped
    after = model(ids).logits
    tokens = model.generate(ids, max_new_tokens=4, do_sample=False)
    handle.undo()
    tokens_torch = model.generate(ids, max_new_tokens=4, do_sample=False)
print(f"logits: max |resnorm - torch| = {(after - before).abs().max().item():.1e}")
print("generated:", tokens[0, ids.shape[1]:].tolist())
assert torch.allclose(after, before, atol=1e-5) and torch.equal(tokens, tokens_torch)
