"""Bitwise reproducibility: any thread count, repeated calls, and every SIMD dispatch level."""
import numpy as np
import pytest

import resnorm
from resnorm import _parallel
from conftest import DTYPES, assert_bitwise_equal, make_inputs, run_at_level, run_ln, run_rms

# More than 2**15 elements (so calls really go parallel) and N >= 520 rows (so backward
# splits into the maximum 64 row blocks); (2048, 1024) float32 is >= 8 MiB: streamed stores.
SHAPES = [(1000, 97), (600, 1024), (2048, 1024)]
THREADS = [1, 2, 4]


def _all_outputs(x, w, b, dy, n_threads):
    out = {f"rms_{k}": v for k, v in run_rms(x, w, dy, n_threads=n_threads).items()}
    out.update({f"ln_{k}": v for k, v in run_ln(x, w, b, dy, n_threads=n_threads).items()})
    out["rms_infer"] = resnorm.rms_norm(x, w, n_threads=n_threads)
    out["ln_infer"] = resnorm.layer_norm(x, w, b, n_threads=n_threads)
    return out


def test_shapes_are_large_enough_to_go_parallel():
    for shape in SHAPES:
        assert np.prod(shape) > _parallel.PARALLEL_MIN_ELEMENTS
        assert shape[0] >= 520
        assert _parallel.threads_for(4, int(np.prod(shape))) == 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_results_identical_for_any_thread_count(rng, dtype, shape):
    x, w, b, dy = make_inputs(rng, shape, dtype)
    base = _all_outputs(x, w, b, dy, 1)
    assert all(np.all(np.isfinite(v)) for v in base.values())
    for nt in THREADS[1:] + [None, 1]:
        got = _all_outputs(x, w, b, dy, nt)
        for key, v in base.items():
            assert_bitwise_equal(got[key], v, f"{key} with n_threads={nt}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 40000), (3, 20000)], ids=str)
def test_fewer_rows_than_threads_identical(rng, dtype, shape):
    # parallel-sized, but fewer rows than threads (and a single backward row block)
    x, w, b, dy = make_inputs(rng, shape, dtype)
    base = _all_outputs(x, w, b, dy, 1)
    for nt in (2, 4):
        got = _all_outputs(x, w, b, dy, nt)
        for key, v in base.items():
            assert_bitwise_equal(got[key], v, f"{key} with n_threads={nt}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeated_calls_identical(rng, dtype):
    x, w, b, dy = make_inputs(rng, (1000, 97), dtype)
    first = _all_outputs(x, w, b, dy, 2)
    for _ in range(3):
        again = _all_outputs(x, w, b, dy, 2)
        for key, v in first.items():
            assert_bitwise_equal(again[key], v, f"{key}, repeated")


@pytest.mark.parametrize("nt", THREADS)
def test_without_weight_or_bias_identical_for_any_thread_count(rng, nt):
    x, _, _, dy = make_inputs(rng, (600, 1024), np.float32, weight=False, bias=False)
    a = (run_rms(x, None, dy, n_threads=1), run_ln(x, None, None, dy, n_threads=1))
    b = (run_rms(x, None, dy, n_threads=nt), run_ln(x, None, None, dy, n_threads=nt))
    for ra, rb in zip(a, b):
        for key in ra:
            assert_bitwise_equal(rb[key], ra[key], f"{key} n_threads={nt}")


# A backward call of 1 to 4 rows (unstreamed) is one group, which writes dweight and dbias
# itself, rounded once, where larger calls add their groups into float64 partial rows and
# narrow the total.  Rows appended with dy = 0 add only zeros to the same sums, so the
# few rows alone and inside a call of 8, 12 or 70 rows must give the same bits.  Columns
# where dy is 0 in every row have sums of zeros (-0 terms where xhat < 0, which both ways
# must turn into +0), and columns with inf or NaN keep them.
def _sums_over_rows(kind, x, r, w, b, dy, p, nt):
    if kind == "rms":
        _, c = resnorm.rms_norm_forward(x, w, n_threads=nt)
        return resnorm.rms_norm_backward(dy, c, n_threads=nt)[1:]
    if kind == "ln":
        _, c = resnorm.layer_norm_forward(x, w, b, n_threads=nt)
        return resnorm.layer_norm_backward(dy, c, n_threads=nt)[1:]
    if kind == "add_rms":
        _, c = resnorm.add_rms_norm_forward(x, r, w, p=p, seed=3, n_threads=nt)
        return resnorm.add_rms_norm_backward(dy, dy, c, n_threads=nt)[2:3]
    if kind == "add_ln_post":
        _, c = resnorm.add_layer_norm_post_forward(x, r, w, b, p=p, seed=3, n_threads=nt)
        return resnorm.add_layer_norm_post_backward(dy, c, n_threads=nt)[2:4]
    _, c = resnorm.add_layer_norm_forward(x, r, w, b, p=p, seed=3, n_threads=nt)
    return resnorm.add_layer_norm_backward(dy, None, c, n_threads=nt)[2:4]


@pytest.mark.parametrize("dtype", DTYPES + ["float16", "bfloat16", "bfloat16+float32"])
@pytest.mark.parametrize("kind", ["rms", "ln", "add_rms", "add_ln", "add_ln_post"])
def test_few_rows_sum_over_rows_with_the_bits_of_a_larger_call(rng, dtype, kind):
    params = dtype
    if isinstance(dtype, str):
        dtype = np.float16 if dtype == "float16" else pytest.importorskip("ml_dtypes").bfloat16
        params = np.float32 if params.endswith("float32") else dtype
    d = 1037
    for n in (1, 2, 3, 4):
        # dropout makes the fused backward's groups single rows: one row is one group
        for p in ([0.0, 0.25] if n == 1 and kind.startswith("add") else [0.0]):
            x, r, dy = (rng.standard_normal((n + 66, d)).astype(dtype) for _ in range(3))
            w, b = (rng.standard_normal(d).astype(params) for _ in range(2))
            dy[n:] = 0
            dy[:n, :40] = 0
            dy[:n, 40] = np.inf
            dy[:n, 41] = np.nan
            for nt in (1, 2):
                with np.errstate(invalid="ignore"):
                    few = _sums_over_rows(kind, x[:n], r[:n], w, b, dy[:n], p, nt)
                    assert all(np.all(np.isfinite(v[42:])) for v in few)
                    # sums of zeros are +0, as from a partial row that starts at +0
                    assert not any(np.signbit(v[:40]).any() for v in few)
                    for m in (8, 12, 70):
                        more = _sums_over_rows(kind, x[:m], r[:m], w, b, dy[:m], p, nt)
                        for i, (a, v) in enumerate(zip(few, more)):
                            assert_bitwise_equal(a, v, f"sum {i} of {n} rows vs {m} "
                                                       f"(p={p}, n_threads={nt})")


# Streamed outputs: a backward group of rows whose stores are streamed goes through its
# columns in chunks, row by row (core/backward.h), where unstreamed groups take all rows
# column by column; both must give the same bits.  D multiple of every vector width (the
# rows share their phase, the chunked case) and not; several chunks per row; row counts
# that leave a short last group; an output that starts off a vector boundary.
_STREAM_SHAPES = [(4, 16), (5, 1536), (9, 520), (7, 1100), (13, 2064), (2, 4096)]


def _plain_and_streamed(outputs, *args):
    """outputs(*args) with every output stored plainly, then with every output streamed."""
    old = _parallel.STREAM_MIN_BYTES
    try:
        _parallel.STREAM_MIN_BYTES = 1 << 62
        plain = outputs(*args)
        _parallel.STREAM_MIN_BYTES = 0
        assert _parallel.streams(1)
        return plain, outputs(*args)
    finally:
        _parallel.STREAM_MIN_BYTES = old


def _placed(buf, start, shape):
    """shape's elements of buf from element `start` past its first 64-byte boundary."""
    first = (-buf.ctypes.data % 64) // buf.itemsize
    return buf[first + start:first + start + int(np.prod(shape))].reshape(shape)


def _backward_outputs(x, w, b, dy, n_threads, offset):
    out = {}
    dx = _placed(np.empty(x.size + 64, x.dtype), offset, x.shape)
    _, cache = resnorm.rms_norm_forward(x, w, n_threads=n_threads)
    out["rms_dx"], out["rms_dw"] = resnorm.rms_norm_backward(dy, cache, out=dx,
                                                             n_threads=n_threads)
    out["rms_dx"] = out["rms_dx"].copy()
    _, cache = resnorm.layer_norm_forward(x, w, b, n_threads=n_threads)
    out["ln_dx"], out["ln_dw"], out["ln_db"] = resnorm.layer_norm_backward(
        dy, cache, out=dx, n_threads=n_threads)
    return out


@pytest.mark.parametrize("dtype", DTYPES + ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", _STREAM_SHAPES, ids=str)
def test_streamed_backward_gives_the_unstreamed_bits(rng, dtype, shape):
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    for weight, bias in [(True, True), (False, True), (False, False)]:
        x, w, b, dy = make_inputs(rng, shape, dtype, weight=weight, bias=bias)
        # dx on a 64-byte boundary, one element past it, and 16 bytes past it (NumPy's
        # placement of large arrays): rows without partial vectors, and rows with one at
        # each end
        for offset in (0, 1, 16 // np.dtype(dtype).itemsize):
            for nt in (1, 2):
                plain, streamed = _plain_and_streamed(_backward_outputs, x, w, b, dy, nt,
                                                      offset)
                for key, v in plain.items():
                    assert_bitwise_equal(streamed[key], v, f"{key} (w={weight}, b={bias}, "
                                         f"offset {offset}, n_threads={nt})")


# Streamed forward outputs at every placement: the partial vectors at a row's two ends are
# streamed too, in 16-, 8- and 4-byte pieces (and a plain 2-byte piece for 16-bit rows off
# a 4-byte boundary).  Every start from a 64-byte boundary, in elements; rows whose length
# leaves partial vectors at both ends; the bytes around the output stay as they were.
def _forward_outputs(x, r, w, b, start, sentinel):
    out = {}
    for name, call in [
            ("rms", lambda y, h: resnorm.rms_norm(x, w, out=y)),
            ("ln", lambda y, h: resnorm.layer_norm(x, w, b, out=y)),
            ("add_rms", lambda y, h: resnorm.add_rms_norm(x, r, w, out=y, residual_out=h)),
            ("add_ln", lambda y, h: resnorm.add_layer_norm(x, r, w, b, out=y,
                                                           residual_out=h))]:
        bufs = [np.full(x.size + 64, sentinel, x.dtype) for _ in range(2)]
        y, h = (_placed(buf, start, x.shape) for buf in bufs)
        call(y, h)
        for buf, v in zip(bufs, (y, h)):
            rest = np.ones(buf.size, bool)
            rest[np.arange(v.size) + (v.ctypes.data - buf.ctypes.data) // buf.itemsize] = False
            assert np.array_equal(buf[rest].view(np.uint8),
                                  np.full(rest.sum(), sentinel, x.dtype).view(np.uint8)), (
                f"{name}: bytes outside the output written (start {start})")
        out[name + "_y"], out[name + "_h"] = y.copy(), h.copy()
    return out


@pytest.mark.parametrize("dtype", DTYPES + ["float16", "bfloat16"])
def test_streamed_forward_gives_the_unstreamed_bits_at_every_placement(rng, dtype):
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    sentinel = np.array(-7.5, dtype)
    for shape in [(3, 37), (2, 70), (1, 5)]:
        x, w, b, _ = make_inputs(rng, shape, dtype)
        r = rng.standard_normal(shape).astype(dtype)
        for start in range(64 // np.dtype(dtype).itemsize):
            plain, streamed = _plain_and_streamed(_forward_outputs, x, r, w, b, start,
                                                  sentinel)
            for key, v in plain.items():
                assert_bitwise_equal(streamed[key], v, f"{key} {shape} from element {start}")


# --------------------------------------------------------------------------- SIMD levels

_SIMD_SCRIPT = r"""
import json, sys
import numpy as np
import resnorm

out = {}
rng = np.random.default_rng(7)
for dtype in (np.float32, np.float64):
    for shape in [(3, 7), (5, 33), (40, 97), (600, 1024), (1100, 2047)]:
        if shape == (1100, 2047) and dtype == np.float64:
            continue
        d = shape[-1]
        x = rng.standard_normal(shape).astype(dtype)
        w = (1 + 0.5 * rng.standard_normal(d)).astype(dtype)
        b = rng.standard_normal(d).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        tag = f"{np.dtype(dtype).name}_{shape[0]}x{d}"
        y, c = resnorm.rms_norm_forward(x, w)
        dx, dw = resnorm.rms_norm_backward(dy, c)
        out.update({tag + "_rms_y": y, tag + "_rms_rstd": c.rstd, tag + "_rms_dx": dx,
                    tag + "_rms_dw": dw})
        y, c = resnorm.layer_norm_forward(x, w, b)
        dx, dw, db = resnorm.layer_norm_backward(dy, c)
        out.update({tag + "_ln_y": y, tag + "_ln_mean": c.mean, tag + "_ln_rstd": c.rstd,
                    tag + "_ln_dx": dx, tag + "_ln_dw": dw, tag + "_ln_db": db})
        y, c = resnorm.layer_norm_forward(x)
        dx, _, _ = resnorm.layer_norm_backward(dy, c)
        out.update({tag + "_ln0_y": y, tag + "_ln0_dx": dx})
# streamed outputs at every size: backward's chunked streamed groups at every level
from resnorm import _parallel
_parallel.STREAM_MIN_BYTES = 0
for dtype in (np.float32, np.float64):
    x = rng.standard_normal((9, 1536)).astype(dtype)
    w = (1 + 0.5 * rng.standard_normal(1536)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    tag = f"{np.dtype(dtype).name}_streamed"
    _, c = resnorm.rms_norm_forward(x, w)
    out[tag + "_rms_dx"], out[tag + "_rms_dw"] = resnorm.rms_norm_backward(dy, c)
    _, c = resnorm.layer_norm_forward(x, w, w)
    out[tag + "_ln_dx"], out[tag + "_ln_dw"], out[tag + "_ln_db"] = (
        resnorm.layer_norm_backward(dy, c))
np.savez(sys.argv[1], **out)
print(json.dumps({"simd_level": resnorm.simd_level()}))
"""


def _run_level(tmp_path, level):
    return run_at_level(_SIMD_SCRIPT, tmp_path / f"{level or 'default'}.npz", level, timeout=120)


def test_every_simd_level_gives_identical_results(tmp_path):
    levels = {}
    for cap in [None, "sse2", "avx2", "avx512", "avx512bf16", "bogus"]:
        levels[cap] = _run_level(tmp_path, cap)
    default_level = levels[None][0]
    assert default_level == resnorm.simd_level()
    order = ["portable", "sse2", "avx2", "avx512", "avx512bf16"]
    if default_level != "portable":
        # RESNORM_CPU caps the level: it never goes above the cap nor above the default
        assert levels["sse2"][0] == "sse2"
        assert levels["avx2"][0] in ("sse2", "avx2")
        assert order.index(levels["avx2"][0]) <= order.index(default_level)
        assert order.index(levels["avx512"][0]) <= order.index("avx512")
        assert order.index(levels["avx512"][0]) <= order.index(default_level)
        assert levels["avx512bf16"][0] == default_level
    assert levels["bogus"][0] == default_level  # an unknown name caps nothing
    reported = {cap: lv for cap, (lv, _) in levels.items()}
    print("SIMD levels run:", reported)
    _, base = levels["sse2"]
    assert len(base) > 50
    for cap, (lv, res) in levels.items():
        assert res.keys() == base.keys()
        for key in base:
            assert_bitwise_equal(res[key], base[key], f"{key} at {lv} (RESNORM_CPU={cap})")
