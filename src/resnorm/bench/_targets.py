"""The performance targets of issue 5, read off the measured rows: MET or NOT MET with the
measured value.  Nothing here measures; a target whose row was not measured in the run is
left out (and counted in `missing`).

* bandwidth (float32, the large shapes, 1 and 2 threads): achieved GB/s of the op's
  minimum traffic / np.copyto GB/s of the same bytes, same rounds; forward kernels >= 0.85,
  backward >= 0.7, fused Pre-Norm add + norm >= 0.8.  Read from the preallocated-output
  row (the allocating row for ops that always allocate).
* against PyTorch (same shapes and threads): torch time / resnorm time.  Judged on the
  allocating row, like for like (torch allocates its outputs); the preallocated row's
  ratio is shown next to it.
* small call: microseconds per (1, 4096) float32 forward from Python with a preallocated
  output, argument checks included.
"""
from dataclasses import dataclass

from . import _cases
from ._cases import BACKWARD, FORWARD, FUSED_PRENORM

SHAPES = [(2048, 4096), (16384, 1024)]
THREADS = [1, 2]
DTYPE = "float32"
X_COPY = {FORWARD: 0.85, BACKWARD: 0.70, FUSED_PRENORM: 0.80}
# the kernels the issue names; the thresholds of their kind apply to every other op measured
NAMED_OPS = ["rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward",
             "add_rms_norm"]
VS_TORCH = {"rms_norm": 3.0, "layer_norm": 1.5, "rms_norm_backward": 5.0,
            "layer_norm_backward": 2.0}
SMALL_CALL_US = {"rms_norm": 3.0, "layer_norm": 3.0}


@dataclass
class Target:
    target: str             # e.g. "forward >= 0.85 x copy"
    op: str
    shape: tuple
    threads: int | None     # None for the small-call target
    measured: float | None  # None: not measured in this run
    threshold: float
    note: str = ""

    @property
    def status(self):
        if self.measured is None:
            return "NOT MEASURED"
        met = (self.measured <= self.threshold if self.target.startswith("small call")
               else self.measured >= self.threshold)
        return "MET" if met else "NOT MET"


def _row(rows, op, shape, threads, preallocated):
    for r in rows:
        if (r.op, tuple(r.shape), r.dtype, r.threads, r.preallocated) == (
                op, shape, DTYPE, threads, preallocated):
            return r
    return None


def _bandwidth(rows, op, shape, threads):
    kind = _cases.kind(op)
    limit = X_COPY[kind]
    r, note = _row(rows, op, shape, threads, True), "preallocated output"
    if r is None:
        r = _row(rows, op, shape, threads, False)
        note = "allocates (no out argument)" if r is not None else ""
    return Target(f"{kind} >= {limit} x copy", op, shape, threads,
                  None if r is None else r.x_copy, limit, note)


def _vs_torch(rows, op, shape, threads):
    alloc, pre = _row(rows, op, shape, threads, False), _row(rows, op, shape, threads, True)
    measured = None if alloc is None else alloc.vs_torch
    note = "" if pre is None or pre.vs_torch is None else f"preallocated: {pre.vs_torch:.2f}x"
    return Target(f"vs torch >= {VS_TORCH[op]}x", op, shape, threads, measured, VS_TORCH[op],
                  note)


def _small_call(latency, op):
    for r in latency:
        if (r.op, r.variant) == (op, "preallocated"):
            return Target(f"small call <= {SMALL_CALL_US[op]} us", op, tuple(r.shape), None,
                          r.us, SMALL_CALL_US[op], f"median of {r.repeats} x {r.calls} calls")
    return Target(f"small call <= {SMALL_CALL_US[op]} us", op, (1, 4096), None, None,
                  SMALL_CALL_US[op])


def evaluate(results):
    """Every target of the issue's kernels, and the bandwidth targets of every other op in
    the run, as Target rows (measured None where the run did not measure it)."""
    measured_ops = {r.op for r in results.rows}
    ops = [op for op in _cases.ops() if op in NAMED_OPS or op in measured_ops]
    targets = [_bandwidth(results.rows, op, s, t) for op in ops for s in SHAPES for t in THREADS]
    targets += [_vs_torch(results.rows, op, s, t) for op in VS_TORCH for s in SHAPES
                for t in THREADS]
    targets += [_small_call(results.latency, op) for op in SMALL_CALL_US]
    return targets
