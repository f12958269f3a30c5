"""float16 and bfloat16: the conversions, the norms, the fused add + norm and the
elementwise residuals forward and backward against the float64 reference rounded once,
reproducibility over threads and SIMD levels.  float16 tests need nothing beyond NumPy;
bfloat16 tests need ml_dtypes."""
import numpy as np
import pytest

import resnorm
from resnorm import _api, _core
from resnorm import reference as ref
from conftest import LANE_STAT_RTOL, run_at_level

bf16 = None
try:
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is an optional extra
    pass

F16 = np.dtype(np.float16)
HALVES = [F16, pytest.param("bfloat16", marks=pytest.mark.skipif(bf16 is None,
                                                                  reason="needs ml_dtypes"))]
SIZES = [1, 3, 17, 1000, 4097]


def half(name):
    return F16 if name is F16 or name == "float16" else bf16


def ordered(a):
    """The 16-bit patterns of a as integers in the order of the values (so that adjacent
    values differ by 1: the distance in units in the last place)."""
    u = a.view(np.uint16).astype(np.int64)
    return np.where(u & 0x8000, 0x8000 - u, u)


def ulps(got, want64):
    """Distance in units in the last place of got from want64 rounded once to got's dtype."""
    return np.abs(ordered(got) - ordered(want64.astype(got.dtype)))


def is_rounded_once(got, want32, dt):
    """got is of dt and holds, bit for bit, the float32 values want32 rounded once to dt."""
    return got.dtype == dt and np.array_equal(got.view(np.uint16),
                                              want32.astype(dt).view(np.uint16))


def rows(rng, kind, n, d, dt):
    if kind == "normal":
        x = rng.standard_normal((n, d))
    elif kind == "offset":
        x = 1e2 + rng.standard_normal((n, d))
    else:  # mixed scales: each row its own scale from 1e-3 to 1e3
        x = rng.standard_normal((n, d)) * 10.0 ** rng.uniform(-3, 3, (n, 1))
    return x.astype(dt)


def half_inputs(rng, dt, n, d, kinds):
    """(n, d) rows of each kind in kinds, then a weight near 1 and a bias, all of dt; and
    their exact float32 widenings, in the same order."""
    arrays = [rows(rng, k, n, d, dt) for k in kinds]
    arrays += [(1 + 0.5 * rng.standard_normal(d)).astype(dt), rng.standard_normal(d).astype(dt)]
    return arrays, [a.astype(np.float32) for a in arrays]


# --------------------------------------------------------------------------- conversions

def test_float16_conversions_every_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    h = bits.view(np.float16)
    out = np.empty(h.size, np.float32)
    _api.to_float32(out, h)
    want = h.astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(out.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    assert np.isnan(out[nan]).all()
    back = np.empty(h.size, np.float16)
    _api.rounded(back, out)   # round trip: exact, NaN stays NaN
    assert np.array_equal(back.view(np.uint16)[~nan], bits[~nan])
    assert np.isnan(back[nan]).all()
    for offset in (0, 1, 7):       # non-temporal stores: the same bits, any alignment
        streamed = np.empty(h.size + offset, np.float16)[offset:]
        _api.rounded(streamed, out[:streamed.size], stream=True)
        assert np.array_equal(streamed.view(np.uint16), back[:streamed.size].view(np.uint16))


def special_floats():
    """Ties, overflow boundaries, subnormals, inf and NaN of both 16-bit formats, and random
    bit patterns."""
    rng = np.random.default_rng(3)
    f = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 65536.0, 1e6,
         2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 3 * 2.0 ** -25, 2.0 ** -14,
         1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8,
         3.3895314e38, 3.4028235e38, 1e-40, -1e-45, 2.0 ** -133, 2.0 ** -134]
    f = np.array(f, np.float32)
    raw = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([f, -f, raw])


@pytest.mark.parametrize("name", HALVES)
def test_round_to_nearest_even_as_numpy_and_ml_dtypes(name):
    dt = half(name)
    f = special_floats()
    got = np.empty(f.size, dt)
    _api.rounded(got, f)
    with np.errstate(over="ignore", invalid="ignore"):
        want = f.astype(dt)   # NumPy's / ml_dtypes' own conversion
    nan = np.isnan(f)
    assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(got[nan].astype(np.float32)).all()


def rounded_once(d, dt):
    """The 16-bit patterns of the doubles d rounded to nearest even in dt, found exactly:
    of the two values of dt around |d| (past the largest finite one, the next power of two,
    which rounds to inf), the nearer, the one with the even pattern on a tie (a double
    minus a neighbour within a factor of two is exact)."""
    pats = np.arange(1 << 15, dtype=np.uint16)
    with np.errstate(invalid="ignore"):   # (the NaN patterns)
        vals = pats.view(dt).astype(np.float64)
    pats, vals = pats[np.isfinite(vals)], vals[np.isfinite(vals)]
    ulp = vals[-1] - vals[-2]
    vals = np.append(vals, vals[-1] + ulp)   # the pattern after the largest finite: inf
    a = np.abs(d)
    i = np.minimum(np.searchsorted(vals, a, side="right") - 1, pats.size - 1)
    up = vals[i + 1] - a
    with np.errstate(invalid="ignore"):
        up = (up < a - vals[i]) | ((up == a - vals[i]) & (pats[i] % 2 == 1)) | np.isinf(a)
    return (pats[i] + up).astype(np.uint16) | np.where(np.signbit(d), 0x8000, 0).astype(np.uint16)


def special_doubles(dt):
    """Every tie between two neighbouring values of dt (and the largest finite one and
    inf), one double unit on either side of each, the values themselves, random doubles
    from below the subnormals to past the largest finite value, zeros and infinities."""
    rng = np.random.default_rng(5)
    with np.errstate(invalid="ignore"):
        vals = np.arange(1 << 15, dtype=np.uint16).view(dt).astype(np.float64)
    vals = vals[np.isfinite(vals)]
    ties = np.append((vals[:-1] + vals[1:]) / 2, vals[-1] + (vals[-1] - vals[-2]) / 2)
    near = [ties, np.nextafter(ties, 0), np.nextafter(ties, np.inf), vals]
    rand = rng.uniform(1, 2, 100_000) * 2.0 ** rng.integers(-160, 140, 100_000)
    d = np.concatenate(near + [rand, [0.0, np.inf, 1e300]])
    return np.concatenate([d, -d])


