"""convergence: gradient descent on the single-layer Transformer of Qin, Zhou, Jiang, Zhu
(2025, arXiv:2506.05249), F(X) = (FFN(Z) + Z) W_U with Z = Attn(X) + beta * X, for beta in
{0, 0.25, 0.5, 1} (model and backward: _transformer.py).

Their result: with a small enough step size, full-batch gradient descent on the squared
loss converges linearly at a rate governed by sigma_min / sigma_max of Z, and the residual
term beta * X keeps Z well conditioned where the softmax alone makes it badly conditioned.
What the demo measures, on two tasks:

* synthetic: S sequences of n Gaussian tokens with random Gaussian targets (the paper's
  model: every token attends to every token; the targets are independent of the inputs, so
  nothing can leak);
* sunspots: the yearly sunspot numbers 1700-2008 bundled with statsmodels (read from the
  installed package, nothing is downloaded).  Token t holds the last `lags` values up to
  year t and its target is year t + 1.  The attention is causal (token t sees tokens 0..t
  only): with every token seeing every other, token t could read its own target in the
  window of token t + 1.  The last sequences are held out to compare the forecast with a
  linear autoregression fitted on the same training windows.  Without statsmodels this
  part is reported as not run.

Every (beta, step size, seed) is a separate run; a seed fixes the initial weights, shared by
every beta and step size.  The step-size grid is geometric (factor 2) and must bracket each
beta's stability limit; the demo reports, per beta: the smallest step (where the paper's
regime of monotone descent holds), the largest stable step, the first diverging one, and
the step with the lowest final loss.
"""
from dataclasses import dataclass

import numpy as np

from ._common import DemoResult, markdown_table, num, plot_band, spread
from . import _transformer

BETAS = (0.0, 0.25, 0.5, 1.0)


def _grid(lo, n):
    return tuple(lo * 2.0**k for k in range(n))


SIZES = {
    "full": {"steps": 1000, "seeds": 3, "cond_every": 50,
             "synthetic": {"samples": 8, "tokens": 8, "d": 16, "d_out": 4,
                           "lrs": _grid(2.5e-4, 7)},
             "sunspots": {"tokens": 8, "lags": 8, "held_out": 0.2, "lrs": _grid(3.125e-5, 7)}},
    "tiny": {"steps": 150, "seeds": 2, "cond_every": 50,
             "synthetic": {"samples": 4, "tokens": 4, "d": 8, "d_out": 2,
                           "lrs": _grid(1e-3, 6)},
             "sunspots": {"tokens": 4, "lags": 4, "held_out": 0.2, "lrs": _grid(1.25e-4, 6)}},
}
DIVERGED = 1e6      # loss above DIVERGED * initial loss (or not finite): the run diverged
MISSING_STATSMODELS = ("the real time series part (sunspots, bundled with statsmodels) was "
                       "not run: statsmodels is not installed.  Install it with "
                       "pip install 'resnorm[demos]' (or pip install statsmodels).")


@dataclass
class Task:
    name: str
    label: str
    x: np.ndarray                 # (S, n, d) training inputs
    y: np.ndarray                 # (S, n, d_out) targets
    causal: bool
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None


def synthetic_task(rng, samples, tokens, d, d_out):
    x = rng.standard_normal((samples, tokens, d))
    y = rng.standard_normal((samples, tokens, d_out))
    return Task("synthetic", f"synthetic regression ({samples} sequences x {tokens} tokens x "
                f"{d} features, {d_out} random targets per token; attention over all tokens)",
                x, y, causal=False)


def sunspots_series():
    """The yearly sunspot numbers shipped inside statsmodels (ImportError without it)."""
    from statsmodels.datasets import sunspots
    return sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(dtype=np.float64)


