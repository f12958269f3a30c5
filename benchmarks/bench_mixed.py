"""Norms of 16-bit rows with float32 parameters (torch's mixed precision, as under
torch.autocast) against the same rows with 16-bit parameters and against torch.

For each shape, 16-bit dtype and thread count, the median time (ms) of:

* resnorm, float32 parameters: rms_norm / layer_norm (out= given), and their backward
  from a training forward's cache (out= given), in NumPy;
* resnorm, 16-bit parameters: the same calls with the parameters rounded to the dtype;
* the fused add + norm the same ways (add_rms_norm / add_layer_norm with out= and
  residual_out=, and their backward), and NumPy's unfused way with float32 parameters:
  x + residual in the 16-bit dtype, then the norm;
* torch: a float32 torch.nn.RMSNorm / LayerNorm given the 16-bit tensor, forward under
  no_grad and forward + backward, and resnorm.torch's modules the same way; and under
  no_grad, x + residual then the float32 module;
* with --compile, torch.compile of the torch rows (Inductor, warmed up before timing); as
  Inductor fixes its thread count when it compiles, --compile takes one --threads value
  (run one process per thread count);
* np.copyto of the 16-bit rows: the memory floor of one read and one write.

All rows of a shape are timed round-robin (resnorm.bench.time_interleaved), so they see
the same machine noise; numbers are to be read on a quiet machine.

    PYTHONPATH=src python benchmarks/bench_mixed.py [--shapes 2048x4096,2048x768]
        [--threads 1,2] [--dtypes bfloat16,float16] [--repeats 9] [--compile] [--quick]

--quick: one small shape and few repeats, to check that the script runs.
"""
import argparse
import warnings

import numpy as np
import torch

import resnorm
import resnorm.torch as rt
from resnorm.bench import machine_info, time_interleaved


def numpy_dtype(name):
    if name == "float16":
        return np.dtype(np.float16)
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def rows_for(shape, name, nt, compiled=False):
    """(label, function) of every timed row at this shape, dtype and thread count
    (compiled: with the torch.compile rows)."""
    dt, tdt = numpy_dtype(name), getattr(torch, name)
    n, d = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    dy = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    w32 = (1 + 0.5 * rng.standard_normal(d)).astype(np.float32)
    b32 = rng.standard_normal(d).astype(np.float32)
    w16, b16 = w32.astype(dt), b32.astype(dt)
    r = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    out, dst, hout = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    caches = {(layer, bits): (resnorm.layer_norm_forward(x, w, b)[1] if layer
                              else resnorm.rms_norm_forward(x, w)[1])
              for layer in (False, True) for bits, (w, b) in ((32, (w32, b32)), (16, (w16, b16)))}
    rows = [("np.copyto", lambda: np.copyto(dst, x))]
    for layer in (False, True):
        name_ = "layer_norm" if layer else "rms_norm"
        for bits, (w, b) in ((32, (w32, b32)), (16, (w16, b16))):
            args = (w, b) if layer else (w,)
            fwd = resnorm.layer_norm if layer else resnorm.rms_norm
            bwd = resnorm.layer_norm_backward if layer else resnorm.rms_norm_backward
            cache = caches[layer, bits]
            params = "float32" if bits == 32 else name
            rows.append((f"resnorm {name_}, {params} params",
                         lambda f=fwd, a=args: f(x, *a, out=out, n_threads=nt)))
            rows.append((f"resnorm {name_}_backward, {params} params",
                         lambda f=bwd, c=cache: f(dy, c, out=out, n_threads=nt)))
            add = resnorm.add_layer_norm if layer else resnorm.add_rms_norm
            add_fwd = getattr(resnorm, f"add_{name_}_forward")
            add_bwd = getattr(resnorm, f"add_{name_}_backward")
            add_cache = add_fwd(x, r, *args)[1]
            rows.append((f"resnorm add_{name_}, {params} params",
                         lambda f=add, a=args: f(x, r, *a, out=out, residual_out=hout,
                                                 n_threads=nt)))
            rows.append((f"resnorm add_{name_}_backward, {params} params",
                         lambda f=add_bwd, c=add_cache: f(dy, dy, c, out=out,
                                                          dresidual_out=dst, n_threads=nt)))
        args = (w32, b32) if layer else (w32,)
        rows.append((f"NumPy x + r, then resnorm {name_}, float32 params",
                     lambda f=fwd, a=args: f(np.add(x, r, out=hout), *a, out=out,
                                             n_threads=nt)))
    xt = torch.from_numpy(x.view(np.int16)).view(tdt)
    dyt = torch.from_numpy(dy.view(np.int16)).view(tdt)
    rt_ = torch.from_numpy(r.view(np.int16)).view(tdt)
    xg = xt.clone().requires_grad_()
    for layer in (False, True):
        for lib, cls in (("torch", nn_class(layer)), ("resnorm.torch", rt_class(layer))):
            m = cls(d)
            with torch.no_grad():
                m.weight.copy_(torch.from_numpy(w32))
                if layer:
                    m.bias.copy_(torch.from_numpy(b32))
            label = f"{lib} {'LayerNorm' if layer else 'RMSNorm'} (float32)"
            rows.append((label + " forward", lambda m=m: no_grad(m, xt)))
            rows.append((label + " forward + backward", lambda m=m: train(m, xg, dyt)))
            if lib == "torch":
                rows.append((f"torch x + r, then {label[6:]} forward",
                             lambda m=m: no_grad(m, xt + rt_)))
                if compiled:
                    rows += compiled_rows(label[6:], m, xt, xg, dyt, rt_)
    return rows


