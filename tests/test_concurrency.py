"""Many Python threads at once, the GIL, and a caller's own thread limits.

* 8 Python threads calling every public function at once, on shared inputs and a shared
  cache, get bitwise what serial calls get (no shared mutable state in the kernels).
* The kernels release the GIL: another Python thread runs while a kernel is half-way.
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
from api_table import OPS, Inputs, assert_same_bits, make_inputs

ALL = pytest.mark.parametrize("op", list(OPS.values()), ids=list(OPS))


def _inputs():
    rng = np.random.default_rng(31)
    cases = [make_inputs(rng, (3, 7), np.float32),
             make_inputs(rng, (600, 97), np.float64, bias=False),     # runs in parallel
             make_inputs(rng, (256, 1024), np.float32, offset=1e4),
             make_inputs(rng, (9, 33), np.float64, weight=False)]
    rare = make_inputs(rng, (40, 64), np.float64)
    rare.x[::3] = 7.0                          # constant rows: the careful LayerNorm path
    rare.x[1::5] *= 1e300                      # rows beyond the double range
    cases.append(rare)
    return cases


def test_eight_python_threads_get_bitwise_the_serial_results():
    cases = _inputs()
    # one shared cache per (training form, case): backward reads it from 8 threads at once
    shared = {}
    for name, op in OPS.items():
        if op.form == "backward":
            for i, inp in enumerate(cases):
                shared[name, i] = op.kwargs(inp)
    tasks = [(name, i, nt) for name in OPS for i in range(len(cases))
             for nt in (1, 2, None)] * 3
    np.random.default_rng(0).shuffle(tasks)

    def run(task):
        name, i, nt = task
        op = OPS[name]
        if op.form == "backward":
            return op.outputs(op.fn(**shared[name, i], n_threads=nt))
        return op.run(cases[i], n_threads=nt)

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


@ALL
def test_kernels_release_the_gil(op):
    """A kernel on one thread writes its output rows in order.  Seeing it half-way means
    this thread ran Python code while the kernel ran.  Retried, as this thread must be
    scheduled during the kernel's ~20 ms (usually it is, on the first or second try)."""
    inp = make_inputs(np.random.default_rng(37), (2048, 2048), np.float32)
    out = np.empty_like(inp.x)
    kw = op.kwargs(inp, n_threads=1)
    if not any(_seen_half_way(lambda o: op.fn(**kw, out=o), out) for _ in range(40)):
        pytest.fail("never saw the kernel half-way from another Python thread")


@pytest.mark.skipif(os.name != "posix", reason="ctypes.PyDLL(None) is POSIX-only")
def test_half_way_check_detects_a_writer_holding_the_gil():
    """The check above can fail: libc memset called through ctypes.PyDLL keeps the GIL
    while it writes (through ctypes.CDLL it would release it)."""
    memset = ctypes.PyDLL(None).memset
    memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    out = np.empty((4096, 4096), np.float32)
    assert not any(_seen_half_way(lambda o: memset(o.ctypes.data, 0x3F, o.nbytes), out)
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
