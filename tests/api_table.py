"""The public kernel functions as one table, for the table-driven reliability tests.

Each entry of OPS says how to call one public function on a set of inputs, what it
returns, and what its float64 twin in resnorm.reference returns, with a tolerance built
from the size of the terms each output is made of (never from the result itself, which
may be a cancellation to ~0).

test_input_table fails while a public function of resnorm is missing here, so a new
kernel is covered by every table-driven test once it has an entry: input checks,
properties, threads, memory, extreme numerics.
"""
import dataclasses
import inspect
import math

import numpy as np

import resnorm
from resnorm import reference as ref

DTYPES = (np.float32, np.float64)

# Tolerance relative to the size of the terms: float64 kernels and reference differ only
# in summation order; float32 rounds every element operation to 2**-24.
RTOL = {np.dtype(np.float32): 4e-6, np.dtype(np.float64): 1e-12}

# The arguments that are arrays (alpha is one when it is learnable); the others are eps,
# p, seed, training and the gated RMSNorm's group_size and norm_before_gate.
ARRAY_ARGS = ("x", "residual", "F", "g", "gate", "weight", "bias", "alpha", "dy", "dh")


@dataclasses.dataclass
class Inputs:
    """The arguments of one call of any public function; each function takes those its
    Op.args name.  weight / bias / dh may be None; eps None means the function's default;
    alpha None means a fixed 1 (a float: fixed; a 0-d or (D,) array: learnable)."""
    x: np.ndarray
    weight: np.ndarray = None
    bias: np.ndarray = None
    dy: np.ndarray = None
    eps: float = None
    residual: np.ndarray = None   # fused add + norm: the residual stream
    dh: np.ndarray = None         # the gradient of h (Pre-Norm: along the residual stream)
    F: np.ndarray = None          # scaled / gated residual: the branch
    g: np.ndarray = None          # gated residual: the gate logits, F's shape or (D,)
    alpha: object = None
    p: float = 0.0
    seed: int = 0
    training: bool = True
    normalized_shape: tuple = None  # the norms: the normalised trailing axes (None: the last)
    zero_centered_weight: bool = False
    gate: np.ndarray = None       # gated RMSNorm: the gate logits, x's shape
    group_size: int = None        # gated RMSNorm: elements per group (None: the row)
    norm_before_gate: bool = False

    @property
    def axes(self):
        """How many trailing axes of x a norm's row spans."""
        return 1 if self.normalized_shape is None else len(self.normalized_shape)

    @property
    def dtype(self):
        return np.asarray(self.x).dtype

    def arrays(self):
        """name -> array, for the arrays that are set."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), np.ndarray)}


def make_inputs(rng, shape, dtype, weight=True, bias=True, scale=1.0, offset=0.0,
                alpha="channel", p=0.2, gate="full", axes=1, zero_centered_weight=False):
    """Random inputs for every function: x (and residual) of magnitude scale around offset,
    F of magnitude scale, O(1) parameters and gradients.  alpha: 'channel' (in [0.5, 1]),
    'scalar' (0-d), 'fixed' (0.75) or None; gate: 'full' or 'channel'.  axes: the norms
    normalise the last `axes` axes (normalized_shape; None for 1), and weight, bias and a
    'channel' alpha have their shape (which the scaled residual takes only for axes=1).
    zero_centered_weight: the weight is then a deviation around 0 (the gain 1 + w).
    The gated RMSNorm's gate logits are uniform in [-4, 1.25], where |silu| < 1, so that
    its u = x * silu(gate) stays within the range of x; they come from a generator of
    their own (seeded from rng's draws), so rng's stream is what it was without them."""
    d = shape[-1]
    row = tuple(shape[len(shape) - axes:])
    w = (1.0 + 0.5 * rng.standard_normal(row)) - (1.0 if zero_centered_weight else 0.0)
    inp = Inputs(
        x=(offset + scale * rng.standard_normal(shape)).astype(dtype),
        weight=w.astype(dtype) if weight else None,
        bias=rng.standard_normal(row).astype(dtype) if bias else None,
        dy=rng.standard_normal(shape).astype(dtype),
        normalized_shape=row if axes > 1 else None, zero_centered_weight=zero_centered_weight)
    inp.residual = (offset + scale * rng.standard_normal(shape)).astype(dtype)
    inp.dh = rng.standard_normal(shape).astype(dtype)
    inp.F = (scale * rng.standard_normal(shape)).astype(dtype)
    inp.g = rng.standard_normal(shape if gate == "full" else d).astype(dtype)
    a = 0.5 + 0.5 * rng.uniform(size=row)
    inp.alpha = {"channel": a.astype(dtype), "scalar": np.array(a.flat[0], dtype), "fixed": 0.75,
                 None: None}[alpha]
    inp.p, inp.seed = p, int(rng.integers(0, 2**63))
    inp.gate = np.random.default_rng(inp.seed).uniform(-4.0, 1.25, shape).astype(dtype)
    return inp


def layouts(a):
    """Arrays with a's values, none of them C-contiguous, aligned and writeable."""
    raw = np.zeros(a.nbytes + 1, np.uint8)
    misaligned = np.frombuffer(raw.data, a.dtype, a.size, offset=1).reshape(a.shape)
    misaligned[...] = a
    read_only = a.copy()
    read_only.setflags(write=False)
    views = {"strided": np.repeat(a, 2, axis=-1)[..., ::2],
             "negative_strides": a[::-1].copy()[::-1],
             "misaligned": misaligned, "read_only": read_only}
    if a.ndim > 1:
        views["fortran"] = np.asfortranarray(a)
    return views


@dataclasses.dataclass(frozen=True)
class Op:
    """One public function.

    family: the reference it is checked against ('rms', 'ln', 'add_rms', 'add_ln',
    'add_rms_post', 'add_ln_post', 'scaled', 'gated', 'gated_rms', 'dropout'); form: 'inference'
    (returns the outputs), 'training' (returns the outputs and a cache) or 'backward' (of
    the training form `forward`, given its cache); args: the Inputs fields it takes;
    returns: the names of the arrays it returns, in order (training forms: besides the
    cache, whose row statistics are outputs too); kept: training forms, the arguments the
    cache keeps for backward (out= must not overlap them)."""
    name: str
    family: str
    form: str
    args: tuple
    returns: tuple
    forward: str = None
    kept: tuple = ()

    @property
    def fn(self):
        return getattr(resnorm, self.name)

    @property
    def norm(self):
        """'rms', 'ln', or None for the residual and dropout functions without a norm."""
        words = self.family.split("_")
        return "rms" if "rms" in words else "ln" if "ln" in words else None

    @property
    def post(self):
        return self.family.endswith("_post")

    @property
    def fused(self):
        return self.family.startswith("add_")

    @property
    def stats(self):
        """The row statistics the training form caches, as outputs."""
        return {"rms": ("rstd",), "ln": ("mean", "rstd"), None: ()}[self.norm]

    @property
    def data(self):
        """The arguments of the forward computation that carry the data (not parameters)."""
        return {"scaled": ("x", "F"), "gated": ("x", "F")}.get(
            self.family, ("x", "residual") if self.fused else ("x",))

    @property
    def arrays(self):
        """The array arguments a caller passes (the cache is not one)."""
        return tuple(a for a in self.args if a in ARRAY_ARGS)

    @property
    def partners(self):
        """The array arguments that must match x (or, in backward, the forward input)."""
        return tuple(a for a in self.arrays if a != "x")

    @property
    def parameters(self):
        return tuple(inspect.signature(self.fn).parameters)

    @property
    def output(self):
        """Name of the array out= receives."""
        if self.form == "backward":
            return "dx"
        return "h" if self.family in ("scaled", "gated") else "y"

    @property
    def buffers(self):
        """The output buffer arguments, and what each receives."""
        dgate = "dgate" if self.family == "gated_rms" else "dg"
        return {b: t for b, t in (("out", self.output), ("residual_out", "h"),
                                  ("dresidual_out", "dresidual"), ("dbranch_out", "dF"),
                                  ("dgate_out", dgate))
                if b in self.parameters}

    def adapt(self, inp):
        """inp as this op takes it: an op with a weight but no normalized_shape (the gated
        RMSNorm) gets, for inputs drawn for a norm over several axes, the weight's first
        (D,) row (a view, in the weight's layout), and no norm options."""
        args = OPS[self.forward].args if self.form == "backward" else self.args
        if "weight" not in args or "normalized_shape" in args or inp.axes == 1:
            return inp
        w = inp.weight
        return dataclasses.replace(
            inp, weight=None if w is None else w[(0,) * (w.ndim - 1)],
            normalized_shape=None, zero_centered_weight=False)

    def default_eps(self):
        fn = OPS[self.forward].fn if self.form == "backward" else self.fn
        return inspect.signature(fn).parameters["eps"].default

    def forward_kwargs(self, inp):
        kw = {}
        for a in self.args:
            value = getattr(inp, a)
            if a == "eps" and value is None:
                continue
            kw[a] = 1.0 if a == "alpha" and value is None else value
        return kw

    def kwargs(self, inp, **extra):
        """Keyword arguments of a valid call on inp (backward: its cache is made here by
        the training form, with the same n_threads), plus extra (out=, n_threads=...)."""
        if self.form != "backward":
            return {**self.forward_kwargs(inp), **extra}
        fwd = OPS[self.forward]
        nt = {"n_threads": extra["n_threads"]} if "n_threads" in extra else {}
        _, cache = fwd.fn(**fwd.forward_kwargs(inp), **nt)
        return {**{a: getattr(inp, a) for a in self.args}, "cache": cache, **extra}

    def call(self, inp, **extra):
        """The raw return value of one call."""
        return self.fn(**self.kwargs(inp, **extra))

    def outputs(self, result):
        """The raw return value as name -> array (None for a gradient not computed)."""
        cache = None
        if self.form == "training":
            result, cache = result
        arrays = result if isinstance(result, tuple) else (result,)
        out = dict(zip(self.returns, arrays, strict=True))
        if cache is not None:  # one statistic per row, in the rows' shape
            lead = arrays[0].shape[:arrays[0].ndim - getattr(cache, "axes", 1)]
            # the gated RMSNorm: one per group, (..., G) for several groups a row
            groups = arrays[0].shape[-1] // getattr(cache, "group_size", arrays[0].shape[-1])
            lead += (groups,) if groups > 1 else ()
            out.update({s: getattr(cache, s).reshape(lead) for s in self.stats})
        return out

    def run(self, inp, **extra):
        return self.outputs(self.call(inp, **extra))

    def outputs_names(self):
        return self.returns + (self.stats if self.form == "training" else ())

    def reference(self, inp):
        """name -> (float64 expected value, tolerance) for every output of run()."""
        forward = OPS[self.forward] if self.form == "backward" else self
        eps = forward.default_eps() if inp.eps is None and "eps" in forward.args else inp.eps
        want = _REFERENCES[self.family.replace("_post", "")](self, inp, eps)
        return {name: want[name] for name in self.outputs_names()}


# --------------------------------------------------------------------------- norms

def norm_reference(kind, x, w, b, dy, eps, dtype):
    """RMSNorm ('rms') or LayerNorm ('ln') of float64 x, with the tolerances of a kernel of
    dtype: ({name: (value, tol)} for y, rstd (, mean) and with dy dx, dweight (, dbias)),
    and |xhat|, the normalised values' magnitudes.

    Valid over the whole float64 range: float64 rows beyond 2**400 (where x**2 may
    overflow) are computed one at a time on u = x * 2**-e, which is exact, and scaled back:
        y(x, eps) = y(u, eps * 2**-2e),  rstd(x) = 2**-e rstd(u),  mean(x) = 2**e mean(u),
        dx(x) = 2**-e dx(u),  dweight and dbias (sums over rows) unchanged.
    """
    d = x.shape[-1]
    rows, dy_rows = x.reshape(-1, d), None if dy is None else dy.reshape(-1, d)
    big = np.zeros(rows.shape[0], bool)
    if np.dtype(dtype) == np.float64 and rows.size:
        big = np.max(np.abs(rows), axis=-1) > 2.0**400
    groups = [(np.flatnonzero(~big), 0)] + [
        ([i], int(np.frexp(np.max(np.abs(rows[i])))[1])) for i in np.flatnonzero(big)]
    parts = []
    for index, e in groups:
        if len(index) == 0 and len(groups) > 1:
            continue
        part, xhat = _norm_terms(kind, np.ldexp(rows[index], -e), w, b,
                                 None if dy is None else dy_rows[index],
                                 np.ldexp(eps, -2 * e), dtype)
        parts.append((index, e, part, xhat))
    out = {}
    for name in parts[0][2]:
        if parts[0][2][name][0] is None:
            out[name] = (None, None)
        elif name in _UNSCALE:  # per row: stacked back in the input's order
            elementwise = name in ("y", "dx")
            per_row = (rows.shape[0], d) if elementwise else (rows.shape[0],)
            value, tol = np.empty(per_row), np.empty(per_row)
            for index, e, part, _ in parts:
                v, t = part[name]
                value[index] = np.ldexp(v, _UNSCALE[name] * e)
                tol[index] = np.broadcast_to(np.ldexp(t, _UNSCALE[name] * e), v.shape)
            shape = x.shape if elementwise else x.shape[:-1]
            out[name] = (value.reshape(shape), tol.reshape(shape))
        else:  # dweight, dbias: sums over rows, and so are their tolerances
            out[name] = tuple(sum(part[name][k] for _, _, part, _ in parts) for k in (0, 1))
    xhat = np.empty(rows.shape)
    for index, _, _, xh in parts:
        xhat[index] = xh
    return out, xhat.reshape(x.shape)


# how each per-row output scales when its row is multiplied by 2**e
_UNSCALE = {"y": 0, "rstd": -1, "mean": 1, "dx": -1}


def _norm_terms(kind, x, w, b, dy, eps, dtype):
    """norm_reference on (N, D) rows whose squares fit the double range."""
    if kind == "rms":
        y, rstd = ref.rms_norm_forward(x, w, eps)
        xhat = np.abs(x * rstd[..., None])
        return _with_tolerances(x, w, None, dy, dtype, {"y": y, "rstd": rstd}, xhat, rstd,
                                lambda: dict(zip(("dx", "dweight"),
                                                 ref.rms_norm_backward(dy, x, w, rstd)))), xhat
    y, mean, rstd = ref.layer_norm_forward(x, w, b, eps)
    r = rstd[..., None]
    d = x.shape[-1]
    # The kernel's and the reference's means are both double sums, each off by a few ulps
    # of max|x| (32-lane sum / pairwise sum); every xhat then shifts by that times rstd.
    # A mean off by delta also adds delta^2 to the variance: rstd moves by delta^2 rstd^3 / 2.
    slack = (d / 32 + math.log2(d) + 10) * np.finfo(np.float64).eps * _rowmax(x) * r
    xhat = np.abs((x - mean[..., None]) * r)
    rstd_slack = 0.5 * slack[..., 0] ** 2 * rstd

    def backward():
        dx, dw, db = ref.layer_norm_backward(dy, x, w, mean, rstd)
        return {"dx": dx, "dweight": dw, "dbias": None if b is None else db}

    return _with_tolerances(x, w, b, dy, dtype, {"y": y, "mean": mean, "rstd": rstd},
                            xhat + slack / RTOL[np.dtype(dtype)], rstd, backward,
                            rstd_slack), xhat


def _with_tolerances(x, w, b, dy, dtype, forward, xhat, rstd, backward, rstd_slack=0.0):
    """name -> (value, tolerance) for the outputs of a norm whose normalised values have
    magnitude xhat (|x * rstd| for RMSNorm, |(x - mean) * rstd| for LayerNorm).

    Tolerance: RTOL times the size of the terms the output is made of, plus a floor for
    results on the subnormal grid, where every rounding is off by up to one step sub of
    the element type: x - mean (amplified by rstd), the products, the sums over rows."""
    d = x.shape[-1]
    rtol = RTOL[np.dtype(dtype)]
    sub = float(np.finfo(dtype).smallest_subnormal)
    r = rstd[..., None]
    w1 = np.ones(d) if w is None else np.abs(w)
    b_max = 0.0 if b is None else np.max(np.abs(b))
    n_rows = x.size // d if d else 0
    out = {"y": (forward["y"], rtol * (_rowmax(xhat * w1) + b_max)
                 + 4 * sub * (1 + r) * (1 + np.max(w1))),
           "rstd": (forward["rstd"], rtol * rstd + rstd_slack)}
    if "mean" in forward:
        out["mean"] = (forward["mean"], rtol * _rowmax(x)[..., 0])
    if dy is None:
        return out
    grads = backward()
    g = _rowmax(dy * w1)
    # dx = rstd * (g - [mean(g)] - xhat * mean(g*xhat)): terms up to rstd*|g|*(1 + xhat^2)
    out["dx"] = (grads["dx"], rtol * r * g * (1 + _rowmax(xhat) ** 2)
                 + 4 * sub * (1 + r) ** 2 * (1 + g) * (1 + _rowmax(xhat)))
    row_floor = 4 * sub * n_rows * (1 + np.max(rstd, initial=0.0)) * (1 + np.max(np.abs(dy), initial=0.0))
    dw = grads["dweight"]
    out["dweight"] = (dw, None if dw is None else rtol * _colsum(np.abs(dy) * xhat) + row_floor)
    if "dbias" in grads:
        db = grads["dbias"]
        out["dbias"] = (db, None if db is None else rtol * _colsum(np.abs(dy)) + row_floor)
    return out


def _rows_of(inp):
    """(flatten, unflatten) for a norm's rows: arrays with the last inp.axes axes as one,
    and results back in the input's shapes (elementwise: x's; per row: its lead axes;
    parameter gradients: normalized_shape)."""
    k, shape = inp.axes, np.shape(inp.x)
    lead, row = shape[:len(shape) - k], shape[len(shape) - k:]

    def flatten(a):
        if a is None:
            return None
        n = np.ndim(a) - k
        return np.reshape(a, np.shape(a)[:n] + (math.prod(np.shape(a)[n:]),))

    def unflatten(want):
        back = {}
        for name, (value, tol) in want.items():
            if value is not None and name in ELEMENTWISE_OUTPUTS:
                value, tol = value.reshape(shape), np.broadcast_to(tol, value.shape).reshape(shape)
            elif value is not None and name not in ROW_OUTPUTS and np.ndim(value) == 1:
                value, tol = value.reshape(row), np.broadcast_to(tol, value.shape).reshape(row)
            elif value is not None and name in ROW_OUTPUTS:
                value, tol = value.reshape(lead), np.broadcast_to(tol, value.shape).reshape(lead)
            back[name] = (value, tol)
        return back
    return flatten, unflatten


def _norm_reference(op, inp, eps):
    flat, back = _rows_of(inp)
    want, _ = norm_reference(op.norm, flat(_f64(inp.x)),
                             flat(ref.gain(inp.weight, inp.zero_centered_weight)),
                             flat(_f64(inp.bias)) if op.norm == "ln" else None,
                             flat(_f64(inp.dy)), eps, inp.dtype)
    return back(want)


# --------------------------------------------------------------------------- fused add + norm

def _fused_reference(op, inp, eps):
    """The composition of reference steps that resnorm.reference.add_*_norm_* are made of
    (dropout, add, norm, and back), with the norm step valid over the whole float64 range.

    Tolerance: the norm's, around the float64 h, plus how far the kernel's h may be from
    it: h = r + alpha * (x * m) rounded in the input dtype, off by dh <= RTOL * (|r| +
    |alpha x m|) (plus a subnormal step).  Through the norm (rowmax E of dh):
      y: |w| rstd (dh + (1 + |xhat|) E);  rstd: 2 rstd^2 E;  mean: E;
      gradient reaching h: 4 rstd^2 max|g| (1 + max|xhat|)^2 E;  dweight: sum |dy| rstd E (2 + max|xhat|).
    """
    dtype = inp.dtype
    rtol, sub = RTOL[dtype], float(np.finfo(dtype).smallest_subnormal)
    flat, back = _rows_of(inp)
    x, r, dy = flat(_f64(inp.x)), flat(_f64(inp.residual)), flat(_f64(inp.dy))
    alpha = 1.0 if inp.alpha is None else flat(inp.alpha) if np.ndim(inp.alpha) else inp.alpha
    a = _f64(alpha) if isinstance(alpha, np.ndarray) else float(alpha)
    d, keep = ref.dropout_forward(x, inp.p, inp.seed, inp.training)
    m = ref.dropout_forward(np.ones_like(x), inp.p, inp.seed, inp.training)[0]  # multipliers
    h = r + a * d
    w = flat(ref.gain(inp.weight, inp.zero_centered_weight))
    b = flat(_f64(inp.bias)) if op.norm == "ln" else None
    norm, xhat = norm_reference(op.norm, h, w, b, dy, eps, dtype)
    err_h = rtol * (np.abs(r) + np.abs(a * d)) + 4 * sub
    E = _rowmax(err_h)
    rstd = norm["rstd"][0][..., None]
    w1 = np.ones(h.shape[-1]) if w is None else np.abs(w)
    out = {"h": (h, err_h),
           "y": (norm["y"][0], norm["y"][1] + w1 * rstd * (err_h + (1 + xhat) * E)),
           "rstd": (norm["rstd"][0], norm["rstd"][1] + 2 * rstd[..., 0] * (rstd * E)[..., 0])}
    if "mean" in norm:
        out["mean"] = (norm["mean"][0], norm["mean"][1] + E[..., 0])
    if dy is None:
        return back(out)
    g, xh = _rowmax(np.abs(dy) * w1), _rowmax(xhat)
    gh, gh_tol = norm["dx"]
    gh_tol = gh_tol + 4 * rstd * (rstd * E) * g * (1 + xh) ** 2
    gh_terms = rstd * g * (1 + xh ** 2)        # the size of the norm backward's terms
    dh = None if op.post else flat(_f64(inp.dh))
    if dh is not None:
        gh, gh_tol, gh_terms = gh + dh, gh_tol + rtol * np.abs(dh), gh_terms + np.abs(dh)
    out["dresidual"] = (gh, gh_tol)
    # dx = (gh * alpha) * m and dalpha = sum gh * (x * m), products of the rounded gh
    gh_err = gh_tol + rtol * gh_terms
    out["dx"] = (a * gh * m, gh_err * np.abs(a) * m + 4 * sub)
    dw, dw_tol = norm["dweight"]
    out["dweight"] = (dw, None if dw is None else
                      dw_tol + _colsum(np.abs(dy) * (rstd * E) * (2 + xh)))
    out["dbias"] = norm.get("dbias", (None, None))
    out["dalpha"] = (None, None)
    if isinstance(alpha, np.ndarray):
        # (x * m on the subnormal grid is off by up to a step, which gh multiplies)
        out["dalpha"] = (ref.sum_like(gh * d, alpha),
                         ref.sum_like(gh_err * np.abs(d) + 4 * sub * (1 + gh_terms), alpha))
    return back(out)


# --------------------------------------------------------------------------- elementwise

def _scaled_reference(op, inp, eps):
    """h = x + alpha F, dF = alpha dh, dalpha = sum dh F: RTOL of the terms, and a
    subnormal step per rounding."""
    rtol, sub = RTOL[inp.dtype], float(np.finfo(inp.dtype).smallest_subnormal)
    x, F, dh = _f64(inp.x), _f64(inp.F), _f64(inp.dh)
    alpha = 1.0 if inp.alpha is None else inp.alpha
    a = _f64(alpha) if isinstance(alpha, np.ndarray) else float(alpha)
    dx, dF, da = ref.scaled_residual_backward(dh, F, a)
    learnable = isinstance(alpha, np.ndarray)
    return {"h": (ref.scaled_residual_forward(x, F, a), rtol * (np.abs(x) + np.abs(a * F)) + 4 * sub),
            "dx": (dx, rtol * np.abs(dh)),
            "dF": (dF, rtol * np.abs(dF) + 4 * sub),
            "dalpha": (da, ref.sum_like(rtol * np.abs(dh * F) + 4 * sub, alpha))
            if learnable else (None, None)}


def _gated_reference(op, inp, eps):
    """h = x + s F, dF = s dh, dg = dh F s(1-s) (summed over rows for a (D,) g), s = sigmoid(g)."""
    rtol, sub = RTOL[inp.dtype], float(np.finfo(inp.dtype).smallest_subnormal)
    x, F, g, dh = _f64(inp.x), _f64(inp.F), _f64(inp.g), _f64(inp.dh)
    s, ds = ref.sigmoid(g), ref.sigmoid_grad(g)
    dx, dF, dg = ref.gated_residual_backward(dh, F, g)
    if g.shape == x.shape:  # dh * ds, on the subnormal grid off by up to a step, times F
        dg_tol = rtol * np.abs(dh * F * ds) + 4 * sub * (1 + np.abs(F))
    else:  # sum_rows dh * F in double, of products rounded in the input dtype, times ds
        n_rows = x.size // x.shape[-1]
        dg_tol = ds * (rtol * _colsum(np.abs(dh * F)) + n_rows * sub) + 4 * sub
    return {"h": (ref.gated_residual_forward(x, F, g), rtol * (np.abs(x) + np.abs(s * F)) + 4 * sub),
            "dx": (dx, rtol * np.abs(dh)), "dF": (dF, rtol * np.abs(dF) + 4 * sub),
            "dg": (dg, dg_tol)}


def _gated_rms_reference(op, inp, eps):
    """The gated RMSNorm (resnorm.reference.gated_rms_norm_*), with the norm step valid over
    the whole float64 range: norm_reference on the groups as rows, without a weight (the
    gradient it is given is the one reaching the normalised rows times w).

    Tolerance: the norm's, and what the gate adds.  Gate before the norm: the kernel's
    u = x * silu(z) is off by du <= RTOL |u| (plus a subnormal step), which goes through the
    norm as the fused functions' h does (group max E of du); dx = du * a and
    dgate = du * x * silu'(z) add RTOL of their terms.  Norm before the gate: the gradient
    entering the norm, dy * a * w, is off by RTOL of itself, which RTOL of the norm's
    terms again covers; y and dgate are products of a few rounded factors.
    """
    dtype = inp.dtype
    rtol, sub = RTOL[dtype], float(np.finfo(dtype).smallest_subnormal)
    shape = np.shape(inp.x)
    d = shape[-1]
    gs = d if inp.group_size is None else int(inp.group_size)
    groups = d // gs
    x = _f64(inp.x).reshape(-1, d)
    n = x.shape[0]
    z = None if inp.gate is None else _f64(inp.gate).reshape(-1, d)
    w = _f64(inp.weight)
    w1 = np.ones(d) if w is None else np.abs(w)
    dy = None if inp.dy is None else _f64(inp.dy).reshape(-1, d)
    before = bool(inp.norm_before_gate) and z is not None

    def rows(a):       # (n, d) -> one row per group
        return a.reshape(n * groups, gs)

    def back(a):       # one row per group -> (n, d)
        return a.reshape(n, d)

    def spread(a):     # one value per group -> each of its elements, (n, d)
        return np.repeat(np.reshape(a, (n, groups)), gs, axis=1)

    def group_max(a):  # (n, d) -> max |a| of each group, spread
        return spread(_rowmax(rows(a)))

    a = None if z is None else ref.silu(z)
    # |silu'| is at most |s| + |z ds|: the size of its terms
    da_dz, da_terms = (None, None) if z is None else (
        ref.silu_grad(z), ref.sigmoid(z) + np.abs(z) * ref.sigmoid_grad(z))
    v = x if a is None or before else x * a        # the rows normalised (u, or x)
    dyn = None if dy is None else (dy * a if before else dy)   # reaching xn * w
    gw = None if dy is None else (dyn if w is None else dyn * w)
    norm, vn_abs = norm_reference("rms", rows(v), None, None,
                                  None if dy is None else rows(gw), eps, dtype)
    un, un_tol = back(norm["y"][0]), back(norm["y"][1])
    rstd, rstd_tol = norm["rstd"]
    r, xh = spread(rstd), back(vn_abs)
    gated_first = a is not None and not before
    err_u = rtol * np.abs(v) + 4 * sub if gated_first else np.zeros_like(v)
    E = group_max(err_u)
    y = un if w is None else un * w
    y_tol = un_tol * (1 + w1) + w1 * r * (err_u + (1 + xh) * E)
    if before:
        y, y_tol = y * a, y_tol * np.abs(a) + 2 * rtol * np.abs(y * a) + 4 * sub
    stat_shape = shape[:-1] + ((groups,) if groups > 1 else ())
    out = {"y": (y.reshape(shape), y_tol.reshape(shape)),
           "rstd": (rstd.reshape(stat_shape),
                    (rstd_tol + 2 * rstd * (rstd * _rowmax(rows(err_u))[:, 0])).reshape(stat_shape))}
    if dy is None:
        return out
    dv, dv_tol = back(norm["dx"][0]), back(norm["dx"][1])
    g, xm = group_max(gw), group_max(xh)
    dv_terms = r * g * (1 + xm ** 2)                # the size of the norm backward's terms
    dv_err = dv_tol + 4 * r * (r * E) * g * (1 + xm) ** 2 + rtol * dv_terms
    dgate = (None, None)
    if gated_first:
        dx, dx_tol = dv * a, dv_err * np.abs(a) + 4 * sub
        dgate = (dv * x * da_dz, dv_err * np.abs(x * da_dz)
                 + rtol * np.abs(dv * x) * da_terms + 4 * sub * (1 + np.abs(x)))
    else:
        dx, dx_tol = dv, dv_err
        if before:
            dgate = (dy * (un if w is None else un * w) * da_dz,
                     (un_tol + 2 * rtol * np.abs(un)) * np.abs(dy) * w1 * da_terms + 4 * sub)
    out["dx"] = (dx.reshape(shape), dx_tol.reshape(shape))
    out["dgate"] = tuple(None if t is None else t.reshape(shape) for t in dgate)
    out["dweight"] = (None, None)
    if w is not None:
        row_floor = 4 * sub * n * (1 + np.max(rstd, initial=0.0)) * (1 + np.max(np.abs(dyn), initial=0.0))
        un_err = r * (err_u + (1 + xh) * E) + (un_tol if before else 0.0)
        out["dweight"] = (_colsum(dyn * un), 2 * rtol * _colsum(np.abs(dyn * un))
                          + _colsum(np.abs(dyn) * un_err) + row_floor)
    return out


def _dropout_reference(op, inp, eps):
    """y = x m, dx = dy m (m = keep / (1 - p)): one rounding each."""
    rtol, sub = RTOL[inp.dtype], float(np.finfo(inp.dtype).smallest_subnormal)
    y, _ = ref.dropout_forward(_f64(inp.x), inp.p, inp.seed, inp.training)
    m = ref.dropout_forward(np.ones(inp.x.shape), inp.p, inp.seed, inp.training)[0]
    out = {"y": (y, rtol * np.abs(y) + 4 * sub)}
    if inp.dy is not None:
        dx = _f64(inp.dy) * m
        out["dx"] = (dx, rtol * np.abs(dx) + 4 * sub)
    return out


_REFERENCES = {"rms": _norm_reference, "ln": _norm_reference, "add_rms": _fused_reference,
               "add_ln": _fused_reference, "scaled": _scaled_reference,
               "gated": _gated_reference, "gated_rms": _gated_rms_reference,
               "dropout": _dropout_reference}


def _f64(a):
    return None if a is None else np.asarray(a, np.float64)


def _rowmax(a):
    """max |a| over the last axis, kept as a length-1 axis (0 for empty rows)."""
    if a.shape[-1] == 0 or a.size == 0:
        return np.zeros(a.shape[:-1] + (1,))
    return np.max(np.abs(a), axis=-1, keepdims=True)


def _colsum(a):
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


# --------------------------------------------------------------------------- the table

# The norms' options (the norms and the fused add + norm take them)
NORM_OPTIONS = ("normalized_shape", "zero_centered_weight")


def _fused_ops(kind, post):
    name = ("add_rms_norm" if kind == "rms" else "add_layer_norm") + ("_post" if post else "")
    family = f"add_{kind}" + ("_post" if post else "")
    params = ("weight",) if kind == "rms" else ("weight", "bias")
    args = ("x", "residual") + params + ("eps",) + NORM_OPTIONS + ("alpha", "p", "seed",
                                                                  "training")
    returns = ("y",) if post else ("y", "h")
    grads = ("dx", "dresidual", "dweight") + (("dbias",) if kind == "ln" else ()) + ("dalpha",)
    kept = ("x",) + (("residual",) if post else ()) + ("weight", "alpha")
    return [Op(name, family, "inference", args, returns),
            Op(name + "_forward", family, "training", args, returns, kept=kept),
            Op(name + "_backward", family, "backward", ("dy",) if post else ("dy", "dh"), grads,
               forward=name + "_forward")]


RMS_ARGS = ("x", "weight", "eps") + NORM_OPTIONS
LN_ARGS = ("x", "weight", "bias", "eps") + NORM_OPTIONS
GATED_RMS_ARGS = ("x", "gate", "weight", "eps", "group_size", "norm_before_gate")
OPS = {op.name: op for op in [
    Op("rms_norm", "rms", "inference", RMS_ARGS, ("y",)),
    Op("rms_norm_forward", "rms", "training", RMS_ARGS, ("y",), kept=("x", "weight")),
    Op("rms_norm_backward", "rms", "backward", ("dy",), ("dx", "dweight"),
       forward="rms_norm_forward"),
    Op("layer_norm", "ln", "inference", LN_ARGS, ("y",)),
    Op("layer_norm_forward", "ln", "training", LN_ARGS, ("y",), kept=("x", "weight", "bias")),
    Op("layer_norm_backward", "ln", "backward", ("dy",), ("dx", "dweight", "dbias"),
       forward="layer_norm_forward"),
    *_fused_ops("rms", post=False), *_fused_ops("ln", post=False),
    *_fused_ops("rms", post=True), *_fused_ops("ln", post=True),
    Op("scaled_residual", "scaled", "inference", ("x", "F", "alpha"), ("h",)),
    Op("scaled_residual_forward", "scaled", "training", ("x", "F", "alpha"), ("h",),
       kept=("F", "alpha")),
    Op("scaled_residual_backward", "scaled", "backward", ("dh",), ("dx", "dF", "dalpha"),
       forward="scaled_residual_forward"),
    Op("gated_residual", "gated", "inference", ("x", "F", "g"), ("h",)),
    Op("gated_residual_forward", "gated", "training", ("x", "F", "g"), ("h",), kept=("F", "g")),
    Op("gated_residual_backward", "gated", "backward", ("dh",), ("dx", "dF", "dg"),
       forward="gated_residual_forward"),
    Op("gated_rms_norm", "gated_rms", "inference", GATED_RMS_ARGS, ("y",)),
    Op("gated_rms_norm_forward", "gated_rms", "training", GATED_RMS_ARGS, ("y",),
       kept=("x", "gate", "weight")),
    Op("gated_rms_norm_backward", "gated_rms", "backward", ("dy",), ("dx", "dgate", "dweight"),
       forward="gated_rms_norm_forward"),
    Op("dropout", "dropout", "inference", ("x", "p", "seed", "training"), ("y",)),
    Op("dropout_forward", "dropout", "training", ("x", "p", "seed", "training"), ("y",)),
    Op("dropout_backward", "dropout", "backward", ("dy",), ("dx",), forward="dropout_forward"),
]}
FORWARDS = [name for name, op in OPS.items() if op.form != "backward"]
BACKWARDS = [name for name, op in OPS.items() if op.form == "backward"]
TRAINING = [name for name, op in OPS.items() if op.form == "training"]
INFERENCE = [name for name, op in OPS.items() if op.form == "inference"]

# Public callables that take no array (build and runtime facts): nothing to check.
NO_ARRAY_FUNCTIONS = {"build_flags", "get_num_threads", "openmp_enabled", "simd_level"}

# Outputs with one value per row (the rest are elementwise, or sums over rows: dweight,
# dbias, dalpha, and dg for a per-channel gate).
ROW_OUTPUTS = ("mean", "rstd")
ELEMENTWISE_OUTPUTS = ("y", "h", "dx", "dresidual", "dF", "dgate")


def public_functions():
    """Every public function of resnorm (callables in __all__ that are not classes)."""
    return {name for name in resnorm.__all__
            if callable(getattr(resnorm, name)) and not inspect.isclass(getattr(resnorm, name))}


def with_data(op, inp, values, split=False):
    """inp with op's data arguments set so that the computation's input (the norm's x, the
    fused ops' h = residual + alpha * dropout(x), the scaled / gated residuals' h) is
    `values`: exactly (residual = values and x = 0, or x = values and F = 0), or with
    split=True shared between them (residual = values/2, x = values/4; x = F = values/2),
    which keeps h within the range of values.  Rows of values that are constant stay
    exactly so in h.  (split=True also halves dropout's x: y = x / (1 - p) must fit.)"""
    values = np.asarray(values)
    first, *rest = op.data
    if not rest:
        if split and op.family == "dropout":
            values = values / 2
        return dataclasses.replace(inp, **{first: values})
    zero = np.zeros_like(values)
    if not split:
        target = "residual" if op.fused else "x"
        other = "x" if op.fused else "F"
        return dataclasses.replace(inp, **{target: values, other: zero})
    constant = np.all(values == values[..., :1], axis=-1, keepdims=True)
    if op.fused:
        return dataclasses.replace(inp, residual=np.where(constant, values, values / 2),
                                   x=np.where(constant, zero, values / 4))
    return dataclasses.replace(inp, x=np.where(constant, values, values / 2),
                               F=np.where(constant, zero, values / 2))


def assert_close(got, want, tol, what=""):
    """|got - want| <= tol everywhere (tol broadcasts); NaN never passes."""
    got = np.asarray(got, np.float64)
    assert got.shape == np.shape(want), f"{what}: shape {got.shape} != {np.shape(want)}"
    err = np.abs(got - want)
    bound = np.broadcast_to(tol, err.shape)
    bad = ~(err <= bound)
    if np.any(bad):
        i = np.unravel_index(np.argmax(bad), err.shape)
        raise AssertionError(f"{what}: {np.count_nonzero(bad)} elements off; at {i}: got "
                             f"{got[i]!r}, want {want[i]!r}, tolerance {bound[i]!r}")


def assert_matches_reference(op, inp, got):
    """Every output of op.run(inp) against the reference, None where it must be None."""
    for name, (value, tol) in op.reference(inp).items():
        if value is None:
            assert got[name] is None, f"{op.name} {name} should be None"
            continue
        assert got[name].dtype == (np.float64 if name in ROW_OUTPUTS else inp.dtype)
        assert_close(got[name], value, tol, f"{op.name} {name}")


def assert_same_bits(a, b, what=""):
    """Same dtype, shape and bytes (None only equals None)."""
    if a is None or b is None:
        assert a is None and b is None, f"{what}: {a!r} vs {b!r}"
        return
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), f"{what}: bits differ"
