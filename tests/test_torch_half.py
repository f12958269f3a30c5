"""resnorm.torch with float16 and bfloat16 tensors: zero-copy views, the norms against
torch's own CPU results and the float64 formula, autograd, modules after .to(dtype),
patch(), torch.autocast and torch.compile."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")   # torch.bfloat16 tensors are viewed as ml_dtypes arrays
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import resnorm.torch as rt  # noqa: E402
from resnorm.torch import _tensors as T  # noqa: E402

from _spy import spy_norms  # noqa: E402
from test_torch_modules import gemma_rms_norm as gemmas  # noqa: E402

HALVES = [torch.bfloat16, torch.float16]
ids = str


@pytest.fixture(autouse=True)
def _own_random_state():
    """These tests seed torch's global generator: restore it afterwards, so that the
    tests after them see the state they would see without these."""
    with torch.random.fork_rng():
        yield


def ordered(t):
    """16-bit patterns as integers in the order of the values (adjacent values differ by 1)."""
    u = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(u < 0, -32768 - u, u)


def ulps(a, b):
    return (ordered(a) - ordered(b)).abs().max().item()


def inputs(dtype, shape=(64, 1000), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x[1::3] = x[1::3] * 1e-2 + 3.0          # rows with an offset, rows at other scales
    w = 1 + 0.5 * torch.randn(shape[-1], generator=g, dtype=torch.float64)
    b = torch.randn(shape[-1], generator=g, dtype=torch.float64)
    return x.to(dtype), w.to(dtype), b.to(dtype)


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
def test_views_share_the_tensors_memory(dtype):
    x, w, _ = inputs(dtype, (4, 8))
    a = T.view(x)
    assert a.ctypes.data == x.data_ptr() and a.dtype.itemsize == 2
    assert T.tensor(a).dtype is dtype and T.tensor(a).data_ptr() == x.data_ptr()
    y = rt.rms_norm(x, w)
    assert y.dtype is dtype


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
def test_norms_as_torch_and_within_one_ulp_of_float64(dtype):
    # torch's CPU norms compute half precision in float32 and round once, as resnorm does:
    # on N(0,1) rows both are within one unit in the last place of the float64 formula
    # rounded once (they differ only where float32 results straddle a rounding boundary)
    x, w, b = inputs(dtype)
    d = x.shape[-1]
    plain = x[0::3]
    for rows in (x, plain):
        y = rt.layer_norm(rows, w, b, eps=1e-5)
        assert ulps(y, F.layer_norm(rows.double(), (d,), w.double(), b.double(),
                                    eps=1e-5).to(dtype)) <= 1
        y = rt.rms_norm(rows, w, eps=1e-6)
        assert ulps(y, F.rms_norm(rows.double(), (d,), w.double(), eps=1e-6).to(dtype)) <= 1
    assert ulps(rt.layer_norm(plain, w, b, eps=1e-5), F.layer_norm(plain, (d,), w, b)) <= 1
    assert ulps(rt.rms_norm(plain, w, eps=1e-6), F.rms_norm(plain, (d,), w, eps=1e-6)) <= 1
    # eps=None: float32's machine epsilon, as torch takes for half precision
    assert ulps(rt.rms_norm(plain, w), F.rms_norm(plain, (d,), w)) <= 1


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
def test_where_torch_differs_layer_norm_of_offset_rows(dtype):
    # Rows whose mean is far above their spread (3 + 0.01 N(0,1)): torch's half-precision
    # LayerNorm misses the float64 result by many units in the last place (its float32
    # variance loses the small spread to the mean), resnorm's two-pass statistics in
    # float64 keep it within one.
    x, w, b = inputs(dtype)
    offset = x[1::3]
    want = F.layer_norm(offset.double(), (x.shape[-1],), w.double(), b.double()).to(dtype)
    assert ulps(rt.layer_norm(offset, w, b), want) <= 1
    assert ulps(F.layer_norm(offset, (x.shape[-1],), w, b), want) > 4


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
def test_gradients_within_float32_bounds_of_float64(dtype, layer):
    # the same bound as tests/test_half.py: one unit in the last place of the result plus
    # 32 float32 epsilons of the terms' size (dx: rstd * (|g| + |xhat * m| (+ |mean g|));
    # dweight: the sum over rows of |dy * xhat|)
    x, w, b = inputs(dtype, (37, 65))
    dy = inputs(dtype, (37, 65), seed=1)[0]
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    wide = [t.double().requires_grad_() for t in (x, w, b)]
    if layer:
        y = rt.layer_norm(*leaves)
        ref = F.layer_norm(wide[0], (65,), wide[1], wide[2], eps=1e-5)
    else:
        y = rt.rms_norm(leaves[0], leaves[1])
        ref = F.rms_norm(wide[0], (65,), wide[1], eps=T.default_eps(dtype))
    y.backward(dy)
    ref.backward(dy.double())
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    if layer:
        mean = x64.mean(1, keepdim=True)
        rstd = 1 / torch.sqrt(((x64 - mean) ** 2).mean(1, keepdim=True) + 1e-5)
        xhat = (x64 - mean) * rstd
    else:
        rstd = 1 / torch.sqrt((x64 ** 2).mean(1, keepdim=True) + T.default_eps(dtype))
        xhat = x64 * rstd
    g = dy64 * w64
    m = (g * xhat).mean(1, keepdim=True)
    scale = rstd * (g.abs() + (xhat * m).abs() + g.mean(1, keepdim=True).abs())
    f32 = 32 * 2.0 ** -24

    def unit(t):   # one unit in the last place of t in dtype, at most
        return torch.finfo(dtype).eps * t.abs() + torch.finfo(dtype).tiny

    for got, want, terms in [(leaves[0].grad, wide[0].grad, scale),
                             (leaves[1].grad, wide[1].grad, (dy64 * xhat).abs().sum(0))]:
        assert got.dtype is dtype
        assert torch.all((got.double() - want).abs() <= unit(want) + f32 * terms)


@pytest.mark.parametrize("dtype", HALVES + [torch.float32], ids=ids)
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm",
                                  "add_rms_norm_post"])
def test_gradients_with_create_graph_are_the_kernels_and_differentiable(dtype, name):
    # a backward that builds a graph returns the backward kernel's values (the differentiable
    # expressions alone, in 16 bits, were 2-4x less accurate), and they differentiate again
    # (rows without an offset: in float16, the second derivatives of offset rows overflow,
    # in torch's own LayerNorm too)
    g = torch.Generator().manual_seed(0)
    x, r, dy = (torch.randn((7, 33), generator=g).to(dtype) for _ in range(3))
    w, b = (1 + 0.5 * torch.randn(33, generator=g)).to(dtype), torch.randn(33, generator=g).to(dtype)
    fused = name.startswith("add")
    args = [x, r, w] if fused else [x, w]
    if "layer" in name:
        args.append(b)
    f = getattr(rt, name)
    leaves = [t.clone().requires_grad_() for t in args]

    def loss_grads(create_graph):
        y = f(*leaves)
        y = y[0] if isinstance(y, tuple) else y
        return torch.autograd.grad(y, leaves, dy, create_graph=create_graph)

    plain, graphed = loss_grads(False), loss_grads(True)
    for p, g in zip(plain, graphed):
        assert torch.equal(p, g.detach())
    second = torch.autograd.grad(graphed[0].double().pow(2).sum(), leaves[0])[0]
    assert second.dtype is dtype and torch.isfinite(second).all() and second.abs().sum() > 0


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
def test_modules_follow_model_to_dtype(dtype):
    torch.manual_seed(0)
    mine = nn.Sequential(rt.RMSNorm(16), rt.LayerNorm(16), rt.AddRMSNorm(16)).to(dtype)
    x = torch.randn(3, 16).to(dtype)
    y = mine[1](mine[0](x))
    assert y.dtype is dtype
    assert ulps(y, F.layer_norm(F.rms_norm(x, (16,), mine[0].weight), (16,), mine[1].weight,
                                mine[1].bias)) <= 1
    y, h = mine[2](x, y)
    assert y.dtype is h.dtype is dtype


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
def test_patch_swaps_half_precision_models(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.RMSNorm(16)).to(dtype)
    x = torch.randn(4, 16).to(dtype)
    ref = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing is left on torch
        handle = rt.patch(model)
    assert len(handle.swapped) == 2 and handle.skipped == []
    assert ulps(model(x), ref) <= 1
    handle.undo()


def test_autocast_norms_return_what_torchs_return():
    # Under CPU autocast, torch runs neither norm in lower precision: a norm receives the
    # bfloat16 output of a Linear with its own float32 parameters, and returns bfloat16.
    # The patched torch.nn norms compute that mixed case on resnorm, as torch does.
    import resnorm
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 16),
                          nn.RMSNorm(16))
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(x)
    calls = []
    with rt.patch(model), torch.autocast("cpu", dtype=torch.bfloat16), \
            spy_norms(resnorm, calls):
        got = model(x)
    assert calls == ["layer_norm_forward", "rms_norm_forward"]   # parameters want grads
    assert got.dtype is ref.dtype is torch.bfloat16
    assert torch.equal(got, ref)


def _mixed_module_pair(layer, dtype, d=200):
    """resnorm.torch's module and torch's with the same float32 parameters."""
    torch.manual_seed(1)
    m, t = ((rt.LayerNorm(d), nn.LayerNorm(d)) if layer
            else (rt.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)))
    with torch.no_grad():
        for p, q in zip(m.parameters(), t.parameters()):
            p.copy_(1 + 0.5 * torch.randn(d))
            q.copy_(p)
    return m, t


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
def test_float32_modules_take_half_input_as_resnorms_kernels(dtype, layer):
    # a float32 module given 16-bit input (torch's mixed precision): resnorm's NumPy result
    # (the float32 norm rounded once), within one unit of the float64 formula and of
    # torch's output; parameter gradients float32, summed in float64 (torch's are not:
    # LayerNorm's dweight and dbias differ from the float64 sums by ~1e-2 in bfloat16)
    import resnorm
    m, t = _mixed_module_pair(layer, dtype)
    x, _, _ = inputs(dtype, (5, 9, 200))
    dy, _, _ = inputs(dtype, (5, 9, 200), seed=4)
    params = [T.view(p.detach()) for p in m.parameters()]
    with torch.no_grad():
        y = m(x)
        assert torch.equal(m(x), y)   # the second call: the module's cached views, in C
    fn = resnorm.layer_norm_forward if layer else resnorm.rms_norm_forward
    want, cache = fn(T.view(x), *params)
    assert y.dtype is dtype and torch.equal(y, T.tensor(want))
    # torch's: the rows without an offset (torch's float16 LayerNorm loses the spread of
    # rows far from zero, see test_where_torch_differs_layer_norm_of_offset_rows)
    assert ulps(y[::3], t(x).detach()[::3]) <= 1
    x64 = x.double().requires_grad_()
    p64 = [p.detach().double().requires_grad_() for p in m.parameters()]
    y64 = (F.layer_norm(x64, (200,), *p64) if layer else F.rms_norm(x64, (200,), *p64, 1e-6))
    # float32 parameters are not 16-bit numbers: where xhat * w + b cancels, the float32
    # terms' rounding (2^-24 of |xhat * w| + |b| each, a few of them) can exceed one unit
    # of the small result
    r = y64.detach().to(dtype).double()
    info = torch.finfo(dtype)   # one unit in the last place of r (subnormals: a fixed step)
    unit = info.eps * torch.ldexp(torch.ones_like(r), torch.frexp(r).exponent - 1).clamp(
        min=info.smallest_normal)
    terms = (y64 - p64[1]).abs() + p64[1].abs() if layer else y64.abs()
    assert ((y.double() - y64).abs() <= unit + 4 * 2.0 ** -24 * terms.detach()).all()

    xr = x.clone().requires_grad_()
    y = m(xr)
    y.backward(dy)
    y64.backward(dy.double())
    grads = (resnorm.layer_norm_backward if layer else resnorm.rms_norm_backward)(
        T.view(dy), cache)
    assert xr.grad.dtype is dtype and torch.equal(xr.grad, T.tensor(grads[0]))
    for p, g, g64 in zip(m.parameters(), grads[1:], (q.grad for q in p64)):
        assert p.grad.dtype is torch.float32 and torch.equal(p.grad, T.tensor(g))
        assert torch.allclose(p.grad.double(), g64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
@pytest.mark.parametrize("prenorm", [True, False], ids=["pre", "post"])
def test_fused_add_norm_with_float32_parameters_is_torchs_composition(dtype, layer, prenorm):
    # the fused kernels take parameters of x's dtype; with float32 ones (torch.autocast)
    # the fused functions and modules compute torch's unfused composition, h = r + x
    # rounded once, then resnorm's mixed norm of that h: the same bits, the same gradients
    x, _, _ = inputs(dtype, (6, 40))
    r, _, _ = inputs(dtype, (6, 40), seed=1)
    w = (1 + 0.5 * torch.randn(40)).requires_grad_()
    b = torch.randn(40).requires_grad_() if layer else None
    name = ("add_layer_norm" if layer else "add_rms_norm") + ("" if prenorm else "_post")
    params = (w, b) if layer else (w,)
    x1, r1, x2, r2 = (t.clone().requires_grad_() for t in (x, r, x, r))
    got = getattr(rt, name)(x1, r1, *params, p=0.25, seed=7)
    h = r2 + rt.dropout(x2, 0.25, seed=7)
    y = rt.layer_norm(h, w, b) if layer else rt.rms_norm(h, w)
    want = (y, h) if prenorm else y
    outs = got if prenorm else (got,)
    for a, c in zip(outs, want if prenorm else (want,)):
        assert a.dtype is dtype and torch.equal(a, c)
    grads = torch.autograd.grad(sum(o.float().sum() for o in outs), (x1, r1, *params))
    wants = torch.autograd.grad(sum(o.float().sum() for o in (want if prenorm else (want,))),
                                (x2, r2, *params))
    for a, c in zip(grads, wants):
        assert a.dtype is c.dtype and torch.equal(a, c)
    module = (rt.AddLayerNorm if layer else rt.AddRMSNorm)(40)   # float32 parameters
    assert all(o.dtype is dtype for o in module(x, r))


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
@pytest.mark.parametrize("rows", [3, 700], ids=["small", "operator"])
def test_float32_modules_compile_with_half_input(dtype, layer, rows):
    """Beyond COMPILED_EXPRESSION_MAX elements (700 x 24) the compiled graph calls resnorm's
    operators: eager's bits.  A small call (3 x 24) is compiled as the float64 expression,
    rounded once: within one unit in the last place of eager's, and its gradients within
    float32 rounding."""
    m, _ = _mixed_module_pair(layer, dtype, 24)
    x = inputs(dtype, (rows, 24))[0].requires_grad_()
    assert (x.numel() > T.COMPILED_EXPRESSION_MAX) == (rows == 700)
    explanation = torch._dynamo.explain(m)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    assert y.dtype is dtype
    y.float().sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    gx = x.grad.clone()
    x.grad = None
    m.zero_grad()
    want = m(x)
    want.float().sum().backward()
    if rows == 700:
        assert torch.equal(y, want) and torch.equal(gx, x.grad)
    else:
        assert ulps(y, want) <= 1
        assert ulps(gx, x.grad) <= 1
    for g, p in zip(grads, m.parameters()):
        assert g.dtype is torch.float32
        if rows == 700:
            assert torch.equal(g, p.grad)
        else:
            torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
def test_compile_keeps_one_graph(dtype):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), rt.RMSNorm(8), rt.LayerNorm(8)).to(dtype)
    x = torch.randn(3, 8).to(dtype).requires_grad_()
    explanation = torch._dynamo.explain(net)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    assert y.dtype is dtype and torch.equal(y, net(x))
    (gx,) = torch.autograd.grad(y.float().sum(), x)
    assert gx.dtype is dtype
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
@pytest.mark.parametrize("per_channel", [False, True], ids=["full", "channel"])
def test_gated_residual_runs_resnorms_half_kernels(dtype, per_channel):
    # rt.gated_residual and its backward give the bits of resnorm's 16-bit kernels, and
    # GatedResidual follows .to(dtype)
    import resnorm
    x, _, _ = inputs(dtype, (6, 40))
    F_, _, _ = inputs(dtype, (6, 40), seed=1)
    g = inputs(dtype, (6, 40), seed=2)[0] * 3
    g = g[0].clone() if per_channel else g
    dh = inputs(dtype, (6, 40), seed=3)[0]
    x, F_, g = (t.clone().requires_grad_() for t in (x, F_, g))
    h = rt.gated_residual(x, F_, g)
    h.backward(dh)
    want, cache = resnorm.gated_residual_forward(T.view(x.detach()), T.view(F_.detach()),
                                                 T.view(g.detach()))
    bits = lambda t: t.detach().contiguous().view(torch.int16)
    assert h.dtype is dtype and torch.equal(bits(h), bits(T.tensor(want)))
    for got, a in zip((x.grad, F_.grad, g.grad),
                      resnorm.gated_residual_backward(T.view(dh), cache)):
        assert got.dtype is dtype and got.shape == T.tensor(a).shape
        assert torch.equal(bits(got), bits(T.tensor(a)))
    module = rt.GatedResidual(40).to(dtype)
    assert module(x.detach(), F_.detach()).dtype is dtype


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
def test_zero_centered_rms_norm_forms_gemmas_gain_in_float32_on_every_path(dtype):
    """An RMSNorm's 16-bit zero-centred weight is applied as the float32 gain 1 + w, as
    Gemma's module forms it: the outputs are Gemma's wherever the float32 statistics round
    alike (the 16-bit gain 1 + w, formerly used, left 26-28% of them a unit apart)."""
    g = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(16, 12, 256, generator=g)).to(dtype)
    w = (0.3 * torch.randn(256, generator=g)).to(dtype)
    ref = gemmas(x, w)
    norm = rt.GemmaRMSNorm(256).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        outputs = {"module": norm(x), "module again": norm(x),   # (its views, in C)
                   "function": rt.rms_norm(x, w, 1e-6, zero_centered_weight=True),
                   "script": torch.jit.script(norm)(x),
                   "fused": rt.add_rms_norm(x, torch.zeros_like(x), w, 1e-6,
                                            zero_centered_weight=True)[0],
                   "vmap": torch.func.vmap(lambda w: rt.rms_norm(
                       x, w, 1e-6, zero_centered_weight=True))(torch.stack([w, w]))[1]}
        outputs["compiled"] = torch.compile(norm, fullgraph=True, backend="aot_eager")(x)
    torch._dynamo.reset()
    xg = x.clone().requires_grad_()
    outputs["autograd"] = norm(xg)
    for path, y in outputs.items():
        assert y.dtype is dtype, path
        assert ulps(y, ref) <= 1, path
        assert (y == ref).float().mean() >= 0.999, path
    # the weight's gradient reaches the 16-bit weight through torch's cast, as in Gemma's
    dy = torch.randn(x.shape, generator=g).to(dtype)
    dx, dw = torch.autograd.grad(outputs["autograd"], (xg, norm.weight), dy)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref_dx, ref_dw = torch.autograd.grad(gemmas(xr, wr), (xr, wr), dy)
    assert dw.dtype is dtype and ulps(dw, ref_dw) <= 1
    assert (dx.float() - ref_dx.float()).abs().max() <= (
        torch.finfo(dtype).eps * ref_dx.float().abs().max())
    # the module's views see a weight changed in place (.data: no version counted)
    w2 = (0.3 * torch.randn(256, generator=g)).to(dtype)
    norm.weight.data.copy_(w2)
    with torch.no_grad():
        assert torch.equal(norm(x), rt.rms_norm(x, w2, 1e-6, zero_centered_weight=True))
        assert ulps(norm(x), gemmas(x, w2)) <= 1
    # LayerNorm keeps resnorm's rule, 1 + w in w's dtype (Nemotron's LayerNorm1P)
    assert torch.equal(rt.layer_norm(x, w, None, 1e-6, zero_centered_weight=True),
                       rt.layer_norm(x, 1 + w, None, 1e-6))


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
def test_fused_zero_centered_rms_norm_takes_gemmas_float32_gain(dtype):
    """The fused add + RMSNorm with a 16-bit zero-centred weight stays one fused pass: h as
    without a weight (rounded once), y Gemma's norm of h, the gradients the float64
    formula's within a rounding of the 16-bit results."""
    g = torch.Generator().manual_seed(4)
    x, r = ((torch.randn(32, 96, generator=g)).to(dtype).requires_grad_() for _ in range(2))
    w = (0.3 * torch.randn(96, generator=g)).to(dtype).requires_grad_()
    options = dict(alpha=0.5, p=0.1, seed=3)
    y, h = rt.add_rms_norm(x, r, w, 1e-6, zero_centered_weight=True, **options)
    _, h_plain = rt.add_rms_norm(x, r, None, 1e-6, **options)
    assert y.dtype is h.dtype is dtype and torch.equal(h, h_plain)
    y_post = rt.add_rms_norm_post(x, r, w, 1e-6, zero_centered_weight=True, **options)
    assert torch.equal(y_post, y)
    ref = gemmas(h, w)
    assert ulps(y, ref) <= 1 and (y == ref).float().mean() >= 0.999
    dy = torch.randn(y.shape, generator=g).to(dtype)
    grads = torch.autograd.grad(y, (x, r, w), dy)
    keep = rt.dropout(torch.ones(x.shape, dtype=dtype), 0.1, seed=3) != 0
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    h64 = r64 + 0.5 * x64 * keep / 0.9
    y64 = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w64)
    for got, want in zip(grads, torch.autograd.grad(y64, (x64, r64, w64), dy.double())):
        assert got.dtype is dtype
        assert (got.double() - want).abs().max() <= 2 * torch.finfo(dtype).eps * want.abs().max()


