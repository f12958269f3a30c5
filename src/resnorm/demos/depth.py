"""depth: the size of the activations through a stack of 30 layers, over several seeds.

Stacks on the same small input (rows = tokens), forward only (see _stacks.py):

* no residual, no norm: x_{l+1} = x_l @ W_l with gain 1.5 (||x W|| ~ 1.5 ||x||): explodes;
* the branch-scaling sweep: Post-Norm, DeepNorm (Post-Norm with the residual scaled by
  alpha and the branch by beta), Pre-Norm with branch gain 1 and with GPT-2's 1/sqrt(2L);
* Pre-Norm with one W shared by every layer (the setup of the classic version of this demo).

Closed forms printed beside the measurements.  Pre-Norm: every layer adds a branch output
of squared norm g^2 * n * D (its input was normalised to unit RMS) in a random direction,
so ||x_l||^2 ~ ||x_0||^2 + l * g^2 * n * D and, for a unit-RMS input,
||x_L|| / ||x_0|| ~ sqrt(1 + L * g^2).  Post-Norm and DeepNorm: the norm ends every layer,
||x_l|| = sqrt(n * D).  No residual: E ||x_L||^2 = gain^(2L) ||x_0||^2.  With one shared W
the branch outputs line up and the norm grows about linearly (no closed form here).
"""
import numpy as np

from ._common import DemoResult, loglog_slope, markdown_table, num, plot_band, spread
from . import _stacks
from ._stacks import Stack

SIZES = {"full": {"tokens": 8, "d": 64, "depth": 30, "seeds": 10},
         "tiny": {"tokens": 4, "d": 16, "depth": 30, "seeds": 4}}
PLAIN_GAIN = 1.5
REPORT_EVERY = 10


def stacks(depth):
    return ([Stack(f"no residual, no norm (gain {PLAIN_GAIN})", "plain", PLAIN_GAIN)]
            + _stacks.branch_scalings(depth)
            + [Stack("Pre-Norm, one W shared by all layers", "pre-norm", 1.0, shared=True)])


def closed_form(stack, depth):
    """||x_L|| / ||x_0|| for a unit-RMS input, or None where there is none."""
    if stack.shared:
        return None
    if stack.kind == "plain":
        return stack.gain ** depth
    if stack.kind == "post-norm":
        return 1.0
    return float(np.sqrt(1.0 + depth * stack.gain ** 2))


def _growth_words(k):
    if 0.35 <= k <= 0.65:
        return "roughly like sqrt(depth): its square grows linearly"
    if 0.8 <= k <= 1.2:
        return "roughly linearly with depth"
    return f"like depth^{k:.2f}"


