"""deepnorm: plain Post-LN against DeepNorm (Wang et al. 2022, "DeepNet: Scaling
Transformers to 1,000 Layers") at a shallow and a deeper depth, with Pre-LN for reference
(and, at the deeper depth, the parallel-residual and sandwich blocks: the other layouts of
resnorm.nn whose residual stream is not normalised).

DeepNorm is Post-LN with the skip connection weighted by alpha = (2N)^(1/4) and the FFN,
value and output-projection weights initialised with gain beta = (8N)^(-1/4) (the paper's
encoder-only constants, resnorm.nn.DeepNormBlock).  The paper's claims: plain Post-LN
becomes unstable as depth grows (at 18 layers and beyond in their experiments, even with
warm-up), DeepNorm trains at any depth; the mechanism, their Figure 3: Post-LN's model
output moves a lot in the first steps, DeepNorm bounds that update.

The task is the character-level language model of the warmup demo (_charlm.py: Python's
documentation topics, Adam with warm-up).  Each configuration (block type x depth, an
"arm") is trained on a grid of peak learning rates and over several seeds; per seed, an
arm's result is its held-out loss at its best learning rate, and every claim is checked
seed by seed on those results.  Within a seed every run starts from the same seed and
sees the same batches.  Measured: the held-out loss at the end, divergence (a non-finite
loss) and stalling (held-out loss not STALLED nats below the unigram level), the number of
grid learning rates at which an arm trained (its stable range), and the model update
||y_t - y_0|| / ||y_0|| of the stack's output y on a fixed batch, every few steps.
"""
import numpy as np

from .. import nn
from . import _charlm
from ._charlm import MISSING_TEXT, STALLED
from ._common import DemoResult, majority, num, seeds_verdict, spread_text

BLOCKS = (("post", "Post-LN"), ("deepnorm", "DeepNorm"), ("pre", "Pre-LN"),
          ("parallel", "parallel (one norm)"), ("sandwich", "sandwich"))
REFERENCE = ("pre", "parallel", "sandwich")   # the blocks with an unnormalised stream
POST_GRID = (1e-3, 2e-3, 5e-3, 1e-2)
REFERENCE_GRID = (2e-3, 5e-3, 1e-2, 2e-2)     # these train at larger lrs: their own grid
SIZES = {
    # depths: depth -> the block types trained at that depth; lrs: block -> its lr grid;
    # probe_lr: the peak lr, on every grid, at which the early model updates are compared
    # (one lr for every model, as in the paper's Figure 3)
    "full": {"depths": {6: ("post", "deepnorm"), 12: ("post", "deepnorm") + REFERENCE},
             "lrs": {"post": POST_GRID, "deepnorm": POST_GRID}
                    | {b: REFERENCE_GRID for b in REFERENCE},
             "seeds": 5, "probe_lr": 5e-3, "steps": 120, "warmup": 30, "batch": 8,
             "seq": 32, "d": 32, "heads": 4, "eval_batches": 8, "every": 5},
    "tiny": {"depths": {2: ("post", "deepnorm"), 4: ("post", "deepnorm")},
             "lrs": {"post": (1e-3, 3e-3, 1e-2, 3e-2), "deepnorm": (1e-3, 3e-3, 1e-2, 3e-2)},
             "seeds": 3, "probe_lr": 1e-2, "steps": 80, "warmup": 20, "batch": 8, "seq": 32,
             "d": 32, "heads": 4, "eval_batches": 2, "every": 5},
}
NAMES = dict(BLOCKS)


def _run(cfg, data, vocab, arm, lr, seed):
    (block, depth), (train, held_out) = arm, data
    model = _charlm.CharLM(vocab, cfg["seq"], block, depth, cfg["d"], cfg["heads"], seed)
    probe_x, _ = _charlm.batch(np.random.default_rng(seed + 4), held_out, cfg["batch"],
                               cfg["seq"])
    outputs = []
    losses = _charlm.train(model, train, cfg["steps"], lr, cfg["warmup"], cfg["batch"],
                           cfg["seq"], seed + 1,
                           probe=lambda m: outputs.append(m.features(probe_x).copy()),
                           every=cfg["every"])
    diverged = bool(np.isnan(losses[-1]))
    final = np.inf if diverged else _charlm.evaluate(model, held_out, cfg["eval_batches"],
                                                      cfg["batch"], cfg["seq"], seed + 2)
    y0 = outputs[0]
    update = np.array([np.linalg.norm(y - y0) / np.linalg.norm(y0) for y in outputs])
    return {"losses": losses, "held_out": final, "diverged": diverged, "update": update}


def arms(depths):
    """(block, depth) -> its name, in table order."""
    return {(b, depth): f"{NAMES[b]}, {depth} layers"
            for depth, blocks in depths.items() for b in blocks}


