"""The PNG chart of a run (needs matplotlib): achieved GB/s of every op, resnorm's and each
peer's, against the copy bandwidth of the same bytes, one panel per thread count, and the
thread scaling.  The legends sit below the panels, where they cover no point."""
import os

from ._results import OK, PEERS, one_per_cell
from ._run import LARGE

MARKERS = {"resnorm": "o", "numpy": "x", "torch": "^", "torch.compile": "v", "numba": "s",
           "onnxruntime": "D"}


def _plotted_rows(rows):
    """The float32 (else first dtype) rows of the large shapes (else of every shape), one per
    (op, shape, threads): the preallocated row where there is one."""
    dtype = "float32" if any(r.dtype == "float32" for r in rows) else rows[0].dtype
    rows = [r for r in rows if r.dtype == dtype]
    large = [r for r in rows if r.shape[0] * r.shape[1] >= LARGE]
    return dtype, one_per_cell(large or rows)


def _points(r):
    """[(library, GB/s)] of a row: resnorm's and every timed peer's."""
    points = [] if r.gbps is None else [("resnorm", r.gbps)]
    points += [(name, r.traffic_bytes / p["us"] / 1e3) for name, p in r.peers.items()
               if p["status"] == OK]
    return points


def _bandwidth_panel(ax, rows, ops, shapes, threads, dtype):
    y = {op: i for i, op in enumerate(ops)}
    # shapes side by side within an op's band, so their points do not sit on each other
    offset = {s: 0.6 * (i - (len(shapes) - 1) / 2) / max(len(shapes), 1)
              for i, s in enumerate(shapes)}
    for i, s in enumerate(shapes):
        here = [r for r in rows if tuple(r.shape) == s and r.threads == threads]
        if not here:
            continue
        color = f"C{i}"
        copy = sorted(r.copy_gbps for r in here)[len(here) // 2]
        ax.axvline(copy, color=color, ls="--", lw=1)
        for r in here:
            for library, gbps in _points(r):
                # resnorm filled, x a line marker, the other peers hollow
                style = ({"color": color} if library in ("resnorm", "numpy")
                         else {"facecolors": "none", "edgecolors": color})
                ax.scatter([gbps], [y[r.op] + offset[s]], marker=MARKERS[library], s=30,
                           linewidths=1.0, zorder=3 if library == "resnorm" else 2, **style)
    ax.set_yticks(range(len(ops)), ops, fontsize=7)
    ax.set_ylim(len(ops) - 0.5, -0.5)
    ax.set_xscale("log")
    ax.set_xlabel("GB/s of the op's minimum traffic (more is faster)")
    ax.set_title(f"{dtype}, {threads} thread{'s' if threads > 1 else ''}")
    ax.grid(True, axis="x", alpha=0.3)


def _legend_handles(shapes, libraries):
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=f"C{i}", marker="o", ls="--", lw=1,
                      label=f"{s[0]}x{s[1]} (dashed: its np.copyto)")
               for i, s in enumerate(shapes)]
    handles += [Line2D([], [], color="black", marker=MARKERS[lib], ls="none",
                       markerfacecolor="black" if lib in ("resnorm", "numpy") else "none",
                       label=lib) for lib in libraries]
    return handles


def _scaling_panel(ax, scaling):
    """Speedup over one thread of every op at the largest shape of the section."""
    shape = max({tuple(r.shape) for r in scaling}, key=lambda s: s[0] * s[1])
    rows = [r for r in scaling if tuple(r.shape) == shape]
    for i, op in enumerate(dict.fromkeys(r.op for r in rows)):
        pts = sorted((r.threads, r.speedup) for r in rows if r.op == op)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i % 10}",
                label=op)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(sorted({r.threads for r in rows}))
    ax.set_xlabel("threads (more than cores: oversubscribed)")
    ax.set_ylabel("speedup over 1 thread")
    ax.set_title(f"thread scaling (resnorm), {shape[0]}x{shape[1]} {rows[0].dtype}")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    ax.grid(True, alpha=0.3)


def save_png(results, path):
    """Draws the chart to path; False (and nothing written) when matplotlib is missing or
    the run has no rows to draw."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not results.rows and not results.scaling:
        return False
    threads, rows = [], []
    if results.rows:
        dtype, rows = _plotted_rows(results.rows)
        ops = list(dict.fromkeys(r.op for r in rows))
        shapes = list(dict.fromkeys(tuple(r.shape) for r in rows))
        threads = sorted({r.threads for r in rows})
    n = len(threads) + bool(results.scaling)
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 7.5), squeeze=False)
    bandwidth_axes = axes[0][:len(threads)]
    for ax, t in zip(bandwidth_axes, threads):
        _bandwidth_panel(ax, rows, ops, shapes, t, dtype)
    if len(bandwidth_axes):   # one GB/s scale for every thread count
        lo = min(ax.get_xlim()[0] for ax in bandwidth_axes)
        hi = max(ax.get_xlim()[1] for ax in bandwidth_axes)
        for ax in bandwidth_axes:
            ax.set_xlim(lo, hi)
        libraries = ["resnorm"] + [p for p in PEERS if any(
            name == p for r in rows for name, _ in _points(r))]
        fig.legend(handles=_legend_handles(shapes, libraries), loc="lower center",
                   ncol=len(shapes) + len(libraries), fontsize=8, frameon=False)
    if results.scaling:
        _scaling_panel(axes[0][-1], results.scaling)
    fig.suptitle("resnorm and its peers: achieved bandwidth against np.copyto of the same "
                 "bytes (dashed)")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
