"""Many Python threads at once, the GIL, and a caller's own thread limits.

* 8 Python threads calling every public function at once, on shared inputs and a shared
  cache, get bitwise what serial calls get (no shared mutable state in the kernels; the
  dropout masks, regenerated from the seed in every call, included).
* The kernels release the GIL: another Python thread runs while a kernel is half-way
  (functions with out=), or runs all along a kernel's call (the others).
* Under a caller's threadpoolctl limit of 1 thread, no OpenMP thread is started, in the
  calling thread and in a Python thread pool whose workers set the limit themselves
  (OpenMP limits are per thread: a limit set in the main thread does not reach pool
  workers, see docs/reliability.md).  Thread counts are read from /proc in a fresh
  process, since OpenMP keeps its threads once started.
"""
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import resnorm
from api_table import OPS, assert_same_bits, make_inputs, with_data

ALL = pytest.mark.parametrize("op", list(OPS.values()), ids=list(OPS))


def _inputs():
    """{(function, case): inputs}: ordinary inputs, and rows taking the rare paths."""
    rng = np.random.default_rng(31)
    cases = [make_inputs(rng, (3, 7), np.float32),
             make_inputs(rng, (600, 97), np.float64, bias=False),     # runs in parallel
             make_inputs(rng, (256, 1024), np.float32, offset=1e4, alpha="scalar", p=0.5),
             make_inputs(rng, (9, 33), np.float64, weight=False, alpha=None, gate="channel")]
    rare = make_inputs(rng, (40, 64), np.float64)
    values = rng.standard_normal((40, 64))
    values[::3] = 7.0                          # constant rows: the careful LayerNorm path
    values[1::5] *= 1e300                      # rows beyond the double range
    inputs = {(name, i): inp for name in OPS for i, inp in enumerate(cases)}
    for name, op in OPS.items():
        forward = OPS[op.forward] if op.form == "backward" else op
        inputs[name, len(cases)] = with_data(forward, rare, values, split=True)
    return inputs


def test_eight_python_threads_get_bitwise_the_serial_results():
    inputs = _inputs()
    # one shared cache per (training form, case): backward reads it from 8 threads at once
    shared = {(name, i): OPS[name].kwargs(inp) for (name, i), inp in inputs.items()
              if OPS[name].form == "backward"}
    tasks = [(name, i, nt) for name, i in inputs for nt in (1, 2, None)] * 3
    np.random.default_rng(0).shuffle(tasks)

    def run(task):
        name, i, nt = task
        op = OPS[name]
        if op.form == "backward":
            return op.outputs(op.fn(**shared[name, i], n_threads=nt))
        return op.run(inputs[name, i], n_threads=nt)

    serial = [run(t) for t in tasks]
    with ThreadPoolExecutor(max_workers=8) as pool:
        concurrent = list(pool.map(run, tasks))
    for task, want, got in zip(tasks, serial, concurrent):
        for out, value in want.items():
            assert_same_bits(got[out], value, f"{task} {out}")


def _seen_half_way(write, out):
    """Runs write(out) in another Python thread, which fills out's rows in order; True if
    this thread, polling between short sleeps, saw the first element written and the last
    one not yet.  Reading out needs the GIL, so a writer holding the GIL all along is never
    seen half-way."""
    out[...] = np.nan
    worker = threading.Thread(target=write, args=(out,))
    worker.start()
    seen = False
    while worker.is_alive() and not seen:
        seen = not np.isnan(out.flat[0]) and np.isnan(out.flat[-1])
        time.sleep(0.0005)
    worker.join()
    assert not np.any(np.isnan(out)), "the writer did not fill out"
    return seen


def _ran_alongside(call):
    """Runs call() in this thread while another Python thread notes the time in a loop;
    True if that thread never stopped for more than a quarter of the call's duration.  A
    call holding the GIL stops it for the whole time it holds it."""
    ticks, stop = [], threading.Event()

    def note():
        while not stop.is_set():
            ticks.append(time.perf_counter())

    worker = threading.Thread(target=note)
    worker.start()
    while not ticks:
        time.sleep(0.0005)
    start = time.perf_counter()
    call()
    end = time.perf_counter()
    stop.set()
    worker.join()
    seen = np.array([start] + [t for t in ticks if start < t < end] + [end])
    return np.max(np.diff(seen)) < (end - start) / 4


