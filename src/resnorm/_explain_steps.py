"""The steps of each kind of explain mode (the public face is explain.py).

A builder runs the compiled kernels through the public API (resnorm.*), records on the
trace the inputs, the float64 reference intermediates and the kernel outputs, and returns
a Built: the kernel outputs to compare with resnorm.reference, the forward's cache, and
what the independent checks need (a float64 forward for finite differences, the norm's
Jacobian in closed form, the invariants).  Reference intermediates are computed from the
inputs and the reference's own statistics, never from a kernel output.
"""
from dataclasses import dataclass, field

import numpy as np

import resnorm

# Jacobians are printed for rows this short (D x D numbers per row).
JACOBIAN_MAX_D = 8


@dataclass
class Built:
    comparisons: list                 # (name, kernel value, reference value)
    cache: object = None              # the forward's cache
    cache_arrays: dict = field(default_factory=dict)   # name -> array it may refer to
    cache_why: str = ""
    forward64: object = None          # values (name -> float64 array) -> outputs
    inputs64: dict = field(default_factory=dict)       # the differentiable inputs
    fd_spread: dict = field(default_factory=dict)      # input name -> its rows' spread
    # "rms", "layer", "gated-rms": the finite-difference check also allows for its own
    # truncation error and the output's smallest subnormal, and it, the check against the
    # reference and the Jacobian's J^T dy allow for the kernel's rounding at the size of the
    # numbers it forms each gradient from (gradient name -> that size, per component)
    fd_limits: bool = False
    fd_rounding_scale: dict = field(default_factory=dict)
    upstream: dict = field(default_factory=dict)       # output name -> its gradient
    gradients: list = field(default_factory=list)      # (gradient, input name, kernel value)
    jacobian: dict | None = None
    invariants: list = field(default_factory=list)     # see _norm_invariants
    forward_invariants: list = field(default_factory=list)   # ForwardInvariant
    philox: dict | None = None


@dataclass
class ForwardInvariant:
    """A property of the forward output, checked on the kernel's outputs (explain.py turns
    it into an Invariant)."""
    name: str
    formula: str
    value: object            # per row (N,) or per group (N, G), from the kernel's outputs
    exact: object            # what exact arithmetic gives, the same shape
    note: str
    # the kernel values compared: twice their rounding is allowed for (None: none is)
    compared: object
    allowance: float = 0.0   # beyond that rounding
    # False where the expectation is the kernel's formula coded again (a definition, or
    # another kernel of the library)
    independent: bool = True


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _row_max(a):
    """The largest |a| of each row (0 for an empty selection)."""
    return np.max(np.abs(a), axis=1, initial=0.0)


def _dropout_active(inp):
    return inp.training and inp.p > 0.0


def _alpha_per(alpha):
    return "column" if np.ndim(alpha) == 1 else "scalar"


def _alpha_note(alpha):
    if not isinstance(alpha, np.ndarray):
        return "residual scale (fixed, no gradient)"
    if alpha.ndim == 0:
        return "residual scale (learnable scalar)"
    return "residual scale per channel (learnable: LayerScale)"


def _learnable(alpha):
    return isinstance(alpha, np.ndarray)


def _record_inputs(t, inp, names):
    branch = inp.kind.startswith("add-")
    n, d = inp.x.shape
    gated_norm = inp.kind == "gated-rms"
    notes = {"x": "branch output, added to the stream" if branch else
                  ("the residual stream" if inp.kind in ("scaled", "gated") else ""),
             "residual": "the residual stream", "w": "weight", "b": "bias",
             "F": "branch output (the sublayer's)", "g": "gate logits",
             "alpha": _alpha_note(inp.alpha), "p": "drop probability",
             "training": "False: dropout is the identity", "D": "row length",
             "k": "flat C-order index: the counter of the dropout mask",
             "dy": "gradient arriving at y",
             "dh": ("gradient arriving along the stream h" if branch
                    else "gradient arriving at h"),
             "z": "the gate (gate=)",
             "group_size": ("None: D, one group per row" if inp.group_size is None
                            else f"elements per group: {d // int(inp.group_size)} groups "
                                 "per row"),
             "norm_before_gate": _order_note(inp) if gated_norm else ""}
    values = {"x": inp.x, "residual": inp.residual, "w": inp.weight, "b": inp.bias,
              "F": inp.F, "g": inp.g, "alpha": inp.alpha, "p": inp.p, "seed": inp.seed,
              "training": inp.training, "eps": inp.eps, "D": d,
              "k": np.arange(n * d).reshape(n, d), "dy": inp.dy, "dh": inp.dh,
              "z": inp.gate, "norm_before_gate": inp.norm_before_gate,
              "group_size": d if inp.group_size is None else int(inp.group_size)}
    per = {"x": "element", "residual": "element", "F": "element", "k": "element",
           "dy": "element", "dh": "element", "w": "column", "b": "column", "z": "element",
           "g": "column" if inp.g is not None and inp.g.ndim == 1 else "element",
           "alpha": _alpha_per(inp.alpha)}
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
    """The gradient reaching the normalised rows and the row reduction m = mean(g * vn).
    Returns (g, m) and the formula of the gradient through the norm."""
    dy = _f64(dy)
    g = dy if weight is None else dy * weight
    t.add("g", g, "element", "reference", "backward", "{dy}" if weight is None else "{dy} * {w}",
          note=f"the gradient reaching {name}n")
    t.add(f"g_{name}n", g * vn, "element", "reference", "backward", f"{{g}} * {{{name}n}}")
    m = (g * vn).mean(axis=1)
    t.add("m", m, "row", "reference", "backward", f"{{g_{name}n}}", "mean",
          note="the one row reduction of backward")
    return g, m, f"{{rstd}} * ({{g}} - {{{name}n}} * {{m}})"


def _kernel_sums(dtype, d):
    """How the kernel sums a LayerNorm row of d elements of dtype (layer_norm.md)."""
    if np.dtype(dtype) != np.float64 and d >= 32:
        return "in float32 lanes, each added into double every 16 of its elements"
    return "in double"


def _layer_forward_steps(t, v, name, weight, bias, mean_kernel, mean_ref, rstd_kernel,
                         rstd_ref, y_kernel, dtype):
    """LayerNorm of v (called `name`, of dtype in the kernel); returns the normalised rows
    vhat (reference)."""
    v = _f64(v)
    t.add(f"sum_{name}", v.sum(axis=1), "row", "reference", "forward", f"{{{name}}}", "sum",
          note="reduction 1")
    t.add("mean", mean_kernel, "row", "kernel", "forward", f"{{sum_{name}}} / {{D}}",
          note=f"cached for backward (float64); the kernel: one pass about a shift near the "
               f"mean (two where it is far), summed {_kernel_sums(dtype, v.shape[1])}")
    centred = v - mean_ref[:, None]
    t.add("centred", centred, "element", "reference", "forward", f"{{{name}}} - {{mean}}")
    t.add("sq_dev", centred * centred, "element", "reference", "forward", "{centred}^2")
    t.add("var", (centred * centred).mean(axis=1), "row", "reference", "forward", "{sq_dev}",
          "mean", note="reduction 2: biased variance (divide by D), two-pass")
    t.add("rstd", rstd_kernel, "row", "kernel", "forward", "1 / sqrt({var} + {eps})",
          note="cached for backward (float64)")
    vhat = centred * rstd_ref[:, None]
    t.add(f"{name}hat", vhat, "element", "reference", "forward", "{centred} * {rstd}",
          note="mean 0, variance 1 (up to eps)")
    expr = f"{{{name}hat}}" + ("" if weight is None else " * {w}") + ("" if bias is None
                                                                       else " + {b}")
    t.add("y", y_kernel, "element", "kernel", "forward", expr)
    return vhat


def _layer_backward_steps(t, dy, weight, vhat, name):
    """The two row reductions of LayerNorm's backward; returns the formula of the gradient
    through the norm."""
    dy64 = _f64(dy)
    g = dy64 if weight is None else dy64 * weight
    hat = f"{name}hat"
    t.add("g", g, "element", "reference", "backward", "{dy}" if weight is None else "{dy} * {w}",
          note=f"the gradient reaching {hat}")
    t.add("mean_g", g.mean(axis=1), "row", "reference", "backward", "{g}", "mean",
          note="backward reduction 1")
    t.add(f"g_{hat}", g * vhat, "element", "reference", "backward", f"{{g}} * {{{hat}}}")
    t.add(f"mean_g_{hat}", (g * vhat).mean(axis=1), "row", "reference", "backward",
          f"{{g_{hat}}}", "mean",
          note="backward reduction 2 (computed in the same pass as reduction 1)")
    return g, f"{{rstd}} * ({{g}} - {{mean_g}} - {{{hat}}} * {{mean_g_{hat}}})"


