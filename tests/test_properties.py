"""Property-based tests (hypothesis) of every public function in api_table.OPS.

Random shapes (rank 1-3, no rows, D = 1 ... 300), layouts of every array (strided,
negative strides, Fortran order, misaligned, read-only), dtypes, eps, weight / bias
presence, alpha kinds (fixed, learnable scalar, per channel), dropout on / off / p = 1,
full and per-channel gates, dh present or not, magnitudes and offsets, constant rows, the
norms over one or several trailing axes (normalized_shape), zero-centred weights, the
gated RMSNorm's groups, both gate orders and no gate,
thread counts, and the two size thresholds of resnorm._parallel forced down so that tiny
inputs also run on several threads and write with streaming stores.  Properties:

* every output is within the term-scaled tolerance of resnorm.reference;
* the inputs are unchanged afterwards, bit for bit;
* the outputs are bitwise independent of layout, thread count and streaming, and the
  inference forms give bitwise the outputs of the training forms;
* backward matches central finite differences of sum(y * dy) (+ sum(h * dh) where h is
  an output), for every array argument (small float64 cases).
"""
import contextlib
import dataclasses
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resnorm import _parallel
from api_table import (BACKWARDS, DTYPES, INFERENCE, OPS, assert_close,
                       assert_matches_reference, assert_same_bits, layouts, make_inputs)
from test_norms_gradients import central_diff

