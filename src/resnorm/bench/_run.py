"""Runs the benchmark sections and collects their rows.

* table:   every (op, shape, dtype, threads): resnorm (preallocated and allocating outputs),
           each installed peer (_peers) and np.copyto of the op's minimum traffic on the
           same threads (_copy), interleaved round by round; medians.  Every output is
           checked against the float64 reference first (_check); a wrong one is not timed.
           torch.compile is measured beforehand in one process per thread count.
* scaling: resnorm on 1, 2, all cores and 2 x cores threads (oversubscribed), interleaved
           with each other and copies on the same thread counts, for the shapes with at
           least LARGE elements.
* latency: microseconds per call from Python of every op at LATENCY_SHAPES, float32,
           default n_threads, preallocated and allocating, with the in-process peers.
"""
import os
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import partial

import numpy as np

from .._parallel import threads_for
from . import _cases, _check, _peers, _peers_torch
from ._cases import parts
from ._copy import CopyReference
from ._machine import cpu_sample, free_cores, largest_cache, load_average, machine_info
from ._results import (OK, PEERS, UNSUPPORTED, WRONG, LatencyRow, Results, Row, ScalingRow,
                       fastest, form_name, note_of, peer_result)
from ._timing import per_call_seconds, time_budgeted

FULL_SHAPES = [(1, 4096), (8, 768), (2048, 768), (128, 4096), (2048, 4096), (8192, 4096),
               (16384, 1024)]
QUICK_SHAPES = [(8, 768), (2048, 4096)]
QUICK_OPS = ["rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward",
             "add_rms_norm", "add_rms_norm_backward", "dropout"]
SCALING_OPS = ["rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward",
               "add_rms_norm", "add_rms_norm_backward"]
LARGE = 1 << 20          # elements: shapes at least this big go into the scaling section
LATENCY_SHAPES = [(1, 4096), (8, 768)]
SECTIONS = ["table", "scaling", "latency"]


@dataclass(frozen=True)
class Budget:
    """Per timed case: about `seconds` of interleaved rounds, at least lo and at most hi
    rounds (big shapes get few rounds, small ones many).  Latency: each timing is about
    latency_seconds of back-to-back calls (at least 10, at most `calls` calls), the median
    of latency_repeats timings."""
    seconds: float
    lo: int
    hi: int
    calls: int
    latency_repeats: int
    latency_seconds: float


FULL = Budget(seconds=0.6, lo=3, hi=201, calls=2000, latency_repeats=21, latency_seconds=2e-3)
QUICK = Budget(seconds=0.12, lo=3, hi=51, calls=1000, latency_repeats=11, latency_seconds=1e-3)


def default_threads():
    """1, 2 and all cores."""
    return sorted({1, 2, os.cpu_count() or 1})


def scaling_threads():
    """1, 2, all cores and twice as many threads as cores (oversubscribed)."""
    cores = os.cpu_count() or 1
    return sorted({1, 2, cores, 2 * cores})


def import_torch(peers):
    if not any(p.startswith("torch") for p in peers):
        return None
    import torch
    return torch


class Progress:
    """Progress on stderr: a one-line bar redrawn with '\\r' on a terminal; elsewhere (a log
    file, a pipe) a plain line at every tenth of the way."""

    def __init__(self, total, enabled):
        self.total, self.done, self.enabled = total, 0, enabled
        self.redraw = enabled and sys.stderr.isatty() and sys.stdout.isatty()
        self.t0, self.tenths = time.perf_counter(), 0

    def step(self, label):
        elapsed = time.perf_counter() - self.t0
        if self.redraw:
            width = 30
            filled = width * self.done // max(self.total, 1)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/"
                             f"{self.total} {elapsed:5.0f}s {label:<44}")
            sys.stderr.flush()
        elif self.enabled and 10 * self.done // max(self.total, 1) > self.tenths:
            self.tenths = 10 * self.done // max(self.total, 1)
            sys.stderr.write(f"benchmark: {10 * self.tenths}% ({self.done}/{self.total}), "
                             f"{elapsed:.0f} s\n")
        self.done += 1

    def close(self):
        if self.redraw:
            self.done = self.total
            self.step("done")
            sys.stderr.write("\n")


# --------------------------------------------------------------------------- checking

