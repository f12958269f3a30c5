"""convergence: gradient descent on the single-layer Transformer of Qin, Zhou, Jiang, Zhu
(2025, arXiv:2506.05249), F(X) = (FFN(Z) + Z) W_U with Z = Attn(X) + beta * X, for beta in
{0, 0.25, 0.5, 1} (model and backward: _transformer.py).

Their result: with a small enough step size, full-batch gradient descent on the squared
loss converges linearly at a rate governed by sigma_min / sigma_max of Z, and the residual
term beta * X keeps Z well conditioned where the softmax alone makes it badly conditioned.
What the demo measures, on two tasks:

* synthetic: S sequences of n Gaussian tokens with random Gaussian targets (the paper's
  model: every token attends to every token; the targets are independent of the inputs, so
  nothing can leak).  Each seed draws its own data set;
* sunspots: the yearly sunspot numbers 1700-2008 bundled with statsmodels (read from the
  installed package, nothing is downloaded).  Token t holds the last `lags` values up to
  year t and its target is year t + 1.  The attention is causal (token t sees tokens 0..t
  only): with every token seeing every other, token t could read its own target in the
  window of token t + 1.  The last sequences are held out to compare the forecast with a
  linear autoregression fitted on the same training windows.  Without statsmodels this
  part is reported as not run.

A seed fixes the initial weights (shared by every beta and step size) and the synthetic
data.  Every beta is trained at every step size of its own grid, geometric (factor 2),
starting from a smallest step common to all betas and reaching past that beta's stability
limit.  Per seed and beta: the run at the smallest step tried (the betas compared at one
step), the largest step that trained, and the best step (lowest final loss / initial
loss).  Every claim is checked seed by seed and printed as "holds in k of n seeds".  The
smallest step is only the smallest one tried: whether it satisfies the step-size
condition of the paper's theorem is not computed.  Near the stability limit the final
loss depends on rounding, so the runs at the smallest and at the best step are repeated
with every input moved by one ulp, and the ratio of the final losses is reported.
"""
from dataclasses import dataclass

import numpy as np

from ._common import (DemoResult, majority, markdown_table, num, plot_band, seeds_verdict,
                      spread)
from . import _transformer

BETAS = (0.0, 0.25, 0.5, 1.0)


def _grids(lo, points):
    """Each beta's step sizes: lo, 2 lo, 4 lo, ..., `points` of them (one count per beta)."""
    return {b: tuple(lo * 2.0**k for k in range(n)) for b, n in zip(BETAS, points)}


SIZES = {
    "full": {"steps": 1000, "seeds": 10, "cond_every": 50,
             "synthetic": {"samples": 8, "tokens": 8, "d": 16, "d_out": 4,
                           "lrs": _grids(1.25e-4, (8, 8, 8, 7))},
             "sunspots": {"tokens": 8, "lags": 8, "held_out": 0.2,
                          "lrs": _grids(3.125e-5, (8, 8, 8, 7))}},
    "tiny": {"steps": 150, "seeds": 3, "cond_every": 50,
             "synthetic": {"samples": 4, "tokens": 4, "d": 8, "d_out": 2,
                           "lrs": _grids(1e-3, (7, 7, 7, 6))},
             "sunspots": {"tokens": 4, "lags": 4, "held_out": 0.2,
                          "lrs": _grids(1.25e-4, (7, 7, 7, 6))}},
}
DIVERGED = 1e6      # loss above DIVERGED * initial loss (or not finite): the run diverged
SENSITIVE = 1.1     # a final loss moved by more than 10% by a one-ulp change of the inputs
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
                f"{d} features, {d_out} random targets per token, a new draw per seed; "
                f"attention over all tokens)", x, y, causal=False)


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
    """Every run of one task and seed: runs[i] = (beta, lr)."""
    runs: list
    losses: np.ndarray            # (steps + 1, R), NaN after a run diverged
    cond: np.ndarray              # (steps // cond_every + 1, R) sigma_min/sigma_max of Z
    params: dict                  # the final weights, (R, ., .) each
    cond_every: int

    def index(self, beta, lr):
        return self.runs.index((beta, lr))


def init_weights(task, seed, k):
    """The initial weights of seed number k (one model; every run of the seed copies it)."""
    d, d_out = task.x.shape[-1], task.y.shape[-1]
    return _transformer.init(np.random.default_rng([seed, k, 1]), 1, d, 2 * d, d_out)


