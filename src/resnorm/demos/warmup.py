"""warmup: Post-LN and Pre-LN Transformers trained with Adam, with and without learning-rate
warm-up (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture").

Their result: a Post-LN Transformer needs the warm-up stage (without it, training ends far
worse), a Pre-LN Transformer does not; and at initialisation the gradient of Post-LN's
parameters near the output is large (their Figure 3: it grows with the layer index), while
Pre-LN's is the same in every layer.

The task: a character-level language model on the help texts of Python's documentation
topics (pydoc_data, bundled with Python; _charlm.py has the data, the model, the training
loop and the sweep).  Each configuration (block type x warm-up, an "arm") is trained on a
grid of peak learning rates and over several seeds; per seed, an arm's result is its
held-out loss at its best learning rate, and every claim is checked seed by seed on those
results.  Within a seed every run starts from the same initialisation and sees the same
batches.  A run diverged when its loss became non-finite and stalled when its held-out
loss is not STALLED nats below the unigram level (it learnt the character frequencies and
next to nothing else); the arm's stable range is the number of grid learning rates at
which it did neither.  Also measured: the gradient norm of each layer's linear2.weight
(the paper's W^2) at initialisation, averaged over a few batches, for every seed.
"""
import numpy as np

from . import _charlm
from ._charlm import MISSING_TEXT, STALLED
from ._common import (DemoResult, majority, markdown_table, num, seeds_verdict, spread,
                      spread_text)

BLOCKS = (("post", "Post-LN"), ("pre", "Pre-LN"))
GROWS = 1.05      # a gradient norm growing by more than 5% per layer "grows with depth"
SIZES = {
    "full": {"layers": 6, "lrs": (1e-3, 3e-3, 1e-2, 3e-2), "seeds": 5, "steps": 200,
             "warmup": 50, "batch": 8, "seq": 32, "d": 32, "heads": 4, "eval_batches": 8,
             "grad_batches": 4},
    "tiny": {"layers": 2, "lrs": (3e-3, 1e-2, 3e-2, 1e-1), "seeds": 3, "steps": 60,
             "warmup": 20, "batch": 8, "seq": 32, "d": 32, "heads": 4, "eval_batches": 2,
             "grad_batches": 2},
}


def arms(warmup):
    """(block, warm-up steps) -> its name, in table order."""
    return {(b, w): f"{name}, {f'warm-up {warmup}' if w else 'no warm-up'}"
            for b, name in BLOCKS for w in (0, warmup)}


def _model(cfg, vocab, block, seed):
    return _charlm.CharLM(vocab, cfg["seq"], block, cfg["layers"], cfg["d"], cfg["heads"],
                          seed)


def _run(cfg, data, vocab, arm, lr, seed):
    (block, warmup), (train, held_out) = arm, data
    model = _model(cfg, vocab, block, seed)
    losses = _charlm.train(model, train, cfg["steps"], lr, warmup, cfg["batch"], cfg["seq"],
                           seed + 1)
    diverged = bool(np.isnan(losses[-1]))
    final = np.inf if diverged else _charlm.evaluate(model, held_out, cfg["eval_batches"],
                                                      cfg["batch"], cfg["seq"], seed + 2)
    return {"losses": losses, "held_out": final, "diverged": diverged}


def _gradient_norms(cfg, data, vocab, block, seed):
    """||d linear2.weight|| of every layer at initialisation, mean over a few batches."""
    model = _model(cfg, vocab, block, seed)
    rng = np.random.default_rng(seed + 3)
    norms = np.zeros(cfg["layers"])
    for _ in range(cfg["grad_batches"]):
        x, y = _charlm.batch(rng, data[0], cfg["batch"], cfg["seq"])
        model.zero_grad()
        model.backward(_charlm.cross_entropy(model.forward(x), y)[1])
        norms += [np.linalg.norm(layer.ffn.linear2.dweight) for layer in model.stack.layers]
    return norms / cfg["grad_batches"]


