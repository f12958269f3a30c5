"""Shared helpers of the resnorm test suite: seeded inputs, kernel/reference runners and
tolerance checks scaled by the size of the terms (never by the result itself)."""
import ast
import collections
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import zlib

import numpy as np
import pytest

# resnorm's optional packages, hidden from this process and its subprocesses when
# RESNORM_TESTS_WITHOUT_EXTRAS is set (without_extras/sitecustomize.py says how and why)
_WITHOUT_EXTRAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "without_extras")
if os.environ.get("RESNORM_TESTS_WITHOUT_EXTRAS"):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [_WITHOUT_EXTRAS, os.environ.get("PYTHONPATH")] if p)
# (loaded by path: a Python may have a sitecustomize of its own, imported at startup)
_spec = importlib.util.spec_from_file_location(
    "resnorm_tests_without_extras", os.path.join(_WITHOUT_EXTRAS, "sitecustomize.py"))
_hider = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_hider)   # hides them, before resnorm loads
EXTRA_PACKAGES = _hider.EXTRA_PACKAGES

import resnorm  # noqa: E402
from resnorm import reference as ref  # noqa: E402

DTYPES = [np.float32, np.float64]

# Relative to the scale of the terms.  float64: the kernels and the reference both work in
# double, differing only in summation order.  float32: a few units in the last place of
# the largest term of a row (float32 eps = 1.19e-7).
RTOL = {np.dtype(np.float32): 4e-6, np.dtype(np.float64): 1e-12}
# Row statistics (mean, rstd) are float64 for every input dtype.  Summed in double (RMSNorm;
# LayerNorm of float64 rows) they differ from the reference only in summation order.
# LayerNorm's sums of float32 and 16-bit rows run in float32 lanes, 16 elements per lane
# before each is added into double: 2**-20 relative is their worst-case rounding
# (core/reduce.h, norm_kernels.pxd's shifted_moments); the outputs are held to the accuracy
# contract in ulps by tests/test_accuracy.py.
STAT_RTOL = 1e-12
LANE_STAT_RTOL = 2.0 ** -20

RMS_EPS = 1e-6  # documented defaults
LN_EPS = 1e-5


def rtol_for(dtype):
    return RTOL[np.dtype(dtype)]


# --------------------------------------------------------------------------- sampling

# A test function with at least this many parametrized cases is a matrix (input table,
# extreme values, references over shapes and options); --matrix-sample=N runs about 1/N of
# each matrix's cases.
MATRIX_CASES = 50


def pytest_addoption(parser):
    parser.addoption(
        "--matrix-sample", type=int, default=1, metavar="N",
        help=f"run about 1/N of the cases of every test function with at least "
             f"{MATRIX_CASES} cases: its first case and those whose node id hashes to 0 "
             f"modulo N, the same ones in every run (default 1: all).  For slow builds "
             f"(sanitizers) after the whole suite has run on a normal one.")


def pytest_collection_modifyitems(config, items):
    n = config.getoption("matrix_sample")
    if n < 1:
        raise pytest.UsageError(f"--matrix-sample must be at least 1, got {n}")
    if n == 1:
        return
    functions = [item.nodeid.split("[")[0] for item in items]
    cases = collections.Counter(functions)
    seen, keep, drop = set(), [], []
    for item, function in zip(items, functions):
        sampled = function not in seen or zlib.crc32(item.nodeid.encode()) % n == 0
        seen.add(function)
        (keep if cases[function] < MATRIX_CASES or sampled else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# --------------------------------------------------------------------------- torch

# README's test command installs neither torch nor transformers (whose tests need torch
# too): there the tests that need them skip, or check less.  CI runs the tests marked
# `torch` again with torch installed (`pytest -m torch`, .ci/run).  The mark is set on every
# test whose own code (decorators included) names torch or transformers (an importorskip,
# an import, a check of whether one is installed), and on every test of a file whose shared
# code (imports, helpers, fixtures) names them: so a new test that needs torch is never left
# out of CI, and a large file with one torch test does not run whole a second time.
TORCH_NAMES = frozenset({"torch", "transformers"})
DOTTED_NAME = re.compile(r"[A-Za-z_][\w.]*")
# The tests marked `extras`: those that name an optional package, or resnorm's modules and
# commands that use them (the benchmark's peers and plots, the accuracy table's peers,
# explain's bfloat16), found as the torch tests are.
EXTRA_NAMES = frozenset(EXTRA_PACKAGES | {"bench", "accuracy", "explain"})


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "torch: needs torch or transformers, or checks more with them (set by "
                   "conftest.py; CI runs these again with torch installed: pytest -m torch)")
    config.addinivalue_line(
        "markers", "docs: builds or checks the documentation site (tests/test_docs_site.py; "
                   "the build needs docs/requirements.txt and torch, else it skips)")
    config.addinivalue_line(
        "markers", "extras: uses an optional package, or checks more with one (set by "
                   "conftest.py; CI runs these again without them: "
                   "RESNORM_TESTS_WITHOUT_EXTRAS=1 pytest -m extras)")