def checked_peers(case, peers, threads, used):
    """({name: peer_result} of the peers that cannot run or are wrong, [(name, call, error)]
    of those to time).  Each peer is made for `threads` (`used`: the threads resnorm's
    call runs on), called once (compiling it where it compiles) and checked."""
    results, timed = {}, []
    for name, bind in _peers.binders(case, peers).items():
        try:
            call = bind(threads, used)
            err = _check.error(case, parts(call()))
        except Exception as e:   # a peer that cannot run this case is reported, not fatal
            results[name] = peer_result(UNSUPPORTED, note=note_of(e))
            continue
        if _check.is_right(case.dtype, err):
            timed.append((name, call, err))
        else:
            results[name] = peer_result(WRONG, error=err)
    return results, timed


def checked_resnorm(case, forms):
    """[(label, call, error)] of resnorm's forms [(label, call)], each called once and
    checked."""
    return [(label, call, _check.error(case, case.flat(call()))) for label, call in forms]


# --------------------------------------------------------------------------- sections

def measure_case(case, threads, budget, copies, peers, compiled=None, cache_bytes=None):
    """Rows of one case on `threads` threads: one per output form of resnorm, with the peers
    timed in the same rounds; `compiled`: this case's torch.compile result, if measured;
    cache_bytes: the CPU's largest cache (None: unknown), to tell whether the case's data
    fits in it.  Each row records the cores other processes left free during the rounds."""
    shape, dtype = case.shape, case.dtype
    copy, copy_bytes, used = copies.make(case.traffic, dtype, threads, shape[0] * shape[1])
    forms = checked_resnorm(case, [(pre, partial(fn, threads)) for pre, fn in case.variants()])
    results, timed = checked_peers(case, peers, threads, used)
    ok_forms = [(pre, call, err) for pre, call, err in forms if _check.is_right(dtype, err)]
    fns = [call for _, call, _ in ok_forms] + [copy] + [call for _, call, _ in timed]
    start = cpu_sample()
    times, repeats = time_budgeted(fns, budget.seconds, budget.lo, budget.hi)
    free = free_cores(start, cpu_sample())
    k = len(ok_forms)
    t_resnorm = {pre: t for (pre, _, _), t in zip(ok_forms, times[:k])}
    t_copy = times[k]
    for (name, _, err), t in zip(timed, times[k + 1:]):
        results[name] = peer_result(OK, us=t * 1e6, error=err)
    if compiled is not None:
        results["torch.compile"] = compiled
    results = {name: results[name] for name in PEERS if name in results}
    copy_gbps = copy_bytes / t_copy / 1e9
    rows = []
    for pre, _, err in forms:
        t = t_resnorm.get(pre)
        gbps = None if t is None else case.traffic / t / 1e9
        best, vs_best = fastest(results, form_name(pre), None if t is None else t * 1e6)
        rows.append(Row(
            op=case.op, kind=case.kind, shape=tuple(shape), dtype=dtype.name, threads=threads,
            preallocated=pre, resnorm_us=None if t is None else t * 1e6, resnorm_error=err,
            traffic_bytes=case.traffic, gbps=gbps, copy_us=t_copy * 1e6, copy_gbps=copy_gbps,
            copy_threads=used, x_copy=None if gbps is None else gbps / copy_gbps,
            peers=results, best_peer=best, vs_best=vs_best, repeats=repeats, free_cores=free,
            in_cache=None if cache_bytes is None else case.traffic <= cache_bytes))
    return rows


