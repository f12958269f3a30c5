"""Plain SGD (with optional momentum) and Adam, updating a module's parameters in place.

The update rules are torch.optim.SGD's and torch.optim.Adam's (weight decay added to the
gradient, L2 style; Adam with bias correction).
"""
from __future__ import annotations

import numpy as np

from .. import _checks
from .module import Module


class _Optimizer:
    """What both optimizers share: the module's parameters and gradients, and lr."""

    def __init__(self, module: Module, lr: float) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"module must be a resnorm.nn.Module, got {type(module).__name__}")
        self.lr = _checks.real_value(lr, "lr")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        self.module = module
        self.params = module.params()
        self.grads = module.grads()

    def zero_grad(self) -> None:
        """Sets the module's gradients to zero (`Module.zero_grad`)."""
        self.module.zero_grad()


class SGD(_Optimizer):
    """Stochastic gradient descent with optional momentum, as ``torch.optim.SGD``.

    Each `step` updates every parameter in place: ``p -= lr * v`` with
    ``v = momentum * v + (g + weight_decay * p)`` (``v = g + weight_decay * p`` at the
    first step and when momentum is 0), g the accumulated gradient.

    Parameters
    ----------
    module : Module
        The module whose parameters are trained.
    lr : float
        The learning rate, > 0.
    momentum : float, default 0.0
        The momentum factor.
    weight_decay : float, default 0.0
        L2 penalty, added to the gradient.

    Raises
    ------
    TypeError
        If module is not a `Module`, or a rate is not a real number.
    ValueError
        If lr <= 0 or a rate is not finite.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> layer = nn.Linear(2, 1, bias=False, seed=0)
    >>> layer.weight[...] = 1.0
    >>> opt = nn.SGD(layer, lr=0.1)
    >>> opt.zero_grad()
    >>> layer.dweight[...] = [[1.0, -2.0]]    # as a backward would have left it
    >>> opt.step()
    >>> layer.weight
    array([[0.9, 1.2]], dtype=float32)
    """

    def __init__(self, module: Module, lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(module, lr)
        self.momentum = _checks.real_value(momentum, "momentum")
        self.weight_decay = _checks.real_value(weight_decay, "weight_decay")
        self._velocity = {n: None for n in self.params}

    def step(self) -> None:
        """Updates every parameter in place from its accumulated gradient."""
        for name, p in self.params.items():
            g = self.grads[name]
            if self.weight_decay:
                g = g + self.weight_decay * p
            if self.momentum:
                v = self._velocity[name]
                if v is None:
                    v = self._velocity[name] = g.copy()
                else:
                    v *= self.momentum
                    v += g
                g = v
            p -= p.dtype.type(self.lr) * g


class Adam(_Optimizer):
    """Adam with bias correction, as ``torch.optim.Adam``.

    Each `step` updates every parameter in place: ``m = b1 m + (1-b1) g``,
    ``v = b2 v + (1-b2) g^2``, ``p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``
    at step t, with ``g`` the accumulated gradient plus ``weight_decay * p``.

    Parameters
    ----------
    module : Module
        The module whose parameters are trained.
    lr : float, default 1e-3
        The learning rate, > 0.
    betas : tuple of float, default (0.9, 0.999)
        b1 and b2, each in [0, 1).
    eps : float, default 1e-8
        Added to the denominator, > 0.
    weight_decay : float, default 0.0
        L2 penalty, added to the gradient.

    Raises
    ------
    TypeError
        If module is not a `Module`, or a rate is not a real number.
    ValueError
        If lr <= 0, a beta is outside [0, 1), eps <= 0, or a rate is not finite.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> layer = nn.Linear(2, 1, bias=False, seed=0)
    >>> start = layer.weight.copy()
    >>> opt = nn.Adam(layer, lr=0.01)
    >>> layer.dweight[...] = [[1.0, -2.0]]
    >>> opt.step()                          # the first step moves each weight by lr
    >>> (layer.weight - start).round(6)
    array([[-0.01,  0.01]], dtype=float32)
    """

    def __init__(self, module: Module, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__(module, lr)
        self.beta1, self.beta2 = (_checks.real_value(b, "betas") for b in betas)
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"betas must be in [0, 1), got {tuple(betas)}")
        self.eps = _checks.eps_value(eps)
        self.weight_decay = _checks.real_value(weight_decay, "weight_decay")
        self.t = 0
        self._m = {n: np.zeros_like(p) for n, p in self.params.items()}
        self._v = {n: np.zeros_like(p) for n, p in self.params.items()}

    def step(self) -> None:
        """Updates every parameter in place from its accumulated gradient."""
        self.t += 1
        c1 = 1.0 - self.beta1 ** self.t
        c2 = 1.0 - self.beta2 ** self.t
        for name, p in self.params.items():
            g = self.grads[name]
            if self.weight_decay:
                g = g + self.weight_decay * p
            m, v = self._m[name], self._v[name]
            m *= self.beta1
            m += (1.0 - self.beta1) * g
            v *= self.beta2
            v += (1.0 - self.beta2) * (g * g)
            p -= (self.lr / c1) * m / (np.sqrt(v / c2) + self.eps)