def train(task, runs, init, steps, cond_every):
    """Full-batch gradient descent for every (beta, lr) of runs at once, each from the
    weights init.  A diverged run is frozen at its initial weights (to keep the batch
    finite) and reads NaN."""
    p = {k: np.repeat(init[k], len(runs), axis=0) for k in _transformer.PARAMS}
    p0 = {k: v.copy() for k, v in p.items()}
    beta = np.array([b for b, _ in runs])
    lr = np.array([lr for _, lr in runs])[:, None, None]
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
    return Study(list(runs), losses, cond, p, cond_every)


def linear_rate(losses):
    """-slope of a least-squares line through log(loss) over the steps, per column: the
    per-step factor of linear convergence is exp(-rate)."""
    t = np.arange(len(losses), dtype=np.float64)
    t -= t.mean()
    logs = np.log(losses)
    return -(t @ (logs - logs.mean(axis=0))) / (t @ t)


def monotone_descent(losses):
    """Per column: every step lowered the loss (to rounding)."""
    return np.all(np.diff(losses, axis=0) <= 1e-12 * losses[:-1], axis=0)


def attention_at_init(task, init):
    """How far the softmax attention is from uniform and from rank one at initialisation:
    the mean largest weight per row, its value for uniform attention, and the median over
    the sequences of sigma_2 / sigma_1 of Attn(X) = softmax(...) X Wv."""
    attn, _, _, v = _transformer.attention(init, task.x, task.causal)
    n = task.x.shape[-2]
    uniform = np.mean(1.0 / np.arange(1, n + 1)) if task.causal else 1.0 / n
    s = np.linalg.svd((attn @ v)[0], compute_uv=False)
    return {"max_weight": float(attn.max(axis=-1).mean()), "uniform": float(uniform),
            "sigma2_over_sigma1": float(np.median(s[:, 1] / s[:, 0]))}


def _test_mse(study, task, idx):
    out, _ = _transformer.forward({k: v[idx] for k, v in study.params.items()}, task.x_test,
                                  np.array([study.runs[i][0] for i in idx]), task.causal)
    r = (out - task.y_test).reshape(len(idx), -1)
    return np.mean(r * r, axis=1)


def _nudged(task):
    """task with every input moved by one ulp (towards +inf)."""
    return Task(task.name, task.label, np.nextafter(task.x, np.inf), task.y, task.causal,
                task.x_test, task.y_test)


