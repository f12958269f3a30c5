"""The library's speed goals, read off the measured rows (shown with ``--goals``): MET or
NOT MET with the measured value.  Nothing here measures; a goal whose row is not in the run
is left out (and counted).  All goals are float32, on 1 and 2 threads.

* ahead of every peer: in every cell of SHAPES x OPS, resnorm with preallocated outputs
  takes less time than the fastest installed peer (vs best > 1), and the median of vs best
  over those cells is at least MEDIAN_MARGIN;
* cache-resident shapes: forward (fused add + norm included) >= 0.9 x copy, backward >= 0.7;
* large shapes, preallocated: forward >= 1.0 x copy, backward >= 0.85;
* small calls (the latency section, every op): preallocated forward <= 1.0 us, backward
  and fused add + norm <= 1.5 us, faster than the numba loop of the same computation, and
  the allocating form at most 0.4 us slower than the preallocated one.
"""
from dataclasses import dataclass
from statistics import median

from . import _cases
from ._cases import BACKWARD, FORWARD
from ._results import ALLOCATING, PREALLOCATED, form_name, one_per_cell, own_form

DTYPE = "float32"
THREADS = [1, 2]
CACHE_RESIDENT = [(2048, 768), (128, 4096)]
LARGE_SHAPES = [(2048, 4096), (8192, 4096), (16384, 1024)]
SHAPES = [(1, 4096), (8, 768)] + CACHE_RESIDENT + LARGE_SHAPES
OPS = ["rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm", "rms_norm_backward",
       "layer_norm_backward", "add_rms_norm_backward", "add_layer_norm_backward"]
MEDIAN_MARGIN = 1.2
X_COPY = {"cache-resident": {"forward": 0.9, "backward": 0.7},
          "large": {"forward": 1.0, "backward": 0.85}}
SMALL_CALL_US = {"forward": 1.0, "backward and fused": 1.5}
ALLOCATING_EXTRA_US = 0.4


@dataclass
class Goal:
    goal: str               # what is asked, e.g. "forward >= 0.9 x copy (cache-resident)"
    op: str
    shape: tuple | None
    threads: int | None
    measured: float | None  # None: the row was measured but gave no value (see note)
    threshold: float
    compare: str            # ">", ">=" or "<=": measured compare threshold is MET
    note: str = ""

    @property
    def status(self):
        if self.measured is None:
            return "NOT MET"
        met = {">": self.measured > self.threshold, ">=": self.measured >= self.threshold,
               "<=": self.measured <= self.threshold}[self.compare]
        return "MET" if met else "NOT MET"


def _preallocated(rows):
    """{(op, shape, threads): the preallocated row (one_per_cell)}."""
    return {(r.op, tuple(r.shape), r.threads): r for r in one_per_cell(rows)
            if r.dtype == DTYPE and r.threads in THREADS}


def _family(kind):
    return "backward" if kind == BACKWARD else "forward"


def _ahead(rows):
    goals = []
    for (op, shape, threads), r in rows.items():
        if op in OPS and shape in SHAPES:
            note = f"best peer: {r.best_peer}" if r.best_peer else "no peer timed"
            if r.resnorm_us is None:
                note = "resnorm's output was wrong"
            goals.append(Goal("faster than the best peer (vs best > 1)", op, shape, threads,
                              r.vs_best, 1.0, ">", note))
    measured = [g.measured for g in goals if g.measured is not None]
    if measured:
        goals.append(Goal(f"median vs best over those cells >= {MEDIAN_MARGIN}", "all",
                          None, None, median(measured), MEDIAN_MARGIN, ">=",
                          f"{len(measured)} cells"))
    return goals


def _bandwidth(rows):
    goals = []
    for (op, shape, threads), r in rows.items():
        size = ("cache-resident" if shape in CACHE_RESIDENT
                else "large" if shape in LARGE_SHAPES else None)
        if size is None or op not in OPS:
            continue
        family = _family(r.kind)
        limit = X_COPY[size][family]
        goals.append(Goal(f"{family} >= {limit} x copy ({size})", op, shape, threads,
                          r.x_copy, limit, ">=",
                          form_name(r.preallocated)))
    return goals


def _small_calls(latency):
    by_op = {}
    for r in latency:
        by_op.setdefault((r.op, tuple(r.shape)), {})[r.variant] = r
    goals = []
    for (op, shape), v in by_op.items():
        pre = own_form(v)
        if pre is None:
            continue
        family = "forward" if _cases.kind(op) == FORWARD else "backward and fused"
        limit = SMALL_CALL_US[family]
        goals.append(Goal(f"small call ({family}) <= {limit} us", op, shape, None, pre.us,
                          limit, "<=", pre.variant))
        numba = v.get("numba")
        if numba is not None and numba.us is not None and pre.us is not None:
            goals.append(Goal("faster than the numba loop (numba / resnorm > 1)", op, shape,
                              None, numba.us / pre.us, 1.0, ">", f"numba {numba.us:.2f} us"))
        alloc = v.get(ALLOCATING)
        if PREALLOCATED in v and alloc is not None and None not in (alloc.us, pre.us):
            goals.append(Goal(f"allocating adds <= {ALLOCATING_EXTRA_US} us", op, shape, None,
                              alloc.us - pre.us, ALLOCATING_EXTRA_US, "<="))
    return goals


def evaluate(results):
    """Every goal whose rows the run measured, as Goal rows."""
    rows = _preallocated(results.rows)
    return _ahead(rows) + _bandwidth(rows) + _small_calls(results.latency)
