"""resnorm.torch fused Pre-Norm add + norm (with dropout) and dropout Functions."""
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import resnorm  # noqa: E402
import resnorm.torch as rt  # noqa: E402

F = torch.nn.functional
KINDS = ["rms", "layer"]
ALPHAS = ["fixed", "scalar", "channel"]


def _inputs(shape, dtype, alpha_kind="fixed", seed=0):
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = torch.randn(shape, generator=g, dtype=dtype).requires_grad_()
    r = (torch.randn(shape, generator=g, dtype=dtype) * 2 + 0.5).requires_grad_()
    w = (1 + 0.3 * torch.randn(d, generator=g, dtype=dtype)).requires_grad_()
    b = (0.2 * torch.randn(d, generator=g, dtype=dtype)).requires_grad_()
    alpha = {"fixed": 0.7,
             "scalar": torch.tensor(0.6, dtype=dtype, requires_grad=True),
             "channel": (0.5 + torch.rand(d, generator=g, dtype=dtype)).requires_grad_()}[alpha_kind]
    return x, r, w, b, alpha


def _fused(kind, x, r, w, b, alpha, p=0.0, seed=0, training=True):
    if kind == "rms":
        return rt.add_rms_norm(x, r, w, 1e-5, alpha=alpha, p=p, seed=seed, training=training)
    return rt.add_layer_norm(x, r, w, b, 1e-5, alpha=alpha, p=p, seed=seed, training=training)


def _keep(shape, p, seed, dtype):
    """resnorm's dropout keep-mask for an array of this shape, as a tensor."""
    _, cache = resnorm.dropout_forward(np.ones(shape), p, seed=seed, return_mask=True)
    return torch.from_numpy(cache.mask).to(dtype)


def _composite(kind, x, r, w, b, alpha, p=0.0, seed=0):
    """The same computation from torch's own ops (dropout with resnorm's mask)."""
    d = x * _keep(x.shape, p, seed, x.dtype) / (1 - p) if p > 0 else x
    h = r + alpha * d
    if kind == "rms":
        return F.rms_norm(h, (h.shape[-1],), w, 1e-5), h
    return F.layer_norm(h, (h.shape[-1],), w, b, 1e-5), h


# --------------------------------------------------------------------------- gradcheck

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("alpha_kind", ALPHAS)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_add_norm_gradcheck_float64(kind, alpha_kind, p):
    x, r, w, b, alpha = _inputs((3, 2, 7), torch.float64, alpha_kind)
    tensors = [x, r, w, b] + ([alpha] if alpha_kind != "fixed" else [])

    def f(x, r, w, b, *a):
        return _fused(kind, x, r, w, b, a[0] if a else alpha, p=p, seed=11)
    assert torch.autograd.gradcheck(f, tuple(tensors))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", [0, 1])
def test_add_norm_gradcheck_with_one_output_unused(kind, which):
    """Only y (h's gradient absent) or only h (y's gradient absent) reaches the loss."""
    x, r, w, b, _ = _inputs((4, 5), torch.float64)
    assert torch.autograd.gradcheck(
        lambda x, r, w: _fused(kind, x, r, w, None, 1.0, p=0.2, seed=4)[which], (x, r, w))


@pytest.mark.parametrize("kind", KINDS)
def test_add_norm_gradcheck_without_parameters(kind):
    x, r, _, _, _ = _inputs((4, 6), torch.float64)
    assert torch.autograd.gradcheck(lambda x, r: _fused(kind, x, r, None, None, 1.0), (x, r))


def test_dropout_gradcheck_float64():
    x = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: rt.dropout(x, 0.4, seed=5), (x,))


# --------------------------------------------------------------------------- vs torch ops

@pytest.mark.parametrize("kind,alpha_kind,p", list(itertools.product(KINDS, ALPHAS, [0.0, 0.25])))
def test_add_norm_matches_torch_composite_float32(kind, alpha_kind, p):
    x, r, w, b, alpha = _inputs((2, 16, 96), torch.float32, alpha_kind)
    dy, dh = torch.randn(2, 16, 96), torch.randn(2, 16, 96)
    y, h = _fused(kind, x, r, w, b, alpha, p=p, seed=7)
    y_ref, h_ref = _composite(kind, x, r, w, b, alpha, p=p, seed=7)
    torch.testing.assert_close(h, h_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    params = [x, r, w] + ([b] if kind == "layer" else []) + (
        [alpha] if alpha_kind != "fixed" else [])
    got = torch.autograd.grad((y, h), params, (dy, dh))
    want = torch.autograd.grad((y_ref, h_ref), params, (dy, dh))
    for name, g, ref in zip("x r w b a".split(), got, want):
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"d{name}: {m}")
        assert g.shape == ref.shape and g.dtype == ref.dtype


