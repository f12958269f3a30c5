"""The PyTorch peers: torch eager and torch.compile (Inductor, CPU) of the same function.

An op module describes its PyTorch computation once, as a TorchSpec: a function of tensors
and the arrays it is called on (and, for a backward op, the gradients of its outputs).

* torch eager: the function on CPU tensors sharing the arrays' memory, with
  torch.set_num_threads(threads).  Backward ops: the graph is built once and each call is
  torch.autograd.grad through it (what a training step pays for the backward pass).
* torch.compile: torch.compile(fn, dynamic=False), compiled and warmed up before timing.
  Inductor fixes its OpenMP team size when it compiles, so each thread count runs in its
  own process (python -m resnorm.bench._peers_torch, fed the cases as JSON on stdin),
  which times the compiled function in rounds with resnorm's two forms (on as many
  threads) and prints one JSON line per case.  The row compares torch.compile with
  resnorm's times from those rounds, as it compares every other peer with resnorm's from
  the rounds they share: the same machine state for both sides of each ratio.

Outputs are tensors in resnorm's order; torch is imported only when a peer is made.
"""
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from . import _cases, _check
from ._results import OK, UNSUPPORTED, WRONG, form_name, note_of, peer_result
from ._timing import time_budgeted


@dataclass
class TorchSpec:
    fn: Callable                 # fn(*tensors) -> tensor or tuple of tensors
    inputs: list                 # the arrays fn is called on
    grads: list | None = None    # backward op: the gradients of fn's outputs


def _tensor(torch, a):
    """The tensor sharing an array's memory (an ml_dtypes bfloat16 array: bit-cast)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _call(torch, spec, fn):
    """The timed call of fn on spec's arrays (autograd through it for a backward op)."""
    if spec.grads is None:
        tensors = [_tensor(torch, a) for a in spec.inputs]
        return lambda: fn(*tensors)
    leaves = [_tensor(torch, a).requires_grad_(True) for a in spec.inputs]
    outputs = fn(*leaves)
    grads = [_tensor(torch, g) for g in spec.grads]
    return lambda: torch.autograd.grad(outputs, leaves, grads, retain_graph=True)


def eager(spec):
    """bind(threads, used) of torch eager: set_num_threads(threads) and the call."""
    made = {}

    def bind(threads, used):
        import torch
        torch.set_num_threads(threads)
        if "call" not in made:
            made["call"] = _call(torch, spec, spec.fn)
        return made["call"]
    return bind


# --------------------------------------------------------------------------- torch.compile

def measure_compiled(case, torch, threads, seconds, lo, hi):
    """torch.compile of the case's TorchSpec: checked, then timed in rounds with resnorm's
    two forms on `threads` threads.  Returns the peer result (peer_result), with resnorm's
    times from those rounds."""
    try:
        call = _call(torch, case.torch, torch.compile(case.torch.fn, dynamic=False))
        err = _check.error(case, _cases.parts(call()))
    except Exception as e:   # a compile or runtime failure: the peer cannot run this case
        return peer_result(UNSUPPORTED, note=note_of(e))
    if not _check.is_right(case.dtype, err):
        return peer_result(WRONG, error=err)
    forms = case.variants()
    times, _ = time_budgeted([call] + [partial(fn, threads) for _, fn in forms], seconds, lo,
                             hi)
    return peer_result(OK, us=times[0] * 1e6, error=err,
                       resnorm_us={form_name(pre): t * 1e6
                                   for (pre, _), t in zip(forms, times[1:])})


def _child():
    """The torch.compile process of one thread count: cases on stdin, results on stdout."""
    import torch

    job = json.loads(sys.stdin.read())
    torch.set_num_threads(job["threads"])
    for op, shape, dtype in job["cases"]:
        case = _cases.setup(op, shape, dtype, torch)
        result = measure_compiled(case, torch, job["threads"], *job["budget"])
        print(json.dumps({"op": op, "shape": shape, "dtype": dtype, **result}), flush=True)


def compiled_results(cases, threads, budget, step):
    """{(op, shape, dtype): peer result} of torch.compile on `threads` threads, measured in a
    child process; step(label) is called once per case.  cases: [(op, shape, dtype name)]
    whose Case has a TorchSpec."""
    import resnorm
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(resnorm.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [env.get("PYTHONPATH")] if p])
    job = {"threads": threads, "cases": [[op, list(s), dt] for op, s, dt in cases],
           "budget": [budget.seconds, budget.lo, budget.hi]}
    results = {}
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "resnorm.bench._peers_torch"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                text=True, env=env)
        proc.stdin.write(json.dumps(job))
        proc.stdin.close()
        for line in proc.stdout:
            d = json.loads(line)
            key = (d.pop("op"), tuple(d.pop("shape")), d.pop("dtype"))
            results[key] = d
            step(f"torch.compile {key[0]} {key[1][0]}x{key[1][1]} t={threads}")
        status = proc.wait()
        log.seek(0)
        last = (log.read().strip().splitlines() or [""])[-1][:160]
    for op, s, dt in cases:
        if (op, tuple(s), dt) not in results:
            results[(op, tuple(s), dt)] = peer_result(
                UNSUPPORTED, note=f"the torch.compile process stopped (exit status {status}): "
                f"{last}")
            step(f"torch.compile {op} t={threads}")
    return results


if __name__ == "__main__":
    _child()