@pytest.mark.parametrize("name", HALVES)
def test_rounding_from_float64_is_correct(name):
    # the sums over rows (dweight, dbias) are float64, rounded once to a 16-bit dtype: in
    # vectors through float rounded to odd (and one by one past the last whole vector)
    dt = half(name)
    d = special_doubles(dt)
    for size in (d.size, d.size - 5):
        got = np.empty(size, dt)
        _api.rounded(got, d[:size])
        assert np.array_equal(got.view(np.uint16), rounded_once(d[:size], dt))
    got = np.empty(3, dt)
    _api.rounded(got, np.array([np.nan, -np.nan, 1.0]))
    assert np.isnan(got[:2].astype(np.float32)).all() and got[2] == 1


@pytest.mark.skipif(bf16 is None, reason="needs ml_dtypes")
def test_bfloat16_widening_every_pattern():
    h = np.arange(1 << 16, dtype=np.uint16).view(bf16)
    out = np.empty(h.size, np.float32)
    _api.to_float32(out, h)
    assert np.array_equal(out.view(np.uint32), h.view(np.uint16).astype(np.uint32) << 16)


# --------------------------------------------------------------------------- forward

@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("kind", ["normal", "offset", "mixed"])
@pytest.mark.parametrize("d", SIZES)
def test_norms_forward_within_one_ulp(rng, name, kind, d):
    dt = half(name)
    x = rows(rng, kind, 5, d, dt)
    w = (1 + 0.5 * rng.standard_normal(d)).astype(dt)
    b = rng.standard_normal(d).astype(dt)
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    y, c = resnorm.rms_norm_forward(x, w)
    want, rstd = ref.rms_norm_forward(x64, w64)
    assert y.dtype == dt and ulps(y, want).max() <= 1
    np.testing.assert_allclose(c.rstd, rstd, rtol=1e-12)   # float64 statistics, as before
    y, c = resnorm.layer_norm_forward(x, w, b)
    want, mean, rstd = ref.layer_norm_forward(x64, w64, b64)
    assert y.dtype == dt and ulps(y, want).max() <= 1
    np.testing.assert_allclose(c.rstd, rstd, rtol=LANE_STAT_RTOL)   # float32 lanes
    assert ulps(resnorm.layer_norm(x), ref.layer_norm_forward(x64)[0]).max() <= 1


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
@pytest.mark.parametrize("d", [3, 17, 1000])
def test_fused_forward_within_one_ulp(rng, name, layer, d):
    # h = x + residual is rounded once into the half dtype; y normalises that h, the one
    # returned (as the unfused h = x + residual; y = norm(h) would)
    dt = half(name)
    x = rows(rng, "normal", 6, d, dt)
    r = rows(rng, "mixed", 6, d, dt)
    w = (1 + 0.5 * rng.standard_normal(d)).astype(dt)
    h64 = x.astype(np.float64) + r.astype(np.float64)
    if layer:
        y, h = resnorm.add_layer_norm(x, r, w)
        want = ref.layer_norm_forward(h.astype(np.float64), w.astype(np.float64))[0]
        post = resnorm.add_layer_norm_post(x, r, w)
    else:
        y, h = resnorm.add_rms_norm(x, r, w)
        want = ref.rms_norm_forward(h.astype(np.float64), w.astype(np.float64))[0]
        post = resnorm.add_rms_norm_post(x, r, w)
    assert h.dtype == y.dtype == dt
    assert ulps(h, h64).max() <= 1
    assert ulps(y, want).max() <= 1
    assert np.array_equal(post.view(np.uint16), y.view(np.uint16))


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("n", [5, 16, 37])
def test_fused_forward_is_the_float32_fused_forward_rounded_once(rng, name, n):
    # with 16-bit parameters (read at every row, or widened to float32 once per call from
    # 16 rows on), h is bitwise the float32 h of the widened inputs rounded once, and y
    # bitwise the float32 norm of that rounded h, rounded once, with any thread count
    dt = half(name)
    for d in (3, 1000):
        (x, r, w, b), wide = half_inputs(rng, dt, n, d, ("normal", "mixed"))
        for nt in (1, 2):
            for layer, post, args in ((True, False, (0, 1, 2, 3)), (True, True, (0, 1, 2, 3)),
                                      (True, False, (0, 1, 2)), (False, False, (0, 1, 2)),
                                      (False, True, (0, 1, 2))):
                f = getattr(resnorm, ("add_layer_norm" if layer else "add_rms_norm")
                            + ("_post" if post else ""))
                norm = resnorm.layer_norm if layer else resnorm.rms_norm
                got = f(*[(x, r, w, b)[k] for k in args], n_threads=nt)
                h32 = wide[1] + wide[0]   # residual + x, in float32
                y32 = norm(h32.astype(dt).astype(np.float32), *[wide[k] for k in args[2:]],
                           n_threads=nt)
                got, want = (got, (y32,)) if post else (got, (y32, h32))
                got = got if isinstance(got, tuple) else (got,)
                for g, e in zip(got, want):
                    assert is_rounded_once(g, e, dt), (f.__name__, d, nt)


