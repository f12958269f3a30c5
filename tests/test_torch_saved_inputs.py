"""Every tensor a resnorm.torch backward reads is checked by autograd's version counter.

Changing an input in place between forward and backward (an optimizer step, an in-place
update of a LayerScale vector) must either be refused, as torch's own operations refuse it
("modified by an inplace operation"), or leave the gradients exactly what they were without
the change (the backward does not read that input).  A backward that silently reads the new
values would give wrong gradients.
"""
import pytest

torch = pytest.importorskip("torch")

import resnorm.torch as rt  # noqa: E402

D = 6


def _tensors(alpha_shape, alpha_grad, gate_shape):
    g = torch.Generator().manual_seed(3)
    make = lambda *shape: torch.randn(shape, generator=g, dtype=torch.float64)  # noqa: E731
    tensors = {"x": make(2, 3, D), "residual": make(2, 3, D), "weight": 1 + 0.2 * make(D),
               "bias": 0.1 * make(D), "F": make(2, 3, D), "gate": make(*gate_shape)}
    for t in tensors.values():
        t.requires_grad_()
    tensors["alpha"] = (0.5 + 0.1 * make(*alpha_shape)).requires_grad_(alpha_grad)
    return tensors


def _fused(name):
    fn = getattr(rt, name)
    layer = "layer" in name

    def call(t):
        params = (t["weight"], t["bias"]) if layer else (t["weight"],)
        out = fn(t["x"], t["residual"], *params, alpha=t["alpha"], p=0.25, seed=11)
        return out if isinstance(out, tuple) else (out,)
    return call


CALLS = {
    "rms_norm": lambda t: (rt.rms_norm(t["x"], t["weight"]),),
    "layer_norm": lambda t: (rt.layer_norm(t["x"], t["weight"], t["bias"]),),
    "scaled_residual": lambda t: (rt.scaled_residual(t["x"], t["F"], t["alpha"]),),
    "gated_residual": lambda t: (rt.gated_residual(t["x"], t["F"], t["gate"]),),
    "dropout": lambda t: (rt.dropout(t["x"], 0.25, seed=5),),
    **{name: _fused(name) for name in ("add_rms_norm", "add_layer_norm", "add_rms_norm_post",
                                       "add_layer_norm_post")},
}
USES = {"rms_norm": ("x", "weight"), "layer_norm": ("x", "weight", "bias"),
        "scaled_residual": ("x", "F", "alpha"), "gated_residual": ("x", "F", "gate"),
        "dropout": ("x",), "add_rms_norm": ("x", "residual", "weight", "alpha"),
        "add_rms_norm_post": ("x", "residual", "weight", "alpha"),
        "add_layer_norm": ("x", "residual", "weight", "bias", "alpha"),
        "add_layer_norm_post": ("x", "residual", "weight", "bias", "alpha")}
# alpha: a learnable scalar, a learnable (D,) vector, a fixed (D,) vector; gate per element
# and per channel
FORMS = [((), True, (2, 3, D)), ((D,), True, (D,)), ((D,), False, (2, 3, D))]


def _loss(outputs):
    g = torch.Generator().manual_seed(9)
    return sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outputs)


def _grads(name, tensors):
    wrt = [tensors[k] for k in USES[name] if tensors[k].requires_grad]
    return torch.autograd.grad(_loss(CALLS[name](tensors)), wrt, allow_unused=True)


@pytest.mark.parametrize("form", range(len(FORMS)))
@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_input_changed_in_place_before_backward_is_refused_or_unread(name, form):
    if form and not {"alpha", "gate"} & set(USES[name]):
        pytest.skip("the forms differ only in alpha and the gate, which this function lacks")
    expected = _grads(name, _tensors(*FORMS[form]))
    for changed in USES[name]:
        tensors = _tensors(*FORMS[form])
        loss = _loss(CALLS[name](tensors))
        with torch.no_grad():
            tensors[changed].mul_(1.5).add_(0.25)
        wrt = [tensors[k] for k in USES[name] if tensors[k].requires_grad]
        try:
            got = torch.autograd.grad(loss, wrt, allow_unused=True)
        except RuntimeError as error:
            assert "modified by an inplace operation" in str(error), (changed, error)
            continue
        # not refused: then backward must not have read the changed tensor
        for e, g in zip(expected, got):
            assert (e is None) == (g is None), changed
            if e is not None:
                torch.testing.assert_close(g, e, rtol=0, atol=0, msg=f"{changed} was read")
