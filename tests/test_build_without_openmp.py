"""A build with RESNORM_OPENMP=0 works on one thread and says so.

Compiles the extensions a second time, without OpenMP, into a temporary directory, and
imports that copy in a subprocess.  Needs the source checkout (setup.py), Cython and a C
compiler: the test extra installs Cython and setuptools.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import numpy as np, resnorm
from resnorm import reference
rng = np.random.default_rng(0)
x = rng.standard_normal((300, 129))
w = rng.standard_normal(129)
y, cache = resnorm.rms_norm_forward(x, w, n_threads=4)
dx, dw = resnorm.rms_norm_backward(np.ones_like(x), cache, n_threads=4)
yr, rstd = reference.rms_norm_forward(x, w)
dxr, dwr = reference.rms_norm_backward(np.ones_like(x), x, w, rstd)
print(resnorm.openmp_enabled(), resnorm.get_num_threads(),
      np.abs(y - yr).max() < 1e-12, np.abs(dx - dxr).max() < 1e-12, np.abs(dw - dwr).max() < 1e-9,
      resnorm.build_flags().split()[0])
"""


@pytest.mark.skipif(not (ROOT / "setup.py").exists(), reason="needs the source checkout")
def test_build_without_openmp_runs_on_one_thread(tmp_path):
    src = tmp_path / "src"
    build_products = shutil.ignore_patterns("*.so", "build", ".git", "__pycache__", "*.egg-info",
                                            ".hypothesis")

    def ignore(directory, names):
        # Cython's generated C sits beside the .pyx files; the core's own C is in core/
        generated = [n for n in names if n.endswith(".c") and Path(directory).name == "resnorm_c"]
        return set(build_products(directory, names)) | set(generated)

    shutil.copytree(ROOT, src, ignore=ignore)
    # -O1: what is checked here is the build without OpenMP and its answers, which do not
    # depend on the level; -O3 took 185 s of this test, -O1 84 s
    env = dict(os.environ, RESNORM_OPENMP="0", RESNORM_OPT="-O1")
    build = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=src,
                           env=env, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-4000:]
    assert "without OpenMP" in build.stderr
    run = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(src / "src")),
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "1", "True", "True", "True", "-O1"]


def test_installed_build_reports_openmp():
    import resnorm

    assert isinstance(resnorm.openmp_enabled(), bool)
    assert resnorm.get_num_threads() >= 1
    if not resnorm.openmp_enabled():
        assert resnorm.get_num_threads() == 1
    np.testing.assert_allclose(resnorm.rms_norm(np.ones((2, 3))), np.ones((2, 3)), rtol=1e-6)
