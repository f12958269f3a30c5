"""Causal self-attention, forward + backward: the masked half skipped vs computed, the cost
of dropout on the probabilities, and PyTorch's MultiheadAttention on the same weights.

Variants of resnorm.nn.CausalSelfAttention (d_model 256, 4 heads, batch 8, float32):
  skip        causal_block = 32 (the default): each block of 32 query rows against the keys
              it sees
  full        causal_block = 0: the full T x T products, masked afterwards
  skip+drop   the default with dropout 0.1 on the attention probabilities
  torch       torch.nn.MultiheadAttention(batch_first=True), causal mask, is_causal=True
All timed interleaved in one run (resnorm.bench.time_interleaved), medians of repeats,
per thread count.  Reported: milliseconds and the ratios full/skip, (skip+drop)/skip and
torch/skip.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=src python benchmarks/bench_attention.py
"""
import argparse

import numpy as np

from resnorm import nn
from resnorm.bench import time_interleaved


def module(d, h, dropout, block, seed=0):
    m = nn.CausalSelfAttention(d, h, dropout=dropout, seed=seed)
    m.causal_block = block
    return m


def step(m, x, dy):
    def run():
        m.zero_grad()
        m.forward(x)
        m.backward(dy)
    return run


def torch_step(torch, m, x, dy):
    d, h = m.d_model, m.n_heads
    t = torch.nn.MultiheadAttention(d, h, batch_first=True)
    t.load_state_dict({k: torch.from_numpy(v) for k, v in m.state_dict().items()})
    tx = torch.from_numpy(x).requires_grad_(True)
    tdy = torch.from_numpy(dy)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])

    def run():
        t.zero_grad(set_to_none=True)
        tx.grad = None
        out, _ = t(tx, tx, tx, attn_mask=mask, is_causal=True, need_weights=False)
        out.backward(tdy)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    print("| threads | T | skip ms | full ms | full/skip | skip+drop ms | (skip+drop)/skip "
          "| torch ms | torch/skip |")
    print("|---|---|---|---|---|---|---|---|---|")
    for threads in args.threads:
        with threadpool_limits(limits=threads):
            if torch is not None:
                torch.set_num_threads(threads)
            for t in args.seq:
                x = rng.standard_normal((args.batch, t, args.d_model)).astype(np.float32)
                dy = rng.standard_normal(x.shape).astype(np.float32)
                skip = module(args.d_model, args.heads, 0.0, nn.attention.CAUSAL_BLOCK)
                fns = [step(skip, x, dy), step(module(args.d_model, args.heads, 0.0, 0), x, dy),
                       step(module(args.d_model, args.heads, 0.1, nn.attention.CAUSAL_BLOCK),
                            x, dy)]
                if torch is not None:
                    fns.append(torch_step(torch, skip, x, dy))
                ms = [1e3 * s for s in time_interleaved(fns, args.repeats)]
                peer = (f"{ms[3]:.2f} | {ms[3] / ms[0]:.2f}" if torch is not None
                        else "not installed | -")
                print(f"| {threads} | {t} | {ms[0]:.2f} | {ms[1]:.2f} | {ms[1] / ms[0]:.2f} | "
                      f"{ms[2]:.2f} | {ms[2] / ms[0]:.2f} | {peer} |")


if __name__ == "__main__":
    main()
