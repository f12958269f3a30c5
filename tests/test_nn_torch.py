"""Optional: the blocks against torch.nn.TransformerEncoderLayer(batch_first=True) with the
same weights (skipped without torch).  Output, input gradient and every parameter gradient."""
import numpy as np
import pytest

from resnorm import nn

torch = pytest.importorskip("torch")

D, H, FF, B, T = 16, 4, 24, 3, 7


def torch_pair(norm_first, dtype, causal, seed=0):
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation="gelu",
                                             batch_first=True, norm_first=norm_first)
    layer = layer.to(torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():   # torch zeroes these at init; random values test them too
        for name, p in layer.named_parameters():
            if name.endswith("bias") or name.startswith("norm"):
                p.add_(0.1 * torch.randn_like(p))
    cls = nn.PreNormBlock if norm_first else nn.PostNormBlock
    ours = cls(D, H, FF, norm="layer", residual="plain", dropout=0.0, causal=causal,
               activation="gelu", eps=1e-5, dtype=dtype)
    ours.load_state_dict({k: v.detach().numpy() for k, v in layer.state_dict().items()})
    return layer, ours


def run_torch(layer, x, dy, causal):
    tx = torch.tensor(x, requires_grad=True)
    mask = (torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=tx.dtype)
            if causal else None)
    y = layer(tx, src_mask=mask, is_causal=causal)
    y.backward(torch.tensor(dy))
    grads = {k: p.grad.numpy() for k, p in layer.named_parameters()}
    return y.detach().numpy(), tx.grad.numpy(), grads


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_block_matches_torch_encoder_layer(norm_first, causal, dtype):
    layer, ours = torch_pair(norm_first, dtype, causal)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, T, D)).astype(dtype)
    dy = rng.standard_normal((B, T, D)).astype(dtype)
    ty, tdx, tgrads = run_torch(layer, x, dy, causal)
    y = ours.forward(x)
    dx = ours.backward(dy)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(y, ty, **tol)
    np.testing.assert_allclose(dx, tdx, **tol)
    grads = ours.grads()
    assert set(grads) == set(tgrads)
    for name, g in tgrads.items():
        np.testing.assert_allclose(grads[name], g, err_msg=name, **tol)


def test_stack_matches_torch_encoder_with_final_norm():
    torch.manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation="gelu",
                                             batch_first=True, norm_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(D),
                                      enable_nested_tensor=False).double()
    ours = nn.TransformerStack(2, D, H, FF, block="pre", causal=True, dtype=np.float64)
    ours.load_state_dict({k: v.detach().numpy() for k, v in enc.state_dict().items()})
    x = np.random.default_rng(4).standard_normal((B, T, D))
    tx = torch.tensor(x, requires_grad=True)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    ty = enc(tx, mask=mask, is_causal=True)
    ty.backward(torch.ones_like(ty))
    np.testing.assert_allclose(ours.forward(x), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.backward(np.ones((B, T, D))), tx.grad.numpy(), rtol=1e-10,
                               atol=1e-12)
    for name, p in enc.named_parameters():
        np.testing.assert_allclose(ours.grads()[name], p.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)


def test_weights_move_back_to_torch():
    ours = nn.PostNormBlock(D, H, FF, seed=5)
    layer = torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation="gelu",
                                             batch_first=True)
    layer.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    x = np.random.default_rng(6).standard_normal((B, T, D)).astype(np.float32)
    ours.causal = False
    ours.self_attn.causal = False
    np.testing.assert_allclose(ours.forward(x), layer(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("make", [
    (lambda m: nn.SGD(m, 0.1), lambda p: torch.optim.SGD(p, 0.1)),
    (lambda m: nn.SGD(m, 0.1, momentum=0.9, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, 0.1, momentum=0.9, weight_decay=0.01)),
    (lambda m: nn.Adam(m, 0.01), lambda p: torch.optim.Adam(p, 0.01)),
    (lambda m: nn.Adam(m, 0.01, betas=(0.8, 0.99), weight_decay=0.1),
     lambda p: torch.optim.Adam(p, 0.01, betas=(0.8, 0.99), weight_decay=0.1)),
])
def test_optimizers_match_torch(make):
    ours = nn.Linear(4, 3, dtype=np.float64, seed=0)
    tparams = [torch.tensor(ours.params()[k].copy(), requires_grad=True)
               for k in ("weight", "bias")]
    opt, topt = make[0](ours), make[1](tparams)
    rng = np.random.default_rng(7)
    for _ in range(5):
        g = [rng.standard_normal(p.shape) for p in tparams]
        ours.grads()["weight"][:] = g[0]
        ours.grads()["bias"][:] = g[1]
        for p, gi in zip(tparams, g):
            p.grad = torch.tensor(gi)
        opt.step()
        topt.step()
    np.testing.assert_allclose(ours.params()["weight"], tparams[0].detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.params()["bias"], tparams[1].detach().numpy(), rtol=1e-12)
