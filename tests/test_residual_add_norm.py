"""Fused add + RMSNorm / LayerNorm, Pre-Norm and Post-Norm, forward and backward."""
import numpy as np
import pytest

import resnorm as rn
from resnorm import _parallel, reference
from _residual_testing import (THREADED_SHAPE, THREADS, assert_grad, numeric_grad, read_only,
                               strided)

DTYPES = (np.float32, np.float64)
VARIANTS = [("rms", True), ("rms", False), ("layer", True), ("layer", False)]
VARIANT_IDS = ["rms-pre", "rms-post", "layer-pre", "layer-post"]


def forward(kind, prenorm, x, residual, weight=None, bias=None, **kw):
    """(outputs, cache) of one variant: outputs (y, h) for Pre-Norm, (y,) for Post-Norm."""
    if kind == "rms":
        fn = rn.add_rms_norm_forward if prenorm else rn.add_rms_norm_post_forward
        out, cache = fn(x, residual, weight, **kw)
    else:
        fn = rn.add_layer_norm_forward if prenorm else rn.add_layer_norm_post_forward
        out, cache = fn(x, residual, weight, bias, **kw)
    return (out if prenorm else (out,)), cache


def backward(kind, prenorm, dy, dh, cache, **kw):
    """(dx, dresidual, dweight, dbias, dalpha) of one variant (dbias None for RMSNorm)."""
    if kind == "rms":
        if prenorm:
            dx, dr, dw, da = rn.add_rms_norm_backward(dy, dh, cache, **kw)
        else:
            dx, dr, dw, da = rn.add_rms_norm_post_backward(dy, cache, **kw)
        return dx, dr, dw, None, da
    if prenorm:
        return rn.add_layer_norm_backward(dy, dh, cache, **kw)
    return rn.add_layer_norm_post_backward(dy, cache, **kw)


def inference(kind, prenorm, x, residual, weight=None, bias=None, **kw):
    if kind == "rms":
        if prenorm:
            return rn.add_rms_norm(x, residual, weight, **kw)
        return (rn.add_rms_norm_post(x, residual, weight, **kw),)
    if prenorm:
        return rn.add_layer_norm(x, residual, weight, bias, **kw)
    return (rn.add_layer_norm_post(x, residual, weight, bias, **kw),)


def reference_forward_backward(kind, x, residual, weight, bias, alpha, p, seed, dy, dh):
    """The float64 reference, built from separate reference steps."""
    alpha64 = np.asarray(alpha, dtype=np.float64)
    if kind == "rms":
        y, h, rstd, keep = reference.add_rms_norm_forward(x, residual, weight, 1e-6, alpha64, p,
                                                          seed)
        dx, dr, dw, da = reference.add_rms_norm_backward(dy, dh, x, h, weight, rstd, alpha64,
                                                         keep, p)
        return y, h, (dx, dr, dw, None, da)
    y, h, mean, rstd, keep = reference.add_layer_norm_forward(x, residual, weight, bias, 1e-5,
                                                              alpha64, p, seed)
    grads = reference.add_layer_norm_backward(dy, dh, x, h, weight, mean, rstd, alpha64, keep, p)
    return y, h, grads


def inputs(shape, dtype, seed=0, alpha_kind="fixed"):
    rng = np.random.default_rng(seed)
    d = shape[-1]
    x = rng.standard_normal(shape).astype(dtype)
    residual = (2 * rng.standard_normal(shape) + 0.5).astype(dtype)
    weight = (1 + 0.3 * rng.standard_normal(d)).astype(dtype)
    bias = (0.2 * rng.standard_normal(d)).astype(dtype)
    alpha = {"fixed": 0.7, "one": 1.0, "scalar": np.asarray(0.6, dtype=dtype),
             "channel": (0.5 + rng.random(d)).astype(dtype)}[alpha_kind]
    return x, residual, weight, bias, alpha


# --------------------------------------------------------------------------- the composition