def _gil_work(op):
    """A call of op on one thread that runs ~10-40 ms in its kernel, and its out buffer
    (None when op has no out=)."""
    inp = make_inputs(np.random.default_rng(37), (2048, 2048), np.float32)
    kw = op.kwargs(inp, n_threads=1)
    if "out" in op.buffers:
        return (lambda o: op.fn(**kw, out=o)), np.empty_like(inp.x)
    return (lambda: op.fn(**kw)), None


@ALL
def test_kernels_release_the_gil(op):
    """A kernel on one thread writes its output rows in order.  Seeing it half-way means
    this thread ran Python code while the kernel ran.  (Functions without out=: another
    Python thread ran all along the call.)  Retried, as this thread must be scheduled
    during the kernel's ~20 ms (usually it is, on the first or second try)."""
    call, out = _gil_work(op)
    if out is not None:
        seen = any(_seen_half_way(call, out) for _ in range(40))
    else:
        seen = any(_ran_alongside(call) for _ in range(40))
    if not seen:
        pytest.fail("no Python code ran in another thread while the kernel ran")


@pytest.mark.skipif(os.name != "posix", reason="ctypes.PyDLL(None) is POSIX-only")
def test_gil_checks_detect_a_call_holding_the_gil():
    """The checks above can fail: libc memset called through ctypes.PyDLL keeps the GIL
    while it writes (through ctypes.CDLL it would release it)."""
    memset = ctypes.PyDLL(None).memset
    memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    out = np.empty((4096, 4096), np.float32)
    assert not any(_seen_half_way(lambda o: memset(o.ctypes.data, 0x3F, o.nbytes), out)
                   for _ in range(5))
    assert not any(_ran_alongside(lambda: memset(out.ctypes.data, 0x3F, out.nbytes))
                   for _ in range(5))


# --------------------------------------------------------------------------- thread limits

_THREADS_SCRIPT = r"""
import hashlib, json, os, sys, threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import resnorm
from threadpoolctl import threadpool_limits

def native_threads():
    # OS threads that are not Python threads: OpenBLAS's, OpenMP's
    return len(os.listdir("/proc/self/task")) - threading.active_count()

rng = np.random.default_rng(41)
x = rng.standard_normal((512, 1024))        # 2**19 elements: parallel unless limited
w, b, dy = rng.standard_normal(1024), rng.standard_normal(1024), rng.standard_normal(x.shape)

def work(_=None):
    _, rc = resnorm.rms_norm_forward(x, w)
    _, lc = resnorm.layer_norm_forward(x, w, b)
    arrays = [resnorm.rms_norm(x, w), resnorm.layer_norm(x, w, b),
              *resnorm.rms_norm_backward(dy, rc), *resnorm.layer_norm_backward(dy, lc)]
    digest = hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()
    return resnorm.get_num_threads(), digest

mode = sys.argv[1]
before = native_threads()
if mode.startswith("main"):
    if mode == "main-limited":
        threadpool_limits(1)
    results = [work()]
    started = native_threads() - before
else:
    init = (lambda: threadpool_limits(1)) if mode == "pool-limited" else None
    with ThreadPoolExecutor(8, initializer=init) as pool:
        results = list(pool.map(work, range(32)))
        started = native_threads() - before
print(json.dumps({"started": started, "results": results}))
"""


def _run_threads_script(mode):
    """_THREADS_SCRIPT in a fresh interpreter: the native (OpenMP) threads the calls
    started, and (get_num_threads, digest of all outputs) per call."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    src = str(Path(resnorm.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH")] if p)
    proc = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, mode], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


needs_openmp_threads = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and resnorm.openmp_enabled()
         and resnorm.get_num_threads() >= 2),
    reason="counts threads in /proc; needs an OpenMP build with >= 2 threads to tell")


@needs_openmp_threads
@pytest.mark.parametrize("caller", ["main", "pool"])
def test_threadpool_limit_of_one_starts_no_openmp_thread(caller):
    """caller 'main': the limit set in the calling thread; 'pool': 8 ThreadPoolExecutor
    workers, each setting the limit in its initializer."""
    pytest.importorskip("threadpoolctl")
    free = _run_threads_script(caller)
    limited = _run_threads_script(f"{caller}-limited")
    assert free["started"] > 0, "the count cannot tell: no OpenMP thread even without a limit"
    assert limited["started"] == 0, f"{limited['started']} OpenMP threads started under a limit of 1"
    assert {n for n, _ in limited["results"]} == {1}
    assert {digest for _, digest in limited["results"]} == {free["results"][0][1]}
