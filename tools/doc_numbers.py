"""Every measured number of the teaching docs, regenerated from the shipped code.

The docs mark what this script owns:

    <!-- numbers:KEY -->            a block (a demo's or explain's printed output, a table)
    ...                             replaced by blocks[KEY]
    <!-- /numbers -->
    <!--n:KEY-->0.48<!--/n-->       an inline value, replaced by values[KEY]
    <!--claim:KEY-->                after a sentence: claims[KEY] must have held in the run

A number measured once and not regenerated (a benchmark of a variant no longer built, a CI
run's wall time) sits in `<!-- measured-once: WHY -->...<!-- /measured-once -->`;
tests/test_doc_measured_numbers.py fails on a number of the docs that looks measured and
is in none of these markers.

The last run's output is committed as tools/doc_numbers.json; tests/test_doc_numbers.py
checks, without measuring anything, that the docs carry exactly its blocks and values and
that every claim held.  Commands (from the repository root, after building in place):

    PYTHONPATH=src python tools/doc_numbers.py              # measure all (a few minutes), write
                                                            # the JSON, the docs and the demo PNGs
    PYTHONPATH=src python tools/doc_numbers.py --only explain layer_norm
                                                            # re-measure some sections only
    PYTHONPATH=src python tools/doc_numbers.py --only warmup deepnorm convergence
                                                            # the training demos (their
                                                            # learning-rate sweeps take minutes)
    PYTHONPATH=src python tools/doc_numbers.py --write      # docs from the JSON, no measuring
    PYTHONPATH=src python tools/doc_numbers.py --check      # exit 1 where a doc differs

Timings (demo wall times, rms-vs-layer, the residual section) are only quotable from a
quiet machine: the JSON records the load average when the run started.
"""
import argparse
import contextlib
import datetime
import io
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
JSON_PATH = ROOT / "tools" / "doc_numbers.json"
DOCS = ["docs/demos.md", "docs/explain.md", "docs/pre_post_norm.md", "docs/layer_norm.md",
        "docs/rms_norm.md", "docs/residual.md", "docs/dropout.md", "docs/deepnorm.md",
        "docs/parallel_residual.md", "docs/sandwich_norm.md", "docs/blocks.md",
        "docs/half_precision.md"]
BLOCK = re.compile(r"(<!-- numbers:([\w.-]+) -->\n)(.*?)(<!-- /numbers -->)", re.S)
VALUE = re.compile(r"(<!--n:([\w.-]+)-->)(.*?)(<!--/n-->)", re.S)
CLAIM = re.compile(r"<!--claim:([\w.-]+)-->")


def _num(v, digits=3):
    from resnorm.demos._common import num
    return num(v, digits)


def _range(s, digits=3):
    """A (median, min, max) spread as 'median (min..max)'."""
    return f"{_num(s[0], digits)} ({_num(s[1], digits)}..{_num(s[2], digits)})"


def _fence(text, lang="text"):
    return f"```{lang}\n{text.rstrip()}\n```\n"


class Out:
    """What a section produces."""

    def __init__(self):
        self.blocks, self.values, self.claims = {}, {}, {}

    def claim(self, key, text, holds):
        self.claims[key] = {"text": text, "holds": bool(holds)}


def _cli(argv):
    """What `python -m resnorm ARGV` prints, and its exit status."""
    from resnorm.__main__ import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = main(argv)
    return buf.getvalue(), status


# --------------------------------------------------------------------------- machine

def machine(out):
    from resnorm.bench import machine_info
    info = machine_info()
    simd = info.get("simd_level", "?")
    out.values.update({
        "machine.cpu": info.get("cpu", "?"), "machine.cores": str(info.get("cores", "?")),
        "machine.simd": simd, "machine.python": info.get("python", "?"),
        "machine.numpy": info.get("numpy", "?"), "machine.matplotlib": info.get("matplotlib", "?"),
        "machine.l3": info.get("caches", {}).get("L3", "?"),
        "machine.load": f"{os.getloadavg()[0]:.1f}",
        "machine.date": datetime.date.today().isoformat()})
    try:
        import statsmodels
        out.values["machine.statsmodels"] = statsmodels.__version__
    except ImportError:
        out.values["machine.statsmodels"] = "not installed"


# --------------------------------------------------------------------------- demos

DEMOS = ("depth", "gradients", "batchnorm", "rms-vs-layer")   # docs/demos.md


def demos(out):
    from resnorm import demos as d
    results = {}
    for name in DEMOS:
        png = f"docs/img/demo-{name}.png"
        t0 = time.perf_counter()
        res = results[name] = d.run(name)
        out.values[f"demo.{name}.seconds"] = f"{time.perf_counter() - t0:.2g}"
        d.save_png(res, ROOT / png)
        # what `python -m resnorm demo NAME --png PNG` prints
        out.blocks[f"demo.{name}"] = _fence(f"{res.text()}\nfigure: {png}")
        out.values[f"demo.{name}.command"] = f"python -m resnorm demo {name} --png {png}"
        out.claim(f"demo.{name}.ran", f"demo {name} ran completely", not res.missing)
    _depth(out, results["depth"])
    _gradients(out, results["gradients"])
    _rms_vs_layer(out, results["rms-vs-layer"])
    _batchnorm(out, results["batchnorm"])


def _spread(v):
    from resnorm.demos._common import spread
    return spread(v)


def _depth(out, res):
    data, v = res.data, out.values
    names = list(data["norms"])
    plain, post, deep, pre1, pre_s, shared = names
    g, k = data["growth"], data["exponents"]
    depth = data["depth"]
    from resnorm.demos.depth import closed_form, stacks
    specs = {s.name: s for s in stacks(depth)}
    for key, name in (("pre1", pre1), ("pres", pre_s)):
        v[f"depth.{key}.growth"] = _range(_spread(g[name]))
        v[f"depth.{key}.closed"] = _num(closed_form(specs[name], depth))
    v["depth.pre1.k"] = f"{np.median(k[pre1]):.2f}"
    v["depth.shared.k"] = f"{np.median(k[shared]):.2f}"
    v["depth.pres.percent"] = f"{100 * (np.max(g[pre_s]) - 1):.0f}"
    post_norms = np.concatenate([data["norms"][post][:, 1:], data["norms"][deep][:, 1:]])
    v["depth.post.norm"] = _num(np.median(post_norms))
    for key, name, tol in (("pre1", pre1, 0.15), ("pres", pre_s, 0.1)):
        ratio = np.median(g[name]) / closed_form(specs[name], depth)
        out.claim(f"depth.{key}.closed", f"{name}: median growth within {tol:.0%} of the "
                  f"closed form", abs(ratio - 1) < tol)
    out.claim("depth.pre1.sqrt", "Pre-Norm gain 1 grows like sqrt(depth)",
              0.35 < np.median(k[pre1]) < 0.65)
    out.claim("depth.shared.linear", "one shared W grows linearly",
              0.8 < np.median(k[shared]) < 1.2)
    out.claim("depth.post.fixed", "Post-Norm and DeepNorm streams stay at sqrt(n D)",
              np.ptp(post_norms) < 1e-4 * np.median(post_norms))
    out.claim("depth.plain.closed", "no residual: median growth within a factor 2 of gain^L",
              0.5 < np.median(g[plain]) / closed_form(specs[plain], depth) < 2)


