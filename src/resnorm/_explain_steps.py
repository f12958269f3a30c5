"""The steps of each kind of explain mode (the public face is explain.py).

A builder runs the compiled kernels, records on the trace the inputs, the float64
reference intermediates and the kernel outputs, and returns the kernel outputs to compare
with resnorm.reference as (name, kernel value, reference value) triples.  Reference
intermediates are computed from the inputs and the reference's own statistics, never from
a kernel output.
"""
import numpy as np

from . import norms, reference
from .inverted_dropout import dropout_backward, dropout_forward
from .residual import add_rms_norm_backward, add_rms_norm_forward


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _dropout_active(inp):
    return inp.training and inp.p > 0.0


def _record_inputs(t, inp, names):
    notes = {"x": "branch output, added to the stream" if inp.kind == "add-rms" else "",
             "residual": "the residual stream", "w": "weight", "b": "bias",
             "alpha": "residual scale (fixed)", "p": "drop probability",
             "training": "False: dropout is the identity", "D": "row length",
             "k": "flat C-order index: the counter of the dropout mask",
             "dy": "gradient arriving at y", "dh": "gradient arriving along the stream h"}
    n, d = inp.x.shape
    values = {"x": inp.x, "residual": inp.residual, "w": inp.weight, "b": inp.bias,
              "alpha": inp.alpha, "p": inp.p, "seed": inp.seed, "training": inp.training,
              "eps": inp.eps, "D": d, "k": np.arange(n * d).reshape(n, d), "dy": inp.dy,
              "dh": inp.dh}
    per = {"x": "element", "residual": "element", "k": "element", "dy": "element",
           "dh": "element", "w": "column", "b": "column"}
    for name in names:
        if values[name] is not None:
            t.add(name, values[name], per.get(name, "scalar"), "input", "input",
                  note=notes.get(name, ""))


# --------------------------------------------------------------------------- shared steps

def _rms_forward_steps(t, v, name, weight, rstd_kernel, rstd_ref, y_kernel):
    """RMSNorm of v (called `name`: "x" or "h"); returns the normalised rows (reference)."""
    v = _f64(v)
    squares = v * v
    sum_sq = squares.sum(axis=1)
    vn = v * rstd_ref[:, None]
    t.add("squares", squares, "element", "reference", "forward", f"{{{name}}}^2")
    t.add("sum_sq", sum_sq, "row", "reference", "forward", "{squares}", "sum",
          note="the one row reduction (the kernel accumulates it in double)")
    t.add("ms", sum_sq / v.shape[1], "row", "reference", "forward", "{sum_sq} / {D}",
          note="mean square")
    t.add("rstd", rstd_kernel, "row", "kernel", "forward", "1 / sqrt({ms} + {eps})",
          note="cached for backward (float64)")
    t.add(f"{name}n", vn, "element", "reference", "forward", f"{{{name}}} * {{rstd}}",
          note="the normalised row: root mean square 1")
    t.add("y", y_kernel, "element", "kernel", "forward",
          f"{{{name}}} * {{rstd}}" + ("" if weight is None else " * {w}"))
    return vn


def _rms_backward_steps(t, dy, weight, vn, name):
    """The gradient reaching the normalised rows and the row reduction m = mean(g * vn)."""
    dy = _f64(dy)
    g = dy if weight is None else dy * weight
    t.add("g", g, "element", "reference", "backward", "{dy}" if weight is None else "{dy} * {w}",
          note=f"the gradient reaching {name}n")
    t.add(f"g_{name}n", g * vn, "element", "reference", "backward", f"{{g}} * {{{name}n}}")
    m = (g * vn).mean(axis=1)
    t.add("m", m, "row", "reference", "backward", f"{{g_{name}n}}", "mean",
          note="the one row reduction of backward")
    return g, m


def _mask_steps(t, inp):
    """How dropout decides which elements to keep; returns (kernel mask, reference mask,
    scale).  Only called when dropout is active."""
    n, d = inp.x.shape
    _, cache = dropout_forward(inp.x, inp.p, seed=inp.seed, return_mask=True)
    keep_ref = reference.dropout_mask(inp.x.shape, inp.p, inp.seed)
    if inp.p == 1.0:
        t.add("keep", cache.mask, "element", "kernel", "forward", "0", note="p = 1 keeps nothing")
        t.add("scale", 0.0, "scalar", "reference", "forward", "0", note="p = 1")
        return cache.mask, keep_ref, 0.0
    t.add("threshold", np.floor(inp.p * 2.0**32), "scalar", "reference", "forward",
          "floor({p} * 2^32)")
    t.add("u", reference.dropout_uniforms(inp.seed, n * d).reshape(n, d), "element",
          "reference", "forward", "philox({seed}, {k})",
          note="32-bit uniform of element k (resnorm.reference.dropout_uniforms)")
    t.add("keep", cache.mask, "element", "kernel", "forward", "[{u} >= {threshold}]",
          note="from the kernel (dropout_forward, return_mask=True): kept with probability 1-p")
    scale = 1.0 / (1.0 - inp.p)
    t.add("scale", scale, "scalar", "reference", "forward", "1 / (1 - {p})",
          note="inverted dropout: kept elements are scaled up, so E[output] = input")
    return cache.mask, keep_ref, scale


