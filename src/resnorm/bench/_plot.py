"""The PNG chart of a run (needs matplotlib): small multiples of achieved GB/s, one panel per
shape (rows) and thread count (columns), every op's resnorm and peer points against the copy
bandwidth of the same bytes; the thread scaling beside them; the legend above and the run's
caveat (load, busy rows) below, both inside the image."""
import os
import textwrap

from ._report import BUSY, IN_CACHE, caveat
from ._results import OK, PEERS, one_per_cell

MARKERS = {"resnorm": "o", "numpy": "x", "torch": "^", "torch.compile": "v", "numba": "s",
           "onnxruntime": "D"}
COLORS = {"resnorm": "black", "numpy": "C0", "torch": "C1", "torch.compile": "C2",
          "numba": "C3", "onnxruntime": "C4"}
PANEL_WIDTH = 4.6      # inches per column of panels
OP_HEIGHT = 0.32       # inches per op in a panel
FONT = 8               # points: tick labels, legend, caveat
CHARS_PER_INCH = 14    # of FONT-point text, to wrap the caveat to the figure's width
LEGEND_ENTRY_INCHES = 1.5


def _plotted_rows(rows):
    """The float32 (else first dtype) rows, one per (op, shape, threads): the preallocated
    row where there is one."""
    dtype = "float32" if any(r.dtype == "float32" for r in rows) else rows[0].dtype
    return dtype, one_per_cell([r for r in rows if r.dtype == dtype])


def _points(r):
    """[(library, GB/s)] of a row: resnorm's and every timed peer's."""
    points = [] if r.gbps is None else [("resnorm", r.gbps)]
    points += [(name, r.traffic_bytes / p["us"] / 1e3) for name, p in r.peers.items()
               if p["status"] == OK]
    return points


def _panel_title(shape, threads, here):
    marks = [m for m, on in (("in cache", any(r.in_cache for r in here)),
                             ("busy", any(r.busy for r in here))) if on]
    return (f"{shape[0]}x{shape[1]}, {threads} thread{'s' if threads > 1 else ''}"
            + (f" ({', '.join(marks)})" if marks else ""))


def _bandwidth_panel(ax, rows, ops, shape, threads):
    from matplotlib.ticker import FuncFormatter

    here = [r for r in rows if tuple(r.shape) == shape and r.threads == threads]
    y = {op: i for i, op in enumerate(ops)}
    if here:
        copy = sorted(r.copy_gbps for r in here)[len(here) // 2]
        ax.axvline(copy, color="grey", ls="--", lw=1)
    for r in here:
        for library, gbps in _points(r):
            # resnorm filled, x a line marker, the other peers hollow
            style = ({"color": COLORS[library]} if library in ("resnorm", "numpy")
                     else {"facecolors": "none", "edgecolors": COLORS[library]})
            ax.scatter([gbps], [y[r.op]], marker=MARKERS[library], s=28, linewidths=1.0,
                       zorder=3 if library == "resnorm" else 2, **style)
    ax.set_yticks(range(len(ops)), ops, fontsize=FONT)
    ax.set_ylim(len(ops) - 0.5, -0.5)
    ax.set_xscale("log")
    # plain numbers (0.5, 2, 20) rather than powers of ten
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_title(_panel_title(shape, threads, here), fontsize=FONT + 1)
    ax.grid(True, axis="x", alpha=0.3)


def _legend_handles(libraries):
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=COLORS[lib], marker=MARKERS[lib], ls="none",
                      markerfacecolor=COLORS[lib] if lib in ("resnorm", "numpy") else "none",
                      label=lib) for lib in libraries]
    handles.append(Line2D([], [], color="grey", ls="--", lw=1,
                          label="np.copyto of the same bytes"))
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
    ax.tick_params(labelsize=FONT)
    ax.set_xlabel("threads (more than cores: oversubscribed)", fontsize=FONT)
    ax.set_ylabel("speedup over 1 thread", fontsize=FONT)
    ax.set_title(f"thread scaling (resnorm), {shape[0]}x{shape[1]} {rows[0].dtype}",
                 fontsize=FONT + 1)
    ax.legend(fontsize=FONT - 1, loc="upper left")
    ax.grid(True, alpha=0.3)


def figure(results):
    """The chart as a matplotlib Figure (None when the run has no rows to draw): a panel per
    shape and thread count, the thread scaling in a column of its own, the legend on top
    and the caveat below, every part inside the figure."""
    import matplotlib.pyplot as plt

    if not results.rows and not results.scaling:
        return None
    rows, ops, shapes, threads, dtype = [], [], [], [], None
    if results.rows:
        dtype, rows = _plotted_rows(results.rows)
        ops = list(dict.fromkeys(r.op for r in rows))
        shapes = sorted(dict.fromkeys(tuple(r.shape) for r in rows), key=lambda s: s[0] * s[1])
        threads = sorted({r.threads for r in rows})
    columns = len(threads) + bool(results.scaling)
    width = PANEL_WIDTH * columns
    text = caveat(results)
    if any(r.busy for r in rows):
        text += f"  Panels marked busy: while some of their rows were timed, {BUSY}."
    if any(r.in_cache for r in rows):
        text += f"  Panels marked in cache: {IN_CACHE}."
    text = textwrap.fill(text, int(width * CHARS_PER_INCH))
    caveat_height = FONT / 72 * 1.4 * (text.count("\n") + 1)
    panel_height = OP_HEIGHT * max(len(ops), 8) + 0.6
    heights = [0.3] + [panel_height] * max(len(shapes), 1) + [caveat_height]
    # constrained layout makes room for every label, title, legend and text it holds
    fig = plt.figure(figsize=(width, sum(heights) + 0.6), constrained_layout=True)
    grid = fig.add_gridspec(len(heights), columns, height_ratios=heights)
    title = (f"resnorm and its peers, {dtype or 'float32'}: achieved GB/s of each op's "
             "minimum traffic (more is faster) against np.copyto of the same bytes")
    fig.suptitle(textwrap.fill(title, int(width * CHARS_PER_INCH * FONT / (FONT + 2))),
                 fontsize=FONT + 2)
    panels = []
    for i, shape in enumerate(shapes):
        for j, t in enumerate(threads):
            ax = fig.add_subplot(grid[1 + i, j], sharex=panels[0] if panels else None)
            _bandwidth_panel(ax, rows, ops, shape, t)
            if i == len(shapes) - 1:
                ax.set_xlabel("GB/s", fontsize=FONT)
            panels.append(ax)
    if panels:
        libraries = ["resnorm"] + [p for p in PEERS if any(
            name == p for r in rows for name, _ in _points(r))]
        handles = _legend_handles(libraries)
        top = fig.add_subplot(grid[0, :])
        top.axis("off")
        top.legend(handles=handles, loc="center", fontsize=FONT, frameon=False,
                   ncol=min(len(handles), max(1, int(width / LEGEND_ENTRY_INCHES))))
    if results.scaling:
        _scaling_panel(fig.add_subplot(grid[1:-1, -1] if shapes else grid[1, 0]),
                       results.scaling)
    bottom = fig.add_subplot(grid[-1, :])
    bottom.axis("off")
    bottom.text(0, 1, text, fontsize=FONT, va="top", ha="left", transform=bottom.transAxes)
    return fig


def save_png(results, path):
    """Draws the chart to path; False (and nothing written) when matplotlib is missing or
    the run has no rows to draw."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = figure(results)
    if fig is None:
        return False
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