def _gradients(out, res):
    data, v = res.data, out.values
    depth, d = data["depth"], data["d"]
    ratio = {n: _spread(r) for n, r in data["ratio"].items()}
    key = {"no residual, gain 0.9": "plain09", "no residual, gain 1.1": "plain11",
           "Post-Norm": "post", "DeepNorm": "deep", "Pre-Norm, gain 1": "pre1",
           "Pre-Norm, gain 1/sqrt(2L)": "pres"}
    v["grad.seeds"] = str(data["seeds"])
    for name, k in key.items():
        v[f"grad.{k}.ratio"] = _range(ratio[name])
        v[f"grad.{k}.reach1"] = _num(np.median(data["reach"][name][:, 0]))
        v[f"grad.{k}.reachL"] = _num(np.median(data["reach"][name][:, -1]))
        if not k.startswith("plain"):
            v[f"grad.{k}.dw1"] = _num(np.median(data["dweight"][name][:, 0]))
            v[f"grad.{k}.dwL"] = _num(np.median(data["dweight"][name][:, -1]))
    from resnorm.demos.gradients import one_row_drift
    from resnorm.demos import _stacks
    alpha, beta = _stacks.deepnorm_constants(depth)
    v["grad.deep.alpha"], v["grad.deep.beta"] = f"{alpha:.3g}", f"{beta:.3g}"
    v["grad.pre1.closed"] = _num(np.sqrt(1 + depth))
    v["grad.pres.closed"] = _num(np.sqrt(1.5))
    v["grad.one_row_drift"] = _num(one_row_drift(depth, d))
    drift = {g: np.exp(np.mean(np.log(data["ratio"][n] / g ** (depth - 1))))
             for n, g in (("no residual, gain 0.9", 0.9), ("no residual, gain 1.1", 1.1))}
    v["grad.plain09.drift"], v["grad.plain11.drift"] = _num(drift[0.9]), _num(drift[1.1])
    sens = {n: s for n, s in data["sensitivity"].items()}
    for name in sens:
        v[f"grad.{key[name]}.sens"] = _range(_spread(sens[name]))
    post_pre = _spread(sens["Post-Norm"] / sens["Pre-Norm, gain 1"])
    v["grad.post_over_pre"] = _range(post_pre)
    v["grad.post_over_deep"] = _num(np.median(sens["Post-Norm"] / sens["DeepNorm"]))
    v["grad.post_over_deep.range"] = _range(_spread(sens["Post-Norm"] / sens["DeepNorm"]))
    sign = data["sign_sensitivity"]
    sign_pre = _spread(sign["Post-Norm"] / sign["Pre-Norm, gain 1"])
    v["grad.sign.post_over_pre"] = _range(sign_pre)
    v["grad.sign.post_over_deep"] = _range(_spread(sign["Post-Norm"] / sign["DeepNorm"]))
    steps = data["step_sizes"]
    for name in sens:
        for i, lr in enumerate(steps):
            v[f"grad.{key[name]}.move.{lr:g}"] = f"{100 * np.median(data['moves'][name][:, 2 + i]):.3g}%"
    i3 = steps.index(1e-3)
    at = np.median(data["moves"]["Post-Norm"][:, 2 + i3] / data["moves"]["Pre-Norm, gain 1"][:, 2 + i3])
    v["grad.post_over_pre.1e-3"] = _num(at)
    sc = data["scalar"]
    v["grad.scalar.median"], v["grad.scalar.closed"] = _num(sc["median"]), _num(sc["closed_median"])
    lin = np.concatenate(list(data["linearity"].values()))
    out.claim("grad.pre1.closed", "Pre-Norm gain 1: ratio within 30% of sqrt(1 + L)",
              abs(ratio["Pre-Norm, gain 1"][0] / np.sqrt(1 + depth) - 1) < 0.3)
    out.claim("grad.pres.closed", "Pre-Norm 1/sqrt(2L): ratio within 10% of sqrt(1.5)",
              abs(ratio["Pre-Norm, gain 1/sqrt(2L)"][0] / np.sqrt(1.5) - 1) < 0.1)
    out.claim("grad.post.spread", "Post-Norm's ratio varies by more than 3x over the seeds",
              ratio["Post-Norm"][2] / ratio["Post-Norm"][1] > 3)
    out.claim("grad.deep.flat", "DeepNorm's ratio stays within 0.8..1.25 for every seed",
              0.8 < ratio["DeepNorm"][1] and ratio["DeepNorm"][2] < 1.25)
    out.claim("grad.post.moves", "Post-Norm moves the output >10x more per unit lr than "
              "Pre-Norm gain 1 and than DeepNorm (medians)",
              post_pre[0] > 10 and np.median(sens["Post-Norm"] / sens["DeepNorm"]) > 10)
    out.claim("grad.sign.larger", "per unit lr, the Adam-like step moves Post-Norm's output "
              "further than Pre-Norm's (gain 1) and DeepNorm's in every seed",
              sign_pre[1] > 1 and np.min(sign["Post-Norm"] / sign["DeepNorm"]) > 1)
    out.claim("grad.sign.smaller", "per unit lr, the Adam-like step's Post-Norm / Pre-Norm "
              "ratio (median) is below the gradient step's", sign_pre[0] < post_pre[0])
    out.claim("grad.linear", "the per-unit-lr measurement is linear to 1%",
              np.max(np.abs(lin - 1)) < 0.01)
    out.claim("grad.saturates", "at lr = 1e-3 the Post/Pre ratio is below the linear one "
              "by more than 1.5x", at * 1.5 < post_pre[0])
    out.claim("grad.plain.drift", "both no-residual products drift below gain^(L-1), less "
              "than the one-row drift", all(one_row_drift(depth, d) < x < 1
                                           for x in drift.values()))
    out.claim("grad.scalar", "the scalar product's median is within 5% of exp(-L sigma^2/2)",
              abs(sc["median"] / sc["closed_median"] - 1) < 0.05)
    out.claim("grad.pres.scaled_moves", "Pre-Norm with 1/sqrt(2L) moves more than Pre-Norm "
              "gain 1 per unit lr", np.median(sens["Pre-Norm, gain 1/sqrt(2L)"])
              > np.median(sens["Pre-Norm, gain 1"]))


