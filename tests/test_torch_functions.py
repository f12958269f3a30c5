"""resnorm.torch autograd Functions: gradients, agreement with torch, no copies, errors."""
import copy
import itertools
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import resnorm  # noqa: E402
import resnorm.torch as rt  # noqa: E402
from resnorm.torch import _tensors as T  # noqa: E402

F = torch.nn.functional


def _make(shape, dtype, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = torch.randn(shape, generator=g, dtype=dtype) * 2 + 0.5
    w = torch.randn(d, generator=g, dtype=dtype)
    b = torch.randn(d, generator=g, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (x, w, b)]


# --------------------------------------------------------------------------- gradcheck

@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 7), (1, 1), (4, 1)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_gradcheck_float64(shape, with_weight):
    x, w, _ = _make(shape, torch.float64)
    args = (x, w) if with_weight else (x,)
    assert torch.autograd.gradcheck(lambda *a: rt.rms_norm(*a, eps=1e-5) if len(a) == 1
                                    else rt.rms_norm(a[0], a[1], 1e-5), args)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 7), (4, 2)])
@pytest.mark.parametrize("with_weight,with_bias", list(itertools.product([True, False], repeat=2)))
def test_layer_norm_gradcheck_float64(shape, with_weight, with_bias):
    x, w, b = _make(shape, torch.float64)
    w, b = (w if with_weight else None), (b if with_bias else None)
    params = [p for p in (w, b) if p is not None]

    def f(x, *ps):
        it = iter(ps)
        return rt.layer_norm(x, next(it) if with_weight else None,
                             next(it) if with_bias else None, 1e-5)
    assert torch.autograd.gradcheck(f, (x, *params))


# --------------------------------------------------------------------------- vs torch, float32

def _grads(y, inputs, dy):
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    return torch.autograd.grad(y, wanted, dy)


@pytest.mark.parametrize("shape", [(8, 768), (2, 5, 33), (3, 1)])
def test_rms_norm_matches_torch_float32(shape):
    x, w, _ = _make(shape, torch.float32)
    dy = torch.randn(shape)
    y, ref = rt.rms_norm(x, w, 1e-6), F.rms_norm(x, (shape[-1],), w, 1e-6)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(_grads(y, (x, w), dy), _grads(ref, (x, w), dy)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(8, 768), (2, 5, 33), (3, 1)])
