"""The sandwich / Peri-LN block: Pre-Norm with each sublayer's output normalised as well,
before it is added to the residual stream (Ding et al. 2021, "CogView", sandwich LN;
Kim et al. 2025, "Peri-LN"; Gemma 2's post-attention and post-feed-forward norms).

    u = x + Dropout(Norm1_out(Attn(Norm1(x))));   y = u + Dropout(Norm2_out(FFN(Norm2(u))))

It runs on the same kernels as Pre-Norm: the output norms are ordinary norm passes, and
the first add stays fused with the norm after it (resnorm.add_*_norm_forward).
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._block import Block, block_doc
from ._residual import pre_add_norm_backward, pre_add_norm_forward


@block_doc
class SandwichBlock(Block):
    """A sandwich-norm (Peri-LN) block over inputs (B, T, D):
    ``u = x + Dropout(Norm1_out(Attn(Norm1(x))))``,
    ``y = u + Dropout(Norm2_out(FFN(Norm2(u))))``.

    Pre-Norm with each sublayer's output normalised as well, before dropout and the
    residual add: four norms of the kind ``norm`` gives, norm1 and norm2 (sublayer inputs,
    as in Pre-Norm) and norm1_out and norm2_out (sublayer outputs).  The residual stream
    is never normalised (a stack of these needs a final norm).  Backward: as
    PreNormBlock's, with each branch gradient passed back through its output norm before
    the sublayer: ``dAttn = Norm1_out'(r1'(du))``, ``dFFN = Norm2_out'(r2'(dy))``.
    NumPy twin: ``resnorm.nn.reference.sandwich_block``.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> block = nn.SandwichBlock(16, 2, norm="rms", seed=0)
    >>> sorted(n for n in block.params() if n.startswith("norm"))
    ['norm1.weight', 'norm1_out.weight', 'norm2.weight', 'norm2_out.weight']
    >>> y = block.forward(np.ones((2, 3, 16), np.float32))
    >>> dx = block.backward(np.ones_like(y))
    >>> dx.shape, block.grads()["norm2_out.weight"].shape
    ((2, 3, 16), (16,))
    """

    norm_names = ("norm1", "norm2", "norm1_out", "norm2_out")

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = self._input(x)
        a = self.norm1_out.forward(self.self_attn.forward(self.norm1.forward(x)))
        n2, u = pre_add_norm_forward(self.res1, self.norm2, x, a)
        return self.res2.forward(u, self.norm2_out.forward(self.ffn.forward(n2)))

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        dy = self._output_gradient(dy)
        du, df = self.res2.backward(dy)
        dn2 = self.ffn.backward(self.norm2_out.backward(df))
        dx, da = pre_add_norm_backward(self.res1, self.norm2, dn2, du)
        g = self.norm1.backward(self.self_attn.backward(self.norm1_out.backward(da)))
        if dx is not None:
            g += dx
        return g