def _rms_vs_layer(out, res):
    v = out.values
    for t in res.data["timings"]:
        s = f"{t['shape'][0]}x{t['shape'][1]}"
        q1, med, q3 = t["quartiles"]
        v[f"rvl.{s}.{t['pass']}"] = f"{med:.2f} ({q1:.2f}..{q3:.2f})"
    meds = [t["quartiles"][1] for t in res.data["timings"]]
    v["rvl.range"] = f"{min(meds):.2f} to {max(meds):.2f}"
    v["rvl.mean0"] = _num(res.data["same_input"][0][1])
    out.claim("rvl.mean0", "the two kernels agree on rows with mean 0 to 1e-12",
              res.data["same_input"][0][1] < 1e-12)


def _batchnorm(out, res):
    ch = res.data["changes"]
    out.values["bn.max_counted"] = _num(max(c["BatchNorm, pads counted"][0] for c in ch.values()))
    out.claim("bn.per_token", "LayerNorm and RMSNorm give bitwise identical outputs in every "
              "batch", all(c[n] == (0.0, True) for c in ch.values()
                           for n in ("LayerNorm", "RMSNorm")))


# --------------------------------------------------------------------------- training demos

def _run_demo(out, name, prefix):
    """Runs demo `name` at full size as `python -m resnorm demo NAME --png PNG` would: its
    printed output as a block, its wall time, its figure.  Returns the DemoResult."""
    from resnorm import demos as d
    png = f"docs/img/demo-{name}.png"
    t0 = time.perf_counter()
    res = d.run(name)
    out.values[f"{prefix}.seconds"] = f"{time.perf_counter() - t0:.0f}"
    d.save_png(res, ROOT / png)
    out.blocks[f"{prefix}.output"] = _fence(f"{res.text()}\nfigure: {png}")
    out.values[f"{prefix}.command"] = f"python -m resnorm demo {name} --png {png}"
    out.claim(f"{prefix}.ran", f"demo {name} ran completely", not res.missing)
    return res


def _count(per_seed):
    """'k of n' seeds for which a claim held."""
    return f"{int(np.sum(per_seed))} of {len(per_seed)}"


def _survives(res):
    """The demo's 'what survives' finding, without its lead-in."""
    line = next(f for f in res.findings if f.startswith("what survives"))
    return line.split(": ", 1)[1]


def warmup(out):
    from resnorm.demos._common import majority, spread_text
    from resnorm.demos._charlm import stalled
    from resnorm.demos.warmup import GROWS, _per_layer_factor, warmup_claims
    res = _run_demo(out, "warmup", "warmup")
    data, v = res.data, out.values
    w, tuned = data["warmup"], data["tuned"]
    v["warmup.seeds"], v["warmup.steps"], v["warmup.warmup"] = (
        str(len(data["seeds"])), str(data["steps"]), str(w))
    v["warmup.lrs"] = ", ".join(f"{lr:g}" for lr in data["lrs"])
    v["warmup.n_lrs"] = str(len(data["lrs"]))
    keys = {("post", 0): "post0", ("post", w): "postw", ("pre", 0): "pre0", ("pre", w): "prew"}
    for arm, key in keys.items():
        v[f"warmup.{key}.best"] = spread_text(tuned[arm]["best_loss"])
    for key in ("post0", "postw"):
        v[f"warmup.{key}.stable"] = spread_text(tuned[("post", 0 if key == "post0" else w)]
                                                ["n_stable"], 0)
    v["warmup.post0.edge"] = _count(tuned["post", 0]["edge"])
    claims, noise = warmup_claims(tuned, w)
    v["warmup.noise"] = f"{noise:.2f}"
    for key in ("post_wider", "post_worse", "pre_worse"):
        v[f"warmup.{key}"] = _count(claims[key])
    v["warmup.post.diff"] = spread_text(tuned["post", 0]["best_loss"]
                                        - tuned["post", w]["best_loss"])
    v["warmup.survives"] = _survives(res)
    grads = data["grads"]
    factor = np.array([_per_layer_factor(g) for g in grads["post"]])
    last = grads["post"][:, -1] / grads["pre"][:, -1]
    v["warmup.grad.post.factor"], v["warmup.grad.last"] = spread_text(factor), spread_text(last)
    v["warmup.grad.grows"] = _count(factor > GROWS)
    runs = data["runs"].values()
    v["warmup.runs"] = str(len(runs))
    v["warmup.diverged"] = str(sum(r["diverged"] for r in runs))
    v["warmup.stalled"] = str(sum(stalled(r["held_out"], data["unigram"]) for r in runs))
    n_lrs = len(data["lrs"])
    out.claim("warmup.pre_all", "Pre-LN trains at every grid lr in every seed, with and "
              "without warm-up", all(np.all(tuned["pre", x]["n_stable"] == n_lrs) for x in (0, w)))
    out.claim("warmup.grad.not_growing", "Post-LN's gradient does not grow by more than the "
              "threshold per layer in most seeds", not majority(factor > GROWS))
    out.claim("warmup.grad.larger", "Post-LN's last-layer gradient is larger than Pre-LN's in "
              "every seed", np.all(last > 1))
    out.claim("warmup.post_wider", "warm-up widens Post-LN's stable lr range in most seeds",
              majority(claims["post_wider"]))
    out.claim("warmup.post_not_worse", "tuned, Post-LN without warm-up is not worse than "
              "with it beyond the seed spread in most seeds", not majority(claims["post_worse"]))
    out.claim("warmup.pre_not_worse", "tuned, Pre-LN without warm-up is not worse than with "
              "it beyond the seed spread in most seeds", not majority(claims["pre_worse"]))
    out.claim("warmup.post0_edge", "Post-LN without warm-up sits on the stability edge in "
              "most seeds", majority(tuned["post", 0]["edge"]))


