"""Latency of one small norm call through resnorm.torch vs torch's own module.

resnorm.torch.RMSNorm / LayerNorm against torch.nn.RMSNorm / LayerNorm on an input of
shape (1, 1, D) (a decode step's norm), float32, one thread:

* no_grad:  forward under torch.no_grad (the path without autograd);
* forward:  forward with gradients recorded (the autograd Function);
* fwd+bwd:  forward, then y.backward(dy).

Rows "rms_norm" / "layer_norm" time the function forms under torch.no_grad:
resnorm.torch.rms_norm / layer_norm against torch.nn.functional's.

Each number is the median over --repeats rounds of the per-call time of a burst of
--calls calls; torch's and resnorm's bursts alternate in every round so that both see the
same machine noise.  --overhead replaces resnorm's NumPy functions by stand-ins that only
allocate their outputs, which leaves the cost of the torch layer itself (checks,
tensor <-> array views, autograd plumbing).  A row "Function floor" times an
autograd.Function that does nothing but allocate its outputs: no Python autograd.Function
can do fwd+bwd faster than that.

  PYTHONPATH=src python benchmarks/bench_torch_latency.py [--dims 256,4096] [--overhead]
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F

import resnorm
import resnorm.torch as rt
from resnorm import _api
from resnorm.bench import time_interleaved


_FORWARDS = (resnorm.rms_norm_forward, resnorm.layer_norm_forward)   # before any stand-in


def stand_ins(d):
    """resnorm's functions replaced by output allocation only (--overhead)."""
    x, w = np.ones((1, 1, d), np.float32), np.ones(d, np.float32)
    _, rms_cache = _FORWARDS[0](x, w)
    _, ln_cache = _FORWARDS[1](x, w, w)
    vec = lambda: np.empty(d, np.float32)   # noqa: E731
    resnorm.rms_norm = lambda x, w, eps, **k: np.empty_like(x)
    resnorm.layer_norm = lambda x, w, b, eps, **k: np.empty_like(x)
    resnorm.rms_norm_forward = lambda x, w, eps, **k: (np.empty_like(x), rms_cache)
    resnorm.layer_norm_forward = lambda x, w, b, eps, **k: (np.empty_like(x), ln_cache)
    resnorm.rms_norm_backward = lambda dy, c, **k: (np.empty_like(dy), vec())
    resnorm.layer_norm_backward = lambda dy, c, **k: (np.empty_like(dy), vec(), vec())
    # the compiled no-grad calls reach the same functions through resnorm._api, with the
    # output tensor torch allocated (out): the stand-in leaves it as it is
    _api.rms_norm = lambda x, w, eps, *, out, **k: out
    _api.layer_norm = lambda x, w, b, eps, *, out, **k: out


class _Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return torch.from_numpy(np.empty(tuple(x.shape), np.float32))

    @staticmethod
    def backward(ctx, dy):
        ctx.saved_tensors
        d = dy.shape[-1]
        empty = lambda *shape: torch.from_numpy(np.empty(shape, np.float32))   # noqa: E731
        return empty(*dy.shape), empty(d), empty(d)


class Floor(torch.nn.LayerNorm):
    def forward(self, x):
        return _Floor.apply(x, self.weight, self.bias)


def per_call(fns, repeats, calls):
    """Median seconds per call of each function: bursts of `calls` calls, interleaved."""
    def burst(f):
        def run():
            for _ in range(calls):
                f()
        return run
    return [t / calls for t in time_interleaved([burst(f) for f in fns], repeats, warmup=1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", default="256,4096")
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--overhead", action="store_true",
                    help="resnorm's functions replaced by output allocation only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# torch {torch.__version__}, 1 thread, float32, (1, 1, D); median us per call of "
          f"{args.repeats} interleaved bursts of {args.calls}"
          + ("; resnorm's functions replaced by allocation only" if args.overhead else ""))
    print("\n| module | D | mode | torch us | resnorm.torch us | ratio |")
    print("|---|---|---|---|---|---|")
    for d in (int(v) for v in args.dims.split(",")):
        if args.overhead:
            stand_ins(d)
        x = torch.randn(1, 1, d, requires_grad=True)
        dy = torch.randn(1, 1, d)
        pairs = [("RMSNorm", torch.nn.RMSNorm(d, eps=1e-6), rt.RMSNorm(d, eps=1e-6)),
                 ("LayerNorm", torch.nn.LayerNorm(d), rt.LayerNorm(d)),
                 ("Function floor", torch.nn.LayerNorm(d), Floor(d))]
        for name, theirs, mine in pairs:
            def no_grad(m):
                def run():
                    with torch.no_grad():
                        m(x)
                return run
            modes = {"no_grad": no_grad, "forward": lambda m: (lambda: m(x)),
                     "fwd+bwd": lambda m: (lambda: m(x).backward(dy))}
            for mode, make in modes.items():
                if name == "Function floor" and mode != "fwd+bwd":
                    continue
                t, r = per_call([make(theirs), make(mine)], args.repeats, args.calls)
                print(f"| {name} | {d} | {mode} | {t * 1e6:.2f} | {r * 1e6:.2f} | "
                      f"{r / t:.2f} |", flush=True)
        w, b = torch.randn(d), torch.randn(d)
        functions = [("rms_norm", lambda: F.rms_norm(x, (d,), w, 1e-6),
                      lambda: rt.rms_norm(x, w, 1e-6)),
                     ("layer_norm", lambda: F.layer_norm(x, (d,), w, b),
                      lambda: rt.layer_norm(x, w, b))]
        for name, theirs, mine in functions:
            with torch.no_grad():
                t, r = per_call([theirs, mine], args.repeats, args.calls)
            print(f"| {name} | {d} | no_grad | {t * 1e6:.2f} | {r * 1e6:.2f} | {r / t:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
