"""Markdown for a benchmark run: resnorm against its peers first, then what the peers are,
thread scaling, small-call latency and (when asked) the goals.  Used by the CLI (stdout)
and benchmarks/make_results.py (RESULTS.md)."""
from statistics import median

from .._parallel import PARALLEL_MIN_ELEMENTS
from . import _check, _peers
from ._machine import OPENBLAS_VARS
from ._timing import BURST_SECONDS
from ._results import (FORMS, OK, PEERS, UNSUPPORTED, WRONG, form_name, one_per_cell,
                       own_form, ratios, resnorm_in_rounds)


def _us(t):
    if t is None:
        return "-"
    return f"{t:.2f}" if t < 10 else f"{t:.1f}" if t < 1000 else f"{t:.0f}"


def _ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def _shape(s):
    return f"{s[0]}x{s[1]}"


def _and(names):
    """'a', 'a and b', 'a, b and c'."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _table(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return "\n".join(out) + "\n"


def _peer_cell(p, best, form):
    """A peer's time (bold when it is the fastest against resnorm), 'wrong', 'n/a' or '-'
    (no such peer); for a peer timed in rounds of its own, resnorm's time of `form` from
    those rounds after it ("163.0 vs 120.2"), the pair its ratio comes from."""
    if p is None:
        return "-"
    if p["status"] == WRONG:
        return "wrong"
    if p["status"] != OK:
        return "n/a"
    cell = f"**{_us(p['us'])}**" if best else _us(p["us"])
    own = resnorm_in_rounds(p, form)
    return cell if own is None else f"{cell} vs {_us(own)}"


def _columns(rows):
    """The peers that appear in any of the rows, in table order."""
    seen = {name for r in rows for name in r.peers}
    return [name for name in PEERS if name in seen]


def _x_copy(r):
    """x copy, marked where it is above 1 on data that fits in the CPU's caches."""
    if r.x_copy is None:
        return "-"
    return f"{r.x_copy:.2f} (in cache)" if r.in_cache and r.x_copy > 1 else f"{r.x_copy:.2f}"


def markdown_table(rows):
    """One line per Row: resnorm, copy, each peer's time and the fastest peer."""
    peers = _columns(rows)
    header = (["op", "shape", "dtype", "threads", "prealloc", "resnorm us", "GB/s", "x copy"]
              + [f"{p} us" for p in peers] + ["fastest peer", "vs best"])
    lines = []
    for r in rows:
        resnorm = "WRONG" if r.resnorm_us is None else _us(r.resnorm_us)
        lines.append(
            [r.op, _shape(r.shape), r.dtype, f"{r.threads} (busy)" if r.busy else r.threads,
             "yes" if r.preallocated else "no", resnorm,
             "-" if r.gbps is None else f"{r.gbps:.1f}", _x_copy(r)]
            + [_peer_cell(r.peers.get(p), p == r.best_peer, form_name(r.preallocated))
               for p in peers]
            + [r.best_peer or "-", _ratio(r.vs_best)])
    return _table(header, lines)


def _against_each(judged):
    """{peer's name in prose: (cells where resnorm was faster than it, cells where it was
    timed)}, in table order; each against resnorm's time from that peer's rounds."""
    won, seen = {}, {}
    for r in judged:
        for name, ratio in ratios(r.peers, form_name(r.preallocated), r.resnorm_us).items():
            seen[name] = seen.get(name, 0) + 1
            won[name] = won.get(name, 0) + (ratio > 1)
    return {_peers.NAMES[n]: (won[n], seen[n]) for n in PEERS if n in seen}


def _not_compared(peers):
    """'numba and ONNX Runtime: not installed (pip install ...)': the peers of a run's
    meta["peers"] that were left out, grouped by why."""
    why = {}
    for name in PEERS:
        reason = (peers.get(name) or {}).get("left_out")
        if reason:
            why.setdefault(reason, []).append(_peers.NAMES[name])
    return [f"{_and(names)}: {reason}" for reason, names in why.items()]