def sunspots_task(series, tokens, lags, held_out):
    """Token t = the `lags` values up to year t, target = year t + 1; consecutive tokens are
    grouped into sequences of `tokens`; the last `held_out` fraction of the sequences is the
    test part.  Standardised with the mean and std of the years the training part sees."""
    windows = np.lib.stride_tricks.sliding_window_view(series[:-1], lags)
    targets = series[lags:]
    sequences = len(windows) // tokens
    n_test = max(1, round(held_out * sequences))
    n_train = sequences - n_test
    seen = series[:n_train * tokens + lags]
    mean, std = seen.mean(), seen.std()
    x = ((windows[:sequences * tokens] - mean) / std).reshape(sequences, tokens, lags)
    y = ((targets[:sequences * tokens] - mean) / std).reshape(sequences, tokens, 1)
    return Task("sunspots", f"sunspots 1700-2008 (statsmodels): next-year forecast from {lags} "
                f"lags, {n_train} training sequences x {tokens} tokens, {n_test} held out; "
                f"causal attention", x[:n_train], y[:n_train], True, x[n_train:], y[n_train:])


def linear_baseline(task):
    """Least squares of the targets on each token's own features (plus an intercept): for
    sunspots the linear autoregression AR(lags).  Returns (training loss, training MSE,
    held-out MSE or None); loss = 1/2 sum of squared errors, as the Transformer's."""
    def design(x):
        flat = x.reshape(-1, x.shape[-1])
        return np.hstack([flat, np.ones((len(flat), 1))])

    coef, *_ = np.linalg.lstsq(design(task.x), task.y.reshape(-1, task.y.shape[-1]), rcond=None)
    r = design(task.x) @ coef - task.y.reshape(-1, task.y.shape[-1])
    test_mse = None
    if task.x_test is not None:
        rt = design(task.x_test) @ coef - task.y_test.reshape(-1, task.y_test.shape[-1])
        test_mse = float(np.mean(rt * rt))
    return 0.5 * float(np.sum(r * r)), float(np.mean(r * r)), test_mse


@dataclass
class Study:
    """Every run of one task: runs[i] = (beta, lr, seed index)."""
    runs: list
    losses: np.ndarray            # (steps + 1, R), NaN after a run diverged
    cond: np.ndarray              # (steps // cond_every + 1, R) sigma_min/sigma_max of Z
    params: dict                  # the final weights, (R, ., .) each
    cond_every: int

    def index(self, beta, lr):
        return [i for i, (b, l, _) in enumerate(self.runs) if b == beta and l == lr]