def deepnorm(out):
    from resnorm.demos._common import majority, spread_text
    from resnorm.demos.deepnorm import depth_claims
    res = _run_demo(out, "deepnorm", "deepnorm")
    data, v = res.data, out.values
    tuned, updates = data["tuned"], data["updates"]
    v["deepnorm.seeds"], v["deepnorm.steps"], v["deepnorm.warmup"] = (
        str(len(data["seeds"])), str(data["steps"]), str(data["warmup"]))
    deepest = max(data["depths"])
    v["deepnorm.post.lrs"] = ", ".join(f"{lr:g}" for lr in data["grids"]["post", deepest])
    v["deepnorm.pre.lrs"] = ", ".join(f"{lr:g}" for lr in data["grids"]["pre", deepest])
    v["deepnorm.probe_lr"] = f"{data['probe_lr']:g}"
    v["deepnorm.depths"] = " and ".join(str(depth) for depth in data["depths"])
    v["deepnorm.unigram"] = f"{data['unigram']:.2f}"
    for arm in data["names"]:
        v[f"deepnorm.{arm[0]}{arm[1]}.best"] = spread_text(tuned[arm]["best_loss"])
    for block in ("post", "deepnorm"):
        v[f"deepnorm.{block}{deepest}.stable"] = spread_text(tuned[block, deepest]["n_stable"], 0)
    # the early updates the docs quote: demos.md's, and sandwich_norm.md's against Pre-LN
    for block in ("post", "deepnorm", "pre", "sandwich"):
        v[f"deepnorm.{block}{deepest}.update"] = spread_text(updates[block, deepest][:, 1])
    v["deepnorm.every"] = str(data["every"])
    out.claim("deepnorm.sandwich_moves_more", f"at {deepest} layers the sandwich stack's "
              f"output moves more than Pre-LN's in the first {data['every']} steps in every "
              f"seed", np.all(updates["sandwich", deepest][:, 1] > updates["pre", deepest][:, 1]))
    out.claim("deepnorm.sandwich_trains", f"the sandwich stack trains at every grid lr at "
              f"{deepest} layers in every seed", np.all(tuned["sandwich", deepest]["n_stable"]
                                                       == len(data["grids"]["sandwich", deepest])))
    v[f"deepnorm.post{deepest}.edge"] = _count(tuned["post", deepest]["edge"])
    for depth, blocks in data["depths"].items():
        claims, noise = depth_claims(tuned, updates, depth, blocks)
        v[f"deepnorm.{depth}.deep_better"] = _count(claims["deep_better"])
        out.claim(f"deepnorm.{depth}.post_trains", f"tuned, plain Post-LN trains at {depth} "
                  f"layers in most seeds", not majority(claims["post_fails"]))
        out.claim(f"deepnorm.{depth}.not_better", f"tuned, DeepNorm is not better than Post-LN "
                  f"beyond the seed spread at {depth} layers in most seeds",
                  not majority(claims["deep_better"]))
        out.claim(f"deepnorm.{depth}.smaller_update", f"DeepNorm's early update is the "
                  f"smaller at {depth} layers in every seed", np.all(claims["smaller_update"]))
    claims, noise = depth_claims(tuned, updates, deepest, data["depths"][deepest])
    v[f"deepnorm.{deepest}.noise"] = f"{noise:.2f}"
    v[f"deepnorm.{deepest}.post_narrower"] = _count(claims["post_narrower"])
    v[f"deepnorm.{deepest}.diff"] = spread_text(tuned["post", deepest]["best_loss"]
                                                - tuned["deepnorm", deepest]["best_loss"])
    v["deepnorm.survives"] = _survives(res)
    runs = data["runs"].values()
    v["deepnorm.runs"] = str(len(runs))
    post, grid = tuned["post", deepest], data["grids"]["post", deepest]
    trained = dict(zip(grid, post["stable"].sum(axis=0)))
    probe = data["probe_lr"]
    smaller = max(lr for lr in grid if lr < probe)
    for lr in (smaller, probe):
        v[f"deepnorm.post{deepest}.trained.{lr:g}"] = f"{trained[lr]} of {len(data['seeds'])}"
    out.claim("deepnorm.lr_specific", f"plain Post-LN at {deepest} layers trains in at most "
              f"half the seeds at lr {probe:g} and in most seeds at the next smaller grid lr",
              2 * trained[probe] <= len(data["seeds"])
              and 2 * trained[smaller] > len(data["seeds"]))
    out.claim("deepnorm.deep_below", f"tuned, DeepNorm ends below plain Post-LN at {deepest} "
              f"layers in every seed", np.all(claims["deep_below"]))
    out.claim("deepnorm.reference", f"at {deepest} layers the unnormalised-stream blocks end "
              f"within the seed spread of each other, and DeepNorm within it of their best, in "
              f"every seed", np.all(claims["reference_agree"])
              and np.all(claims["deep_like_reference"]))
    out.claim("deepnorm.no_divergence", "no run diverged",
              not any(r["diverged"] for r in runs))
    _branch_rms(out)


def _branch_rms(out):
    """The RMS of each sublayer's output at initialisation (docs/sandwich_norm.md), Pre-LN's
    and the sandwich's, on unit-Gaussian input at the deepnorm demo's width and batch: a
    block's default initialisation, one seed per demo seed."""
    from resnorm import nn
    from resnorm.demos._common import spread_text
    from resnorm.demos.deepnorm import SIZES
    cfg = SIZES["full"]
    shape = (cfg["batch"], cfg["seq"], cfg["d"])
    rms = lambda a: float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))
    pre_attn, pre_ffn, sandwich = [], [], []
    for seed in range(cfg["seeds"]):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        pre = nn.PreNormBlock(cfg["d"], cfg["heads"], seed=seed)
        a = pre.self_attn.forward(pre.norm1.forward(x))
        pre_attn.append(rms(a))
        pre_ffn.append(rms(pre.ffn.forward(pre.norm2.forward(x + a))))
        sw = nn.SandwichBlock(cfg["d"], cfg["heads"], seed=seed)
        a = sw.norm1_out.forward(sw.self_attn.forward(sw.norm1.forward(x)))
        f = sw.norm2_out.forward(sw.ffn.forward(sw.norm2.forward(x + a)))
        sandwich += [rms(a), rms(f)]
    v = out.values
    v["deepnorm.branch.shape"] = " x ".join(map(str, shape))
    v["deepnorm.branch.pre.attn"], v["deepnorm.branch.pre.ffn"] = (
        spread_text(pre_attn), spread_text(pre_ffn))
    v["deepnorm.branch.sandwich"] = f"{np.median(sandwich):.2f}"
    # below 1 only by the eps in the norm's denominator
    out.claim("deepnorm.branch.sandwich_unit", "the sandwich's branch outputs have RMS "
              "within 1e-3 of 1 in every seed", np.all(np.abs(np.array(sandwich) - 1) < 1e-3))