def compiled_rows(label, m, xt, xg, dyt, r):
    """torch.compile of the torch rows, each called once before timing (compiles it)."""
    fwd = torch.compile(lambda x: m(x))
    add = torch.compile(lambda x, r: m(x + r))
    rows = [(f"torch.compile {label} forward", lambda: no_grad(fwd, xt)),
            (f"torch.compile {label} forward + backward", lambda: train(fwd, xg, dyt, m)),
            (f"torch.compile x + r, then {label} forward", lambda: no_grad(add, xt, r))]
    for _, f in rows:
        f()
    return rows


def nn_class(layer):
    return torch.nn.LayerNorm if layer else (lambda d: torch.nn.RMSNorm(d, eps=1e-6))


def rt_class(layer):
    return rt.LayerNorm if layer else (lambda d: rt.RMSNorm(d, eps=1e-6))


def no_grad(m, *x):
    with torch.no_grad():
        return m(*x)


def train(m, x, dy, module=None):
    """Forward and backward of m (a module, or a compiled call of `module`)."""
    m(x).backward(dy)
    x.grad = None
    (module or m).zero_grad(set_to_none=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="2048x4096,2048x768")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--compile", action="store_true",
                        help="also torch.compile of the torch rows (one --threads value)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.shapes, args.threads, args.repeats = "64x256", "1", 3
    if args.compile and "," in args.threads:
        parser.error("--compile takes one --threads value (Inductor fixes its thread count "
                     "when it compiles): run one process per thread count")
    warnings.simplefilter("ignore")   # torch: "Mismatch dtype between input and weight"
    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores, resnorm level {info['simd_level']}, "
          f"torch {torch.__version__}")
    for nt in map(int, args.threads.split(",")):
        torch.set_num_threads(nt)
        for name in args.dtypes.split(","):
            for shape in args.shapes.split(","):
                shape = tuple(map(int, shape.split("x")))
                rows = rows_for(shape, name, nt, args.compile)
                times = time_interleaved([f for _, f in rows], args.repeats)
                print(f"\n## {shape[0]}x{shape[1]} {name}, {nt} thread(s): median ms")
                for (label, _), t in zip(rows, times):
                    print(f"{label:58s} {t * 1e3:9.3f}")


if __name__ == "__main__":
    main()
