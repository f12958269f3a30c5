"""Fused Pre-Norm add + RMSNorm against its memory limit, our own separate kernels, dropout
and PyTorch CPU, in one interleaved run.

For each shape (float32) and thread count, these are timed round-robin, repeat by repeat
(resnorm.bench.time_interleaved; medians):

  fused       resnorm.add_rms_norm(x, r, w, out=y, residual_out=h)   reads x, r; writes h, y
  fused_drop  the same with p = 0.1 (Philox-4x32-10 mask)
  separate    resnorm.scaled_residual(x, r, 1.0, out=h) then resnorm.rms_norm(h, w, out=y)
  copy        np.copyto of one array: the bandwidth reference (NumPy: one thread)
  torch       F.rms_norm(x + r, ...) with torch.set_num_threads(threads), when installed

and reported as: fused GB/s over its four streams and that / copy GB/s (target >= 0.8);
separate / fused time (target >= 1.25); fused_drop / fused time (target <= 1.3); torch
GB/s over the same four streams / copy GB/s.  The machine may be shared: compare ratios
from one run, not absolute times across runs.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=src \\
        python benchmarks/bench_residual.py [--repeats N] [--threads 1 2] [--json out.json]
"""
import argparse
import json

import numpy as np

import resnorm as rn
from resnorm.bench import machine_info, time_interleaved

SHAPES = [(2048, 4096), (16384, 1024)]


def measure(shape, threads, repeats, torch):
    rng = np.random.default_rng(0)
    x, r, src = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    w = (1 + 0.1 * rng.standard_normal(shape[1])).astype(np.float32)
    y, h, dst = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    fns = {
        "fused": lambda: rn.add_rms_norm(x, r, w, out=y, residual_out=h, n_threads=threads),
        "fused_drop": lambda: rn.add_rms_norm(x, r, w, p=0.1, seed=1, out=y, residual_out=h,
                                              n_threads=threads),
        "separate": lambda: (rn.scaled_residual(x, r, 1.0, out=h, n_threads=threads),
                             rn.rms_norm(h, w, out=y, n_threads=threads)),
        "copy": lambda: np.copyto(dst, src),
    }
    if torch is not None:
        torch.set_num_threads(threads)
        tx, tr, tw = torch.from_numpy(x), torch.from_numpy(r), torch.from_numpy(w)
        fns["torch"] = lambda: torch.nn.functional.rms_norm(tx + tr, (shape[1],), tw, 1e-6)
    t = dict(zip(fns, time_interleaved(list(fns.values()), repeats)))
    copy_gbps = 2 * x.nbytes / t["copy"] / 1e9
    row = {"shape": list(shape), "threads": threads,
           "ms": {k: v * 1e3 for k, v in t.items()},
           "copy_gbps": copy_gbps,
           "fused_gbps": 4 * x.nbytes / t["fused"] / 1e9,
           "separate_over_fused": t["separate"] / t["fused"],
           "dropout_over_fused": t["fused_drop"] / t["fused"]}
    row["fused_x_copy"] = row["fused_gbps"] / copy_gbps
    if "torch" in t:
        row["torch_x_copy"] = 4 * x.nbytes / t["torch"] / 1e9 / copy_gbps
        row["torch_over_fused"] = t["torch"] / t["fused"]
    return row


def table(rows):
    lines = ["| shape | threads | fused ms | fused GB/s | x copy (>= 0.8) | separate/fused "
             "(>= 1.25) | drop/fused (<= 1.3) | torch x copy | torch/fused |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tx = f"{r['torch_x_copy']:.2f}" if "torch_x_copy" in r else "-"
        tf = f"{r['torch_over_fused']:.2f}x" if "torch_over_fused" in r else "-"
        lines.append(f"| {r['shape'][0]}x{r['shape'][1]} | {r['threads']} | "
                     f"{r['ms']['fused']:.2f} | {r['fused_gbps']:.1f} | {r['fused_x_copy']:.2f} | "
                     f"{r['separate_over_fused']:.2f}x | {r['dropout_over_fused']:.2f}x | "
                     f"{tx} | {tf} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
    rows = [measure(s, t, args.repeats, torch) for s in SHAPES for t in args.threads]
    info = machine_info()
    print(f"# fused Pre-Norm add + RMSNorm, float32: {info['cpu']}, {info['cores']} cores, "
          f"simd={info['simd_level']}, torch={info['torch']}\n")
    print(table(rows))
    print("\nx copy: GB/s over the op's four streams / np.copyto GB/s (one thread), same run; "
          "medians of interleaved repeats.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
