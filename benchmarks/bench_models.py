"""Whole Hugging Face models on CPU, torch's norms vs resnorm's (resnorm.torch.patch).

Two architectures built from configs in code (random weights, nothing downloaded):
Llama (RMSNorm, SwiGLU, rotary) and GPT-2 (LayerNorm, GELU), float32, by default
hidden 512, 4 layers, 8 heads, vocabulary 8192.  For each architecture and thread count:

* forward 1x1:    one token, batch 1, no cache (torch.inference_mode)
* forward 8x128:  batch 8 x 128 tokens (torch.inference_mode)
* forward 8x256:  batch 8 x 256 tokens (torch.inference_mode)
* decode:         one new token, batch 1, after a 16-token prompt in the KV cache (the
                  cache is cropped back to the prompt after each step)
* generate:       greedy, batch 1, a 16-token prompt and 32 new tokens (with the KV cache)
* train 8x256:    zero_grad, forward with labels, backward, AdamW step

--compile runs every copy through torch.compile (one --threads value per process: Inductor
fixes its thread count when it compiles); the norm time is then not measured (a hook on a
compiled module's norms would break its graph).

Three deep copies of one build (the same weights, allocated alike) are timed: torch,
patched (switched with resnorm.torch.patch) and a second torch copy, the control: the
"control" column is torch / control, the ratio two identical models get on this machine,
so a speed-up closer to 1 than the control is within the noise.  The script checks that
the patched model's logits agree with torch's and that generate gives the same tokens.
Times are medians of interleaved repeats (torch, patched, control, torch, ...: all see
the same machine noise), in milliseconds; a repeat of "forward 1x1" is a burst of 20
steps, and that case takes three times the repeats (its steps are short).  Threads are
set with torch.set_num_threads, which resnorm.torch follows.

Norm time: every call a norm module receives during one run of the case is recorded
(module, input) and replayed alone, as forward (inference cases) or forward + backward
with a fixed random output gradient (training), timed interleaved like the cases.  Its
sum over the calls is the norm time per run of the case; "norm share" is that over the
case's median time.  The replay times the norms' own work and call overhead without the
rest of the model (the caches then hold only the norm's data), so it is an estimate of
the norms' part, not a subtraction.

  PYTHONPATH=src python benchmarks/bench_models.py [--arch llama,gpt2] [--threads 1,2]
      [--cases ...] [--hidden 512] [--layers 4] [--repeats 7] [--compile] [--quick]

--quick: tiny models and few repeats, to check that the script runs (numbers meaningless).
"""
import argparse
import copy
import warnings

import torch

import resnorm.torch as rt
from resnorm.bench import machine_info, time_interleaved

CASES = ("forward 1x1", "forward 8x128", "forward 8x256", "decode", "generate", "train 8x256")
DEFAULT_CASES = ("forward 1x1", "forward 8x256", "generate", "train 8x256")
PROMPT = 16   # tokens before the one "decode" times


def build(arch, hidden, layers, heads, vocab, positions):
    """A randomly initialised model of the architecture (seeded), in eval mode."""
    import transformers as tf
    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    if arch == "llama":
        config = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                num_attention_heads=heads, num_key_value_heads=heads,
                                intermediate_size=int(hidden * 8 / 3) // 64 * 64,
                                max_position_embeddings=positions, bos_token_id=1,
                                eos_token_id=2, pad_token_id=0)
        model = tf.LlamaForCausalLM(config)
    elif arch == "gpt2":
        config = tf.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                               n_positions=positions, bos_token_id=1, eos_token_id=2)
        model = tf.GPT2LMHeadModel(config)
    else:
        raise SystemExit(f"unknown --arch {arch!r}: llama or gpt2")
    return model.eval()


class Case:
    """One case of one model: run() is what is timed; norm_calls() records what its norms
    receive during one run."""

    def __init__(self, name, model, batch, threads, compiled=None):
        self.name, self.model, self.threads = name, model, threads
        # what is called: the model, or torch.compile's
        self.compiled = model if compiled is None else compiled
        g = torch.Generator().manual_seed(1)
        vocab = model.config.vocab_size
        rows, tokens = {"forward 1x1": (1, 1), "generate": (1, PROMPT),
                        "decode": (1, PROMPT), "forward 8x128": (batch, 128)
                        }.get(name, (batch, 256))
        self.ids = torch.randint(3, vocab, (rows, tokens), generator=g)
        if name == "train 8x256":
            self.opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        if name == "decode":
            torch.set_num_threads(threads)
            model.eval()
            with torch.inference_mode():
                self.cache = model(self.ids, use_cache=True).past_key_values
            self.next = torch.randint(3, vocab, (1, 1), generator=g)

    def run(self):
        torch.set_num_threads(self.threads)
        model = self.compiled
        if self.name == "train 8x256":
            self.model.train()
            self.opt.zero_grad(set_to_none=True)
            model(self.ids, labels=self.ids).loss.backward()
            self.opt.step()
            return None
        self.model.eval()
        with torch.inference_mode():
            if self.name == "generate":
                return self.model.generate(self.ids, max_new_tokens=32, min_new_tokens=32,
                                           do_sample=False, pad_token_id=0)
            if self.name == "decode":
                logits = model(self.next, cache=self.cache, use_cache=True).logits
                self.cache.crop(-1)   # back to the prompt
                return logits
            return model(self.ids, use_cache=False).logits

    def norm_calls(self, norms):
        """[(module, input, output gradient or None)] of one run of the case."""
        calls = []
        training = self.name == "train 8x256"

        def record(module, args):
            x = args[0].detach().clone()
            calls.append((module, x, torch.randn_like(x) if training else None))
        hooks = [m.register_forward_pre_hook(record) for m in norms]
        try:
            self.run()
        finally:
            for h in hooks:
                h.remove()
        return calls


