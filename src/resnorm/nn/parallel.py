"""The parallel-residual block (GPT-J, GPT-NeoX, PaLM): attention and the feed-forward
network read the same block input, and both outputs are added to it at once.

One shared norm (GPT-J, PaLM):  n = Norm1(x);  y = x + Dropout(Attn(n)) + Dropout(FFN(n))
Two norms (GPT-NeoX):           y = x + Dropout(Attn(Norm1(x))) + Dropout(FFN(Norm2(x)))
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _checks
from ._block import Activation, Block, NormKind, ResidualKind, block_doc
from .init import Seed


@block_doc
class ParallelBlock(Block):
    """A parallel-residual block over inputs (B, T, D):
    ``y = x + Dropout(Attn(Norm1(x))) + Dropout(FFN(Norm(x)))``, Norm = Norm1 with
    shared_norm=True (GPT-J, PaLM), Norm2 otherwise (GPT-NeoX).

    The two sums are res1 (``h = x + r1(attention branch)``) and res2
    (``y = h + r2(FFN branch)``); with ``residual="none"`` the skip connection is dropped
    and the second sum still adds the two branches: ``y = r1 + r2``.  Backward:
    ``dFFN = r2'(dy)``, ``dh = dy``; dx_skip and dAttn from res1; then with one norm
    ``dx = dx_skip + Norm1'(Attn'(dAttn) + FFN'(dFFN))`` (the shared norm's backward runs
    once, on the sum), with two ``dx = dx_skip + Norm1'(Attn'(dAttn)) + Norm2'(FFN'(dFFN))``.
    Parameter names are PreNormBlock's, with norm2.* only when shared_norm=False.
    NumPy twin: ``resnorm.nn.reference.parallel_block``.

    Parameters
    ----------
    shared_norm : bool, default True
        True: one norm (norm1.*) feeds both sublayers; False: norm1 before attention and
        norm2 before the feed-forward network, both reading x.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> neox = nn.ParallelBlock(16, 2, shared_norm=False, seed=0)
    >>> [n for n in neox.params() if n.startswith("norm")]
    ['norm1.weight', 'norm1.bias', 'norm2.weight', 'norm2.bias']
    >>> gptj = nn.ParallelBlock(16, 2, seed=0)
    >>> [n for n in gptj.params() if n.startswith("norm")]
    ['norm1.weight', 'norm1.bias']
    >>> x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    >>> y = neox.forward(x)
    >>> neox.backward(np.ones_like(y)).shape
    (2, 3, 16)
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *,
                 shared_norm: bool = True, norm: NormKind = "layer",
                 residual: ResidualKind = "plain", dropout: float = 0.0,
                 attn_dropout: float = 0.0, causal: bool = True,
                 activation: Activation = "gelu", eps: float = 1e-5, bias: bool = True,
                 alpha: float = 1.0, gate: float = 0.0, dtype: DTypeLike = np.float32,
                 seed: Seed = 0) -> None:
        self.shared_norm = _checks.flag(shared_norm, "shared_norm")
        self.norm_names = ("norm1",) if self.shared_norm else ("norm1", "norm2")
        super().__init__(d_model, n_heads, d_ff, norm=norm, residual=residual,
                         dropout=dropout, attn_dropout=attn_dropout, causal=causal,
                         activation=activation, eps=eps, bias=bias, alpha=alpha, gate=gate,
                         dtype=dtype, seed=seed)

    def _residual_kinds(self, residual: ResidualKind) -> tuple[ResidualKind, ResidualKind]:
        # without a skip connection the second sum still adds the two branches
        return residual, "plain" if residual == "none" else residual

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = self._input(x)
        n1 = self.norm1.forward(x)
        n2 = n1 if self.shared_norm else self.norm2.forward(x)
        h = self.res1.forward(x, self.self_attn.forward(n1))
        return self.res2.forward(h, self.ffn.forward(n2))

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        dy = self._output_gradient(dy)
        dh, df = self.res2.backward(dy)
        dx, da = self.res1.backward(dh)
        dn2 = self.ffn.backward(df)
        g = self.self_attn.backward(da)          # fresh: safe to add into
        if self.shared_norm:
            g += dn2
            g = self.norm1.backward(g)
        else:
            g = self.norm1.backward(g)
            g += self.norm2.backward(dn2)
        if dx is not None:
            g += dx
        return g
