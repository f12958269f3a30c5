"""Property-based tests (hypothesis) of every public function in api_table.OPS.

Random shapes (rank 1-3, no rows, D = 1 ... 300), layouts of every array (strided,
negative strides, Fortran order, misaligned, read-only), dtypes, eps, weight / bias
presence, magnitudes and offsets, constant rows, thread counts, and the two size
thresholds of resnorm._parallel forced down so that tiny inputs also run on several
threads and write with streaming stores.  Properties:

* every output is within the term-scaled tolerance of resnorm.reference;
* the inputs are unchanged afterwards, bit for bit;
* the outputs are bitwise independent of layout, thread count and streaming, and the
  inference forms give bitwise the y of the training forms;
* backward matches central finite differences of sum(y * dy) (small float64 cases).
"""
import contextlib
import dataclasses
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resnorm import _parallel
from api_table import (DTYPES, OPS, Inputs, assert_close, assert_matches_reference,
                       assert_same_bits, layouts, make_inputs)
from test_norms_gradients import central_diff

# RESNORM_HYPOTHESIS_EXAMPLES=5000 for a deep run; 100 keeps the suite at a few seconds.
SETTINGS = settings(max_examples=int(os.environ.get("RESNORM_HYPOTHESIS_EXAMPLES", 100)),
                    deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclasses.dataclass
class Case:
    inp: Inputs        # the arrays, in their drawn layouts
    plain: Inputs      # the same values, C-contiguous
    n_threads: object
    parallel: bool     # every input, however small, runs on n_threads threads
    stream: bool       # every output is written with streaming stores


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


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    d = draw(st.one_of(st.integers(1, 40), st.integers(41, 300)))
    lead = draw(st.lists(st.integers(0, 6), min_size=0, max_size=2))
    shape = tuple(lead) + (d,)
    scale = 10.0 ** draw(st.floats(-3, 3))
    offset = draw(st.sampled_from([0.0, 1.0, -30.0, 1e3])) * scale
    seed = draw(st.integers(0, 2**32 - 1))
    inp = make_inputs(np.random.default_rng(seed), shape, dtype,
                      weight=draw(st.booleans()), bias=draw(st.booleans()),
                      scale=scale, offset=offset)
    if inp.x.size and draw(st.booleans()):  # one constant row
        inp.x.reshape(-1, d)[0] = inp.x.flat[0]
    inp.eps = 10.0 ** draw(st.floats(-12, 1)) if draw(st.booleans()) else None
    plain = dataclasses.replace(inp)
    for name, a in inp.arrays().items():
        views = layouts(a)
        choice = draw(st.sampled_from(["contiguous"] + sorted(views)))
        if choice != "contiguous":
            setattr(inp, name, views[choice])
    return Case(inp, plain, draw(st.sampled_from([None, 1, 2, 3, 4])),
                parallel=draw(st.booleans()), stream=draw(st.booleans()))


def _snapshot(inp):
    return {name: np.array(a, copy=True) for name, a in inp.arrays().items()}


@SETTINGS
@given(case=cases())
def test_every_function_matches_the_reference_and_leaves_its_inputs_alone(case):
    before = _snapshot(case.inp)
    with thresholds(case.parallel, case.stream):
        for op in OPS.values():
            assert_matches_reference(op, case.plain, op.run(case.inp, n_threads=case.n_threads))
    for name, a in case.inp.arrays().items():
        assert_same_bits(np.array(a), before[name], f"{name} modified")


@SETTINGS
@given(case=cases())
def test_results_do_not_depend_on_layout_threads_or_streaming(case):
    with thresholds(case.parallel, case.stream):
        got = {name: op.run(case.inp, n_threads=case.n_threads) for name, op in OPS.items()}
    for name, op in OPS.items():
        want = op.run(case.plain, n_threads=1)
        for out, value in want.items():
            assert_same_bits(got[name][out], value, f"{name} {out}")
    for inference, training in (("rms_norm", "rms_norm_forward"),
                                ("layer_norm", "layer_norm_forward")):
        assert_same_bits(got[inference]["y"], got[training]["y"], inference)


# --------------------------------------------------------------------------- gradients

@SETTINGS
@given(name=st.sampled_from([n for n, op in OPS.items() if op.form == "backward"]),
       n=st.integers(1, 3), d=st.integers(1, 6), has_w=st.booleans(), has_b=st.booleans(),
       scale=st.floats(0.3, 10), offset=st.floats(-5, 5), eps=st.floats(1e-3, 1.0),
       seed=st.integers(0, 2**32 - 1))
def test_backward_matches_finite_differences(name, n, d, has_w, has_b, scale, offset, eps, seed):
    """L = sum(y * R) for a fixed random R: backward(dy=R) is dL/dx, dL/dweight, dL/dbias.
    Steps h = 1e-6 * scale; error bound 1e-6 times the size of the gradient's terms."""
    op = OPS[name]
    fwd = OPS[op.forward]
    inp = make_inputs(np.random.default_rng(seed), (n, d), np.float64, weight=has_w,
                      bias=has_b and op.norm == "ln", scale=scale, offset=offset * scale)
    inp.eps = eps
    got = op.run(inp)
    rstd = fwd.run(inp)["rstd"]
    r_max = np.max(np.abs(inp.dy))
    w_max = 1.0 if inp.weight is None else np.max(np.abs(inp.weight))
    # dx terms: rstd * |R w| (1 + xhat^2) with |xhat| <= sqrt(d); dw, db: n rows of |R| (xhat)
    bounds = {"x": np.max(rstd) * r_max * w_max * (1 + d),
              "weight": n * r_max * np.sqrt(d), "bias": n * r_max}
    steps = {"x": 1e-6 * scale, "weight": 1e-6, "bias": 1e-6}

    for arg, grad in (("x", "dx"), ("weight", "dweight"), ("bias", "dbias")):
        a = getattr(inp, arg)
        if a is None:
            assert got.get(grad) is None
            continue
        probe = dataclasses.replace(inp, **{arg: a.copy()})

        def loss():
            return float(np.sum(fwd.run(probe)["y"] * inp.dy))

        numeric = central_diff(loss, getattr(probe, arg), steps[arg])
        assert_close(got[grad], numeric, 1e-6 * bounds[arg], f"{name} {grad}")
