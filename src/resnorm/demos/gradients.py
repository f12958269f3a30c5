"""gradients: how much gradient reaches each of 100 layers, with the real backward passes,
over several seeds.

Stacks of linear sublayers (see _stacks.py): no residual with gain 0.9 and 1.1, and the
branch-scaling sweep of normalised stacks (Post-Norm, DeepNorm, Pre-Norm with branch gain
1 and 1/sqrt(2L); RMSNorm, the library's forward and backward kernels).  A unit-norm random
gradient is injected at the output (the loss is <g, output>) and backpropagated.

Reported per layer l (1 = first, L = last):
* ||dloss/dx|| at the input of layer l: the signal that reaches it;
* ||dloss/dW_l||: what an optimizer step would use;
and, for the warm-up question, how much the output moves after one step on every layer:
a gradient-descent step of size lr (per unit lr in the linear range, lr -> 0, and at
larger lr), and an Adam-like step that moves every weight by lr against the sign of its
gradient, which is what Adam's first, bias-corrected update m / sqrt(v) = g / |g| does.
Also the scalar picture: a product of 100 per-layer factors.

Closed forms beside the measurements.  No residual: the gradient at layer 1 is gain^(L-1)
times the one at layer L on average of squares; for one row the median carries an exact
extra factor exp((L-1) * (psi(D/2) - ln(D/2)) / 2) (the log of ||v W|| / ||v|| has mean
ln(gain) + (psi(D/2) - ln(D/2)) / 2 for Gaussian W), and n rows that start independent
drift less.  Pre-Norm: each layer adds its branch term, divided by the stream's RMS at
that layer, so ratio^2 ~ prod (1 + g^2 / (1 + l g^2)) ~ 1 + L g^2: the ratio is about
sqrt(1 + L g^2), the same factor as the stream's growth.  Scalar residual factors 1 + a_l,
a_l ~ N(0, sigma^2): log of the product has mean L * E[log(1 + a)] ~ -L sigma^2 / 2 and
variance ~ L sigma^2.
"""
import numpy as np
from scipy.special import digamma

from ._common import DemoResult, markdown_table, num, plot_band, spread
from . import _stacks
from ._stacks import Stack

SIZES = {"full": {"tokens": 8, "d": 64, "depth": 100, "seeds": 10},
         "tiny": {"tokens": 4, "d": 64, "depth": 100, "seeds": 3}}
LINEAR_LR = 1e-6     # small enough that the output change is linear in lr (checked below)
# the sign step moves each of the d^2 weights of a layer by lr, far more than a gradient
# step of the same lr moves them: a smaller lr keeps it in the linear range (checked too)
SIGN_LR = 1e-9
STEP_SIZES = (1e-4, 1e-3, 1e-2)
SCALAR_DEPTH = 100
SCALAR_DRAWS = 10000
SCALAR_BRANCH_STD = 0.1
ONE_ROW_DRAWS = 400


def stacks(depth):
    return ([Stack("no residual, gain 0.9", "plain", 0.9),
             Stack("no residual, gain 1.1", "plain", 1.1)] + _stacks.branch_scalings(depth))


def one_row_drift(depth, d):
    """exp of (L-1) * E[log(chi2_D / D)] / 2: the median factor below gain^(L-1) of one row
    through L-1 Gaussian matrices."""
    return float(np.exp((depth - 1) * (digamma(d / 2) - np.log(d / 2)) / 2))


def closed_form(stack, depth, d):
    """(text, value) of the layer-1 / layer-L gradient ratio, or None."""
    if stack.kind == "plain":
        return (f"gain^{depth - 1} = {num(stack.gain ** (depth - 1))}; one row: x "
                f"{num(one_row_drift(depth, d))}", stack.gain ** (depth - 1))
    if stack.kind == "pre-norm":
        v = float(np.sqrt(1 + depth * stack.gain ** 2))
        return f"sqrt(1 + L gain^2) = {num(v)}", v
    return None


