"""The benchmark suite: what it times is what it says (every public op, peers computing the
same thing, checked against the float64 reference before they are timed), its rows,
tables and JSON have the documented structure, its output speaks to users, and the goal
check reads the rows correctly.  No timing is asserted anywhere."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import resnorm
from resnorm import bench
from resnorm.bench import _check, _machine, _peers, _peers_torch, _plot, _report, _run
from resnorm.bench._cases import fixed, parts
from resnorm.bench._copy import CopyReference
from resnorm.bench._results import fastest, peer_result
from resnorm.bench._run import Budget, scaling_threads
from resnorm.bench._timing import (BURST_SECONDS, burst_calls, per_call_seconds,
                                   repeats_for, time_budgeted)

TINY = Budget(seconds=0.002, lo=3, hi=5, calls=10, latency_repeats=3, latency_seconds=1e-5)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_OPS = {"build_flags", "explain", "get_num_threads", "openmp_enabled", "reference",
           "simd_level"}

try:
    import torch
except ImportError:
    torch = None

INSTALLED = [p for p in bench.PEERS if _peers.installed(p) and p != "torch.compile"]


# --------------------------------------------------------------------------- the ops

def test_every_public_op_is_benchmarked():
    public = [n for n in resnorm.__all__
              if n not in NOT_OPS and not isinstance(getattr(resnorm, n), type)]
    assert len(public) >= 27
    for name in public:
        assert name in bench.OPS, name
    # the default table leaves out the training forms; the latency section does not
    assert "rms_norm_forward" not in bench._cases.table_ops()
    assert {"rms_norm", "rms_norm_backward"} <= set(bench._cases.table_ops())


@pytest.mark.parametrize("op", bench.OPS)
def test_resnorm_and_every_installed_peer_match_the_reference(op):
    """float64, where every library should agree with the reference to rounding: resnorm
    (both output forms, which agree bitwise) and each installed in-process peer."""
    case = bench.setup(op, (24, 80), "float64", torch)
    alloc = case.flat(case.alloc(1))
    assert _check.error(case, alloc) < 1e-13
    if case.out is not None:
        for a, b in zip(alloc, case.flat(case.out(1))):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(a, b)
    for name, bind in _peers.binders(case, INSTALLED).items():
        try:
            call = bind(1, 1)
        except Exception as e:   # ONNX Runtime has no float64 Skip*LayerNormalization
            assert name == "onnxruntime", (name, e)
            continue
        assert _check.error(case, parts(call())) < 1e-12, name


@pytest.mark.skipif(not _peers.installed("numba"), reason="numba is an optional peer")
@pytest.mark.parametrize("fused", [False, True])
def test_numba_norm_loops_are_the_same_in_inference_and_training(fused):
    # The inference form's loop must be the training form's (statistics stored to
    # scratch): numba compiles a loop given None for rstd separately, and LLVM leaves
    # that one's scaling loop scalar, a slower peer than a user would keep.
    from resnorm.bench import _peers_numba as nb
    x = np.linspace(-1.0, 1.0, 2 * 40, dtype=np.float32).reshape(2, 40)
    res = x[::-1].copy() if fused else None
    w = np.ones(40, np.float32)
    for peer in (nb.rms_norm, lambda x, w, eps, **k: nb.layer_norm(x, w, w, eps, **k)):
        peer(x, w, 1e-6, stats=True, res=res, prenorm=fused)(1, 1)()
        loop = nb._compiled[("_norm", False)]
        trained = set(loop.signatures)
        y = peer(x, w, 1e-6, stats=False, res=res, prenorm=fused)(1, 1)()
        assert set(loop.signatures) == trained
        assert len(y) == (2 if fused else 1)


@pytest.mark.skipif(torch is None, reason="torch is optional")
def test_torch_gated_rms_norm_peer_is_hugging_faces_module():
    # the torch peer of the gated RMSNorm ops is the Mamba2 models' gated norm as
    # transformers writes it (one group per row), forward and backward
    modeling = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
    shape = (6, 48)
    for op in ("gated_rms_norm", "gated_rms_norm_backward"):
        case = bench.setup(op, shape, "float32", torch)
        x, g, w = (torch.from_numpy(a.copy()).requires_grad_(True) for a in case.torch.inputs)
        norm = modeling.Mamba2RMSNormGated(shape[1], group_size=shape[1], eps=1e-6)
        with torch.no_grad():
            norm.weight.copy_(w)
        y = norm(x, g)
        mine = case.torch.fn(x, g, w)
        torch.testing.assert_close(mine, y, rtol=0, atol=0)
        if case.torch.grads is not None:
            dy = torch.from_numpy(case.torch.grads[0])
            ours = torch.autograd.grad(mine, (x, g, w), dy)
            theirs = torch.autograd.grad(y, (x, g, norm.weight), dy)
            for a, b in zip(ours, theirs):
                torch.testing.assert_close(a, b)


def test_traffic_counts_at_least_one_read_and_one_write():
    for op in bench.OPS:
        case = bench.setup(op, (4, 16), "float32")
        assert case.traffic >= 2 * 4 * 16 * 4, op
        assert case.kind in ("forward", "backward", "fused")


def test_unknown_op_or_peer_is_a_value_error():
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        bench.setup("nope", (2, 8), "float32")
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        bench.run(ops=["nope"], shapes=[(2, 8)], progress=False, budget=TINY)
    with pytest.raises(ValueError, match="unknown peer 'jax'"):
        bench.run(ops=["rms_norm"], shapes=[(2, 8)], peers=["jax"], progress=False,
                  budget=TINY)


# --------------------------------------------------------------------------- the check

def test_check_accepts_float32_rounding_and_rejects_a_wrong_output():
    case = bench.setup("rms_norm_backward", (64, 256), "float32")
    dx, dw = case.alloc(1)
    assert _check.is_right("float32", _check.error(case, (dx, dw)))
    assert not _check.is_right("float32", _check.error(case, (dx * 1.01, dw)))
    assert not _check.is_right("float32", _check.error(case, (dx, dw + 1e-2 * np.abs(dw).max())))
    nan = dx.copy()
    nan[3, 4] = np.nan
    assert not _check.is_right("float32", _check.error(case, (nan, dw)))
    assert not _check.is_right("float32", _check.error(case, (dx[:-1], dw)))   # shape
    assert not _check.is_right("float32", _check.error(case, (None, None)))    # nothing


def test_check_of_random_ops_reads_the_mask_back():
    case = bench.setup("dropout", (64, 256), "float32")
    (x,) = bench._cases.arrays((64, 256), np.dtype("float32"), ["x"])
    rng = np.random.default_rng(5)
    own_mask = rng.random(x.shape) >= 0.1      # another library's mask, same p
    y = np.where(own_mask, x / np.float32(0.9), 0).astype(np.float32)
    assert _check.is_right("float32", _check.error(case, (y,)))
    assert not _check.is_right("float32", _check.error(case, (x,)))   # nothing dropped
    wrong_scale = np.where(own_mask, x, 0).astype(np.float32)          # no 1/(1-p)
    assert not _check.is_right("float32", _check.error(case, (wrong_scale,)))


# --------------------------------------------------------------------------- timing

def test_repeats_come_from_the_budget_within_bounds():
    assert repeats_for(1.0, 1.0, 3, 201) == 3        # slow rounds: the minimum
    assert repeats_for(1e-6, 1.0, 3, 201) == 201     # fast rounds: the maximum
    assert repeats_for(0.01, 1.0, 3, 201) == 100


def test_time_interleaved_calls_every_function_in_rounds():
    calls = []
    times = bench.time_interleaved([lambda: calls.append("a"), lambda: calls.append("b")],
                                   repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert len(times) == 2 and all(t >= 0 for t in times)


def test_short_calls_are_timed_in_bursts_long_ones_alone():
    assert burst_calls(1.0) == 1 and burst_calls(BURST_SECONDS * 2) == 1
    assert burst_calls(BURST_SECONDS / 50) == 50
    assert burst_calls(0.0) == 1000                   # bounded
    calls = {"short": 0, "long": 0}

    def short():
        calls["short"] += 1

    def long():
        calls["long"] += 1
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2 * BURST_SECONDS:
            pass
    (t_short, t_long), repeats = time_budgeted([short, long], budget=0.0, lo=3, hi=3)
    assert repeats == 3 and calls["long"] == 2 + 1 + 3    # two single calls, warm-up, rounds
    assert calls["short"] > 10 * (2 + 1 + 3)                  # bursts of many calls
    assert t_short < BURST_SECONDS < t_long                   # per call, not per burst


def test_rounds_start_one_function_later_each_time():
    calls = []
    per_call_seconds([lambda: calls.append("a"), lambda: calls.append("b"),
                      lambda: calls.append("c")], 1, repeats=3)
    assert "".join(calls) == "abc" + "abc" + "bca" + "cab"   # warm-up, then the rounds


def test_per_call_seconds_takes_a_count_per_function():
    calls = {"a": 0, "b": 0}
    per_call_seconds([lambda: calls.__setitem__("a", calls["a"] + 1),
                      lambda: calls.__setitem__("b", calls["b"] + 1)], [3, 5], repeats=2)
    assert calls == {"a": 3 * 3, "b": 5 * 3}   # warm-up plus two timings


# --------------------------------------------------------------------------- rows

def _small_run(**kw):
    args = dict(ops=["rms_norm", "scaled_residual_backward"], shapes=[(4, 32)],
                dtypes=["float32"], threads=[1], peers=["numpy"], sections=["table"],
                budget=TINY, progress=False)
    return bench.run(**{**args, **kw})


def test_half_precision_rows():
    # float16 always; bfloat16 with ml_dtypes: every op has rows in them, checked against
    # the float64 reference within two units of the dtype's epsilon
    dtypes = ["float16"] + (["bfloat16"] if importlib.util.find_spec("ml_dtypes") else [])
    ops = ["rms_norm", "layer_norm_backward", "add_rms_norm", "gated_residual",
           "gated_residual_backward", "gated_rms_norm", "gated_rms_norm_backward"]
    res = _small_run(ops=ops, dtypes=dtypes + ["float32"], peers=["numpy"])
    cells = {(r.op, r.dtype) for r in res.rows}
    assert {(op, dt) for op in ops for dt in dtypes + ["float32"]} <= cells
    for r in res.rows:
        assert r.resnorm_us > 0 and r.resnorm_error <= _check.TOLERANCE[r.dtype]


def test_rows_have_consistent_fields():
    res = _small_run()
    forms = [(r.op, r.preallocated) for r in res.rows]
    # every op: into preallocated outputs, then allocating
    assert forms == [("rms_norm", True), ("rms_norm", False),
                     ("scaled_residual_backward", True), ("scaled_residual_backward", False)]
    for r in res.rows:
        assert r.shape == (4, 32) and r.dtype == "float32" and r.threads == 1
        assert r.resnorm_us > 0 and r.copy_us > 0 and r.resnorm_error < 1e-5
        assert list(r.peers) == ["numpy"]
        numpy_peer = r.peers["numpy"]
        assert numpy_peer["status"] == "ok" and numpy_peer["us"] > 0
        assert numpy_peer["error"] < _check.TOLERANCE["float32"]
        assert r.best_peer == "numpy"
        assert r.vs_best == pytest.approx(numpy_peer["us"] / r.resnorm_us)
        assert r.gbps == pytest.approx(r.traffic_bytes / r.resnorm_us / 1e3)
        assert r.x_copy == pytest.approx(r.gbps / r.copy_gbps)
        assert 3 <= r.repeats <= 5
    assert res.rows[0].kind == "forward" and res.rows[3].kind == "backward"
    assert res.meta["ops"] == ["rms_norm", "scaled_residual_backward"]
    assert res.meta["peers"]["numpy"]["left_out"] is None
    assert res.meta["peers"]["numba"]["left_out"] == "not asked for"
    assert res.meta["load_average_start"] is None or res.meta["load_average_start"] >= 0


def test_peers_appear_only_when_installed(monkeypatch):
    res = _small_run(peers=None, use_torch=False)
    for name in ("numba", "onnxruntime"):
        present = any(name in r.peers for r in res.rows)
        assert present == _peers.installed(name), name
    assert not any("torch" in r.peers for r in res.rows)
    assert res.meta["peers"]["torch"]["left_out"] == "--no-torch"
    # as if numba and onnxruntime were not installed
    real = _peers.installed
    monkeypatch.setattr(_peers, "installed",
                        lambda name: name not in ("numba", "onnxruntime") and real(name))
    res = _small_run(peers=None, use_torch=False)
    assert {name for r in res.rows for name in r.peers} == {"numpy"}
    assert res.meta["peers"]["numba"]["left_out"] == \
        'not installed (pip install "resnorm[bench]")'
    assert 'left out: not installed (pip install "resnorm[bench]")' in bench.report(res)


def test_the_headline_names_the_peers_beaten_and_those_missing(monkeypatch):
    # as if NumPy were the only peer installed: the headline must not read as a win over
    # every library, and says how to add the others
    real = _peers.installed
    monkeypatch.setattr(_peers, "installed", lambda name: name == "numpy" and real(name))
    res = _small_run(peers=None, quick=True)
    headline = bench.report(res).split("## resnorm and its peers\n\n")[1].split("\n")[0]
    assert headline.startswith("resnorm (preallocated outputs where the op takes them) "
                               "against NumPy: faster than the fastest of them in ")
    assert "; faster than NumPy in " in headline
    assert ("Not compared: torch and torch.compile: not installed (pip install torch "
            "--index-url https://download.pytorch.org/whl/cpu, then pip install "
            '"resnorm[torch]"); numba and ONNX Runtime: not installed (pip install '
            '"resnorm[bench]").') in headline


def test_the_headline_counts_the_cells_won_against_each_peer():
    rows = [_row("rms_norm", (8, 64), 1, True, vs_best=2.0),
            _row("rms_norm", (8, 64), 2, True, vs_best=0.5),
            _row("layer_norm", (8, 64), 1, True, vs_best=3.0)]
    rows[0].peers["numpy"] = peer_result("ok", us=5.0)
    rows[1].peers["numpy"] = peer_result("ok", us=0.8)
    text = _report.standing(rows, {"torch": {"left_out": "--no-torch"},
                                   "torch.compile": {"left_out": "--no-torch"}})
    assert text.startswith("resnorm (preallocated outputs where the op takes them) against "
                           "NumPy and numba: faster than the fastest of them in 2 of 3 cells")
    assert "faster than NumPy in 1 of 2, numba in 2 of 3." in text
    assert "Not compared: torch and torch.compile: --no-torch." in text


def test_a_wrong_peer_is_reported_as_wrong_and_not_timed():
    case = bench.setup("layer_norm", (16, 64), "float32")
    y = bench.setup("layer_norm", (16, 64), "float32").alloc(1)
    case.peers["numpy"] = fixed(lambda: y * np.float32(1.01))   # 1% off: a wrong peer
    copies = CopyReference(1)
    try:
        rows = _run.measure_case(case, 1, TINY, copies, ["numpy"])
    finally:
        copies.close()
    for r in rows:
        assert r.peers["numpy"]["status"] == "wrong"
        assert r.peers["numpy"]["us"] is None
        assert r.peers["numpy"]["error"] == pytest.approx(0.01, rel=0.05)
        assert r.best_peer is None and r.vs_best is None and r.resnorm_us > 0
    text = bench.markdown_table(rows)
    assert "| wrong |" in text
    res = bench.Results(rows=rows, meta={"peers": {}}, machine=bench.machine_info())
    assert "Output failed the check, so not timed: numpy" in bench.report(res)


def test_a_peer_that_cannot_run_is_reported_as_not_available():
    case = bench.setup("rms_norm", (16, 64), "float32")

    def bind(threads, used):
        raise RuntimeError("no kernel for this dtype")
    case.peers["numpy"] = bind
    copies = CopyReference(1)
    try:
        (row, _) = _run.measure_case(case, 1, TINY, copies, ["numpy"])
    finally:
        copies.close()
    assert row.peers["numpy"] == {"status": "unsupported", "us": None, "error": None,
                                  "note": "RuntimeError: no kernel for this dtype"}
    assert "| n/a |" in bench.markdown_table([row])


@pytest.mark.skipif(torch is None, reason="torch is optional; rows without it are tested above")
def test_rows_with_torch_have_a_torch_time():
    res = _small_run(peers=["torch"])
    for r in res.rows:
        p = r.peers["torch"]
        assert p["status"] == "ok" and p["us"] > 0 and r.best_peer == "torch"


@pytest.mark.skipif(torch is None, reason="torch.compile needs torch")
def test_torch_compile_runs_in_its_own_process_per_thread_count():
    steps = []
    cases = [("rms_norm", (8, 32), "float32"), ("add_rms_norm_backward", (8, 32), "float32")]
    got = _peers_torch.compiled_results(cases, 1, TINY, steps.append)
    assert len(steps) == 2
    for key in cases:
        result = got[key]
        if shutil.which("g++") or shutil.which("c++"):   # Inductor compiles C++
            assert result["status"] == "ok" and result["us"] > 0, result
            assert result["error"] < _check.TOLERANCE["float32"]
            # resnorm's two forms timed in the same rounds, to be compared with
            assert sorted(result["resnorm_us"]) == ["allocating", "preallocated"]
            assert all(us > 0 for us in result["resnorm_us"].values())
        else:
            assert result["status"] == "unsupported" and result["note"], result


def test_vs_best_compares_times_from_the_same_rounds():
    # numba shares resnorm's rounds (resnorm: 20 us there); torch.compile had rounds of
    # its own, where resnorm took 4 us: its 8 us is the faster time but the slower ratio
    peers = {"numba": peer_result("ok", us=10.0),
             "torch.compile": peer_result("ok", us=8.0,
                                          resnorm_us={"preallocated": 4.0, "allocating": 5.0}),
             "numpy": peer_result("wrong", error=1.0)}
    assert fastest(peers, "preallocated", 20.0) == ("numba", 0.5)
    peers["numba"]["us"] = 50.0
    assert fastest(peers, "preallocated", 20.0) == ("torch.compile", 2.0)
    assert fastest(peers, "allocating", 20.0) == ("torch.compile", 1.6)
    assert fastest(peers, "preallocated", None) == ("torch.compile", None)
    assert fastest({"numpy": peers["numpy"]}, "preallocated", 20.0) == (None, None)
    # the table shows the pair each ratio comes from
    assert _report._peer_cell(peers["torch.compile"], True, "allocating") == "**8.00** vs 5.00"
    assert _report._peer_cell(peers["numba"], False, "allocating") == "50.0"


def test_scaling_and_latency_sections():
    res = bench.run(ops=["rms_norm", "dropout", "scaled_residual_backward"],
                    shapes=[(8, 64), (256, 4096)], dtypes=["float32"],
                    sections=["scaling", "latency"], peers=INSTALLED, use_torch=False,
                    budget=TINY, progress=False)
    assert res.rows == []
    # scaling: only the large shape, only the ops of the scaling list, every thread count
    assert {(r.op, r.shape) for r in res.scaling} == {("rms_norm", (256, 4096))}
    assert [r.threads for r in res.scaling] == scaling_threads()
    assert max(r.threads for r in res.scaling) > os.cpu_count()   # oversubscribed
    one = [r for r in res.scaling if r.threads == 1][0]
    assert one.speedup == 1.0
    # latency: the ops asked for at both small shapes; numba beside the ops it has
    got = {(r.op, r.shape, r.variant) for r in res.latency}
    for shape in ((1, 4096), (8, 768)):
        assert {("rms_norm", shape, "preallocated"), ("rms_norm", shape, "allocating"),
                ("dropout", shape, "preallocated"),
                ("scaled_residual_backward", shape, "preallocated"),
                ("scaled_residual_backward", shape, "allocating")} <= got
        assert ("dropout", shape, "numba") not in got
        assert (("rms_norm", shape, "numba") in got) == _peers.installed("numba")
        assert ("rms_norm", shape, "numpy") not in got
    assert all(r.us > 0 and 10 <= r.calls <= TINY.calls for r in res.latency if r.us)
    assert all(r.status == "ok" for r in res.latency)


def test_latency_covers_every_op_by_default():
    planned = _run._plan(bench._cases.table_ops(), [(8, 8)], ["float32"], ["latency"],
                         bench.OPS)[2]
    assert {op for _, op in planned} == set(bench.OPS)
    assert {s for s, _ in planned} == {(1, 4096), (8, 768)}


# --------------------------------------------------------------------------- output

def test_markdown_tables_have_a_line_per_row():
    res = bench.run(ops=["rms_norm"], shapes=[(2, 16), (256, 4096)], dtypes=["float32"],
                    threads=[1], peers=["numpy"], budget=TINY, progress=False)
    table = bench.markdown_table(res.rows).splitlines()
    assert table[0] == ("| op | shape | dtype | threads | prealloc | resnorm us | GB/s | "
                        "x copy | numpy us | fastest peer | vs best |")
    assert len(table) == 2 + len(res.rows) == 2 + 4
    assert table[2].startswith("| rms_norm | 2x16 | float32 | 1 | yes |")
    assert "| numpy |" in table[2]   # the fastest peer, named
    scaling = bench.scaling_table(res.scaling).splitlines()
    assert len(scaling) == 3 and scaling[2].startswith("| rms_norm | 256x4096 | float32 |")
    latency = bench.latency_table(res.latency).splitlines()
    assert len(latency) == 2 + 2    # rms_norm at both latency shapes
    text = bench.report(res)
    titles = [line for line in text.splitlines() if line.startswith("## ")]
    assert titles[0] == "## resnorm and its peers"     # the comparison first
    assert "## Small-call latency" in titles and "## Thread scaling" in text
    assert "## Goals" not in text
    assert "## Goals" in bench.report(res, bench.evaluate_goals(res))


def test_json_round_trip_and_machine_info(tmp_path):
    path = tmp_path / "bench.json"
    res = _small_run(sections=["table", "latency"], json_path=str(path))
    data = json.loads(path.read_text())
    assert set(data) == {"meta", "machine", "rows", "scaling", "latency"}
    for key in ("cpu", "cores", "simd_level", "build_flags", "openmp", "numpy", "scipy",
                "torch", "numba", "onnxruntime", "python", "cython_build", "load_average"):
        assert key in data["machine"], key
    assert data["machine"]["openmp"] == resnorm.openmp_enabled()
    row = data["rows"][0]
    assert row["op"] == "rms_norm" and row["shape"] == [4, 32]
    assert row["peers"]["numpy"]["status"] == "ok" and row["peers"]["numpy"]["us"] > 0
    assert row["best_peer"] == "numpy" and row["vs_best"] > 0
    assert set(data["meta"]["peers"]) == set(bench.PEERS)
    back = bench.Results.from_json(path.read_text())
    assert back.rows == res.rows and back.latency == res.latency and back.meta == res.meta


# --------------------------------------------------------------------------- goals

def _row(op, shape, threads, preallocated, x_copy=1.0, vs_best=None, kind="forward"):
    peers = {} if vs_best is None else {"numba": {"status": "ok", "us": vs_best,
                                                  "error": 0.0, "note": ""}}
    return bench.Row(op=op, kind=kind, shape=shape, dtype="float32", threads=threads,
                     preallocated=preallocated, resnorm_us=1.0, resnorm_error=0.0,
                     traffic_bytes=1000, gbps=1.0, copy_us=1.0, copy_gbps=1.0,
                     copy_threads=threads, x_copy=x_copy, peers=peers,
                     best_peer=None if vs_best is None else "numba", vs_best=vs_best,
                     repeats=3)


def _goals(rows, latency=()):
    found = bench.evaluate_goals(bench.Results(rows=list(rows), latency=list(latency)))
    return {(g.goal, g.op, g.shape, g.threads): g for g in found}


def test_bandwidth_goals_read_the_preallocated_row_by_size():
    big, cached = (2048, 4096), (2048, 768)
    g = _goals([_row("rms_norm", big, 1, True, x_copy=1.0),
                _row("rms_norm", big, 1, False, x_copy=0.30),
                _row("rms_norm", big, 2, True, x_copy=0.99),
                _row("rms_norm", cached, 1, True, x_copy=0.9),
                _row("rms_norm_backward", cached, 2, True, x_copy=0.69, kind="backward"),
                _row("add_rms_norm", big, 1, True, x_copy=1.0, kind="fused"),
                _row("dropout", big, 1, True, x_copy=0.1)])
    assert g[("forward >= 1.0 x copy (large)", "rms_norm", big, 1)].status == "MET"   # boundary
    assert g[("forward >= 1.0 x copy (large)", "rms_norm", big, 2)].status == "NOT MET"
    assert g[("forward >= 0.9 x copy (cache-resident)", "rms_norm", cached, 1)].status == "MET"
    assert g[("backward >= 0.7 x copy (cache-resident)", "rms_norm_backward", cached,
              2)].status == "NOT MET"
    assert g[("forward >= 1.0 x copy (large)", "add_rms_norm", big, 1)].status == "MET"
    # goals are set for the main norms only, and only for measured rows
    assert not [k for k in g if k[1] == "dropout"]
    assert ("forward >= 1.0 x copy (large)", "rms_norm", (16384, 1024), 1) not in g


def test_ahead_of_the_best_peer_and_the_median_margin():
    big = (8192, 4096)
    g = _goals([_row("layer_norm", big, 1, True, vs_best=1.3),
                _row("layer_norm", big, 2, True, vs_best=1.0),
                _row("layer_norm_backward", big, 1, True, vs_best=2.0, kind="backward"),
                _row("rms_norm", big, 1, True)])            # no peer timed
    ahead = "faster than the best peer (vs best > 1)"
    assert g[(ahead, "layer_norm", big, 1)].status == "MET"
    assert g[(ahead, "layer_norm", big, 2)].status == "NOT MET"   # a tie is not ahead
    assert g[(ahead, "rms_norm", big, 1)].status == "NOT MET"
    assert g[(ahead, "rms_norm", big, 1)].note == "no peer timed"
    margin = g[("median vs best over those cells >= 1.2", "all", None, None)]
    assert margin.measured == pytest.approx(1.3) and margin.status == "MET"


def test_small_call_goals_read_the_latency_rows():
    def lat(op, variant, us):
        return bench.LatencyRow(op, (1, 4096), "float32", variant, us, 100, 5)
    g = _goals([], [lat("rms_norm", "preallocated", 0.9), lat("rms_norm", "allocating", 1.4),
                    lat("rms_norm", "numba", 0.8),
                    lat("add_rms_norm", "preallocated", 1.4),
                    lat("rms_norm_backward", "preallocated", 1.6),
                    lat("scaled_residual_backward", "allocating", 1.0)])
    shape = (1, 4096)
    assert g[("small call (forward) <= 1.0 us", "rms_norm", shape, None)].status == "MET"
    assert g[("allocating adds <= 0.4 us", "rms_norm", shape, None)].status == "NOT MET"
    numba = g[("faster than the numba loop (numba / resnorm > 1)", "rms_norm", shape, None)]
    assert numba.status == "NOT MET" and numba.measured == pytest.approx(0.8 / 0.9)
    assert g[("small call (backward and fused) <= 1.5 us", "add_rms_norm", shape,
              None)].status == "MET"
    assert g[("small call (backward and fused) <= 1.5 us", "rms_norm_backward", shape,
              None)].status == "NOT MET"
    assert g[("small call (backward and fused) <= 1.5 us", "scaled_residual_backward", shape,
              None)].status == "MET"
    text = bench.goals_table(list(g.values()))
    assert "| small call (forward) <= 1.0 us | 1 of 1 |" in text
    assert "| allocating adds <= 0.4 us | rms_norm | 1x4096 | - | 0.50 |" in text


# --------------------------------------------------------------------------- CLI, RESULTS.md

def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "resnorm", "bench", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_cli_quick_writes_table_json_and_png_for_users(tmp_path):
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    args = ["--quick", "--shape", "8x64", "--threads", "1", "--peers", "numpy", "--budget",
            "0.002", "--json", str(js)]
    p = _cli(*args, "--png", str(png))
    if not has_mpl:
        assert p.returncode == 2 and "--png needs matplotlib" in p.stderr
        p = _cli(*args)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[4] == "## resnorm and its peers"
    # "1 (busy)" when other processes kept every core busy while it was timed (CI runs
    # the suite beside a build)
    assert re.search(r"\| rms_norm \| 8x64 \| float32 \| 1( \(busy\))? \| yes \|", p.stdout)
    assert ("resnorm (preallocated outputs where the op takes them) against NumPy: faster "
            "than the fastest of them in ") in p.stdout
    assert "## Goals" not in p.stdout
    # progress on a pipe: plain lines, never a carriage return
    assert "\r" not in p.stdout + p.stderr and "benchmark: " in p.stderr
    assert "issue" not in (p.stdout + p.stderr).lower()
    data = json.loads(js.read_text())
    assert {r["op"] for r in data["rows"]} == set(bench.QUICK_OPS)
    assert data["meta"]["command"].startswith("resnorm bench --quick --shape 8x64")
    if has_mpl:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_goals_only_when_asked_and_never_naming_work_items():
    p = _cli("--ops", "rms_norm", "--shape", "2048x768", "--threads", "1", "--dtype",
             "float32", "--peers", "numpy", "--sections", "table", "--budget", "0.002",
             "--goals", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "## Goals" in p.stdout and "faster than the best peer" in p.stdout
    assert "issue" not in p.stdout.lower() and "target" not in p.stdout.lower()


def test_cli_runs_without_openblas_overrides_and_says_so(tmp_path):
    js = tmp_path / "b.json"
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576"}
    p = _cli("--ops", "rms_norm", "--shape", "8x64", "--threads", "1", "--dtype", "float32",
             "--peers", "numpy", "--sections", "table", "--budget", "0.002", "--no-progress",
             "--json", str(js), env=env)
    assert p.returncode == 0, p.stderr
    assert "OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE were set in the environment; the " \
           "benchmark ran without them" in p.stdout.replace("\n", " ")
    machine = json.loads(js.read_text())["machine"]
    assert machine["openblas_unset"] == ["OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"]
    assert not [k for k in machine["omp_env"] if k.startswith("OPENBLAS_")]


def test_cli_rejects_bad_arguments():
    p = _cli("--ops", "nope", "--no-progress")
    assert p.returncode == 2 and "unknown op 'nope'" in p.stderr
    p = _cli("--shape", "8by64")
    assert p.returncode == 2 and "shape must look like 2048x4096" in p.stderr
    p = _cli("--peers", "jax")
    assert p.returncode == 2 and "invalid choice: 'jax'" in p.stderr


def test_make_results_renders_every_section(tmp_path):
    path = tmp_path / "bench.json"
    bench.run(ops=["rms_norm", "layer_norm"], shapes=[(256, 4096)], dtypes=["float32"],
              threads=[1], peers=["numpy"], budget=TINY, progress=False, json_path=str(path),
              command="resnorm bench --test")
    spec = importlib.util.spec_from_file_location(
        "make_results", os.path.join(ROOT, "benchmarks", "make_results.py"))
    make_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_results)
    results = bench.Results.from_json(path.read_text())
    text = make_results.render(results, note="provisional", png="bench.png")
    for part in ("**provisional**", "python -m resnorm bench --test", "load average",
                 "| simd_level |", "![achieved bandwidth", "## resnorm and its peers",
                 "## Peers", "## Thread scaling", "## Small-call latency",
                 "## All rows, float32", "RESULTS_residual.md",
                 "faster than the fastest of them"):
        assert part in text, part
    assert "## Goals" not in text and "issue" not in text.lower()
    assert "## Goals" in make_results.render(results, goals=True)


def test_make_results_adds_the_rows_of_further_runs(tmp_path):
    first, second, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "RESULTS.md"
    for path, dtype in ((first, "float32"), (second, "float64")):
        bench.run(ops=["rms_norm"], shapes=[(8, 64)], dtypes=[dtype], threads=[1],
                  peers=["numpy"], budget=TINY, progress=False, json_path=str(path),
                  command=f"resnorm bench --dtype {dtype}")
    spec = importlib.util.spec_from_file_location(
        "make_results", os.path.join(ROOT, "benchmarks", "make_results.py"))
    make_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_results)
    make_results.main([str(first), str(second), "--out", str(out)])
    text = out.read_text()
    for part in ("## All rows, float32", "## All rows, float64",
                 "python -m resnorm bench --dtype float32\npython -m resnorm bench --dtype float64"):
        assert part in text, part


# --------------------------------------------------------------------------- busy rows, caches

def test_free_cores_count_other_processes_as_the_thread_rule_does():
    cores = len(os.sched_getaffinity(0))
    # one second in which this process's CPUs were busy 1.5 s, 0.5 s of it this process's
    assert _machine.free_cores((0.0, 100.0, 1.0), (1.0, 101.5, 1.5)) == max(0, cores - 1)
    assert _machine.free_cores((0.0, 100.0, 1.0), (1.0, 100.0 + 9 * cores, 1.0)) == 0
    # too short to tell from 10 ms clock ticks, or no /proc/stat: not measured
    assert _machine.free_cores((0.0, 100.0, 1.0), (0.01, 100.0, 1.0)) is None
    assert _machine.free_cores((0.0, None, 1.0), (1.0, None, 1.5)) is None
    start = _machine.cpu_sample()
    time.sleep(0.06)
    free = _machine.free_cores(start, _machine.cpu_sample())
    assert free is None or 0 <= free <= cores


def test_rows_record_the_free_cores_and_whether_the_data_fits_in_cache():
    case = bench.setup("rms_norm", (16, 64), "float32")
    copies = CopyReference(1)
    budget = Budget(seconds=0.08, lo=3, hi=2000, calls=10, latency_repeats=3,
                    latency_seconds=1e-5)
    try:
        fits = _run.measure_case(case, 1, budget, copies, ["numpy"], cache_bytes=1 << 20)
        spills = _run.measure_case(case, 1, TINY, copies, ["numpy"], cache_bytes=1024)
    finally:
        copies.close()
    cores = len(os.sched_getaffinity(0))
    for r in fits:
        assert r.in_cache is True
        assert r.free_cores is None or 0 <= r.free_cores <= cores
        assert r.busy == (r.free_cores is not None and r.free_cores < 1)
    assert all(r.in_cache is False and r.free_cores is None for r in spills)   # short rounds


def test_busy_rows_and_x_copy_from_cache_are_marked():
    quiet = _row("rms_norm", (8, 768), 1, True, x_copy=1.4, vs_best=2.0)
    quiet.in_cache, quiet.free_cores = True, 2
    busy = _row("rms_norm", (2048, 4096), 2, True, x_copy=1.2, vs_best=2.0)
    busy.in_cache, busy.free_cores = False, 1
    table = bench.markdown_table([quiet, busy]).splitlines()
    assert table[2].startswith("| rms_norm | 8x768 | float32 | 1 | yes | 1.00 | 1.0 | "
                               "1.40 (in cache) |")
    assert table[3].startswith("| rms_norm | 2048x4096 | float32 | 2 (busy) | yes | 1.00 | "
                               "1.0 | 1.20 |")
    text = _report.standing([quiet, busy])
    assert "1 of 2 cells were timed while other processes kept busy more of this " \
           "process's cores than its threads left free" in text
    note = _report.X_COPY_NOTE.replace("\n", " ")
    assert "x copy above 1 marked in cache: the op's data fits in the CPU's largest cache" \
           in note and "cache bandwidth, not memory bandwidth" in note
    # rows from before these fields read back unmarked
    old = {k: v for k, v in vars(busy).items() if k not in ("free_cores", "in_cache")}
    assert not bench.Row(**old).busy and bench.Row(**old).in_cache is None


def test_cache_sizes_read_as_bytes():
    assert _machine.cache_bytes("48K") == 48 << 10
    assert _machine.cache_bytes("32M") == 32 << 20
    assert _machine.cache_bytes("4096") == 4096
    assert _machine.cache_bytes("big") is None
    assert _machine.largest_cache({"L1d": "32K", "L2": "512K", "L3": "32768K"}) == 32 << 20
    assert _machine.largest_cache({}) is None


# --------------------------------------------------------------------------- machine facts

def test_cpu_flags_are_those_the_simd_level_is_chosen_from(monkeypatch):
    bf16_cpu = {"sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                "avx512dq", "avx512_bf16", "avx512_vnni"}
    monkeypatch.setattr(_machine, "_cpuinfo", lambda: ("a CPU", bf16_cpu))
    flags = bench.machine_info()["cpu_simd_flags"]
    assert {"avx512_bf16", "avx512dq", "avx512vl", "f16c"} <= set(flags)
    assert "avx512_vnni" not in flags and "avx" not in flags   # not part of the choice
    monkeypatch.undo()
    # on this machine: the chosen level's flags are all listed
    needs = {"sse2": {"sse2"}, "avx2": {"avx2", "fma", "f16c"},
             "avx512": {"avx512f", "avx512bw", "avx512vl", "f16c"},
             "avx512bf16": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}}
    info = bench.machine_info()
    if info["simd_level"] in needs and info["cpu_simd_flags"]:
        assert needs[info["simd_level"]] <= set(info["cpu_simd_flags"])


def test_cpu_flags_cover_every_flag_the_dispatch_tests():
    dispatch = os.path.join(ROOT, "resnorm_c", "core", "dispatch.c")
    if not os.path.exists(dispatch):
        pytest.skip("not run from a checkout: resnorm_c/ is not here")
    import re
    with open(dispatch) as f:
        tested = set(re.findall(r'__builtin_cpu_supports\("(\w+)"\)', f.read()))
    # /proc/cpuinfo spells AVX512-BF16 avx512_bf16
    assert {f.replace("avx512bf16", "avx512_bf16") for f in tested} == \
        set(_machine.LEVEL_FLAGS) - {"sse2"}


# --------------------------------------------------------------------------- the chart

@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="the chart needs matplotlib")
@pytest.mark.parametrize("with_scaling", [True, False])
def test_chart_draws_every_shape_and_keeps_legend_and_caveat_inside(with_scaling):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes, threads = [(8, 768), (2048, 768), (8192, 4096)], [1, 2]
    rows = []
    for shape in shapes:
        for t in threads:
            for op in ("rms_norm", "layer_norm_backward", "add_rms_norm_backward"):
                r = _row(op, shape, t, True, vs_best=2.0)
                r.in_cache, r.free_cores = shape[0] * shape[1] < 1 << 20, 0 if t == 2 else 2
                rows.append(r)
    scaling = [bench.ScalingRow("rms_norm", (8192, 4096), "float32", t, 10.0 / t, 1.0, 1.0,
                                float(t), 3) for t in (1, 2, 4)]
    res = bench.Results(rows=rows, scaling=scaling if with_scaling else [],
                        meta={"load_average_start": 3.5, "load_average_end": 4.0},
                        machine={"cores": 2})
    fig = _plot.figure(res)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        titles = [ax.get_title() for ax in fig.axes]
        for shape in shapes:
            for t in threads:
                name = f"{shape[0]}x{shape[1]}, {t} thread{'s' if t > 1 else ''}"
                assert any(title.startswith(name) for title in titles), name
        assert "8x768, 2 threads (in cache, busy)" in titles
        texts = [t for ax in fig.axes for t in ax.texts]
        words = [" ".join(t.get_text().split()) for t in texts]
        assert any("load average was 3.5" in w for w in words)   # the caveat
        assert any("Panels marked busy" in w for w in words)
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        labels = {t.get_text() for legend in legends for t in legend.get_texts()}
        assert {"resnorm", "numba", "np.copyto of the same bytes"} <= labels
        assert ("rms_norm" in labels) == with_scaling     # the scaling panel's legend
        inside = fig.bbox.padded(1)
        for artist in legends + texts + [fig._suptitle]:
            box = artist.get_window_extent(renderer)
            assert (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0
                    and box.y1 <= inside.y1), artist
        for ax in fig.axes:
            for label in ax.get_yticklabels() + ax.get_xticklabels():
                assert label.get_fontsize() >= 8
                assert "$" not in label.get_text()    # plain numbers, not 10^k
    finally:
        plt.close(fig)