def run(size="full", seed=0):
    cfg = SIZES[size]
    n, d, depth, seeds = cfg["tokens"], cfg["d"], cfg["depth"], cfg["seeds"]
    specs = stacks(depth)
    norms = {s.name: np.empty((seeds, depth + 1)) for s in specs}     # ||x_l|| per seed
    for k in range(seeds):
        rng = np.random.default_rng([seed, k])
        x = rng.standard_normal((n, d))
        for s in specs:
            _, tape = _stacks.forward(s.kind, x, _stacks.weights_for(s, rng, depth, d), s.alpha,
                                      final_norm=False)
            norms[s.name][k] = [np.linalg.norm(v) for v in tape["streams"]]
    growth = {name: v[:, -1] / v[:, 0] for name, v in norms.items()}
    fit_from = depth // 3
    fit_layers = np.arange(fit_from, depth + 1)
    exponents = {name: np.array([loglog_slope(fit_layers, row[fit_from:]) for row in v])
                 for name, v in norms.items()}
    layers = list(range(0, depth + 1, REPORT_EVERY))
    rows = []
    for s in specs:
        g, c = spread(growth[s.name]), closed_form(s, depth)
        rows.append([s.name] + [num(np.median(norms[s.name][:, l])) for l in layers]
                    + [f"{num(g[0])} ({num(g[1])}..{num(g[2])})", "-" if c is None else num(c),
                       f"{round(float(np.median(exponents[s.name])), 2) + 0.0:.2f}"])
    headers = (["stack"] + [f"layer {l}" for l in layers]
               + [f"norm_{depth} / norm_0, median (min..max)", "closed form",
                  f"k: norm ~ l^k fitted on l={fit_from}..{depth}"])

    res = DemoResult("depth", f"Activation norm through {depth} layers", size, seed)
    res.tables.append((
        f"Frobenius norm of the activations ({n} tokens x {d} features) entering each layer "
        f"(median over {seeds} seeds), its growth over the stack, the closed form for a "
        f"unit-RMS input (Pre-Norm: sqrt(1 + L gain^2); no residual: gain^L), and the "
        f"power-law exponent k. {_stacks.describe(specs, depth)}.",
        markdown_table(headers, rows)))

    plain, post, deep, pre1, pre_s, shared = (s.name for s in specs)
    post_norms = np.concatenate([norms[post][:, 1:], norms[deep][:, 1:]])
    k1, ks = spread(exponents[pre1]), spread(exponents[shared])
    res.findings += [
        f"no residual: the norm grew {num(np.median(growth[plain]))}x in {depth} layers "
        f"(median over {seeds} seeds; gain^{depth} = {num(PLAIN_GAIN ** depth)}).",
        f"Post-Norm and DeepNorm: from layer 1 on the norm stays between "
        f"{num(post_norms.min(), 7)} and {num(post_norms.max(), 7)} (sqrt(tokens * D) = "
        f"{num(np.sqrt(n * d), 7)}): every layer ends with the norm.",
        f"Pre-Norm, gain 1: the stream grew {num(np.median(growth[pre1]))}x "
        f"({num(growth[pre1].min())}..{num(growth[pre1].max())}; closed form "
        f"{num(closed_form(specs[3], depth))}); it grows {_growth_words(k1[0])} (k = "
        f"{k1[0]:.2f}, {k1[1]:.2f}..{k1[2]:.2f}).",
        f"Pre-Norm, gain 1/sqrt(2L): the stream grew {num(np.median(growth[pre_s]))}x "
        f"({num(growth[pre_s].min())}..{num(growth[pre_s].max())}; closed form "
        f"{num(closed_form(specs[4], depth))}): branch scaling keeps it within "
        f"{num(100 * (np.max(growth[pre_s]) - 1), 2)}% of its input size.",
        f"Pre-Norm, one shared W: {num(np.median(growth[shared]))}x; it grows "
        f"{_growth_words(ks[0])} (k = {ks[0]:.2f}, {ks[1]:.2f}..{ks[2]:.2f}).",
    ]
    res.data = {"layers": np.arange(depth + 1), "norms": norms, "exponents": exponents,
                "growth": growth, "depth": depth, "seeds": seeds,
                "gains": {s.name: (s.kind, s.gain) for s in specs}}
    return res


def plot(res, path, plt):
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    layers = res.data["layers"]
    for name, v in res.data["norms"].items():
        rel = v / v[:, :1]
        line = plot_band(left, layers, rel, name)
        kind, gain = res.data["gains"][name]
        if kind == "plain" or "shared" in name:
            continue
        plot_band(right, layers, rel ** 2, name, log=False, color=line.get_color())
        ref = 1 + layers * gain ** 2 if kind == "pre-norm" else np.ones_like(layers)
        right.plot(layers, ref, color=line.get_color(), ls="--", lw=1)
    left.set_title("||x_l|| / ||x_0||, log scale (median, band = min..max)")
    left.set_ylabel("||x_l|| / ||x_0||")
    right.set_title("||x_l||^2 / ||x_0||^2, linear scale; dashed: closed form 1 + l gain^2")
    right.set_ylabel("||x_l||^2 / ||x_0||^2")
    for ax in (left, right):
        ax.set_xlabel("layer l")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{res.title}, {res.data['seeds']} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