CONV_CLAIMS = (   # the per-seed claims of the convergence demo, in the summary's order
    ("small_monotone", "smallest step tried: every step of every run descends"),
    ("cond_up", "sigma_min/sigma_max of Z at initialisation increases with beta"),
    ("loss0_up", "the initial loss increases with beta"),
    ("small_ratio_down", "smallest step tried: loss/loss0 decreases with beta"),
    ("small_final_down", "smallest step tried: the absolute loss decreases with beta"),
    ("small_rate_up", "smallest step tried: the fitted linear rate increases with beta"),
    ("bracketed", "every beta's grid brackets its stability limit"),
    ("limit_not_up", "the largest lr that trained does not increase with beta"),
    ("tuned_ratio_down", "each beta at its best lr: loss/loss0 decreases with beta"),
    ("tuned_final_down", "each beta at its best lr: the absolute loss decreases with beta"),
    ("tuned_monotone", "each beta at its best lr: every step descends"),
    ("small_sensitive", "smallest step tried: a one-ulp change of the inputs moves some "
                        "beta's final loss by more than 10%"),
    ("best_sensitive", "best lr: a one-ulp change of the inputs moves some beta's final "
                       "loss by more than 10%"),
    ("below_ar", "every beta's training loss at its best lr is below the linear AR's"),
    ("forecast_better", "some beta forecasts the held-out years at least 10% better than "
                        "the linear AR"),
)

# the claims whose seed counts the prose of docs/demos.md quotes
CONV_COUNTED = ("loss0_up", "small_ratio_down", "small_final_down", "small_rate_up",
                "limit_not_up", "tuned_ratio_down", "tuned_final_down", "tuned_monotone",
                "best_sensitive", "below_ar", "forecast_better")


def convergence(out):
    from resnorm.demos._common import majority, markdown_table
    from resnorm.demos.convergence import (BETAS, _counted, _largest_change, medians_text,
                                           sig_text)
    res = _run_demo(out, "convergence", "conv")
    data, v = res.data, out.values
    v["conv.seeds"], v["conv.steps"] = str(data["seeds"]), str(data["steps"])
    tasks = {name: data[name] for name in ("synthetic", "sunspots") if data[name]}
    for name, d in tasks.items():
        t, claims, p = d["tuned"], d["claims"], f"conv.{name}"
        grids = {b: t[b]["grid"] for b in BETAS}
        v[f"{p}.small_lr"] = f"{grids[BETAS[0]][0]:g}"
        tops = {}
        for b in BETAS:
            tops.setdefault(grids[b][-1], []).append(f"{b:g}")
        v[f"{p}.tops"] = " and ".join(f"{top:g} (beta {', '.join(bs)})"
                                      for top, bs in tops.items())
        for key in CONV_COUNTED:
            if key in claims:
                v[f"{p}.{key}"] = _count(claims[key])
        v[f"{p}.cond0"] = medians_text(t[b]["cond0"] for b in BETAS)
        v[f"{p}.loss0"] = medians_text(t[b]["loss0"] for b in BETAS)
        v[f"{p}.small.ratio"] = medians_text(t[b]["ratio"][:, 0] for b in BETAS)
        v[f"{p}.small.final"] = medians_text(t[b]["final"][:, 0] for b in BETAS)
        v[f"{p}.small.rate"] = medians_text(t[b]["rate"][:, 0] for b in BETAS)
        v[f"{p}.trained"] = ", ".join(sig_text(t[b]["n_trained"], 1) for b in BETAS)
        v[f"{p}.limits"] = "; ".join(f"beta {b:g}: {_counted(t[b]['limit_lr'])}"
                                     for b in BETAS)
        v[f"{p}.tuned.ratio"] = medians_text(t[b]["best_ratio"] for b in BETAS)
        v[f"{p}.tuned.final"] = medians_text(t[b]["best_final"] for b in BETAS)
        v[f"{p}.edge"] = ", ".join(str(int(t[b]["edge"].sum())) for b in BETAS)
        v[f"{p}.moved"] = sig_text(_largest_change(d["moved"]["best"]))
        v[f"{p}.survives"] = next(f for f in res.findings if f.startswith(
            f"what survives on the {name} task")).split(": ", 1)[1].rstrip(".")
        out.claim(f"{p}.small_monotone", f"{name}: at the smallest step tried every run "
                  f"descends at every step, in every seed", np.all(claims["small_monotone"]))
        out.claim(f"{p}.cond_up", f"{name}: the conditioning of Z at initialisation increases "
                  f"with beta in every seed", np.all(claims["cond_up"]))
        out.claim(f"{p}.small_ratio_down", f"{name}: at the smallest step tried loss/loss0 "
                  f"decreases with beta in most seeds", majority(claims["small_ratio_down"]))
        out.claim(f"{p}.bracketed", f"{name}: every beta's grid brackets its stability limit "
                  f"in every seed", np.all(claims["bracketed"]))
        out.claim(f"{p}.best_not_monotone", f"{name}: at the best lr some step raises the loss "
                  f"in most seeds", not majority(claims["tuned_monotone"]))
        out.claim(f"{p}.edge", f"{name}: most seeds' best lrs, over all betas, sit on the "
                  f"stability edge", 2 * sum(t[b]["edge"].sum() for b in BETAS)
                  > len(BETAS) * data["seeds"])
        out.claim(f"{p}.small_robust", f"{name}: at the smallest step tried a one-ulp change "
                  f"of the inputs moves no final loss by more than 10%",
                  not np.any(claims["small_sensitive"]))
    syn, sun = tasks["synthetic"]["claims"], tasks.get("sunspots", {}).get("claims")
    out.claim("conv.synthetic.rate_up", "synthetic: at the smallest step tried the fitted rate "
              "increases with beta in most seeds", majority(syn["small_rate_up"]))
    out.claim("conv.synthetic.tuned_lost", "synthetic: with each beta at its best lr neither "
              "loss/loss0 nor the absolute loss decreases with beta in most seeds",
              not majority(syn["tuned_ratio_down"]) and not majority(syn["tuned_final_down"]))
    out.claim("conv.synthetic.best_sensitive", "synthetic: at the best lr a one-ulp change of "
              "the inputs moves some beta's final loss by more than 10% in some seed",
              np.any(syn["best_sensitive"]))
    att = tasks["synthetic"]["attention"]
    v["conv.synthetic.attn.max"] = sig_text([a["max_weight"] for a in att])
    v["conv.synthetic.attn.uniform"] = _num(att[0]["uniform"])
    v["conv.synthetic.attn.s21"] = sig_text([a["sigma2_over_sigma1"] for a in att])
    out.claim("conv.attn", "synthetic: in every seed the attention at initialisation is not "
              "uniform (largest weight > 1.5x uniform) and Attn(X) not near rank one (median "
              "sigma2/sigma1 > 0.2)", np.all(syn["attn_not_uniform"] & syn["attn_not_rank_one"]))
    if sun is not None:
        ar, t = tasks["sunspots"]["baseline"], tasks["sunspots"]["tuned"]
        v["conv.sunspots.ar.train"], v["conv.sunspots.ar.test"] = _num(ar[0]), _num(ar[2])
        v["conv.sunspots.tuned.test"] = medians_text(t[b]["best_test"] for b in BETAS)
        out.claim("conv.sunspots.rate_not_up", "sunspots: at the smallest step tried the "
                  "fitted rate does not increase with beta in most seeds",
                  not majority(sun["small_rate_up"]))
        out.claim("conv.sunspots.tuned_final_lost", "sunspots: with each beta at its best lr "
                  "the absolute loss does not decrease with beta in most seeds",
                  not majority(sun["tuned_final_down"]))
        out.claim("conv.sunspots.fits_not_forecasts", "sunspots: every beta's training loss "
                  "is below the AR's in most seeds, but no beta forecasts 10% better in most",
                  majority(sun["below_ar"]) and not majority(sun["forecast_better"]))
    rows = [[text] + [f"{_count(d['claims'][key])} seeds" if key in d["claims"] else "-"
                      for d in tasks.values()] for key, text in CONV_CLAIMS]
    out.blocks["conv.summary"] = markdown_table(["claim"] + list(tasks), rows) + "\n"


