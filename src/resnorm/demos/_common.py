"""What every demo shares: its result record, table formatting, optional matplotlib."""
from dataclasses import dataclass, field

import numpy as np


@dataclass
class DemoResult:
    """A demo's measured output.

    tables: (caption, markdown table) pairs, printed in order.  findings: sentences stating
    what was measured (each one computed from the numbers, not written in advance).
    data: the raw numbers, for tests and plots.  missing: non-empty when part of the demo
    could not run, saying which part and why.
    """
    name: str
    title: str
    size: str
    seed: int
    tables: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    data: dict = field(default_factory=dict)
    missing: str = ""

    def text(self):
        lines = [f"# {self.title}", f"(demo {self.name}, size {self.size}, seed {self.seed})", ""]
        for caption, table in self.tables:
            lines += [caption, "", table, ""]
        if self.findings:
            lines += ["Measured:"] + [f"- {f}" for f in self.findings] + [""]
        if self.missing:
            lines += [f"NOT RUN: {self.missing}", ""]
        return "\n".join(lines).rstrip() + "\n"


def num(v, digits=3):
    """A number for a table: 3 significant digits, exponent form when very large or small."""
    v = float(v)
    if not np.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e5:
        return f"{v:.{digits}g}"
    return f"{v:.{digits - 1}e}"


def markdown_table(headers, rows):
    """A markdown table; cells must not contain '|' (it would split the cell)."""
    cells = [str(c) for row in [headers, *rows] for c in row]
    if any("|" in c for c in cells):
        raise ValueError(f"a table cell contains '|': {[c for c in cells if '|' in c]}")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot with a file-only backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def spread(values):
    """(median, min, max) of values, as floats: how results vary over seeds or repeats."""
    v = np.asarray(values, dtype=np.float64)
    return float(np.median(v)), float(v.min()), float(v.max())


def loglog_slope(x, y):
    """The exponent k of the best fit y ~ x^k (least squares on logs)."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def plot_band(ax, x, curves, label, log=True, alpha=0.2, color=None):
    """curves (draws, points): the median over the draws as a line, min..max as a band of
    the same colour.  Returns the line."""
    curves = np.asarray(curves)
    line, = (ax.semilogy if log else ax.plot)(x, np.median(curves, axis=0), label=label,
                                                color=color)
    ax.fill_between(x, curves.min(axis=0), curves.max(axis=0), color=line.get_color(),
                    alpha=alpha)
    return line