def test_layer_norm_matches_torch_float32(shape):
    x, w, b = _make(shape, torch.float32)
    dy = torch.randn(shape)
    y, ref = rt.layer_norm(x, w, b, 1e-5), F.layer_norm(x, (shape[-1],), w, b, 1e-5)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(_grads(y, (x, w, b), dy), _grads(ref, (x, w, b), dy)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("needs", [c for c in itertools.product([True, False], repeat=3) if any(c)])
def test_layer_norm_requires_grad_combinations(needs):
    """Only the tensors that require grad get one, and those equal torch's."""
    x, w, b = _make((6, 9), torch.float64, requires_grad=False)
    for t, need in zip((x, w, b), needs):
        t.requires_grad_(need)
    dy = torch.randn(6, 9, dtype=torch.float64)
    y = rt.layer_norm(x, w, b, 1e-5)
    ref = F.layer_norm(x, (9,), w, b, 1e-5)
    for got, want in zip(_grads(y, (x, w, b), dy), _grads(ref, (x, w, b), dy)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("needs", [(True, False), (False, True)])
def test_rms_norm_requires_grad_combinations(needs):
    x, w, _ = _make((6, 9), torch.float64, requires_grad=False)
    x.requires_grad_(needs[0])
    w.requires_grad_(needs[1])
    dy = torch.randn(6, 9, dtype=torch.float64)
    y, ref = rt.rms_norm(x, w, 1e-5), F.rms_norm(x, (9,), w, 1e-5)
    for got, want in zip(_grads(y, (x, w), dy), _grads(ref, (x, w), dy)):
        torch.testing.assert_close(got, want)


def test_weight_without_grad_gets_none_and_x_gets_torchs():
    x, w, _ = _make((4, 8), torch.float32)
    w.requires_grad_(False)
    rt.rms_norm(x, w).sum().backward()
    assert w.grad is None
    ref = x.detach().clone().requires_grad_()
    F.rms_norm(ref, (8,), w, 1e-6).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eps_none_is_the_dtype_epsilon(dtype):
    """As in torch.nn.functional.rms_norm; rows of tiny values show the eps."""
    x = torch.full((2, 4), 1e-4, dtype=dtype) * torch.tensor([[1.0], [1e-3]], dtype=dtype)
    torch.testing.assert_close(rt.rms_norm(x, None, None), F.rms_norm(x, (4,), None, None),
                               rtol=1e-5, atol=0)
    torch.testing.assert_close(rt.layer_norm(x, None, None, None),
                               F.layer_norm(x, (4,), eps=torch.finfo(dtype).eps),
                               rtol=1e-5, atol=1e-7)


def test_no_grad_saves_nothing():
    x, w, _ = _make((4, 8), torch.float32)
    with torch.no_grad():
        y = rt.rms_norm(x, w)
    assert y.grad_fn is None and not y.requires_grad


def test_inference_mode():
    x, w, b = _make((4, 8), torch.float32, requires_grad=False)
    with torch.inference_mode():
        y = rt.layer_norm(x, w, b)
    torch.testing.assert_close(y, F.layer_norm(x, (8,), w, b))


def test_zero_rows():
    x, w, b = _make((0, 8), torch.float32)
    y = rt.layer_norm(x, w, b)
    y.sum().backward()
    assert y.shape == (0, 8) and torch.equal(w.grad, torch.zeros(8))
    assert torch.equal(b.grad, torch.zeros(8))


# --------------------------------------------------------------------------- no copies

def _ptr(a):
    return None if a is None else a.__array_interface__["data"][0]


def _spy(monkeypatch, name, record, module=resnorm, keywords=None):
    """Records the data pointers of the arrays resnorm's function `name` (public, or of
    another module: resnorm._api, the call path under it) receives and returns (positional
    arrays, cache arrays, returned arrays); `keywords`, a list, also gets {name: pointer or
    value} of the keyword arguments of each call."""
    real = getattr(module, name)

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        arrays = out if isinstance(out, tuple) else (out,)
        record.append(([_ptr(a) if isinstance(a, np.ndarray) else a for a in args],
                       [_ptr(a) if isinstance(a, np.ndarray) else a for a in arrays]))
        if keywords is not None:
            keywords.append({k: _ptr(v) if isinstance(v, np.ndarray) else v
                             for k, v in kwargs.items()})
        return out
    monkeypatch.setattr(module, name, spy)


def test_rms_norm_reads_and_writes_tensor_storage_in_place(monkeypatch):
    fwd, bwd = [], []
    _spy(monkeypatch, "rms_norm_forward", fwd)
    _spy(monkeypatch, "rms_norm_backward", bwd)
    x, w, _ = _make((16, 64), torch.float32)
    dy = torch.randn(16, 64)
    y = rt.rms_norm(x, w)
    assert y.grad_fn.saved_tensors[0].data_ptr() == x.data_ptr()   # x saved, not copied
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    (xin, win, _), (out, cache) = fwd[0]
    assert (xin, win, out) == (x.data_ptr(), w.data_ptr(), y.data_ptr())
    (bdy, _), (bdx, bdw) = bwd[0]
    assert (bdy, bdx, bdw) == (dy.data_ptr(), dx.data_ptr(), dw.data_ptr())


def test_layer_norm_reads_and_writes_tensor_storage_in_place(monkeypatch):
    fwd, bwd = [], []
    _spy(monkeypatch, "layer_norm_forward", fwd)
    _spy(monkeypatch, "layer_norm_backward", bwd)
    x, w, b = _make((2, 8, 64), torch.float64)
    dy = torch.randn(2, 8, 64, dtype=torch.float64)
    y = rt.layer_norm(x, w, b)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    (xin, win, bin_, _), (out, _) = fwd[0]
    assert (xin, win, bin_, out) == (x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr())
    (bdy, _), (bdx, bdw, bdb) = bwd[0]
    assert (bdy, bdx, bdw, bdb) == (dy.data_ptr(), dx.data_ptr(), dw.data_ptr(),
                                    db.data_ptr())


@pytest.mark.parametrize("grad", [False, True])
def test_inference_path_skips_autograd_and_the_training_form(monkeypatch, grad):
    """Without gradients the norm is resnorm's inference call (its compiled call path,
    which resnorm.layer_norm runs), reading the tensors in place and writing the returned
    tensor, and no training form."""
    from resnorm import _api
    calls, keywords = [], []
    for name in ("layer_norm", "layer_norm_forward"):
        _spy(monkeypatch, name, calls, _api, keywords)
    x, w, b = _make((3, 16), torch.float32, requires_grad=grad)
    with torch.no_grad():
        y = rt.layer_norm(x, w, b)
    assert y.grad_fn is None and len(calls) == 1
    (xin, win, bin_, _), (out,) = calls[0]
    assert (xin, win, bin_) == (x.data_ptr(), w.data_ptr(), b.data_ptr())
    assert keywords[0]["out"] == out == y.data_ptr()


def _bits(t):
    return t.view(torch.int16) if t.dtype.itemsize == 2 else t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layer,params", [(True, "weight and bias"), (True, "weight"),
                                          (True, "bias"), (True, "none"), (False, "weight"),
                                          (False, "none")])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_inference_call_runs_in_c_with_the_general_paths_bits(dtype, layer, params,
                                                              zero_centered):
    """A no-grad call whose arguments the kernel takes as they are runs compiled
    (norm_infer), with the bits of the general path (normalized_shape given: checked in
    Python first), in a fresh tensor; the inputs are left as they were."""
    if dtype is torch.bfloat16:
        pytest.importorskip("ml_dtypes")
    from resnorm.torch import _tensors as T
    x, w, b = (t.detach().to(dtype) for t in _make((3, 5, 40), torch.float32))
    w = w if "weight" in params else None
    b = b if "bias" in params and layer else None
    before = [t.clone() for t in (x, w, b) if t is not None]
    options = dict(zero_centered_weight=zero_centered)
    if layer:   # (the general path first: it loads ml_dtypes for a first bfloat16 tensor)
        general = rt.layer_norm(x, w, b, 1e-5, normalized_shape=(40,), **options)
        y = rt.layer_norm(x, w, b, 1e-5, **options)
    else:
        general = rt.rms_norm(x, w, 1e-5, normalized_shape=(40,), **options)
        y = rt.rms_norm(x, w, 1e-5, **options)
    outputs = [y]
    if not (zero_centered and T.float32_gain(layer, x, w)):   # (else a float32 gain reaches it)
        fast = T.norm_infer(layer, x, w, b, 1e-5, zero_centered, T.NUMPY_DTYPES)
        assert fast is not None and fast.dtype is dtype and fast.shape == x.shape
        outputs.append(fast)
    for out in outputs:
        assert torch.equal(_bits(out), _bits(general)) and out.data_ptr() != x.data_ptr()
    for t, was in zip((t for t in (x, w, b) if t is not None), before):
        assert torch.equal(_bits(t), _bits(was))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layer", [False, True])
