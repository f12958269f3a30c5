"""Training step time of a small Pre-Norm Transformer on CPU: torch's norms vs resnorm's.

Model: torch.nn.TransformerEncoder, d=512, 8 heads, FFN 2048, 4 layers, norm_first=True,
dropout 0, a final norm; batch 8 x T=256 tokens, float32; one step = zero_grad, forward,
MSE loss, backward, AdamW step.  Norms: torch.nn.LayerNorm (the layer's default) and
torch.nn.RMSNorm put in its place.  The resnorm model is a deep copy of the torch model
switched with resnorm.torch.patch, so both start from the same weights.

Step times: all configurations (torch/resnorm x thread counts) are timed round-robin in one
run (resnorm.bench.time_interleaved) and reported as medians; the thread count is set with
torch.set_num_threads, which resnorm.torch follows.

Norm time, in the same steps: every norm is wrapped by two identity autograd Functions that
read the clock (36 Python calls per step, well under 1 ms of a step of a second or more).
Forward norm time runs from the input stamp to the output stamp; backward from the output
stamp's backward to the input stamp's backward: the CPU autograd engine runs nodes in
decreasing creation order, so exactly the norm's own nodes (and the accumulation of its
weight gradients) run in between.  Each interval's median over the timed steps, summed over
the norms, is the norm time per step; the share is that over the median step time.

A one-norm table first: forward and backward of a single norm at the activation shape.

  PYTHONPATH=src python benchmarks/bench_torch_training.py [--repeats 7] [--threads 1,2]
"""
import argparse
import copy
import time

import numpy as np
import torch
from torch import nn

import resnorm.torch as rt
from resnorm.bench import machine_info, time_interleaved


def build_model(norm, d, heads, layers):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                       norm_first=True)
    model = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d),
                                  enable_nested_tensor=False)
    if norm == "rms":
        for m in list(model.modules()):
            for name in ("norm1", "norm2", "norm"):
                if isinstance(getattr(m, name, None), nn.LayerNorm):
                    setattr(m, name, nn.RMSNorm(d))
    return model


class Trainer:
    """One model, its optimizer and a fixed batch; step() is one training step.

    Every norm is wrapped by two clock stamps (_Stamp), so each step also records the
    time spent inside each norm, forward and backward (self.intervals, one list per step).
    """

    def __init__(self, model, x, target, threads):
        self.model, self.x, self.target, self.threads = model, x, target, threads
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.log, self.intervals = [], []
        self.norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]
        for m in self.norms:
            m.register_forward_pre_hook(lambda m, args: (_Stamp.apply(args[0], self.log, "in"),))
            m.register_forward_hook(lambda m, args, y: _Stamp.apply(y, self.log, "out"))

    def step(self):
        torch.set_num_threads(self.threads)
        self.log.clear()
        self.opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(self.model(self.x), self.target)
        loss.backward()
        self.log.append(("done.bwd", time.perf_counter()))
        self.opt.step()
        self.intervals.append(_norm_intervals(self.log, len(self.norms)))
        return loss.item()

    def norm_seconds(self, skip):
        """Seconds per step inside the norms: the median of each norm interval over the
        steps after the first `skip`, summed.  (Per interval, because on a loaded machine
        a parallel region now and then waits a whole scheduler time slice for a
        descheduled thread: a median per interval drops those, a median of per-step sums
        would not.)"""
        return float(np.median(self.intervals[skip:], axis=0).sum())


# --------------------------------------------------------------------------- norm time

class _Stamp(torch.autograd.Function):
    """Identity that appends (key, perf_counter()) to a log in forward and in backward."""

    @staticmethod
    def forward(ctx, x, log, key):
        ctx.log, ctx.key = log, key
        log.append((key + ".fwd", time.perf_counter()))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append((ctx.key + ".bwd", time.perf_counter()))
        return grad, None, None


def _norm_intervals(log, n_norms):
    """The stamped intervals of one step: forward in->out, backward out->in.

    The first norm reads the model input, which needs no gradient, so its input stamp has
    no backward: its backward ends when loss.backward() returns ("done").
    """
    fwd = [(k, t) for k, t in log if k.endswith(".fwd")]
    bwd = [(k, t) for k, t in log if k.endswith(".bwd")]
    assert [k for k, _ in fwd] == ["in.fwd", "out.fwd"] * n_norms, fwd
    assert [k for k, _ in bwd] == ["out.bwd", "in.bwd"] * (n_norms - 1) + ["out.bwd", "done.bwd"], bwd
    pairs = fwd + bwd
    return [pairs[i + 1][1] - pairs[i][1] for i in range(0, len(pairs), 2)]


