"""A character-level language model on text bundled with Python, for the training demos
(warmup, deepnorm): the data, the model around a resnorm.nn.TransformerStack, the loss and
a training loop with learning-rate warm-up, and the learning-rate sweep both demos tune
every configuration with.

Data: the help texts of Python's own documentation topics (the standard library module
pydoc_data.topics, what ``help("if")`` prints), about 465,000 characters; nothing is
downloaded.  Each distinct character is a token.  Every tenth topic (in sorted order) is
held out, the rest trains.

Model: token embedding (N(0, 1)) + fixed sinusoidal positions -> the stack -> a Linear
head over the vocabulary; loss: mean cross-entropy in nats per character.  Training: Adam,
betas (0.9, 0.98) as in the Transformer papers, learning rate ramped linearly from lr/W
to lr over the first W steps (W = 0: constant lr), a fresh random batch every step.

Tuning: one shared learning rate favours whichever configuration it happens to suit, so
each configuration (an "arm") is trained on its own grid of learning rates and over
several seeds; per seed its result is the held-out loss at its best learning rate of that
seed.  A claim is then checked seed by seed on those results and reported as "holds in k
of n seeds".
"""
import contextlib

import numpy as np

from .. import nn
from ._common import markdown_table, spread_text

HELD_OUT_EVERY = 10  # every tenth topic is held out
STALLED = 0.15       # held-out loss not this far below the unigram level: the run stalled
MISSING_TEXT = ("the text these demos train on, Python's pydoc_data.topics, is missing "
                "from this Python installation (some distributions ship it separately).")


def corpus():
    """(train tokens, held-out tokens, vocabulary size).  ImportError without pydoc_data
    (some distributions ship Python without it)."""
    from pydoc_data import topics
    names = sorted(topics.topics)
    parts = ["".join(topics.topics[k] for i, k in enumerate(names)
                     if (i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1) == held_out)
             for held_out in (False, True)]
    vocab = sorted(set(parts[0] + parts[1]))
    index = {c: i for i, c in enumerate(vocab)}
    train, held_out = (np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
                       for text in parts)
    return train, held_out, len(vocab)


def unigram_loss(train, held_out, vocab):
    """Held-out cross-entropy of predicting every character by its training frequency (no
    context at all): the level a model sits at when it has learnt only the frequencies."""
    freq = np.bincount(train, minlength=vocab) + 1.0        # add-one: no log(0)
    logp = np.log(freq / freq.sum())
    return float(-logp[held_out].mean())


def stalled(held_out_loss, unigram):
    """True when a (finite) held-out loss is not STALLED below the unigram level: the model
    learnt the character frequencies and next to nothing else."""
    return bool(np.isfinite(held_out_loss) and held_out_loss > unigram - STALLED)


def batch(rng, tokens, size, seq):
    """size random windows: (inputs, next-character targets), each (size, seq)."""
    start = rng.integers(0, len(tokens) - seq - 1, size)
    rows = start[:, None] + np.arange(seq)
    return tokens[rows], tokens[rows + 1]


