"""Runs the benchmark sections and collects their rows.

* table:   every (op, shape, dtype, threads): resnorm (preallocated and allocating outputs),
           NumPy, PyTorch (torch.set_num_threads(threads)) and np.copyto of the op's minimum
           traffic on the same threads (_copy), interleaved round by round; medians.
* scaling: resnorm on 1, 2, all cores and 2 x cores threads (oversubscribed), interleaved
           with each other and copies on the same thread counts, for the shapes with at
           least LARGE elements.
* latency: microseconds per call from Python of a (1, 4096) float32 forward.
"""
import os
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import partial

import numpy as np

from . import _cases
from ._copy import CopyReference
from ._machine import load_average, machine_info
from ._results import LatencyRow, Results, Row, ScalingRow
from ._targets import evaluate
from ._timing import per_call_seconds, time_budgeted

FULL_SHAPES = [(1, 4096), (8, 768), (2048, 4096), (8192, 4096), (16384, 1024)]
QUICK_SHAPES = [(8, 768), (2048, 4096)]
QUICK_OPS = ["rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward",
             "add_rms_norm", "add_rms_norm_backward", "dropout"]
SCALING_OPS = ["rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward",
               "add_rms_norm", "add_rms_norm_backward"]
LARGE = 1 << 20          # elements: shapes at least this big go into the scaling section
LATENCY_SHAPE = (1, 4096)
LATENCY_OPS = ["rms_norm", "layer_norm"]
SECTIONS = ["table", "scaling", "latency"]


@dataclass(frozen=True)
class Budget:
    """Per timed case: about `seconds` of interleaved rounds, at least lo and at most hi
    rounds (big shapes get few rounds, small ones many), and the latency loop sizes."""
    seconds: float
    lo: int
    hi: int
    calls: int
    latency_repeats: int


FULL = Budget(seconds=0.6, lo=3, hi=201, calls=2000, latency_repeats=21)
QUICK = Budget(seconds=0.12, lo=3, hi=51, calls=1000, latency_repeats=11)


def default_threads():
    """1, 2 and all cores."""
    return sorted({1, 2, os.cpu_count() or 1})


def scaling_threads():
    """1, 2, all cores and twice as many threads as cores (oversubscribed)."""
    cores = os.cpu_count() or 1
    return sorted({1, 2, cores, 2 * cores})


def import_torch(use_torch):
    if not use_torch:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total, enabled):
        self.total, self.done, self.enabled = total, 0, enabled
        self.t0 = time.perf_counter()

    def step(self, label):
        if self.enabled:
            width = 30
            filled = width * self.done // max(self.total, 1)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/"
                             f"{self.total} {time.perf_counter() - self.t0:5.0f}s {label:<44}")
            sys.stderr.flush()
        self.done += 1

    def close(self):
        if self.enabled:
            self.done = self.total
            self.step("done")
            sys.stderr.write("\n")


# --------------------------------------------------------------------------- sections

def measure_case(case, shape, dtype, threads, torch, budget, copies):
    """Rows of one case on `threads` threads: one per output form of resnorm, with the peers
    timed in the same rounds."""
    variants = case.variants()
    copy, copy_bytes, copy_threads = copies.make(case.traffic, dtype, threads,
                                                 shape[0] * shape[1])
    fns = [partial(fn, threads) for _, fn in variants] + [case.numpy, copy]
    if case.torch is not None:
        torch.set_num_threads(threads)
        fns.append(case.torch)
    times, repeats = time_budgeted(fns, budget.seconds, budget.lo, budget.hi)
    k = len(variants)
    t_numpy, t_copy = times[k], times[k + 1]
    t_torch = times[k + 2] if case.torch is not None else None
    copy_gbps = copy_bytes / t_copy / 1e9
    rows = []
    for (preallocated, _), t in zip(variants, times[:k]):
        gbps = case.traffic / t / 1e9
        rows.append(Row(
            op=case.op, kind=case.kind, shape=tuple(shape), dtype=dtype.name, threads=threads,
            preallocated=preallocated, resnorm_us=t * 1e6, traffic_bytes=case.traffic,
            gbps=gbps, copy_us=t_copy * 1e6, copy_gbps=copy_gbps, copy_threads=copy_threads,
            x_copy=gbps / copy_gbps,
            numpy_us=t_numpy * 1e6, vs_numpy=t_numpy / t,
            torch_us=None if t_torch is None else t_torch * 1e6,
            vs_torch=None if t_torch is None else t_torch / t, repeats=repeats))
    return rows