@pytest.mark.parametrize("name", HALVES)
def test_non_contiguous_read_only_inputs_unchanged(rng, name):
    dt = half(name)
    base = rows(rng, "normal", 8, 34, dt)
    x = base[::2, ::2]              # strided view
    w = (1 + rng.standard_normal(17)).astype(dt)
    w.flags.writeable = False
    keep_x, keep_w = x.copy(), w.copy()
    y = resnorm.rms_norm(x, w)
    assert np.array_equal(y.view(np.uint16), resnorm.rms_norm(np.ascontiguousarray(x), w).view(np.uint16))
    y, c = resnorm.layer_norm_forward(x, w)
    dx, dw, _ = resnorm.layer_norm_backward(np.ones_like(x), c)
    assert np.array_equal(x.view(np.uint16), keep_x.view(np.uint16))
    assert np.array_equal(w.view(np.uint16), keep_w.view(np.uint16))
    assert dx.dtype == dw.dtype == dt
    h, c = resnorm.gated_residual_forward(x, x, w)   # a read-only per-channel gate
    assert np.array_equal(h.view(np.uint16), resnorm.gated_residual(
        np.ascontiguousarray(x), np.ascontiguousarray(x), w).view(np.uint16))
    dx, dF, dg = resnorm.gated_residual_backward(x, c)
    assert np.array_equal(x.view(np.uint16), keep_x.view(np.uint16))
    assert np.array_equal(w.view(np.uint16), keep_w.view(np.uint16))
    assert dg.dtype == dt and dg.shape == w.shape


# --------------------------------------------------------------------------- backward

def spacing(want64, dt):
    """One unit in the last place of want64 rounded to dt, as float64."""
    r = want64.astype(dt)
    u = r.view(np.uint16)
    up = (u & 0x8000) | ((u & 0x7fff) + 1)
    return np.abs(up.astype(np.uint16).view(dt).astype(np.float64) - r.astype(np.float64))


# Backward tolerances.  Every term is formed in float32 from exactly widened 16-bit inputs:
# a product or sum of a few float32 operations is within 4 * 2^-24 of its magnitude, and
# the reductions over a row add their float32 block sums (8 terms) in double, so a row sum
# is within 16 * 2^-24 of the sum of its terms' magnitudes.  dx = rstd * (g - xn * m) is
# then within ~32 * 2^-24 of rstd * (|g| + |xn * m|) (plus the mean terms for LayerNorm),
# and rounding it to the half dtype adds one unit in the last place.  dweight / dbias sum
# float32 terms over rows in double: within 16 * 2^-24 of the sum of |terms|, plus one
# unit in the last place of the rounded result.
F32_TERMS = 32 * 2.0 ** -24


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("d", [3, 17, 1000])
def test_norm_backward_within_float32_bounds(rng, name, d):
    dt = half(name)
    x = rows(rng, "normal", 37, d, dt)
    dy = rows(rng, "normal", 37, d, dt)
    w = (1 + 0.5 * rng.standard_normal(d)).astype(dt)
    b = rng.standard_normal(d).astype(dt)
    x64, dy64, w64 = (a.astype(np.float64) for a in (x, dy, w))

    y, c = resnorm.rms_norm_forward(x, w)
    dx, dw = resnorm.rms_norm_backward(dy, c)
    _, rstd = ref.rms_norm_forward(x64, w64)
    want_dx, want_dw = ref.rms_norm_backward(dy64, x64, w64, rstd)
    xn, g = x64 * rstd[:, None], dy64 * w64
    m = np.mean(g * xn, axis=1, keepdims=True)
    scale = rstd[:, None] * (np.abs(g) + np.abs(xn * m))
    assert dx.dtype == dw.dtype == dt
    assert np.all(np.abs(dx - want_dx) <= spacing(want_dx, dt) + F32_TERMS * scale)
    assert np.all(np.abs(dw - want_dw) <= spacing(want_dw, dt)
                  + F32_TERMS * np.abs(dy64 * xn).sum(0))

    y, c = resnorm.layer_norm_forward(x, w, b)
    dx, dw, db = resnorm.layer_norm_backward(dy, c)
    _, mean, rstd = ref.layer_norm_forward(x64, w64, b.astype(np.float64))
    want_dx, want_dw, want_db = ref.layer_norm_backward(dy64, x64, w64, mean, rstd)
    xhat = (x64 - mean[:, None]) * rstd[:, None]
    mg = g.mean(1, keepdims=True)
    mgx = (g * xhat).mean(1, keepdims=True)
    scale = rstd[:, None] * (np.abs(g) + np.abs(mg) + np.abs(xhat * mgx))
    assert np.all(np.abs(dx - want_dx) <= spacing(want_dx, dt) + F32_TERMS * scale)
    assert np.all(np.abs(dw - want_dw) <= spacing(want_dw, dt)
                  + F32_TERMS * np.abs(dy64 * xhat).sum(0))
    assert np.all(np.abs(db - want_db) <= spacing(want_db, dt) + F32_TERMS * np.abs(dy64).sum(0))


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
def test_fused_backward_within_float32_bounds(rng, name, layer):
    # the norm's backward at the stored h (float64 reference), plus dh along the stream.
    # The gradient reaching h from the norm, gh, is rounded to the half dtype in its row
    # (as torch's autograd rounds it), then gh + dh is rounded once more: half a unit of
    # each, plus the float32 bounds of the norm backward above with |dh| among the terms.
    dt = half(name)
    x, r, dy, dh = (rows(rng, "normal", 21, 33, dt) for _ in range(4))
    w = (1 + 0.5 * rng.standard_normal(33)).astype(dt)
    if layer:
        (y, h), c = resnorm.add_layer_norm_forward(x, r, w)
        dx, dres, dw, _, _ = resnorm.add_layer_norm_backward(dy, dh, c)
    else:
        (y, h), c = resnorm.add_rms_norm_forward(x, r, w)
        dx, dres, dw, _ = resnorm.add_rms_norm_backward(dy, dh, c)[:4]
    h64, dy64, dh64, w64 = (a.astype(np.float64) for a in (h, dy, dh, w))
    g = dy64 * w64
    if layer:
        gx, gw, _ = ref.layer_norm_backward(dy64, h64, w64, c.mean, c.rstd)
        hhat = (h64 - c.mean[:, None]) * c.rstd[:, None]
        mg, mgx = g.mean(1, keepdims=True), (g * hhat).mean(1, keepdims=True)
        scale = c.rstd[:, None] * (np.abs(g) + np.abs(mg) + np.abs(hhat * mgx))
    else:
        gx, gw = ref.rms_norm_backward(dy64, h64, w64, c.rstd)
        hhat = h64 * c.rstd[:, None]
        m = (g * hhat).mean(1, keepdims=True)
        scale = c.rstd[:, None] * (np.abs(g) + np.abs(hhat * m))
    assert dx.dtype == dres.dtype == dw.dtype == dt
    assert np.array_equal(dx.view(np.uint16), dres.view(np.uint16))
    want = gx + dh64
    assert np.all(np.abs(dx - want) <= 0.5 * (spacing(gx, dt) + spacing(want, dt))
                  + F32_TERMS * (scale + np.abs(dh64)))
    assert np.all(np.abs(dw - gw) <= spacing(gw, dt) + F32_TERMS * np.abs(dy64 * hhat).sum(0))


