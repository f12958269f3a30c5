"""Memory: no growth over 100,000 calls of every norm function (10,000 of every residual
and dropout function, and 2,000 instead of 20,000 refused calls: the suite's time; their
kernels allocate only NumPy arrays, which tracemalloc sees, and no C memory),
and the peak memory of one call is its outputs plus O(rows) (backward: plus O(D) partial
sums and scratch rows), never a temporary the size of the input.

Growth is measured after a warm-up, both by tracemalloc (every Python and NumPy
allocation still alive) and by the resident set size (/proc/self/statm: anything the C
code might leak), with small absolute tolerances; a deliberate leak of 16 bytes per call
is caught by both (test_growth_check_detects_a_small_leak).
"""
import functools
import gc
import os
import tracemalloc

import numpy as np
import pytest

from api_table import OPS, make_inputs

CALLS = 100_000
CALLS_RESIDUAL = 10_000   # residual and dropout functions (see the module docstring)
REFUSED, REFUSED_RESIDUAL = 20_000, 2_000
WARM_UP = 2_000
TRACED_TOLERANCE = 64 << 10   # bytes still alive after the calls, beyond those before
RSS_TOLERANCE = 1 << 20
ALL = pytest.mark.parametrize("op", list(OPS.values()), ids=list(OPS))


def _rss():
    """Resident set size in bytes, or None where /proc is not available."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _asan_loaded():
    """AddressSanitizer keeps freed memory in quarantine: RSS then grows by design."""
    try:
        with open("/proc/self/maps") as f:
            return "libasan" in f.read()
    except OSError:
        return False


def _growth(call, calls=CALLS):
    """(traced bytes, RSS bytes or None) still held after `calls` calls, beyond what was
    held after a warm-up."""
    tracemalloc.start()
    try:
        for _ in range(WARM_UP):
            call()
        gc.collect()
        traced, rss = tracemalloc.get_traced_memory()[0], _rss()
        for _ in range(calls):
            call()
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - traced
        rss = None if rss is None else _rss() - rss
    finally:
        tracemalloc.stop()
    return traced, rss


def _assert_no_growth(traced, rss, what):
    assert traced <= TRACED_TOLERANCE, f"{what}: {traced} bytes still traced"
    if rss is not None and not _asan_loaded():
        assert rss <= RSS_TOLERANCE, f"{what}: RSS grew by {rss} bytes"


@ALL
def test_no_growth_over_100000_calls(op):
    """Small float32 inputs with weight and bias, a per-channel alpha, dropout and a full
    gate, alternating with float64 inputs without weight and bias, with a fixed alpha, no
    dropout and a per-channel gate, so both element types and both parameter cases run."""
    rng = np.random.default_rng(43)
    cases = [make_inputs(rng, (4, 8), np.float32),
             make_inputs(rng, (3, 5), np.float64, weight=False, bias=False, alpha="fixed",
                         p=0.0, gate="channel")]
    calls = [lambda inp=inp, kw=op.kwargs(inp): op.fn(**kw) for inp in cases]
    if op.form == "backward":   # a fresh cache each call, too
        calls.append(lambda inp=cases[0]: op.call(inp))
    step = iter(range(1 << 62))
    n = CALLS if op.family in ("rms", "ln") else CALLS_RESIDUAL
    _assert_no_growth(*_growth(lambda: calls[next(step) % len(calls)](), n), op.name)


@ALL
def test_no_growth_over_calls_that_raise(op):
    """The error path: a wrong-dtype array argument, 20,000 times (2,000 for the residual
    and dropout functions)."""
    inp = make_inputs(np.random.default_rng(47), (4, 8), np.float32)
    arg = op.arrays[0]
    kw = {**op.kwargs(inp), arg: getattr(inp, arg).astype(np.int32)}

    def call():
        try:
            op.fn(**kw)
        except TypeError:
            return
        raise AssertionError("no TypeError")

    _assert_no_growth(*_growth(call, REFUSED if op.family in ("rms", "ln") else
                               REFUSED_RESIDUAL), op.name)


def test_growth_check_detects_a_small_leak():
    kept = []
    traced, rss = _growth(lambda: kept.append(np.empty(2, np.float64)), 100_000)
    with pytest.raises(AssertionError):
        _assert_no_growth(traced, None, "traced")
    if rss is not None and not _asan_loaded():
        with pytest.raises(AssertionError):
            _assert_no_growth(0, rss, "rss")


# --------------------------------------------------------------------------- peak memory

def _peak(call):
    """(peak bytes allocated during call(), its result), beyond what was held before."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = call()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return peak, result


N, D = 8192, 1024    # 32 MiB of float32: a temporary of the input's size cannot hide


@functools.lru_cache(maxsize=1)
def _large_inputs():
    """One set of (N, D) float32 inputs for every function (they leave them unchanged)."""
    return make_inputs(np.random.default_rng(53), (N, D), np.float32)


@ALL
def test_peak_is_the_outputs_plus_o_rows(op):
    inp = _large_inputs()
    kw = op.kwargs(inp)
    per_row = 64 * N + (64 << 10)        # row statistics, the cache object, small objects
    # backward: one float64 partial row of dweight, dbias and dalpha per row block (<= 64
    # blocks), their results, and a few scratch rows per thread (gradient reaching h,
    # sigmoid rows, dropout bits)
    per_column = 3 * 64 * D * 8 + 3 * D * 8 + 64 * 3 * D * 4 if op.form == "backward" else 0
    peak, result = _peak(lambda: op.fn(**kw))
    outputs = sum(a.nbytes for a in op.outputs(result).values()
                  if a is not None and a.shape == inp.x.shape)
    assert outputs >= inp.x.nbytes
    extra = peak - outputs
    assert extra <= per_row + per_column, f"{op.name}: {extra} bytes beyond the outputs"
    # with every output buffer given, nothing of the input's size is allocated but the
    # outputs without a buffer
    buffers = {b: np.empty_like(inp.x) for b in op.buffers}
    if buffers:
        unbuffered = outputs - len(buffers) * inp.x.nbytes
        peak, _ = _peak(lambda: op.fn(**kw, **buffers))
        assert peak - unbuffered <= per_row + per_column, f"{op.name} with buffers: peak {peak}"


@pytest.mark.parametrize("op", [OPS["rms_norm"], OPS["layer_norm_forward"]],
                         ids=lambda op: op.name)
def test_non_contiguous_input_is_copied_exactly_once(op):
    inp = make_inputs(np.random.default_rng(59), (N, 2 * D), np.float32)
    inp.x = inp.x[:, ::2]
    inp.weight, inp.bias = inp.weight[::2], inp.bias[::2]
    kw = op.kwargs(inp)
    peak, _ = _peak(lambda: op.fn(**kw))
    extra = peak - 2 * N * D * 4          # the output and one contiguous copy of x
    assert extra <= 64 * N + (64 << 10), f"{op.name}: {extra} bytes beyond output + copy"