def _names(tree, names):
    """Whether code names one of names, as a name, a module or a string such as "torch" or
    "resnorm.torch" (comments and prose do not count)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            dotted = node.id
        elif isinstance(node, ast.Attribute):
            dotted = node.attr
        elif isinstance(node, ast.alias):
            dotted = node.name
        elif isinstance(node, ast.ImportFrom):
            dotted = node.module or ""
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            dotted = node.value if DOTTED_NAME.fullmatch(node.value) else ""
        else:
            continue
        if names & set(dotted.split(".")):
            return True
    return False


@functools.lru_cache(maxsize=None)
def tests_naming(path, names):
    """The tests of a Python file that name one of names: all of them (True) when its shared
    code does, else the names of the test functions and classes that do."""
    with open(path, encoding="utf-8") as f:
        body = ast.parse(f.read()).body
    tests = [node for node in body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
             and node.name.startswith(("test", "Test"))]
    if any(_names(node, names) for node in body if node not in tests):
        return True
    return {node.name for node in tests if _names(node, names)}


def pytest_itemcollected(item):
    if item.path.suffix != ".py":
        return
    test = item.nodeid.split("::")[1].split("[")[0]
    for names, mark in ((TORCH_NAMES, pytest.mark.torch),
                        (EXTRA_NAMES, pytest.mark.extras)):
        marked = tests_naming(item.path, names)
        if marked is True or test in marked:
            item.add_marker(mark)


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


def make_inputs(rng, shape, dtype, weight=True, bias=True, scale=1.0, offset=0.0):
    """x, weight (or None), bias (or None), dy, all of dtype, for an input of shape."""
    d = shape[-1]
    x = (offset + scale * rng.standard_normal(shape)).astype(dtype)
    w = (1.0 + 0.5 * rng.standard_normal(d)).astype(dtype) if weight else None
    b = rng.standard_normal(d).astype(dtype) if bias else None
    dy = rng.standard_normal(shape).astype(dtype)
    return x, w, b, dy


# --------------------------------------------------------------------------- runners

def run_rms(x, w, dy, eps=RMS_EPS, n_threads=None):
    """Kernel RMSNorm forward + backward: dict of y, rstd (shape x.shape[:-1]), dx, dw."""
    y, cache = resnorm.rms_norm_forward(x, w, eps, n_threads=n_threads)
    dx, dw = resnorm.rms_norm_backward(dy, cache, n_threads=n_threads)
    return {"y": y, "rstd": cache.rstd.reshape(np.shape(x)[:-1]), "dx": dx, "dw": dw}


def run_ln(x, w, b, dy, eps=LN_EPS, n_threads=None):
    """Kernel LayerNorm forward + backward: dict of y, mean, rstd, dx, dw, db."""
    y, cache = resnorm.layer_norm_forward(x, w, b, eps, n_threads=n_threads)
    dx, dw, db = resnorm.layer_norm_backward(dy, cache, n_threads=n_threads)
    stat_shape = np.shape(x)[:-1]
    return {"y": y, "mean": cache.mean.reshape(stat_shape),
            "rstd": cache.rstd.reshape(stat_shape), "dx": dx, "dw": dw, "db": db}


def ref_rms(x, w, dy, eps=RMS_EPS):
    """float64 reference of run_rms, plus the scales of the terms of every output."""
    y, rstd = ref.rms_norm_forward(x, w, eps)
    dx, dw = ref.rms_norm_backward(dy, x, w, rstd)
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    w64 = np.ones(x64.shape[-1]) if w is None else np.asarray(w, np.float64)
    xn = x64 * rstd[..., None]
    return {"y": y, "rstd": rstd, "dx": dx, "dw": dw,
            "scales": _scales(np.abs(xn), w64, None, dy64, rstd)}


def ref_ln(x, w, b, dy, eps=LN_EPS):
    """float64 reference of run_ln, plus the scales of the terms of every output."""
    y, mean, rstd = ref.layer_norm_forward(x, w, b, eps)
    dx, dw, db = ref.layer_norm_backward(dy, x, w, mean, rstd)
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    w64 = np.ones(x64.shape[-1]) if w is None else np.asarray(w, np.float64)
    xhat = (x64 - mean[..., None]) * rstd[..., None]
    # The mean is a double sum, known to a few double ulps of mean|x| (summation order
    # differs from the reference): every xhat may shift by ~1e-15*rstd*mean|x|, which is
    # 1e-3*rstd*mean|x| at the float64 rtol of 1e-12 (and negligible at float32's).
    mean_abs = np.mean(np.abs(x64), axis=-1, keepdims=True) if x64.size else 0.0
    xmag = np.abs(xhat) + 1e-3 * rstd[..., None] * mean_abs
    return {"y": y, "mean": mean, "rstd": rstd, "dx": dx, "dw": dw,
            "db": db if b is not None else None,
            "scales": _scales(xmag, w64, b, dy64, rstd)}


def _rowmax(a):
    """max |a| over the last axis, kept as a broadcastable axis (0 for empty rows)."""
    if a.size == 0:
        return np.zeros(a.shape[:-1] + (1,))
    return np.max(np.abs(a), axis=-1, keepdims=True)


def _scales(xmag, w, b, dy, rstd):
    """Size of the terms each output is built from, per row (y, dx) or per column (dw, db).

    xmag: |xhat| (RMSNorm: |x*rstd|), widened by the uncertainty of the mean for LayerNorm.

    y:  xhat*w (+ b); x - mean is rounded relative to itself, so |xhat*w| bounds it.
    dx: rstd*g, rstd*mean(g) and rstd*xhat*mean(g*xhat) with g = dy*w: bounded by
        rstd*max|g|*(1 + max xhat^2).  Not |dx| itself: dx may be a cancellation to ~0.
    dw: sum_rows |dy*xhat|.   db: sum_rows |dy|.
    """
    d = xmag.shape[-1]
    sy = _rowmax(xmag * w)
    if b is not None:
        sy = sy + np.max(np.abs(np.asarray(b, np.float64)))
    g = dy * w
    sdx = rstd[..., None] * _rowmax(g) * (1.0 + _rowmax(xmag) ** 2)
    sdw = np.abs(dy * xmag).reshape(-1, d).sum(axis=0)
    sdb = np.abs(dy).reshape(-1, d).sum(axis=0)
    return {"y": sy, "dx": sdx, "dw": sdw, "db": sdb}


# --------------------------------------------------------------------------- checks

def assert_scaled_close(actual, expected, scale, rtol, what=""):
    """|actual - expected| <= rtol * scale everywhere (scale broadcasts); NaN fails."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual - expected)
    bound = rtol * np.broadcast_to(np.asarray(scale, np.float64), err.shape)
    ok = err <= bound
    if not np.all(ok):
        idx = np.unravel_index(np.argmin(np.where(ok, np.inf, bound - err)), err.shape)
        ratio = np.max(np.where(bound > 0, err / np.where(bound > 0, bound, 1), np.inf))
        raise AssertionError(
            f"{what}: max |err|/(rtol*scale) = {ratio:.3g} > 1; first bad index {idx}: "
            f"actual {actual[idx]!r}, expected {expected[idx]!r}, bound {bound[idx]!r}")


