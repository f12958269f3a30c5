"""Timing: medians of interleaved repeats, repeat counts from a time budget, and the
per-call cost of very short calls."""
import time

import numpy as np


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


def step_seconds(fns):
    """One call of each function (a warm-up), returning the seconds the round took."""
    t0 = time.perf_counter()
    for f in fns:
        f()
    return time.perf_counter() - t0


def repeats_for(step, budget, lo, hi):
    """How many interleaved rounds fit in budget seconds, given one round takes step seconds:
    at least lo (a median needs a few), at most hi."""
    return int(min(hi, max(lo, budget / max(step, 1e-9))))


def time_budgeted(fns, budget, lo=3, hi=201):
    """time_interleaved with a repeat count chosen so the rounds take about budget seconds.
    Returns (median seconds of each function, repeats).  Warm-up: one round, plus a second
    one when rounds are short (the first call of a big array pays its page faults)."""
    step = step_seconds(fns)
    warmup = 1 if step < 0.05 else 0
    repeats = repeats_for(step, budget, lo, hi)
    return time_interleaved(fns, repeats, warmup=warmup), repeats


def per_call_seconds(fns, calls, repeats):
    """Median over repeats of (time of `calls` back-to-back calls) / calls, for each
    function, interleaved: the cost of a call too short to time one at a time.  calls: one
    count for all, or one per function."""
    counts = list(calls) if isinstance(calls, (list, tuple)) else [calls] * len(fns)
    for f, n in zip(fns, counts):
        for _ in range(n):
            f()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for t, f, n in zip(times, fns, counts):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            t.append((time.perf_counter() - t0) / n)
    return [float(np.median(t)) for t in times]
