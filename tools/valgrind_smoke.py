"""A small workout of every public kernel function, for tools/valgrind.sh.

Every entry of tests/api_table.OPS on: both dtypes; with and without weight / bias
(the residual and dropout functions: one or the other per shape, to keep memcheck's time);
float16 and bfloat16 (with ml_dtypes) where a function takes them, and with float32
weight and bias where a norm takes them beside 16-bit rows; learnable per-channel,
learnable scalar and fixed alpha; dropout on and off; full and
per-channel gates; D = 1, 7, 33 and 300; no rows; rank 1 and 3; strided, misaligned and
read-only inputs; out= and residual_out= where a function has them; 1, 2 and 3 threads
with the size thresholds forced down, so that tiny inputs run parallel and stream their
stores; rows taking the kernels' rare paths (beyond the double range, spanning past
FLT_MAX, constant, NaN; for the fused ops, as h); and a few refused calls.  Checks nothing itself but that the outputs are
what a plain call gives: valgrind memcheck does the checking.

    python tools/valgrind_smoke.py                  the whole workout
    python tools/valgrind_smoke.py --part=threads   all but the layouts on forced-parallel
    python tools/valgrind_smoke.py --part=layouts   all but 1 and 3 threads on forced-parallel

tools/valgrind.sh runs one part at each of two SIMD levels, in parallel: the thread splits
and the layout copies do not depend on the level, so each is checked at one of them, and
the two parts take about the same time under memcheck (the whole workout at one level took
most of the stage's time while the other level's run sat finished).
"""
import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from api_table import OPS, layouts, make_inputs, with_data  # noqa: E402

import resnorm  # noqa: E402
from resnorm import _parallel  # noqa: E402


def rare_rows(rng, dtype, d):
    """(inputs, the data their rows should carry: see api_table.with_data)."""
    inp = make_inputs(rng, (6, d), dtype)
    values = rng.standard_normal((6, d)).astype(dtype)
    top = np.finfo(dtype).max
    values[0] = 0.9 * top * np.where(np.arange(d) % 2, 1, -1)
    values[1] = 7.0
    values[2] *= 1e300 if dtype == np.float64 else 1e37
    values[3, d // 2] = np.nan
    return inp, values


def half_dtypes():
    """float16, and bfloat16 when ml_dtypes is installed."""
    try:
        import ml_dtypes
    except ImportError:  # an optional extra: the bfloat16 paths then go unchecked here
        return [np.dtype(np.float16)]
    return [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


def takes(op, inp):
    """Whether op takes inp's dtype (the 16-bit types are refused by some functions)."""
    try:
        op.run(inp)
    except TypeError:
        return False
    return True


# --part: (forced parallel and streaming?, the thread counts to run, the input layouts too?)
PARTS = {"all": ((False, (None,), True), (True, (1, 2, 3), True)),
         "threads": ((False, (None,), True), (True, (1, 2, 3), False)),
         "layouts": ((False, (None,), True), (True, (2,), True))}


def main(part="all"):
    settings = PARTS[part]
    rng = np.random.default_rng(61)
    cases, rare = [], []
    for dtype in (np.float32, np.float64):
        for shape in [(3, 1), (2, 7), (5, 33), (4, 300), (0, 5), (9,), (2, 3, 17)]:
            cases.append(make_inputs(rng, shape, dtype))
            cases.append(make_inputs(rng, shape, dtype, weight=False, bias=False,
                                     alpha=["scalar", "fixed"][len(cases) % 2], p=0.0,
                                     gate="channel"))
        rare.append(rare_rows(rng, dtype, 45))
    halves = [make_inputs(rng, shape, dtype, weight=w, bias=w, gate=gate)
              for dtype in half_dtypes()
              for shape, w, gate in [((3, 1), True, "full"), ((5, 33), False, "channel"),
                                     ((4, 300), True, "full"), ((2, 3, 17), True, "channel")]]
    # float32 parameters beside 16-bit rows (mixed precision: the norms and the fused add + norm)
    mixed = [dataclasses.replace(h, weight=h.weight.astype(np.float32),
                                 bias=h.bias.astype(np.float32))
             for h in halves if h.weight is not None and h.bias is not None]
    calls = 0
    with np.errstate(all="ignore"):
        for parallel, nts, with_layouts in settings:
            _parallel.PARALLEL_MIN_ELEMENTS = 0 if parallel else 1 << 15
            _parallel.STREAM_MIN_BYTES = 0 if parallel else 8 << 20
            for op in OPS.values():
                forward = OPS[op.forward] if op.form == "backward" else op
                # the residual and dropout functions: one of the two variants per shape
                mine = cases if op.norm and not op.fused else cases[len(op.name) % 2::2]
                mine = mine + [h for h in halves if takes(op, h)]
                mine += mixed if op.norm else []
                for inp in mine + [with_data(forward, i, v, split=True) for i, v in rare]:
                    for nt in nts:
                        want = op.run(inp, n_threads=nt)
                        # each buffer as its output (a per-channel gate's gradient is (D,))
                        buffers = {b: np.empty_like(want[name]) for b, name in op.buffers.items()}
                        got = op.run(inp, n_threads=nt, **buffers)
                        for name in op.buffers.values():
                            assert np.array_equal(got[name], want[name], equal_nan=True)
                        calls += 2
                    arg = op.arrays[0]
                    for view in layouts(getattr(inp, arg)).values() if with_layouts else ():
                        op.run(dataclasses.replace(inp, **{arg: view}))
                        calls += 1
                try:
                    op.fn(**{**op.kwargs(cases[0]), op.arrays[0]: np.ones((2, 2), np.int32)})
                except TypeError:
                    calls += 1
    print(f"valgrind_smoke ({part}): {calls} calls of {len(OPS)} functions at SIMD level "
          f"{resnorm.simd_level()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A workout of every kernel for memcheck.")
    parser.add_argument("--part", choices=PARTS, default="all")
    main(parser.parse_args().part)