@pytest.mark.parametrize("kind", KINDS)
def test_eval_mode_has_no_dropout(kind):
    x, r, w, b, _ = _inputs((4, 8), torch.float32)
    y, h = _fused(kind, x, r, w, b, 1.0, p=0.5, seed=3, training=False)
    torch.testing.assert_close(h, r + x)


def test_dropout_applies_the_documented_mask_forward_and_backward():
    x = torch.randn(6, 50, requires_grad=True)
    dy = torch.randn(6, 50)
    y = rt.dropout(x, 0.3, seed=9)
    keep = _keep(x.shape, 0.3, 9, torch.float32)
    assert 0.5 < keep.mean().item() < 0.9
    torch.testing.assert_close(y, x * keep / 0.7)
    (dx,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(dx, dy * keep / 0.7)
    assert not torch.equal(rt.dropout(x, 0.3, seed=10), y)      # another seed, another mask


def test_dropout_is_the_identity_in_eval_and_for_p_zero():
    x = torch.randn(3, 4)
    assert rt.dropout(x, 0.5, seed=1, training=False) is x
    assert rt.dropout(x, 0.0, seed=1) is x


DROPPING = [
    ("add_rms_norm", "AddRMSNorm", lambda x, **kw: rt.add_rms_norm(x, x, **kw)),
    ("add_layer_norm", "AddLayerNorm", lambda x, **kw: rt.add_layer_norm(x, x, **kw)),
    ("add_rms_norm_post", "AddRMSNormPost", lambda x, **kw: rt.add_rms_norm_post(x, x, **kw)),
    ("add_layer_norm_post", "AddLayerNormPost",
     lambda x, **kw: rt.add_layer_norm_post(x, x, **kw)),
    ("dropout", None, lambda x, **kw: rt.dropout(x, **kw)),
]


@pytest.mark.parametrize("name, module, call", DROPPING)
def test_seed_is_required_when_a_mask_is_drawn(name, module, call):
    x = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(TypeError, match=rf"resnorm\.torch\.{name}\b.*seed is required when "
                                        r"p > 0 in training.*same elements on every call") as e:
        call(x, p=0.1)
    assert (f"resnorm.torch.{module}" in str(e.value)) == (module is not None)
    with pytest.raises(TypeError, match="seed is required"):
        call(x, p=0.1, training=True)
    # no mask drawn (p = 0, or eval mode): no seed needed
    want = x if name == "dropout" else call(x, p=0.0, seed=1)
    for kw in ({"p": 0.0}, {"p": 0.1, "training": False}):
        torch.testing.assert_close(call(x, **kw), want)


def test_a_tensor_seed_gives_the_mask_of_the_int_it_holds():
    x = torch.randn(3, 40)
    for seed in (5, 2 ** 63 + 9):
        held = torch.tensor(seed - 2 ** 64 if seed >= 2 ** 63 else seed)
        assert torch.equal(rt.dropout(x, 0.3, seed=held), rt.dropout(x, 0.3, seed=seed))
        assert torch.equal(rt.add_rms_norm(x, x, p=0.3, seed=held)[1],
                           rt.add_rms_norm(x, x, p=0.3, seed=seed)[1])
    with pytest.raises(TypeError, match=r"seed must be an int or a 0-d torch\.int64 tensor"):
        rt.dropout(x, 0.3, seed=torch.tensor([1]))


# --------------------------------------------------------------------------- memory

def _ptr(a):
    return None if a is None else a.__array_interface__["data"][0]


def _spy(monkeypatch, name, seen):
    real = getattr(resnorm, name)

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen[name] = ([_ptr(a) if isinstance(a, np.ndarray) else a for a in args], out)
        return out
    monkeypatch.setattr(resnorm, name, spy)


def test_add_rms_norm_reads_and_writes_tensor_storage_in_place(monkeypatch):
    seen = {}
    _spy(monkeypatch, "add_rms_norm_forward", seen)
    _spy(monkeypatch, "add_rms_norm_backward", seen)
    x, r, w, _, _ = _inputs((8, 32), torch.float32)
    dy, dh = torch.randn(8, 32), torch.randn(8, 32)
    y, h = rt.add_rms_norm(x, r, w, p=0.1, seed=2)
    dx, dr, dw = torch.autograd.grad((y, h), (x, r, w), (dy, dh))
    (fx, fr, fw, _), ((fy, fh), cache) = seen["add_rms_norm_forward"]
    assert (fx, fr, fw) == (x.data_ptr(), r.data_ptr(), w.data_ptr())
    assert (_ptr(fy), _ptr(fh), _ptr(cache.h)) == (y.data_ptr(), h.data_ptr(), h.data_ptr())
    assert cache.x is None                     # fixed alpha: x not kept
    (bdy, bdh, _), (bdx, bdr, bdw, bda) = seen["add_rms_norm_backward"]
    assert (bdy, bdh) == (dy.data_ptr(), dh.data_ptr())
    assert (_ptr(bdx), _ptr(bdr), _ptr(bdw)) == (dx.data_ptr(), dr.data_ptr(), dw.data_ptr())
    assert bda is None


def test_x_is_kept_only_for_a_learnable_alpha():
    x, r, w, _, alpha = _inputs((4, 8), torch.float32, "channel")
    # saved: (h, weight, x or None, alpha or None); a tensor alpha is saved either way
    y, _ = rt.add_rms_norm(x, r, w, alpha=alpha)
    assert y.grad_fn.saved_tensors[2].data_ptr() == x.data_ptr()
    y, _ = rt.add_rms_norm(x, r, w, alpha=alpha.detach())
    assert y.grad_fn.saved_tensors[2] is None
    assert y.grad_fn.saved_tensors[3].data_ptr() == alpha.data_ptr()
    y, _ = rt.add_layer_norm(x, r, w, alpha=0.5)
    assert y.grad_fn.saved_tensors[2:] == (None, None)


def test_unused_h_gradient_reaches_the_kernel_as_none(monkeypatch):
    seen = {}
    _spy(monkeypatch, "add_layer_norm_backward", seen)
    x, r, w, b, _ = _inputs((4, 8), torch.float32)
    y, h = rt.add_layer_norm(x, r, w, b)
    y.sum().backward()
    assert seen["add_layer_norm_backward"][0][1] is None


@pytest.mark.parametrize("kind", KINDS)
def test_only_h_used_gives_no_weight_gradient_as_torch(kind):
    # torch's composition: y unused, so the weight and bias are not in the loss's graph
    x, r, w, b, alpha = _inputs((4, 8), torch.float32, "channel")
    params = [x, r, w, b, alpha]
    for y, h in (_fused(kind, x, r, w, b, alpha), _composite(kind, x, r, w, b, alpha)):
        grads = torch.autograd.grad(h.square().sum(), params, allow_unused=True)
        assert grads[2] is None and grads[3] is None
        for g, ref in zip(grads[:2] + grads[4:], (2 * h * alpha, 2 * h, (2 * h * x).sum(0))):
            torch.testing.assert_close(g, ref)


def test_threads_bitwise_reproducible():
    x, r, w, b, alpha = _inputs((128, 512), torch.float32, "channel")
    dy, dh = torch.randn(128, 512), torch.randn(128, 512)
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            y, h = rt.add_layer_norm(x, r, w, b, alpha=alpha, p=0.1, seed=8)
            results.append((y, h, *torch.autograd.grad((y, h), (x, r, w, b, alpha), (dy, dh))))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        assert all(torch.equal(a, c) for a, c in zip(results[0], other))


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("call,error,match", [
    (lambda x, r: rt.add_rms_norm(x, r[:, :7]), ValueError, "residual must have the input's shape"),
    (lambda x, r: rt.add_rms_norm(x, r.double()), TypeError, "residual must have the input's dtype"),
    (lambda x, r: rt.add_rms_norm(x, r.numpy()), TypeError, "residual must be a torch.Tensor"),
    (lambda x, r: rt.add_rms_norm(x, r, alpha=torch.ones(3)), ValueError, r"alpha must have shape \(\)"),
    (lambda x, r: rt.add_rms_norm(x, r, alpha="2"), TypeError, "alpha must be a real number"),
    (lambda x, r: rt.add_layer_norm(x, r, alpha=torch.ones(8).double()), TypeError,
     "alpha must have the input's dtype"),
    (lambda x, r: rt.add_layer_norm(x, r, p=1.5), ValueError, r"p must be in \[0, 1\]"),
    (lambda x, r: rt.add_layer_norm(x, r, p=0.1, seed=-1), ValueError, "seed must be in"),
    (lambda x, r: rt.add_layer_norm(x.to(torch.complex64), r.to(torch.complex64)), TypeError,
     "x must have dtype"),
    (lambda x, r: rt.dropout(x, 2.0, seed=0), ValueError, r"p must be in \[0, 1\]"),
    (lambda x, r: rt.dropout(x.int(), 0.5, seed=0), TypeError, "x must have dtype"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.ones(4, 8), torch.ones(4, 8))


# --------------------------------------------------------------------------- second order

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("alpha_kind", ALPHAS)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_add_norm_gradgradcheck_float64(kind, alpha_kind, p):
    x, r, w, b, alpha = _inputs((3, 5), torch.float64, alpha_kind)
    tensors = [x, r, w, b] + ([alpha] if alpha_kind != "fixed" else [])

    def f(x, r, w, b, *a):
        return _fused(kind, x, r, w, b, a[0] if a else alpha, p=p, seed=11)
    assert torch.autograd.gradgradcheck(f, tuple(tensors))


@pytest.mark.parametrize("which", [0, 1])
def test_add_norm_gradgradcheck_with_one_output_unused(which):
    x, r, w, _, _ = _inputs((4, 5), torch.float64)
    assert torch.autograd.gradgradcheck(
        lambda x, r, w: _fused("rms", x, r, w, None, 1.0, p=0.2, seed=4)[which], (x, r, w))


def test_dropout_gradgradcheck_and_forward_mode():
    x = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    f = lambda x: rt.dropout(x, 0.4, seed=5)         # noqa: E731
    assert torch.autograd.gradgradcheck(f, (x,))
    assert torch.autograd.gradcheck(f, (x,), check_forward_ad=True)


# --------------------------------------------------------------------------- graphs, transforms

@pytest.mark.parametrize("kind", KINDS)
def test_compile_fullgraph_matches_eager(kind):
    x, r, w, b, alpha = _inputs((2, 3, 16), torch.float32, "channel")

    def f(x, r, w, b, alpha):
        y, h = _fused(kind, x, r, w, b, alpha, p=0.2, seed=2 ** 63 + 7)
        return (y * h).sum()
    params = (x, r, w, b, alpha)
    assert torch._dynamo.explain(f)(*params).graph_break_count == 0
    ref = f(*params)
    grads = torch.autograd.grad(ref, params, allow_unused=True)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(*params)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for g, want in zip(torch.autograd.grad(got, params, allow_unused=True), grads):
        if want is not None:
            torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


def test_torch_func_transforms_are_refused_with_the_alternative():
    x = torch.randn(3, 4, 8)
    with pytest.raises(RuntimeError, match="add_rms_norm does not support torch.func"):
        torch.vmap(lambda t: rt.add_rms_norm(t, t)[0])(x)
    with pytest.raises(RuntimeError, match="dropout does not support torch.func"):
        torch.vmap(lambda t: rt.dropout(t, 0.5, seed=1))(x)
    import torch.autograd.forward_ad as fwad
    with fwad.dual_level():
        dual = fwad.make_dual(x[0], torch.ones(4, 8))
        with pytest.raises(RuntimeError, match="add_layer_norm does not support.*forward-mode"):
            rt.add_layer_norm(dual, x[0])


# --------------------------------------------------------------------------- training

class PreNormMLP(torch.nn.Module):
    """Pre-Norm residual MLP blocks: h <- h + f_l(norm_l(h)), final norm.  fused=True runs each
    'add the branch, then normalise for the next block' as one add_rms_norm call."""

    def __init__(self, d, depth, fused):
        super().__init__()
        torch.manual_seed(0)
        self.fused = fused
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(d, eps=1e-6) for _ in range(depth + 1))
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))
            for _ in range(depth))

    def forward(self, h):
        y = self.norms[0](h)
        for block, norm in zip(self.blocks, self.norms[1:]):
            if self.fused:
                y, h = rt.add_rms_norm(block(y), h, norm.weight, 1e-6)
            else:
                h = h + block(y)
                y = norm(h)
        return y


def test_pre_norm_model_trains_the_same_with_fused_add_norm():
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(16, 24, generator=g), torch.randn(16, 24, generator=g)
    losses = {}
    for fused in (False, True):
        model = PreNormMLP(24, 3, fused)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses[fused] = []
        for _ in range(15):
            opt.zero_grad()
            loss = F.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            losses[fused].append(loss.item())
    assert losses[True][-1] < 0.8 * losses[True][0]
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]),
                               rtol=1e-5, atol=0)
