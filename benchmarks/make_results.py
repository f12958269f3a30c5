"""Writes benchmarks/RESULTS.md from the JSON of a `resnorm bench` run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m resnorm bench \\
        --json bench-results/bench.json --png docs/img/bench.png
    python benchmarks/make_results.py bench-results/bench.json --png ../docs/img/bench.png \\
        > benchmarks/RESULTS.md

The tables are the run's rows, unchanged; the targets are re-evaluated from them by
resnorm.bench (the same code the CLI uses).  --note adds a line under the title (e.g.
"provisional: measured while the machine was busy").
"""
import argparse
import sys

from resnorm import bench
from resnorm.bench import _report as report
from resnorm.bench._run import LARGE
from resnorm.bench._targets import DTYPE as TARGET_DTYPE

METHOD = """\
* Every case is timed in interleaved rounds: resnorm writing into preallocated outputs,
  resnorm allocating its outputs, NumPy, `np.copyto` and PyTorch each run once per round,
  so all see the same machine state.  Reported: medians after warm-up.  Rounds per case
  come from a time budget ({seconds} s per case, at least {lo}, at most {hi}): big shapes
  get few rounds.
* GB/s counts the op's minimum traffic: every input read once, every output written once
  (parameter gradients and float64 row statistics included).  `x copy` = that GB/s divided
  by the GB/s of `np.copyto` moving the same number of bytes (reading half, writing half)
  on as many threads as the resnorm call uses (split over Python threads; NumPy releases
  the GIL while copying), in the same rounds.  Where writes cost more than reads (they
  do on the EPYC guest these were first measured on), an op that reads more than it
  writes can exceed 1.0.
* NumPy: the same computation as a NumPy user writes it, in the input dtype (one thread).
  PyTorch: `torch.nn.functional` / autograd on CPU with `torch.set_num_threads(threads)`.
  `vs X` = X's time / resnorm's time (above 1: resnorm is faster).
* Thread scaling: resnorm on {scaling_threads} threads (more threads than cores is
  oversubscribed), interleaved with copies on the same thread counts.
* Small-call latency: {calls} back-to-back calls per timing, median of {latency_repeats}
  timings, default `n_threads`.
* resnorm and PyTorch each bring an OpenMP runtime; after a parallel region their idle
  threads spin for a while, so on a machine with few cores they slow each other down in
  multi-thread rows (`--no-torch` removes PyTorch from the run)."""

def _machine_table(m):
    keys = ["cpu", "cores", "caches", "cpu_simd_flags", "simd_level", "openmp",
            "omp_max_threads", "build_flags", "compiler", "cython_build", "python", "numpy",
            "scipy", "torch", "cython", "matplotlib", "threadpoolctl", "resnorm", "omp_env",
            "platform"]
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | `{m.get(k)}` |" for k in keys if k in m]
    return "\n".join(lines) + "\n"


def _large(rows):
    return [r for r in rows if r.shape[0] * r.shape[1] >= LARGE and r.dtype == TARGET_DTYPE]


def render(results, note=None, png=None):
    meta, m = results.meta, results.machine
    targets = bench.evaluate_targets(results)
    out = ["# resnorm benchmark results\n"]
    if note:
        out.append(f"**{note}**\n")
    out.append(f"Measured {meta['started_utc']} (UTC), {meta['duration_s']} s, on "
               f"{report.headline(m)}.\n")
    out.append("## How these numbers were made\n")
    out.append(f"```\nenv -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m {meta['command']}\n"
               f"python benchmarks/make_results.py <that json> > benchmarks/RESULTS.md\n```\n")
    out.append(METHOD.format(scaling_threads=", ".join(map(str, meta["scaling_threads"])),
                             **meta["budget"]) + "\n")
    out.append(report.caveat(results))
    out.append("Machine and build:\n\n" + _machine_table(m))
    if png:
        out.append(f"![achieved bandwidth vs copy, thread scaling]({png})\n")
    out.append(report.targets_section(targets))
    large = _large(results.rows)
    if large:
        out.append(report.kernels_section(large, f"Large shapes, {TARGET_DTYPE}"))
    if results.scaling:
        out.append(report.scaling_section(results.scaling))
    if results.latency:
        out.append(report.latency_section(results.latency))
    for dtype in dict.fromkeys(r.dtype for r in results.rows):
        out.append(report.kernels_section([r for r in results.rows if r.dtype == dtype],
                                          f"All rows, {dtype}"))
    out.append("## Earlier, more specific results\n\n"
               "* [RESULTS_residual.md](RESULTS_residual.md): the fused Pre-Norm add + RMSNorm "
               "against our own separate kernels and the cost of dropout "
               "(`benchmarks/bench_residual.py`).\n")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="the --json file of a `resnorm bench` run")
    parser.add_argument("--note", help="a line under the title, e.g. 'provisional'")
    parser.add_argument("--png", help="path of the run's --png chart, relative to "
                        "benchmarks/ (e.g. ../docs/img/bench.png)")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        results = bench.Results.from_json(f.read())
    sys.stdout.write(render(results, args.note, args.png))


if __name__ == "__main__":
    main()
