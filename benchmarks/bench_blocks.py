"""One training step (forward + backward) of a Pre-Norm Transformer stack: resnorm.nn vs PyTorch.

The model: 4 PreNormBlocks (LayerNorm, GELU, causal attention, dropout 0) with a final
LayerNorm, d_model=256, 4 heads, d_ff=1024, T=128, batch 8, float32.  PyTorch runs the same
model (torch.nn.TransformerEncoder of TransformerEncoderLayer(norm_first=True, batch_first=True)
with the same weights) on the same thread count.  Both are timed in the same run, interleaved
step by step (resnorm.bench.time_interleaved), and medians are reported.

Also reported, for resnorm: the share of the step spent outside BLAS (gemm calls timed in
resnorm_c/blas_timer.h), time per module kind (--profile), and the peak memory of one step
(tracemalloc, which sees every NumPy allocation) next to the bytes of the activations the
step caches for backward.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=src python benchmarks/bench_blocks.py
"""
import argparse
import dataclasses
import time
import tracemalloc
from collections import defaultdict

import numpy as np

from resnorm import _layers
from resnorm.bench import time_interleaved
from resnorm.nn import TransformerStack


def build(args, dtype=np.float32):
    model = TransformerStack(args.layers, args.d_model, args.heads, args.d_ff, block="pre",
                             norm="layer", dropout=0.0, causal=True, activation="gelu",
                             dtype=dtype, seed=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((args.batch, args.seq, args.d_model)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    return model, x, dy


def resnorm_step(model, x, dy):
    model.zero_grad()
    model.forward(x)
    model.backward(dy)


def build_torch(torch, args, model, x, dy):
    layer = torch.nn.TransformerEncoderLayer(args.d_model, args.heads, args.d_ff, dropout=0.0,
                                             activation="gelu", batch_first=True,
                                             norm_first=True)
    tmodel = torch.nn.TransformerEncoder(layer, args.layers, norm=torch.nn.LayerNorm(args.d_model),
                                         enable_nested_tensor=False)
    tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    tx = torch.from_numpy(x).requires_grad_(True)
    tdy = torch.from_numpy(dy)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(args.seq)

    def step():
        tmodel.zero_grad(set_to_none=True)
        tx.grad = None
        tmodel(tx, mask=mask, is_causal=True).backward(tdy)

    return step


# --------------------------------------------------------------------------- memory

def _arrays(obj):
    """Every ndarray reachable from a cache entry (tuples, dataclasses, arrays)."""
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _arrays(o)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _arrays(getattr(obj, f.name))


def _modules(m):
    yield m
    for child in m._children.values():
        yield from _modules(child)


def cached_bytes(model):
    """Bytes of the distinct buffers the modules hold for backward (views counted once)."""
    buffers = {}
    for m in _modules(model):
        for a in _arrays(getattr(m, "_cache", None)):
            base = a if a.base is None else a.base
            while isinstance(base, np.ndarray) and base.base is not None:
                base = base.base
            key = base.__array_interface__["data"][0] if isinstance(base, np.ndarray) else id(a)
            buffers[key] = max(buffers.get(key, 0), a.nbytes)
    return sum(buffers.values())


def memory_report(model, x, dy):
    """(peak bytes allocated during one step, bytes cached after forward)."""
    resnorm_step(model, x, dy)          # warm: optimizer-free, grads already allocated
    model.zero_grad()
    tracemalloc.start()
    model.forward(x)
    cached = cached_bytes(model)
    model.backward(dy)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, cached


# --------------------------------------------------------------------------- profile

def profile(model, x, dy, steps):
    """Seconds per step in each module kind's own forward/backward (children excluded)."""
    totals = defaultdict(float)
    stack = []
    originals = []

    def wrap(m, name):
        fn = getattr(m, name)

        def timed(*a, **k):
            stack.append(0.0)
            t0 = time.perf_counter()
            r = fn(*a, **k)
            dt = time.perf_counter() - t0
            inner = stack.pop()
            totals[(type(m).__name__, name)] += dt - inner
            if stack:
                stack[-1] += dt
            return r

        originals.append((m, name))
        setattr(m, name, timed)

    for m in _modules(model):
        wrap(m, "forward")
        wrap(m, "backward")
    for _ in range(steps):
        resnorm_step(model, x, dy)
    for m, name in originals:
        delattr(m, name)
    return {k: v / steps for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def blas_share(model, x, dy, steps, threads):
    """(median step seconds, fraction of the step's thread time spent inside gemm).

    gemm calls run inside our parallel loops, several at once: the timer adds up the time of
    every call on every thread, which is divided by threads x wall time (exact for one
    thread; with more it counts idle waits at the end of a loop as time outside BLAS)."""
    _layers.blas_timer(True)
    times, inside = [], []
    for _ in range(steps):
        _layers.blas_seconds(reset=True)
        t0 = time.perf_counter()
        resnorm_step(model, x, dy)
        times.append(time.perf_counter() - t0)
        inside.append(_layers.blas_seconds() / threads)
    _layers.blas_timer(False)
    return float(np.median(times)), float(np.median(np.array(inside) / np.array(times)))


# --------------------------------------------------------------------------- main

def _line(label, times):
    line = f"{label}: resnorm {times[0] * 1e3:.1f} ms"
    if len(times) > 1:
        line += f", torch {times[1] * 1e3:.1f} ms, resnorm/torch = {times[0] / times[1]:.2f}"
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--profile", action="store_true", help="time per module kind")
    ap.add_argument("--blocked", action="store_true",
                    help="also time each framework alone, in its own block of repeats (the "
                         "other's OpenMP threads may still spin right after its steps when "
                         "interleaved)")
    args = ap.parse_args()

    from threadpoolctl import threadpool_limits
    try:
        import torch
    except ImportError:
        torch = None
    if args.no_torch:
        torch = None

    model, x, dy = build(args)
    tstep = None if torch is None else build_torch(torch, args, model, x, dy)
    step = lambda: resnorm_step(model, x, dy)
    print(f"# {args.layers} Pre-Norm blocks, d={args.d_model}, heads={args.heads}, "
          f"d_ff={args.d_ff}, T={args.seq}, batch={args.batch}, float32, forward+backward")
    for t in args.threads:
        with threadpool_limits(limits=t):
            if torch is not None:
                torch.set_num_threads(t)
            fns = [step] + ([tstep] if tstep else [])
            times = time_interleaved(fns, args.repeats, warmup=3)
            print(_line(f"threads={t} interleaved", times))
            if args.blocked:
                alone = [time_interleaved([f], args.repeats, warmup=3)[0] for f in fns]
                print(_line(f"threads={t} blocked", alone))
            t_step, share = blas_share(model, x, dy, args.repeats, t)
            print(f"  resnorm step {t_step * 1e3:.1f} ms, inside BLAS {share:.0%}, "
                  f"outside BLAS {1 - share:.0%}")
            if args.profile:
                for (kind, fn), sec in profile(model, x, dy, 5).items():
                    print(f"    {kind:>20}.{fn:<8} {sec * 1e3:7.2f} ms")
    peak, cached = memory_report(model, x, dy)
    print(f"memory of one step: tracemalloc peak {peak / 2**20:.1f} MiB; activations cached "
          f"for backward {cached / 2**20:.1f} MiB (ratio {peak / cached:.2f})")


if __name__ == "__main__":
    main()