def standing(rows, peers=None, worst=5):
    """One paragraph: the peers resnorm was compared with; in how many cells it is ahead of
    the fastest of them and of each, the median ratio, the cells where it is furthest
    behind, the cells timed while other processes held the cores they needed, the peers
    whose output was wrong and (peers: the run's meta["peers"]) the peers left out, why,
    and how to install the missing ones."""
    cells = one_per_cell(rows)
    judged = [r for r in cells if r.vs_best is not None]
    text = ""
    if judged:
        each = _against_each(judged)
        ahead = sum(r.vs_best > 1 for r in judged)
        behind = sorted((r for r in judged if r.vs_best <= 1), key=lambda r: r.vs_best)[:worst]
        text = (f"resnorm (preallocated outputs where the op takes them) against "
                f"{_and(list(each))}: faster than the fastest of them in {ahead} of "
                f"{len(judged)} cells (op, shape, dtype, threads), median vs best "
                f"{median(r.vs_best for r in judged):.2f}x; faster than "
                + ", ".join(f"{name} in {won} of {n}" for name, (won, n) in each.items())
                + ".")
        if behind:
            text += " Furthest behind: " + "; ".join(
                f"{r.op} {_shape(r.shape)} {r.dtype} {r.threads} thr {r.vs_best:.2f}x "
                f"({r.best_peer})" for r in behind) + "."
    busy = sum(r.busy for r in cells)
    if busy:
        text += (f" {busy} of {len(cells)} cells were timed while {BUSY} (threads marked "
                 "busy); time them again on an idle machine.")
    own = sorted({f"{r.op} {_shape(r.shape)} {r.dtype}" for r in rows if r.resnorm_us is None})
    if own:
        text += f" resnorm's own output failed the check, so not timed: {'; '.join(own)}."
    wrong = sorted({name for r in rows for name, p in r.peers.items() if p["status"] == WRONG})
    if wrong:
        text += (f" Output failed the check, so not timed: {', '.join(wrong)} "
                 "(see the rows marked wrong).")
    missing = _not_compared(peers or {})
    if missing:
        text += f" Not compared: {'; '.join(missing)}."
    return text.strip() + "\n" if text else ""


# what the table's and the chart's marks mean
BUSY = ("other processes kept busy more of this process's cores than its threads left free "
        "(counted from /proc/stat as resnorm's thread rule counts them), so the times "
        "include waiting for a core")
IN_CACHE = ("the op's data fits in the CPU's largest cache, so the op and the copy both ran "
            "from cache: this compares cache bandwidth, not memory bandwidth")

X_COPY_NOTE = (
    f"Medians of interleaved rounds, in microseconds per call (a call under "
    f"{BURST_SECONDS * 1e3:g} ms is timed in bursts of back-to-back calls, every function "
    "alike).  x copy: GB/s of the op's minimum "
    "traffic / GB/s of np.copyto of the same bytes on as many threads, same rounds.  "
    "vs best: the fastest peer's time / resnorm's time (above 1: resnorm is faster); the "
    "fastest peer's time is in bold.  '-': the peer has no such op; 'wrong': its output "
    f"was off the float64 reference by more than {_check.TOLERANCE['float32']:g} of the "
    "output's scale (float32), so it was not timed; 'n/a': it could not run this case.  "
    f"threads: the n_threads asked for; calls on fewer than {PARALLEL_MIN_ELEMENTS} "
    f"elements run on one thread (and so do their copy and the numba loop); busy: while the "
    f"row was timed, {BUSY}.  x copy above 1 marked in cache: {IN_CACHE}.\n")


def kernels_section(rows, title="resnorm and its peers", peers=None):
    """The table of rows under a paragraph of where resnorm stands (standing); peers: the
    run's meta["peers"], to name the peers left out."""
    return (f"## {title}\n\n" + standing(rows, peers) + "\n" + markdown_table(rows) + "\n"
            + X_COPY_NOTE)


def _unsupported(results, name):
    """{reason: ["op (dtype)", ...]} of the cases the peer could not run."""
    failed = [(r.op, r.dtype, r.peers[name]["note"]) for r in results.rows
              if r.peers.get(name, {}).get("status") == UNSUPPORTED]
    failed += [(r.op, r.dtype, r.note) for r in results.latency
               if r.variant == name and r.status == UNSUPPORTED]
    found = {}
    for op, dtype, note in failed:
        cases = found.setdefault(note.rstrip("."), [])
        if f"{op} ({dtype})" not in cases:
            cases.append(f"{op} ({dtype})")
    return found


def peers_section(results):
    """What each peer is and how it runs, which were left out and why, and which ops of
    the run have no such peer."""
    meta_peers = results.meta.get("peers", {})
    ops = list(dict.fromkeys([r.op for r in results.rows]
                             + [r.op for r in results.latency]))
    have = {}
    for r in results.rows:
        for name in r.peers:
            have.setdefault(name, set()).add(r.op)
    for r in results.latency:
        have.setdefault(r.variant, set()).add(r.op)
    lines = []
    for name in PEERS:
        info = meta_peers.get(name, {})
        version = info.get("version") or "not installed"
        if info.get("left_out"):
            lines.append(f"* {name} ({version}): left out: {info['left_out']}.")
            continue
        line = f"* {name} {version}: {_peers.HOW[name]}."
        missing = [op for op in ops if op not in have.get(name, set())]
        if missing and ops:
            line += f" No {name} version of: {', '.join(missing)}."
        for note, cases in _unsupported(results, name).items():
            line += f" Could not run {', '.join(cases)}: {note}."
        lines.append(line)
    return "## Peers\n\n" + "\n".join(lines) + "\n"


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


def _latency_cell(r):
    if r is None:
        return "-"
    return _us(r.us) if r.status == OK else "wrong" if r.status == WRONG else "n/a"