# --------------------------------------------------------------------------- elementwise

@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("d", [1, 17, 4097])
def test_dropout_and_scaled_residual_round_once(rng, name, d):
    # each output is one float32 product (and sum) rounded once: bitwise what NumPy's
    # float32 arithmetic rounded to the half dtype gives, and within one unit of float64
    dt = half(name)
    x, F, dh = (rows(rng, "mixed", 7, d, dt) for _ in range(3))
    x32, F32, dh32 = (a.astype(np.float32) for a in (x, F, dh))
    y, cache = resnorm.dropout_forward(x, 0.3, seed=5, return_mask=True)
    keep = cache.mask
    m = np.where(keep, np.float32(1 / 0.7), np.float32(0))   # x * 0 keeps x's sign
    want32 = x32 * m
    assert y.dtype == dt and np.array_equal(y.view(np.uint16), want32.astype(dt).view(np.uint16))
    assert ulps(y, ref.dropout_forward(x.astype(np.float64), 0.3, 5)[0]).max() <= 1
    dx = resnorm.dropout_backward(dh, cache)
    assert np.array_equal(dx.view(np.uint16), (dh32 * m).astype(dt).view(np.uint16))
    alpha = (0.5 + rng.random(d)).astype(dt)
    h, cache = resnorm.scaled_residual_forward(x, F, alpha)
    want = x32 + F32 * alpha.astype(np.float32)
    assert h.dtype == dt and np.array_equal(h.view(np.uint16), want.astype(dt).view(np.uint16))
    gx, gF, galpha = resnorm.scaled_residual_backward(dh, cache)
    assert np.array_equal(gx.view(np.uint16), dh.view(np.uint16))
    assert np.array_equal(gF.view(np.uint16),
                          (dh32 * alpha.astype(np.float32)).astype(dt).view(np.uint16))
    want = (dh.astype(np.float64) * F.astype(np.float64)).sum(0)
    terms = np.abs(dh.astype(np.float64) * F.astype(np.float64)).sum(0)
    assert galpha.dtype == dt
    assert np.all(np.abs(galpha - want) <= spacing(want, dt) + F32_TERMS * terms)


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("d", [1, 17, 4097])
def test_gated_residual_rounds_once(rng, name, d):
    # h = x + F * sigmoid(g) formed in float32, the sigmoid never rounded to 16 bits: the
    # float32 kernel's result on the widened inputs, rounded once; a per-channel gate gives
    # the bits of the full gate it broadcasts to
    dt = half(name)
    x, F, dh = (rows(rng, "mixed", 7, d, dt) for _ in range(3))
    g = (3 * rng.standard_normal((7, d))).astype(dt)
    gc = g[2].copy()
    x32, F32, dh32, g32 = (a.astype(np.float32) for a in (x, F, dh, g))
    x64, F64, dh64 = (a.astype(np.float64) for a in (x, F, dh))
    bits = lambda a: a.view(np.uint16)

    h, cache = resnorm.gated_residual_forward(x, F, g)
    assert h.dtype == dt
    assert np.array_equal(bits(h), bits(resnorm.gated_residual(x32, F32, g32).astype(dt)))
    assert ulps(h, ref.gated_residual_forward(x64, F64, g.astype(np.float64))).max() <= 1
    dx, dF, dg = resnorm.gated_residual_backward(dh, cache)
    want = resnorm.gated_residual_backward(dh32, resnorm.gated_residual_forward(x32, F32, g32)[1])
    assert dx.dtype == dF.dtype == dg.dtype == dt and dg.shape == g.shape
    for got, w32 in zip((dx, dF, dg), want):
        assert np.array_equal(bits(got), bits(w32.astype(dt)))

    broad = np.broadcast_to(gc, x.shape).copy()
    h, cache = resnorm.gated_residual_forward(x, F, gc)
    assert np.array_equal(bits(h), bits(resnorm.gated_residual(x, F, broad)))
    cx, cF, cg = resnorm.gated_residual_backward(dh, cache)
    fx, fF, _ = resnorm.gated_residual_backward(dh, resnorm.gated_residual_forward(x, F, broad)[1])
    assert np.array_equal(bits(cx), bits(fx)) and np.array_equal(bits(cF), bits(fF))
    # dg: the float32 terms F * (dh * s(1 - s)) summed over rows in double, rounded once
    s = 1 / (1 + np.exp(-gc.astype(np.float64)))
    terms = F64 * dh64 * s * (1 - s)
    want = terms.sum(0)
    assert cg.dtype == dt and cg.shape == (d,)
    assert np.all(np.abs(cg - want) <= spacing(want, dt) + F32_TERMS * np.abs(terms).sum(0))


# ------------------------------------------------- float32 parameters beside 16-bit rows

