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


def once_seconds(f):
    """The seconds of one call of f (the call also warms f up)."""
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def repeats_for(step, budget, lo, hi):
    """How many interleaved rounds fit in budget seconds, given one round takes step seconds:
    at least lo (a median needs a few), at most hi."""
    return int(min(hi, max(lo, budget / max(step, 1e-9))))


# A timed sample of a call shorter than this is a burst of back-to-back calls lasting about
# this long.  Timed alone, the first call after another function's pays for what that one
# left in the caches and branch predictors: a 7 us call measured 23 us as the first of a
# round, 9 us as the second.  A burst measures each function the way a loop calls it.
BURST_SECONDS = 2e-4


def burst_calls(seconds):
    """Calls per timed sample of a call that takes `seconds` (1 for a long call)."""
    return max(1, min(1000, int(BURST_SECONDS / max(seconds, 1e-9))))


def time_budgeted(fns, budget, lo=3, hi=201):
    """Median seconds per call of each function, timed in interleaved rounds (all see the
    same noise), a short call in bursts (burst_calls), with a repeat count chosen so that
    the rounds take about budget seconds.  Returns (medians, repeats).  Warm-up: two calls
    of each (the first call of a big array pays its page faults), then one burst."""
    singles = [min(once_seconds(f), once_seconds(f)) for f in fns]
    counts = [burst_calls(s) for s in singles]
    repeats = repeats_for(sum(s * n for s, n in zip(singles, counts)), budget, lo, hi)
    return per_call_seconds(fns, counts, repeats), repeats


def per_call_seconds(fns, calls, repeats):
    """Median over repeats of (time of `calls` back-to-back calls) / calls, for each
    function, interleaved: the cost of a call too short to time one at a time.  calls: one
    count for all, or one per function.  Each round starts one function later than the
    one before: the first function of a round finds the caches as the last one of the
    previous round left them (a 6 MB backward measured 2.2 ms first, 1.4 ms second), so
    every function is first equally often: among three or more functions, a function's
    median comes from rounds where it was not first."""
    counts = list(calls) if isinstance(calls, (list, tuple)) else [calls] * len(fns)
    for f, n in zip(fns, counts):
        for _ in range(n):
            f()
    times = [[] for _ in fns]
    k = len(fns)
    for r in range(repeats):
        for j in range(k):
            i = (r + j) % k
            f, n = fns[i], counts[i]
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            times[i].append((time.perf_counter() - t0) / n)
    return [float(np.median(t)) for t in times]
