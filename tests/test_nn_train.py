"""A small stack learns: SGD and Adam drive the loss of a teacher-student task down."""
import numpy as np
import pytest

from resnorm import nn


def teacher_task(seed=0, batch=16, t=8, d=16):
    """Inputs and the outputs of a randomly initialised teacher stack (other seed)."""
    teacher = nn.TransformerStack(2, d, 2, 32, block="pre", norm="rms", seed=seed + 100)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, t, d)).astype(np.float32)
    return x, teacher.forward(x)


@pytest.mark.parametrize("block, norm, residual", [("pre", "rms", "plain"),
                                                    ("post", "layer", "plain"),
                                                    ("pre", "layer", "scaled")])
def test_sgd_drives_the_loss_down(block, norm, residual):
    x, target = teacher_task()
    model = nn.TransformerStack(2, 16, 2, 32, block=block, norm=norm, residual=residual,
                                seed=1)
    opt = nn.SGD(model, lr=0.05, momentum=0.9)
    losses = []
    for _ in range(300):
        opt.zero_grad()
        loss, dy = nn.mse_loss(model.forward(x), target)
        model.backward(dy)
        opt.step()
        losses.append(loss)
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-10:]) < 0.3 * losses[0], (losses[0], losses[-10:])


def test_adam_drives_the_loss_down_with_dropout():
    x, target = teacher_task(seed=1)
    model = nn.TransformerStack(2, 16, 2, 32, block="pre", dropout=0.05, seed=2)
    opt = nn.Adam(model, lr=3e-3)
    first = None
    for _ in range(200):
        opt.zero_grad()
        loss, dy = nn.mse_loss(model.forward(x), target)
        first = loss if first is None else first
        model.backward(dy)
        opt.step()
    model.eval()
    final, _ = nn.mse_loss(model.forward(x), target)
    assert final < 0.3 * first, (first, final)


def test_mse_loss_value_and_gradient():
    y = np.array([[1.0, 2.0], [3.0, 5.0]])
    t = np.array([[1.0, 0.0], [3.0, 4.0]])
    loss, dy = nn.mse_loss(y, t)
    assert loss == pytest.approx((4 + 1) / 4)
    np.testing.assert_allclose(dy, 2 * (y - t) / 4)
    with pytest.raises(ValueError, match="target must have shape"):
        nn.mse_loss(y, t[:1])


def test_optimizer_argument_checks():
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="resnorm.nn.Module"):
        nn.SGD([np.zeros(2)], 0.1)
    with pytest.raises(ValueError, match="lr must be > 0"):
        nn.Adam(m, lr=0.0)
    with pytest.raises(ValueError, match=r"betas must be in \[0, 1\)"):
        nn.Adam(m, betas=(0.9, 1.0))
