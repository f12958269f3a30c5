"""warmup: Post-LN and Pre-LN Transformers trained with Adam, with and without learning-rate
warm-up (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture").

Their result: a Post-LN Transformer needs the warm-up stage (without it, training ends far
worse), a Pre-LN Transformer does not; and at initialisation the gradient of Post-LN's
parameters near the output is large (their Figure 3: it grows with the layer index), while
Pre-LN's is the same in every layer.

The task: a character-level language model on the help texts of Python's documentation
topics (pydoc_data, bundled with Python; _charlm.py has the data, the model and the
training loop).  Each configuration (block type x learning rate x warm-up) starts from the
same seed and sees the same batches.  Measured: the training loss curve, the held-out loss
at the end, whether a run diverged (a non-finite loss) or stalled (its held-out loss not
STALLED nats below the unigram level: it learnt the character frequencies and next to
nothing else), and the gradient norm of each layer's linear2.weight (the paper's W^2) at
initialisation, averaged over a few batches.
"""
import numpy as np

from . import _charlm
from ._charlm import MATTERS, MISSING_TEXT, STALLED
from ._common import DemoResult, markdown_table, num

BLOCKS = (("post", "Post-LN"), ("pre", "Pre-LN"))
GROWS = 1.05      # a gradient norm growing by more than 5% per layer "grows with depth"
SIZES = {
    "full": {"layers": 6, "lrs": (1e-3, 1e-2), "steps": 250, "warmup": 60, "batch": 8,
             "seq": 32, "d": 32, "heads": 4, "eval_batches": 8, "grad_batches": 4},
    "tiny": {"layers": 6, "lrs": (1e-2,), "steps": 150, "warmup": 40, "batch": 8,
             "seq": 32, "d": 32, "heads": 4, "eval_batches": 4, "grad_batches": 2},
}


def _model(cfg, vocab, block, seed):
    return _charlm.CharLM(vocab, cfg["seq"], block, cfg["layers"], cfg["d"], cfg["heads"],
                          seed)


def _run(cfg, data, vocab, block, lr, warmup, seed):
    train, held_out = data
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


def _verdict(flag):
    return "yes" if flag else "no"