def train(task, lrs, seeds, steps, cond_every, seed):
    """Full-batch gradient descent for every (beta, lr, seed index) at once.  A diverged
    run is frozen at its initial weights (to keep the batch finite) and reads NaN."""
    d, d_out = task.x.shape[-1], task.y.shape[-1]
    inits = [_transformer.init(np.random.default_rng([seed, i]), 1, d, 2 * d, d_out)
             for i in range(seeds)]
    runs = [(b, lr, i) for b in BETAS for lr in lrs for i in range(seeds)]
    p = {k: np.concatenate([inits[i][k] for _, _, i in runs]) for k in _transformer.PARAMS}
    p0 = {k: v.copy() for k, v in p.items()}
    beta = np.array([r[0] for r in runs])
    lr = np.array([r[1] for r in runs])[:, None, None]
    losses = np.full((steps + 1, len(runs)), np.nan)
    cond = np.full((steps // cond_every + 1, len(runs)), np.nan)
    alive = np.ones(len(runs), dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(steps + 1):
            loss, grads, z = _transformer.loss_and_grads(p, task.x, task.y, beta, task.causal)
            failed = alive & ~(loss <= DIVERGED * (loss if t == 0 else losses[0]))
            if failed.any():
                alive &= ~failed
                for k in p:
                    p[k][failed] = p0[k][failed]
            losses[t, alive] = loss[alive]
            if t % cond_every == 0:
                cond[t // cond_every, alive] = _transformer.condition_ratio(z[alive])
            step = lr * alive[:, None, None]
            for k in p:
                p[k] -= step * grads[k]
    return Study(runs, losses, cond, p, cond_every)


def linear_rate(losses):
    """-slope of a least-squares line through log(loss) over the steps, per column: the
    per-step factor of linear convergence is exp(-rate)."""
    t = np.arange(len(losses), dtype=np.float64)
    t -= t.mean()
    logs = np.log(losses)
    return -(t @ (logs - logs.mean(axis=0))) / (t @ t)


def _monotone_descent(losses):
    return bool(np.all(np.diff(losses, axis=0) <= 1e-12 * losses[:-1]))


def attention_at_init(task, seed):
    """How far the softmax attention is from uniform and from rank one at initialisation
    (the first seed's weights): the mean largest weight per row and its uniform value,
    and sigma_2 / sigma_1 of Attn(X) = softmax(...) X Wv per sequence (median, min, max)."""
    d, d_out = task.x.shape[-1], task.y.shape[-1]
    p = _transformer.init(np.random.default_rng([seed, 0]), 1, d, 2 * d, d_out)
    attn, _, _, v = _transformer.attention(p, task.x, task.causal)
    n = task.x.shape[-2]
    uniform = np.mean(1.0 / np.arange(1, n + 1)) if task.causal else 1.0 / n
    s = np.linalg.svd((attn @ v)[0], compute_uv=False)
    ratio = s[:, 1] / s[:, 0]
    return {"max_weight": float(attn.max(axis=-1).mean()), "uniform": float(uniform),
            "sigma2_over_sigma1": (float(np.median(ratio)), float(ratio.min()),
                                   float(ratio.max()))}


def _decreasing(values):
    return all(b < a for a, b in zip(values, values[1:]))


def _increasing(values):
    return all(b > a for a, b in zip(values, values[1:]))


def _test_mse(study, task, idx):
    out, _ = _transformer.forward({k: v[idx] for k, v in study.params.items()}, task.x_test,
                                  np.array([study.runs[i][0] for i in idx]), task.causal)
    r = (out - task.y_test).reshape(len(idx), -1)
    return np.mean(r * r, axis=1)


def analyse(study, task, lrs):
    """Per beta: the small-lr (theorem regime) numbers, the stability limit, the best lr."""
    losses, steps = study.losses, len(study.losses) - 1
    small, per_beta = lrs[0], []
    for beta in BETAS:
        finals = {}
        for lr in lrs:
            idx = study.index(beta, lr)
            if not np.isnan(losses[-1, idx]).any():
                finals[lr] = np.median(losses[-1, idx] / losses[0, idx])
        unstable = [lr for lr in lrs if lr not in finals]
        limit = max(finals) if finals else None
        diverges = min((lr for lr in unstable if limit is None or lr > limit), default=None)
        best = min(finals, key=finals.get) if finals else None
        row = {"beta": beta, "limit": limit, "diverges": diverges, "best": best,
               "bracketed": diverges is not None and best not in (None, lrs[0])}
        for which, lr in (("small", small), ("tuned", best)):
            if lr is None or lr not in finals:
                row[which] = None
                continue
            idx = study.index(beta, lr)
            L = losses[:, idx]
            row[which] = {"lr": lr, "loss0": np.median(L[0]), "final": spread(L[-1]),
                          "ratio": spread(L[-1] / L[0]), "rate": spread(linear_rate(L)),
                          "monotone": _monotone_descent(L),
                          "cond0": float(np.median(study.cond[0, idx])),
                          "cond_end": float(np.median(study.cond[-1, idx])),
                          "test_mse": (None if task.x_test is None
                                       else spread(_test_mse(study, task, idx)))}
        per_beta.append(row)
    return {"small_lr": small, "steps": steps, "per_beta": per_beta}


def _cell(s, digits=3):
    """A (median, min, max) spread as 'median (min..max)'."""
    return f"{num(s[0], digits)} ({num(s[1], digits)}..{num(s[2], digits)})"


def _report(res, task, study, analysis, baseline, attention, seeds):
    rows = analysis["per_beta"]
    steps, small = analysis["steps"], analysis["small_lr"]
    ok_small = [r for r in rows if r["small"] is not None]
    table = [[f"{r['beta']:g}", num(r["small"]["cond0"]), num(r["small"]["loss0"]),
              _cell(r["small"]["final"]), _cell(r["small"]["ratio"]),
              _cell(r["small"]["rate"]), str(r["small"]["monotone"])] for r in ok_small]
    res.tables.append((
        f"{task.label}. Smallest step of the grid, lr = {small:g} (the theorem's regime), "
        f"{steps} full-batch gradient-descent steps; median (min..max) over {seeds} seeds of "
        f"the initial weights.",
        markdown_table(["beta", "sigma_min/sigma_max of Z, step 0", "loss, step 0",
                        f"loss, step {steps}", f"loss/loss0, step {steps}",
                        "fitted linear rate per step", "every step descends"], table)))

    def tuned_row(r):
        t = r["tuned"]
        lim = "none" if r["limit"] is None else f"{r['limit']:g}"
        div = "none in the grid" if r["diverges"] is None else f"{r['diverges']:g}"
        if t is None:
            return [f"{r['beta']:g}", lim, div, "-", "-", "-", "-", "-"]
        extra = [] if task.x_test is None else [_cell(t["test_mse"])]
        return [f"{r['beta']:g}", lim, div, f"{t['lr']:g}", _cell(t["final"]),
                _cell(t["ratio"]), _cell(t["rate"]), str(t["monotone"])] + extra

    headers = ["beta", "largest stable lr", "first diverging lr", "best lr",
               f"loss, step {steps}", f"loss/loss0, step {steps}", "fitted linear rate per step",
               "every step descends"]
    if task.x_test is not None:
        headers.append("held-out MSE")
    grid = ", ".join(f"{v:g}" for v in study_lrs(study))
    res.tables.append((
        f"{task.label}. Each beta at its own step size: the grid {grid}; 'stable' = no seed "
        f"diverged (loss above {DIVERGED:g} x loss0 or not finite); best = lowest median final "
        f"loss/loss0 among the stable steps.",
        markdown_table(headers, [tuned_row(r) for r in rows])))

    name = task.name
    cond0 = [r["small"]["cond0"] for r in ok_small]
    ratio_small = [r["small"]["ratio"][0] for r in ok_small]
    final_small = [r["small"]["final"][0] for r in ok_small]
    rate_small = [r["small"]["rate"][0] for r in ok_small]
    betas = ", ".join(f"{r['beta']:g}" for r in ok_small)
    monotone = all(r["small"]["monotone"] for r in ok_small)
    res.findings += [
        f"{name}, theorem regime (lr = {small:g}, every step of every run descends: "
        f"{monotone}): sigma_min/sigma_max of Z at step 0 = "
        f"{', '.join(num(c) for c in cond0)} for beta = {betas} (increasing with beta: "
        f"{_increasing(cond0)}); loss/loss0 after {steps} steps = "
        f"{', '.join(num(v) for v in ratio_small)} (decreasing with beta: "
        f"{_decreasing(ratio_small)}); fitted rates {', '.join(num(v) for v in rate_small)} "
        f"(increasing with beta: {_increasing(rate_small)}); absolute loss "
        f"{', '.join(num(v) for v in final_small)} (decreasing with beta: "
        f"{_decreasing(final_small)}).",
    ]
    loss0 = [r["small"]["loss0"] for r in ok_small]
    res.findings.append(
        f"{name}: the initial loss depends on beta ({', '.join(num(v) for v in loss0)}; "
        f"increasing with beta: {_increasing(loss0)}), so loss/loss0 and the absolute loss can "
        f"order the betas differently.")
    tuned = [r for r in rows if r["tuned"] is not None]
    limits = [r["limit"] for r in tuned]
    t_ratio = [r["tuned"]["ratio"][0] for r in tuned]
    t_final = [r["tuned"]["final"][0] for r in tuned]
    tuned_betas = ", ".join(f"{r['beta']:g}" for r in tuned)
    res.findings.append(
        f"{name}, each beta at its best step: stability limits (largest stable lr) "
        f"{', '.join(f'{v:g}' for v in limits)} for beta = {tuned_betas} (every limit bracketed by a diverging "
        f"step and the best step above the grid's smallest: "
        f"{all(r['bracketed'] for r in rows)}); final loss/loss0 = "
        f"{', '.join(num(v) for v in t_ratio)} (decreasing with beta: {_decreasing(t_ratio)}); "
        f"absolute loss {', '.join(num(v) for v in t_final)} (decreasing with beta: "
        f"{_decreasing(t_final)}).")
    train_loss, train_mse, test_mse = baseline
    if task.x_test is None:
        res.findings.append(
            f"{name}: a linear least-squares fit of the targets on each token's features "
            f"reaches loss {num(train_loss)} on the same data (reference for the table).")
    else:
        best = {f"{r['beta']:g}": r["tuned"]["test_mse"][0] for r in tuned}
        res.findings.append(
            f"{name}: the linear autoregression on the same training windows reaches training "
            f"loss {num(train_loss)} (MSE {num(train_mse)}) and held-out MSE {num(test_mse)}; "
            f"the Transformer's held-out MSE at each beta's best step: "
            f"{', '.join(f'beta {b}: {num(v)}' for b, v in best.items())} (1 = predicting the "
            f"mean of the training years).")
    s21 = attention["sigma2_over_sigma1"]
    res.findings.append(
        f"{name}, attention at initialisation: mean largest weight per row "
        f"{num(attention['max_weight'])} (uniform attention: {num(attention['uniform'])}); "
        f"sigma_2/sigma_1 of Attn(X) per sequence {num(s21[0])} (median; "
        f"{num(s21[1])}..{num(s21[2])}; 0 would be rank one).")


def study_lrs(study):
    return sorted({lr for _, lr, _ in study.runs})


def _run_task(res, task, lrs, cfg, seed):
    study = train(task, lrs, cfg["seeds"], cfg["steps"], cfg["cond_every"], seed)
    analysis = analyse(study, task, lrs)
    baseline = linear_baseline(task)
    attention = attention_at_init(task, seed)
    _report(res, task, study, analysis, baseline, attention, cfg["seeds"])
    return {"study": study, "analysis": analysis, "baseline": baseline, "attention": attention,
            "lrs": lrs}


def run(size="full", seed=0):
    cfg = SIZES[size]
    res = DemoResult("convergence", "Single-layer Transformer with residual weight beta: "
                     "gradient descent (Qin et al. 2025)", size, seed)
    syn = cfg["synthetic"]
    task = synthetic_task(np.random.default_rng(seed), syn["samples"], syn["tokens"], syn["d"],
                          syn["d_out"])
    res.data["synthetic"] = _run_task(res, task, syn["lrs"], cfg, seed)
    try:
        series = sunspots_series()
    except ImportError:
        res.missing = MISSING_STATSMODELS
        res.data["sunspots"] = None
    else:
        sun = cfg["sunspots"]
        task = sunspots_task(series, sun["tokens"], sun["lags"], sun["held_out"])
        res.data["sunspots"] = _run_task(res, task, sun["lrs"], cfg, seed)
    res.data.update(steps=cfg["steps"], seeds=cfg["seeds"])
    return res


def plot(res, path, plt):
    tasks = [(k, v) for k, v in (("synthetic", res.data["synthetic"]),
                                  ("sunspots", res.data["sunspots"])) if v]
    fig, axes = plt.subplots(len(tasks), 3, figsize=(15, 4.6 * len(tasks)), squeeze=False)
    for row, (name, t) in zip(axes, tasks):
        study, analysis = t["study"], t["analysis"]
        steps = np.arange(len(study.losses))
        small = analysis["small_lr"]
        for r in analysis["per_beta"]:
            beta = r["beta"]
            L = study.losses[:, study.index(beta, small)]
            plot_band(row[0], steps, (L / L[0]).T, f"beta = {beta:g}")
            if r["tuned"] is not None:
                L = study.losses[:, study.index(beta, r["tuned"]["lr"])]
                plot_band(row[1], steps, L.T, f"beta = {beta:g} (lr {r['tuned']['lr']:g})")
            c = study.cond[:, study.index(beta, small)]
            plot_band(row[2], np.arange(len(c)) * study.cond_every, c.T, f"beta = {beta:g}")
        row[1].axhline(t["baseline"][0], color="black", ls="--", lw=1,
                       label="linear least squares" if name == "synthetic" else "linear AR")
        row[0].set_title(f"{name}: loss / initial loss\nsmallest step, lr = {small:g}")
        row[0].set_ylabel("loss / loss at step 0")
        row[1].set_title(f"{name}: absolute loss\neach beta at its best step")
        row[1].set_ylabel("loss = 1/2 sum of squared errors")
        row[2].set_title(f"{name}: sigma_min / sigma_max of Z\n"
                         f"Z = Attn(X) + beta X, smallest step, lr = {small:g}")
        row[2].set_ylabel("sigma_min / sigma_max of Z")
        for ax in row:
            ax.set_xlabel("gradient-descent step")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"{res.title}: median over {res.data['seeds']} seeds, band = min..max")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