@pytest.mark.parametrize("dtype", HALVES, ids=ids)
@pytest.mark.parametrize("layer", [False, True], ids=["rms", "ln"])
@pytest.mark.parametrize("pdtype", ["same", "float32"])
def test_vmap_over_parameters_beside_16_bit_rows_rounds_once(dtype, layer, pdtype):
    """torch.func.vmap over a batch of weights (and biases) of 16-bit rows: each output is
    the unbatched call's, in x's dtype (the parameters applied in float32, rounded once)."""
    x, w, b = inputs(dtype, (6, 40))
    if pdtype == "float32":
        w, b = w.float(), b.float()
    ws, bs = torch.stack([w, 1 + w]), torch.stack([b, -b])
    if layer:
        ys = torch.func.vmap(lambda w, b: rt.layer_norm(x, w, b))(ws, bs)
        want = [rt.layer_norm(x, w_, b_) for w_, b_ in zip(ws, bs)]
    else:
        ys = torch.func.vmap(lambda w: rt.rms_norm(x, w))(ws)
        want = [rt.rms_norm(x, w_) for w_ in ws]
    assert ys.dtype is dtype
    for y, ref in zip(ys, want):
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16))


def test_other_dtypes_still_refused():
    with pytest.raises(TypeError, match="torch.float16 or torch.bfloat16, got torch.int32"):
        rt.rms_norm(torch.ones(2, 4, dtype=torch.int32))
    with pytest.raises(TypeError, match="weight must have the input's dtype"):
        rt.layer_norm(torch.ones(2, 4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.float64))
    assert np.dtype(T.numpy_dtype(torch.bfloat16)).name == "bfloat16"
