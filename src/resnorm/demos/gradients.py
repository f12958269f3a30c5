"""gradients: how much gradient reaches each of 100 layers, with the real backward passes.

Stacks of linear sublayers (see _stacks.py): no residual with gain 0.9 and 1.1, Post-Norm
and Pre-Norm (RMSNorm, the library's forward and backward kernels).  A unit-norm random
gradient is injected at the output (the loss is <g, output>) and backpropagated.

Reported per layer l (1 = first, L = last):
* ||dloss/dx|| at the input of layer l: the signal that reaches it;
* ||dloss/dW_l||: what an optimizer step would use;
and, for the warm-up question, how much the output moves after one gradient-descent step
of size lr on every layer.  Also the scalar picture: a product of 100 per-layer factors.
"""
import numpy as np

from ._common import DemoResult, markdown_table, num
from . import _stacks

SIZES = {"full": {"tokens": 8, "d": 64, "depth": 100},
         "tiny": {"tokens": 4, "d": 16, "depth": 100}}
STACKS = (("no residual, gain 0.9", "plain", 0.9),
          ("no residual, gain 1.1", "plain", 1.1),
          ("Post-Norm", "post-norm", 1.0),
          ("Pre-Norm", "pre-norm", 1.0))
STEP_SIZES = (1e-4, 1e-3, 1e-2)
SCALAR_DEPTH = 100
SCALAR_DRAWS = 10000
SCALAR_BRANCH_STD = 0.1
BOUNDED = 100     # "neither vanishes nor explodes": layer 1 / layer L within this factor