def _mask_steps(t, inp):
    """How dropout decides which elements to keep; returns (kernel mask, reference mask,
    scale, philox map).  Only called when dropout is active."""
    n, d = inp.x.shape
    _, cache = resnorm.dropout_forward(inp.x, inp.p, seed=inp.seed, return_mask=True)
    keep_ref = resnorm.reference.dropout_mask(inp.x.shape, inp.p, inp.seed)
    if inp.p == 1.0:
        t.add("keep", cache.mask, "element", "kernel", "forward", "0", note="p = 1 keeps nothing")
        t.add("scale", 0.0, "scalar", "reference", "forward", "0", note="p = 1")
        return cache.mask, keep_ref, 0.0, None
    t.add("threshold", np.floor(inp.p * 2.0**32), "scalar", "reference", "forward",
          "floor({p} * 2^32)")
    philox = philox_map(inp.seed, n * d)
    t.add("u", philox["u"].reshape(n, d), "element", "reference", "forward",
          "philox({seed}, {k})",
          note="32-bit uniform of element k: word w of the Philox block at counter c (below)")
    t.add("keep", cache.mask, "element", "kernel", "forward", "[{u} >= {threshold}]",
          note="from the kernel (dropout_forward, return_mask=True): kept with probability 1-p")
    scale = 1.0 / (1.0 - inp.p)
    t.add("scale", scale, "scalar", "reference", "forward", "1 / (1 - {p})",
          note="inverted dropout: kept elements are scaled up, so E[output] = input")
    return cache.mask, keep_ref, scale, philox