def latency_table(latency):
    """One line per (op, shape): us per call of resnorm's forms and of each peer, the
    fastest peer and its time / resnorm's (preallocated, else allocating)."""
    peers = [p for p in PEERS if any(r.variant == p for r in latency)]
    groups = {}
    for r in latency:
        groups.setdefault((r.op, tuple(r.shape), r.dtype), {})[r.variant] = r
    header = (["op", "shape", "dtype"] + [f"{v} us" for v in FORMS]
              + [f"{p} us" for p in peers] + ["fastest peer", "vs best"])
    lines = []
    for (op, s, dt), by_v in groups.items():
        timed = [(by_v[p].us, p) for p in peers if p in by_v and by_v[p].status == OK]
        best_us, best = min(timed) if timed else (None, None)
        own = own_form(by_v)
        vs = None if best_us is None or own is None or own.us is None else best_us / own.us
        lines.append([op, _shape(s), dt] + [_latency_cell(by_v.get(v)) for v in FORMS]
                     + [_latency_cell(by_v.get(p)) for p in peers] + [best or "-", _ratio(vs)])
    return _table(header, lines)


def scaling_section(scaling):
    return ("## Thread scaling (resnorm, preallocated output; x copy: against a copy on as "
            "many threads)\n\n" + scaling_table(scaling))


def latency_section(latency):
    return ("## Small-call latency\n\nMedian microseconds per call from Python, argument "
            "checks included, float32, default n_threads (calls this small run on one "
            "thread; the peers too).  vs best: the fastest peer's time / resnorm's "
            "(preallocated).\n\n" + latency_table(latency))


def _goal_value(g):
    if g.measured is None:
        return "-"
    return f"{g.measured:.2f}"


def goals_table(goals):
    """Per goal: how many of its cells are MET, and each cell NOT MET (worst first)."""
    groups = {}
    for g in goals:
        groups.setdefault(g.goal, []).append(g)
    summary = [[goal, f"{sum(g.status == 'MET' for g in gs)} of {len(gs)}"]
               for goal, gs in groups.items()]
    text = _table(["goal", "met"], summary)
    failed = [g for g in goals if g.status != "MET"]
    if failed:
        def gap(g):   # how far from the goal, relative
            if g.measured is None:
                return float("-inf")
            r = g.measured / g.threshold if g.threshold else g.measured
            return r if g.compare != "<=" else 1 / r if r else float("inf")
        failed.sort(key=lambda g: (g.goal, gap(g)))
        text += "\nNot met:\n\n" + _table(
            ["goal", "op", "shape", "threads", "measured", "note"],
            [[g.goal, g.op, "-" if g.shape is None else _shape(g.shape),
              "-" if g.threads is None else g.threads, _goal_value(g), g.note]
             for g in failed])
    return text


def goals_section(goals):
    met = sum(g.status == "MET" for g in goals)
    return (f"## Goals\n\nfloat32, measured in this run: {met} of {len(goals)} met.  Goals "
            "whose shapes, ops or thread counts were not in the run are not listed.\n\n"
            + goals_table(goals))


def headline(machine):
    m = machine
    return (f"{m['cpu']}, {m['cores']} cores, simd={m['simd_level']}, openmp={m['openmp']}, "
            f"numpy {m['numpy']}, python {m['python']}")


def caveat(results):
    """How busy the machine was, what that does to the rows, and the OpenBLAS settings."""
    meta, m = results.meta, results.machine
    text = (f"The 1-minute load average was {meta.get('load_average_start')} when the run "
            f"started and {meta.get('load_average_end')} when it ended, on {m.get('cores')} "
            "cores.  Where other work holds a core, rows with as many threads as cores "
            "measure contention (OpenMP threads wait at the end of every parallel region "
            "for the slowest one), not the kernel.  Compare ratios within a row (same "
            "rounds), not absolute times across runs.")
    unset = m.get("openblas_unset") or []
    still = [k for k in m.get("omp_env", {}) if k in OPENBLAS_VARS]
    if unset:
        text += (f"  {' and '.join(unset)} were set in the environment; the benchmark ran "
                 "without them, so that NumPy's OpenBLAS detects this CPU as it does by "
                 "default.")
    if still:
        text += (f"  {' and '.join(still)} are set: NumPy's OpenBLAS uses them instead of "
                 "what it detects (the command line runs without them).")
    return text + "\n"


def report(results, goals=None):
    """The whole run as Markdown sections (what the CLI prints); goals: with --goals."""
    parts = [f"# resnorm benchmark\n\n{headline(results.machine)}\n"]
    if results.rows:
        parts.append(kernels_section(results.rows, peers=results.meta.get("peers")))
    if results.latency:
        parts.append(latency_section(results.latency))
    parts.append(peers_section(results))
    if results.scaling:
        parts.append(scaling_section(results.scaling))
    if goals is not None:
        parts.append(goals_section(goals))
    parts.append(f"{results.meta.get('duration_s')} s.  " + caveat(results))
    return "\n".join(parts)