def tune(studies, tasks, grids):
    """Per beta, arrays over (seeds, grid): ratio (final loss / initial loss, NaN when the
    run diverged), final, rate, monotone, trained (did not diverge and ended below its
    initial loss); over seeds: loss0, cond0, n_trained, best (index of the lowest ratio
    among the trained steps, -1 when none trained), limit (index of the largest step that
    trained, -1 when none), bracketed (the smallest step trained and the largest diverged
    or did not train), edge (the best step is the largest that trained and the next one
    of the grid failed), and at the best step: best_ratio, best_final, best_rate,
    best_monotone, best_lr, limit_lr, and best_test (held-out MSE, sunspots only)."""
    out = {}
    for beta in BETAS:
        grid = grids[beta]
        cols = [[s.index(beta, lr) for lr in grid] for s in studies]
        L = np.array([s.losses[:, c].T for s, c in zip(studies, cols)])   # (seeds, grid, T+1)
        final, loss0 = L[:, :, -1], L[:, :, 0]
        trained = np.isfinite(final) & (final < loss0)
        ratio = np.where(trained, final / loss0, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.array([linear_rate(l.T) for l in L])
        monotone = np.array([monotone_descent(l.T) for l in L])
        limit = np.array([np.flatnonzero(t).max() if t.any() else -1 for t in trained])
        best = np.array([int(np.nanargmin(r)) if np.isfinite(r).any() else -1 for r in ratio])
        at = lambda a: np.array([a[k, i] if i >= 0 else np.nan for k, i in enumerate(best)])
        t = {"grid": grid, "ratio": ratio, "final": final, "rate": rate,
             "monotone": monotone, "trained": trained, "loss0": loss0[:, 0],
             "cond0": np.array([s.cond[0, c[0]] for s, c in zip(studies, cols)]),
             "n_trained": trained.sum(axis=1), "best": best, "limit": limit,
             "bracketed": trained[:, 0] & ~trained[:, -1],
             "edge": (best >= 0) & (best == limit) & (limit < len(grid) - 1),
             "best_ratio": at(ratio), "best_final": at(np.where(trained, final, np.nan)),
             "best_rate": at(rate), "best_monotone": at(monotone) == 1,
             "best_lr": np.array([grid[i] if i >= 0 else np.nan for i in best]),
             "limit_lr": np.array([grid[i] if i >= 0 else np.nan for i in limit])}
        if tasks[0].x_test is not None:
            t["best_test"] = np.array([
                _test_mse(s, task, [c[i]])[0] if i >= 0 else np.nan
                for s, task, c, i in zip(studies, tasks, cols, best)])
        out[beta] = t
    return out


def rounding(studies, tasks, inits, tuned, steps, cond_every):
    """The runs at the smallest and at the best step of every beta, repeated with every
    input moved by one ulp: (final loss nudged / final loss) over seeds, {"small": {beta:
    array}, "best": {beta: array}}; NaN where no step of the grid trained, inf where the
    repeat diverged.  Results do not depend on which runs share a batch, so the repeat
    runs only these."""
    out = {"small": {b: [] for b in BETAS}, "best": {b: [] for b in BETAS}}
    for k, (study, task, init) in enumerate(zip(studies, tasks, inits)):
        picks = {(which, b): tuned[b]["grid"][0] if which == "small" else tuned[b]["best_lr"][k]
                 for which in out for b in BETAS}
        runs = sorted({(b, lr) for (_, b), lr in picks.items() if np.isfinite(lr)})
        again = train(_nudged(task), runs, init, steps, cond_every)
        for (which, b), lr in picks.items():
            if not np.isfinite(lr):
                out[which][b].append(np.nan)
                continue
            nudged = again.losses[-1, again.index(b, lr)]
            out[which][b].append(nudged / study.losses[-1, study.index(b, lr)]
                                 if np.isfinite(nudged) else np.inf)
    return {w: {b: np.array(v) for b, v in d.items()} for w, d in out.items()}


def _decreasing(a):
    """Per row of a (seeds, betas): strictly decreasing along the betas."""
    return np.all(np.diff(a, axis=1) < 0, axis=1)


def task_claims(t, moved, attention, baseline):
    """The per-seed truth of each claim on one task: a dict of boolean arrays over the
    seeds.  t: tune()'s result, moved: rounding()'s, attention: attention_at_init() per
    seed, baseline: linear_baseline()."""
    col = lambda key, i=None: np.array([t[b][key] if i is None else t[b][key][:, i]
                                        for b in BETAS]).T       # (seeds, betas)
    claims = {
        "small_monotone": np.all(col("monotone", 0), axis=1),
        "cond_up": _decreasing(-col("cond0")),
        "loss0_up": _decreasing(-col("loss0")),
        "small_ratio_down": _decreasing(col("ratio", 0)),
        "small_final_down": _decreasing(col("final", 0)),
        "small_rate_up": _decreasing(-col("rate", 0)),
        "bracketed": np.all(col("bracketed"), axis=1),
        "limit_not_up": np.all(np.diff(col("limit_lr"), axis=1) <= 0, axis=1),
        "tuned_ratio_down": _decreasing(col("best_ratio")),
        "tuned_final_down": _decreasing(col("best_final")),
        "tuned_monotone": np.all(col("best_monotone"), axis=1),
        "small_sensitive": np.any(_moved_much(moved["small"]), axis=1),
        "best_sensitive": np.any(_moved_much(moved["best"]), axis=1),
        "attn_not_uniform": np.array([a["max_weight"] > 1.5 * a["uniform"] for a in attention]),
        "attn_not_rank_one": np.array([a["sigma2_over_sigma1"] > 0.2 for a in attention]),
    }
    if "best_test" in t[BETAS[0]]:
        train_loss, _, test_mse = baseline
        claims["below_ar"] = np.all(col("best_final") < train_loss, axis=1)
        claims["forecast_better"] = np.any(col("best_test") < 0.9 * test_mse, axis=1)
    return claims


def _moved_much(moved):
    """(seeds, betas): the final loss moved by more than SENSITIVE either way (inf: the
    repeat diverged; NaN, no step trained: False)."""
    m = np.array([moved[b] for b in BETAS]).T
    with np.errstate(invalid="ignore"):
        return (m > SENSITIVE) | (m < 1 / SENSITIVE)


def _digits(values, most=3):
    """The significant digits the spread of values supports: the median's digits down to
    the first significant digit of max - min (at least 1, at most `most`); None when no
    value is finite."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return None
    med, lo, hi = spread(v)
    if hi == lo:
        return most
    mag = np.floor(np.log10(abs(med) or max(abs(lo), abs(hi))))
    return int(np.clip(mag - np.floor(np.log10(hi - lo)) + 1, 1, most))


def _sig(x, digits):
    """x to `digits` significant digits: fixed decimals in [1e-3, 1e5), else exponent."""
    x = float(f"{x:.{digits - 1}e}")          # rounded first: 0.99996 reads 1.00
    if x == 0 or 1e-3 <= abs(x) < 1e5:
        return f"{x:.{max(0, digits - 1 - int(np.floor(np.log10(abs(x) or 1.0))))}f}"
    return f"{x:.{digits - 1}e}"


def sig_text(values, most=3):
    """'median (min..max)' of values at the significant digits their spread supports, the
    same count for all three: for quantities spanning orders of magnitude, where fixed
    decimals would print 0.000.  Non-finite values are left out ('-' when none is
    finite)."""
    digits = _digits(values, most)
    if digits is None:
        return "-"
    med, lo, hi = spread(np.asarray(values, dtype=np.float64)[np.isfinite(values)])
    return f"{_sig(med, digits)} ({_sig(lo, digits)}..{_sig(hi, digits)})"


def medians_text(columns, most=3):
    """The medians of several columns (one per beta), 'a, b, c, d', all at one count of
    significant digits: the most that any column's spread supports, so that rounding does
    not reorder values the seeds order consistently ('-' for a column with no finite
    value)."""
    columns = [np.asarray(c, dtype=np.float64) for c in columns]
    digits = max((d for d in (_digits(c, most) for c in columns) if d is not None),
                 default=most)
    return ", ".join(_sig(np.median(c[np.isfinite(c)]), digits) if np.isfinite(c).any()
                     else "-" for c in columns)


def _counted(values):
    """'0.004 x3, 0.008 x7': how many seeds had each value (NaN: 'none')."""
    vals, counts = np.unique(np.where(np.isfinite(values), values, -1.0), return_counts=True)
    return ", ".join(f"{'none' if v < 0 else f'{v:g}'} x{c}" for v, c in zip(vals, counts))


def _of(flags):
    return f"{int(np.sum(flags))} of {len(flags)}"


def _tables(res, task, t, moved, steps, n):
    small = t[BETAS[0]]["grid"][0]
    res.tables.append((
        f"{task.label}.  The smallest step tried, lr = {small:g}, the same for every beta; "
        f"{steps} full-batch gradient-descent steps; median (min..max) over {n} seeds.  "
        f"One-ulp change: final loss with every input moved by one ulp / final loss.",
        markdown_table(
            ["beta", "sigma_min/sigma_max of Z, step 0", "loss, step 0",
             f"loss/loss0, step {steps}", f"loss, step {steps}", "fitted linear rate per step",
             "every step descends", "one-ulp change of the final loss"],
            [[f"{b:g}", sig_text(t[b]["cond0"]), sig_text(t[b]["loss0"]),
              sig_text(t[b]["ratio"][:, 0]), sig_text(t[b]["final"][:, 0]),
              sig_text(t[b]["rate"][:, 0]), f"{_of(t[b]['monotone'][:, 0])} seeds",
              sig_text(moved["small"][b])] for b in BETAS])))
    headers = ["beta", "grid", "lrs that trained", "largest that trained (x seeds)",
               "best lr (x seeds)", "best lr on the stability edge",
               "loss/loss0 at the best lr", "loss at the best lr",
               "fitted linear rate per step", "every step descends",
               "one-ulp change of the final loss"]
    if task.x_test is not None:
        headers.append("held-out MSE")
    rows = []
    for b in BETAS:
        r, g = t[b], t[b]["grid"]
        row = [f"{b:g}", f"{g[0]:g} to {g[-1]:g} ({len(g)})",
               f"{sig_text(r['n_trained'], 1)} of {len(g)}", _counted(r["limit_lr"]),
               _counted(r["best_lr"]), f"{_of(r['edge'])} seeds", sig_text(r["best_ratio"]),
               sig_text(r["best_final"]), sig_text(r["best_rate"]),
               f"{_of(r['best_monotone'])} seeds", sig_text(moved["best"][b])]
        if task.x_test is not None:
            row.append(sig_text(r["best_test"]))
        rows.append(row)
    res.tables.append((
        f"{task.label}.  Each beta on its own grid of step sizes (factor 2), tuned per seed: "
        f"the best lr is the one with the lowest final loss/loss0 among the lrs that "
        f"trained (no divergence: loss above {DIVERGED:g} x loss0 or not finite; final loss "
        f"below loss0); median (min..max) over {n} seeds.  On the stability edge: the best "
        f"lr is the largest that trained and the next grid lr failed.",
        markdown_table(headers, rows)))


def _findings(res, task, t, moved, claims, attention, baseline, steps):
    name, n = task.name, len(claims["cond_up"])
    small = t[BETAS[0]]["grid"][0]
    betas = ", ".join(f"{b:g}" for b in BETAS)
    med = lambda key, i=None: medians_text(t[b][key] if i is None else t[b][key][:, i]
                                           for b in BETAS)
    res.findings += [
        seeds_verdict(f"{name}, smallest step tried (lr = {small:g}): every step of every "
                      f"beta's run descends", claims["small_monotone"]) + ".",
        seeds_verdict(f"{name}: sigma_min/sigma_max of Z at initialisation increases with "
                      f"beta", claims["cond_up"]) + f" (medians {med('cond0')} for beta = "
                      f"{betas}).",
        seeds_verdict(f"{name}: the initial loss increases with beta, so loss/loss0 and the "
                      f"absolute loss can order the betas differently", claims["loss0_up"])
        + f" (medians {med('loss0')}).",
        seeds_verdict(f"{name}, smallest step tried: loss/loss0 after {steps} steps decreases "
                      f"with beta", claims["small_ratio_down"]) + f" (medians "
                      f"{med('ratio', 0)}).",
        seeds_verdict(f"{name}, smallest step tried: the absolute loss after {steps} steps "
                      f"decreases with beta", claims["small_final_down"])
        + f" (medians {med('final', 0)}).",
        seeds_verdict(f"{name}, smallest step tried: the fitted linear rate increases with "
                      f"beta", claims["small_rate_up"]) + f" (medians {med('rate', 0)}).",
        seeds_verdict(f"{name}: every beta's grid brackets its stability limit (the smallest "
                      f"lr trains, the largest does not)", claims["bracketed"])
        + f" (lrs that trained, per beta: "
        f"{', '.join(sig_text(t[b]['n_trained'], 1) for b in BETAS)}).",
        seeds_verdict(f"{name}: the largest lr that trained does not increase with beta",
                      claims["limit_not_up"]) + ".",
        seeds_verdict(f"{name}, each beta at its own best lr: loss/loss0 after {steps} steps "
                      f"decreases with beta", claims["tuned_ratio_down"])
        + f" (medians {med('best_ratio')}).",
        seeds_verdict(f"{name}, each beta at its own best lr: the absolute loss decreases "
                      f"with beta", claims["tuned_final_down"])
        + f" (medians {med('best_final')}).",
        seeds_verdict(f"{name}, each beta at its own best lr: every step descends",
                      claims["tuned_monotone"]) + ".",
        seeds_verdict(f"{name}: at the smallest step tried, a one-ulp change of the inputs "
                      f"moves some beta's final loss by more than {SENSITIVE - 1:.0%}",
                      claims["small_sensitive"]) + ".",
        seeds_verdict(f"{name}: at the best lr, a one-ulp change of the inputs moves some "
                      f"beta's final loss by more than {SENSITIVE - 1:.0%}",
                      claims["best_sensitive"])
        + f" (largest change per seed: {sig_text(_largest_change(moved['best']))}x).",
    ]
    for b in BETAS:
        edge = t[b]["edge"]
        if edge.any():
            res.findings.append(
                f"{name}, beta {b:g}: in {_of(edge)} seeds the best lr is the largest that "
                f"trained and the next grid lr failed: these runs sit on the stability edge, "
                f"where a grid point between the two could change the tuned result.")
    train_loss, train_mse, test_mse = baseline
    if task.x_test is None:
        res.findings.append(
            f"{name}: a linear least-squares fit of the targets on each token's features "
            f"reaches loss {sig_text(train_loss)} on the same data (median (min..max) over "
            f"the seeds' data sets; reference for the tables).")
    else:
        res.findings += [
            seeds_verdict(f"{name}: every beta's training loss at its best lr is below the "
                          f"linear autoregression's on the same windows ({num(train_loss)})",
                          claims["below_ar"]) + ".",
            seeds_verdict(f"{name}: some beta forecasts the held-out years at least 10% better "
                          f"than the linear autoregression (held-out MSE {num(test_mse)}; 1 = "
                          f"predicting the mean of the training years)",
                          claims["forecast_better"])
            + f" (held-out MSE at the best lr, medians: {med('best_test')}).",
        ]
    measured = (f"largest weight {sig_text([a['max_weight'] for a in attention])}, uniform "
                f"{num(attention[0]['uniform'])}; sigma_2/sigma_1 "
                f"{sig_text([a['sigma2_over_sigma1'] for a in attention])}")
    if task.causal:
        # causal rows are short at the start (row 0 has one weight, 1.0): 1.5x uniform
        # says little there, so only the numbers are given
        res.findings.append(f"{name}: attention at initialisation: mean largest weight per "
                            f"row and median sigma_2/sigma_1 of Attn(X): {measured}.")
    else:
        res.findings.append(seeds_verdict(
            f"{name}: at initialisation the attention is not uniform (mean largest weight "
            f"per row above 1.5x uniform) and Attn(X) is not near rank one (median "
            f"sigma_2/sigma_1 over the sequences above 0.2)",
            claims["attn_not_uniform"] & claims["attn_not_rank_one"]) + f" ({measured}).")
    res.findings.append(_what_survives(name, claims))


def _largest_change(moved):
    """Per seed, the largest factor by which a one-ulp change moved a beta's final loss."""
    m = np.array([moved[b] for b in BETAS]).T
    return np.nanmax(np.maximum(m, 1 / m), axis=1)


def _what_survives(name, claims):
    """The paper's claims on one task, worded to what the seeds support."""
    n = len(claims["cond_up"])
    small = []
    if majority(claims["cond_up"]):
        small.append("a larger beta gives a better-conditioned Z at initialisation")
    if majority(claims["small_ratio_down"]):
        small.append("at the smallest step tried a lower loss/loss0"
                     + (" and a lower absolute loss" if majority(claims["small_final_down"])
                        else ""))
    text = "; ".join(small) if small else "larger beta neither conditions Z better nor " \
                                          "lowers loss/loss0 at the smallest step tried"
    tuned = [majority(claims["tuned_ratio_down"]), majority(claims["tuned_final_down"])]
    if all(tuned):
        text += "; the ordering by beta survives tuning each beta's step"
    elif any(tuned):
        text += (f"; with each beta at its own best step only the "
                 f"{'normalised' if tuned[0] else 'absolute'} loss keeps the ordering by beta")
    else:
        text += "; with each beta at its own best step the ordering by beta is lost"
    if majority(claims["best_sensitive"]):
        text += (", and there the final loss depends on rounding (a one-ulp change of the "
                 "inputs moves it by more than 10%)")
    return f"what survives on the {name} task (majorities of {n} seeds): {text}."


def _run_task(res, make_task, lrs, cfg, seed):
    """Every seed of one task: per seed its task (make_task(k)), its weights, every beta at
    every lr of its grid; then the tuning, the rounding check, the tables and findings."""
    tasks = [make_task(k) for k in range(cfg["seeds"])]
    inits = [init_weights(task, seed, k) for k, task in enumerate(tasks)]
    runs = [(b, lr) for b in BETAS for lr in lrs[b]]
    studies = [train(task, runs, init, cfg["steps"], cfg["cond_every"])
               for task, init in zip(tasks, inits)]
    tuned = tune(studies, tasks, lrs)
    moved = rounding(studies, tasks, inits, tuned, cfg["steps"], cfg["cond_every"])
    attention = [attention_at_init(task, init) for task, init in zip(tasks, inits)]
    baselines = [linear_baseline(task) for task in tasks]
    # synthetic: one least-squares loss per seed's data; sunspots: the same data every seed
    baseline = (np.array([b[0] for b in baselines]), baselines[0][1], baselines[0][2]) \
        if tasks[0].x_test is None else baselines[0]
    claims = task_claims(tuned, moved, attention, baseline)
    _tables(res, tasks[0], tuned, moved, cfg["steps"], cfg["seeds"])
    _findings(res, tasks[0], tuned, moved, claims, attention, baseline, cfg["steps"])
    return {"studies": studies, "tuned": tuned, "moved": moved, "claims": claims,
            "attention": attention, "baseline": baseline, "lrs": lrs}


def run(size="full", seed=0):
    cfg = SIZES[size]
    res = DemoResult("convergence", "Single-layer Transformer with residual weight beta: "
                     "gradient descent (Qin et al. 2025)", size, seed)
    syn = cfg["synthetic"]
    res.data["synthetic"] = _run_task(
        res, lambda k: synthetic_task(np.random.default_rng([seed, k, 0]), syn["samples"],
                                      syn["tokens"], syn["d"], syn["d_out"]),
        syn["lrs"], cfg, seed)
    try:
        series = sunspots_series()
    except ImportError:
        res.missing = MISSING_STATSMODELS
        res.data["sunspots"] = None
    else:
        sun = cfg["sunspots"]
        task = sunspots_task(series, sun["tokens"], sun["lags"], sun["held_out"])
        res.data["sunspots"] = _run_task(res, lambda k: task, sun["lrs"], cfg, seed)
    res.data.update(steps=cfg["steps"], seeds=cfg["seeds"])
    return res


def plot(res, path, plt):
    tasks = [(k, v) for k, v in (("synthetic", res.data["synthetic"]),
                                  ("sunspots", res.data["sunspots"])) if v]
    fig, axes = plt.subplots(len(tasks), 4, figsize=(20, 4.6 * len(tasks)), squeeze=False)
    for row, (name, d) in zip(axes, tasks):
        studies, tuned = d["studies"], d["tuned"]
        steps = np.arange(len(studies[0].losses))
        small = tuned[BETAS[0]]["grid"][0]
        for b in BETAS:
            t = tuned[b]
            L = np.array([s.losses[:, s.index(b, small)] for s in studies])
            plot_band(row[0], steps, L / L[:, :1], f"beta = {b:g}")
            best = [s.losses[:, s.index(b, lr)] for s, lr in zip(studies, t["best_lr"])
                    if np.isfinite(lr)]
            if best:
                plot_band(row[1], steps, best, f"beta = {b:g}")
            c = np.array([s.cond[:, s.index(b, small)] for s in studies])
            plot_band(row[2], np.arange(c.shape[1]) * studies[0].cond_every, c,
                      f"beta = {b:g}")
            line = plot_band(row[3], t["grid"], np.where(t["trained"], t["ratio"], 1.0),
                             f"beta = {b:g}")
            line.set_marker("o")
        if name == "synthetic":
            row[1].axhline(np.median(d["baseline"][0]), color="black", ls="--", lw=1,
                           label="linear least squares (median)")
        else:
            row[1].axhline(d["baseline"][0], color="black", ls="--", lw=1, label="linear AR")
        row[0].set_title(f"{name}: loss / initial loss\nsmallest step tried, lr = {small:g}")
        row[0].set_ylabel("loss / loss at step 0")
        row[1].set_title(f"{name}: absolute loss\neach beta at its best step, per seed")
        row[1].set_ylabel("loss = 1/2 sum of squared errors")
        row[2].set_title(f"{name}: sigma_min / sigma_max of Z\n"
                         f"Z = Attn(X) + beta X, smallest step tried, lr = {small:g}")
        row[2].set_ylabel("sigma_min / sigma_max of Z")
        for ax in row[:3]:
            ax.set_xlabel("gradient-descent step")
        row[3].set_xscale("log")
        row[3].set_title(f"{name}: final loss / initial loss against the step size\n"
                         f"(1 = did not train)")
        row[3].set_xlabel("step size (lr)")
        for ax in row:
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"{res.title}: median over {res.data['seeds']} seeds, band = min..max")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