def test_reference_is_the_composition_of_separate_reference_steps():
    x, r, w, b, _ = inputs((4, 9), np.float64)
    alpha = np.linspace(0.5, 1.5, 9)
    d, keep = reference.dropout_forward(x, 0.3, 17)
    h = r + alpha * d
    y, h_ref, _, keep_ref = reference.add_rms_norm_forward(x, r, w, 1e-6, alpha, 0.3, 17)
    np.testing.assert_array_equal(h_ref, h)
    np.testing.assert_array_equal(keep_ref, keep)
    np.testing.assert_array_equal(y, reference.rms_norm_forward(h, w, 1e-6)[0])
    y_ln = reference.add_layer_norm_post_forward(x, r, w, b, 1e-5, alpha, 0.3, 17)[0]
    np.testing.assert_array_equal(y_ln, reference.layer_norm_forward(h, w, b, 1e-5)[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind, prenorm", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("alpha_kind", ["one", "fixed", "channel"])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_fused_equals_our_separate_kernels_bitwise(dtype, kind, prenorm, alpha_kind, p):
    # h is residual + alpha * dropout(x) and y is norm(h), to the last bit, in the input dtype
    x, r, w, b, alpha = inputs((37, 70), dtype, alpha_kind=alpha_kind)
    outs = inference(kind, prenorm, x, r, w, b, alpha=alpha, p=p, seed=5)
    h = r + dtype(alpha) * rn.dropout(x, p, seed=5) if alpha_kind != "channel" else \
        r + alpha * rn.dropout(x, p, seed=5)
    y = rn.rms_norm(h, w) if kind == "rms" else rn.layer_norm(h, w, b)
    assert np.array_equal(outs[0], y)
    if prenorm:
        assert np.array_equal(outs[1], h)


# --------------------------------------------------------------------------- against the reference

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind, prenorm", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("alpha_kind", ["one", "fixed", "scalar", "channel"])
@pytest.mark.parametrize("p", [0.0, 0.25])
@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 1), (1, 64), (5, 130)])
def test_matches_reference(dtype, kind, prenorm, alpha_kind, p, shape):
    x, r, w, b, alpha = inputs(shape, dtype, alpha_kind=alpha_kind)
    rng = np.random.default_rng(1)
    dy = rng.standard_normal(shape).astype(dtype)
    dh = rng.standard_normal(shape).astype(dtype) if prenorm else None
    outs, cache = forward(kind, prenorm, x, r, w, b, alpha=alpha, p=p, seed=21)
    grads = backward(kind, prenorm, dy, dh, cache)
    y_ref, h_ref, grads_ref = reference_forward_backward(kind, x, r, w, b, alpha, p, 21, dy, dh)
    rtol, atol = (2e-5, 2e-5) if dtype == np.float32 else (1e-12, 1e-12)
    np.testing.assert_allclose(outs[0], y_ref, rtol=rtol, atol=atol)
    assert outs[0].dtype == dtype and outs[0].shape == shape
    if prenorm:
        np.testing.assert_allclose(outs[1], h_ref, rtol=rtol, atol=atol)
    learnable = alpha_kind in ("scalar", "channel")
    names = ("dx", "dresidual", "dweight", "dbias", "dalpha")
    for name, g, g_ref in zip(names, grads, grads_ref):
        if name == "dbias" and kind == "rms" or name == "dalpha" and not learnable:
            assert g is None, name
            continue
        assert g.dtype == dtype and g.shape == np.shape(g_ref), name
        scale = max(1.0, float(np.max(np.abs(g_ref))))
        np.testing.assert_allclose(g, g_ref, rtol=rtol * 10, atol=atol * 10 * scale, err_msg=name)


@pytest.mark.parametrize("kind, prenorm", VARIANTS, ids=VARIANT_IDS)
def test_without_weight_bias_and_without_dh(kind, prenorm):
    x, r, _, _, alpha = inputs((4, 11), np.float64, alpha_kind="channel")
    dy = np.random.default_rng(2).standard_normal(x.shape)
    outs, cache = forward(kind, prenorm, x, r, alpha=alpha, p=0.5, seed=3)
    dx, dr, dw, db, da = backward(kind, prenorm, dy, None, cache)
    assert dw is None and db is None
    y_ref, h_ref, (dx_ref, dr_ref, _, _, da_ref) = reference_forward_backward(
        kind, x, r, None, None, alpha, 0.5, 3, dy, None)
    np.testing.assert_allclose(outs[0], y_ref, rtol=1e-12, atol=1e-12)
    for g, g_ref in ((dx, dx_ref), (dr, dr_ref), (da, da_ref)):
        np.testing.assert_allclose(g, g_ref, rtol=1e-11, atol=1e-11)