def sinusoids(seq, d):
    """The fixed positional encoding of Vaswani et al.: sin / cos of pos / 10000^(2i/d)."""
    angle = np.arange(seq)[:, None] / 10000.0 ** (np.arange(0, d, 2)[None] / d)
    pe = np.zeros((seq, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe


class CharLM(nn.Module):
    """embedding + positions -> TransformerStack(block, ...) -> Linear head (logits)."""

    def __init__(self, vocab, seq, block, n_layers, d, heads, seed, dtype=np.float32,
                 **options):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.embedding, self.dembedding = self.add_param(
            "embedding.weight", rng.standard_normal((vocab, d)).astype(dtype))
        self.positions = sinusoids(seq, d).astype(dtype)
        self.stack = self.add_module("stack", nn.TransformerStack(
            n_layers, d, heads, 4 * d, block=block, dtype=dtype, seed=rng, **options))
        self.head = self.add_module("head", nn.Linear(d, vocab, dtype=dtype, seed=rng))
        self._tokens = None

    def features(self, tokens):
        """The stack's output (what the head reads)."""
        self._tokens = tokens
        return self.stack.forward(self.embedding[tokens] + self.positions[:tokens.shape[1]])

    def forward(self, tokens):
        return self.head.forward(self.features(tokens))

    def backward(self, dlogits):
        dx = self.stack.backward(self.head.backward(dlogits))
        np.add.at(self.dembedding, self._tokens, dx)


def cross_entropy(logits, targets):
    """(mean -log softmax(logits)[target], its gradient with respect to logits)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)
    grad = np.exp(logp)
    np.put_along_axis(grad, targets[..., None], np.exp(picked) - 1.0, axis=-1)
    return float(-picked.mean()), (grad / targets.size).astype(logits.dtype)


def warmup_lr(step, lr, warmup):
    """The learning rate of step (0-based): lr * min(1, (step + 1) / warmup)."""
    return lr if warmup <= 0 else lr * min(1.0, (step + 1) / warmup)


def train(model, data, steps, lr, warmup, batch_size, seq, seed, probe=None, every=10):
    """Adam for `steps` steps.  Returns the training loss of every step; a run whose loss
    becomes non-finite stops there (the rest NaN).  probe(model), if given, is called
    before step 0 and every `every` steps (before that step's update)."""
    opt = nn.Adam(model, lr=lr, betas=(0.9, 0.98))
    rng = np.random.default_rng(seed)
    losses = np.full(steps, np.nan)
    with np.errstate(over="ignore", invalid="ignore"):
        for step in range(steps):
            if probe is not None and step % every == 0:
                probe(model)
            opt.lr = warmup_lr(step, lr, warmup)
            x, y = batch(rng, data, batch_size, seq)
            opt.zero_grad()
            loss, dlogits = cross_entropy(model.forward(x), y)
            if not np.isfinite(loss):
                break
            losses[step] = loss
            model.backward(dlogits)
            opt.step()
    return losses


def evaluate(model, data, batches, batch_size, seq, seed):
    """Mean cross-entropy over fixed held-out batches (eval mode, no update)."""
    model.eval()
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore", invalid="ignore"):
        losses = [cross_entropy(model.forward(x), y)[0]
                  for x, y in (batch(rng, data, batch_size, seq) for _ in range(batches))]
    model.train()
    return float(np.mean(losses))


def one_thread():
    """A context holding OpenMP and BLAS at one thread when threadpoolctl is installed.
    These models are small (256 tokens of width 32 per step): on two shared cores, threads
    of a few microseconds' work each mostly wait for one another.  Results do not depend
    on it (resnorm.nn is bitwise the same for any thread count)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1)


def run_seeds(base, n):
    """The n seeds of a sweep.  Each run uses seed, seed + 1 and seed + 2 (model, batches,
    held-out batches), so seeds 10 apart never share a stream; the first is `base`."""
    return [base + 10 * k for k in range(n)]


def failed(run, unigram):
    """True when a run diverged or stalled at the unigram level."""
    return bool(run["diverged"] or stalled(run["held_out"], unigram))


def sweep(grids, seeds, run_one):
    """run_one(arm, lr, seed) for every arm, every lr of grids[arm] and every seed:
    {(arm, lr, seed): result}."""
    return {(arm, lr, s): run_one(arm, lr, s)
            for arm, grid in grids.items() for lr in grid for s in seeds}


def tune(runs, arm, grid, seeds, unigram):
    """One arm of a sweep, tuned per seed.

    Returns a dict of arrays over (seeds, grid): held (held-out loss, inf when diverged),
    stable (neither diverged nor stalled); and over seeds: best (the index of the lr with
    the lowest held-out loss), best_loss, n_stable (how many grid lrs trained), edge (the
    best lr is the largest one that trained and a larger grid lr failed: the run sits on
    the stability edge), top (the best lr is the largest of the grid, which then does not
    show where this arm stops training).
    """
    held = np.array([[runs[arm, lr, s]["held_out"] for lr in grid] for s in seeds])
    stable = np.array([[not failed(runs[arm, lr, s], unigram) for lr in grid] for s in seeds])
    best = np.argmin(held, axis=1)
    last_stable = np.array([np.flatnonzero(row).max() if row.any() else -1 for row in stable])
    top = best == len(grid) - 1
    edge = (best == last_stable) & ~top    # every grid lr above the best one failed
    return {"held": held, "stable": stable, "best": best,
            "best_loss": held[np.arange(len(seeds)), best], "n_stable": stable.sum(axis=1),
            "edge": edge, "top": top}


def lr_table(names, grids, tuned):
    """Every arm at every lr of its grid: held-out loss over the seeds, how many seeds
    trained (neither diverged nor stalled) and how many picked that lr as their best."""
    rows = []
    for arm, grid in grids.items():
        t, n = tuned[arm], len(tuned[arm]["best"])
        for i, lr in enumerate(grid):
            rows.append([names[arm], f"{lr:g}", spread_text(t["held"][:, i]),
                         f"{int(t['stable'][:, i].sum())} of {n}",
                         f"{int(np.sum(t['best'] == i))} of {n}"])
    return markdown_table(["configuration", "peak lr", "held-out loss, median (min..max)",
                           "trained (not diverged or stalled)", "best lr of the seed"], rows)


def best_table(names, grids, tuned, extra=None):
    """Every arm at its best lr per seed: the held-out loss, the lrs picked, the number of
    grid lrs that trained, and how often the best lr sits on the stability edge or at the
    top of the grid.  extra: {header: {arm: cell}}, more columns."""
    extra = extra or {}
    rows = []
    for arm, grid in grids.items():
        t, n = tuned[arm], len(tuned[arm]["best"])
        picked = ", ".join(f"{grid[i]:g} x{int(np.sum(t['best'] == i))}"
                           for i in range(len(grid)) if np.any(t["best"] == i))
        rows.append([names[arm]] + [cells[arm] for cells in extra.values()]
                    + [spread_text(t["best_loss"]), picked,
                       spread_text(t["n_stable"], 0) + f" of {len(grid)}",
                       f"{int(t['edge'].sum())} of {n}", f"{int(t['top'].sum())} of {n}"])
    return markdown_table(["configuration"] + list(extra)
                          + ["held-out loss at the best lr, median (min..max)",
                             "best lr (x seeds)", "lrs that trained, median (min..max)",
                             "best lr on the stability edge", "best lr at the top of the grid"],
                          rows)


def edge_findings(names, grids, tuned):
    """Sentences naming the arms whose best lr sits on the stability edge or at the top of
    the grid in some seed: there the tuned result depends on where the grid's points fall."""
    lines = []
    for arm, grid in grids.items():
        t, n = tuned[arm], len(tuned[arm]["best"])
        if t["edge"].any():
            lines.append(f"{names[arm]}: in {int(t['edge'].sum())} of {n} seeds the best lr is "
                         f"the largest grid lr that trained and the next one failed: these "
                         f"runs sit on the stability edge, and a grid point between the two "
                         f"could change their result.")
        if t["top"].any():
            lines.append(f"{names[arm]}: in {int(t['top'].sum())} of {n} seeds the best lr is "
                         f"the largest of the grid ({grid[-1]:g}): the grid does not show where "
                         f"this configuration stops training.")
    return lines


SMOOTH = 10   # steps per point of a plotted loss curve (moving average)


def figure(plt, panels):
    """A row of panels for a demo's figure: (fig, axes)."""
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.8), squeeze=False)
    return fig, axes[0]


def loss_curve(ax, losses, **style):
    """Plots a training loss curve as a SMOOTH-step moving average."""
    smooth = np.convolve(losses, np.ones(SMOOTH) / SMOOTH, mode="valid")
    ax.plot(np.arange(len(smooth)) + SMOOTH, smooth, **style)


def finish_loss_panel(ax, title, unigram):
    """The unigram level as a reference line, labels, grid, legend."""
    ax.axhline(unigram, color="gray", lw=0.8, ls=":", label="unigram level")
    ax.set_title(title)
    ax.set_xlabel("Adam step")
    ax.set_ylabel(f"nats / character ({SMOOTH}-step mean)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def plot_not_run(res, path, plt):
    """The figure of a demo that could not run: the reason, in words."""
    fig, ax = plt.subplots(figsize=(6, 1.5))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{res.name}: not run\n{res.missing}", ha="center", va="center",
            wrap=True, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