def replay(calls, threads):
    """A function running every recorded norm call once (forward, or forward + backward)."""
    def run():
        torch.set_num_threads(threads)
        for module, x, dy in calls:
            if dy is None:
                with torch.inference_mode():
                    module(x)
            else:
                x.requires_grad_(True)
                y = module(x)
                torch.autograd.grad(y, [x, *module.parameters()], dy)
    return run


def check_same(theirs, mine):
    """The patched model computes what the torch model does."""
    ids = torch.randint(3, theirs.config.vocab_size, (2, 12),
                        generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        torch.testing.assert_close(mine(ids).logits, theirs(ids).logits, rtol=1e-4, atol=1e-4)
        kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert torch.equal(mine.generate(ids[:1], **kw), theirs.generate(ids[:1], **kw))


# Calls per timed run of the short cases, so that one run outlasts the machine's noise,
# and how many times the repeats they take.
BURST = {"forward 1x1": 20}
MORE_REPEATS = {"forward 1x1": 3}


def bursts(fn, count):
    """fn called count times in a row (one timed run)."""
    def run():
        for _ in range(count):
            fn()
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="llama,gpt2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES),
                    help=f"of: {', '.join(CASES)}")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per configuration")
    ap.add_argument("--compile", action="store_true",
                    help="every copy under torch.compile (one --threads value)")
    ap.add_argument("--quick", action="store_true", help="tiny models, 2 repeats")
    args = ap.parse_args()
    if args.quick:
        args.hidden, args.layers, args.heads, args.vocab, args.batch = 64, 2, 4, 256, 2
        args.repeats = 2
    threads = [int(t) for t in args.threads.split(",")]
    if args.compile and len(threads) > 1:
        raise SystemExit("--compile takes one --threads value per process")
    cases = [c.strip() for c in args.cases.split(",")]
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown --cases {sorted(unknown)}; choose from {', '.join(CASES)}")

    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores, torch {info['torch']}, "
          f"resnorm simd {info['simd_level']}, openmp {info['openmp']}")
    print(f"# hidden={args.hidden} layers={args.layers} heads={args.heads} "
          f"vocab={args.vocab} batch={args.batch} float32; medians of {args.repeats} "
          f"interleaved runs; 'x 256' cases use batch {args.batch}"
          f"{'; every copy under torch.compile' if args.compile else ''}\n")
    print("| arch | case | threads | torch ms | patched ms | speed-up | control | norm ms torch | "
          "norm ms patched | norm share torch | norm share patched |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for arch in args.arch.split(","):
        # deep copies of one build: the same weights, allocated alike
        base = build(arch, args.hidden, args.layers, args.heads, args.vocab, 512)
        theirs, mine, control = (copy.deepcopy(base) for _ in range(3))
        del base
        with warnings.catch_warnings():
            warnings.simplefilter("error")     # every norm must be swapped
            handle = rt.patch(mine)
        names = [name for name, _ in handle.swapped]
        norms = {id(theirs): [theirs.get_submodule(n) for n in names],
                 id(mine): [m for _, m in handle.swapped]}
        check_same(theirs, mine)
        models = (theirs, mine, control)
        compiled = [torch.compile(m) if args.compile else m for m in models]
        for case in cases:
            for t in threads:
                runs = [Case(case, m, args.batch, t, c) for m, c in zip(models, compiled)]
                burst = BURST.get(case, 1)
                run_t, run_m, run_c = (v / burst for v in time_interleaved(
                    [bursts(c.run, burst) for c in runs],
                    args.repeats * MORE_REPEATS.get(case, 1), warmup=2 if args.compile else 1))
                norm = "| - | - | - | - |"
                if not args.compile:
                    replays = [replay(c.norm_calls(norms[id(c.model)]), t) for c in runs[:2]]
                    norm_t, norm_m = time_interleaved(replays, args.repeats, warmup=1)
                    norm = (f"| {norm_t * 1e3:.3f} | {norm_m * 1e3:.3f} | "
                            f"{norm_t / run_t:.1%} | {norm_m / run_m:.1%} |")
                print(f"| {arch} | {case} | {t} | {run_t * 1e3:.2f} | {run_m * 1e3:.2f} | "
                      f"{run_t / run_m:.3f}x | {run_t / run_c:.3f}x {norm}", flush=True)


if __name__ == "__main__":
    main()
