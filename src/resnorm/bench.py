"""The benchmark runner behind ``python -m resnorm bench``.

For each (op, shape, dtype, threads) it times, in the same run and interleaved repeat by
repeat, so that all see the same machine state:

* resnorm's kernel (with a preallocated output where the op allows it),
* the same computation written in NumPy in the input dtype (what a NumPy user would write),
* PyTorch CPU on the same thread count, when torch is installed,
* ``np.copyto`` of the op's output bytes: the bandwidth reference.

Times are medians after warm-up.  GB/s counts the op's minimum traffic (each input read
once, each output written once); "x copy" is that bandwidth divided by copy bandwidth.
The ops are memory-bound, so x copy near 1 means the kernel runs at the memory limit.
"""
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from . import _bench_residual, _runtime
from . import norms

QUICK_SHAPES = [(8, 768), (2048, 4096)]
FULL_SHAPES = [(1, 4096), (8, 768), (2048, 4096), (8192, 4096), (16384, 1024)]


@dataclass
class Row:
    op: str
    shape: tuple
    dtype: str
    threads: int
    resnorm_us: float
    gbps: float
    x_copy: float
    numpy_us: float
    torch_us: float | None
    copy_us: float

    @property
    def vs_numpy(self):
        return self.numpy_us / self.resnorm_us

    @property
    def vs_torch(self):
        return None if self.torch_us is None else self.torch_us / self.resnorm_us


# --------------------------------------------------------------------------- the ops

def _numpy_rms(x, w, eps):
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)).astype(x.dtype) * w


def _numpy_layer(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    c = x - mean
    return c * (1.0 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)).astype(x.dtype) * w + b


def _numpy_rms_backward(dy, x, w, rstd):
    xn = x * rstd[:, None]
    g = dy * w
    dx = rstd[:, None] * (g - xn * np.mean(g * xn, axis=-1, keepdims=True))
    return dx, (dy * xn).sum(axis=0)


def _numpy_layer_backward(dy, x, w, mean, rstd):
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * w
    dx = rstd[:, None] * (g - g.mean(axis=-1, keepdims=True)
                          - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def _setup(op, shape, dtype, threads, torch):
    """(resnorm_fn, numpy_fn, torch_fn or None, output array, min traffic bytes) for one case."""
    if op in _bench_residual.OPS:
        return _bench_residual.setup(op, shape, dtype, threads, torch)
    rng = np.random.default_rng(0)
    n, d = shape
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
    b = (0.1 * rng.standard_normal(d)).astype(dtype)
    out = np.empty_like(x)
    item = x.dtype.itemsize
    tx = tw = tb = tdy = None
    if torch is not None:
        tx = torch.from_numpy(x).requires_grad_(op.endswith("backward"))
        tw = torch.from_numpy(w).requires_grad_(op.endswith("backward"))
        tb = torch.from_numpy(b).requires_grad_(op.endswith("backward"))
        tdy = torch.from_numpy(dy)
    F = None if torch is None else torch.nn.functional
    if op == "rms_norm":
        fn = lambda: norms.rms_norm(x, w, 1e-6, out=out, n_threads=threads)
        ref = lambda: _numpy_rms(x, w, 1e-6)
        tfn = None if torch is None else (lambda: F.rms_norm(tx, (d,), tw, 1e-6))
        return fn, ref, tfn, out, 2 * x.nbytes + w.nbytes
    if op == "layer_norm":
        fn = lambda: norms.layer_norm(x, w, b, 1e-5, out=out, n_threads=threads)
        ref = lambda: _numpy_layer(x, w, b, 1e-5)
        tfn = None if torch is None else (lambda: F.layer_norm(tx, (d,), tw, tb, 1e-5))
        return fn, ref, tfn, out, 2 * x.nbytes + 2 * w.nbytes
    if op == "rms_norm_backward":
        _, cache = norms.rms_norm_forward(x, w, 1e-6)
        fn = lambda: norms.rms_norm_backward(dy, cache, out=out, n_threads=threads)
        rstd = cache.rstd.astype(dtype)
        ref = lambda: _numpy_rms_backward(dy, x, w, rstd)
        tfn = None
        if torch is not None:
            ty = F.rms_norm(tx, (d,), tw, 1e-6)
            tfn = lambda: torch.autograd.grad(ty, (tx, tw), tdy, retain_graph=True)
        return fn, ref, tfn, out, 3 * x.nbytes + 2 * w.nbytes + n * 8
    if op == "layer_norm_backward":
        _, cache = norms.layer_norm_forward(x, w, b, 1e-5)
        fn = lambda: norms.layer_norm_backward(dy, cache, out=out, n_threads=threads)
        mean, rstd = cache.mean.astype(dtype), cache.rstd.astype(dtype)
        ref = lambda: _numpy_layer_backward(dy, x, w, mean, rstd)
        tfn = None
        if torch is not None:
            ty = F.layer_norm(tx, (d,), tw, tb, 1e-5)
            tfn = lambda: torch.autograd.grad(ty, (tx, tw, tb), tdy, retain_graph=True)
        return fn, ref, tfn, out, 3 * x.nbytes + 3 * w.nbytes + 2 * n * 8
    raise ValueError(f"unknown op {op!r}")


OPS = ["rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward"] + _bench_residual.OPS


# --------------------------------------------------------------------------- timing

def _repeats_for(nbytes, quick):
    """Enough repeats for a stable median, fewer for big arrays."""
    if nbytes > 64 << 20:
        return 5 if quick else 9
    if nbytes > 4 << 20:
        return 9 if quick else 21
    return 51 if quick else 201


def time_interleaved(fns, repeats, warmup=2):
    """Median seconds of each function, timed round-robin so that all see the same noise."""
    for _ in range(warmup):
        for f in fns:
            f()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for t, f in zip(times, fns):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in times]