# RESNORM_HYPOTHESIS_EXAMPLES=5000 for a deep run; 100 keeps the suite at a few seconds.
SETTINGS = settings(max_examples=int(os.environ.get("RESNORM_HYPOTHESIS_EXAMPLES", 100)),
                    deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclasses.dataclass
class Case:
    inp: object        # the api_table.Inputs, in their drawn layouts
    plain: object      # the same values, C-contiguous
    n_threads: object
    parallel: bool     # every input, however small, runs on n_threads threads
    stream: bool       # every output is written with streaming stores
    no_dh: bool        # the Pre-Norm backward gets dh = None (no gradient along the stream)

    def inputs(self, op, plain=False):
        """The inputs of op (plain: C-contiguous)."""
        inp = op.adapt(self.plain if plain else self.inp)
        if self.no_dh and "dh" in op.args and op.fused:
            return dataclasses.replace(inp, dh=None)
        return inp


@contextlib.contextmanager
def thresholds(parallel, stream):
    """resnorm._parallel's size thresholds forced to 0 (threads_for and streams read them
    at every call)."""
    saved = _parallel.PARALLEL_MIN_ELEMENTS, _parallel.STREAM_MIN_BYTES
    if parallel:
        _parallel.PARALLEL_MIN_ELEMENTS = 0
    if stream:
        _parallel.STREAM_MIN_BYTES = 0
    try:
        yield
    finally:
        _parallel.PARALLEL_MIN_ELEMENTS, _parallel.STREAM_MIN_BYTES = saved


ALPHAS = st.sampled_from(["channel", "scalar", "fixed", None])


def _axes(shape, alpha):
    """How many trailing axes the norms normalise (normalized_shape): sizes >= 1 only.  A
    per-channel alpha then has their shape, which only the fused functions take (the
    scaled residual's is the last axis'): it keeps one axis."""
    k = 1
    while k < len(shape) and shape[-k - 1] > 0:
        k += 1
    return st.just(1) if alpha == "channel" else st.integers(1, k)


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    d = draw(st.one_of(st.integers(1, 40), st.integers(41, 300)))
    lead = draw(st.lists(st.integers(0, 6), min_size=0, max_size=2))
    shape = tuple(lead) + (d,)
    scale = 10.0 ** draw(st.floats(-3, 3))
    offset = draw(st.sampled_from([0.0, 1.0, -30.0, 1e3])) * scale
    seed = draw(st.integers(0, 2**32 - 1))
    alpha = draw(ALPHAS)
    inp = make_inputs(np.random.default_rng(seed), shape, dtype,
                      weight=draw(st.booleans()), bias=draw(st.booleans()),
                      scale=scale, offset=offset, alpha=alpha,
                      p=draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
                      gate=draw(st.sampled_from(["full", "channel"])),
                      axes=draw(_axes(shape, alpha)),
                      zero_centered_weight=draw(st.booleans()))
    inp.training = draw(st.booleans())
    _draw_gated_norm_options(draw, inp, d)
    if inp.x.size and draw(st.booleans()):  # one constant row
        inp.x.reshape(-1, d)[0] = inp.x.flat[0]
    inp.eps = 10.0 ** draw(st.floats(-12, 1)) if draw(st.booleans()) else None
    plain = dataclasses.replace(inp)
    for name, a in inp.arrays().items():
        if a.ndim == 0:  # a learnable scalar alpha has no layouts
            continue
        views = layouts(a)
        choice = draw(st.sampled_from(["contiguous"] + sorted(views)))
        if choice != "contiguous":
            setattr(inp, name, views[choice])
    return Case(inp, plain, draw(st.sampled_from([None, 1, 2, 3, 4])),
                parallel=draw(st.booleans()), stream=draw(st.booleans()),
                no_dh=draw(st.booleans()))


def _draw_gated_norm_options(draw, inp, d):
    """The gated RMSNorm's group_size (None or a divisor of d), order and gate (or none)."""
    inp.group_size = draw(st.sampled_from([None] + [k for k in range(1, d + 1) if d % k == 0]))
    inp.norm_before_gate = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        inp.gate = None


def _snapshot(inp):
    return {name: np.array(a, copy=True) for name, a in inp.arrays().items()}


@SETTINGS
@given(case=cases())
def test_every_function_matches_the_reference_and_leaves_its_inputs_alone(case):
    before = _snapshot(case.inp)
    with thresholds(case.parallel, case.stream):
        for op in OPS.values():
            assert_matches_reference(op, case.inputs(op, plain=True),
                                     op.run(case.inputs(op), n_threads=case.n_threads))
    for name, a in case.inp.arrays().items():
        assert_same_bits(np.array(a), before[name], f"{name} modified")


@SETTINGS
@given(case=cases())
def test_results_do_not_depend_on_layout_threads_or_streaming(case):
    with thresholds(case.parallel, case.stream):
        got = {name: op.run(case.inputs(op), n_threads=case.n_threads)
               for name, op in OPS.items()}
    for name, op in OPS.items():
        want = op.run(case.inputs(op, plain=True), n_threads=1)
        for out, value in want.items():
            assert_same_bits(got[name][out], value, f"{name} {out}")
    for inference in INFERENCE:
        for out, value in got[inference].items():
            assert_same_bits(value, got[inference + "_forward"][out], f"{inference} {out}")


# --------------------------------------------------------------------------- gradients

# the gradient each backward returns for each forward argument, and the cotangent of each
# forward output (the loss is sum over the outputs of output * cotangent)
GRADIENTS = {"x": "dx", "residual": "dresidual", "weight": "dweight", "bias": "dbias",
             "alpha": "dalpha", "F": "dF", "g": "dg", "gate": "dgate"}
COTANGENTS = {"y": "dy", "h": "dh"}


@SETTINGS
@given(name=st.sampled_from(BACKWARDS), n=st.integers(1, 3), d=st.integers(1, 6),
       has_w=st.booleans(), has_b=st.booleans(), alpha=ALPHAS,
       p=st.sampled_from([0.0, 0.3]), gate=st.sampled_from(["full", "channel"]),
       scale=st.floats(0.3, 10), offset=st.floats(-5, 5), eps=st.floats(1e-3, 1.0),
       seed=st.integers(0, 2**32 - 1), both_axes=st.booleans(), zero_centered=st.booleans(),
       data=st.data())
def test_backward_matches_finite_differences(name, n, d, has_w, has_b, alpha, p, gate, scale,
                                             offset, eps, seed, both_axes, zero_centered, data):
    """L = sum(y * R) (+ sum(h * R_h)) for fixed random cotangents R: backward(dy=R,
    dh=R_h) is dL/d(every array argument).  Steps 1e-6 times the argument's scale; error
    bound 1e6 times the reference's float64 tolerance, which is 1e-12 times the size of
    the gradient's terms (api_table): so 1e-6 times the size of the terms; plus the
    rounding error of L itself over the step, 4 eps sum|y * R| / step."""
    op = OPS[name]
    fwd = OPS[op.forward]
    inp = make_inputs(np.random.default_rng(seed), (n, d), np.float64, weight=has_w,
                      bias=has_b, scale=scale, offset=offset * scale, alpha=alpha, p=p,
                      gate=gate, axes=2 if both_axes and alpha != "channel"
                      and "normalized_shape" in fwd.args else 1,
                      zero_centered_weight=zero_centered)
    inp.eps = eps
    _draw_gated_norm_options(data.draw, inp, d)
    got = op.run(inp)
    want = op.reference(inp)
    for arg in fwd.arrays:
        grad = GRADIENTS[arg]
        a = getattr(inp, arg)
        if not (isinstance(a, np.ndarray) and grad in got):
            assert got.get(grad) is None, f"{name} {grad}"
            continue
        probe = dataclasses.replace(inp, **{arg: a.copy()})

        def loss(terms=np.sum):
            outputs = fwd.run(probe)
            return float(sum(terms(outputs[o] * getattr(inp, c))
                             for o, c in COTANGENTS.items()
                             if o in fwd.returns and getattr(inp, c) is not None
                             and c in op.args))

        step = 1e-6 * (scale if arg in fwd.data else 1.0)
        rounding = 4 * np.finfo(np.float64).eps * loss(lambda t: np.sum(np.abs(t))) / step
        numeric = central_diff(loss, getattr(probe, arg), step)
        assert_close(got[grad], numeric, 1e6 * want[grad][1] + rounding, f"{name} {grad}")