def _report_layers(depth):
    return sorted({1, depth // 10, depth // 4, depth // 2, 3 * depth // 4, depth})


def _measure(stack, x, weights, g):
    out, tape = _stacks.forward(stack.kind, x, weights, stack.alpha)
    dstreams, dweights = _stacks.backward(g, weights, tape)
    depth = len(weights)
    reach = np.array([np.linalg.norm(dstreams[l]) for l in range(depth)])   # input of layer l+1
    dw = np.array([np.linalg.norm(dwl) for dwl in dweights])
    def moved(steps):
        new_out, _ = _stacks.forward(stack.kind, x, [w - s for w, s in zip(weights, steps)],
                                     stack.alpha)
        return np.linalg.norm(new_out - out) / np.linalg.norm(out)

    if stack.kind == "plain":
        return reach, dw, np.empty(0), np.empty(0)
    moves = [moved([lr * dwl for dwl in dweights])
             for lr in (LINEAR_LR, LINEAR_LR / 10) + STEP_SIZES]
    signs = [np.sign(dwl) for dwl in dweights]
    sign_moves = [moved([lr * s for s in signs]) for lr in (SIGN_LR, SIGN_LR / 10)]
    return reach, dw, np.array(moves), np.array(sign_moves)


def _scalar_table(rng, depth, d, plain_gain=1.1):
    branch = rng.normal(0.0, SCALAR_BRANCH_STD, size=(SCALAR_DRAWS, SCALAR_DEPTH))
    products = np.prod(1.0 + branch, axis=1)
    lo, med, hi = np.percentile(products, [5, 50, 95])
    n, s2 = SCALAR_DEPTH, SCALAR_BRANCH_STD ** 2
    centre, width = -n * s2 / 2, 1.645 * np.sqrt(n * s2)
    # one row through depth-1 Gaussian matrices of gain 1.1, a fresh matrix per draw and
    # layer: the median's drift below gain^(L-1)
    v = rng.standard_normal((ONE_ROW_DRAWS, 1, d))
    log_ratio = np.zeros(ONE_ROW_DRAWS)
    for _ in range(depth - 1):
        new = v @ (rng.standard_normal((ONE_ROW_DRAWS, d, d)) * (plain_gain / np.sqrt(d)))
        log_ratio += np.log(np.linalg.norm(new, axis=(1, 2)) / np.linalg.norm(v, axis=(1, 2)))
        v = new / np.linalg.norm(new, axis=(1, 2), keepdims=True)
    one_row = float(np.exp(np.median(log_ratio)))
    rows = [
        ["no residual: 0.9 per layer", f"0.9^{n}", num(0.9 ** n), "-"],
        ["no residual: 1.1 per layer", f"1.1^{n}", num(1.1 ** n), "-"],
        [f"residual: 1 + a_l, a_l ~ N(0, {SCALAR_BRANCH_STD}^2) independent",
         f"median of {SCALAR_DRAWS} draws (5%..95%)", f"{num(med)} ({num(lo)}..{num(hi)})",
         f"exp(-L sigma^2/2) = {num(np.exp(centre))} ({num(np.exp(centre - width))}.."
         f"{num(np.exp(centre + width))})"],
        ["residual: 1 + a_l with every a_l = +0.1", f"1.1^{n}", num(1.1 ** n), "-"],
        ["residual: 1 + a_l with every a_l = +0.005", f"1.005^{n}", num(1.005 ** n), "-"],
        [f"one row through {depth - 1} Gaussian {d}x{d} matrices of gain {plain_gain}",
         f"median of {len(log_ratio)} draws", num(one_row),
         f"{plain_gain}^{depth - 1} x {num(one_row_drift(depth, d))} = "
         f"{num(plain_gain ** (depth - 1) * one_row_drift(depth, d))}"],
    ]
    return rows, {"median": med, "p5": lo, "p95": hi, "closed_median": float(np.exp(centre)),
                  "one_row": one_row,
                  "one_row_closed": plain_gain ** (depth - 1) * one_row_drift(depth, d)}


def run(size="full", seed=0):
    cfg = SIZES[size]
    n, d, depth, seeds = cfg["tokens"], cfg["d"], cfg["depth"], cfg["seeds"]
    specs = stacks(depth)
    reach = {s.name: np.empty((seeds, depth)) for s in specs}
    dw = {s.name: np.empty((seeds, depth)) for s in specs}
    moves = {s.name: np.empty((seeds, 0 if s.kind == "plain" else 2 + len(STEP_SIZES)))
             for s in specs}
    sign_moves = {s.name: np.empty((seeds, 0 if s.kind == "plain" else 2)) for s in specs}
    for k in range(seeds):
        rng = np.random.default_rng([seed, k])
        x = rng.standard_normal((n, d))
        g = rng.standard_normal((n, d))
        g /= np.linalg.norm(g)
        for s in specs:
            reach[s.name][k], dw[s.name][k], moves[s.name][k], sign_moves[s.name][k] = _measure(
                s, x, _stacks.weights_for(s, rng, depth, d), g)
    layers = _report_layers(depth)
    ratio = {name: v[:, 0] / v[:, -1] for name, v in reach.items()}
    res = DemoResult("gradients", f"Gradient reaching each of {depth} layers", size, seed)

    rows = []
    for s in specs:
        r, c = spread(ratio[s.name]), closed_form(s, depth, d)
        rows.append([s.name] + [num(np.median(reach[s.name][:, l - 1])) for l in layers]
                    + [f"{num(r[0])} ({num(r[1])}..{num(r[2])})", "-" if c is None else c[0]])
    res.tables.append((
        f"||dloss/dx|| at the input of layer l ({n} tokens x {d} features, unit-norm "
        f"gradient injected at the output), median over {seeds} seeds, and the ratio layer 1 "
        f"/ layer {depth} with its min..max over the seeds. {_stacks.describe(specs, depth)}.",
        markdown_table(["stack"] + [f"layer {l}" for l in layers]
                       + [f"layer 1 / layer {depth}, median (min..max)", "closed form"], rows)))
    rows = [[s.name] + [num(np.median(dw[s.name][:, l - 1])) for l in layers] for s in specs]
    res.tables.append((f"||dloss/dW_l||, the weight gradient of layer l (median over {seeds} "
                       f"seeds).",
                       markdown_table(["stack"] + [f"layer {l}" for l in layers], rows)))
    normed = [s for s in specs if s.kind != "plain"]
    sensitivity = {s.name: moves[s.name][:, 0] / LINEAR_LR for s in normed}
    sign_sensitivity = {s.name: sign_moves[s.name][:, 0] / SIGN_LR for s in normed}
    linear = {s.name: moves[s.name][:, 1] / (LINEAR_LR / 10) / sensitivity[s.name]
              for s in normed}
    linear |= {f"{s.name}, sign step": sign_moves[s.name][:, 1] / (SIGN_LR / 10)
               / sign_sensitivity[s.name] for s in normed}
    band = lambda v: f"{num(np.median(v))} ({num(v.min())}..{num(v.max())})"
    rows = [[s.name, band(sensitivity[s.name])]
            + [num(np.median(moves[s.name][:, 2 + i])) for i in range(len(STEP_SIZES))]
            + [band(sign_sensitivity[s.name])] for s in normed]
    res.tables.append((
        "How far one step on every layer moves the output: ||output after - before|| / "
        "||output||.  Gradient descent W_l -= lr * dloss/dW_l: per unit lr in the linear "
        f"range (measured at lr = {LINEAR_LR:g}; median (min..max) over {seeds} seeds), and "
        "at larger lr (median).  Adam-like step W_l -= lr * sign(dloss/dW_l), every weight "
        "moved by lr as by Adam's first update: per unit lr in the linear range (measured at "
        f"lr = {SIGN_LR:g}).",
        markdown_table(["stack", "gradient step, change per unit lr, lr -> 0"]
                       + [f"gradient step, lr = {lr:g}" for lr in STEP_SIZES]
                       + ["Adam-like step, change per unit lr, lr -> 0"], rows)))
    scalar_rows, scalar = _scalar_table(np.random.default_rng([seed, seeds]), depth, d)
    res.tables.append((f"The scalar picture: a product of {SCALAR_DEPTH} per-layer derivatives.",
                       markdown_table(["per-layer factor", "product", "value", "closed form"],
                                      scalar_rows)))

    post, deep, pre1, pre_s = (s.name for s in normed)
    med = {name: spread(v) for name, v in ratio.items()}
    post_pre = spread(sensitivity[post] / sensitivity[pre1])
    post_deep = spread(sensitivity[post] / sensitivity[deep])
    sign_pre = spread(sign_sensitivity[post] / sign_sensitivity[pre1])
    sign_deep = spread(sign_sensitivity[post] / sign_sensitivity[deep])
    plain_drift = {s.gain: np.exp(np.mean(np.log(ratio[s.name] / s.gain ** (depth - 1))))
                   for s in specs if s.kind == "plain"}
    lin = np.concatenate(list(linear.values()))
    i3 = STEP_SIZES.index(1e-3)
    res.findings += [
        f"no residual: layer 1 receives {num(med['no residual, gain 0.9'][0])}x (gain 0.9) and "
        f"{num(med['no residual, gain 1.1'][0])}x (gain 1.1) the gradient of layer {depth} "
        f"(median over {seeds} seeds); the geometric mean over seeds is "
        f"{num(plain_drift[0.9])} and {num(plain_drift[1.1])} times gain^{depth - 1}: random "
        f"products drift below gain^{depth - 1} (for one row the log's mean is exactly "
        f"(L-1)(psi(D/2) - ln(D/2))/2, a factor {num(one_row_drift(depth, d))}; {n} rows "
        f"drift less).",
        f"Pre-Norm, gain 1: layer 1 receives {num(med[pre1][0])}x "
        f"({num(med[pre1][1])}..{num(med[pre1][2])}) the gradient of layer {depth}, closed "
        f"form {num(closed_form(normed[2], depth, d)[1])}; with gain 1/sqrt(2L): "
        f"{num(med[pre_s][0])}x ({num(med[pre_s][1])}..{num(med[pre_s][2])}), closed form "
        f"{num(closed_form(normed[3], depth, d)[1])}.",
        f"Post-Norm: {num(med[post][0])}x, and it varies with the seed "
        f"({num(med[post][1])}..{num(med[post][2])}); DeepNorm: {num(med[deep][0])}x "
        f"({num(med[deep][1])}..{num(med[deep][2])}).",
        f"one step on every layer, per unit lr in the linear range: Post-Norm moves the output "
        f"{num(post_pre[0])}x as far as Pre-Norm with gain 1 ({num(post_pre[1])}..{num(post_pre[2])}"
        f" over the seeds) and {num(post_deep[0])}x as far as DeepNorm ({num(post_deep[1])}.."
        f"{num(post_deep[2])}); the change is linear in lr there (10x the change at lr / 10 "
        f"is {num(lin.min(), 4)}..{num(lin.max(), 4)} times the change at lr, for both kinds "
        f"of step).",
        f"one Adam-like step on every layer (each weight moved by lr against the sign of its "
        f"gradient, as Adam's first update does), per unit lr: Post-Norm moves the output "
        f"{num(sign_pre[0])}x as far as Pre-Norm with gain 1 ({num(sign_pre[1])}.."
        f"{num(sign_pre[2])} over the seeds) and {num(sign_deep[0])}x as far as DeepNorm "
        f"({num(sign_deep[1])}..{num(sign_deep[2])}): against Pre-Norm, "
        f"{'smaller' if sign_pre[0] < post_pre[0] else 'not smaller'} than the "
        f"gradient-descent ratio (Adam's step does not grow with the gradient's size).",
        f"at lr = 1e-3 the ratio Post-Norm / Pre-Norm (gain 1) is "
        f"{num(np.median(moves[post][:, 2 + i3] / moves[pre1][:, 2 + i3]))} (median): Post-Norm's"
        f" change saturates ({num(100 * np.median(moves[post][:, 2 + i3]))}% of the output), "
        f"so a ratio at one finite lr understates the linear-range ratio.",
        f"scalar picture: with independent branch derivatives a_l ~ N(0, "
        f"{SCALAR_BRANCH_STD}^2) the product of {SCALAR_DEPTH} factors 1 + a_l has median "
        f"{num(scalar['median'])} (closed form exp(-L sigma^2/2) = "
        f"{num(scalar['closed_median'])}; 90% of draws in {num(scalar['p5'])}.."
        f"{num(scalar['p95'])}), against {num(0.9 ** SCALAR_DEPTH)} and "
        f"{num(1.1 ** SCALAR_DEPTH)} without the 1; with every a_l = +0.1 the residual product "
        f"is 1.1^{SCALAR_DEPTH} again.",
    ]
    res.data = {"layers": np.arange(1, depth + 1), "reach": reach, "dweight": dw,
                "ratio": ratio, "moves": moves, "sensitivity": sensitivity, "linearity": linear,
                "sign_moves": sign_moves, "sign_sensitivity": sign_sensitivity,
                "step_sizes": STEP_SIZES, "scalar": scalar, "depth": depth, "seeds": seeds,
                "d": d}
    return res


def plot(res, path, plt):
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.4))
    layers = res.data["layers"]
    for name in res.data["reach"]:
        for ax, key in zip(axes, ("reach", "dweight")):
            plot_band(ax, layers, res.data[key][name], name, alpha=0.15)
    axes[0].set_title("gradient reaching layer l: ||dloss/dx_l||")
    axes[0].set_ylabel("||dloss/dx|| at the layer's input")
    axes[1].set_title("weight gradient of layer l: ||dloss/dW_l||")
    axes[1].set_ylabel("||dloss/dW_l||")
    for ax in axes:
        ax.set_xlabel("layer l")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9,
               title="stack (same colours in both panels)")
    fig.suptitle(f"{res.title}: median over {res.data['seeds']} seeds, band = min..max")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