def measure_scaling(case, shape, dtype, threads, budget, copies):
    """Rows of resnorm on each thread count (preallocated output), interleaved with copies
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


def measure_latency(op, shape, torch, budget, peers):
    """Per-call microseconds of op at shape, float32, default n_threads: resnorm with
    preallocated outputs and allocating, and each in-process peer but NumPy (on the
    threads resnorm's call runs on)."""
    case = _cases.setup(op, shape, np.float32, torch)
    forms = checked_resnorm(case, [(form_name(pre), partial(fn, None))
                                   for pre, fn in case.variants()])
    used = threads_for(None, shape[0] * shape[1])
    failed, timed = checked_peers(case, [p for p in peers if p != "numpy"], used, used)
    rows = [LatencyRow(op, shape, "float32", label, None, 0, 0, WRONG, err)
            for label, _, err in forms if not _check.is_right(case.dtype, err)]
    rows += [LatencyRow(op, shape, "float32", name, None, 0, 0, r["status"], r["error"],
                        r["note"]) for name, r in failed.items()]
    measured = [f for f in forms if _check.is_right(case.dtype, f[2])] + timed
    probe = per_call_seconds([call for _, call, _ in measured], 10, 1)
    calls = [int(min(budget.calls, max(10, budget.latency_seconds / max(t, 1e-9))))
             for t in probe]
    times = per_call_seconds([call for _, call, _ in measured], calls, budget.latency_repeats)
    rows += [LatencyRow(op, shape, "float32", label, t * 1e6, n, budget.latency_repeats, OK,
                        err) for (label, _, err), t, n in zip(measured, times, calls)]
    return rows


# --------------------------------------------------------------------------- the run

def _plan(ops, shapes, dtypes, sections, latency_ops):
    """The cases each section will time: (table cases, scaling cases, latency cases)."""
    table = ([(s, _cases.dtype_of(dt), op) for s in shapes for dt in dtypes for op in ops]
             if "table" in sections else [])
    scaling = []
    if "scaling" in sections:
        dt = _cases.dtype_of("float32" if "float32" in dtypes else dtypes[0])
        scaling = [(s, dt, op) for s in shapes if s[0] * s[1] >= LARGE
                   for op in ops if op in SCALING_OPS]
    latency = []
    if "latency" in sections:
        latency = [(s, op) for s in LATENCY_SHAPES for op in latency_ops]
    return table, scaling, latency


def _compile_cases(table, torch):
    """The table's cases that have a torch function (torch.compile compiles it)."""
    return [(op, s, dt.name) for s, dt, op in table
            if _cases.setup(op, (1, 8), dt, torch).torch is not None]


def run(ops=None, shapes=None, dtypes=None, threads=None, quick=False, peers=None,
        use_torch=True, sections=None, budget=None, progress=True, json_path=None,
        command=None):
    """Runs the sections and returns the Results (also written as JSON to json_path).

    Defaults: full run: every op but the training forms in the table (the latency section
    times those too), FULL_SHAPES, float32 and float64, every installed peer, all
    sections; quick (under 30 s): QUICK_OPS, QUICK_SHAPES, float32, table and latency, no
    torch.compile.  peers: names from resnorm.bench.PEERS (None: every installed one).
    """
    latency_ops = ops or (QUICK_OPS if quick else _cases.ops())
    ops = ops or (QUICK_OPS if quick else _cases.table_ops())
    shapes = [tuple(s) for s in (shapes or (QUICK_SHAPES if quick else FULL_SHAPES))]
    dtypes = list(dtypes or (["float32"] if quick else ["float32", "float64"]))
    threads = sorted(set(threads or default_threads()))
    sections = list(sections or (["table", "latency"] if quick else SECTIONS))
    budget = budget or (QUICK if quick else FULL)
    for op in ops:
        if op not in _cases.ops():
            raise ValueError(f"unknown op {op!r}; known: {', '.join(_cases.ops())}")
    chosen, left_out = _peers.select(peers, use_torch, quick)
    torch = import_torch(chosen)

    started, load_start, t0 = datetime.now(timezone.utc), load_average(), time.perf_counter()
    table, scaling, latency = _plan(ops, shapes, dtypes, sections, latency_ops)
    to_compile = _compile_cases(table, torch) if "torch.compile" in chosen else []
    bar = Progress(len(to_compile) * len(threads) + len(table) * len(threads) + len(scaling)
                   + len(latency), progress)
    compiled = {n: _peers_torch.compiled_results(to_compile, n, budget, bar.step)
                for n in (threads if to_compile else [])}
    res = Results(machine=machine_info())
    copies = CopyReference(max(threads + scaling_threads()))
    cache = largest_cache(res.machine["caches"])
    for shape, dtype, op in table:
        case = _cases.setup(op, shape, dtype, torch)
        for n in threads:
            bar.step(f"{op} {shape[0]}x{shape[1]} {dtype.name} t={n}")
            res.rows += measure_case(case, n, budget, copies, chosen,
                                     compiled.get(n, {}).get((op, shape, dtype.name)), cache)
        del case
    for shape, dtype, op in scaling:
        bar.step(f"scaling {op} {shape[0]}x{shape[1]}")
        res.scaling += measure_scaling(_cases.setup(op, shape, dtype), shape, dtype,
                                       scaling_threads(), budget, copies)
    copies.close()
    for shape, op in latency:
        bar.step(f"latency {op} {shape[0]}x{shape[1]}")
        res.latency += measure_latency(op, shape, torch, budget, chosen)
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
        "peers": {name: {"version": _peers.version(name), "left_out": left_out.get(name)}
                  for name in PEERS},
        "budget": asdict(budget),
    }
    if json_path:
        os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
        with open(json_path, "w") as f:
            f.write(res.to_json())
    return res
