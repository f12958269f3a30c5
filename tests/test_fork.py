"""resnorm in worker processes: fork, spawn and forkserver pools after threaded calls in the
parent.

A forked child cannot start OpenMP threads (GNU OpenMP waits forever for the parent's team),
so there every call runs on one thread, with one warning that names the fix; spawn and
forkserver workers keep their threads.  Each pool runs in a child interpreter under a
timeout: a hang fails the test instead of stopping the suite.
"""
import os
import subprocess
import sys
import textwrap

import pytest

import resnorm

WORKER = textwrap.dedent("""
    import warnings

    import numpy as np

    import resnorm
    from resnorm._parallel import threads_for

    SHAPE = (64, 1024)   # above the one-thread limit: calls are threaded where they can be


    def rows():
        return np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)


    def work(n_threads):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            team = threads_for(n_threads, rows().size)
            y = resnorm.rms_norm(rows(), n_threads=n_threads)
            y2 = resnorm.layer_norm(rows(), n_threads=n_threads)
        return team, y.tobytes() + y2.tobytes(), [str(w.message) for w in caught]
""")

DRIVER = textwrap.dedent("""
    import multiprocessing as mp
    import sys
    import warnings

    import numpy as np

    import resnorm
    from worker import work

    if __name__ == "__main__":
        method = sys.argv[1]
        parent = work(2)                  # the parent starts an OpenMP team first
        assert parent[0] == 2 and not parent[2], parent[::2]
        asked = [2, None, 2, None]        # None: the default, sized to the free cores
        with mp.get_context(method).Pool(2) as pool:
            results = pool.map(work, asked)
        # the children compute the parent's bits on whatever team they get
        assert all(r[1] == parent[1] for r in results)
        teams = sorted({r[0] for r, n in zip(results, asked) if n == 2})
        warned = [m for r in results for m in r[2]]
        print(method, teams, len(warned), warned[0] if warned else "")
""")


@pytest.mark.skipif(not resnorm.openmp_enabled(), reason="built without OpenMP: no threads")
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_pool_workers_after_a_threaded_parent_call(tmp_path, method):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "driver.py").write_text(DRIVER)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "2"}
    try:
        run = subprocess.run([sys.executable, "driver.py", method], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a {method} pool hung after a threaded call in the parent")
    assert run.returncode == 0, run.stderr
    words = run.stdout.split()
    if method == "fork":
        assert run.stdout.startswith("fork [1] "), run.stdout
        # one warning per worker process (each says it once), naming the fix
        assert 1 <= int(words[2]) <= 2, run.stdout
        assert "one thread" in run.stdout and "'forkserver'" in run.stdout, run.stdout
    else:
        assert run.stdout.split(" 0 ")[0] == f"{method} [2]", run.stdout
