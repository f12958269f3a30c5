"""Build and runtime facts: OpenMP, thread count, SIMD level, compiler flags."""
import os
import subprocess
import sys

import numpy as np
import pytest

import resnorm


def test_openmp_enabled_is_bool():
    assert type(resnorm.openmp_enabled()) is bool


def test_get_num_threads_is_positive_int():
    n = resnorm.get_num_threads()
    assert isinstance(n, int) and n >= 1
    if not resnorm.openmp_enabled():
        assert n == 1


def test_threadpool_limits_one_gives_one_thread():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not resnorm.openmp_enabled():
        pytest.skip("built without OpenMP")
    before = resnorm.get_num_threads()
    with threadpoolctl.threadpool_limits(1):
        assert resnorm.get_num_threads() == 1
        # and the kernels still run (on one thread) with the default n_threads
        x = np.random.default_rng(0).standard_normal((600, 97))
        assert np.all(np.isfinite(resnorm.layer_norm(x)))
    assert resnorm.get_num_threads() == before


def test_omp_num_threads_is_honoured():
    if not resnorm.openmp_enabled():
        pytest.skip("built without OpenMP")
    env = dict(os.environ, OMP_NUM_THREADS="3")
    src = os.path.dirname(os.path.dirname(resnorm.__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH")] if p)
    out = subprocess.run([sys.executable, "-c", "import resnorm; print(resnorm.get_num_threads())"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"


def test_simd_level_is_known():
    assert resnorm.simd_level() in {"sse2", "avx2", "avx512", "avx512bf16", "portable"}


def test_build_flags_are_safe():
    flags = resnorm.build_flags()
    assert isinstance(flags, str) and flags.strip()
    assert "-ffast-math" not in flags
    assert "-march=native" not in flags
    assert "-Ofast" not in flags
    assert "-funsafe-math-optimizations" not in flags
