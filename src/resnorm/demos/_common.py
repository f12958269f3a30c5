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


def decimals(values, most=3):
    """Decimal places that the spread of values supports: down to the first significant
    digit of max - min (at least 1, at most `most`), so that seed-to-seed noise is not
    printed as if it were signal.  Non-finite values are ignored."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    width = float(v.max() - v.min()) if v.size > 1 else 0.0
    if width <= 0:
        return most
    return int(min(most, max(1, -np.floor(np.log10(width)))))


def spread_text(values, places=None):
    """'median (min..max)' of values, at the decimal places their spread supports (or
    `places`)."""
    med, lo, hi = spread(values)
    p = decimals(values) if places is None else places
    def text(x):
        if not np.isfinite(x):
            return str(x)
        return f"{x:.{p}f}".replace(f"-{0:.{p}f}", f"{0:.{p}f}")   # no "-0.00"
    return f"{text(med)} ({text(lo)}..{text(hi)})"


def seeds_verdict(claim, per_seed):
    """'claim: holds in k of n seeds', from one truth value per seed."""
    per_seed = [bool(x) for x in per_seed]
    return f"{claim}: holds in {sum(per_seed)} of {len(per_seed)} seeds"


def majority(per_seed):
    """True when a claim held in more than half of the seeds."""
    per_seed = [bool(x) for x in per_seed]
    return 2 * sum(per_seed) > len(per_seed)