# --------------------------------------------------------------------------- the kinds

def rms(t, inp):
    x, w, eps = inp.x, inp.weight, inp.eps
    _record_inputs(t, inp, ["x", "w", "eps", "D", "dy"])
    y, cache = norms.rms_norm_forward(x, w, eps)
    y_ref, rstd_ref = reference.rms_norm_forward(x, w, eps)
    out = [("y", y, y_ref), ("rstd", cache.rstd, rstd_ref)]
    xn = _rms_forward_steps(t, x, "x", w, cache.rstd, rstd_ref, y)
    if inp.dy is None:
        return out
    dx, dw = norms.rms_norm_backward(inp.dy, cache)
    dx_ref, dw_ref = reference.rms_norm_backward(inp.dy, x, w, rstd_ref)
    _rms_backward_steps(t, inp.dy, w, xn, "x")
    t.add("dx", dx, "element", "kernel", "backward", "{rstd} * ({g} - {xn} * {m})")
    out.append(("dx", dx, dx_ref))
    if w is not None:
        t.add("dw", dw, "column", "kernel", "backward", "{dy} * {xn}", "sum",
              note="summed over rows in fixed row blocks")
        out.append(("dw", dw, dw_ref))
    return out


def layer(t, inp):
    x, w, b, eps = inp.x, inp.weight, inp.bias, inp.eps
    _record_inputs(t, inp, ["x", "w", "b", "eps", "D", "dy"])
    x64 = _f64(x)
    y, cache = norms.layer_norm_forward(x, w, b, eps)
    y_ref, mean_ref, rstd_ref = reference.layer_norm_forward(x, w, b, eps)
    out = [("y", y, y_ref), ("mean", cache.mean, mean_ref), ("rstd", cache.rstd, rstd_ref)]

    t.add("sum_x", x64.sum(axis=1), "row", "reference", "forward", "{x}", "sum",
          note="reduction 1")
    t.add("mean", cache.mean, "row", "kernel", "forward", "{sum_x} / {D}",
          note="cached for backward (float64)")
    centred = x64 - mean_ref[:, None]
    t.add("centred", centred, "element", "reference", "forward", "{x} - {mean}")
    t.add("sq_dev", centred * centred, "element", "reference", "forward", "{centred}^2")
    t.add("var", (centred * centred).mean(axis=1), "row", "reference", "forward", "{sq_dev}",
          "mean", note="reduction 2: biased variance (divide by D), two-pass")
    t.add("rstd", cache.rstd, "row", "kernel", "forward", "1 / sqrt({var} + {eps})",
          note="cached for backward (float64)")
    xhat = centred * rstd_ref[:, None]
    t.add("xhat", xhat, "element", "reference", "forward", "{centred} * {rstd}",
          note="mean 0, variance 1 (up to eps)")
    expr = "{xhat}" + ("" if w is None else " * {w}") + ("" if b is None else " + {b}")
    t.add("y", y, "element", "kernel", "forward", expr)
    if inp.dy is None:
        return out

    dx, dw, db = norms.layer_norm_backward(inp.dy, cache)
    dx_ref, dw_ref, db_ref = reference.layer_norm_backward(inp.dy, x, w, mean_ref, rstd_ref)
    out.append(("dx", dx, dx_ref))
    dy64 = _f64(inp.dy)
    g = dy64 if w is None else dy64 * w
    t.add("g", g, "element", "reference", "backward", "{dy}" if w is None else "{dy} * {w}",
          note="the gradient reaching xhat")
    t.add("mean_g", g.mean(axis=1), "row", "reference", "backward", "{g}", "mean",
          note="backward reduction 1")
    t.add("g_xhat", g * xhat, "element", "reference", "backward", "{g} * {xhat}")
    t.add("mean_g_xhat", (g * xhat).mean(axis=1), "row", "reference", "backward", "{g_xhat}",
          "mean", note="backward reduction 2 (computed in the same pass as reduction 1)")
    t.add("dx", dx, "element", "kernel", "backward",
          "{rstd} * ({g} - {mean_g} - {xhat} * {mean_g_xhat})")
    if w is not None:
        t.add("dw", dw, "column", "kernel", "backward", "{dy} * {xhat}", "sum")
        out.append(("dw", dw, dw_ref))
    if b is not None:
        t.add("db", db, "column", "kernel", "backward", "{dy}", "sum")
        out.append(("db", db, db_ref))
    return out