def _mixed_results(x, dy, w, b, zc, nt):
    """The four norm functions with float32 parameters (whatever x's dtype): outputs first,
    then the gradients."""
    out = [resnorm.rms_norm(x, w, zero_centered_weight=zc, n_threads=nt),
           resnorm.layer_norm(x, w, b, zero_centered_weight=zc, n_threads=nt)]
    y, c = resnorm.rms_norm_forward(x, w, zero_centered_weight=zc, n_threads=nt)
    out += [y, *resnorm.rms_norm_backward(dy, c, n_threads=nt)]
    y, c = resnorm.layer_norm_forward(x, w, b, zero_centered_weight=zc, n_threads=nt)
    out += [y, *resnorm.layer_norm_backward(dy, c, n_threads=nt)]
    y, c = resnorm.layer_norm_forward(x, None, b, n_threads=nt)   # a bias alone
    out += [y, *resnorm.layer_norm_backward(dy, c, n_threads=nt)[::2]]
    return out


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("d", [1, 3, 17, 1000, 4097])
@pytest.mark.parametrize("zc", [False, True], ids=["w", "1+w"])
def test_float32_parameters_are_the_float32_norm_rounded_once(rng, name, d, zc):
    # 16-bit x with float32 weight and bias (torch's mixed precision) is, bit for bit, the
    # float32 norm of the widened rows with each output rounded once to x's dtype; dweight
    # and dbias are the float32 norm's, in float32; any thread count
    dt = half(name)
    x, dy = rows(rng, "mixed", 37, d, dt), rows(rng, "normal", 37, d, dt)
    w = (1 + 0.5 * rng.standard_normal(d)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    want = _mixed_results(x.astype(np.float32), dy.astype(np.float32), w, b, zc, 1)
    for nt in (1, 2, 4):
        got = _mixed_results(x, dy, w, b, zc, nt)
        for k, (g, f) in enumerate(zip(got, want)):
            if f is None:
                assert g is None, k
            elif g.shape == x.shape:   # outputs and dx: x's dtype, rounded once
                assert is_rounded_once(g, f, dt), k
            else:                      # dweight, dbias: float32
                assert g.dtype == np.float32 and np.array_equal(g, f), k


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("n", [5, 16, 37])
def test_half_parameters_backward_is_the_float32_backward_rounded_once(rng, name, n):
    # 16-bit weight and bias (read at every row, or widened to float32 once per call from
    # 16 rows on: the same arithmetic): dx is bitwise the float32 backward of the widened
    # rows and parameters, rounded once; dweight and dbias, summed in float64 and rounded
    # once to the 16-bit type, are within one unit in the last place of float32's (which
    # are rounded to float32 first)
    dt = half(name)
    for d in (3, 1000):
        (x, dy, w, b), f32 = half_inputs(rng, dt, n, d, ("mixed", "normal"))
        for nt in (1, 2):
            for layer in (False, True):
                def grads(x, dy, w, b):
                    if layer:
                        return resnorm.layer_norm_backward(
                            dy, resnorm.layer_norm_forward(x, w, b)[1], n_threads=nt)
                    return resnorm.rms_norm_backward(
                        dy, resnorm.rms_norm_forward(x, w)[1], n_threads=nt)

                got, want = grads(x, dy, w, b), grads(*f32)
                assert is_rounded_once(got[0], want[0], dt), (d, nt, layer)
                for g, f in zip(got[1:], want[1:]):
                    f64 = f.astype(np.float64)
                    assert g.dtype == dt
                    assert np.all(np.abs(g.astype(np.float64) - f64) <= spacing(f64, dt))


@pytest.mark.skipif(bf16 is None, reason="ml_dtypes is not installed")
@pytest.mark.parametrize("pdt", ["bfloat16", "float32"])
def test_layer_norm_backward_rows_whose_deviation_overflows_float32(rng, pdt):
    # bfloat16 rows spanning +-3e38 among ordinary rows: x - mean overflows float32, and
    # such a row takes the careful path (in double), with bfloat16 parameters (widened once
    # for 20 rows) and with float32 ones.  Its dx is within one unit in the last place of
    # the float64 reference; the other rows' dx is bitwise the float32 backward of the
    # widened rows, rounded once, and so are the parameters' gradients (with bfloat16
    # parameters within one unit in the last place: see above)
    n, d = 20, 64
    x = rng.standard_normal((n, d))
    for r in (3, 10):
        x[r] = -3e38
        x[r, ::5] = 3e38
    x, dy = x.astype(bf16), rows(rng, "normal", n, d, bf16)
    pt = bf16 if pdt == "bfloat16" else np.float32
    w = (1 + 0.5 * rng.standard_normal(d)).astype(pt)
    b = rng.standard_normal(d).astype(pt)
    x64, dy64, w64 = (a.astype(np.float64) for a in (x, dy, w))
    _, mean, rstd = ref.layer_norm_forward(x64, w64, b.astype(np.float64))
    want_dx = ref.layer_norm_backward(dy64, x64, w64, mean, rstd)[0]
    f32 = [a.astype(np.float32) for a in (x, dy, w, b)]
    want = resnorm.layer_norm_backward(f32[1], resnorm.layer_norm_forward(f32[0], *f32[2:])[1])
    rare = np.isin(np.arange(n), (3, 10))
    for nt in (1, 2):
        dx, dw, db = resnorm.layer_norm_backward(dy, resnorm.layer_norm_forward(x, w, b)[1],
                                                 n_threads=nt)
        assert np.all(np.isfinite(dx.astype(np.float64)))
        assert ulps(dx[rare], want_dx[rare]).max() <= 1
        assert is_rounded_once(dx[~rare], want[0][~rare], bf16)
        for g, f in zip((dw, db), want[1:]):
            f64 = f.astype(np.float64)
            assert g.dtype == pt
            assert np.all(np.abs(g.astype(np.float64) - f64) <= (spacing(f64, bf16)
                                                                 if pt is bf16 else 0))


@pytest.mark.parametrize("name", HALVES)
def test_float32_parameters_streamed_outputs_give_the_same_bits(rng, name):
    # outputs stored with non-temporal stores (large outputs) hold the bits of ordinary
    # stores, at any alignment of the output and any thread count
    from resnorm import _parallel
    dt = half(name)
    x, dy = rows(rng, "normal", 21, 203, dt), rows(rng, "normal", 21, 203, dt)
    w = (1 + rng.standard_normal(203)).astype(np.float32)
    old = _parallel.STREAM_MIN_BYTES

    def run(nt, offset):
        out = [np.empty(x.size + offset, dt)[offset:].reshape(x.shape) for _ in range(4)]
        resnorm.rms_norm(x, w, out=out[0], n_threads=nt)
        resnorm.layer_norm(x, w, w, out=out[1], n_threads=nt)
        _, c = resnorm.layer_norm_forward(x, w, w)
        dw = resnorm.layer_norm_backward(dy, c, out=out[2], n_threads=nt)[1:]
        _, c = resnorm.rms_norm_forward(x, w)
        dw += resnorm.rms_norm_backward(dy, c, out=out[3], n_threads=nt)[1:]
        return [a.view(np.uint16) for a in out] + list(dw)

    for nt in (1, 2):
        for offset in (0, 1):
            try:
                _parallel.STREAM_MIN_BYTES = 1 << 62
                plain = run(nt, offset)
                _parallel.STREAM_MIN_BYTES = 0
                streamed = run(nt, offset)
            finally:
                _parallel.STREAM_MIN_BYTES = old
            for a, b in zip(plain, streamed):
                assert np.array_equal(a, b)


@pytest.mark.parametrize("name", HALVES)
def test_float32_parameters_within_one_ulp_of_float64(rng, name):
    dt = half(name)
    x = rows(rng, "offset", 9, 333, dt)
    w = (1 + 0.5 * rng.standard_normal(333)).astype(np.float32)
    b = rng.standard_normal(333).astype(np.float32)
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    assert ulps(resnorm.rms_norm(x, w), ref.rms_norm_forward(x64, w64)[0]).max() <= 1
    assert ulps(resnorm.layer_norm(x, w, b), ref.layer_norm_forward(x64, w64, b64)[0]).max() <= 1
    # multi-axis parameters, as normalized_shape says
    x3 = x.reshape(9, 9, 37)
    w3 = w.reshape(9, 37)
    y = resnorm.rms_norm(x3, w3, normalized_shape=(9, 37))
    assert np.array_equal(y.reshape(9, 333).view(np.uint16),
                          resnorm.rms_norm(x, w).view(np.uint16))


@pytest.mark.parametrize("name", HALVES)
def test_float32_parameters_read_only_and_strided_inputs_unchanged(rng, name):
    dt = half(name)
    x = rows(rng, "normal", 8, 40, dt)[:, ::2]
    w = (1 + rng.standard_normal(40)).astype(np.float32)[::2]
    x.flags.writeable = False
    before = x.copy()
    y, c = resnorm.layer_norm_forward(x, w, w)
    assert np.array_equal(x.view(np.uint16), before.view(np.uint16))
    assert np.array_equal(y.view(np.uint16),
                          resnorm.layer_norm(before.copy(), w.copy(), w.copy()).view(np.uint16))
    out = np.empty_like(x)
    assert resnorm.layer_norm(x, w, w, out=out) is out


@pytest.mark.parametrize("name", HALVES)
def test_float32_parameters_cache_checked(rng, name):
    import dataclasses
    dt = half(name)
    x = rows(rng, "normal", 4, 8, dt)
    w = np.ones(8, np.float32)
    _, c = resnorm.rms_norm_forward(x, w)
    assert c.param_dtype == np.float32 and c.weight.dtype == np.float32
    for edit in [dict(param_dtype=None), dict(param_dtype=np.dtype(np.float64)),
                 dict(weight=w.astype(dt)), dict(x=x.astype(np.float32))]:
        with pytest.raises(ValueError, match="cache"):
            resnorm.rms_norm_backward(x, dataclasses.replace(c, **edit))
    _, c = resnorm.rms_norm_forward(x, w.astype(dt))
    assert c.param_dtype is None
    # the fused add + norm's cache likewise
    _, c = resnorm.add_rms_norm_forward(x, x, w)
    assert c.param_dtype == np.float32
    for edit in [dict(param_dtype=None), dict(param_dtype=np.dtype(np.float64)),
                 dict(weight=w.astype(dt))]:
        with pytest.raises(ValueError, match="cache"):
            resnorm.add_rms_norm_backward(x, x, dataclasses.replace(c, **edit))
    _, c = resnorm.add_rms_norm_forward(x.astype(np.float32), x.astype(np.float32), w)
    with pytest.raises(ValueError, match="cache"):   # float32 rows: no float32 param_dtype
        resnorm.add_rms_norm_backward(x, x, dataclasses.replace(
            c, param_dtype=np.dtype(np.float32)))


def _fused_mixed(layer, prenorm, x, r, dy, dh, w, b, nt, **kw):
    """A fused training forward and its backward with float32 parameters: the outputs, then
    the gradients (16-bit arrays as their bit patterns)."""
    name = ("add_layer_norm" if layer else "add_rms_norm") + ("" if prenorm else "_post")
    params = (w, b) if layer else (w,)
    out, cache = getattr(resnorm, name + "_forward")(x, r, *params, n_threads=nt, **kw)
    backward = getattr(resnorm, name + "_backward")
    grads = backward(dy, dh, cache, n_threads=nt) if prenorm else backward(dy, cache,
                                                                          n_threads=nt)
    got = [a.view(np.uint16) if a.dtype == x.dtype else a
           for a in (*(out if prenorm else (out,)), *grads) if a is not None]
    return got, cache


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
@pytest.mark.parametrize("prenorm", [True, False], ids=["pre", "post"])
@pytest.mark.parametrize("d", [1, 17, 1000])
def test_fused_float32_parameters_are_the_mixed_norm_of_h(rng, name, layer, prenorm, d):
    # the fused add + norm with float32 parameters: h = residual + alpha * dropout(x) as the
    # 16-bit fused kernels form and round it, then the mixed norm of h, bit for bit; in
    # backward the mixed norm's gradient (rounded to x's dtype), plus dh, rounded once, then
    # through the add; dweight and dbias float32.  The same bits for any thread count.
    dt = half(name)
    x, r, dy, dh = (rows(rng, "mixed", 23, d, dt) for _ in range(4))
    w = (1 + 0.5 * rng.standard_normal(d)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    params = (w, b) if layer else (w,)
    norm_forward = resnorm.layer_norm_forward if layer else resnorm.rms_norm_forward
    norm_backward = resnorm.layer_norm_backward if layer else resnorm.rms_norm_backward
    for kw in ({}, {"alpha": 0.5, "p": 0.25, "seed": 7}):
        _, h = resnorm.add_rms_norm(x, r, **kw)   # the 16-bit kernels' h
        y, c = norm_forward(h, *params)
        gn = norm_backward(dy, c)
        gh = gn[0].astype(np.float32)
        if prenorm:
            gh = gh + dh.astype(np.float32)
        base, cache = _fused_mixed(layer, prenorm, x, r, dy, dh, w, b, 1, **kw)
        assert cache.param_dtype == np.float32
        got = list(base)
        assert np.array_equal(got[0], y.view(np.uint16))
        if prenorm:
            assert np.array_equal(got.pop(1), h.view(np.uint16))
        dx, dres, dparams = got[1], got[2], got[3:]
        assert np.array_equal(dres, gh.astype(dt).view(np.uint16))
        keep = resnorm.dropout(np.ones(x.shape, np.float32), kw.get("p", 0.0),
                               seed=kw.get("seed", 0))
        want_dx = gh * np.float32(kw.get("alpha", 1.0)) * keep
        assert np.array_equal(dx, want_dx.astype(dt).view(np.uint16))
        for g, want in zip(dparams, gn[1:]):
            assert g.dtype == np.float32
            if not kw:   # the same row groups as the norm's own backward: the same sums
                assert np.array_equal(g, want)
            else:        # with dropout, a row at a time: float32 rounding apart
                assert np.allclose(g, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
        for nt in (2, 4):
            again, _ = _fused_mixed(layer, prenorm, x, r, dy, dh, w, b, nt, **kw)
            assert all(np.array_equal(a, g) for a, g in zip(again, base))


@pytest.mark.parametrize("name", HALVES)
def test_fused_float32_parameters_other_forms(rng, name):
    # the inference forms, a bias alone, a zero-centred weight, a learnable alpha, and
    # streamed outputs give what the training forms give
    from resnorm import _parallel
    dt = half(name)
    x, r, dy, dh = (rows(rng, "normal", 9, 203, dt) for _ in range(4))
    w = rng.standard_normal(203).astype(np.float32)
    _, h = resnorm.add_rms_norm(x, r)
    y, h2 = resnorm.add_layer_norm(x, r, None, w)
    assert np.array_equal(y.view(np.uint16), resnorm.layer_norm(h, None, w).view(np.uint16))
    assert np.array_equal(h2.view(np.uint16), h.view(np.uint16))
    y = resnorm.add_rms_norm_post(x, r, w, zero_centered_weight=True)
    want = resnorm.rms_norm(h, w, zero_centered_weight=True)
    assert np.array_equal(y.view(np.uint16), want.view(np.uint16))
    alpha = np.asarray(0.75, dt)
    (y, h), c = resnorm.add_rms_norm_forward(x, r, w, alpha=alpha)
    grads = resnorm.add_rms_norm_backward(dy, dh, c)
    _, fc = resnorm.add_rms_norm_forward(x, r, w.astype(dt), alpha=alpha)
    assert grads[3].dtype == dt and grads[3].shape == ()
    assert np.allclose(grads[3].astype(np.float64),
                       resnorm.add_rms_norm_backward(dy, dh, fc)[3].astype(np.float64),
                       rtol=2 ** -6)
    old = _parallel.STREAM_MIN_BYTES
    try:
        _parallel.STREAM_MIN_BYTES = 0
        streamed = resnorm.add_rms_norm_backward(dy, dh, resnorm.add_rms_norm_forward(
            x, r, w, alpha=alpha)[1])
        ys, hs = resnorm.add_rms_norm(x, r, w, alpha=alpha)
    finally:
        _parallel.STREAM_MIN_BYTES = old
    assert np.array_equal(ys.view(np.uint16), y.view(np.uint16))
    assert np.array_equal(hs.view(np.uint16), h.view(np.uint16))
    for a, g in zip(streamed, grads):
        assert np.array_equal(np.ravel(a).view(np.uint8), np.ravel(g).view(np.uint8))


# --------------------------------------------------------------------------- checks

@pytest.mark.parametrize("name", HALVES)
def test_mixed_dtypes_refused_naming_the_argument(rng, name):
    dt = half(name)
    x = rows(rng, "normal", 2, 8, dt)
    with pytest.raises(TypeError, match="weight must have dtype float32"):
        resnorm.layer_norm(x, np.ones(8, dt), np.ones(8, np.float32))   # one or the other
    with pytest.raises(TypeError, match="weight"):
        resnorm.rms_norm(x, np.ones(8, np.float64))
    with pytest.raises(TypeError, match="bias must have dtype float32"):   # the fused too
        resnorm.add_layer_norm(x, x, np.ones(8, np.float32), np.ones(8, dt))
    with pytest.raises(TypeError, match="weight"):   # float32 x: float32 parameters only
        resnorm.rms_norm(x.astype(np.float32), np.ones(8, dt))
    with pytest.raises(TypeError, match="residual"):
        resnorm.add_rms_norm(x, x.astype(np.float32))
    with pytest.raises(TypeError, match="g"):
        resnorm.gated_residual(x, x, x.astype(np.float32))
    with pytest.raises(TypeError, match=r"float32, float64, float16 or bfloat16, got int32"):
        resnorm.rms_norm(x.astype(np.float32).astype(np.int32))


def test_float16_eps_is_checked_in_float32():
    x = np.ones((2, 4), np.float16)
    resnorm.rms_norm(x, eps=1e-30)   # below float16's smallest normal, fine in float32
    with pytest.raises(ValueError, match="eps"):
        resnorm.rms_norm(x, eps=1e-39)


# --------------------------------------------------------------------------- reproducibility

@pytest.mark.parametrize("name", HALVES)
def test_identical_for_any_thread_count(rng, name):
    dt = half(name)
    x, r, dy = (rows(rng, "normal", 600, 1024, dt) for _ in range(3))
    w = (1 + 0.5 * rng.standard_normal(1024)).astype(dt)

    def run(nt):
        out = []
        y, c = resnorm.layer_norm_forward(x, w, w, n_threads=nt)
        out += [y, *resnorm.layer_norm_backward(dy, c, n_threads=nt)]
        y, c = resnorm.rms_norm_forward(x, w, n_threads=nt)
        out += [y, *resnorm.rms_norm_backward(dy, c, n_threads=nt)]
        (y, h), c = resnorm.add_rms_norm_forward(x, r, w, n_threads=nt)
        out += [y, h, *resnorm.add_rms_norm_backward(dy, dy, c, n_threads=nt)[:3]]
        for gate in (r, w):   # a full and a per-channel gate (dg summed over row blocks)
            h, c = resnorm.gated_residual_forward(x, dy, gate, n_threads=nt)
            out += [h, *resnorm.gated_residual_backward(r, c, n_threads=nt)]
        assert all(a is not None for a in out)
        return [a.view(np.uint16) for a in out]

    base = run(1)
    for nt in (2, 4):
        for a, b in zip(run(nt), base):
            assert np.array_equal(a, b)


_LEVEL_SCRIPT = r"""
import json, sys
import numpy as np
import resnorm
from resnorm import _api
out = {}
rng = np.random.default_rng(11)
names = ["float16"]
try:
    import ml_dtypes
    names.append("bfloat16")
except ImportError:
    pass
f = rng.integers(0, 1 << 32, 100_003, dtype=np.uint64).astype(np.uint32).view(np.float32)
for name in names:
    dt = np.dtype(np.float16) if name == "float16" else np.dtype(ml_dtypes.bfloat16)
    h = np.empty(f.size, dt)
    _api.rounded(h, f)
    back = np.empty(1 << 16, np.float32)
    _api.to_float32(back, np.arange(1 << 16, dtype=np.uint16).view(dt))
    out[name + "_from"], out[name + "_to"] = h.view(np.uint16), back.view(np.uint32)
    d = rng.uniform(1, 2, 100_003) * 2.0 ** rng.integers(-160, 140, 100_003)
    h = np.empty(d.size, dt)
    _api.rounded(h, d)
    out[name + "_from64"] = h.view(np.uint16)
    for shape in [(3, 7), (5, 33), (40, 97), (300, 1031)]:
        x, r, dy = (rng.standard_normal(shape).astype(dt) for _ in range(3))
        w = (1 + 0.5 * rng.standard_normal(shape[1])).astype(dt)
        tag = f"{name}_{shape[0]}x{shape[1]}"
        y, c = resnorm.rms_norm_forward(x, w)
        res = [y, *resnorm.rms_norm_backward(dy, c)]
        y, c = resnorm.layer_norm_forward(x, w, w)
        res += [y, *resnorm.layer_norm_backward(dy, c)]
        w32 = w.astype(np.float32)   # float32 parameters (their gradients: float32)
        y, c = resnorm.layer_norm_forward(x, w32, w32)
        res += [y, *resnorm.layer_norm_backward(dy, c)]
        (y, h), c = resnorm.add_layer_norm_forward(x, r, w)
        res += [y, h, *resnorm.add_layer_norm_backward(dy, dy, c)[:3]]
        (y, h), c = resnorm.add_rms_norm_forward(x, r, w32, p=0.25, seed=3)
        res += [y, h, *resnorm.add_rms_norm_backward(dy, dy, c)[:3]]
        for gate in (r, w):
            h, c = resnorm.gated_residual_forward(x, dy, gate)
            res += [h, *resnorm.gated_residual_backward(r, c)]
        for k, a in enumerate(res):
            out[f"{tag}_{k}"] = a.view(np.uint16)
np.savez(sys.argv[1], **out)
print(json.dumps({"simd_level": resnorm.simd_level()}))
"""


def test_every_simd_level_gives_identical_bits(tmp_path):
    results = dict(run_at_level(_LEVEL_SCRIPT, tmp_path / f"{level}.npz", level)
                   for level in _core.simd_levels())
    first = next(iter(results.values()))
    for level, res in results.items():
        assert res.keys() == first.keys()
        for k in first:
            assert np.array_equal(res[k], first[k]), f"{k} differs on {level}"


@pytest.mark.parametrize("name", HALVES)
@pytest.mark.parametrize("d", [1, 2, 9])
def test_fused_layer_norm_backward_of_rows_that_round_to_a_constant(name, d):
    # rows whose float32 h is not constant but whose 16-bit h is (or, at D = 1, always):
    # the backward reads the stored h, so the forward's statistics must be that h's, or
    # xhat = (h16 - h32)*rstd is far from 0 (it reached inf)
    dt = half(name)
    step = float(np.finfo(dt).eps) / 8     # well below h's ulp at 1
    x = (np.arange(4 * d).reshape(4, d) % 3 * step).astype(np.float32)
    residual = np.ones((4, d), dt)
    dy = np.linspace(-1, 1, 4 * d).reshape(4, d).astype(dt)
    (y, h), cache = resnorm.add_layer_norm_forward(x.astype(dt), residual, np.ones(d, dt))
    assert np.all(h == 1)
    dx, dres, dw, db, _ = resnorm.add_layer_norm_backward(dy, None, cache)
    h64, dy64 = h.astype(np.float64), dy.astype(np.float64)
    y64, mean, rstd = ref.layer_norm_forward(h64, np.ones(d))
    want = ref.layer_norm_backward(dy64, h64, np.ones(d), mean, rstd)
    assert db is None
    for got, expected in zip((dx, dw), want):
        assert np.all(np.isfinite(got.astype(np.float64)))
        # one rounding to the 16-bit dtype, at the scale of the output
        tol = float(np.finfo(dt).eps) * np.abs(expected).max()
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=0, atol=tol)
    assert np.array_equal(dres, dx)
