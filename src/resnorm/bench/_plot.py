"""The PNG chart of a run (needs matplotlib): achieved GB/s of every op against the copy
bandwidth of the same bytes, one panel per thread count, and the thread scaling."""
import os

from ._run import LARGE


def _plotted_rows(rows):
    """The float32 (else first dtype) rows of the large shapes (else of every shape), one per
    (op, shape, threads): the preallocated row where there is one."""
    dtype = "float32" if any(r.dtype == "float32" for r in rows) else rows[0].dtype
    rows = [r for r in rows if r.dtype == dtype]
    large = [r for r in rows if r.shape[0] * r.shape[1] >= LARGE]
    chosen = {}
    for r in large or rows:
        key = (r.op, tuple(r.shape), r.threads)
        if key not in chosen or r.preallocated:
            chosen[key] = r
    return dtype, list(chosen.values())


def _bandwidth_panel(ax, rows, ops, shapes, threads, dtype):
    colors = {s: f"C{i}" for i, s in enumerate(shapes)}
    y = {op: i for i, op in enumerate(ops)}
    for s in shapes:
        here = [r for r in rows if tuple(r.shape) == s and r.threads == threads]
        if not here:
            continue
        c = colors[s]
        copy = sorted(r.copy_gbps for r in here)[len(here) // 2]
        ax.axvline(copy, color=c, ls="--", lw=1)
        ax.scatter([r.gbps for r in here], [y[r.op] for r in here], color=c, marker="o",
                   label=f"resnorm {s[0]}x{s[1]} (copy: dashed)")
        ax.scatter([r.traffic_bytes / r.numpy_us / 1e3 for r in here],
                   [y[r.op] for r in here], color=c, marker="x", s=20)
        torch = [r for r in here if r.torch_us is not None]
        ax.scatter([r.traffic_bytes / r.torch_us / 1e3 for r in torch],
                   [y[r.op] for r in torch], facecolors="none", edgecolors=c, marker="^", s=25)
    ax.set_yticks(range(len(ops)), ops, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("GB/s of the op's minimum traffic (o resnorm, x numpy, ^ torch)")
    ax.set_title(f"{dtype}, {threads} thread{'s' if threads > 1 else ''}")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


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
    ax.legend(fontsize=7)
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
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 6.5), squeeze=False)
    bandwidth_axes = axes[0][:len(threads)]
    for ax, t in zip(bandwidth_axes, threads):
        _bandwidth_panel(ax, rows, ops, shapes, t, dtype)
    if len(bandwidth_axes):   # one GB/s scale for every thread count
        lo = min(ax.get_xlim()[0] for ax in bandwidth_axes)
        hi = max(ax.get_xlim()[1] for ax in bandwidth_axes)
        for ax in bandwidth_axes:
            ax.set_xlim(lo, hi)
    if results.scaling:
        _scaling_panel(axes[0][-1], results.scaling)
    fig.suptitle("resnorm: achieved bandwidth vs np.copyto of the same bytes (dashed)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