def add_rms(t, inp):
    x, res, w, eps, alpha = inp.x, inp.residual, inp.weight, inp.eps, inp.alpha
    active = _dropout_active(inp)
    _record_inputs(t, inp, ["x", "residual", "w", "alpha", "p", "seed", "training", "eps", "D"]
                   + (["k"] if active else []) + ["dy", "dh"])
    kw = dict(alpha=alpha, p=inp.p, seed=inp.seed, training=inp.training)
    (y, h), cache = add_rms_norm_forward(x, res, w, eps, **kw)
    y_ref, h_ref, rstd_ref, keep_ref = reference.add_rms_norm_forward(x, res, w, eps, **kw)
    out = [("y", y, y_ref), ("h", h, h_ref), ("rstd", cache.rstd, rstd_ref)]

    if active:
        keep, keep_check, scale = _mask_steps(t, inp)
        out.append(("keep", keep, keep_check))
        t.add("d", _f64(x) * keep_ref * scale, "element", "reference", "forward",
              "{x} * {keep} * {scale}", note="dropout(x)")
    else:
        t.add("d", _f64(x), "element", "reference", "forward", "{x}",
              note="dropout off (p = 0 or training=False): the identity")
    t.add("h", h, "element", "kernel", "forward", "{residual} + {alpha} * {d}",
          note="the new residual stream")
    hn = _rms_forward_steps(t, h_ref, "h", w, cache.rstd, rstd_ref, y)
    if inp.dy is None:
        return out

    dx, dres, dw, _ = add_rms_norm_backward(inp.dy, inp.dh, cache)
    dx_ref, dres_ref, dw_ref, _ = reference.add_rms_norm_backward(
        inp.dy, inp.dh, x, h_ref, w, rstd_ref, alpha, keep_ref, inp.p if active else 0.0)
    g, m = _rms_backward_steps(t, inp.dy, w, hn, "h")
    through_norm = rstd_ref[:, None] * (g - hn * m[:, None])
    gh = through_norm if inp.dh is None else _f64(inp.dh) + through_norm
    t.add("gh", gh, "element", "reference", "backward",
          ("" if inp.dh is None else "{dh} + ") + "{rstd} * ({g} - {hn} * {m})",
          note="the gradient reaching h: through the norm" +
               ("" if inp.dh is None else " plus along the stream"))
    t.add("dresidual", dres, "element", "kernel", "backward", "{gh}",
          note="the skip path passes gh unchanged")
    t.add("dx", dx, "element", "kernel", "backward",
          "{gh} * {alpha} * {keep} * {scale}" if active else "{gh} * {alpha}",
          note="the same mask, regenerated from (seed, k)" if active else "")
    out += [("dx", dx, dx_ref), ("dresidual", dres, dres_ref)]
    if w is not None:
        t.add("dw", dw, "column", "kernel", "backward", "{dy} * {hn}", "sum")
        out.append(("dw", dw, dw_ref))
    return out


def dropout(t, inp):
    x = inp.x
    active = _dropout_active(inp)
    _record_inputs(t, inp, ["x", "p", "seed", "training"] + (["k"] if active else []) + ["dy"])
    y, cache = dropout_forward(x, inp.p, seed=inp.seed, training=inp.training)
    y_ref, keep_ref = reference.dropout_forward(x, inp.p, inp.seed, inp.training)
    out = [("y", y, y_ref)]
    if active:
        keep, keep_check, _ = _mask_steps(t, inp)
        out.append(("keep", keep, keep_check))
        t.add("y", y, "element", "kernel", "forward", "{x} * {keep} * {scale}")
    else:
        t.add("y", y, "element", "kernel", "forward", "{x}",
              note="p = 0 or training=False: the identity")
    if inp.dy is None:
        return out
    dx = dropout_backward(inp.dy, cache)
    dx_ref = reference.dropout_backward(inp.dy, keep_ref, inp.p if active else 0.0)
    t.add("dx", dx, "element", "kernel", "backward",
          "{dy} * {keep} * {scale}" if active else "{dy}",
          note="the same mask, regenerated from (seed, k), never stored" if active else "")
    out.append(("dx", dx, dx_ref))
    return out


BUILDERS = {"rms": rms, "layer": layer, "add-rms": add_rms, "dropout": dropout}
