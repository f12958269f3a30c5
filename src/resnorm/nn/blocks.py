"""Pre-Norm and Post-Norm Transformer encoder blocks.

Pre-Norm:   u = x + Dropout(Attn(Norm1(x)));   y = u + Dropout(FFN(Norm2(u)))
Post-Norm:  u = Norm1(x + Dropout(Attn(x)));   y = Norm2(u + Dropout(FFN(u)))

Parameter names and layouts are those of torch.nn.TransformerEncoderLayer(batch_first=True):
docs/blocks.md has the table.  The other block types: parallel.py, deepnorm.py, sandwich.py;
the stack of blocks: stack.py.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._block import Block, block_doc
from ._residual import (post_add_norm_backward, post_add_norm_forward, pre_add_norm_backward,
                        pre_add_norm_forward)


@block_doc
class PreNormBlock(Block):
    """A Pre-Norm Transformer encoder block over inputs (B, T, D).

    ``u = x + Dropout(Attn(Norm1(x)))``, ``y = u + Dropout(FFN(Norm2(u)))``: the residual
    stream is never normalised (a stack of these needs a final norm).  Parameters are named
    as in ``torch.nn.TransformerEncoderLayer(d_model, n_heads, d_ff, batch_first=True,
    norm_first=True)``; the first add and the norm after it run as one fused kernel.
    NumPy twin: ``resnorm.nn.reference.pre_norm_block``.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> block = nn.PreNormBlock(16, 2, dropout=0.1, attn_dropout=0.1, seed=0)
    >>> x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    >>> y = block.forward(x)
    >>> dx = block.backward(np.ones_like(y))
    >>> y.shape, dx.shape, block.num_params()
    ((2, 5, 16), (2, 5, 16), 3280)
    >>> y_eval = block.eval().forward(x)    # eval mode: no dropout, the same output twice
    >>> bool(np.array_equal(y_eval, block.forward(x))), bool(np.array_equal(y_eval, y))
    (True, False)
    """

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = self._input(x)
        a = self.self_attn.forward(self.norm1.forward(x))
        n2, u = pre_add_norm_forward(self.res1, self.norm2, x, a)
        return self.res2.forward(u, self.ffn.forward(n2))

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        dy = self._output_gradient(dy)
        du, df = self.res2.backward(dy)
        dx, da = pre_add_norm_backward(self.res1, self.norm2, self.ffn.backward(df), du)
        g = self.norm1.backward(self.self_attn.backward(da))   # fresh: safe to add into
        if dx is not None:
            g += dx
        return g


@block_doc
class PostNormBlock(Block):
    """A Post-Norm Transformer encoder block over inputs (B, T, D).

    ``u = Norm1(x + Dropout(Attn(x)))``, ``y = Norm2(u + Dropout(FFN(u)))``: every residual
    sum is normalised, each add + norm as one fused kernel.  Parameters are named as in
    ``torch.nn.TransformerEncoderLayer(d_model, n_heads, d_ff, batch_first=True)``.
    NumPy twin: ``resnorm.nn.reference.post_norm_block``.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> block = nn.PostNormBlock(16, 2, norm="rms", residual="scaled", seed=0)
    >>> y = block.forward(np.ones((1, 4, 16), np.float32))
    >>> bool(np.allclose(np.mean(y.astype(np.float64) ** 2, axis=-1), 1, atol=1e-3))
    True
    >>> dx = block.backward(np.ones_like(y))
    >>> block.grads()["res1.alpha"].shape
    (1,)
    """

    # y = Norm(skip_scale * x + Dropout(F(x))): 1 here, DeepNorm's alpha in DeepNormBlock
    skip_scale = 1.0

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = self._input(x)
        u = post_add_norm_forward(self.res1, self.norm1, x, self.self_attn.forward(x),
                                  self.skip_scale)
        return post_add_norm_forward(self.res2, self.norm2, u, self.ffn.forward(u),
                                     self.skip_scale)

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        dy = self._output_gradient(dy)
        du, df = post_add_norm_backward(self.res2, self.norm2, dy)
        g = self.ffn.backward(df)               # fresh: safe to add into
        if du is not None:
            g += du
        dx, da = post_add_norm_backward(self.res1, self.norm1, g)
        g = self.self_attn.backward(da)
        if dx is not None:
            g += dx
        return g