# --------------------------------------------------------------------------- explain

EXPLAIN_EXAMPLES = {
    "explain.rms": "explain rms --x 1,2,3,4 --weight 1,0.5,2,1 --dy 1,0,0,-1",
    "explain.layer": "explain layer --x 1,2,6 --bias 0,0.5,1 --dy 1,0,0 --dtype float32",
    "explain.rms-half": "explain rms --x 1,2,3,4 --weight 1,0.5,2,1 --dy 1,0,0,-1 "
                        "--dtype float16",
    "explain.dropout": "explain dropout --x 1,2,3,4 --p 0.5 --seed 1 --dy 1,1,1,1",
    "explain.add-rms": "explain add-rms --x 1,2,3,4 --residual=0.5,-1,0,2 --p 0.25 --seed 3 "
                       "--dy 1,0,0,-1",
    "explain.add-layer-post": "explain add-layer-post --x 1,2,3 --residual=0.5,-1,2 "
                              "--alpha 0.5 --learnable-alpha --dy 1,0,-1",
    "explain.scaled": "explain scaled --x 1,2,3 --F=0.5,-1,2 --alpha 0.1,1,2 --dh 1,1,-1",
    "explain.gated": "explain gated --x 1,2 --F 3,-4 --g=-1,20 --dh 1,1",
}


def explain(out):
    for key, args in EXPLAIN_EXAMPLES.items():
        text, status = _cli(args.split())
        out.blocks[key] = _fence(text)
        out.values[f"{key}.command"] = f"python -m resnorm {args}"
        out.claim(f"{key}.agree", f"{args}: verdict AGREE", status == 0)
    import resnorm
    e = resnorm.explain("layer", [1, 2, 6], bias=[0, 0.5, 1], dy=[1, 0, 0], dtype="float32")
    ydiff = {c.name: c for c in e.checks}["y"].max_abs_diff
    out.values["explain.layer.ydiff"] = _num(ydiff)
    out.claim("explain.layer.ulp", "float32 LayerNorm y within one ulp of 1 of the reference",
              0 < ydiff < 2.0**-23)
    h = resnorm.explain("rms", [1, 2, 3, 4], weight=[1, 0.5, 2, 1], dy=[1, 0, 0, -1],
                        dtype="float16")
    y, exact = h["y"].astype(np.float64), h["y_exact"]
    out.values["explain.rms-half.ydiff"] = _num(float(np.max(np.abs(y - exact))))
    out.claim("explain.rms-half.halfulp", "float16 RMSNorm y within half a float16 ulp of "
              "each exact value", bool(np.all(np.abs(y - exact) <= np.spacing(
                  np.abs(exact).astype(np.float16)).astype(np.float64) / 2)))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(EXPLAIN_NOTEBOOK, {})
    out.blocks["explain.notebook"] = _fence(EXPLAIN_NOTEBOOK, "python")
    out.blocks["explain.notebook.output"] = _fence(buf.getvalue())
    e = resnorm.explain("dropout", np.ones((2, 40)), p=0.3, seed=2**32 + 7)
    m = e.philox
    rows = ["| k | counter c | word w | u_k |", "|---|---|---|---|"]
    for k in (0, 1, 15, 16, 17, 63, 64, 79):
        rows.append(f"| {k} | {m['counter'][k]} | {m['word'][k]} | {m['u'][k]} |")
    out.blocks["explain.philox.table"] = "\n".join(rows) + "\n"


EXPLAIN_NOTEBOOK = '''import numpy as np
import resnorm

e = resnorm.explain("rms", [1, 2, 3, 4], dy=[1, 0, 0, 0])   # also: weight=, bias=, eps=, dtype=
print(e.names)                    # every step, in order
print(e["rstd"], e["dx"])         # the kernel's values
print(e.step("y").formula)        # 'y_i = x_i * rstd'
print([(c.name, c.agree) for c in e.checks])            # kernel vs resnorm.reference
print([(i.name, i.agree) for i in e.forward_invariants])  # properties of any correct norm
print([(c.name, c.agree) for c in e.gradient_checks])   # vs finite differences, per component
print(e.jacobians[0].closed_form.round(4))               # dy/dx of row 0
print([(i.name, i.value, i.exact) for i in e.invariants])
print(e.agree)
s = resnorm.explain("scaled", [1.0, 2.0], F=[3.0, 4.0], alpha=np.array(0.5), dh=[1.0, 1.0])
print(s["dalpha"], dict(s.cache))   # a learnable scalar alpha: its gradient, and the cache
'''


# --------------------------------------------------------------------------- layer_norm

CANCELLATION = '''import numpy as np
import resnorm


def variances(offset, dtype, seed=0):
    """The variance of one row offset + N(0, 1) of 4096 values, four ways."""
    x = (offset + np.random.default_rng(seed).standard_normal((1, 4096))).astype(dtype)
    exact = float(np.var(x.astype(np.longdouble)))                   # two-pass, extended
    one_pass_f32 = float(np.mean(x * x, dtype=np.float32) - np.mean(x, dtype=np.float32) ** 2)
    x64 = x.astype(np.float64)
    one_pass_f64 = float(np.mean(x64 * x64) - np.mean(x64) ** 2)      # float32 data, double sums
    _, cache = resnorm.layer_norm_forward(x, eps=1e-5)
    kernel = float(1 / cache.rstd[0] ** 2 - 1e-5)                     # the kernel: shifted
    return exact, one_pass_f32, one_pass_f64, kernel


for offset, dtype in ((1e4, np.float32), (1e6, np.float32), (1e8, np.float64)):
    exact, f32, f64, kernel = variances(offset, dtype)
    print(f"{np.dtype(dtype).name} input {offset:g} + N(0,1): variance {exact:.6g}; one-pass "
          f"E[x^2] - E[x]^2 summed in float32: {f32:.6g}, in double: {f64:.6g}; "
          f"kernel (shifted): {kernel:.6g}")
'''