def philox_map(seed, n):
    """Element k -> its Philox-4x32-10 block counter c = 16 * (k div 64) + k mod 16 and
    output word w = (k mod 64) div 16, under the key (seed mod 2^32, seed div 2^32); the
    uniform is word w of philox(key, (c mod 2^32, c div 2^32, 0, 0)).  Computed here from
    resnorm.reference.philox4x32_10 itself, so the map is shown, not assumed."""
    k = np.arange(n, dtype=np.uint64)
    counter = (k // np.uint64(64)) * np.uint64(16) + k % np.uint64(16)
    word = ((k % np.uint64(64)) // np.uint64(16)).astype(np.intp)
    low = np.uint64(0xFFFFFFFF)
    blocks = np.stack([counter & low, counter >> np.uint64(32), np.zeros_like(counter),
                       np.zeros_like(counter)], axis=-1)
    key = (seed & 0xFFFFFFFF, seed >> 32)
    out = resnorm.reference.philox4x32_10(blocks, key)
    return {"k": k.astype(np.int64), "counter": counter.astype(np.int64), "word": word,
            "key": key, "block": out, "u": out[np.arange(n), word]}


def _dropped_input(t, inp, active):
    """The dropout of the branch x (d = x * keep * scale); returns (keep, keep_ref, scale,
    philox, d)."""
    if active:
        keep, keep_ref, scale, philox = _mask_steps(t, inp)
        d = _f64(inp.x) * keep_ref * scale
        t.add("d", d, "element", "reference", "forward", "{x} * {keep} * {scale}",
              note="dropout(x)")
        return keep, keep_ref, scale, philox, d
    t.add("d", _f64(inp.x), "element", "reference", "forward", "{x}",
          note="dropout off (p = 0 or training=False): the identity")
    return None, np.ones(inp.x.shape, dtype=bool), 1.0, None, _f64(inp.x)


def _dalpha_step(t, alpha, dalpha, summand):
    if np.ndim(alpha) == 1:
        t.add("dalpha", dalpha, "column", "kernel", "backward", summand, "sum",
              note="summed over rows in fixed row blocks")
    else:
        t.add("dalpha", dalpha, "scalar", "kernel", "backward", summand, "sum",
              note="over rows and channels")


# --------------------------------------------------------------------------- checks' inputs

def _norm_invariants(norm, v_name, grad_name, value_rows, v64, stats, g, eps):
    """The identities the gradient through a norm satisfies, per row: the norm's output
    does not change when v is scaled (RMSNorm) or shifted and scaled (LayerNorm), so the
    gradient is orthogonal to those directions, up to the eps term.  value_rows: the
    kernel's gradient through the norm.  Each: (name, formula, kernel value, exact value,
    note, size of the summed terms)."""
    def dot(direction):
        terms = value_rows * direction
        return terms.sum(axis=1), float(np.max(np.abs(terms).sum(axis=1)))

    rstd = stats["rstd"]
    if norm == "rms":
        ms = (v64 * v64).mean(axis=1)
        value, scale = dot(v64)
        exact = rstd * (g * v64).sum(axis=1) * eps / (ms + eps)
        return [(f"{grad_name} . {v_name}", f"sum_i {grad_name}_i * {v_name}_i", value, exact,
                 f"exact: rstd * (g . {v_name}) * eps / (ms + eps); y does not change when "
                 f"{v_name} is scaled, so the gradient is orthogonal to {v_name} up to eps",
                 scale)]
    mean = stats["mean"]
    vhat = (v64 - mean[:, None]) * rstd[:, None]
    var = ((v64 - mean[:, None]) ** 2).mean(axis=1)
    total, total_scale = dot(np.ones_like(v64))
    value, scale = dot(vhat)
    exact = rstd * (g * vhat).sum(axis=1) * eps / (var + eps)
    return [(f"sum {grad_name}", f"sum_i {grad_name}_i", total, np.zeros(len(v64)),
             f"exact: 0; y does not change when a constant is added to {v_name}",
             total_scale),
            (f"{grad_name} . {v_name}hat", f"sum_i {grad_name}_i * {v_name}hat_i", value, exact,
             f"exact: rstd * (g . {v_name}hat) * eps / (var + eps); y does not change when "
             f"{v_name} - mean is scaled, so the gradient is orthogonal to {v_name}hat up to "
             f"eps", scale)]


def _norm_spread(stats):
    """The spread of each row as the norm sees it, 1 / rstd = sqrt(var + eps) (LayerNorm) or
    sqrt(ms + eps) (RMSNorm), shape (N,): never 0, and eps's scale on a constant row."""
    return 1.0 / np.asarray(stats["rstd"], dtype=np.float64)


# y(SCALE * v) against y(v): a power of two, so SCALE * v is exact in every dtype.
SCALE = 2.0


def _mean_square(norm, v64):
    """What the norm divides by before eps, from its definition: var (LayerNorm, biased) or
    ms (RMSNorm) of each row."""
    centred = v64 - v64.mean(axis=1, keepdims=True) if norm == "layer" else v64
    return (centred * centred).mean(axis=1)


def _eps_effect(spread2, eps):
    """The factor y - b grows by when v is multiplied by SCALE, exactly: xhat(SCALE v) =
    xhat(v) * sqrt((s2 + eps) / (s2 + eps / SCALE^2)), 1 up to eps / s2."""
    return np.sqrt((spread2 + eps) / (spread2 + eps / SCALE**2)) - 1.0


def _shift_of(v):
    """The constant added to v for LayerNorm's shift invariance: the power of two at most
    max |v| (1 for a zero row), so v + c loses at most about one bit."""
    top = float(np.max(np.abs(_f64(v)), initial=0.0))
    return 2.0 ** np.floor(np.log2(top)) if top > 0 else 1.0


def _forward_invariants(norm, v_name, run, inputs, v64, w, b, eps, shift_into, formed=None,
                        definition=""):
    """Properties any correct norm's output has, checked on the kernel's outputs alone:
    the normalised row (y without w and b) has mean 0 (LayerNorm) and root mean square
    sqrt(s2 / (s2 + eps)); y(2 v) = y(v) up to eps's effect; LayerNorm: y(v + c) = y(v).  The
    expectations come from the mean square or variance s2 of v and eps, never from the
    kernel's steps or the reference.

    v (called v_name) is what the norm normalises, formed by the kernel from its array
    inputs (name -> array): scaling every input by SCALE scales v by SCALE exactly, and a
    constant added to inputs[shift_into] is added to v.  v64: v from its definition, in
    float64 (`definition` says how, "" when v is an input itself).  run(inputs, w, b): the
    kernel's y.  formed(inputs): per row, a bound on the kernel's rounding of v when it
    forms v from several inputs (None: v is an input, taken as it is)."""
    spread2 = _mean_square(norm, v64)
    rounded = np.zeros(len(v64)) if formed is None else formed(inputs)
    # v rounded by up to `rounded` moves sqrt(s2) (the rms of the centred row) by as much:
    # an expectation that is a monotone function of sqrt(s2) may be anywhere in its band
    s = np.sqrt(spread2)
    low, high = np.maximum(s - rounded, 0.0) ** 2, (s + rounded) ** 2
    rstd = 1.0 / np.sqrt(low + eps)      # the largest in the band

    def band(f):
        return float(np.max(np.abs(f(high) - f(low))))
    hat_name = f"{v_name}hat" if norm == "layer" else f"{v_name}n"
    hat_kernel = run(inputs, None, None)
    hat = _f64(hat_kernel)
    args = ", ".join(inputs)
    out = []
    if norm == "layer":
        # the kernel centres v at v's size: its rounding there, times rstd, moves the mean
        centring = np.finfo(np.result_type(inputs[shift_into].dtype, np.float32)).eps * \
            _row_max(v64)
        out.append(ForwardInvariant(
            f"mean {hat_name}", f"mean_i {hat_name}_i", hat.mean(axis=1), np.zeros(len(v64)),
            "exact: 0; the norm removes the row's mean (up to the rounding of centring "
            f"{v_name})", hat_kernel,
            float(np.max((rounded + centring) * rstd))))

    def unit_rms(s2):
        return np.sqrt(s2 / (s2 + eps))
    out.append(ForwardInvariant(
        f"rms {hat_name}", f"sqrt(mean_i {hat_name}_i^2)", np.sqrt((hat * hat).mean(axis=1)),
        unit_rms(spread2),
        f"exact: sqrt(s2 / (s2 + eps)), s2 = {'var' if norm == 'layer' else 'ms'}({v_name})"
        + (f", {definition}, up to the kernel's rounding of {v_name}" if definition else "")
        + ": 1 up to eps", hat_kernel, band(unit_rms)))
    y_kernel = run(inputs, w, b)
    y = _f64(y_kernel)
    bias = 0.0 if b is None else _f64(b)
    scaled = _f64(run({k: a * np.asarray(SCALE, dtype=a.dtype) for k, a in inputs.items()},
                      w, b))
    doubled = ", ".join(f"{SCALE:g}{k}" for k in inputs)
    size = _row_max(y - bias)
    out.append(ForwardInvariant(
        f"y({doubled}) - y({args})", f"max_i |y_i({doubled}) - y_i({args})|",
        _row_max(scaled - y), size * _eps_effect(spread2, eps),
        f"exact: max_i |y_i - b_i| * (sqrt((s2 + eps) / (s2 + eps/4)) - 1): y does not change "
        f"when {v_name} is scaled, but for eps"
        + (f" (scaling {' and '.join(inputs)} scales {v_name} exactly)" if formed else ""),
        y_kernel, band(lambda s2: size * _eps_effect(s2, eps))))
    if norm == "layer":
        c = _shift_of(v64)
        a = inputs[shift_into]
        moved = {**inputs, shift_into: (_f64(a) + c).astype(a.dtype)}
        # the rounding of a + c moves each element of v by up to delta (and so does the
        # kernel's rounding of v, in each run): y moves by at most |w| * rstd * delta *
        # (2 + max |xhat|) (the centred value, and rstd through var)
        delta = float(np.max(np.abs(_f64(moved[shift_into]) - c - _f64(a)))) + float(
            np.spacing(np.max(np.abs(_f64(moved[shift_into]))))) + rounded
        if formed is not None:
            delta = delta + formed(moved)
        wmax = 1.0 if w is None else float(np.max(np.abs(_f64(w))))
        allowance = float(np.max(wmax * delta * (2.0 + _row_max(hat)) * rstd))
        shifted = args.replace(shift_into, f"{shift_into} + c")
        out.append(ForwardInvariant(
            f"y({shifted}) - y({args})", f"max_i |y_i({shifted}) - y_i({args})|, c = {c:g}",
            _row_max(_f64(run(moved, w, b)) - y), np.zeros(len(v64)),
            f"exact: 0; y does not change when a constant is added to {v_name} ("
            + (f"here: to {shift_into}; " if formed else "") + f"up to the rounding of "
            f"{shift_into} + c" + (f" and of {v_name}" if formed else "") + ")", y_kernel,
            allowance))
    return out


def _jacobian(norm, v_name, v64, w, b, eps, stats, through_norm, dy):
    """The Jacobian dy/dv of each row in closed form (reference statistics) and the
    function finite differences need, for rows of at most JACOBIAN_MAX_D elements."""
    n, d = v64.shape
    if d > JACOBIAN_MAX_D:
        return None
    w64 = np.ones(d) if w is None else _f64(w)
    eye = np.eye(d)
    closed = []
    for r in range(n):
        rstd = stats["rstd"][r]
        if norm == "rms":
            vn = v64[r] * rstd
            closed.append(w64[:, None] * rstd * (eye - np.outer(vn, vn) / d))
            formula = (f"J_ij = w_i * rstd * ([i == j] - {v_name}n_i * {v_name}n_j / D)")
        else:
            vhat = (v64[r] - stats["mean"][r]) * rstd
            closed.append(w64[:, None] * rstd * (eye - 1.0 / d - np.outer(vhat, vhat) / d))
            formula = (f"J_ij = w_i * rstd * ([i == j] - 1/D - {v_name}hat_i * "
                       f"{v_name}hat_j / D)")

    def norm_row(row, r=None):
        if norm == "rms":
            return resnorm.rms_norm(row, None if w is None else w64, eps)
        return resnorm.layer_norm(row, None if w is None else w64, None if b is None
                                  else _f64(b), eps)

    return {"of": "y", "wrt": v_name, "formula": formula, "closed": closed,
            "norm_row": norm_row, "rows": v64, "spread": _norm_spread(stats),
            "through_norm": _f64(through_norm), "dy": _f64(dy)}


# --------------------------------------------------------------------------- the norms

def rms(t, inp):
    x, w, eps = inp.x, inp.weight, inp.eps
    y, cache = resnorm.rms_norm_forward(x, w, eps)
    _record_inputs(t, inp, ["x", "w", "eps", "D", "dy"])
    y_ref, rstd_ref = resnorm.reference.rms_norm_forward(x, w, eps)
    xn = _rms_forward_steps(t, x, "x", w, cache.rstd, rstd_ref, y)
    built = Built([("y", y, y_ref), ("rstd", cache.rstd, rstd_ref)], cache, {"x": x, "w": w},
                  "backward needs xn = x * rstd: x is the input (kept by reference, no copy) "
                  "and rstd one float64 per row, so recomputing xn costs one multiply per "
                  "element instead of storing and re-reading an N x D array")
    built.forward_invariants = _forward_invariants(
        "rms", "x", lambda v, w_, b_: resnorm.rms_norm_forward(v["x"], w_, eps)[0], {"x": x},
        _f64(x), w, None, eps, "x")
    if inp.dy is None:
        return built
    dx, dw = resnorm.rms_norm_backward(inp.dy, cache)
    dx_ref, dw_ref = resnorm.reference.rms_norm_backward(inp.dy, x, w, rstd_ref)
    g, _, through = _rms_backward_steps(t, inp.dy, w, xn, "x")
    t.add("dx", dx, "element", "kernel", "backward", through)
    built.comparisons.append(("dx", dx, dx_ref))
    built.gradients.append(("dx", "x", dx))
    if w is not None:
        t.add("dw", dw, "column", "kernel", "backward", "{dy} * {xn}", "sum",
              note="summed over rows in fixed row blocks")
        built.comparisons.append(("dw", dw, dw_ref))
        built.gradients.append(("dw", "w", dw))
    x64 = _f64(x)
    built.forward64 = lambda v: {"y": resnorm.rms_norm(v["x"], v.get("w"), eps)}
    built.inputs64 = {"x": x64, "w": _f64(w)}
    built.fd_spread = {"x": _norm_spread({"rstd": rstd_ref})[:, None]}
    built.upstream = {"y": _f64(inp.dy)}
    built.jacobian = _jacobian("rms", "x", x64, w, None, eps, {"rstd": rstd_ref}, dx, inp.dy)
    # dx = rstd * (g - xn * m): rounded at the size of those terms, though they may cancel
    xn64 = x64 * rstd_ref[:, None]
    g64 = np.abs(_f64(inp.dy) * (1.0 if w is None else _f64(w)))
    _rounding_sizes(built, rstd_ref[:, None] * (
        g64 + np.abs(xn64) * np.mean(g64 * np.abs(xn64), axis=1, keepdims=True)))
    built.invariants = _norm_invariants("rms", "x", "dx", _f64(dx), x64, {"rstd": rstd_ref},
                                        g, eps)
    return built


def _rounding_sizes(built, dx_size):
    """The finite-difference, reference and Jacobian checks of dx allow for the kernel's
    rounding at dx_size, the size of the terms it forms dx from (a component the norm makes
    nearly 0, as x_0 of the row (3, 0), is a difference of numbers of that size)."""
    built.fd_limits = True
    built.fd_rounding_scale = {"dx": dx_size}
    if built.jacobian is not None:
        built.jacobian["size"] = dx_size


def layer(t, inp):
    x, w, b, eps = inp.x, inp.weight, inp.bias, inp.eps
    y, cache = resnorm.layer_norm_forward(x, w, b, eps)
    _record_inputs(t, inp, ["x", "w", "b", "eps", "D", "dy"])
    y_ref, mean_ref, rstd_ref = resnorm.reference.layer_norm_forward(x, w, b, eps)
    xhat = _layer_forward_steps(t, x, "x", w, b, cache.mean, mean_ref, cache.rstd, rstd_ref, y,
                                x.dtype)
    built = Built([("y", y, y_ref), ("mean", cache.mean, mean_ref),
                   ("rstd", cache.rstd, rstd_ref)], cache, {"x": x, "w": w},
                  "backward needs xhat = (x - mean) * rstd: x is the input (kept by "
                  "reference) and mean, rstd one float64 each per row, so recomputing xhat "
                  "costs two flops per element instead of storing and re-reading an N x D "
                  "array")
    built.forward_invariants = _forward_invariants(
        "layer", "x", lambda v, w_, b_: resnorm.layer_norm_forward(v["x"], w_, b_, eps)[0],
        {"x": x}, _f64(x), w, b, eps, "x")
    if inp.dy is None:
        return built
    dx, dw, db = resnorm.layer_norm_backward(inp.dy, cache)
    dx_ref, dw_ref, db_ref = resnorm.reference.layer_norm_backward(inp.dy, x, w, mean_ref,
                                                                   rstd_ref)
    built.comparisons.append(("dx", dx, dx_ref))
    g, through = _layer_backward_steps(t, inp.dy, w, xhat, "x")
    t.add("dx", dx, "element", "kernel", "backward", through)
    built.gradients.append(("dx", "x", dx))
    if w is not None:
        t.add("dw", dw, "column", "kernel", "backward", "{dy} * {xhat}", "sum")
        built.comparisons.append(("dw", dw, dw_ref))
        built.gradients.append(("dw", "w", dw))
    if b is not None:
        t.add("db", db, "column", "kernel", "backward", "{dy}", "sum")
        built.comparisons.append(("db", db, db_ref))
        built.gradients.append(("db", "b", db))
    x64 = _f64(x)
    stats = {"mean": mean_ref, "rstd": rstd_ref}
    built.forward64 = lambda v: {"y": resnorm.layer_norm(v["x"], v.get("w"), v.get("b"), eps)}
    built.inputs64 = {"x": x64, "w": _f64(w), "b": _f64(b)}
    built.fd_spread = {"x": _norm_spread(stats)[:, None]}
    built.upstream = {"y": _f64(inp.dy)}
    built.jacobian = _jacobian("layer", "x", x64, w, b, eps, stats, dx, inp.dy)
    # dx = rstd * (g - mean_g - xhat * mean_gxhat), likewise
    xhat64 = np.abs(x64 - mean_ref[:, None]) * rstd_ref[:, None]
    g64 = np.abs(_f64(inp.dy) * (1.0 if w is None else _f64(w)))
    _rounding_sizes(built, rstd_ref[:, None] * (
        g64 + np.mean(g64, axis=1, keepdims=True)
        + xhat64 * np.mean(g64 * xhat64, axis=1, keepdims=True)))
    built.invariants = _norm_invariants("layer", "x", "dx", _f64(dx), x64, stats, g, eps)
    return built


# --------------------------------------------------------------------------- fused add + norm

FUSED = {  # kind -> (norm, Pre-Norm?, forward, backward, reference forward, reference backward)
    "add-rms": ("rms", True, "add_rms_norm_forward", "add_rms_norm_backward"),
    "add-layer": ("layer", True, "add_layer_norm_forward", "add_layer_norm_backward"),
    "add-rms-post": ("rms", False, "add_rms_norm_post_forward", "add_rms_norm_post_backward"),
    "add-layer-post": ("layer", False, "add_layer_norm_post_forward",
                       "add_layer_norm_post_backward"),
}


def _fused_forward(kind, eps, p, seed, training):
    """The fused forward as a function of its arrays (name -> array: x, residual, and w, b,
    alpha when given), in their dtype."""
    norm, prenorm, fwd_name, _ = FUSED[kind]
    fwd = getattr(resnorm, fwd_name)

    def forward(v):
        extra = () if norm == "rms" else (v.get("b"),)
        outputs, _ = fwd(v["x"], v["residual"], v.get("w"), *extra, eps,
                         alpha=v.get("alpha", 1.0), p=p, seed=seed, training=training)
        return {"y": outputs[0], "h": outputs[1]} if prenorm else {"y": outputs}
    return forward


# The fused kernels form h = residual + alpha * dropout(x) in at most four roundings (of
# 1 / (1 - p), of its product with x, of the product with alpha, of the sum), each within
# eps(dtype) / 2 of the size of what it rounds: within FORMED_ULPS * eps(dtype) *
# (|residual_i| + |alpha * d_i|) of the exact h.
FORMED_ULPS = 2


def _add_norm_invariants(inp, forward, h, kept):
    """The fused add + norm's forward invariants: the norm's (_forward_invariants) of
    h = residual + alpha * d, d = x * kept (kept: the keep-mask times 1 / (1 - p), from
    Philox by the reference, as the step d), which scaling x and residual by 2 scales and a
    constant added to residual shifts; and, Pre-Norm, the kernel's h against its definition
    (not independent: the formula itself).  forward: the fused forward of arrays."""
    norm, prenorm = FUSED[inp.kind][:2]
    alpha = _f64(inp.alpha)
    h64 = _f64(inp.residual) + alpha * _f64(inp.x) * kept
    unit = np.finfo(inp.x.dtype).eps

    def formed(arrays):
        size = np.abs(_f64(arrays["residual"])) + np.abs(alpha * _f64(arrays["x"]) * kept)
        return FORMED_ULPS * unit * np.max(size, axis=1)

    def run(arrays, w, b):
        return forward({**arrays, "w": w, "b": b, "alpha": inp.alpha})["y"]

    inputs = {"x": inp.x, "residual": inp.residual}
    out = _forward_invariants(norm, "h", run, inputs, h64, inp.weight, inp.bias, inp.eps,
                              "residual", formed, "h = residual + alpha * d in float64")
    if prenorm:
        out.insert(0, ForwardInvariant(
            "h - (residual + alpha d)", "max_i |h_i - (residual_i + alpha * d_i)|",
            _row_max(_f64(h) - h64), np.zeros(len(h64)),
            f"exact: 0 up to the kernel's rounding, {FORMED_ULPS} * eps(dtype) * max_i "
            "(|residual_i| + |alpha * d_i|): h is the stream plus the scaled branch by "
            "definition, coded again in float64", None, float(np.max(formed(inputs))),
            independent=False))
    return out


def add_norm(t, inp):
    """Pre-Norm (h = residual + alpha * dropout(x), y = norm(h); both returned) and
    Post-Norm (y = norm(residual + alpha * dropout(x)); h stays inside)."""
    norm, prenorm, fwd_name, bwd_name = FUSED[inp.kind]
    x, res, w, b, eps, alpha = inp.x, inp.residual, inp.weight, inp.bias, inp.eps, inp.alpha
    kw = dict(alpha=alpha, p=inp.p, seed=inp.seed, training=inp.training)
    bias_arg = () if norm == "rms" else (b,)
    outputs, cache = getattr(resnorm, fwd_name)(x, res, w, *bias_arg, eps, **kw)
    active = _dropout_active(inp)
    _record_inputs(t, inp, ["x", "residual", "w", "b", "alpha", "p", "seed", "training", "eps",
                            "D"] + (["k"] if active else []) + ["dy", "dh"])
    y, h = outputs if prenorm else (outputs, None)
    ref_fwd = getattr(resnorm.reference, fwd_name)
    ref = ref_fwd(x, res, w, *bias_arg, eps, **kw)
    y_ref, h_ref, keep_ref_fwd = ref[0], ref[1], ref[-1]
    stats_ref = {"rstd": ref[2]} if norm == "rms" else {"mean": ref[2], "rstd": ref[3]}
    comparisons = [("y", y, y_ref)] + ([("h", h, h_ref)] if prenorm else [])
    if norm == "layer":
        comparisons.append(("mean", cache.mean, stats_ref["mean"]))
    comparisons.append(("rstd", cache.rstd, stats_ref["rstd"]))

    keep, keep_ref, scale, philox, d = _dropped_input(t, inp, active)
    if active:
        comparisons.append(("keep", keep, keep_ref))
    if prenorm:
        t.add("h", h, "element", "kernel", "forward", "{residual} + {alpha} * {d}",
              note="the new residual stream")
    else:
        t.add("h", h_ref, "element", "reference", "forward", "{residual} + {alpha} * {d}",
              note="Post-Norm: not an output; backward recomputes it row by row")
    if norm == "rms":
        vn = _rms_forward_steps(t, h_ref, "h", w, cache.rstd, stats_ref["rstd"], y)
    else:
        vn = _layer_forward_steps(t, h_ref, "h", w, b, cache.mean, stats_ref["mean"],
                                  cache.rstd, stats_ref["rstd"], y, np.asarray(inp.x).dtype)
    why = ("h is an output anyway (kept by reference: no extra memory) and the norm's "
           "statistics are one float64 per row" if prenorm else
           "x and residual are kept by reference and h is recomputed in backward: no N x D "
           "buffer lives between the passes") + \
          "; the dropout mask is regenerated from (seed, k), never stored" + \
          ("; x is kept only because alpha is learnable (dalpha needs dropout(x))"
           if prenorm and _learnable(alpha) else "")
    arrays = {"x": x, "residual": res, "w": w, "h": h, "alpha": alpha}
    built = Built(comparisons, cache, arrays, why, philox=philox)
    forward = _fused_forward(inp.kind, eps, inp.p, inp.seed, inp.training)
    built.forward_invariants = _add_norm_invariants(inp, forward, h, keep_ref * scale)
    if inp.dy is None:
        return built

    dh = inp.dh if prenorm else None
    grads = getattr(resnorm, bwd_name)(*((inp.dy, dh, cache) if prenorm else (inp.dy, cache)))
    ref_bwd = getattr(resnorm.reference, bwd_name)
    stats_list = [stats_ref["rstd"]] if norm == "rms" else [stats_ref["mean"],
                                                              stats_ref["rstd"]]
    ref_args = ((inp.dy, dh) if prenorm else (inp.dy,)) + (x, h_ref, w, *stats_list, alpha,
                                                            keep_ref_fwd,
                                                            inp.p if active else 0.0)
    refs = ref_bwd(*ref_args)
    dx, dres, dw = grads[0], grads[1], grads[2]
    db = grads[3] if norm == "layer" else None
    dalpha = grads[-1]
    dx_ref, dres_ref, dw_ref = refs[0], refs[1], refs[2]
    db_ref = refs[3] if norm == "layer" else None
    dalpha_ref = refs[-1]

    if norm == "rms":
        g, _, through = _rms_backward_steps(t, inp.dy, w, vn, "h")
        m = (g * vn).mean(axis=1)
        through_value = stats_ref["rstd"][:, None] * (g - vn * m[:, None])
    else:
        g, through = _layer_backward_steps(t, inp.dy, w, vn, "h")
        through_value = stats_ref["rstd"][:, None] * (
            g - g.mean(axis=1, keepdims=True) - vn * (g * vn).mean(axis=1, keepdims=True))
    gh = through_value if dh is None else _f64(dh) + through_value
    t.add("gh", gh, "element", "reference", "backward",
          ("" if dh is None else "{dh} + ") + through,
          note="the gradient reaching h: through the norm" +
               ("" if dh is None else " plus along the stream"))
    t.add("dresidual", dres, "element", "kernel", "backward", "{gh}",
          note="the skip path passes gh unchanged")
    t.add("dx", dx, "element", "kernel", "backward",
          "{gh} * {alpha} * {keep} * {scale}" if active else "{gh} * {alpha}",
          note="the same mask, regenerated from (seed, k)" if active else "")
    built.comparisons += [("dx", dx, dx_ref), ("dresidual", dres, dres_ref)]
    built.gradients += [("dx", "x", dx), ("dresidual", "residual", dres)]
    hat = "hn" if norm == "rms" else "hhat"
    if w is not None:
        t.add("dw", dw, "column", "kernel", "backward", f"{{dy}} * {{{hat}}}", "sum")
        built.comparisons.append(("dw", dw, dw_ref))
        built.gradients.append(("dw", "w", dw))
    if b is not None:
        t.add("db", db, "column", "kernel", "backward", "{dy}", "sum")
        built.comparisons.append(("db", db, db_ref))
        built.gradients.append(("db", "b", db))
    if _learnable(alpha):
        _dalpha_step(t, alpha, dalpha, "{gh} * {d}")
        built.comparisons.append(("dalpha", dalpha, dalpha_ref))
        built.gradients.append(("dalpha", "alpha", dalpha))

    built.forward64 = forward
    built.inputs64 = {"x": _f64(x), "residual": _f64(res), "w": _f64(w), "b": _f64(b),
                      "alpha": _f64(alpha) if _learnable(alpha) else alpha}
    # x reaches the norm as alpha * dropout(x): the row's spread of h is the scale for both
    spread = _norm_spread(stats_ref)[:, None]
    built.fd_spread = {"x": spread, "residual": spread}
    built.upstream = {"y": _f64(inp.dy)}
    if prenorm and dh is not None:
        built.upstream["h"] = _f64(dh)
    # the kernel's gradient through the norm alone: dresidual minus what came along h
    through_kernel = _f64(dres) - (0.0 if dh is None else _f64(dh))
    built.jacobian = _jacobian(norm, "h", h_ref, w, b, eps, stats_ref, through_kernel, inp.dy)
    name = "dresidual" if dh is None else "(dresidual - dh)"
    built.invariants = _norm_invariants(norm, "h", name, through_kernel, h_ref, stats_ref, g,
                                        eps)
    return built


# --------------------------------------------------------------------------- dropout

def _dropout_invariants(run, x, y, keep, scale, active):
    """Inverted dropout's output from x, the kernel's keep-mask and its scale 1 / (1 - p)
    alone (no Philox): kept elements scaled, dropped ones 0, and y(2x) = 2 y(x) (the mask
    depends on the seed and the position, never on the values).  run(x): the kernel's y;
    active: False when dropout is off (all kept, scale 1)."""
    x64, y64 = _f64(x), _f64(y)
    doubled = run(x * np.asarray(SCALE, dtype=x.dtype))
    kept = ("exact: 0; each kept element is scaled by 1 / (1 - p), so that E[y] = x (the "
            "mask: keep, as the kernel returns it)" if active else
            "exact: 0; dropout off (p = 0 or training=False): every element kept, unscaled")
    return [
        ForwardInvariant("kept", "max_{i kept} |y_i - x_i" + (" / (1 - p)|" if active else "|"),
                         _row_max(np.where(keep, y64 - x64 * scale, 0.0)), np.zeros(len(x64)),
                         kept, y),
        ForwardInvariant("dropped", "max_{i dropped} |y_i|",
                         _row_max(np.where(keep, 0.0, y64)), np.zeros(len(x64)),
                         "exact: 0; each dropped element is 0", y),
        ForwardInvariant("y(2x) - 2y(x)", "max_i |y_i(2x) - 2 y_i(x)|",
                         _row_max(_f64(doubled) - SCALE * y64), np.zeros(len(x64)),
                         "exact: 0; the mask depends on the seed and the element's position, "
                         "not on x", np.concatenate([y, doubled]))]


def dropout(t, inp):
    x = inp.x
    y, cache = resnorm.dropout_forward(x, inp.p, seed=inp.seed, training=inp.training)
    active = _dropout_active(inp)
    _record_inputs(t, inp, ["x", "p", "seed", "training"] + (["k"] if active else []) + ["dy"])
    y_ref, keep_ref = resnorm.reference.dropout_forward(x, inp.p, inp.seed, inp.training)
    built = Built([("y", y, y_ref)], cache, {"x": x},
                  "only p, seed and the shape: backward regenerates the mask from "
                  "(seed, k), so nothing of size N x D is kept between the passes")
    if active:
        keep, keep_check, scale, built.philox = _mask_steps(t, inp)
        built.comparisons.append(("keep", keep, keep_check))
        t.add("y", y, "element", "kernel", "forward", "{x} * {keep} * {scale}")
    else:
        keep, scale = np.ones(x.shape, dtype=bool), 1.0
        t.add("y", y, "element", "kernel", "forward", "{x}",
              note="p = 0 or training=False: the identity")
    built.forward_invariants = _dropout_invariants(
        lambda v: resnorm.dropout_forward(v, inp.p, seed=inp.seed, training=inp.training)[0],
        x, y, keep, scale, active)
    if inp.dy is None:
        return built
    dx = resnorm.dropout_backward(inp.dy, cache)
    dx_ref = resnorm.reference.dropout_backward(inp.dy, keep_ref, inp.p if active else 0.0)
    t.add("dx", dx, "element", "kernel", "backward",
          "{dy} * {keep} * {scale}" if active else "{dy}",
          note="the same mask, regenerated from (seed, k), never stored" if active else "")
    built.comparisons.append(("dx", dx, dx_ref))
    built.gradients.append(("dx", "x", dx))
    p, seed, training = inp.p, inp.seed, inp.training
    built.forward64 = lambda v: {"y": resnorm.dropout(v["x"], p, seed=seed, training=training)}
    built.inputs64 = {"x": _f64(x)}
    built.upstream = {"y": _f64(inp.dy)}
    return built


# --------------------------------------------------------------------------- scaled, gated

def _skip_and_branch(t, built, dx, dF, dF_expr):
    """dx = dh (the skip path) and dF, each a (kernel, reference) pair."""
    t.add("dx", dx[0], "element", "kernel", "backward", "{dh}",
          note="the skip path: the identity (a new array, not dh itself)")
    t.add("dF", dF[0], "element", "kernel", "backward", dF_expr)
    built.comparisons += [("dx", *dx), ("dF", *dF)]
    built.gradients += [("dx", "x", dx[0]), ("dF", "F", dF[0])]


def _residual_invariants(run, x, F, h, factor):
    """h = x + factor * F from the kernel's outputs alone, whatever the factor (alpha, or
    the gate): the skip path is the identity, the branch enters linearly, and scaling both
    inputs scales h.  run(x, F): the kernel's h, the factor fixed."""
    x64, h64 = _f64(x), _f64(h)
    two = np.asarray(SCALE, dtype=x.dtype)
    no_branch = run(x, np.zeros_like(F))
    branch_doubled = run(x, F * two)
    both_doubled = run(x * two, F * two)
    return [
        ForwardInvariant("h(x, 0) - x", "max_i |h_i(x, 0) - x_i|", _row_max(
            _f64(no_branch) - x64), np.zeros(len(x64)),
            "exact: 0; without a branch the skip path passes x unchanged", no_branch),
        ForwardInvariant(
            "h(x, 2F) - x - 2(h - x)", "max_i |h_i(x, 2F) - x_i - 2 (h_i - x_i)|",
            _row_max(_f64(branch_doubled) - x64 - SCALE * (h64 - x64)), np.zeros(len(x64)),
            f"exact: 0; the branch enters linearly, {factor} * F (up to the rounding of each h)",
            np.concatenate([h, branch_doubled])),
        ForwardInvariant("h(2x, 2F) - 2h", "max_i |h_i(2x, 2F) - 2 h_i|",
                         _row_max(_f64(both_doubled) - SCALE * h64), np.zeros(len(x64)),
                         "exact: 0; scaling both inputs by 2 scales h by 2", both_doubled)]


def scaled(t, inp):
    x, F, alpha = inp.x, inp.F, inp.alpha
    h, cache = resnorm.scaled_residual_forward(x, F, alpha)
    _record_inputs(t, inp, ["x", "F", "alpha", "D", "dh"])
    h_ref = resnorm.reference.scaled_residual_forward(x, F, alpha)
    t.add("h", h, "element", "kernel", "forward", "{x} + {alpha} * {F}")
    built = Built([("h", h, h_ref)], cache, {"x": x, "F": F, "alpha": alpha},
                  "alpha, and F by reference only when alpha is learnable (dalpha = "
                  "sum dh * F); with a fixed alpha backward needs no array at all")
    built.forward_invariants = _residual_invariants(
        lambda x_, F_: resnorm.scaled_residual_forward(x_, F_, alpha)[0], x, F, h, "alpha")
    if inp.dh is None:
        return built
    dx, dF, dalpha = resnorm.scaled_residual_backward(inp.dh, cache)
    dx_ref, dF_ref, dalpha_ref = resnorm.reference.scaled_residual_backward(inp.dh, F, alpha)
    _skip_and_branch(t, built, (dx, dx_ref), (dF, dF_ref), "{alpha} * {dh}")
    if _learnable(alpha):
        _dalpha_step(t, alpha, dalpha, "{dh} * {F}")
        built.comparisons.append(("dalpha", dalpha, dalpha_ref))
        built.gradients.append(("dalpha", "alpha", dalpha))
    built.forward64 = lambda v: {"h": resnorm.scaled_residual(v["x"], v["F"], v["alpha"])}
    built.inputs64 = {"x": _f64(x), "F": _f64(F),
                      "alpha": _f64(alpha) if _learnable(alpha) else alpha}
    built.upstream = {"h": _f64(inp.dh)}
    return built


def gated(t, inp):
    x, F, g = inp.x, inp.F, inp.g
    h, cache = resnorm.gated_residual_forward(x, F, g)
    _record_inputs(t, inp, ["x", "F", "g", "D", "dh"])
    h_ref = resnorm.reference.gated_residual_forward(x, F, g)
    per = "column" if g.ndim == 1 else "element"
    e = np.exp(-np.abs(_f64(g)))
    t.add("e", e, per, "reference", "forward", "exp(-|{g}|)", note="at most 1")
    t.add("s", resnorm.reference.sigmoid(g), per, "reference", "forward",
          "1 / (1 + exp(-{g}))", note="sigmoid(g) in double: 1/(1+e) for g >= 0, e/(1+e) "
                                      "below, so exp never overflows")
    t.add("h", h, "element", "kernel", "forward", "{x} + {s} * {F}")
    why = "F and g by reference: dg needs both"
    if cache.s is not None:
        why += ("; a per-channel gate keeps sigmoid(g) and its derivative as (D,) vectors "
                "instead, computed once per call")
    built = Built([("h", h, h_ref)], cache, {"x": x, "F": F, "g": g}, why)

    def run(x_, F_, g_=g):
        return resnorm.gated_residual_forward(x_, F_, g_)[0]
    mirrored = run(x, F, -g)
    built.forward_invariants = _residual_invariants(run, x, F, h, "sigmoid(g)") + [
        ForwardInvariant("h(g) + h(-g) - 2x - F", "max_i |h_i(g) + h_i(-g) - 2 x_i - F_i|",
                         _row_max(_f64(h) + _f64(mirrored) - 2 * _f64(x) - _f64(F)),
                         np.zeros(len(x)), "exact: 0; sigmoid(g) + sigmoid(-g) = 1: a gate and "
                         "its mirror share F between them", np.concatenate([h, mirrored, F]))]
    if inp.dh is None:
        return built
    dx, dF, dg = resnorm.gated_residual_backward(inp.dh, cache)
    dx_ref, dF_ref, dg_ref = resnorm.reference.gated_residual_backward(inp.dh, F, g)
    t.add("ds", resnorm.reference.sigmoid_grad(g), per, "reference", "backward",
          "{e} / (1 + {e})^2", note="s * (1 - s), without the cancellation of 1 - s")
    _skip_and_branch(t, built, (dx, dx_ref), (dF, dF_ref), "{s} * {dh}")
    if per == "column":
        t.add("dg", dg, "column", "kernel", "backward", "{dh} * {F} * {ds}", "sum",
              note="summed over rows in fixed row blocks")
    else:
        t.add("dg", dg, "element", "kernel", "backward", "{dh} * {F} * {ds}")
    built.comparisons.append(("dg", dg, dg_ref))
    built.gradients.append(("dg", "g", dg))
    built.forward64 = lambda v: {"h": resnorm.gated_residual(v["x"], v["F"], v["g"])}
    built.inputs64 = {"x": _f64(x), "F": _f64(F), "g": _f64(g)}
    # g enters through sigmoid, which bends over about one unit of g whatever g's spread
    built.fd_spread = {"g": 1.0}
    built.upstream = {"h": _f64(inp.dh)}
    return built


# --------------------------------------------------------------------------- gated RMSNorm

def _order_note(inp):
    if inp.gate is None:
        return "no gate: either order is the grouped RMSNorm of x"
    if inp.norm_before_gate:
        return "True: x is normalised, then gated (Qwen3-Next)"
    return "False: the gate multiplies x before the norm (Mamba2)"


def _grouped(a, gs):
    """(N, D) rows as (N, G, gs): each group of gs consecutive elements on its own axis."""
    return a.reshape(a.shape[0], -1, gs)


def _group_mean(a, gs):
    """The mean over each group, (N, G)."""
    return _grouped(a, gs).mean(axis=-1)


def _to_elements(v, gs):
    """A per-group value (N, G) at each element of its group, (N, D)."""
    return np.repeat(v, gs, axis=1)


def _group_max(a, gs):
    return np.max(_grouped(a, gs), axis=-1)


# y(c x) against y(x): each group's x scaled by its own power of two (exact in every dtype),
# so a norm that mixes the groups' statistics moves y
GROUP_SCALES = (2.0, 0.5)


def _gated_forward_invariants(run, x, z, w, eps, gs, gate_first):
    """The properties any correct gated RMSNorm has, per group, checked on the kernel's
    outputs: the normalised groups' root mean square, y(c x) = y(x) up to eps's effect and,
    without a gate, y = rms_norm of each group.  The expectations come from the inputs (the
    gated row u = x * silu(z) by its definition, in float64) and eps."""
    x64 = _f64(x)
    v64 = x64 * resnorm.reference.silu(_f64(z)) if gate_first else x64
    ms = _group_mean(v64 * v64, gs)
    hat_name, v_name = ("un", "u") if gate_first else ("xn", "x")
    hat_kernel = run(x, z if gate_first else None, None)
    hat = _f64(hat_kernel)
    out = [ForwardInvariant(
        f"rms {hat_name}", f"sqrt(mean_{{i in k}} {hat_name}_i^2)",
        np.sqrt(_group_mean(hat * hat, gs)), np.sqrt(ms / (ms + eps)),
        f"exact: sqrt(ms / (ms + eps)), ms = mean_{{i in k}} {v_name}_i^2"
        + (" (u = x * silu(z) from the inputs, in float64)" if gate_first else "")
        + ": 1 up to eps, 0 for a zero group", hat_kernel)]
    y_kernel = run(x, z, w)
    y = _f64(y_kernel)
    n_groups = x.shape[1] // gs
    c = np.array([GROUP_SCALES[k % 2] for k in range(n_groups)])
    scaled = _f64(run(x * _to_elements(c[None, :], gs).astype(x.dtype), z, w))
    effect = np.abs(np.sqrt((ms + eps) / (ms + eps / c**2)) - 1.0)
    scales = "c = 2" if n_groups == 1 else "c = 2 in even groups k, 1/2 in odd ones"
    out.append(ForwardInvariant(
        "y(cx) - y(x)", f"max_{{i in k}} |y_i(c x) - y_i(x)|, {scales}",
        _group_max(np.abs(scaled - y), gs), _group_max(np.abs(y), gs) * effect,
        "exact: max_{i in k} |y_i| * |sqrt((ms + eps) / (ms + eps/c^2)) - 1|: y of a group "
        f"does not change when its {v_name} is scaled" + (" (here: its x)" if gate_first else "")
        + ", but for eps; nor when another group is", y_kernel))
    if z is None:
        w_ = None if w is None else np.asarray(w)
        rms = np.concatenate([
            resnorm.rms_norm_forward(np.ascontiguousarray(x[:, k * gs:(k + 1) * gs]),
                                     None if w_ is None else w_[k * gs:(k + 1) * gs],
                                     eps)[0] for k in range(n_groups)], axis=1)
        out.append(ForwardInvariant(
            "y - rms_norm", "max_{i in k} |y_i - rms_norm(x_k, w_k)_i|",
            _group_max(np.abs(y - _f64(rms)), gs), np.zeros((len(x64), n_groups)),
            "exact: 0; without a gate, each group's y is the RMSNorm of its slice "
            "(resnorm.rms_norm_forward on x_k and w_k)", y_kernel, independent=False))
    return out


def _gated_jacobian(x64, z64, w, gs, gate_first, rstd_ref, spread_x, run_row, dx, dy):
    """dy/dx of each row in closed form (block diagonal: one block per group), for rows of
    at most JACOBIAN_MAX_D elements; see _jacobian."""
    n, d = x64.shape
    if d > JACOBIAN_MAX_D:
        return None
    w64 = np.ones(d) if w is None else _f64(w)
    a = None if z64 is None else resnorm.reference.silu(z64)
    v = x64 * a if gate_first else x64
    same = np.kron(np.eye(d // gs), np.ones((gs, gs)))     # [j in i's group]
    closed = []
    for r in range(n):
        rstd = np.repeat(rstd_ref[r], gs)
        vn = v[r] * rstd
        jac = (w64 * rstd)[:, None] * same * (np.eye(d) - np.outer(vn, vn) / gs)
        if a is not None:
            jac = jac * a[r][None, :] if gate_first else a[r][:, None] * jac
        closed.append(jac)
    hat = "un" if gate_first else "xn"
    size = "D" if gs == d else "group_size"
    core = f"w_i * rstd_k * ([i == j] - {hat}_i * {hat}_j / {size})"
    formula = ("J_ij = " + (f"{core} * a_j" if gate_first else
                            f"a_i * {core}" if a is not None else core)
               + ("" if gs == d else ", k = i's group, for j in group k; 0 for j in another"))
    return {"of": "y", "wrt": "x", "formula": formula, "closed": closed, "norm_row": run_row,
            "rows": x64, "spread": spread_x, "through_norm": _f64(dx), "dy": _f64(dy)}


def gated_rms(t, inp):
    """The gated RMSNorm, gate before the norm (u = x * silu(z), y = rms_norm(u) * w) or
    after it (y = rms_norm(x) * w * silu(z)), per group; without a gate the grouped
    RMSNorm of x."""
    x, z, w, eps, before = inp.x, inp.gate, inp.weight, inp.eps, inp.norm_before_gate
    kw = dict(group_size=inp.group_size, norm_before_gate=before)
    y, cache = resnorm.gated_rms_norm_forward(x, z, w, eps, **kw)
    n, d = x.shape
    # from the arguments (which the kernel has checked), never from its outputs
    gs = d if inp.group_size is None else int(inp.group_size)
    gate_first = z is not None and not before
    _record_inputs(t, inp, ["x", "z", "w", "eps", "group_size", "norm_before_gate", "D",
                            "dy"])
    y_ref, ref_cache = resnorm.reference.gated_rms_norm_forward(x, z, w, eps, **kw)
    rstd = np.asarray(cache.rstd).reshape(n, -1)
    x64, z64 = _f64(x), _f64(z)
    a = None if z is None else resnorm.reference.silu(z64)

    def gate_steps():
        t.add("s", resnorm.reference.sigmoid(z64), "element", "reference", "forward",
              "1 / (1 + exp(-{z}))", note="sigmoid(z), in double (exp never overflows)")
        t.add("a", a, "element", "reference", "forward", "{z} * {s}",
              note="silu(z): the gate's factor")

    if gate_first:
        gate_steps()
        v, v_name, hat = x64 * a, "u", "un"
        t.add("u", v, "element", "reference", "forward", "{x} * {a}",
              note="the gated row: what is normalised")
    else:
        v, v_name, hat = x64, "x", "xn"
    # the statistics as resnorm.reference computes them (compared with the kernel's below)
    rstd_ref = 1.0 / np.sqrt(_group_mean(v * v, gs) + eps)
    t.add("ms", _group_mean(v * v, gs), "group", "reference", "forward", f"{{{v_name}}}^2",
          "mean", note=f"mean square of group k (element i is in group i div {gs}): the one "
                       "reduction per group (the kernel accumulates it in double)")
    t.add("rstd", rstd, "group", "kernel", "forward", "1 / sqrt({ms} + {eps})",
          note="cached for backward: one float64 per group of each row")
    vn = v * _to_elements(rstd_ref, gs)
    t.add(hat, vn, "element", "reference", "forward", f"{{{v_name}}} * {{rstd}}",
          note="each group normalised: root mean square 1 (up to eps)")
    if z is not None and before:
        gate_steps()
    t.add("y", y, "element", "kernel", "forward",
          f"{{{hat}}}" + ("" if w is None else " * {w}")
          + (" * {a}" if z is not None and before else ""))
    why = ("x and the gate by reference, and one float64 rstd per group of each row: "
           "backward recomputes " + ("sigmoid(z), silu(z) and u = x * silu(z)" if gate_first
                                     else "sigmoid(z) and silu(z)")
           + " from the rows it reads anyway, instead of storing and re-reading an N x D "
           "array" if z is not None else
           "x by reference and one float64 rstd per group of each row: backward recomputes "
           "xn = x * rstd, one multiply per element, instead of storing an N x D array")
    built = Built([("y", y, y_ref), ("rstd", rstd, ref_cache["rstd"].reshape(n, -1))], cache,
                  {"x": x, "z": z, "w": w}, why)

    def run(v_, z_, w_):
        return resnorm.gated_rms_norm_forward(v_, z_, w_, eps, **kw)[0]
    built.forward_invariants = _gated_forward_invariants(run, x, z, w, eps, gs, gate_first)
    if inp.dy is None:
        return built

    dx, dgate, dw = resnorm.gated_rms_norm_backward(inp.dy, cache)
    dx_ref, dgate_ref, dw_ref = resnorm.reference.gated_rms_norm_backward(inp.dy, ref_cache)
    dy64 = _f64(inp.dy)
    w64 = None if w is None else _f64(w)

    def gate_derivative_steps():
        t.add("ds", resnorm.reference.sigmoid_grad(z64), "element", "reference", "backward",
              "{s} * (1 - {s})", note="sigmoid'(z), formed without the cancellation of 1 - s")
        t.add("da_dz", resnorm.reference.silu_grad(z64), "element", "reference", "backward",
              "{s} + {z} * {ds}", note="silu'(z)")

    if z is not None and before:
        gate_derivative_steps()
        t.add("dgate", dgate, "element", "kernel", "backward",
              "{dy} * {xn}" + ("" if w is None else " * {w}") + " * {da_dz}",
              note="y = (xn * w) * a: dy times the normalised output, times silu'(z)")
        upstream, up_name = dy64 * a, "dyn"
        t.add("dyn", upstream, "element", "reference", "backward", "{dy} * {a}",
              note="the gradient reaching xn * w")
    else:
        upstream, up_name = dy64, "dy"
    g = upstream if w is None else upstream * w64
    t.add("g", g, "element", "reference", "backward",
          f"{{{up_name}}}" + ("" if w is None else " * {w}"), note=f"the gradient reaching {hat}")
    t.add(f"g_{hat}", g * vn, "element", "reference", "backward", f"{{g}} * {{{hat}}}")
    m = _group_mean(g * vn, gs)
    t.add("m", m, "group", "reference", "backward", f"{{g_{hat}}}", "mean",
          note="the one reduction per group of backward")
    through = f"{{rstd}} * ({{g}} - {{{hat}}} * {{m}})"
    if gate_first:
        t.add("du", _to_elements(rstd_ref, gs) * (g - vn * _to_elements(m, gs)), "element",
              "reference", "backward", through,
              note="RMSNorm's backward: the gradient reaching u")
        t.add("dx", dx, "element", "kernel", "backward", "{du} * {a}", note="u = x * a")
        gate_derivative_steps()
        t.add("dgate", dgate, "element", "kernel", "backward", "{du} * {x} * {da_dz}",
              note="u = x * a(z)")
    else:
        t.add("dx", dx, "element", "kernel", "backward", through)
    built.comparisons.append(("dx", dx, dx_ref))
    built.gradients.append(("dx", "x", dx))
    if z is not None:
        built.comparisons.append(("dgate", dgate, dgate_ref))
        built.gradients.append(("dgate", "z", dgate))
    if w is not None:
        t.add("dw", dw, "column", "kernel", "backward", f"{{{up_name}}} * {{{hat}}}", "sum",
              note="summed over rows in fixed row blocks")
        built.comparisons.append(("dw", dw, dw_ref))
        built.gradients.append(("dw", "w", dw))

    built.forward64 = lambda vals: {"y": resnorm.gated_rms_norm(
        vals["x"], vals.get("z"), vals.get("w"), eps, **kw)}
    built.inputs64 = {"x": x64, "z": z64, "w": w64}
    # finite-difference steps: what the norm normalises bends at its group's sqrt(ms + eps);
    # x reaches it times a (gate first), the gate z times x * silu'(z) (and z bends sigmoid
    # over about one unit)
    spread_v = _to_elements(_norm_spread({"rstd": rstd_ref}), gs)
    spread_x = spread_v
    if gate_first:
        # (where a is too small to divide by, y hardly depends on x_i: any moderate step)
        big = np.abs(a) > 1e-150
        spread_x = np.where(big, spread_v / np.where(big, np.abs(a), 1.0),
                            np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True)) + spread_v)
        slope = np.abs(x64) * (np.abs(resnorm.reference.silu_grad(z64)) + 0.5)
        built.fd_spread["z"] = np.minimum(1.0, spread_v / np.where(slope > 0, slope, 1.0))
    elif z is not None:
        built.fd_spread["z"] = 1.0
    built.fd_spread["x"] = spread_x
    built.upstream = {"y": dy64}
    # the kernel forms dx (and dgate) from rstd * (g - vn * m): their rounding is at the size
    # of those numbers, though the difference may be nearly 0; silu'(z) = s + z * ds likewise
    rstd_at = _to_elements(rstd_ref, gs)
    part = rstd_at * (np.abs(g) + np.abs(vn) * _to_elements(_group_mean(np.abs(g * vn), gs),
                                                            gs))
    built.jacobian = _gated_jacobian(
        x64, z64, w, gs, gate_first, rstd_ref, spread_x,
        lambda row, r: resnorm.gated_rms_norm(row, None if z is None else z64[r:r + 1], w64,
                                              eps, **kw), dx, inp.dy)
    _rounding_sizes(built, part * np.abs(a) if gate_first else part)
    if z is not None:
        s64, ds64 = resnorm.reference.sigmoid(z64), resnorm.reference.sigmoid_grad(z64)
        slope_size = np.abs(s64) + np.abs(z64 * ds64)
        if gate_first:
            du = rstd_at * (g - vn * _to_elements(m, gs))
            built.fd_rounding_scale["dgate"] = np.abs(x64) * (part + np.abs(du)) * slope_size
        else:
            built.fd_rounding_scale["dgate"] = np.abs(
                dy64 * vn * (1.0 if w is None else w64)) * slope_size
    # y of a group does not change when its x is scaled: sum_{i in k} dx_i x_i is the eps term
    terms = _f64(dx) * x64
    ms = _group_mean(v * v, gs)
    built.invariants = [(
        "dx . x", "sum_{i in k} dx_i * x_i", _grouped(terms, gs).sum(axis=-1),
        rstd_ref * _grouped(g * v, gs).sum(axis=-1) * eps / (ms + eps),
        f"exact: rstd_k * (g . {v_name})_k * eps / (ms_k + eps); y of a group does not change "
        f"when its x{' (so its u)' if gate_first else ''} is scaled, so the gradient is "
        "orthogonal to x, group by group, up to eps",
        float(np.max(_grouped(np.abs(terms), gs).sum(axis=-1))))]
    return built


BUILDERS = {"rms": rms, "layer": layer, "add-rms": add_norm, "add-layer": add_norm,
            "add-rms-post": add_norm, "add-layer-post": add_norm, "dropout": dropout,
            "scaled": scaled, "gated": gated, "gated-rms": gated_rms}