def test_inference_call_takes_float32_parameters_beside_16_bit_x(dtype, layer):
    """torch's mixed case (float32 parameters, 16-bit x, as under torch.autocast) runs
    compiled too, with the general path's bits."""
    if dtype is torch.bfloat16:
        pytest.importorskip("ml_dtypes")
    from resnorm.torch import _tensors as T
    x, w, b = (t.detach() for t in _make((3, 5, 40), torch.float32))
    x = x.to(dtype)
    b = b if layer else None
    if layer:
        general = rt.layer_norm(x, w, b, 1e-5, normalized_shape=(40,))
    else:
        general = rt.rms_norm(x, w, 1e-5, normalized_shape=(40,))
    fast = T.norm_infer(layer, x, w, b, 1e-5, False, T.NUMPY_DTYPES)
    assert fast is not None and fast.dtype is dtype
    assert torch.equal(_bits(fast), _bits(general))


def test_inference_call_hands_other_arguments_to_the_checks():
    """norm_infer declines (None) every call it must not take as it is; the function then
    gives the general path's result or error."""
    from resnorm.torch import _tensors as T
    x, w, b = (t.detach() for t in _make((4, 8), torch.float32))

    class Sub(torch.Tensor):
        pass

    declined = {
        "strided x": (torch.randn(8, 4).t(), w, b, 1e-5),
        "subclass x": (x.as_subclass(Sub), w, b, 1e-5),
        "negated x": (torch.complex(x, x).conj().imag, w, b, 1e-5),
        "float64 weight": (x, w.double(), b, 1e-5),
        "weight of another shape": (x, w[:4], b, 1e-5),
        "strided weight": (x, torch.randn(8, 2)[:, 0], b, 1e-5),
        "list bias": (x, w, [1.0] * 8, 1e-5),
        "eps None": (x, w, b, None),
        "0-d x": (torch.tensor(1.0), None, None, 1e-5),
        "empty last axis": (torch.ones(3, 0), None, None, 1e-5),
        "int x": (torch.ones(3, 8, dtype=torch.int32), None, None, 1e-5),
    }
    for name, (xa, wa, ba, eps) in declined.items():
        assert T.norm_infer(True, xa, wa, ba, eps, False, T.NUMPY_DTYPES) is None, name
    with torch.no_grad():
        for name in ("strided x", "negated x", "strided weight", "eps None"):
            xa, wa, ba, eps = declined[name]
            torch.testing.assert_close(rt.layer_norm(xa, wa, ba, eps),
                                       F.layer_norm(xa, (xa.shape[-1],), wa, ba,
                                                    1e-5 if eps else torch.finfo().eps))
    xg = x.clone().requires_grad_()
    assert T.norm_infer(True, xg, w, b, 1e-5, False, T.NUMPY_DTYPES) is None   # autograd
    with torch.autograd.forward_ad.dual_level():
        assert T.norm_infer(True, x, w, b, 1e-5, False, T.NUMPY_DTYPES) is None
    with torch.no_grad():
        assert T.norm_infer(True, xg, w, b, 1e-5, False, T.NUMPY_DTYPES) is not None
    with pytest.raises(ValueError, match="eps must be finite and > 0"):   # resnorm's check
        T.norm_infer(True, x, w, b, -1.0, False, T.NUMPY_DTYPES)