def run(size="full", seed=0):
    cfg = SIZES[size]
    res = DemoResult("warmup", "Post-LN vs Pre-LN, with and without learning-rate warm-up "
                     "(Xiong et al. 2020)", size, seed)
    try:
        train, held_out, vocab = _charlm.corpus()
    except ImportError:
        res.missing = MISSING_TEXT
        return res
    unigram = _charlm.unigram_loss(train, held_out, vocab)
    seeds = _charlm.run_seeds(seed, cfg["seeds"])
    names = arms(cfg["warmup"])
    grids = {arm: cfg["lrs"] for arm in names}
    with _charlm.one_thread():
        runs = _charlm.sweep(grids, seeds, lambda arm, lr, s: _run(
            cfg, (train, held_out), vocab, arm, lr, s))
        grads = {b: np.array([_gradient_norms(cfg, (train, held_out), vocab, b, s)
                              for s in seeds]) for b, _ in BLOCKS}
    tuned = {arm: _charlm.tune(runs, arm, grids[arm], seeds, unigram) for arm in names}
    res.tables.append((
        f"Character-level language model on Python's documentation topics ({len(train)} "
        f"training / {len(held_out)} held-out characters, {vocab} symbols): "
        f"{cfg['layers']} layers, d_model {cfg['d']}, {cfg['heads']} heads, "
        f"batch {cfg['batch']} x {cfg['seq']} characters, {cfg['steps']} Adam steps "
        f"(betas 0.9, 0.98), warm-up linear over the first {cfg['warmup']} steps.  Every "
        f"configuration at every peak lr, over {len(seeds)} seeds (median (min..max); inf = "
        f"diverged).  Losses in nats per character; the unigram level (character "
        f"frequencies only) is {num(unigram)}; a run stalled when its held-out loss is not "
        f"{STALLED} below it.",
        _charlm.lr_table(names, grids, tuned)))
    res.tables.append((
        f"Each configuration at its own best peak lr, chosen per seed ({len(seeds)} seeds).",
        _charlm.best_table(names, grids, tuned)))
    layers = cfg["layers"]
    res.tables.append((
        f"Gradient norm of each layer's linear2.weight at initialisation (the paper's W^2), "
        f"mean over {cfg['grad_batches']} batches; median over {len(seeds)} seeds, and the "
        f"last / first layer ratio with its min..max.",
        markdown_table(["block"] + [f"layer {i + 1}" for i in range(layers)]
                       + ["last / first"],
                       [[name] + [num(v) for v in np.median(grads[b], axis=0)]
                        + [spread_text(grads[b][:, -1] / grads[b][:, 0])]
                        for b, name in BLOCKS])))
    _findings(res, runs, tuned, names, grids, grads, unigram, cfg)
    res.data.update(runs=runs, tuned=tuned, grids=grids, names=names, seeds=seeds,
                    grads=grads, unigram=unigram, lrs=cfg["lrs"], warmup=cfg["warmup"],
                    steps=cfg["steps"], layers=layers)
    return res


def warmup_claims(tuned, warmup):
    """The per-seed truth of each claim about warm-up, from the tuned arms: a dict of
    boolean arrays over the seeds, and the seed spread the loss differences are held
    against."""
    post0, postw = tuned["post", 0], tuned["post", warmup]
    pre0, prew = tuned["pre", 0], tuned["pre", warmup]
    # the seed-to-seed spread of a tuned result: the widest max - min of the four arms
    noise = max(np.ptp(t["best_loss"]) for t in tuned.values())
    return {
        "post_wider": postw["n_stable"] > post0["n_stable"],
        "pre_wider": prew["n_stable"] > pre0["n_stable"],
        "post_worse": post0["best_loss"] - postw["best_loss"] > noise,
        "pre_worse": pre0["best_loss"] - prew["best_loss"] > noise,
    }, noise