def run(size="full", seed=0):
    cfg = SIZES[size]
    res = DemoResult("warmup", "Post-LN vs Pre-LN, with and without learning-rate warm-up "
                     "(Xiong et al. 2020)", size, seed)
    try:
        train, held_out, vocab = _charlm.corpus()
    except ImportError:
        res.missing = MISSING_TEXT
        return res
    data = (train, held_out)
    unigram = _charlm.unigram_loss(train, held_out, vocab)
    runs, grads = {}, {}
    with _charlm.one_thread():
        for block, _ in BLOCKS:
            grads[block] = _gradient_norms(cfg, data, vocab, block, seed)
            for lr in cfg["lrs"]:
                for warmup in (0, cfg["warmup"]):
                    runs[block, lr, warmup] = _run(cfg, data, vocab, block, lr, warmup, seed)
    tail = max(1, cfg["steps"] // 10)
    rows = []
    for (block, lr, warmup), r in runs.items():
        stalled = _charlm.stalled(r["held_out"], unigram)
        rows.append([dict(BLOCKS)[block], f"{lr:g}", f"{warmup} steps" if warmup else "none",
                     num(r["losses"][0]), num(np.nanmean(r["losses"][-tail:])),
                     num(r["held_out"]), _verdict(r["diverged"]), _verdict(stalled)])
    res.tables.append((
        f"Character-level language model on Python's documentation topics ({len(train)} "
        f"training / {len(held_out)} held-out characters, {vocab} symbols): "
        f"{cfg['layers']} layers, d_model {cfg['d']}, {cfg['heads']} heads, "
        f"batch {cfg['batch']} x {cfg['seq']} characters, {cfg['steps']} Adam steps "
        f"(betas 0.9, 0.98), warm-up linear over the first {cfg['warmup']} steps.  Losses "
        f"in nats per character; the unigram level (character frequencies only) is "
        f"{num(unigram)}.",
        markdown_table(["block", "peak lr", "warm-up", "loss, step 1",
                        f"training loss, last {tail} steps", "held-out loss, end",
                        "diverged", f"stalled (held-out not {STALLED} below unigram)"],
                       rows)))
    layers = cfg["layers"]
    res.tables.append((
        f"Gradient norm of each layer's linear2.weight at initialisation (the paper's W^2), "
        f"mean over {cfg['grad_batches']} batches.",
        markdown_table(["block"] + [f"layer {i + 1}" for i in range(layers)]
                       + ["last / first"],
                       [[name] + [num(v) for v in grads[b]] + [num(grads[b][-1] / grads[b][0])]
                        for b, name in BLOCKS])))
    _findings(res, runs, grads, unigram, cfg)
    res.data.update(runs=runs, grads=grads, unigram=unigram, lrs=cfg["lrs"],
                    warmup=cfg["warmup"], steps=cfg["steps"], layers=layers)
    return res


def _findings(res, runs, grads, unigram, cfg):
    w = cfg["warmup"]
    for lr in cfg["lrs"]:
        post = runs["post", lr, 0]["held_out"], runs["post", lr, w]["held_out"]
        pre = runs["pre", lr, 0]["held_out"], runs["pre", lr, w]["held_out"]
        post_needs = post[0] - post[1] > MATTERS
        pre_needs = pre[0] - pre[1] > MATTERS
        res.findings.append(
            f"peak lr {lr:g}: held-out loss without / with warm-up: Post-LN {num(post[0])} / "
            f"{num(post[1])}, Pre-LN {num(pre[0])} / {num(pre[1])} (unigram level "
            f"{num(unigram)}).  Warm-up helps Post-LN by more than {MATTERS}: "
            f"{_verdict(post_needs)}; helps Pre-LN by more than {MATTERS}: "
            f"{_verdict(pre_needs)}.  The paper's claim (Post-LN needs warm-up, Pre-LN does "
            f"not) {'holds' if post_needs and not pre_needs else 'does not hold'} here.")
    diverged = [f"{dict(BLOCKS)[b]} lr {lr:g} warm-up {wu}" for (b, lr, wu), r in runs.items()
                if r["diverged"]]
    stalled = [f"{dict(BLOCKS)[b]} lr {lr:g} {'with' if wu else 'without'} warm-up"
               for (b, lr, wu), r in runs.items()
               if _charlm.stalled(r["held_out"], unigram)]
    res.findings.append(
        ("diverged (a non-finite loss): " + ", ".join(diverged)) if diverged else
        "no run diverged: every loss stayed finite.  Failure here means stalling, not "
        "blowing up.")
    res.findings.append(
        (f"stalled at the unigram level (held-out not {STALLED} below {num(unigram)}): "
         + ", ".join(stalled)) if stalled else "no run stalled at the unigram level.")
    factor = {b: _per_layer_factor(grads[b]) for b, _ in BLOCKS}
    grows = factor["post"] > GROWS
    res.findings.append(
        f"gradient norm of linear2.weight at initialisation, layer 1 -> {cfg['layers']}: "
        f"Post-LN {num(grads['post'][0])} -> {num(grads['post'][-1])} (fitted factor per "
        f"layer {factor['post']:.3f}), Pre-LN {num(grads['pre'][0])} -> "
        f"{num(grads['pre'][-1])} ({factor['pre']:.3f}); Post-LN / Pre-LN in the last layer "
        f"{num(grads['post'][-1] / grads['pre'][-1])}.  The paper has Post-LN's growing with "
        f"the layer index; by more than {GROWS - 1:.0%} per layer here: {_verdict(grows)}.")


def _per_layer_factor(norms):
    """exp of the least-squares slope of log(norm) against the layer index."""
    return float(np.exp(np.polyfit(np.arange(len(norms)), np.log(norms), 1)[0]))


def plot(res, path, plt):
    if res.missing:
        return _charlm.plot_not_run(res, path, plt)
    lrs = res.data["lrs"]
    fig, axes = _charlm.figure(plt, len(lrs) + 1)
    for ax, lr in zip(axes, lrs):
        for (block, r_lr, warmup), r in res.data["runs"].items():
            if r_lr == lr:
                _charlm.loss_curve(
                    ax, r["losses"], ls="-" if warmup else "--",
                    color="C0" if block == "post" else "C1",
                    label=f"{dict(BLOCKS)[block]}, {'warm-up' if warmup else 'no warm-up'}")
        _charlm.finish_loss_panel(
            ax, f"training loss, peak lr {lr:g} (warm-up {res.data['warmup']} steps)",
            res.data["unigram"])
    ax = axes[-1]
    layers = np.arange(1, res.data["layers"] + 1)
    for block, name in BLOCKS:
        ax.semilogy(layers, res.data["grads"][block], "o-", label=name)
    ax.set_title("||d linear2.weight|| at initialisation")
    ax.set_xlabel("layer")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