def run(size="full", seed=0):
    cfg = SIZES[size]
    res = DemoResult("deepnorm", "Post-LN vs DeepNorm with depth (Wang et al. 2022)", size,
                     seed)
    try:
        train, held_out, vocab = _charlm.corpus()
    except ImportError:
        res.missing = MISSING_TEXT
        return res
    unigram = _charlm.unigram_loss(train, held_out, vocab)
    seeds = _charlm.run_seeds(seed, cfg["seeds"])
    names = arms(cfg["depths"])
    grids = {arm: cfg["lrs"][arm[0]] for arm in names}
    with _charlm.one_thread():
        runs = _charlm.sweep(grids, seeds, lambda arm, lr, s: _run(
            cfg, (train, held_out), vocab, arm, lr, s))
    tuned = {arm: _charlm.tune(runs, arm, grids[arm], seeds, unigram) for arm in names}
    updates = {arm: np.array([runs[arm, cfg["probe_lr"], s]["update"] for s in seeds])
               for arm in names}
    res.tables.append((
        f"Character-level language model on Python's documentation topics ({vocab} "
        f"symbols), d_model {cfg['d']}, {cfg['heads']} heads, batch {cfg['batch']} x "
        f"{cfg['seq']}; {cfg['steps']} Adam steps, warm-up over {cfg['warmup']} steps.  Every "
        f"configuration at every peak lr, over {len(seeds)} seeds (median (min..max); inf = "
        f"diverged).  Unigram level: {num(unigram)} nats per character; a run stalled when "
        f"its held-out loss is not {STALLED} below it.",
        _charlm.lr_table(names, grids, tuned)))
    every = cfg["every"]
    extra = {"alpha / beta": {arm: "{:.3f} / {:.3f}".format(*nn.deepnorm_constants(arm[1]))
                              if arm[0] == "deepnorm" else "-" for arm in names},
             f"model update after {every} steps at lr {cfg['probe_lr']:g}":
                 {arm: spread_text(u[:, 1]) for arm, u in updates.items()}}
    res.tables.append((
        f"Each configuration at its own best peak lr, chosen per seed ({len(seeds)} seeds).  "
        f"Model update = ||y_t - y_0|| / ||y_0|| of the stack output on a fixed held-out "
        f"batch, measured every {every} steps (before that step's update), here at one peak "
        f"lr for every model.",
        _charlm.best_table(names, grids, tuned, extra)))
    _findings(res, runs, tuned, updates, names, grids, unigram, cfg)
    res.data.update(runs=runs, tuned=tuned, updates=updates, grids=grids, names=names,
                    seeds=seeds, unigram=unigram, depths=cfg["depths"], every=every,
                    probe_lr=cfg["probe_lr"], warmup=cfg["warmup"], steps=cfg["steps"])
    return res


def depth_claims(tuned, updates, depth, blocks):
    """The per-seed truth of each claim at one depth, from the tuned arms: a dict of
    boolean arrays over the seeds, and the seed spread the loss differences are held
    against (the widest max - min of the tuned results at that depth)."""
    post, deep = tuned["post", depth], tuned["deepnorm", depth]
    noise = max(np.ptp(tuned[b, depth]["best_loss"]) for b in blocks)
    claims = {
        "post_fails": post["n_stable"] == 0,
        "deep_fails": deep["n_stable"] == 0,
        "deep_below": post["best_loss"] > deep["best_loss"],
        "deep_better": post["best_loss"] - deep["best_loss"] > noise,
        "post_narrower": post["n_stable"] < deep["n_stable"],
        "smaller_update": updates["deepnorm", depth][:, 1] < updates["post", depth][:, 1],
    }
    reference = [tuned[b, depth]["best_loss"] for b in REFERENCE if b in blocks]
    if reference:
        best_reference = np.min(reference, axis=0)
        claims["deep_like_reference"] = np.abs(deep["best_loss"] - best_reference) <= noise
    if len(reference) > 1:
        claims["reference_agree"] = np.ptp(reference, axis=0) <= noise
    return claims, noise