def run_case(op, shape, dtype, threads, torch=None, quick=False):
    fn, ref, tfn, out, traffic = _setup(op, shape, dtype, threads, torch)
    src = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    copy = lambda: np.copyto(out, src)
    fns = [fn, ref, copy] + ([tfn] if tfn is not None else [])
    if torch is not None:
        torch.set_num_threads(threads)
    times = time_interleaved(fns, _repeats_for(src.nbytes, quick))
    t_res, t_np, t_copy = times[:3]
    copy_gbps = 2 * src.nbytes / t_copy / 1e9
    gbps = traffic / t_res / 1e9
    return Row(op, tuple(shape), np.dtype(dtype).name, threads, t_res * 1e6, gbps,
               gbps / copy_gbps, t_np * 1e6, times[3] * 1e6 if tfn is not None else None,
               t_copy * 1e6)


# --------------------------------------------------------------------------- reporting

def machine_info():
    """What the numbers were measured on."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "simd_level": _runtime.simd_level(),
        "openmp": _runtime.openmp_enabled(),
        "omp_max_threads": _runtime.get_max_threads(),
        "build_flags": _runtime.build_flags(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch_version,
        "platform": platform.platform(),
    }


def markdown_table(rows):
    head = ("| op | shape | dtype | threads | resnorm us | GB/s | x copy | vs numpy | vs torch |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        vt = "-" if r.vs_torch is None else f"{r.vs_torch:.2f}x"
        lines.append(f"| {r.op} | {r.shape[0]}x{r.shape[1]} | {r.dtype} | {r.threads} | "
                     f"{r.resnorm_us:.1f} | {r.gbps:.1f} | {r.x_copy:.2f} | "
                     f"{r.vs_numpy:.2f}x | {vt} |")
    return head + "\n".join(lines) + "\n"


def _progress(i, total, label):
    width = 30
    filled = int(width * i / total)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {i}/{total} {label:<40}")
    sys.stderr.flush()
    if i == total:
        sys.stderr.write("\n")


def run(ops=OPS, shapes=None, dtypes=("float32",), threads=(1, 2), quick=False,
        use_torch=True, json_path=None, progress=True):
    """Runs every case; returns the rows (and writes JSON when json_path is given)."""
    shapes = shapes or (QUICK_SHAPES if quick else FULL_SHAPES)
    torch = None
    if use_torch:
        try:
            import torch
        except ImportError:
            torch = None
    cases = [(op, s, dt, t) for op in ops for s in shapes for dt in dtypes for t in threads]
    rows = []
    for i, (op, s, dt, t) in enumerate(cases):
        if progress:
            _progress(i, len(cases), f"{op} {s[0]}x{s[1]} {dt} t={t}")
        rows.append(run_case(op, s, dt, t, torch=torch, quick=quick))
    if progress:
        _progress(len(cases), len(cases), "done")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": machine_info(), "rows": [asdict(r) for r in rows]}, f,
                      indent=1)
    return rows