def _findings(res, runs, tuned, names, grids, grads, unigram, cfg):
    w = cfg["warmup"]
    claims, noise = warmup_claims(tuned, w)
    n = len(claims["post_wider"])
    post_diff = tuned["post", 0]["best_loss"] - tuned["post", w]["best_loss"]
    pre_diff = tuned["pre", 0]["best_loss"] - tuned["pre", w]["best_loss"]
    res.findings += [
        "each configuration at its best peak lr (held-out loss over the seeds): "
        + "; ".join(f"{names[a]} {spread_text(tuned[a]['best_loss'])}" for a in names)
        + f" (unigram level {num(unigram)}).",
        seeds_verdict("warm-up widens Post-LN's stable lr range (more grid lrs train "
                      "without diverging or stalling)", claims["post_wider"])
        + f" (lrs that trained, without / with warm-up: "
        f"{spread_text(tuned['post', 0]['n_stable'], 0)} / "
        f"{spread_text(tuned['post', w]['n_stable'], 0)} of {len(cfg['lrs'])}).",
        seeds_verdict("warm-up widens Pre-LN's stable lr range", claims["pre_wider"])
        + f" ({spread_text(tuned['pre', 0]['n_stable'], 0)} / "
        f"{spread_text(tuned['pre', w]['n_stable'], 0)} of {len(cfg['lrs'])}).",
        seeds_verdict(f"each at its best lr, Post-LN without warm-up ends worse than with it "
                      f"by more than the seed spread ({noise:.2f})", claims["post_worse"])
        + f" (difference without - with: {spread_text(post_diff)}).",
        seeds_verdict(f"each at its best lr, Pre-LN without warm-up ends worse than with it "
                      f"by more than the seed spread ({noise:.2f})", claims["pre_worse"])
        + f" (difference without - with: {spread_text(pre_diff)}).",
        _what_survives(claims, n),
    ]
    res.findings += _charlm.edge_findings(names, grids, tuned)
    diverged = sum(r["diverged"] for r in runs.values())
    stalled = sum(_charlm.stalled(r["held_out"], unigram) for r in runs.values())
    res.findings.append(
        f"of {len(runs)} runs, {diverged} diverged (a non-finite loss) and {stalled} stalled "
        f"at the unigram level.")
    factor = {b: np.array([_per_layer_factor(g) for g in grads[b]]) for b, _ in BLOCKS}
    last = grads["post"][:, -1] / grads["pre"][:, -1]
    res.findings += [
        seeds_verdict(f"at initialisation Post-LN's linear2.weight gradient grows with the "
                      f"layer index by more than {GROWS - 1:.0%} per layer (the paper's "
                      f"Figure 3)", factor["post"] > GROWS)
        + f" (fitted factor per layer: Post-LN {spread_text(factor['post'])}, Pre-LN "
        f"{spread_text(factor['pre'])}).",
        seeds_verdict("in the last layer Post-LN's linear2.weight gradient is larger than "
                      "Pre-LN's", last > 1) + f" (Post-LN / Pre-LN {spread_text(last)}).",
    ]


def _what_survives(claims, n):
    """The paper's claim, worded to what the seeds support."""
    wider, worse = majority(claims["post_wider"]), majority(claims["post_worse"])
    pre_fine = not majority(claims["pre_worse"])
    if wider and not worse:
        text = ("what survives: Post-LN without warm-up trains over a narrower lr range "
                "than with it, and at its best lr ends as well (within the seed spread): it "
                "does not need warm-up, it needs a smaller lr")
    elif worse:
        text = ("what survives: tuned Post-LN without warm-up ends worse than with it beyond "
                "the seed spread: Post-LN needs warm-up here")
    else:
        text = ("what survives: in most seeds warm-up neither widens Post-LN's stable lr "
                "range nor improves its tuned result")
    return (f"{text}; Pre-LN {'does not need it' if pre_fine else 'needs it too'} "
            f"(majorities of {n} seeds).")


def _per_layer_factor(norms):
    """exp of the least-squares slope of log(norm) against the layer index."""
    return float(np.exp(np.polyfit(np.arange(len(norms)), np.log(norms), 1)[0]))


def plot(res, path, plt):
    if res.missing:
        return _charlm.plot_not_run(res, path, plt)
    fig, axes = _charlm.figure(plt, 3)
    names, grids, tuned, w = (res.data[k] for k in ("names", "grids", "tuned", "warmup"))
    style = {arm: {"color": "C0" if arm[0] == "post" else "C1", "ls": "-" if arm[1] else "--"}
             for arm in names}
    ax = axes[0]
    for arm, grid in grids.items():
        held = np.minimum(tuned[arm]["held"], 2 * res.data["unigram"])   # inf: off the top
        ax.plot(grid, np.median(held, axis=0), "o", label=names[arm], **style[arm])
        ax.fill_between(grid, held.min(axis=0), held.max(axis=0), alpha=0.15,
                        color=style[arm]["color"])
    ax.axhline(res.data["unigram"], color="gray", lw=0.8, ls=":", label="unigram level")
    ax.set_xscale("log")
    ax.set_title(f"held-out loss vs peak lr ({len(res.data['seeds'])} seeds: median, min..max)")
    ax.set_xlabel("peak lr")
    ax.set_ylabel("nats / character")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    first = res.data["seeds"][0]
    for arm, grid in grids.items():
        lr = grid[tuned[arm]["best"][0]]
        _charlm.loss_curve(ax, res.data["runs"][arm, lr, first]["losses"],
                           label=f"{names[arm]}, lr {lr:g}", **style[arm])
    _charlm.finish_loss_panel(ax, f"training loss at each one's best lr, seed {first}",
                              res.data["unigram"])
    ax = axes[2]
    layers = np.arange(1, res.data["layers"] + 1)
    for block, name in BLOCKS:
        ax.semilogy(layers, np.median(res.data["grads"][block], axis=0), "o-", label=name)
    ax.set_title("||d linear2.weight|| at initialisation (median over seeds)")
    ax.set_xlabel("layer")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