def _report_layers(depth):
    return sorted({1, depth // 10, depth // 4, depth // 2, 3 * depth // 4, depth})


def _measure(kind, x, weights, g):
    out, tape = _stacks.forward(kind, x, weights)
    dstreams, dweights = _stacks.backward(g, weights, tape)
    depth = len(weights)
    reach = np.array([np.linalg.norm(dstreams[l]) for l in range(depth)])   # input of layer l+1
    dw = np.array([np.linalg.norm(dwl) for dwl in dweights])
    moves = []
    for lr in STEP_SIZES:
        stepped = [w - lr * dwl for w, dwl in zip(weights, dweights)]
        new_out, _ = _stacks.forward(kind, x, stepped)
        moves.append(np.linalg.norm(new_out - out) / np.linalg.norm(out))
    return reach, dw, np.array(moves)


def _scalar_table(rng):
    branch = rng.normal(0.0, SCALAR_BRANCH_STD, size=(SCALAR_DRAWS, SCALAR_DEPTH))
    products = np.prod(1.0 + branch, axis=1)
    lo, med, hi = np.percentile(products, [5, 50, 95])
    n = SCALAR_DEPTH
    rows = [
        ["no residual: 0.9 per layer", f"0.9^{n}", num(0.9 ** n)],
        ["no residual: 1.1 per layer", f"1.1^{n}", num(1.1 ** n)],
        [f"residual: 1 + a_l, a_l ~ N(0, {SCALAR_BRANCH_STD}^2) independent",
         f"median of {SCALAR_DRAWS} draws (5%..95%)", f"{num(med)} ({num(lo)}..{num(hi)})"],
        ["residual: 1 + a_l with every a_l = +0.1", f"1.1^{n}", num(1.1 ** n)],
        ["residual: 1 + a_l with every a_l = +0.005", f"1.005^{n}", num(1.005 ** n)],
    ]
    return rows, {"median": med, "p5": lo, "p95": hi}


def run(size="full", seed=0):
    cfg = SIZES[size]
    n, d, depth = cfg["tokens"], cfg["d"], cfg["depth"]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    g = rng.standard_normal((n, d))
    g /= np.linalg.norm(g)
    reach, dw, moves = {}, {}, {}
    for name, kind, gain in STACKS:
        weights = _stacks.random_weights(rng, depth, d, gain)
        reach[name], dw[name], moves[name] = _measure(kind, x, weights, g)
    layers = _report_layers(depth)
    res = DemoResult("gradients", f"Gradient reaching each of {depth} layers", size, seed)

    rows = [[name] + [num(v[l - 1]) for l in layers] + [num(v[0] / v[-1])]
            for name, v in reach.items()]
    res.tables.append((
        f"||dloss/dx|| at the input of layer l ({n} tokens x {d} features, unit-norm "
        f"gradient injected at the output).",
        markdown_table(["stack"] + [f"layer {l}" for l in layers] + [f"layer 1 / layer {depth}"],
                       rows)))
    rows = [[name] + [num(v[l - 1]) for l in layers] for name, v in dw.items()]
    res.tables.append(("||dloss/dW_l||, the weight gradient of layer l.",
                       markdown_table(["stack"] + [f"layer {l}" for l in layers], rows)))
    rows = [[name] + [num(m) for m in moves[name]] for name in ("Post-Norm", "Pre-Norm")]
    res.tables.append((
        "||output after - before|| / ||output|| after one gradient-descent step "
        "W_l -= lr * dloss/dW_l on every layer.",
        markdown_table(["stack"] + [f"lr = {lr:g}" for lr in STEP_SIZES], rows)))
    scalar_rows, scalar = _scalar_table(rng)
    res.tables.append((f"The scalar picture: a product of {SCALAR_DEPTH} per-layer derivatives.",
                       markdown_table(["per-layer factor", "product", "value"], scalar_rows)))

    ratio = {name: v[0] / v[-1] for name, v in reach.items()}
    last_dw = {name: v[-1] for name, v in dw.items()}
    move = {name: m[STEP_SIZES.index(1e-3)] for name, m in moves.items()}
    bounded = all(1 / BOUNDED < ratio[k] < BOUNDED for k in ("Pre-Norm", "Post-Norm"))
    res.findings += [
        f"no residual: layer 1 receives {num(ratio['no residual, gain 0.9'])}x (gain 0.9) and "
        f"{num(ratio['no residual, gain 1.1'])}x (gain 1.1) the gradient of layer {depth} "
        f"(compare 0.9^{depth - 1} = {num(0.9 ** (depth - 1))}, "
        f"1.1^{depth - 1} = {num(1.1 ** (depth - 1))}).",
        f"Pre-Norm: layer 1 receives {num(ratio['Pre-Norm'])}x the gradient of layer {depth}; "
        f"Post-Norm: {num(ratio['Post-Norm'])}x"
        + (f" (both within a factor {BOUNDED} over {depth} layers)." if bounded else "."),
        f"weight gradient of the last layer: Post-Norm {num(last_dw['Post-Norm'])}, Pre-Norm "
        f"{num(last_dw['Pre-Norm'])} (ratio {num(last_dw['Post-Norm'] / last_dw['Pre-Norm'])}).",
        f"one step with lr = 1e-3 on every layer moves the Post-Norm output by "
        f"{num(100 * move['Post-Norm'])}% and the Pre-Norm output by "
        f"{num(100 * move['Pre-Norm'])}% (ratio {num(move['Post-Norm'] / move['Pre-Norm'])}).",
        f"scalar picture: with independent branch derivatives a_l ~ N(0, "
        f"{SCALAR_BRANCH_STD}^2) the product of {SCALAR_DEPTH} factors 1 + a_l has median "
        f"{num(scalar['median'])} (90% of draws in {num(scalar['p5'])}..{num(scalar['p95'])}), "
        f"against {num(0.9 ** SCALAR_DEPTH)} and {num(1.1 ** SCALAR_DEPTH)} without the 1; "
        f"with every a_l = +0.1 the residual product is 1.1^{SCALAR_DEPTH} again.",
    ]
    res.data = {"layers": np.arange(1, depth + 1), "reach": reach, "dweight": dw,
                "moves": moves, "step_sizes": STEP_SIZES, "scalar": scalar, "depth": depth}
    return res


def plot(res, path, plt):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in res.data["reach"]:
        axes[0].semilogy(res.data["layers"], res.data["reach"][name], label=name)
        axes[1].semilogy(res.data["layers"], res.data["dweight"][name], label=name)
    axes[0].set_ylabel("||dloss/dx|| at the layer's input")
    axes[1].set_ylabel("||dloss/dW_l||")
    for ax in axes:
        ax.set_xlabel("layer")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(res.title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
