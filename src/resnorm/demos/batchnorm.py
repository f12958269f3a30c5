"""batchnorm: why batch statistics break on padded variable-length sequences and batch
size 1, while LayerNorm and RMSNorm give each token the same result whatever else is in
the batch.

We follow one sequence A and normalise it in different batches.  BatchNorm (training
mode, statistics per feature over every position of the batch) is written here in NumPy,
in two variants: the padding counted as tokens, or masked out.  LayerNorm and RMSNorm are
the library's kernels, run over all rows of the padded batch.  Each cell is the largest
change of A's normalised tokens between the two batches; for batch size 1 with a single
token it is the size of the output.
"""
import numpy as np

import resnorm
from ._common import DemoResult, markdown_table, num

SIZES = {"full": {"d": 16, "lengths": {"A": 5, "B": 9, "C": 16, "E": 3}},
         "tiny": {"d": 4, "lengths": {"A": 3, "B": 5, "C": 8, "E": 2}}}
EPS = 1e-5
NORMS = ("BatchNorm, pads counted", "BatchNorm, pads masked", "LayerNorm", "RMSNorm")


def _sequences(rng, d, lengths):
    """Each sequence has its own per-feature offset and scale, as different sentences do."""
    return {name: rng.normal(rng.normal(0, 1, d), rng.uniform(0.5, 2, d), (n, d))
            for name, n in lengths.items()}


def _pad(seqs, length):
    """(batch, length, d) zero-padded, and the (batch, length) mask of real tokens."""
    d = seqs[0].shape[1]
    x = np.zeros((len(seqs), length, d))
    mask = np.zeros((len(seqs), length), dtype=bool)
    for b, s in enumerate(seqs):
        x[b, :len(s)] = s
        mask[b, :len(s)] = True
    return x, mask


def batch_norm(x, mask=None, eps=EPS):
    """Training-mode BatchNorm over (batch, position) per feature; mask=None counts every
    position, padding included."""
    sel = x.reshape(-1, x.shape[-1]) if mask is None else x[mask]
    mean, var = sel.mean(axis=0), sel.var(axis=0)
    return (x - mean) / np.sqrt(var + eps)


def _normalise(which, x, mask):
    rows = x.reshape(-1, x.shape[-1])
    if which == "BatchNorm, pads counted":
        return batch_norm(x)
    if which == "BatchNorm, pads masked":
        return batch_norm(x, mask)
    if which == "LayerNorm":
        return resnorm.layer_norm(rows, None, None, EPS).reshape(x.shape)
    return resnorm.rms_norm(rows, None, EPS).reshape(x.shape)


def _a_tokens(which, seqs, length):
    """Sequence A (always first in the batch) after normalising the padded batch."""
    x, mask = _pad(seqs, length)
    return _normalise(which, x, mask)[0, :len(seqs[0])]


def run(size="full", seed=0):
    cfg = SIZES[size]
    d, lengths = cfg["d"], cfg["lengths"]
    s = _sequences(np.random.default_rng(seed), d, lengths)
    a, b, c, e = s["A"], s["B"], s["C"], s["E"]
    la, lb, lc = lengths["A"], lengths["B"], lengths["C"]
    scenarios = [
        (f"A with B (padded to {lb}) vs A with C (padded to {lc})",
         ([a, b], lb), ([a, c], lc)),
        (f"A with B padded to {lb} vs the same batch padded to {2 * lc}",
         ([a, b], lb), ([a, b], 2 * lc)),
        (f"A alone (batch size 1) vs A with B, C, E (padded to {lc})",
         ([a], la), ([a, b, c, e], lc)),
    ]
    changes = {}
    for label, (seqs1, len1), (seqs2, len2) in scenarios:
        changes[label] = {}
        for which in NORMS:
            y1, y2 = _a_tokens(which, seqs1, len1), _a_tokens(which, seqs2, len2)
            changes[label][which] = (float(np.max(np.abs(y1 - y2))), bool(np.array_equal(y1, y2)))
    single = {which: float(np.linalg.norm(_a_tokens(which, [a[:1]], 1))) for which in NORMS}

    def cell(diff, identical):
        return "0 (bitwise identical)" if identical else num(diff)

    rows = [[label] + [cell(*changes[label][w]) for w in NORMS] for label, *_ in scenarios]
    rows.append([f"batch size 1, one token: norm of y (norm of x = {num(np.linalg.norm(a[0]))})"]
                + [num(single[w]) for w in NORMS])
    res = DemoResult("batchnorm", "Batch statistics vs per-token statistics", size, seed)
    res.tables.append((
        f"Largest absolute change of sequence A's {la} normalised tokens (D = {d}) "
        f"between two batches; "
        f"last row: the output size for a single token in a batch of one.",
        markdown_table(["scenario"] + list(NORMS), rows)))
    per_token_same = all(changes[l][w][1] for l in changes for w in ("LayerNorm", "RMSNorm"))
    bn_changes = [changes[l]["BatchNorm, pads masked"][0] for l in changes]
    res.findings += [
        f"LayerNorm and RMSNorm give A's tokens bitwise identical outputs in every batch: "
        f"{per_token_same}.",
        f"BatchNorm with the padding counted changes A's outputs by up to "
        f"{num(max(changes[l]['BatchNorm, pads counted'][0] for l in changes))}, even when "
        f"only the amount of padding changes "
        f"({num(changes[scenarios[1][0]]['BatchNorm, pads counted'][0])}).",
        f"Masking the padding removes that one effect "
        f"({cell(*changes[scenarios[1][0]]['BatchNorm, pads masked'])}), but A's outputs "
        f"still depend on the other sequences (up to {num(max(bn_changes))}).",
        f"One token in a batch of one: BatchNorm outputs a vector of size "
        f"{num(single['BatchNorm, pads counted'])} (the token is its own mean; the variance "
        f"is 0); LayerNorm {num(single['LayerNorm'])}, RMSNorm {num(single['RMSNorm'])}.",
    ]
    res.data = {"changes": changes, "single_token": single, "scenarios": [l for l, *_ in scenarios]}
    return res


def plot(res, path, plt):
    labels = res.data["scenarios"] + ["batch size 1, one token: norm of y"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(NORMS)
    top = 0.0
    for k, which in enumerate(NORMS):
        values = [res.data["changes"][l][which][0] for l in res.data["scenarios"]]
        values.append(res.data["single_token"][which])
        xs = np.arange(len(labels)) + (k - (len(NORMS) - 1) / 2) * width
        ax.bar(xs, values, width, label=which)
        top = max(top, max(values))
        for x, v in zip(xs, values):
            ax.text(x, v, num(v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(np.arange(len(labels)))
    ax.set_xticklabels([l.replace(" vs ", "\nvs ") for l in labels], fontsize=7)
    ax.set_ylim(0, 1.35 * top)
    ax.set_ylabel("max abs change of A's outputs (last group: norm of y)")
    ax.set_title(res.title)
    ax.legend(fontsize=8, ncol=len(NORMS), loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