def test_non_contiguous_input_is_copied_once_and_correct():
    base, w, b = _make((8, 12), torch.float64)
    x = base.t()[:, :8]                         # (12, 8) view, not contiguous
    assert not x.is_contiguous()
    y = rt.layer_norm(x, w[:8], b[:8])
    torch.testing.assert_close(y, F.layer_norm(x, (8,), w[:8], b[:8]))
    dy = torch.randn(12, 8, dtype=torch.float64).t().contiguous().t()   # non-contiguous dy
    got = torch.autograd.grad(y, (base, w), dy)
    want = torch.autograd.grad(F.layer_norm(x, (8,), w[:8], b[:8]), (base, w), dy)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_views_of_contiguous_tensors_share_memory_read_only_and_keep_it_alive(dtype):
    from resnorm.torch import _tensors as T
    x = torch.randn(3, 4, 5).to(dtype)
    a = T.view(x)
    assert a.shape == (3, 4, 5) and a.dtype == x.numpy().dtype
    assert _ptr(a) == x.data_ptr() and not a.flags.writeable and a.flags.aligned
    want = x.clone()
    del x                       # the view's base keeps the tensor's memory alive
    np.testing.assert_array_equal(a, want.numpy())
    p = torch.nn.Parameter(torch.randn(7).to(dtype))   # requires grad: viewed all the same
    assert _ptr(T.view(p)) == p.data_ptr()
    sliced = torch.randn(6, 5).to(dtype)[2:]            # an offset into the storage
    np.testing.assert_array_equal(T.view(sliced), sliced.numpy())


def test_lazily_negated_inputs_give_their_values():
    """z.conj().imag is a float tensor whose negation is pending (its negative bit): the
    norms see its values, in every path, as torch's do."""
    z = torch.randn(4, 8, dtype=torch.complex128, generator=torch.Generator().manual_seed(3))
    x = z.conj().imag
    assert x.is_neg()
    want = F.layer_norm(x.resolve_neg(), (8,))
    torch.testing.assert_close(rt.layer_norm(x), want)
    with torch.no_grad():
        torch.testing.assert_close(rt.layer_norm(x), want)
        torch.testing.assert_close(rt.LayerNorm(8, dtype=torch.float64)(x), want)
    torch.testing.assert_close(rt.rms_norm(x.t().contiguous().t()[:, :5], eps=1e-6),
                               F.rms_norm(x.resolve_neg()[:, :5], (5,), eps=1e-6))


def test_broadcast_gradient_is_accepted():
    """y.sum().backward() hands backward an expanded (stride 0) dy."""
    x, w, _ = _make((5, 6), torch.float64)
    rt.rms_norm(x, w).sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    F.rms_norm(x, (6,), w, 1e-6).sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)


# --------------------------------------------------------------------------- threads