def measure_scaling(case, shape, dtype, threads, budget, copies):
    """Rows of resnorm on each thread count (preallocated outputs), interleaved with copies
    on the same thread counts."""
    made = [copies.make(case.traffic, dtype, t, shape[0] * shape[1]) for t in threads]
    fns = [case.resnorm(t) for t in threads] + [copy for copy, _, _ in made]
    times, repeats = time_budgeted(fns, budget.seconds, budget.lo, budget.hi)
    t_resnorm, t_copy = times[:len(threads)], times[len(threads):]
    t1 = t_resnorm[threads.index(1)] if 1 in threads else None
    return [ScalingRow(op=case.op, shape=tuple(shape), dtype=dtype.name, threads=n,
                       us=t * 1e6, gbps=case.traffic / t / 1e9, x_copy=tc / t,
                       speedup=None if t1 is None else t1 / t, repeats=repeats)
            for n, t, tc in zip(threads, t_resnorm, t_copy)]


def measure_latency(op, torch, budget):
    """Per-call microseconds of op at LATENCY_SHAPE float32 with the default n_threads:
    preallocated output, allocating, and torch (allocating) when installed."""
    dtype = np.dtype(np.float32)
    case = _cases.setup(op, LATENCY_SHAPE, dtype, torch)
    variants = [("preallocated", case.resnorm(None)), ("allocating", case.resnorm(None, False))]
    if case.torch is not None:
        variants.append(("torch", case.torch))
    times = per_call_seconds([fn for _, fn in variants], budget.calls, budget.latency_repeats)
    return [LatencyRow(op=op, shape=LATENCY_SHAPE, dtype=dtype.name, variant=name, us=t * 1e6,
                       calls=budget.calls, repeats=budget.latency_repeats)
            for (name, _), t in zip(variants, times)]


# --------------------------------------------------------------------------- the run

def _plan(ops, shapes, dtypes, sections):
    """The cases each section will time: (table cases, scaling cases)."""
    table = ([(s, np.dtype(dt), op) for s in shapes for dt in dtypes for op in ops]
             if "table" in sections else [])
    scaling = []
    if "scaling" in sections:
        dt = np.dtype("float32" if "float32" in dtypes else dtypes[0])
        scaling = [(s, dt, op) for s in shapes if s[0] * s[1] >= LARGE
                   for op in ops if op in SCALING_OPS]
    return table, scaling


def run(ops=None, shapes=None, dtypes=None, threads=None, quick=False, use_torch=True,
        sections=None, budget=None, progress=True, json_path=None, command=None):
    """Runs the sections and returns the Results (also written as JSON to json_path).

    Defaults: full run: every op, FULL_SHAPES, float32 and float64, all sections;
    quick (under 30 s): QUICK_OPS, QUICK_SHAPES, float32, table and latency.
    """
    ops = ops or (QUICK_OPS if quick else _cases.ops())
    shapes = [tuple(s) for s in (shapes or (QUICK_SHAPES if quick else FULL_SHAPES))]
    dtypes = list(dtypes or (["float32"] if quick else ["float32", "float64"]))
    threads = sorted(set(threads or default_threads()))
    sections = list(sections or (["table", "latency"] if quick else SECTIONS))
    budget = budget or (QUICK if quick else FULL)
    torch = import_torch(use_torch)
    for op in ops:
        if op not in _cases.ops():
            raise ValueError(f"unknown op {op!r}; known: {', '.join(_cases.ops())}")

    started, load_start, t0 = datetime.now(timezone.utc), load_average(), time.perf_counter()
    table, scaling = _plan(ops, shapes, dtypes, sections)
    latency = LATENCY_OPS if "latency" in sections else []
    bar = Progress(len(table) * len(threads) + len(scaling) + len(latency), progress)
    res = Results(machine=machine_info())
    copies = CopyReference(max(threads + scaling_threads()))
    for shape, dtype, op in table:
        case = _cases.setup(op, shape, dtype, torch)
        for n in threads:
            bar.step(f"{op} {shape[0]}x{shape[1]} {dtype.name} t={n}")
            res.rows += measure_case(case, shape, dtype, n, torch, budget, copies)
        del case
    for shape, dtype, op in scaling:
        bar.step(f"scaling {op} {shape[0]}x{shape[1]}")
        res.scaling += measure_scaling(_cases.setup(op, shape, dtype), shape, dtype,
                                       scaling_threads(), budget, copies)
    copies.close()
    for op in latency:
        bar.step(f"latency {op}")
        res.latency += measure_latency(op, torch, budget)
    bar.close()

    order = {op: i for i, op in enumerate(_cases.ops())}
    res.rows.sort(key=lambda r: (order[r.op], r.dtype, r.shape[0] * r.shape[1], r.shape,
                                 r.threads, not r.preallocated))
    res.meta = {
        "command": command, "started_utc": started.isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - t0, 1),
        "load_average_start": load_start, "load_average_end": load_average(),
        "quick": quick, "ops": ops, "shapes": [list(s) for s in shapes], "dtypes": dtypes,
        "threads": threads, "scaling_threads": scaling_threads(), "sections": sections,
        "torch": torch is not None, "budget": asdict(budget),
    }
    if json_path:
        os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
        with open(json_path, "w") as f:
            f.write(res.to_json(evaluate(res)))
    return res
