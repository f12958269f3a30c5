"""Markdown for a benchmark run: the main table, thread scaling, small-call latency and the
target check.  Used by the CLI (stdout) and benchmarks/make_results.py (RESULTS.md)."""
from .._parallel import PARALLEL_MIN_ELEMENTS
from ._targets import SHAPES as TARGET_SHAPES
from ._targets import THREADS as TARGET_THREADS


def _us(t):
    if t is None:
        return "-"
    return f"{t:.2f}" if t < 10 else f"{t:.1f}" if t < 1000 else f"{t:.0f}"


def _ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def _shape(s):
    return f"{s[0]}x{s[1]}"


def _table(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return "\n".join(out) + "\n"


def markdown_table(rows):
    """One line per Row."""
    header = ["op", "shape", "dtype", "threads", "prealloc", "resnorm us", "GB/s", "x copy",
              "copy GB/s", "numpy us", "vs numpy", "torch us", "vs torch"]
    return _table(header, [
        [r.op, _shape(r.shape), r.dtype, r.threads, "yes" if r.preallocated else "no",
         _us(r.resnorm_us), f"{r.gbps:.1f}", f"{r.x_copy:.2f}", f"{r.copy_gbps:.1f}",
         _us(r.numpy_us), _ratio(r.vs_numpy), _us(r.torch_us), _ratio(r.vs_torch)]
        for r in rows])


def scaling_table(scaling):
    """One line per (op, shape, dtype): us and x copy on each thread count, and speedups."""
    threads = sorted({r.threads for r in scaling})
    groups = {}
    for r in scaling:
        groups.setdefault((r.op, tuple(r.shape), r.dtype), {})[r.threads] = r
    header = (["op", "shape", "dtype"] + [f"{t} thr: us (x copy)" for t in threads]
              + [f"speedup {t} thr" for t in threads if t != 1])
    lines = []
    for (op, shape, dtype), by_t in groups.items():
        cells = [f"{_us(by_t[t].us)} ({by_t[t].x_copy:.2f})" if t in by_t else "-"
                 for t in threads]
        speedups = [_ratio(by_t[t].speedup) if t in by_t else "-" for t in threads if t != 1]
        lines.append([op, _shape(shape), dtype] + cells + speedups)
    return _table(header, lines)


def latency_table(latency):
    """One line per op: us per call for each variant."""
    variants = ["preallocated", "allocating", "torch"]
    groups = {}
    for r in latency:
        groups.setdefault((r.op, tuple(r.shape), r.dtype), {})[r.variant] = r.us
    header = ["op", "shape", "dtype"] + [f"{v} us/call" for v in variants]
    return _table(header, [[op, _shape(s), dt] + [_us(by_v.get(v)) for v in variants]
                           for (op, s, dt), by_v in groups.items()])


def _cell(t):
    if t.measured is None:
        return "-"
    value = f"{t.measured:.2f}x" if "torch" in t.target else f"{t.measured:.2f}"
    status = "MET" if t.status == "MET" else f"**{t.status}**"
    extra = f" ({t.note})" if "torch" in t.target and t.note else ""
    return f"{value} {status}{extra}"


def targets_table(targets):
    """The per-shape targets as one line per (target, op) measured at least once, then the
    small-call targets, then the counts."""
    columns = [(s, t) for s in TARGET_SHAPES for t in TARGET_THREADS]
    groups, notes = {}, {}
    for t in targets:
        if t.threads is not None and t.measured is not None:
            groups.setdefault((t.target, t.op), {})[(tuple(t.shape), t.threads)] = t
            if "torch" not in t.target:
                notes[(t.target, t.op)] = t.note
    header = ["target", "op"] + [f"{_shape(s)} {t} thr" for s, t in columns] + ["row used"]
    lines = [[target, op] + [_cell(by_c[c]) if c in by_c else "-" for c in columns]
             + [notes.get((target, op), "allocating (like torch)")]
             for (target, op), by_c in groups.items()]
    text = _table(header, lines) if lines else ""
    small = [t for t in targets if t.threads is None and t.measured is not None]
    if small:
        text += "\n" + _table(
            ["target", "op", "shape", "measured us/call", "status", "how"],
            [[t.target, t.op, _shape(t.shape), _us(t.measured), t.status, t.note]
             for t in small])
    counts = {s: sum(t.status == s for t in targets) for s in ("MET", "NOT MET", "NOT MEASURED")}
    text += ("\n" + ", ".join(f"{n} {s}" for s, n in counts.items())
             + " (not measured: shape, thread count, op or torch not in this run)\n")
    return text


def headline(machine):
    m = machine
    return (f"{m['cpu']}, {m['cores']} cores, simd={m['simd_level']}, openmp={m['openmp']}, "
            f"numpy {m['numpy']}, torch {m['torch'] or 'not installed'}, python {m['python']}")


def caveat(results):
    """How busy the machine was, and what that does to the rows."""
    meta, cores = results.meta, results.machine.get("cores")
    return (f"The 1-minute load average was {meta.get('load_average_start')} when the run "
            f"started and {meta.get('load_average_end')} when it ended, on {cores} cores.  "
            "Where other work holds a core, rows with as many threads as cores measure "
            "contention (OpenMP threads wait at the end of every parallel region for the "
            "slowest one), not the kernel.  Compare ratios within a row (same rounds), not "
            "absolute times across runs.\n")


X_COPY_NOTE = (
    "x copy: GB/s of the op's minimum traffic / GB/s of np.copyto of the same bytes on as "
    "many threads, same interleaved rounds.  vs X: X's time / resnorm's time.  Medians.  "
    f"threads: the n_threads asked for; calls on fewer than {PARALLEL_MIN_ELEMENTS} elements "
    "run on one thread (and so does their copy).\n")


def kernels_section(rows, title="Kernels vs NumPy, PyTorch and copy"):
    return f"## {title}\n\n" + markdown_table(rows) + "\n" + X_COPY_NOTE


def scaling_section(scaling):
    return ("## Thread scaling (resnorm, preallocated output; x copy: against a copy on as "
            "many threads)\n\n" + scaling_table(scaling))


def latency_section(latency):
    return ("## Small-call latency (from Python, argument checks included)\n\n"
            + latency_table(latency))


def targets_section(targets):
    return ("## Targets (issue 5)\n\nfloat32.  Bandwidth targets read the preallocated-output "
            "row; torch targets the allocating row (torch allocates its outputs too).\n\n"
            + targets_table(targets))


def report(results, targets):
    """The whole run as Markdown sections (what the CLI prints)."""
    parts = [f"# resnorm benchmark\n\n{headline(results.machine)}\n"]
    if results.rows:
        parts.append(kernels_section(results.rows))
    if results.scaling:
        parts.append(scaling_section(results.scaling))
    if results.latency:
        parts.append(latency_section(results.latency))
    parts.append(targets_section(targets))
    parts.append(f"{results.meta.get('duration_s')} s.  " + caveat(results))
    return "\n".join(parts)
