"""The public kernel functions as one table, for the table-driven reliability tests.

Each entry of OPS says how to call one public function on a set of inputs, what it
returns, and what its float64 twin in resnorm.reference returns, with a tolerance built
from the size of the terms each output is made of (never from the result itself, which
may be a cancellation to ~0).

test_input_table fails while a public function of resnorm is missing here, so a new
kernel (the residual / dropout family) is covered by every table-driven test once it has
an entry: input checks, properties, threads, memory, extreme numerics.
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


@dataclasses.dataclass
class Inputs:
    """The arrays of one call of a norm.  weight / bias may be None; eps None means the
    function's default."""
    x: np.ndarray
    weight: np.ndarray = None
    bias: np.ndarray = None
    dy: np.ndarray = None
    eps: float = None

    @property
    def dtype(self):
        return np.asarray(self.x).dtype

    def arrays(self):
        """name -> array, for the arrays that are set."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if isinstance(v, np.ndarray)}


def make_inputs(rng, shape, dtype, weight=True, bias=True, scale=1.0, offset=0.0):
    d = shape[-1]
    return Inputs(
        x=(offset + scale * rng.standard_normal(shape)).astype(dtype),
        weight=(1.0 + 0.5 * rng.standard_normal(d)).astype(dtype) if weight else None,
        bias=rng.standard_normal(d).astype(dtype) if bias else None,
        dy=rng.standard_normal(shape).astype(dtype))


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
    """One public function.  norm: which reference family ('rms' or 'ln'); form:
    'inference' (returns y), 'training' (returns y, cache) or 'backward' (of the training
    form `forward`); params: its optional parameter vectors."""
    name: str
    norm: str
    form: str
    params: tuple
    forward: str = None

    @property
    def fn(self):
        return getattr(resnorm, self.name)

    @property
    def arrays(self):
        """The array arguments a caller passes (the cache is not one)."""
        return ("dy",) if self.form == "backward" else ("x",) + self.params

    @property
    def output(self):
        """Name of the array out= receives."""
        return "dx" if self.form == "backward" else "y"

    def default_eps(self):
        fn = OPS[self.forward].fn if self.form == "backward" else self.fn
        return inspect.signature(fn).parameters["eps"].default

    def forward_kwargs(self, inp):
        kw = {"x": inp.x, **{p: getattr(inp, p) for p in self.params}}
        if inp.eps is not None:
            kw["eps"] = inp.eps
        return kw

    def kwargs(self, inp, **extra):
        """Keyword arguments of a valid call on inp (backward: its cache is made here by
        the training form, with the same n_threads), plus extra (out=, n_threads=...)."""
        if self.form != "backward":
            return {**self.forward_kwargs(inp), **extra}
        fwd = OPS[self.forward]
        nt = {"n_threads": extra["n_threads"]} if "n_threads" in extra else {}
        _, cache = fwd.fn(**fwd.forward_kwargs(inp), **nt)
        return {"dy": inp.dy, "cache": cache, **extra}

    def call(self, inp, **extra):
        """The raw return value of one call."""
        return self.fn(**self.kwargs(inp, **extra))

    def outputs(self, result):
        """The raw return value as name -> array (None for a gradient not computed)."""
        if self.form == "inference":
            return {"y": result}
        if self.form == "training":
            y, cache = result  # the cache holds one statistic per row, in the rows' shape:
            lead = y.shape[:-1]
            stats = ("rstd",) if self.norm == "rms" else ("mean", "rstd")
            return {"y": y, **{s: getattr(cache, s).reshape(lead) for s in stats}}
        names = ("dx", "dweight", "dbias")[:len(result)]
        return dict(zip(names, result))

    def run(self, inp, **extra):
        return self.outputs(self.call(inp, **extra))

    def reference(self, inp):
        """name -> (float64 expected value, tolerance) for every output of run()."""
        eps = self.default_eps() if inp.eps is None else inp.eps
        want = _REFERENCES[self.norm](inp, eps)
        return {name: want[name] for name in self.outputs_names(inp)}

    def outputs_names(self, inp):
        if self.form == "inference":
            return ("y",)
        if self.form == "training":
            return ("y", "rstd") if self.norm == "rms" else ("y", "mean", "rstd")
        return ("dx", "dweight") + (("dbias",) if self.norm == "ln" else ())


def _rms_reference(inp, eps):
    x, dy, w = _f64(inp.x), _f64(inp.dy), _f64(inp.weight)
    y, rstd = ref.rms_norm_forward(x, w, eps)
    xn = np.abs(x * rstd[..., None])
    return _with_tolerances(inp, {"y": y, "rstd": rstd}, xn, rstd, lambda: dict(zip(
        ("dx", "dweight"), ref.rms_norm_backward(dy, x, w, rstd))))


def _ln_reference(inp, eps):
    x, dy, w, b = _f64(inp.x), _f64(inp.dy), _f64(inp.weight), _f64(inp.bias)
    y, mean, rstd = ref.layer_norm_forward(x, w, b, eps)
    r = rstd[..., None]
    d = x.shape[-1]
    # The kernel's and the reference's means are both double sums, each off by a few ulps
    # of max|x| (32-lane sum / pairwise sum); every xhat then shifts by that times rstd.
    # A mean off by delta also adds delta^2 to the variance: rstd moves by delta^2 rstd^3 / 2.
    slack = (d / 32 + math.log2(d) + 10) * np.finfo(np.float64).eps * _rowmax(x) * r
    xhat = np.abs((x - mean[..., None]) * r) + slack / RTOL[inp.dtype]
    rstd_slack = 0.5 * slack[..., 0] ** 2 * rstd

    def backward():
        dx, dw, db = ref.layer_norm_backward(dy, x, w, mean, rstd)
        return {"dx": dx, "dweight": dw, "dbias": None if b is None else db}

    return _with_tolerances(inp, {"y": y, "mean": mean, "rstd": rstd}, xhat, rstd, backward,
                            rstd_slack)


def _with_tolerances(inp, forward, xhat, rstd, backward, rstd_slack=0.0):
    """name -> (value, tolerance) for the outputs of a norm whose normalised values have
    magnitude xhat (|x * rstd| for RMSNorm, |(x - mean) * rstd| for LayerNorm).

    Tolerance: RTOL times the size of the terms the output is made of, plus a floor for
    results on the subnormal grid, where every rounding is off by up to one step sub of
    the element type: x - mean (amplified by rstd), the products, the sums over rows."""
    x, dy = _f64(inp.x), _f64(inp.dy)
    d = x.shape[-1]
    rtol = RTOL[inp.dtype]
    sub = float(np.finfo(inp.dtype).smallest_subnormal)
    r = rstd[..., None]
    w1 = np.ones(d) if inp.weight is None else np.abs(_f64(inp.weight))
    b_max = 0.0 if inp.bias is None else np.max(np.abs(_f64(inp.bias)))
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


_REFERENCES = {"rms": _rms_reference, "ln": _ln_reference}


def _f64(a):
    return None if a is None else np.asarray(a, np.float64)


def _rowmax(a):
    """max |a| over the last axis, kept as a length-1 axis (0 for empty rows)."""
    if a.shape[-1] == 0 or a.size == 0:
        return np.zeros(a.shape[:-1] + (1,))
    return np.max(np.abs(a), axis=-1, keepdims=True)


def _colsum(a):
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


OPS = {op.name: op for op in [
    Op("rms_norm", "rms", "inference", ("weight",)),
    Op("rms_norm_forward", "rms", "training", ("weight",)),
    Op("rms_norm_backward", "rms", "backward", ("weight",), forward="rms_norm_forward"),
    Op("layer_norm", "ln", "inference", ("weight", "bias")),
    Op("layer_norm_forward", "ln", "training", ("weight", "bias")),
    Op("layer_norm_backward", "ln", "backward", ("weight", "bias"), forward="layer_norm_forward"),
]}
FORWARDS = [name for name, op in OPS.items() if op.form != "backward"]
BACKWARDS = [name for name, op in OPS.items() if op.form == "backward"]
TRAINING = [name for name, op in OPS.items() if op.form == "training"]

# Public callables that take no array (build and runtime facts): nothing to check.
NO_ARRAY_FUNCTIONS = {"build_flags", "get_num_threads", "openmp_enabled", "simd_level"}


def public_functions():
    """Every public function of resnorm (callables in __all__ that are not classes)."""
    return {name for name in resnorm.__all__
            if callable(getattr(resnorm, name)) and not inspect.isclass(getattr(resnorm, name))}


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
        assert got[name].dtype == (np.float64 if name in ("mean", "rstd") else inp.dtype)
        assert_close(got[name], value, tol, f"{op.name} {name}")


def assert_same_bits(a, b, what=""):
    """Same dtype, shape and bytes (None only equals None)."""
    if a is None or b is None:
        assert a is None and b is None, f"{what}: {a!r} vs {b!r}"
        return
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), f"{what}: bits differ"