def test_follows_torch_threads_and_is_bitwise_reproducible():
    x, w, b = _make((256, 512), torch.float32)     # large enough to run in parallel
    dy = torch.randn(256, 512)
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            y = rt.layer_norm(x, w, b)
            results.append((y, *torch.autograd.grad(y, (x, w, b), dy)))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, c in zip(results[0], other):
            assert torch.equal(a, c)


# --------------------------------------------------------------------------- errors

def test_in_place_change_of_x_before_backward_is_caught():
    x, w, _ = _make((4, 8), torch.float32)
    h = x * 1.0
    y = rt.rms_norm(h, w)
    with torch.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("dtype", [torch.int32, torch.complex64, torch.float8_e4m3fn])
def test_other_dtypes_raise_type_error(dtype):
    # (float16 and bfloat16 are taken: tests/test_torch_half.py)
    x = torch.ones(4, 8).to(dtype)
    with pytest.raises(TypeError, match="x must have dtype torch.float32, torch.float64, "
                                        "torch.float16 or torch.bfloat16"):
        rt.rms_norm(x)
    with pytest.raises(TypeError, match="x must have dtype"):
        rt.layer_norm(x)


def test_non_cpu_tensor_raises_type_error():
    # A CUDA tensor takes the same path; "meta" is a non-CPU device every build has.
    x = torch.empty(4, 8, device="meta")
    with pytest.raises(TypeError, match="x must be a CPU tensor"):
        rt.rms_norm(x)
    w = torch.empty(8, device="meta")
    with pytest.raises(TypeError, match="weight must be a CPU tensor"):
        rt.layer_norm(torch.ones(4, 8), w)