def layer_norm(out):
    buf, space = io.StringIO(), {}
    with contextlib.redirect_stdout(buf):
        exec(CANCELLATION, space)
    out.blocks["layer_norm.cancellation"] = _fence(CANCELLATION, "python")
    out.blocks["layer_norm.cancellation.output"] = _fence(buf.getvalue())
    off = lambda v, exact: abs(v / exact - 1)
    f32 = space["variances"](1e4, np.float32)
    mid32 = space["variances"](1e6, np.float32)
    f64 = space["variances"](1e8, np.float64)
    out.claim("layer_norm.f32_one_pass_fails", "float32 1e4: one-pass summed in float32 is "
              "off by more than 10%", off(f32[1], f32[0]) > 0.1)
    out.claim("layer_norm.f32_double_ok", "float32 1e4: one-pass summed in double is within "
              "1e-6", off(f32[2], f32[0]) < 1e-6)
    out.claim("layer_norm.f64_one_pass_fails", "float64 1e8: one-pass in double is off by "
              "more than 1%", off(f64[2], f64[0]) > 0.01)
    out.claim("layer_norm.one_pass_grows", "one-pass in double: its error grows with the "
              "offset (1e4 < 1e6 < 1e8)", off(f32[2], f32[0]) < off(mid32[2], mid32[0])
              < off(f64[2], f64[0]))
    out.claim("layer_norm.kernel_ok", "the kernel's variance is within 1e-6 of the exact one "
              "in all three", all(off(n[3], n[0]) < 1e-6 for n in (f32, mid32, f64)))


# --------------------------------------------------------------------------- rms_norm

def rms_norm(out):
    n, d, s = 2048, 4096, 4
    out.values["rms_norm.fwd_mib"] = f"{(2 * n * d * s + d * s + n * 8) / 2**20:.0f}"
    out.values["rms_norm.bwd_mib"] = f"{(3 * n * d * s + 2 * d * s + n * 8) / 2**20:.0f}"


# --------------------------------------------------------------------------- residual

def residual(out):
    """One thread, (2048, 4096) float32: the fit t = read/R + write/W over ops with known
    streams, the fused forward against it and against separate kernels, and the fused
    backward with and without gradient buffers."""
    import resnorm as rn
    from resnorm.demos.rms_vs_layer import time_paired
    shape = (2048, 4096)
    rng = np.random.default_rng(0)
    x, r, dy, src = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    w = np.ones(shape[1], np.float32)
    y, h, dst, dx, dres = (np.empty_like(x) for _ in range(5))
    _, rms_cache = rn.rms_norm_forward(x, w)
    (_, _), add_cache = rn.add_rms_norm_forward(x, r, w)
    streams = {  # name: (call, arrays read, arrays written)
        "copy": (lambda: np.copyto(dst, src), 1, 1),
        "scaled_residual": (lambda: rn.scaled_residual(x, r, 1.0, out=h, n_threads=1), 2, 1),
        "rms_norm": (lambda: rn.rms_norm(x, w, out=y, n_threads=1), 1, 1),
        "rms_norm_backward": (lambda: rn.rms_norm_backward(dy, rms_cache, out=dx,
                                                           n_threads=1), 2, 1),
    }
    extra = {
        "fused": lambda: rn.add_rms_norm(x, r, w, out=y, residual_out=h, n_threads=1),
        "separate": lambda: (rn.scaled_residual(x, r, 1.0, out=h, n_threads=1),
                             rn.rms_norm(h, w, out=y, n_threads=1)),
        "backward_buffers": lambda: rn.add_rms_norm_backward(dy, None, add_cache, out=dx,
                                                             dresidual_out=dres, n_threads=1),
        "backward_fresh": lambda: rn.add_rms_norm_backward(dy, None, add_cache, n_threads=1),
    }
    names = list(streams) + list(extra)
    fns = [streams[n][0] for n in streams] + list(extra.values())
    t = dict(zip(names, np.median(time_paired(fns, 21, 1, rng), axis=0)))
    a = x.nbytes
    A = np.array([[streams[n][1] * a, streams[n][2] * a] for n in streams], dtype=float)
    inv, *_ = np.linalg.lstsq(A, np.array([t[n] for n in streams]), rcond=None)
    read_gbps, write_gbps = 1 / inv[0] / 1e9, 1 / inv[1] / 1e9
    fused_fit = 2 * a * inv[0] + 2 * a * inv[1]
    fit_err = max(abs(A[i] @ inv / t[n] - 1) for i, n in enumerate(streams))
    v = out.values
    v["residual.read_gbps"], v["residual.write_gbps"] = _num(read_gbps), _num(write_gbps)
    v["residual.fit_err"] = f"{100 * fit_err:.0f}%"
    v["residual.fused_vs_fit"] = f"{t['fused'] / fused_fit:.2f}"
    v["residual.separate_over_fused"] = f"{t['separate'] / t['fused']:.2f}"
    v["residual.separate_predicted"] = f"{(3 * inv[0] + 2 * inv[1]) / (2 * inv[0] + 2 * inv[1]):.2f}"
    v["residual.bwd_buffers_ms"] = f"{t['backward_buffers'] * 1e3:.2g}"
    v["residual.bwd_fresh_ms"] = f"{t['backward_fresh'] * 1e3:.2g}"
    v["residual.fused_x_copy"] = f"{(4 * a / t['fused']) / (2 * a / t['copy']):.2f}"
    cheaper = "reads" if read_gbps > write_gbps else "writes"
    v["residual.cheaper"] = cheaper
    out.claim("residual.buffers_help", "the fused backward with buffers is faster than "
              "without", t["backward_buffers"] < t["backward_fresh"])


# --------------------------------------------------------------------------- dropout

DROPOUT_EXAMPLE = '''import numpy as np
import resnorm

x = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
step, layer = 7, 2
s = step * 1000 + layer                        # a different seed for every step and site
print(resnorm.dropout(x, 0.25, seed=s))        # inference-style call
y, cache = resnorm.dropout_forward(x, 0.25, seed=s, return_mask=True)
print(cache.mask)                              # bool keep-mask (only with return_mask)
dx = resnorm.dropout_backward(np.ones_like(x), cache)   # mask regenerated from the seed
print(dx)
print(resnorm.dropout(x, 0.25, seed=s, training=False))  # eval: a copy of x
'''


