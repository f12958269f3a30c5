"""rms-vs-layer: the same input through RMSNorm and LayerNorm, and what the mean
subtraction costs in time on this machine.

Part 1 (the maths): on rows whose mean is 0, LayerNorm and RMSNorm compute the same thing
(with the same eps); a row mean away from 0 makes them differ.
Part 2 (the cost): both real kernels, forward and backward, timed interleaved
(resnorm.bench.time_interleaved, medians).  The often-quoted figure is "RMSNorm is 7-10%
faster"; the demo reports whatever ratio this machine shows.  Both norms move the same
bytes, so once both run at the memory bandwidth the ratio tends to 1.  The 1x8 shape
measures the per-call cost (argument checks, small allocations), which dominates small
calls.
"""
import os

import numpy as np

from .. import bench, norms
from ..bench import time_interleaved
from ._common import DemoResult, markdown_table, num

# One thread: on a shared 2-core machine a second thread mostly measures contention
# (python -m resnorm bench --threads 1 2 reports thread scaling).
SIZES = {"full": {"shapes": [(1, 8), (8, 768), (4096, 1024), (2048, 4096)], "threads": [1],
                  "repeats": {"small": 201, "large": 61}},
         "tiny": {"shapes": [(64, 256)], "threads": [1], "repeats": {"small": 5, "large": 5}}}
EPS = 1e-5           # the same eps for both norms, so that part 1 compares like with like
ROW_SHIFT = 3.0      # part 1: the row mean added to a centred input
DTYPE = np.float32


def _same_input(rng, d=8, rows=4):
    x = rng.standard_normal((rows, d))
    centred = x - x.mean(axis=1, keepdims=True)
    out = []
    shifted = (f"the same rows + {ROW_SHIFT:g} (mean {ROW_SHIFT:g})", centred + ROW_SHIFT)
    for label, inp in (("rows with mean 0", centred), shifted):
        layer, rms = norms.layer_norm(inp, None, None, EPS), norms.rms_norm(inp, None, EPS)
        diff = np.max(np.abs(layer - rms))
        out.append((label, float(diff)))
    return out


def _time_case(shape, threads, repeats):
    """Both kernels, forward and backward, set up exactly as `python -m resnorm bench` sets
    them up (the same input for both norms, preallocated outputs)."""
    result = {"bytes": {}}
    for pass_, ops in (("forward", ("rms_norm", "layer_norm")),
                       ("backward", ("rms_norm_backward", "layer_norm_backward"))):
        cases = [bench.setup(op, shape, DTYPE) for op in ops]
        result[pass_] = time_interleaved([c.resnorm(threads) for c in cases], repeats)
        result["bytes"][pass_] = tuple(c.traffic for c in cases)    # minimum traffic
    return result


def run(size="full", seed=0):
    cfg = SIZES[size]
    rng = np.random.default_rng(seed)
    res = DemoResult("rms-vs-layer", "RMSNorm vs LayerNorm: same input, measured cost", size, seed)
    same = _same_input(rng)
    res.tables.append((f"The same input through both kernels (eps = {EPS:g} for both).",
                       markdown_table(["input", "max abs(LayerNorm(x) - RMSNorm(x))"],
                                      [[label, num(v)] for label, v in same])))
    rows, ratios = [], {"forward": [], "backward": []}
    timings = []
    for shape in cfg["shapes"]:
        size_class = "large" if shape[0] * shape[1] >= 1 << 20 else "small"
        for threads in cfg["threads"]:
            t = _time_case(shape, threads, cfg["repeats"][size_class])
            timings.append((shape, threads, t))
            for pass_ in ("forward", "backward"):
                t_rms, t_ln = t[pass_]
                bytes_rms, bytes_ln = t["bytes"][pass_]
                ratios[pass_].append(t_ln / t_rms)
                rows.append([f"{shape[0]}x{shape[1]}", threads, pass_,
                             num(t_rms * 1e6), num(t_ln * 1e6), num(bytes_rms / t_rms / 1e9),
                             num(bytes_ln / t_ln / 1e9), f"{t_ln / t_rms:.3f}"])
    res.tables.append((
        f"Median time of the compiled kernels, {np.dtype(DTYPE).name}, interleaved repeats "
        f"({os.cpu_count()} cores, shared machine: expect noise). GB/s counts each array "
        f"read or written once (as python -m resnorm bench does).",
        markdown_table(["shape", "threads", "pass", "RMSNorm us", "LayerNorm us",
                        "RMSNorm GB/s", "LayerNorm GB/s", "LayerNorm / RMSNorm"], rows)))

    def pct(r):
        return f"{100 * (r - 1):+.1f}%"
    res.findings += [
        f"on rows with mean 0 the two kernels agree to {num(same[0][1])}; with the rows "
        f"shifted by {ROW_SHIFT:g} they differ by up to {num(same[1][1])}.",
        f"LayerNorm time relative to RMSNorm: forward {pct(min(ratios['forward']))} to "
        f"{pct(max(ratios['forward']))}, backward {pct(min(ratios['backward']))} to "
        f"{pct(max(ratios['backward']))} over the cases above (the usual claim is that "
        f"RMSNorm saves 7-10%).",
    ]
    res.data = {"same_input": same, "ratios": ratios, "timings": timings}
    return res


def plot(res, path, plt):
    fig, ax = plt.subplots(figsize=(8, 4))
    labels, values = [], []
    for shape, threads, t in res.data["timings"]:
        for pass_ in ("forward", "backward"):
            t_rms, t_ln = t[pass_]
            labels.append(f"{shape[0]}x{shape[1]}\n{threads} thread(s), {pass_}")
            values.append(t_ln / t_rms)
    ax.bar(np.arange(len(values)), values, color="tab:blue")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhspan(1.07, 1.10, color="tab:orange", alpha=0.3, label="the usual 7-10% claim")
    ax.set_xticks(np.arange(len(values)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("LayerNorm time / RMSNorm time")
    ax.set_title(res.title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
