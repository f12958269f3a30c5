"""How far the residual stream of a Pre-Norm stack drifts when it is stored in bfloat16
(or float16) instead of float32: a 40-layer stack run three times on the same input and
weights, in float64 (the reference), float32 and the 16-bit dtype, and the relative
distance of each one's residual stream from float64's printed every few layers.

Each layer is  y, h = add_rms_norm(branch, h, weight)  (the residual add rounded once into
the stream's dtype, the norm of the sum) followed by  branch = (y @ W) * scale,  a fixed
random linear map standing in for attention and MLP.  The matmul runs in float32 for the
16-bit dtypes (as BLAS does) and its result is rounded to the dtype: every value the
stack stores is stored in that dtype.  A fourth run keeps the branches in bfloat16 but the
residual stream (and the norm) in float32: the difference is what storing the stream in
bfloat16 costs.  Accuracy only; nothing is timed.

    python benchmarks/half_drift.py [--layers 40] [--width 512] [--rows 64] [--seed 0]
"""
import argparse

import numpy as np

import resnorm


def dtypes():
    out = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
    try:
        import ml_dtypes
        out["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        pass
    return out


def run(dtype, x, weights, gains, scale, stream=None):
    """The residual stream after each layer, as float64.  stream: the dtype the residual
    stream (and the norm) is kept in, when it is not dtype (the branches still round
    their input and output to dtype)."""
    compute = np.float64 if dtype == np.float64 else np.float32
    stream = dtype if stream is None else stream
    h = x.astype(stream)
    branch = np.zeros_like(h)
    streams = []
    for W, g in zip(weights, gains):
        y, h = resnorm.add_rms_norm(branch, h, g.astype(stream))
        y = y.astype(dtype).astype(compute)
        branch = ((y @ W.astype(compute)) * scale).astype(dtype).astype(stream)
        streams.append(h.astype(np.float64))
    return streams


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    d = args.width
    x = rng.standard_normal((args.rows, d))
    weights = [rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(args.layers)]
    gains = [1 + 0.1 * rng.standard_normal(d) for _ in range(args.layers)]
    scale = 0.5   # each branch adds about half the stream's unit scale
    ref = run(np.dtype(np.float64), x, weights, gains, scale)
    results = {name: run(dt, x, weights, gains, scale) for name, dt in dtypes().items()}
    if "bfloat16" in results:   # the branches in bfloat16, the stream kept in float32
        results["bf16 (f32 h)"] = run(dtypes()["bfloat16"], x, weights, gains, scale,
                                      np.dtype(np.float32))
    names = list(results)
    print(f"Pre-Norm stack, {args.layers} layers, {args.rows} rows of {d}, seed {args.seed}: "
          f"relative distance of the residual stream from float64's, ||h - h64|| / ||h64||")
    print(f"{'layer':>5}  {'|h64| rms':>9}  " + "  ".join(f"{n:>12}" for n in names))
    for layer in range(args.layers):
        if layer + 1 in (1, 2, 5) or (layer + 1) % 5 == 0:
            r = ref[layer]
            rms = np.sqrt(np.mean(r * r))
            cells = [np.linalg.norm(results[n][layer] - r) / np.linalg.norm(r) for n in names]
            print(f"{layer + 1:>5}  {rms:>9.3g}  " + "  ".join(f"{c:>12.2e}" for c in cells))
    for n in names:
        eps = float(np.finfo(np.float32).eps) if n == "float32" else (
            2.0 ** -10 if n == "float16" else 2.0 ** -7)
        final = np.linalg.norm(results[n][-1] - ref[-1]) / np.linalg.norm(ref[-1])
        print(f"{n}: after {args.layers} layers {final:.2e} = {final / eps:.1f} x its epsilon "
              f"{eps:.3g}")


if __name__ == "__main__":
    main()