@pytest.mark.parametrize("call,error,match", [
    (lambda: rt.rms_norm([[1.0, 2.0]]), TypeError, "x must be a torch.Tensor"),
    (lambda: rt.rms_norm(torch.tensor(1.0)), ValueError, "at least one axis"),
    (lambda: rt.rms_norm(torch.ones(3, 0)), ValueError, "non-empty last axis"),
    (lambda: rt.rms_norm(torch.ones(3, 4), torch.ones(5)), ValueError, r"weight must have shape \(4,\)"),
    (lambda: rt.rms_norm(torch.ones(3, 4), torch.ones(4, dtype=torch.float64)), TypeError,
     "weight must have the input's dtype"),
    (lambda: rt.layer_norm(torch.ones(3, 4), None, torch.ones(3)), ValueError, "bias must have shape"),
    (lambda: rt.layer_norm(torch.ones(3, 4), None, [1.0] * 4), TypeError, "bias must be a torch.Tensor"),
    (lambda: rt.rms_norm(torch.ones(3, 4), None, 0.0), ValueError, "eps must be finite and > 0"),
    (lambda: rt.rms_norm(torch.ones(3, 4), None, "1e-5"), TypeError, "eps must be a real number"),
    (lambda: rt.layer_norm(torch.ones(3, 4).to_sparse()), TypeError, "dense"),
    # the Functions' own apply, called directly
    (lambda: rt.RMSNormFunction.apply(np.ones((2, 3), np.float32), None, 1e-6), TypeError,
     "x must be a torch.Tensor, got ndarray"),
    (lambda: rt.LayerNormFunction.apply([[1.0, 2.0]], None, None, 1e-5), TypeError,
     "x must be a torch.Tensor, got list"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --------------------------------------------------------------------------- second order

@pytest.mark.parametrize("shape", [(3, 5), (2, 2, 4), (1, 1)])
@pytest.mark.parametrize("with_weight,with_bias", [(True, True), (True, False), (False, True),
                                                   (False, False)])
def test_layer_norm_gradgradcheck_float64(shape, with_weight, with_bias):
    x, w, b = _make(shape, torch.float64)
    params = [p for p, on in ((w, with_weight), (b, with_bias)) if on]

    def f(x, *ps):
        it = iter(ps)
        return rt.layer_norm(x, next(it) if with_weight else None,
                             next(it) if with_bias else None, 1e-5)
    assert torch.autograd.gradgradcheck(f, (x, *params))


@pytest.mark.parametrize("shape", [(3, 5), (2, 2, 4), (4, 1)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_gradgradcheck_float64(shape, with_weight):
    x, w, _ = _make(shape, torch.float64)
    args = (x, w) if with_weight else (x,)
    assert torch.autograd.gradgradcheck(lambda *a: rt.rms_norm(*a, eps=1e-5), args)


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_second_order_gradients_are_torchs_never_a_silent_none(norm):
    """d/dw of a gradient wrt x: the values torch's own norms give, in every path."""
    x, w, b = _make((4, 6), torch.float64)

    def f(fn, x, w, b):
        y = fn(x, w, b)
        (gx,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        return gx

    ours = (lambda x, w, b: rt.rms_norm(x, w, 1e-5)) if norm == "rms" else (
        lambda x, w, b: rt.layer_norm(x, w, b, 1e-5))
    theirs = (lambda x, w, b: F.rms_norm(x, (6,), w, 1e-5)) if norm == "rms" else (
        lambda x, w, b: F.layer_norm(x, (6,), w, b, 1e-5))
    want = torch.autograd.grad(f(theirs, x, w, b).sum(), (x, w))
    got = torch.autograd.grad(f(ours, x, w, b).sum(), (x, w), allow_unused=True)
    assert all(g is not None for g in got)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)
    gx = f(ours, x, w, b)
    w.grad = None
    gx.sum().backward(inputs=[w])
    torch.testing.assert_close(w.grad, want[1])


def test_forward_mode_ad_and_batched_gradients_float64():
    x, w, b = _make((3, 7), torch.float64)
    assert torch.autograd.gradcheck(lambda x, w, b: rt.layer_norm(x, w, b, 1e-5), (x, w, b),
                                    check_forward_ad=True, check_batched_grad=True,
                                    check_batched_forward_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rt.rms_norm(x, w, 1e-5), (x, w),
                                    check_forward_ad=True, check_batched_grad=True)


# --------------------------------------------------------------------------- torch.func

def test_vmap_matches_a_loop():
    g = torch.Generator().manual_seed(3)
    xb = torch.randn(4, 3, 6, generator=g, dtype=torch.float64)
    w, b = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g,
                                                                         dtype=torch.float64)
    wb = torch.randn(4, 6, generator=g, dtype=torch.float64)
    loop = torch.stack([F.layer_norm(xb[i], (6,), wb[i], b) for i in range(4)])
    torch.testing.assert_close(torch.vmap(lambda t, v: rt.layer_norm(t, v, b))(xb, wb), loop)
    torch.testing.assert_close(torch.vmap(lambda t: rt.rms_norm(t, w, None), in_dims=1)(xb),
                               F.rms_norm(xb.movedim(1, 0), (6,), w))
    torch.testing.assert_close(torch.vmap(lambda v: rt.rms_norm(xb[0], v))(wb),
                               torch.stack([F.rms_norm(xb[0], (6,), v, 1e-6) for v in wb]))


def test_per_sample_gradients_jacobians_and_hessian():
    g = torch.Generator().manual_seed(4)
    xb = torch.randn(5, 2, 6, generator=g, dtype=torch.float64)
    w = torch.randn(6, generator=g, dtype=torch.float64)
    fn = torch.func

    def loss(norm):
        return lambda w, x: norm(x, w).square().sum()
    ours = loss(lambda x, w: rt.rms_norm(x, w, 1e-5))
    theirs = loss(lambda x, w: F.rms_norm(x, (6,), w, 1e-5))
    torch.testing.assert_close(fn.vmap(fn.grad(ours), in_dims=(None, 0))(w, xb),
                               fn.vmap(fn.grad(theirs), in_dims=(None, 0))(w, xb))
    f = lambda x: rt.layer_norm(x, w, None, 1e-5)           # noqa: E731
    ref = fn.jacrev(lambda x: F.layer_norm(x, (6,), w, None, 1e-5))(xb[0])
    torch.testing.assert_close(fn.jacrev(f)(xb[0]), ref)
    torch.testing.assert_close(fn.jacfwd(f)(xb[0]), ref)
    torch.testing.assert_close(fn.hessian(lambda x: rt.rms_norm(x, w, 1e-5).sum())(xb[0]),
                               fn.hessian(lambda x: F.rms_norm(x, (6,), w, 1e-5).sum())(xb[0]))


# --------------------------------------------------------------------------- graphs

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.rms = rt.RMSNorm(8)
        self.ln = rt.LayerNorm(8)

    def forward(self, x):
        return self.ln(torch.relu(self.rms(self.fc(x)))) * 2


@pytest.mark.parametrize("rows", [3, 700], ids=["small", "operator"])
def test_torch_compile_fullgraph_without_graph_breaks(rows):
    """Compiled, the net trains as eager does.  Beyond COMPILED_EXPRESSION_MAX elements
    (700 x 5 x 8) the graph calls resnorm's operators: eager's values.  Small calls (3 x 5 x
    8) are compiled as float64 expressions: their values and gradients are as close to the
    float64 net's as eager's, within the rounding of the float32 layers around them."""
    torch.manual_seed(0)
    net, x = _Net(), torch.randn(rows, 5, 8, requires_grad=True)
    assert (x.numel() > T.COMPILED_EXPRESSION_MAX) == (rows == 700)
    explanation = torch._dynamo.explain(net)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    y = net(x)
    grads = torch.autograd.grad(y.square().sum(), [x, *net.parameters()])
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    cy = compiled(x)
    cgrads = torch.autograd.grad(cy.square().sum(), [x, *net.parameters()])
    if rows == 700:
        torch.testing.assert_close(cy, y)
        for g, r in zip(cgrads, grads):
            torch.testing.assert_close(g, r)
    else:
        net64, x64 = copy.deepcopy(net).double(), x.detach().double().requires_grad_()
        y64 = net64(x64)
        grads64 = torch.autograd.grad(y64.square().sum(), [x64, *net64.parameters()])
        for got, want, exact in ((cy, y, y64), *zip(cgrads, grads, grads64)):
            err = (got.double() - exact).abs().max()
            assert err <= max(4 * (want.double() - exact).abs().max(), 1e-6 * exact.abs().max())
    torch._dynamo.reset()


@pytest.mark.parametrize("layer", [False, True], ids=["rms", "layer"])
def test_compile_records_small_norms_as_float64_expressions(layer):
    """Inside torch.compile a norm of at most COMPILED_EXPRESSION_MAX elements is recorded as
    torch operations in float64, rounded once (no resnorm operator in the graph: inductor
    fuses it); a larger one as resnorm's operator."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(64, generator=g), torch.randn(64, generator=g)
    f = (lambda x: rt.layer_norm(x, w, b, 1e-5)) if layer else (lambda x: rt.rms_norm(x, w))
    for rows, operator in ((4, False), (T.COMPILED_EXPRESSION_MAX // 64 + 1, True)):
        x = torch.randn(rows, 64, generator=g) * 3 + 1
        graph = str(torch._dynamo.explain(f)(x).graphs[0].graph)
        assert ("resnorm" in graph) == operator, graph
        y = torch.compile(f, fullgraph=True)(x)
        if operator:
            assert torch.equal(y, f(x))
            continue
        x64 = x.double()
        xc = x64 - x64.mean(-1, keepdim=True) if layer else x64
        exact = xc * (xc.square().mean(-1, keepdim=True) + (1e-5 if layer else 1e-6)).rsqrt()
        exact = exact * w.double() + (b.double() if layer else 0.0)
        ulp = (torch.nextafter(y.abs(), torch.tensor(float("inf"))) - y.abs()).double()
        assert ((y.double() - exact).abs() <= 0.5001 * ulp).all()
    torch._dynamo.reset()


def test_inductor_compiles_the_graph_around_resnorm():
    torch.manual_seed(0)
    net, x = _Net(), torch.randn(3, 8)
    with torch.no_grad():
        y = net(x)
        torch.testing.assert_close(torch.compile(net, fullgraph=True)(x), y)
    torch._dynamo.reset()


def test_torchscript_and_jit_trace_run_resnorms_operators():
    torch.manual_seed(0)
    x = torch.randn(2, 8, dtype=torch.float64, requires_grad=True)
    for module in (rt.RMSNorm(8, dtype=torch.float64), rt.LayerNorm(8, dtype=torch.float64)):
        scripted = torch.jit.script(module)
        assert "resnorm::" in str(scripted.graph)
        y = scripted(x)
        torch.testing.assert_close(y, module(x))
        (gx,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(gx, torch.autograd.grad(module(x).sum(), x)[0])
        traced = torch.jit.trace(module, x.detach())
        assert "resnorm::" in str(traced.graph)
        torch.testing.assert_close(traced(x), module(x))


def test_core_never_imports_torch():
    code = ("import sys, resnorm, resnorm.norms, resnorm.reference, resnorm.bench, "
            "resnorm.__main__; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
