"""convergence: gradient descent on the single-layer Transformer of Qin, Zhou, Jiang, Zhu
(2025, arXiv:2506.05249), F(X) = (FFN(Z) + Z) W_U with Z = Attn(X) + beta * X, for beta in
{0, 0.25, 0.5, 1} (model and backward: _transformer.py).

Their result: full-batch gradient descent on the squared loss converges linearly at a rate
set by sigma_min / sigma_max of Z, and the residual term beta * X keeps Z well conditioned
where the softmax alone makes it nearly low-rank.  Expected, therefore: larger beta, larger
sigma_min / sigma_max, faster convergence.  The demo measures it on two tasks:

* synthetic: S sequences of n Gaussian tokens, random Gaussian targets (fitting them is
  possible but needs a well-conditioned Z);
* real: the yearly sunspot numbers 1700-2008 bundled with statsmodels (read from the
  installed package, nothing is downloaded): each token holds the last d values, the
  target is the next year.  Without statsmodels this part is reported as not run.

Every beta starts from the same initial weights.  Each run is repeated over a grid of step
sizes; the "common" step is the largest at which no beta diverges.
"""
import numpy as np

from ._common import DemoResult, markdown_table, num
from . import _transformer

BETAS = (0.0, 0.25, 0.5, 1.0)
SIZES = {
    "full": {"steps": 2000, "record_every": 10,
             "synthetic": {"samples": 8, "tokens": 8, "d": 16, "d_out": 4,
                           "lrs": (2.5e-4, 5e-4, 1e-3, 2e-3)},
             "sunspots": {"tokens": 8, "lags": 16, "lrs": (1e-4, 2e-4, 5e-4, 1e-3)}},
    "tiny": {"steps": 200, "record_every": 10,
             "synthetic": {"samples": 4, "tokens": 4, "d": 8, "d_out": 2,
                           "lrs": (5e-4, 2e-3)},
             "sunspots": {"tokens": 4, "lags": 8, "lrs": (2e-4, 5e-4)}},
}
DIVERGED = 1e6      # loss above DIVERGED * initial loss (or not finite): the run diverged
MISSING_STATSMODELS = ("the real time series part (sunspots, bundled with statsmodels) was "
                       "not run: statsmodels is not installed.  Install it with "
                       "pip install 'resnorm[demos]' (or pip install statsmodels).")


def synthetic_task(rng, samples, tokens, d, d_out):
    return rng.standard_normal((samples, tokens, d)), rng.standard_normal((samples, tokens, d_out))


def sunspots_series():
    """The yearly sunspot numbers shipped inside statsmodels (ImportError without it)."""
    from statsmodels.datasets import sunspots
    return sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(dtype=np.float64)


def sunspots_task(series, tokens, lags):
    """Standardised series; token t = the last `lags` values, target = the next value;
    consecutive tokens grouped into sequences of `tokens`."""
    v = (series - series.mean()) / series.std()
    x = np.stack([v[t - lags + 1:t + 1] for t in range(lags - 1, len(v) - 1)])
    y = v[lags:, None]
    s = len(x) // tokens
    return x[:s * tokens].reshape(s, tokens, lags), y[:s * tokens].reshape(s, tokens, 1)


