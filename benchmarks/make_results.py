"""Writes a RESULTS.md from the JSON of a `resnorm bench` run.

Into the untracked bench-results/ folder:

    python -m resnorm bench --json bench-results/bench.json --png bench-results/bench.png
    python benchmarks/make_results.py bench-results/bench.json --png bench-results/bench.png \\
        --out bench-results/RESULTS.md

(benchmarks/RESULTS.md and docs/img/bench.png are the same with --png docs/img/bench.png
and --out benchmarks/RESULTS.md.)  The tables are the run's rows, unchanged; --goals adds
the goal check, re-evaluated from them by resnorm.bench (the same code as the CLI's
--goals).  --note adds a line under the title (e.g. "provisional: measured while the
machine was busy").
"""
import argparse
import os
import sys

from resnorm import bench
from resnorm.bench import _goals
from resnorm.bench import _report as report
from resnorm.bench._check import TOLERANCE
from resnorm.bench._timing import BURST_SECONDS

METHOD = """\
* Every output (resnorm's and each peer's) is compared with the float64 reference
  (`resnorm.reference`) before it is timed; one that is off by more than
  {tolerance:g} of the output's scale (float32) is reported as wrong and not timed.
* Every case is timed in interleaved rounds: resnorm writing into preallocated outputs,
  resnorm allocating its outputs, each peer and `np.copyto` run once per round (a call
  under {burst_ms:g} ms as a burst of back-to-back calls, per call), so all see the same
  machine state.  Each round starts one function later than the one before: the first
  function of a round finds the caches as the last one of the previous round left them,
  and timed in a fixed order that was always resnorm's preallocated form.  Reported: medians after warm-up.  Rounds per case come from a
  time budget ({seconds} s per case, at least {lo}, at most {hi}): big shapes get few
  rounds.  torch.compile runs in its own process per thread count (Inductor fixes its
  team size when it compiles), timed there the same way in rounds with resnorm's two
  forms; its cells show its time and, after "vs", resnorm's from those rounds, and its
  `vs best` is their ratio (every ratio in a row compares times from the same rounds; the
  resnorm columns show the main rounds').
* GB/s counts the op's minimum traffic: every input read once, every output written once
  (parameter gradients and float64 row statistics included).  `x copy` = that GB/s divided
  by the GB/s of `np.copyto` moving the same number of bytes (reading half, writing half)
  on as many threads as the resnorm call uses (split over Python threads; NumPy releases
  the GIL while copying), in the same rounds.  Where writes cost more than reads, an op
  that reads more than it writes can exceed 1.0.
* `vs best` = the fastest peer's time / resnorm's time (above 1: resnorm is faster).  The
  numba loop and ONNX Runtime write into preallocated outputs; NumPy and torch allocate.
* Thread scaling: resnorm on {scaling_threads} threads (more threads than cores is
  oversubscribed), interleaved with copies on the same thread counts.
* Small-call latency: back-to-back calls (about {latency_ms:g} ms of them, at most {calls})
  per timing, median of {latency_repeats} timings, default `n_threads`.
* resnorm, PyTorch and numba bring OpenMP runtimes; after a parallel region their idle
  threads spin for a while, so on a machine with few cores they slow each other down in
  multi-thread rows (`--peers` chooses the peers of a run)."""


def _machine_table(m):
    keys = ["cpu", "cores", "caches", "cpu_simd_flags", "simd_level", "openmp",
            "omp_max_threads", "build_flags", "compiler", "cython_build", "python", "numpy",
            "scipy", "torch", "numba", "onnxruntime", "onnx", "cython", "matplotlib",
            "threadpoolctl", "resnorm", "omp_env", "openblas_unset", "platform"]
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | `{m.get(k)}` |" for k in keys if k in m]
    return "\n".join(lines) + "\n"


def _main_rows(rows):
    """float32 rows of the main norms and fused add + norms, forward and backward."""
    return [r for r in rows if r.dtype == _goals.DTYPE and r.op in _goals.OPS]


# The other results files, linked from every one but itself
MORE = (("RESULTS_latency.md", "the small-call latency of every public function, forward and "
         "backward, against the numba loop, ONNX Runtime and torch (a run of the latency "
         "section alone)."),
        ("RESULTS_residual.md", "the fused Pre-Norm add + RMSNorm against our own separate "
         "kernels and the cost of dropout (`benchmarks/bench_residual.py`)."))


def render(results, note=None, png=None, goals=False, commands=None, out_name=None):
    meta, m = results.meta, results.machine
    commands = commands or [meta["command"]]
    out = ["# resnorm benchmark results\n"]
    if note:
        out.append(f"**{note}**\n")
    out.append(f"Measured {meta['started_utc']} (UTC), {meta['duration_s']} s, on "
               f"{report.headline(m)}.\n")
    main = _main_rows(results.rows)
    if main:
        out.append(report.kernels_section(
            main, f"resnorm and its peers: the main norms, {_goals.DTYPE}"))
    if results.latency:
        out.append(report.latency_section(results.latency))
    out.append(report.peers_section(results))
    out.append("## How these numbers were made\n")
    runs = "".join(f"python -m {c}\n" for c in commands)
    jsons = "<that json>" if len(commands) == 1 else "<their jsons, in this order>"
    out.append(f"```\n{runs}python benchmarks/make_results.py {jsons} --out <RESULTS.md>\n```\n")
    budget = meta["budget"]
    out.append(METHOD.format(scaling_threads=", ".join(map(str, meta["scaling_threads"])),
                             tolerance=TOLERANCE["float32"],
                             latency_ms=budget["latency_seconds"] * 1e3,
                             burst_ms=BURST_SECONDS * 1e3, **budget) + "\n")
    out.append(report.caveat(results))
    out.append("Machine and build:\n\n" + _machine_table(m))
    if png:
        out.append(f"![achieved bandwidth of resnorm and its peers, thread scaling]({png})\n")
    if results.scaling:
        out.append(report.scaling_section(results.scaling))
    if goals:
        out.append(report.goals_section(bench.evaluate_goals(results)))
    for dtype in dict.fromkeys(r.dtype for r in results.rows):
        out.append(report.kernels_section([r for r in results.rows if r.dtype == dtype],
                                          f"All rows, {dtype}"))
    out.append("## More specific results\n\n" + "".join(
        f"* [{name}]({name}): {what}\n" for name, what in MORE if name != out_name))
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="the --json file of a `resnorm bench` run")
    parser.add_argument("more", nargs="*", help="--json files of further runs (e.g. other "
                        "dtypes): their table rows are added; the first run gives the rest")
    parser.add_argument("--out", help="where to write the Markdown (default: stdout)")
    parser.add_argument("--png", help="the run's --png chart, linked from the Markdown "
                        "(a path from here, e.g. docs/img/bench.png)")
    parser.add_argument("--goals", action="store_true", help="add the goal check")
    parser.add_argument("--note", help="a line under the title, e.g. 'provisional'")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        results = bench.Results.from_json(f.read())
    commands = [results.meta["command"]]
    for path in args.more:
        with open(path) as f:
            more = bench.Results.from_json(f.read())
        results.rows += more.rows
        commands.append(more.meta["command"])
    link = None
    if args.png:   # the image link is relative to where the Markdown is
        base = os.path.dirname(os.path.abspath(args.out)) if args.out else os.getcwd()
        link = os.path.relpath(args.png, base)
    text = render(results, args.note, link, args.goals, commands,
                  os.path.basename(args.out) if args.out else None)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