# --------------------------------------------------------------------------- one norm

def norm_op_times(rows, d, threads, repeats=100):
    """Medians (us) of one norm at the model's activation shape, torch's vs resnorm's:
    forward alone, and backward alone (torch.autograd.grad on a kept graph)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, d, generator=g, requires_grad=True)
    dy = torch.randn(rows, d, generator=g)
    w = (1 + 0.1 * torch.randn(d, generator=g)).requires_grad_()
    b = (0.1 * torch.randn(d, generator=g)).requires_grad_()
    F = nn.functional
    ops = {
        "layer": ((lambda: F.layer_norm(x, (d,), w, b, 1e-5)),
                  (lambda: rt.layer_norm(x, w, b, 1e-5)), (x, w, b)),
        "rms": ((lambda: F.rms_norm(x, (d,), w, 1e-6)), (lambda: rt.rms_norm(x, w, 1e-6)),
                (x, w)),
    }
    table = []
    for name, (theirs, mine, inputs) in ops.items():
        for t in threads:
            torch.set_num_threads(t)
            yt, ym = theirs(), mine()
            fns = [theirs, mine,
                   lambda: torch.autograd.grad(yt, inputs, dy, retain_graph=True),
                   lambda: torch.autograd.grad(ym, inputs, dy, retain_graph=True)]
            table.append((name, t, *(1e6 * v for v in time_interleaved(fns, repeats, 5))))
    return table


# --------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--norms", default="layer,rms")
    ap.add_argument("--repeats", type=int, default=7, help="timed steps per configuration")
    ap.add_argument("--ops-only", action="store_true", help="only the one-norm table")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]

    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores, torch {info['torch']}, "
          f"resnorm simd {info['simd_level']}, openmp {info['openmp']}")
    print(f"# d={args.d} heads={args.heads} layers={args.layers} batch={args.batch} "
          f"T={args.tokens} float32, AdamW, {args.repeats} interleaved steps per config "
          f"(medians)")
    print(f"\nOne norm at the activation shape ({args.batch * args.tokens} x {args.d} float32), "
          f"medians of 100 interleaved calls, us:\n")
    print("| norm | threads | torch fwd | resnorm fwd | torch bwd | resnorm bwd |")
    print("|---|---|---|---|---|---|")
    for name, t, tf, rf, tb, rb in norm_op_times(args.batch * args.tokens, args.d, threads):
        print(f"| {name} | {t} | {tf:.0f} | {rf:.0f} | {tb:.0f} | {rb:.0f} |", flush=True)
    if args.ops_only:
        return

    print("\nTraining steps:\n")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.tokens, args.d, generator=g)
    target = torch.randn(args.batch, args.tokens, args.d, generator=g)

    print("| norm | threads | torch step ms | resnorm step ms | speed-up | "
          "norm share torch | norm share resnorm | norm ms torch | norm ms resnorm |")
    print("|---|---|---|---|---|---|---|---|---|")
    for norm in args.norms.split(","):
        base = build_model(norm, args.d, args.heads, args.layers)
        trainers = []
        for t in threads:
            theirs = copy.deepcopy(base)
            mine = copy.deepcopy(base)
            rt.patch(mine)
            trainers += [Trainer(theirs, x, target, t), Trainer(mine, x, target, t)]
        first = [tr.step() for tr in trainers[:2]]
        assert abs(first[0] - first[1]) <= 1e-5 * abs(first[0]), first   # same model
        times = time_interleaved([tr.step for tr in trainers], args.repeats, warmup=1)
        for i, t in enumerate(threads):
            tt, tr_ = times[2 * i], times[2 * i + 1]
            # skip the steps before the timed ones (the check above and the warm-up)
            n_t = trainers[2 * i].norm_seconds(skip=2 if i == 0 else 1)
            n_r = trainers[2 * i + 1].norm_seconds(skip=2 if i == 0 else 1)
            print(f"| {norm} | {t} | {tt * 1e3:.0f} | {tr_ * 1e3:.0f} | {tt / tr_:.3f}x | "
                  f"{n_t / tt:.1%} | {n_r / tr_:.1%} | {n_t * 1e3:.1f} | {n_r * 1e3:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
