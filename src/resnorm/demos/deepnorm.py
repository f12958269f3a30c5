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
documentation topics, Adam with warm-up).  Every configuration starts from the same seed
and sees the same batches.  Measured: the loss curve, the held-out loss at the end,
divergence (a non-finite loss) and stalling (held-out loss not STALLED nats below the
unigram level), and the model update ||y_t - y_0|| / ||y_0|| of the stack's output y on a
fixed batch, every few steps.
"""
import numpy as np

from .. import nn
from . import _charlm
from ._charlm import MATTERS, MISSING_TEXT, STALLED
from ._common import DemoResult, markdown_table, num

BLOCKS = (("post", "Post-LN"), ("deepnorm", "DeepNorm"), ("pre", "Pre-LN"),
          ("parallel", "parallel (one norm)"), ("sandwich", "sandwich"))
SIZES = {
    # depth -> the block types trained at that depth
    "full": {"depths": {6: ("post", "deepnorm"),
                        12: ("post", "deepnorm", "pre", "parallel", "sandwich")},
             "lr": 5e-3, "steps": 160, "warmup": 40, "batch": 8, "seq": 32, "d": 32,
             "heads": 4, "eval_batches": 8, "every": 5},
    "tiny": {"depths": {12: ("post", "deepnorm")}, "lr": 5e-3, "steps": 120, "warmup": 30,
             "batch": 8, "seq": 32, "d": 32, "heads": 4, "eval_batches": 4, "every": 5},
}
NAMES = dict(BLOCKS)


def _run(cfg, data, vocab, block, depth, seed):
    train, held_out = data
    model = _charlm.CharLM(vocab, cfg["seq"], block, depth, cfg["d"], cfg["heads"], seed)
    probe_x, _ = _charlm.batch(np.random.default_rng(seed + 4), held_out, cfg["batch"],
                               cfg["seq"])
    outputs = []
    losses = _charlm.train(model, train, cfg["steps"], cfg["lr"], cfg["warmup"],
                           cfg["batch"], cfg["seq"], seed + 1,
                           probe=lambda m: outputs.append(m.features(probe_x).copy()),
                           every=cfg["every"])
    diverged = bool(np.isnan(losses[-1]))
    final = np.inf if diverged else _charlm.evaluate(model, held_out, cfg["eval_batches"],
                                                      cfg["batch"], cfg["seq"], seed + 2)
    y0 = outputs[0]
    update = np.array([np.linalg.norm(y - y0) / np.linalg.norm(y0) for y in outputs])
    return {"losses": losses, "held_out": final, "diverged": diverged, "update": update}


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
    runs = {}
    with _charlm.one_thread():
        for depth, blocks in cfg["depths"].items():
            for block in blocks:
                runs[block, depth] = _run(cfg, (train, held_out), vocab, block, depth, seed)
    tail = max(1, cfg["steps"] // 10)
    rows = []
    for (block, depth), r in runs.items():
        stalled = _charlm.stalled(r["held_out"], unigram)
        alpha = ("{:.3f} / {:.3f}".format(*nn.deepnorm_constants(depth))
                 if block == "deepnorm" else "-")
        rows.append([NAMES[block], str(depth), alpha, num(r["losses"][0]),
                     num(np.nanmean(r["losses"][-tail:])), num(r["held_out"]),
                     "yes" if r["diverged"] else "no", "yes" if stalled else "no",
                     num(r["update"][1]), num(r["update"][2])])
    res.tables.append((
        f"Character-level language model on Python's documentation topics ({vocab} "
        f"symbols), d_model {cfg['d']}, {cfg['heads']} heads, batch {cfg['batch']} x "
        f"{cfg['seq']}; {cfg['steps']} Adam steps at peak lr {cfg['lr']:g}, warm-up over "
        f"{cfg['warmup']} steps, for every model.  Model update = ||y_t - y_0|| / ||y_0|| "
        f"of the stack output on a fixed held-out batch, measured every {cfg['every']} "
        f"steps (before that step's update).  Unigram level: {num(unigram)} nats per character.",
        markdown_table(["block", "layers", "alpha / beta", "loss, step 1",
                        f"training loss, last {tail} steps", "held-out loss, end",
                        "diverged", f"stalled (held-out not {STALLED} below unigram)",
                        f"model update, step {cfg['every']}",
                        f"model update, step {2 * cfg['every']}"],
                       rows)))
    _findings(res, runs, unigram, cfg)
    res.data.update(runs=runs, unigram=unigram, depths=cfg["depths"], every=cfg["every"],
                    warmup=cfg["warmup"], steps=cfg["steps"])
    return res


def _findings(res, runs, unigram, cfg):
    deepest = max(cfg["depths"])
    for depth, blocks in cfg["depths"].items():
        held = ", ".join(f"{NAMES[b]} {num(runs[b, depth]['held_out'])}" for b in blocks)
        res.findings.append(f"{depth} layers: held-out loss {held} (unigram level "
                            f"{num(unigram)}).")
    post, deep = runs["post", deepest], runs["deepnorm", deepest]
    post_failed = post["diverged"] or _charlm.stalled(post["held_out"], unigram)
    deep_trained = not deep["diverged"] and deep["held_out"] < post["held_out"] - MATTERS
    how = ("diverged" if post["diverged"] else
           "stalled at the unigram level" if post_failed else "trained")
    stall = post_failed and not post["diverged"]
    res.findings.append(
        f"at {deepest} layers plain Post-LN {how}; DeepNorm ends {num(deep['held_out'])}, "
        f"{'more than' if deep_trained else 'not more than'} {MATTERS} below it.  The "
        f"paper's claim (plain Post-LN fails at depth, DeepNorm trains) "
        f"{'holds' if post_failed and deep_trained else 'does not hold'} here"
        + ("; the failure is a stall, not the divergence the paper reports." if stall else "."))
    shallow = min(cfg["depths"])
    if shallow != deepest:
        ok = not (runs["post", shallow]["diverged"]
                    or _charlm.stalled(runs["post", shallow]["held_out"], unigram))
        res.findings.append(
            f"at {shallow} layers plain Post-LN {'trains' if ok else 'fails too'} "
            f"(held-out {num(runs['post', shallow]['held_out'])}) with the same settings.")
    family = [b for b in ("pre", "parallel", "sandwich") if b in cfg["depths"][deepest]]
    if len(family) > 1:
        held = [runs[b, deepest]["held_out"] for b in family]
        res.findings.append(
            f"at {deepest} layers the blocks with an unnormalised residual stream end at "
            f"{', '.join(f'{NAMES[b]} {num(v)}' for b, v in zip(family, held))}: "
            f"{'within' if max(held) - min(held) < MATTERS else 'not within'} {MATTERS} of "
            f"each other, and DeepNorm {num(deep['held_out'])} is "
            f"{'within' if abs(deep['held_out'] - min(held)) < MATTERS else 'not within'} "
            f"{MATTERS} of the best of them.")
    smaller = deep["update"][1] < post["update"][1]
    blocks = cfg["depths"][deepest]
    late = [runs[b, deepest]["update"][cfg["warmup"] // cfg["every"]] for b in blocks]
    res.findings.append(
        f"model update in the first {cfg['every']} steps at {deepest} layers: Post-LN "
        f"{num(post['update'][1])}, DeepNorm {num(deep['update'][1])}; the paper has "
        f"DeepNorm's the smaller: {'as measured' if smaller else 'not as measured'}.  At step "
        f"{cfg['warmup']} (the end of warm-up) the updates are "
        f"{', '.join(num(v) for v in late)} for {', '.join(NAMES[b] for b in blocks)} "
        f"({'all' if min(late) > 1 else 'not all'} above 1; an output turned to an unrelated "
        f"direction of the same size would be at sqrt(2) = 1.41).")


def plot(res, path, plt):
    if res.missing:
        return _charlm.plot_not_run(res, path, plt)
    depths = res.data["depths"]
    fig, axes = _charlm.figure(plt, len(depths) + 1)
    colours = {"post": "C0", "deepnorm": "C2", "pre": "C1", "parallel": "C4", "sandwich": "C5"}
    for ax, (depth, blocks) in zip(axes, depths.items()):
        for block in blocks:
            _charlm.loss_curve(ax, res.data["runs"][block, depth]["losses"],
                               color=colours[block], label=NAMES[block])
        _charlm.finish_loss_panel(ax, f"training loss, {depth} layers", res.data["unigram"])
    ax = axes[-1]
    deepest = max(depths)
    for block in depths[deepest]:
        update = res.data["runs"][block, deepest]["update"]
        ax.plot(np.arange(len(update)) * res.data["every"], update, "o-", ms=3,
                color=colours[block], label=NAMES[block])
    ax.set_title(f"model update ||y_t - y_0|| / ||y_0||, {deepest} layers")
    ax.set_xlim(0, 2 * res.data["warmup"])
    ax.set_xlabel("Adam step")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
