"""How many threads a call runs on: -1 is every core, counts above 4 per core run on 4 per
core, and the default (None) is sized to the cores that other processes leave free."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import resnorm
from resnorm import _parallel

BIG = 1 << 20   # elements: above the one-thread limit


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_minus_one_is_every_core_and_big_counts_are_capped():
    cores = _cores()
    assert _parallel.threads_for(-1, BIG) == cores
    assert _parallel.threads_for(1000, BIG) == 4 * cores
    assert _parallel.threads_for(2, BIG) == 2
    assert _parallel.threads_for(-1, 8) == 1          # small calls stay on one thread


def test_counts_give_the_same_bits():
    x = np.random.default_rng(0).standard_normal((300, 1024)).astype(np.float32)
    want = resnorm.layer_norm(x, n_threads=1)
    for nt in (-1, 1000, None):
        assert np.array_equal(resnorm.layer_norm(x, n_threads=nt), want)


def test_bad_counts_name_the_core_count():
    with pytest.raises(ValueError, match=rf"all {_cores()} cores"):
        resnorm.rms_norm(np.ones((2, 3)), n_threads=0)


@pytest.mark.skipif(not os.path.exists("/proc/stat") or _cores() < 2,
                    reason="needs /proc/stat and at least two cores")
def test_default_team_leaves_out_cores_others_keep_busy():
    """With a busy process on every core, the default team is one thread."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(_cores())]
    try:
        deadline = time.monotonic() + 20
        team = None
        while time.monotonic() < deadline:
            time.sleep(0.06)                 # a new sample of /proc/stat (every 50 ms)
            team = _parallel.threads_for(None, BIG)
            if team == 1:
                break
        assert team == 1
    finally:
        for p in busy:
            p.kill()
            p.wait()


def test_resnorm_torch_follows_the_same_rule():
    """resnorm.torch passes n_threads=None (sized to the free cores) while torch's thread
    count is its default, and torch.set_num_threads's count once it is changed."""
    torch = pytest.importorskip("torch")
    from resnorm.torch import _storage, _tensors

    now = torch.get_num_threads()     # (another test may have changed it)
    default = _storage._torch_default_threads   # torch's count when resnorm.torch came in
    other = 1 if default > 1 else 2
    try:
        torch.set_num_threads(default)
        assert _tensors.threads() is None
        torch.set_num_threads(other)
        assert _tensors.threads() == other
    finally:
        torch.set_num_threads(now)
