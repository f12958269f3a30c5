"""torch.distributed DistributedDataParallel (gloo, 2 processes on localhost) with resnorm
modules gives the same parameters as one process training on the full batch."""
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

WORKER = Path(__file__).with_name("torch_ddp_worker.py")
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this torch build has no gloo backend")


def _worker_module():
    spec = importlib.util.spec_from_file_location("torch_ddp_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(world_size, tmp_path):
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    outs = [tmp_path / f"rank{r}.pt" for r in range(world_size)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(world_size), str(port),
                               str(out)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for r, out in enumerate(outs)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{log}"
    return [torch.load(out) for out in outs]


def test_ddp_two_ranks_equal_single_process_full_batch(tmp_path):
    worker = _worker_module()
    single = worker.build_model()
    losses = worker.train(single, worker.full_batches())
    assert losses[-1] < losses[0]
    reference = single.state_dict()
    initial = worker.build_model().state_dict()

    ranks = _run_ranks(2, tmp_path)
    for state in ranks:
        assert list(state) == list(reference)
        for name, value in state.items():
            torch.testing.assert_close(value, reference[name], rtol=1e-12, atol=1e-12)
    # the runs really moved the parameters (the comparison is not between two initial states)
    moved = max((reference[k] - initial[k]).abs().max().item() for k in reference)
    assert moved > 1e-2
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in reference)
