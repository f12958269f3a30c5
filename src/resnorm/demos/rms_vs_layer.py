"""rms-vs-layer: the same input through RMSNorm and LayerNorm, and what the mean
subtraction costs in time on this machine.

Part 1 (the maths): on rows whose mean is 0, LayerNorm and RMSNorm compute the same thing
(with the same eps); a row mean away from 0 makes them differ.
Part 2 (the cost): both compiled kernels, forward and backward, float32, one thread, timed
in paired rounds.  Each round runs the two kernels in a random order, and calls each one
once untimed right before timing it: the call just before a timed call is always the same
kernel, so neither pays for the other's dirty cache lines or leaves it a warmer cache.
Reported: the median time of each, and the LayerNorm / RMSNorm ratio of every round
(median and quartiles), so the spread over repeats is visible.

For context: Zhang & Sennrich (2019, "Root Mean Square Layer Normalization", NeurIPS)
report that replacing LayerNorm by RMSNorm made whole models 7% to 64% faster; that is
the running time of entire networks, not of the normalisation kernel alone.
"""
import time

import numpy as np

import resnorm
from ..bench import machine_info
from ._common import DemoResult, markdown_table, num

# One thread: on a shared 2-core machine a second thread mostly measures contention
# (python -m resnorm bench --threads 1 2 reports thread scaling).
SIZES = {"full": {"shapes": [(1, 8), (8, 768), (4096, 1024), (2048, 4096)],
                  "rounds": {"small": 101, "large": 31}, "calls": {"small": 200, "large": 1}},
         "tiny": {"shapes": [(1, 8), (64, 256)], "rounds": {"small": 7, "large": 3},
                  "calls": {"small": 20, "large": 1}}}
LARGE = 1 << 20      # elements: one call is long enough to time on its own
EPS = 1e-5           # the same eps for both norms, so that part 1 compares like with like
ROW_SHIFT = 3.0      # part 1: the row mean added to a centred input
DTYPE = np.float32
WARMUP_ROUNDS = 2


def _same_input(rng, d=8, rows=4):
    x = rng.standard_normal((rows, d))
    centred = x - x.mean(axis=1, keepdims=True)
    out = []
    shifted = (f"the same rows + {ROW_SHIFT:g} (mean {ROW_SHIFT:g})", centred + ROW_SHIFT)
    for label, inp in (("rows with mean 0", centred), shifted):
        layer = resnorm.layer_norm(inp, None, None, EPS)
        rms = resnorm.rms_norm(inp, None, EPS)
        out.append((label, float(np.max(np.abs(layer - rms)))))
    return out


def _calls(shape, rng):
    """The four timed calls, with preallocated outputs, one thread, on the same input."""
    x = rng.standard_normal(shape, dtype=DTYPE)
    dy = rng.standard_normal(shape, dtype=DTYPE)
    w, b = np.ones(shape[1], DTYPE), np.zeros(shape[1], DTYPE)
    out = np.empty_like(x)
    _, rms_cache = resnorm.rms_norm_forward(x, w, EPS)
    _, ln_cache = resnorm.layer_norm_forward(x, w, b, EPS)
    return {
        "forward": (lambda: resnorm.rms_norm(x, w, EPS, out=out, n_threads=1),
                    lambda: resnorm.layer_norm(x, w, b, EPS, out=out, n_threads=1)),
        "backward": (lambda: resnorm.rms_norm_backward(dy, rms_cache, out=out, n_threads=1),
                     lambda: resnorm.layer_norm_backward(dy, ln_cache, out=out, n_threads=1)),
    }


def time_paired(fns, rounds, calls, rng):
    """Seconds per call of each function in every round, shape (rounds, len(fns)).  Each
    round visits the functions in a random order; each is called once untimed just before
    its `calls` timed calls."""
    times = np.empty((rounds + WARMUP_ROUNDS, len(fns)))
    for r in range(len(times)):
        for i in rng.permutation(len(fns)):
            fns[i]()
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[i]()
            times[r, i] = (time.perf_counter() - t0) / calls
    return times[WARMUP_ROUNDS:]


def _cache_text():
    caches = machine_info().get("caches", {})
    return ", ".join(f"{k} {v}" for k, v in caches.items()) or "cache sizes unknown"


def run(size="full", seed=0):
    cfg = SIZES[size]
    rng = np.random.default_rng(seed)
    res = DemoResult("rms-vs-layer", "RMSNorm vs LayerNorm: same input, measured cost", size, seed)
    same = _same_input(rng)
    res.tables.append((f"The same input through both kernels (eps = {EPS:g} for both).",
                       markdown_table(["input", "max abs(LayerNorm(x) - RMSNorm(x))"],
                                      [[label, num(v)] for label, v in same])))
    rows, timings = [], []
    for shape in cfg["shapes"]:
        cls = "large" if shape[0] * shape[1] >= LARGE else "small"
        for pass_, fns in _calls(shape, rng).items():
            t = time_paired(fns, cfg["rounds"][cls], cfg["calls"][cls], rng)
            ratio = t[:, 1] / t[:, 0]
            q1, med, q3 = np.percentile(ratio, [25, 50, 75])
            timings.append({"shape": shape, "pass": pass_, "times": t, "ratio": ratio,
                            "quartiles": (q1, med, q3)})
            mib = shape[0] * shape[1] * np.dtype(DTYPE).itemsize / 2**20
            rows.append([f"{shape[0]}x{shape[1]}", num(mib), pass_, len(t),
                         num(np.median(t[:, 0]) * 1e6), num(np.median(t[:, 1]) * 1e6),
                         f"{med:.3f}", f"{q1:.3f}..{q3:.3f}"])
    res.tables.append((
        f"Compiled kernels, {np.dtype(DTYPE).name}, one thread, preallocated outputs; paired "
        f"rounds in random order (this machine: {_cache_text()}; shared with other jobs, so "
        f"expect noise).",
        markdown_table(["shape", "MiB per array", "pass", "rounds", "RMSNorm us (median)",
                        "LayerNorm us (median)", "LayerNorm / RMSNorm (median of rounds)",
                        "quartiles of the ratio"], rows)))

    meds = {p: [t["quartiles"][1] for t in timings if t["pass"] == p]
            for p in ("forward", "backward")}
    res.findings += [
        f"on rows with mean 0 the two kernels agree to {num(same[0][1])}; with the rows "
        f"shifted by {ROW_SHIFT:g} they differ by up to {num(same[1][1])}.",
        f"LayerNorm / RMSNorm time, median of the paired rounds: forward "
        f"{min(meds['forward']):.2f} to {max(meds['forward']):.2f}, backward "
        f"{min(meds['backward']):.2f} to {max(meds['backward']):.2f} over the shapes above.",
    ]
    res.data = {"same_input": same, "timings": timings}
    return res


def plot(res, path, plt):
    timings = res.data["timings"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(timings) + 1.6))
    y = np.arange(len(timings))[::-1]
    colours = {"forward": "tab:blue", "backward": "tab:orange"}
    for yi, t in zip(y, timings):
        q1, med, q3 = t["quartiles"]
        ax.barh(yi, med, color=colours[t["pass"]], xerr=[[med - q1], [q3 - med]], capsize=3,
                label=t["pass"])
    ax.set_yticks(y)
    ax.set_yticklabels([f"{t['shape'][0]}x{t['shape'][1]} {t['pass']}" for t in timings])
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("LayerNorm time / RMSNorm time (median of paired rounds; bars: quartiles)")
    ax.set_title(f"{res.title}\nfloat32, one thread")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