def _example(out, key, code):
    """A doc's python example and what it prints, as the blocks KEY and KEY.output."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, {})
    out.blocks[key] = _fence(code, "python")
    out.blocks[f"{key}.output"] = _fence(buf.getvalue())


def dropout(out):
    _example(out, "dropout.example", DROPOUT_EXAMPLE)


# --------------------------------------------------------------------------- blocks

BLOCKS_EXAMPLE = '''import numpy as np
from resnorm import nn

model = nn.TransformerStack(2, 64, 4, block="pre", norm="layer", dropout=0.1, seed=0)
opt = nn.Adam(model, lr=3e-3)
x = np.random.default_rng(0).standard_normal((4, 32, 64)).astype(np.float32)
target = np.roll(x, 1, axis=1)                          # a toy task: predict the previous token
for step in range(60):
    opt.zero_grad()
    loss, dy = nn.mse_loss(model.forward(x), target)   # any loss that gives dL/dy
    model.backward(dy)                                  # fills model.grads()
    opt.step()
    if step % 20 == 0:
        print(f"step {step}: loss {loss:.3f}")
model.eval()                                            # dropout off
print(f"eval loss {nn.mse_loss(model.forward(x), target)[0]:.3f}")
'''


def blocks(out):
    _example(out, "blocks.example", BLOCKS_EXAMPLE)


# --------------------------------------------------------------------------- half_precision

def half_precision(out):
    """What `python benchmarks/half_drift.py` prints, and the drifts after the last layer
    that the prose quotes (from its closing lines, so that the prose and the block come
    from one run)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("half_drift",
                                                  ROOT / "benchmarks" / "half_drift.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        module.main([])
    text = buf.getvalue()
    out.blocks["half.drift"] = _fence(text)
    final = {m[1]: (float(m[2]), float(m[3])) for m in re.finditer(
        r"^(.+?): after \d+ layers (\S+) = (\S+) x its epsilon", text, re.M)}
    v = out.values
    for key, name in (("float16", "float16"), ("bfloat16", "bfloat16"),
                      ("bf16_f32h", "bf16 (f32 h)")):
        v[f"half.{key}"] = f"{100 * final[name][0]:.2g}%"
    v["half.bfloat16.eps"] = f"{final['bfloat16'][1]:.1f}"
    stream_share = 1 - final["bf16 (f32 h)"][0] / final["bfloat16"][0]
    out.claim("half.stream_share", "keeping the stream in float32 removes between 0.6 and "
              "0.75 of bfloat16's drift after the last layer", 0.6 < stream_share < 0.75)


# --------------------------------------------------------------------------- the docs

SECTIONS = {"machine": machine, "demos": demos, "warmup": warmup, "deepnorm": deepnorm,
            "convergence": convergence,
            "explain": explain, "layer_norm": layer_norm, "rms_norm": rms_norm,
            "residual": residual, "dropout": dropout, "blocks": blocks,
            "half_precision": half_precision}


def load():
    return json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else \
        {"blocks": {}, "values": {}, "claims": {}}


def render(text, numbers):
    """text with every marked block and value taken from numbers; also returns the keys
    it used."""
    used = set()

    def block(m):
        used.add(m.group(2))
        return m.group(1) + numbers["blocks"].get(m.group(2), m.group(3)) + m.group(4)

    def value(m):
        used.add(m.group(2))
        return m.group(1) + numbers["values"].get(m.group(2), m.group(3)) + m.group(4)

    text = BLOCK.sub(block, text)
    text = VALUE.sub(value, text)
    used |= set(CLAIM.findall(text))
    return text, used


def check(numbers=None, root=ROOT):
    """Problems (strings): a doc whose marked blocks or values differ from numbers, a
    marker with no entry, an entry no doc uses, a claim that did not hold."""
    numbers = load() if numbers is None else numbers
    problems, used = [], set()
    known = set(numbers["blocks"]) | set(numbers["values"]) | set(numbers["claims"])
    for doc in DOCS:
        text = (root / doc).read_text()
        rendered, keys = render(text, numbers)
        used |= keys
        for key in sorted(keys - known):
            problems.append(f"{doc}: marker {key!r} has no entry in {JSON_PATH.name}")
        if rendered != text:
            problems.append(f"{doc}: numbers differ from {JSON_PATH.name} "
                            f"(run tools/doc_numbers.py --write)")
        for key in CLAIM.findall(text):
            claim = numbers["claims"].get(key)
            if claim is not None and not claim["holds"]:
                problems.append(f"{doc}: claim {key!r} ({claim['text']}) did not hold in the "
                                f"last run")
    for key in sorted(known - used):
        if not key.endswith(".ran") and not key.startswith("machine."):
            problems.append(f"{JSON_PATH.name}: {key!r} is used by no doc")
    for key, claim in numbers["claims"].items():
        if not claim["holds"] and key not in used:
            problems.append(f"claim {key!r} ({claim['text']}) did not hold in the last run")
    return problems


def write(numbers):
    for doc in DOCS:
        path = ROOT / doc
        text, _ = render(path.read_text(), numbers)
        path.write_text(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS),
                        help="re-measure these sections, keep the others from the JSON")
    parser.add_argument("--write", action="store_true", help="only rewrite the docs")
    parser.add_argument("--check", action="store_true", help="only compare the docs")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        print("\n".join(problems) or "docs match tools/doc_numbers.json")
        return 1 if problems else 0
    numbers = load()
    if not args.write:
        for name in args.only or list(SECTIONS):
            print(f"measuring {name} ...", file=sys.stderr)
            o = Out()
            SECTIONS[name](o)
            for kind in ("blocks", "values", "claims"):
                mine = getattr(o, kind)
                numbers[kind] = {k: v for k, v in numbers[kind].items()
                                 if not _owned(k, name)} | mine
        numbers["command"] = "PYTHONPATH=src python tools/doc_numbers.py"
        JSON_PATH.write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")
    write(numbers)
    failed = [k for k, c in numbers["claims"].items() if not c["holds"]]
    if failed:
        print("claims that did not hold: " + ", ".join(failed), file=sys.stderr)
    return 0


OWNERS = {"machine": ("machine.",), "demos": ("demo.", "depth.", "grad.", "rvl.", "bn."),
          "warmup": ("warmup.",), "deepnorm": ("deepnorm.",), "convergence": ("conv.",),
          "explain": ("explain.",), "layer_norm": ("layer_norm.",), "rms_norm": ("rms_norm.",),
          "residual": ("residual.",), "dropout": ("dropout.",), "blocks": ("blocks.",),
          "half_precision": ("half.",)}


def _owned(key, section):
    return key.startswith(OWNERS[section])


if __name__ == "__main__":
    sys.exit(main())
