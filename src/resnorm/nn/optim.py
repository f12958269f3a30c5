"""Plain SGD (with optional momentum) and Adam, updating a module's parameters in place.

The update rules are torch.optim.SGD's and torch.optim.Adam's (weight decay added to the
gradient, L2 style; Adam with bias correction).
"""
import numpy as np

from .. import _checks
from .module import Module


class _Optimizer:
    def __init__(self, module, lr):
        if not isinstance(module, Module):
            raise TypeError(f"module must be a resnorm.nn.Module, got {type(module).__name__}")
        self.lr = _checks.real_value(lr, "lr")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        self.module = module
        self.params = module.params()
        self.grads = module.grads()

    def zero_grad(self):
        self.module.zero_grad()


class SGD(_Optimizer):
    """p -= lr * v,  v = momentum * v + (g + weight_decay * p)   (v = g when momentum = 0)."""

    def __init__(self, module, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(module, lr)
        self.momentum = _checks.real_value(momentum, "momentum")
        self.weight_decay = _checks.real_value(weight_decay, "weight_decay")
        self._velocity = {n: None for n in self.params}

    def step(self):
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
    """m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)."""

    def __init__(self, module, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(module, lr)
        self.beta1, self.beta2 = (_checks.real_value(b, "betas") for b in betas)
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"betas must be in [0, 1), got {tuple(betas)}")
        self.eps = _checks.eps_value(eps)
        self.weight_decay = _checks.real_value(weight_decay, "weight_decay")
        self.t = 0
        self._m = {n: np.zeros_like(p) for n, p in self.params.items()}
        self._v = {n: np.zeros_like(p) for n, p in self.params.items()}

    def step(self):
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
