"""depth: the size of the activations through a stack of 30 layers.

Four stacks on the same small input (rows = tokens), forward only:

* no residual, no norm: x_{l+1} = x_l @ W_l with gain 1.5 (||x W|| ~ 1.5 ||x||): explodes;
* Post-Norm: x_{l+1} = RMSNorm(x_l + x_l @ W_l): renormalised after every layer;
* Pre-Norm, an independent W_l per layer: x_{l+1} = x_l + RMSNorm(x_l) @ W_l;
* Pre-Norm, one W shared by every layer (the setup of the classic version of this demo).

The Pre-Norm residual stream stays finite but is not constant: each layer adds a branch
output of fixed size.  With independent random branches the additions are uncorrelated,
so the squared norm grows linearly (the norm like sqrt(depth)); with one shared W they line
up and the norm grows linearly.  The demo fits the growth exponent and reports it.
"""
import numpy as np

from ._common import DemoResult, loglog_slope, markdown_table, num
from . import _stacks

SIZES = {"full": {"tokens": 8, "d": 64, "depth": 30},
         "tiny": {"tokens": 4, "d": 16, "depth": 30}}
PLAIN_GAIN = 1.5
BRANCH_GAIN = 1.0
REPORT_EVERY = 10


def _stack_norms(kind, x, weights):
    _, tape = _stacks.forward(kind, x, weights, final_norm=False)
    return np.array([np.linalg.norm(s) for s in tape["streams"]])


def _growth_words(k):
    if 0.35 <= k <= 0.65:
        return "roughly like sqrt(depth): its square grows linearly"
    if 0.8 <= k <= 1.2:
        return "roughly linearly with depth"
    return f"like depth^{k:.2f}"


def run(size="full", seed=0):
    cfg = SIZES[size]
    n, d, depth = cfg["tokens"], cfg["d"], cfg["depth"]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    shared = _stacks.random_weights(rng, 1, d, BRANCH_GAIN) * depth
    stacks = {
        f"no residual, no norm (gain {PLAIN_GAIN})":
            _stack_norms("plain", x, _stacks.random_weights(rng, depth, d, PLAIN_GAIN)),
        "Post-Norm (RMSNorm after the add)":
            _stack_norms("post-norm", x, _stacks.random_weights(rng, depth, d, BRANCH_GAIN)),
        "Pre-Norm, independent W_l":
            _stack_norms("pre-norm", x, _stacks.random_weights(rng, depth, d, BRANCH_GAIN)),
        "Pre-Norm, one W shared by all layers": _stack_norms("pre-norm", x, shared),
    }
    layers = list(range(0, depth + 1, REPORT_EVERY))
    fit_from = depth // 3
    fit_layers = np.arange(fit_from, depth + 1)
    exponents = {name: loglog_slope(fit_layers, v[fit_from:]) for name, v in stacks.items()}
    factors = {name: (v[-1] / v[0]) ** (1.0 / depth) for name, v in stacks.items()}
    rows = [[name] + [num(v[l]) for l in layers]
            + [f"{factors[name]:.3f}", f"{round(exponents[name], 2) + 0.0:.2f}"]
            for name, v in stacks.items()]
    headers = (["stack"] + [f"layer {l}" for l in layers]
               + ["factor per layer (geometric mean)",
                  f"k: norm ~ l^k fitted on l={fit_from}..{depth}"])

    res = DemoResult("depth", f"Activation norm through {depth} layers", size, seed)
    res.tables.append((f"Frobenius norm of the activations ({n} tokens x {d} features) "
                       f"entering each layer, and two summaries of its growth: exponential growth "
                       f"shows as a factor per layer above 1, power-law growth as k.",
                       markdown_table(headers, rows)))
    names = list(stacks)
    plain, post, pre, pre_shared = (stacks[k] for k in names)
    res.findings += [
        f"no residual: the norm grew {num(plain[-1] / plain[0])}x in {depth} layers "
        f"(gain^{depth} = {num(PLAIN_GAIN ** depth)}); at layer {depth} it is "
        f"{num(plain[-1] / pre[-1])}x the Pre-Norm stream's.",
        f"Post-Norm: from layer 1 on the norm stays between {num(post[1:].min(), 7)} and "
        f"{num(post[1:].max(), 7)} (sqrt(tokens * D) = {num(np.sqrt(n * d), 7)}): every layer ends "
        f"with the norm.",
        f"Pre-Norm (independent W_l): {num(pre[0])} -> {num(pre[-1])} "
        f"({num(pre[-1] / pre[0])}x, all finite: {bool(np.all(np.isfinite(pre)))}); it grows "
        f"{_growth_words(exponents[names[2]])} (fitted k = {exponents[names[2]]:.2f}).",
        f"Pre-Norm (shared W): {num(pre_shared[0])} -> {num(pre_shared[-1])}; it grows "
        f"{_growth_words(exponents[names[3]])} (fitted k = {exponents[names[3]]:.2f}).",
    ]
    res.data = {"layers": np.arange(depth + 1), "norms": stacks, "exponents": exponents,
                "depth": depth}
    return res


def plot(res, path, plt):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, norms_ in res.data["norms"].items():
        ax.semilogy(res.data["layers"], norms_, label=name)
    ax.set_xlabel("layer")
    ax.set_ylabel("||x_l|| (Frobenius)")
    ax.set_title(res.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