def _findings(res, runs, tuned, updates, names, grids, unigram, cfg):
    res.findings.append(
        "each configuration at its best peak lr (held-out loss over the seeds): "
        + "; ".join(f"{names[a]} {spread_text(tuned[a]['best_loss'])}" for a in names)
        + f" (unigram level {num(unigram)}).")
    every, probe = cfg["every"], cfg["probe_lr"]
    for depth, blocks in cfg["depths"].items():
        claims, noise = depth_claims(tuned, updates, depth, blocks)
        post, deep = tuned["post", depth], tuned["deepnorm", depth]
        res.findings += [
            seeds_verdict(f"at {depth} layers plain Post-LN fails at every grid lr (diverges "
                          f"or stalls)", claims["post_fails"])
            + f" (DeepNorm fails at every grid lr in {int(claims['deep_fails'].sum())} of "
            f"{len(claims['deep_fails'])} seeds).",
            seeds_verdict(f"at {depth} layers, each at its best lr, DeepNorm ends below plain "
                          f"Post-LN", claims["deep_below"])
            + f" (Post-LN - DeepNorm: {spread_text(post['best_loss'] - deep['best_loss'])}).",
            seeds_verdict(f"at {depth} layers, each at its best lr, DeepNorm ends below plain "
                          f"Post-LN by more than the seed spread ({noise:.2f})",
                          claims["deep_better"]) + ".",
            seeds_verdict(f"at {depth} layers plain Post-LN trains at fewer grid lrs than "
                          f"DeepNorm", claims["post_narrower"])
            + f" (Post-LN {spread_text(post['n_stable'], 0)}, DeepNorm "
            f"{spread_text(deep['n_stable'], 0)} of {len(grids['post', depth])}).",
            seeds_verdict(f"at {depth} layers and peak lr {probe:g}, DeepNorm's output moves "
                          f"less than Post-LN's in the first {every} steps (the paper's "
                          f"Figure 3)", claims["smaller_update"])
            + f" (Post-LN {spread_text(updates['post', depth][:, 1])}, DeepNorm "
            f"{spread_text(updates['deepnorm', depth][:, 1])}).",
        ]
        reference = ", ".join(NAMES[b] for b in REFERENCE if b in blocks)
        if "reference_agree" in claims:
            res.findings.append(seeds_verdict(
                f"at {depth} layers, each at its best lr, the blocks with an unnormalised "
                f"residual stream ({reference}) end within the seed spread ({noise:.2f}) of "
                f"each other", claims["reference_agree"]) + ".")
        if "deep_like_reference" in claims:
            res.findings.append(seeds_verdict(
                f"at {depth} layers, each at its best lr, DeepNorm ends within the seed spread "
                f"({noise:.2f}) of the best of {reference}", claims["deep_like_reference"]) + ".")
    deepest = max(cfg["depths"])
    claims, _ = depth_claims(tuned, updates, deepest, cfg["depths"][deepest])
    res.findings.append(_what_survives(claims, deepest))
    res.findings += _charlm.edge_findings(names, grids, tuned)
    diverged = sum(r["diverged"] for r in runs.values())
    stalled = sum(_charlm.stalled(r["held_out"], unigram) for r in runs.values())
    res.findings.append(
        f"of {len(runs)} runs, {diverged} diverged (a non-finite loss) and {stalled} stalled "
        f"at the unigram level.")


def _what_survives(claims, depth):
    """The paper's claim at the deepest depth, worded to what the seeds support."""
    n = len(claims["post_fails"])
    if majority(claims["post_fails"]):
        return (f"what survives (majorities of {n} seeds): plain Post-LN fails at {depth} "
                f"layers at every lr tried; DeepNorm "
                f"{'fails too' if majority(claims['deep_fails']) else 'trains'}.")
    text = f"at {depth} layers plain Post-LN trains once its lr is tuned"
    if majority(claims["post_narrower"]):
        text += ", over fewer learning rates than DeepNorm"
    if majority(claims["deep_better"]):
        text += ", and ends worse than DeepNorm by more than the seed spread"
    elif majority(claims["deep_below"]):
        text += (", and ends worse than DeepNorm, by less than the seed spread in most "
                 "seeds")
    else:
        text += ", and ends as well as DeepNorm"
    return (f"what survives (majorities of {n} seeds): {text}: 'plain Post-LN fails at "
            f"depth' holds only at learning rates outside its stable range.")


def plot(res, path, plt):
    if res.missing:
        return _charlm.plot_not_run(res, path, plt)
    depths, names, grids, tuned = (res.data[k] for k in ("depths", "names", "grids", "tuned"))
    fig, axes = _charlm.figure(plt, len(depths) + 1)
    colours = {"post": "C0", "deepnorm": "C2", "pre": "C1", "parallel": "C4", "sandwich": "C5"}
    for ax, (depth, blocks) in zip(axes, depths.items()):
        for block in blocks:
            arm, grid = (block, depth), grids[block, depth]
            held = np.minimum(tuned[arm]["held"], 2 * res.data["unigram"])  # inf: off the top
            ax.plot(grid, np.median(held, axis=0), "o-", color=colours[block],
                    label=names[arm])
            ax.fill_between(grid, held.min(axis=0), held.max(axis=0), alpha=0.15,
                            color=colours[block])
        ax.axhline(res.data["unigram"], color="gray", lw=0.8, ls=":", label="unigram level")
        ax.set_xscale("log")
        ax.set_title(f"held-out loss vs peak lr, {depth} layers "
                     f"({len(res.data['seeds'])} seeds)")
        ax.set_xlabel("peak lr")
        ax.set_ylabel("nats / character")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[-1]
    deepest = max(depths)
    for block in depths[deepest]:
        update = res.data["updates"][block, deepest]
        steps = np.arange(update.shape[1]) * res.data["every"]
        ax.plot(steps, np.median(update, axis=0), "o-", ms=3, color=colours[block],
                label=NAMES[block])
        ax.fill_between(steps, update.min(axis=0), update.max(axis=0), alpha=0.15,
                        color=colours[block])
    ax.set_title(f"model update ||y_t - y_0|| / ||y_0||, {deepest} layers, "
                 f"lr {res.data['probe_lr']:g}")
    ax.set_xlim(0, 2 * res.data["warmup"])
    ax.set_xlabel("Adam step")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