def assert_stats_close(actual, expected, what, scale=None, lanes=np.float64):
    """Row statistics: float64, STAT_RTOL relative (to scale when given, e.g. for a mean);
    lanes: the dtype of the rows whose LayerNorm sums these are (float32 lanes for every
    dtype but float64: LANE_STAT_RTOL)."""
    actual = np.asarray(actual)
    assert actual.dtype == np.float64, f"{what} must be float64, got {actual.dtype}"
    s = np.abs(expected) if scale is None else scale
    rtol = STAT_RTOL if np.dtype(lanes) == np.float64 else LANE_STAT_RTOL
    assert_scaled_close(actual, expected, s, rtol, what)


def assert_bitwise_equal(a, b, what=""):
    """Same dtype, shape and bytes (None only equals None)."""
    if a is None or b is None:
        assert a is None and b is None, f"{what}: {a!r} vs {b!r}"
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    assert np.array_equal(a, b, equal_nan=True), f"{what}: values differ"
    assert a.tobytes() == b.tobytes(), f"{what}: bytes differ"


def central_diff(f, a, h=1e-6):
    """d f / d a by central differences, one element of a at a time (a is restored)."""
    grad = np.empty_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + h
        fp = f()
        a[i] = old - h
        fm = f()
        a[i] = old
        grad[i] = (fp - fm) / (2 * h)
    return grad


def run_at_level(script, path, level, timeout=300):
    """Runs script in a fresh interpreter with the dispatch capped at level (RESNORM_CPU;
    None: uncapped); the script writes its arrays to path (argv[1], an .npz) and prints
    {"simd_level": ...} last.  Returns (the level it ran at, its arrays)."""
    env = dict(os.environ)
    env.pop("RESNORM_CPU", None)
    if level is not None:
        env["RESNORM_CPU"] = level
    src = os.path.dirname(os.path.dirname(resnorm.__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH")] if p)
    proc = subprocess.run([sys.executable, "-c", script, str(path)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    reported = json.loads(proc.stdout.strip().splitlines()[-1])["simd_level"]
    with np.load(path) as f:
        return reported, {k: f[k] for k in f.files}