# --------------------------------------------------------------------------- finite differences

@pytest.mark.parametrize("kind, prenorm", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("alpha_kind", ["fixed", "scalar", "channel"])
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_gradients_by_finite_differences(kind, prenorm, alpha_kind, p):
    x, r, w, b, alpha = inputs((3, 5), np.float64, seed=3, alpha_kind=alpha_kind)
    rng = np.random.default_rng(4)
    dy = rng.standard_normal(x.shape)
    dh = rng.standard_normal(x.shape) if prenorm else None
    args = {"x": x, "residual": r, "weight": w, "alpha": alpha}
    if kind == "layer":
        args["bias"] = b

    def fn(**a):
        return inference(kind, prenorm, a["x"], a["residual"], a["weight"], a.get("bias"),
                         alpha=a["alpha"], p=p, seed=13)

    _, cache = forward(kind, prenorm, x, r, w, args.get("bias"), alpha=alpha, p=p, seed=13)
    dx, dr, dw, db, da = backward(kind, prenorm, dy, dh, cache)
    cot = [dy, dh]
    checks = {"x": dx, "residual": dr, "weight": dw}
    if kind == "layer":
        checks["bias"] = db
    if alpha_kind != "fixed":
        checks["alpha"] = da
    else:
        assert da is None
    for name, analytic in checks.items():
        assert_grad(analytic, numeric_grad(fn, args, name, cot), name)


def test_dropped_elements_get_no_gradient_and_p_one_keeps_the_residual():
    x, r, w, _, _ = inputs((6, 40), np.float64)
    (y, h), cache = rn.add_rms_norm_forward(x, r, w, p=0.5, seed=2)
    keep = rn.dropout_forward(x, 0.5, seed=2, return_mask=True)[1].mask
    dx = rn.add_rms_norm_backward(np.ones_like(x), None, cache)[0]
    assert np.all(dx[~keep] == 0) and np.all(dx[keep] != 0)
    y1, h1 = rn.add_rms_norm(x, r, w, p=1.0, seed=2)
    assert np.array_equal(h1, r) and np.array_equal(y1, rn.rms_norm(r, w))


def test_eval_mode_is_the_plain_sum():
    x, r, w, _, _ = inputs((6, 40), np.float32)
    y, h = rn.add_rms_norm(x, r, w, p=0.5, seed=2, training=False)
    assert np.array_equal(h, r + x) and np.array_equal(y, rn.rms_norm(r + x, w))


# --------------------------------------------------------------------------- threads

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind, prenorm", VARIANTS, ids=VARIANT_IDS)
def test_bitwise_identical_across_thread_counts(dtype, kind, prenorm):
    x, r, w, b, alpha = inputs(THREADED_SHAPE, dtype, alpha_kind="channel")
    rng = np.random.default_rng(5)
    dy = rng.standard_normal(x.shape).astype(dtype)
    dh = rng.standard_normal(x.shape).astype(dtype) if prenorm else None
    results = []
    for t in THREADS:
        outs, cache = forward(kind, prenorm, x, r, w, b, alpha=alpha, p=0.2, seed=6, n_threads=t)
        grads = backward(kind, prenorm, dy, dh, cache, n_threads=t)
        results.append([a for a in (*outs, *grads) if a is not None])
    for other in results[1:]:
        for a, b_ in zip(results[0], other):
            assert np.array_equal(a, b_)


@pytest.mark.parametrize("shape", [(1, 40000), (3, 20000), (2, 1)])
def test_fewer_rows_than_threads_and_single_columns(shape):
    x, r, w, b, alpha = inputs(shape, np.float64, alpha_kind="scalar")
    dy = np.random.default_rng(7).standard_normal(shape)
    outs, cache = forward("layer", True, x, r, w, b, alpha=alpha, p=0.1, seed=1, n_threads=4)
    grads = backward("layer", True, dy, None, cache, n_threads=4)
    y_ref, h_ref, grads_ref = reference_forward_backward("layer", x, r, w, b, alpha, 0.1, 1, dy,
                                                         None)
    np.testing.assert_allclose(outs[0], y_ref, rtol=1e-10, atol=1e-10)
    for g, g_ref in zip(grads, grads_ref):
        np.testing.assert_allclose(g, g_ref, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- layouts, buffers

@pytest.mark.parametrize("kind, prenorm", VARIANTS, ids=VARIANT_IDS)
def test_non_contiguous_and_read_only_inputs_unchanged(kind, prenorm):
    x, r, w, b, alpha = inputs((9, 33), np.float32, alpha_kind="channel")
    expected = inference(kind, prenorm, x, r, w, b, alpha=alpha, p=0.3, seed=4)
    for make in (strided, read_only, np.asfortranarray):
        xs, rs, ws, bs, al = (make(a) for a in (x, r, w, b, alpha))
        before = [a.copy() for a in (xs, rs, ws, bs, al)]
        got = inference(kind, prenorm, xs, rs, ws, bs, alpha=al, p=0.3, seed=4)
        for g, e in zip(got, expected):
            assert np.array_equal(g, e)
        for a, a0 in zip((xs, rs, ws, bs, al), before):
            assert np.array_equal(a, a0)


def test_training_form_with_non_contiguous_inputs():
    x, r, w, _, alpha = inputs((5, 12), np.float64, alpha_kind="channel")
    dy = np.random.default_rng(8).standard_normal(x.shape)
    _, cache = rn.add_rms_norm_post_forward(strided(x), strided(r), w, alpha=alpha, p=0.3, seed=1)
    _, cache_c = rn.add_rms_norm_post_forward(x, r, w, alpha=alpha, p=0.3, seed=1)
    for g, g_c in zip(rn.add_rms_norm_post_backward(strided(dy), cache),
                      rn.add_rms_norm_post_backward(dy, cache_c)):
        assert np.array_equal(g, g_c)


@pytest.mark.parametrize("layer", [False, True])
def test_residual_stream_updated_in_place(layer):
    x, r, w, b, _ = inputs((8, 24), np.float32)
    expected = (rn.add_layer_norm(x, r, w, b, p=0.1, seed=1) if layer
                else rn.add_rms_norm(x, r, w, p=0.1, seed=1))
    stream, y = r.copy(), np.empty_like(x)
    if layer:
        got = rn.add_layer_norm(x, stream, w, b, p=0.1, seed=1, out=y, residual_out=stream)
    else:
        got = rn.add_rms_norm(x, stream, w, p=0.1, seed=1, out=y, residual_out=stream)
    assert got[0] is y and got[1] is stream
    assert np.array_equal(stream, expected[1]) and np.array_equal(y, expected[0])
    # out=x as well: both inputs overwritten by the two outputs
    xx, rr = x.copy(), r.copy()
    rn.add_rms_norm(xx, rr, w, out=xx, residual_out=rr)
    y0, h0 = rn.add_rms_norm(x, r, w)
    assert np.array_equal(xx, y0) and np.array_equal(rr, h0)


def at_offset(shape, dtype, offset):
    """An empty C-contiguous array whose data starts `offset` elements past a 64-byte
    boundary (the vector width of the widest SIMD level)."""
    size = int(np.prod(shape))
    raw = np.empty(size + 64, dtype)
    start = (-raw.ctypes.data % 64) // raw.itemsize + offset
    return raw[start:start + size].reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES + (np.float16,))
@pytest.mark.parametrize("kind, prenorm", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("alpha_kind, p", [("one", 0.0), ("channel", 0.3)])
def test_backward_outputs_at_any_offset_from_a_vector_boundary(dtype, kind, prenorm,
                                                               alpha_kind, p):
    """out and dresidual_out at every pair of offsets (the kernels write each in a loop
    aligned to it when the two differ) get the bits of aligned outputs, on 1 and 2 threads,
    and so does dresidual_out=dh in place (the second loop reads g back from it)."""
    shape = (5, 133)
    x, r, w, b, alpha = inputs(shape, dtype, seed=4, alpha_kind=alpha_kind)
    rng = np.random.default_rng(5)
    dy, dh = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    dh = dh if prenorm else None
    _, cache = forward(kind, prenorm, x, r, w, b if kind == "layer" else None, alpha=alpha,
                       p=p, seed=3)
    want = backward(kind, prenorm, dy, dh, cache, out=at_offset(shape, dtype, 0),
                    dresidual_out=at_offset(shape, dtype, 0))
    for o1, o2 in [(0, 1), (3, 0), (1, 2), (5, 5), (15, 4)]:
        for nt in (1, 2):
            got = backward(kind, prenorm, dy, dh, cache, out=at_offset(shape, dtype, o1),
                           dresidual_out=at_offset(shape, dtype, o2), n_threads=nt)
            for g0, g1 in zip(want, got):
                assert (g0 is None) == (g1 is None)
                assert g0 is None or np.array_equal(g0, g1)
    if prenorm:
        for o1, o2 in [(0, 3), (3, 0)]:
            stream = at_offset(shape, dtype, o2)
            stream[...] = dh
            got = backward(kind, prenorm, dy, stream, cache, out=at_offset(shape, dtype, o1),
                           dresidual_out=stream)
            assert got[1] is stream
            assert all(g0 is None or np.array_equal(g0, g1) for g0, g1 in zip(want, got))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind, prenorm, with_dh",
                         [(k, p, d) for k, p in VARIANTS for d in (True, False) if p or not d])
def test_backward_is_the_norm_backward_plus_dh_bitwise(dtype, kind, prenorm, with_dh):
    """Without alpha or dropout, dx and dresidual are both the gradient reaching h (plus dh),
    which the norm's apply pass writes at once: to the last bit our norm's backward at h,
    then the add in the input dtype.  Streamed or not, out and dresidual_out at the same or
    different offsets from a vector boundary, 1 and 2 threads, and a LayerNorm row whose
    x - mean overflows the dtype (the scalar path, then the add)."""
    shape = (131, 128)   # rows of whole vectors (the streamed groups go chunk by chunk)
    x, r, w, b, _ = inputs(shape, dtype, seed=6)
    rng = np.random.default_rng(7)
    dy, dh = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    dh = dh if with_dh else None
    if kind == "layer":
        big = np.finfo(dtype).max / 2
        x[9], r[9] = big, 0
        x[9, 5] = -big
    with np.errstate(over="ignore", invalid="ignore"):
        h = r + x
        if kind == "rms":
            _, norm_cache = rn.rms_norm_forward(h, w)
            gh, *dparams = rn.rms_norm_backward(dy, norm_cache)
        else:
            _, norm_cache = rn.layer_norm_forward(h, w, b)
            gh, *dparams = rn.layer_norm_backward(dy, norm_cache)
        want = gh + dh if with_dh else gh
        _, cache = forward(kind, prenorm, x, r, w, b if kind == "layer" else None)
        saved = _parallel.STREAM_MIN_BYTES
        try:
            for stream_min in (1 << 62, 0):
                _parallel.STREAM_MIN_BYTES = stream_min
                for o1, o2 in [(0, 0), (0, 1), (3, 3)]:
                    for nt in (1, 2):
                        dx, dres, dw, db, _ = backward(
                            kind, prenorm, dy, dh, cache, out=at_offset(shape, dtype, o1),
                            dresidual_out=at_offset(shape, dtype, o2), n_threads=nt)
                        assert np.array_equal(dx, want), (stream_min, o1, o2, nt)
                        assert np.array_equal(dres, want)
                        assert np.array_equal(dw, dparams[0])
                        assert db is None or np.array_equal(db, dparams[1])
        finally:
            _parallel.STREAM_MIN_BYTES = saved


def test_residual_out_in_training_form_and_strided_out_buffers():
    x, r, w, _, alpha = inputs((6, 10), np.float64, alpha_kind="scalar")
    dy = np.random.default_rng(9).standard_normal(x.shape)
    (y0, h0), c0 = rn.add_rms_norm_forward(x, r, w, alpha=alpha, p=0.3, seed=2)
    stream = r.copy()
    out = np.zeros((6, 20))[:, ::2]
    (y1, h1), c1 = rn.add_rms_norm_forward(x, stream, w, alpha=alpha, p=0.3, seed=2, out=out,
                                           residual_out=stream)
    assert y1 is out and h1 is stream
    assert np.array_equal(out, y0) and np.array_equal(stream, h0)
    for g0, g1 in zip(rn.add_rms_norm_backward(dy, None, c0),
                      rn.add_rms_norm_backward(dy, None, c1)):
        assert np.array_equal(g0, g1)


# --------------------------------------------------------------------------- bad input

def test_shape_and_dtype_mismatches_name_the_argument():
    x, r, w, b, _ = inputs((4, 6), np.float32)
    with pytest.raises(ValueError, match="residual"):
        rn.add_rms_norm(x, r[:, :5], w)
    with pytest.raises(ValueError, match="residual"):
        rn.add_layer_norm_post(x, r.reshape(6, 4), w, b)
    with pytest.raises(TypeError, match="residual"):
        rn.add_rms_norm(x, r.astype(np.float64), w)
    with pytest.raises(TypeError, match="x"):
        rn.add_rms_norm(x.astype(np.int32), r, w)
    with pytest.raises(ValueError, match="weight"):
        rn.add_rms_norm(x, r, w[:5])
    with pytest.raises(TypeError, match="bias"):
        rn.add_layer_norm(x, r, w, b.astype(np.float64))


@pytest.mark.parametrize("alpha, error", [
    (np.ones(5, np.float32), ValueError), (np.ones((4, 6), np.float32), ValueError),
    (np.ones(6, np.float64), TypeError), (np.asarray(1.0), TypeError), (True, TypeError),
    ([1.0] * 6, TypeError), (float("inf"), ValueError), ("1", TypeError)])
def test_bad_alpha(alpha, error):
    x, r, w, _, _ = inputs((4, 6), np.float32)
    with pytest.raises(error, match="alpha"):
        rn.add_rms_norm(x, r, w, alpha=alpha)


def test_bad_dropout_arguments():
    x, r, w, _, _ = inputs((4, 6), np.float32)
    with pytest.raises(ValueError, match=r"\bp\b"):
        rn.add_rms_norm(x, r, w, p=1.5)
    with pytest.raises(ValueError, match="seed"):
        rn.add_layer_norm_post(x, r, p=0.1, seed=-3)
    with pytest.raises(TypeError, match="training"):
        rn.add_rms_norm(x, r, w, training=None)


def test_bad_output_buffers():
    x, r, w, _, alpha = inputs((4, 6), np.float64, alpha_kind="channel")
    with pytest.raises(ValueError, match="out"):
        rn.add_rms_norm(x, r, w, out=np.empty((6, 4)))
    with pytest.raises(TypeError, match="residual_out"):
        rn.add_rms_norm(x, r, w, residual_out=np.empty((4, 6), np.float32))
    with pytest.raises(ValueError, match="residual_out"):
        rn.add_rms_norm(x, r, w, residual_out=read_only(r))
    buf = np.empty_like(x)
    with pytest.raises(ValueError, match="residual_out"):
        rn.add_rms_norm(x, r, w, out=buf, residual_out=buf)
    memory = np.zeros(30)
    shifted_x = memory[:24].reshape(4, 6)
    shifted_x[...] = x
    with pytest.raises(ValueError, match="out may overlap x"):
        rn.add_rms_norm(shifted_x, r, w, out=memory[3:27].reshape(4, 6))
    # interleaved in one buffer, no element shared: the rule compares bounds, and says so
    pairs = np.zeros((4, 12))
    pairs[:, ::2] = x
    with pytest.raises(ValueError, match=r"out may overlap x \(their memory bounds meet\)"):
        rn.add_rms_norm(pairs[:, ::2], r, w, out=pairs[:, 1::2])
    # training forms: backward reads x (learnable alpha, Post-Norm) and residual (Post-Norm)
    with pytest.raises(ValueError, match="out must not overlap x"):
        rn.add_rms_norm_forward(x, r, w, alpha=alpha, out=x)
    xx = x.copy()  # a fixed alpha: Pre-Norm backward does not read x, so out=x is fine
    assert rn.add_rms_norm_forward(xx, r, w, out=xx)[0][0] is xx
    with pytest.raises(ValueError, match="out must not overlap residual"):
        rn.add_layer_norm_post_forward(x, r, out=r)


def test_backward_checks_cache_and_gradients():
    x, r, w, _, _ = inputs((4, 6), np.float32)
    _, cache = rn.add_rms_norm_forward(x, r, w)
    _, post_cache = rn.add_rms_norm_post_forward(x, r, w)
    dy = np.ones_like(x)
    with pytest.raises(TypeError, match="add_rms_norm_forward"):
        rn.add_rms_norm_backward(dy, None, post_cache)
    with pytest.raises(TypeError, match="cache"):
        rn.add_layer_norm_backward(dy, None, cache)
    with pytest.raises(TypeError, match="cache"):
        rn.add_rms_norm_post_backward(dy, object())
    with pytest.raises(ValueError, match="dy"):
        rn.add_rms_norm_backward(dy[:, :5], None, cache)
    with pytest.raises(TypeError, match="dh"):
        rn.add_rms_norm_backward(dy, dy.astype(np.float64), cache)


@pytest.mark.parametrize("kind, prenorm", VARIANTS, ids=VARIANT_IDS)
def test_backward_leaves_its_inputs_and_the_cache_unchanged(kind, prenorm):
    x, r, w, b, alpha = inputs((7, 40), np.float32, alpha_kind="channel")
    rng = np.random.default_rng(10)
    dy = read_only(rng.standard_normal(x.shape).astype(np.float32))
    dh = read_only(rng.standard_normal(x.shape).astype(np.float32)) if prenorm else None
    outs, cache = forward(kind, prenorm, x, r, w, b, alpha=alpha, p=0.3, seed=2)
    kept = [a.copy() for a in (*outs, x, r, w, b, alpha, cache.rstd)]
    first = backward(kind, prenorm, dy, dh, cache)
    second = backward(kind, prenorm, dy, dh, cache)
    for a, a0 in zip((*outs, x, r, w, b, alpha, cache.rstd), kept):
        assert np.array_equal(a, a0)
    for g1, g2 in zip(first, second):
        assert (g1 is None and g2 is None) or np.array_equal(g1, g2)


@pytest.mark.parametrize("kind, prenorm", VARIANTS, ids=VARIANT_IDS)
def test_backward_gradient_buffers(kind, prenorm):
    """out / dresidual_out receive dx / dresidual with the bits of the allocating call:
    written directly when contiguous, through a temporary when the buffer is dy or dh."""
    x, r, w, b, alpha = inputs((6, 40), np.float32, alpha_kind="channel")
    rng = np.random.default_rng(5)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dh = rng.standard_normal(x.shape).astype(np.float32) if prenorm else None
    _, cache = forward(kind, prenorm, x, r, w, b, alpha=alpha, p=0.2, seed=3)
    want = backward(kind, prenorm, dy, dh, cache)
    out, dres = np.empty_like(x), np.empty_like(x)
    got = backward(kind, prenorm, dy, dh, cache, out=out, dresidual_out=dres)
    assert got[0] is out and got[1] is dres
    for g, e in zip(got, want):
        assert (g is None and e is None) or np.array_equal(g, e)
    in_place = [("out", dy.copy(), "dy")] + ([("dresidual_out", dh.copy(), "dh")] if prenorm else [])
    for buffer, target, arg in in_place:
        kw = {"dy": dy, "dh": dh, arg: target}
        got = backward(kind, prenorm, kw["dy"], kw["dh"], cache, **{buffer: target})
        assert got[0 if buffer == "out" else 1] is target
        assert np.array_equal(target, want[0 if buffer == "out" else 1])
    held = [a for a in (cache.h, cache.x, cache.residual, cache.mean, cache.rstd) if a is not None]
    for a in held:
        view = a.reshape(-1)[:x.size].reshape(x.shape) if a.size >= x.size else None
        if view is None:
            continue
        before = view.copy()
        with pytest.raises(ValueError, match=r"\bout\b.*cache"):
            backward(kind, prenorm, dy, dh, cache, out=view)
        assert np.array_equal(view, before)
    with pytest.raises(ValueError, match="dresidual_out"):
        backward(kind, prenorm, dy, dh, cache, out=out, dresidual_out=out)