def train(x, y, beta, lr, steps, record_every, seed):
    """Full-batch gradient descent; returns losses (steps+1,) and the conditioning of Z at
    every record_every-th step; a diverged run stops and has NaN afterwards."""
    p = _transformer.init(np.random.default_rng(seed), x.shape[-1], 2 * x.shape[-1], y.shape[-1])
    losses = np.full(steps + 1, np.nan)
    cond = np.full(steps // record_every + 1, np.nan)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(steps + 1):
            loss, grads, z = _transformer.loss_and_grads(p, x, y, beta)
            if not np.isfinite(loss) or loss > DIVERGED * losses[0]:
                break
            losses[t] = loss
            if t % record_every == 0:
                cond[t // record_every] = _transformer.condition_ratio(z)
            for k in grads:
                p[k] -= lr * grads[k]
    return losses, cond


def _diverged(losses):
    return bool(np.isnan(losses[-1]))


def _study(x, y, lrs, steps, record_every, seed):
    runs = {(beta, lr): train(x, y, beta, lr, steps, record_every, seed)
            for beta in BETAS for lr in lrs}
    stable = [lr for lr in lrs if not any(_diverged(runs[b, lr][0]) for b in BETAS)]
    common = max(stable) if stable else None
    return runs, common


def _monotone(values, increasing):
    pairs = list(zip(values, values[1:]))
    return all(b > a for a, b in pairs) if increasing else all(b < a for a, b in pairs)


def _task_report(res, label, x, y, cfg, steps, record_every, seed):
    runs, common = _study(x, y, cfg["lrs"], steps, record_every, seed)
    checkpoints = [steps // 10, steps // 2, steps]
    rows, final_common, best_final, cond_start = [], [], [], []
    for beta in BETAS:
        finals = {lr: runs[beta, lr][0][-1] / runs[beta, lr][0][0] for lr in cfg["lrs"]
                  if not _diverged(runs[beta, lr][0])}
        best_lr = min(finals, key=finals.get) if finals else None
        max_stable = max(finals) if finals else None
        cond_start.append(runs[beta, cfg["lrs"][0]][1][0])
        best_final.append(finals.get(best_lr, np.nan))
        if common is None:
            rows.append([f"{beta:g}", num(cond_start[-1]), "-", "-", "-", "-",
                         "-" if best_lr is None else f"{num(finals[best_lr])} ({best_lr:g})",
                         "none" if max_stable is None else f"{max_stable:g}"])
            continue
        losses, cond = runs[beta, common]
        final_common.append(losses[-1] / losses[0])
        rows.append([f"{beta:g}", num(cond[0]), num(cond[-1]), num(losses[0])]
                    + [num(losses[c] / losses[0]) for c in checkpoints]
                    + [f"{num(finals[best_lr])} ({best_lr:g})", f"{max_stable:g}"])
    headers = (["beta", "sigma_min/sigma_max of Z, step 0", f"same, step {steps}",
                "loss, step 0"] + [f"loss/loss0, step {c}" for c in checkpoints]
               + ["best final loss/loss0 over the grid (its lr)", "largest stable lr"])
    if common is None:
        headers = headers[:2] + ["-"] * 5 + headers[-2:]
    n_samples, n_tokens, d = x.shape
    common_text = "none of the grid" if common is None else f"{common:g}"
    res.tables.append((
        f"{label}: {n_samples} sequences x {n_tokens} tokens x {d} features, "
        f"{y.shape[-1]} target(s) per token; {steps} full-batch gradient-descent steps at the "
        f"common step size lr = {common_text} (grid {', '.join(f'{v:g}' for v in cfg['lrs'])}).",
        markdown_table(headers, rows)))
    res.findings.append(
        f"{label}: sigma_min/sigma_max of Z at step 0 is "
        f"{', '.join(num(c) for c in cond_start)} for beta = {', '.join(f'{b:g}' for b in BETAS)}"
        f" (increasing with beta: {_monotone(cond_start, True)}).")
    if common is not None:
        at = {c: [runs[b, common][0][c] / runs[b, common][0][0] for b in BETAS]
              for c in checkpoints}
        ordered = ", ".join(f"step {c}: {_monotone(at[c], False)}" for c in checkpoints)
        res.findings.append(
            f"{label}: loss/loss0 decreasing with beta at the common lr {common:g}? {ordered}. "
            f"With each beta's best lr of the grid, final loss/loss0 = "
            f"{', '.join(num(v) for v in best_final)} (decreasing with beta: "
            f"{_monotone(best_final, False)}).")
    return {"runs": runs, "common_lr": common, "cond_start": cond_start,
            "final_common": final_common, "best_final": best_final, "lrs": cfg["lrs"]}


def run(size="full", seed=0):
    cfg = SIZES[size]
    steps, every = cfg["steps"], cfg["record_every"]
    res = DemoResult("convergence", "Single-layer Transformer with residual weight beta: "
                     "gradient descent (Qin et al. 2025)", size, seed)
    rng = np.random.default_rng(seed)
    syn = cfg["synthetic"]
    x, y = synthetic_task(rng, syn["samples"], syn["tokens"], syn["d"], syn["d_out"])
    res.data["synthetic"] = _task_report(res, "synthetic regression", x, y, syn, steps, every,
                                         seed)
    try:
        series = sunspots_series()
    except ImportError:
        res.missing = MISSING_STATSMODELS
        res.data["sunspots"] = None
    else:
        sun = cfg["sunspots"]
        x, y = sunspots_task(series, sun["tokens"], sun["lags"])
        res.data["sunspots"] = _task_report(
            res, f"sunspots 1700-2008 (statsmodels), next-year forecast from {sun['lags']} lags",
            x, y, sun, steps, every, seed)
    res.data.update(steps=steps, record_every=every)
    return res


def plot(res, path, plt):
    tasks = [(k, v) for k, v in (("synthetic", res.data["synthetic"]),
                                  ("sunspots", res.data["sunspots"])) if v and v["common_lr"]]
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.8 * len(tasks)), squeeze=False)
    steps, every = res.data["steps"], res.data["record_every"]
    for row, (name, task) in zip(axes, tasks):
        lr = task["common_lr"]
        for beta in BETAS:
            losses, cond = task["runs"][beta, lr]
            row[0].semilogy(losses / losses[0], label=f"beta = {beta:g}")
            row[1].semilogy(np.arange(len(cond)) * every, cond, label=f"beta = {beta:g}")
        row[0].set_title(f"{name}: loss / initial loss (lr = {lr:g})")
        row[1].set_title(f"{name}: sigma_min / sigma_max of Z = Attn(X) + beta X")
        for ax in row:
            ax.set_xlabel("gradient-descent step")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlim(0, steps)
        row[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
