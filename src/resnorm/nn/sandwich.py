"""The sandwich / Peri-LN block: Pre-Norm with each sublayer's output normalised as well,
before it is added to the residual stream (Ding et al. 2021, "CogView", sandwich LN;
Kim et al. 2025, "Peri-LN"; Gemma 2's post-attention and post-feed-forward norms).

    u = x + Dropout(NormA(Attn(Norm1(x))));   y = u + Dropout(NormF(FFN(Norm2(u))))

It runs on the same kernels as Pre-Norm: the output norms are ordinary norm passes, and
the first add stays fused with the norm after it (resnorm.add_*_norm_forward).
"""
from ._block import Block
from ._residual import pre_add_norm_backward, pre_add_norm_forward


class SandwichBlock(Block):
    """u = x + Dropout(Norm1_out(Attn(Norm1(x))));  y = u + Dropout(Norm2_out(FFN(Norm2(u)))).

    Backward: as PreNormBlock, with each branch gradient passed back through its output
    norm before the sublayer: dAttn = Norm1_out'(r1'(du)), dFFN = Norm2_out'(r2'(dy)).
    NumPy reference: resnorm.nn.reference.sandwich_block.

    Parameters
    ----------
    d_model, n_heads, d_ff : int
        Width, attention heads (a divisor of d_model), FFN hidden size (default 4 d_model).
    norm : {"layer", "rms"}
        The kind of all four norms: norm1, norm2 (sublayer inputs, as in Pre-Norm) and
        norm1_out, norm2_out (sublayer outputs).
    residual : {"plain", "scaled", "gated", "none"}
        The residual connections res1, res2 (see PreNormBlock).
    dropout, attn_dropout : float
        Dropout on both residual branches (after the output norm) / on the attention
        probabilities.
    causal, activation, eps, bias, alpha, gate, dtype, seed
        As PreNormBlock.

    Raises
    ------
    ValueError
        norm, residual or activation not one of the values above; d_model not a multiple
        of n_heads; a dropout rate outside [0, 1].
    TypeError
        An option of the wrong type.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> block = nn.SandwichBlock(16, 2, norm="rms", seed=0)
    >>> sorted(n for n in block.params() if n.startswith("norm"))
    ['norm1.weight', 'norm1_out.weight', 'norm2.weight', 'norm2_out.weight']
    >>> block.forward(np.ones((2, 3, 16), np.float32)).shape
    (2, 3, 16)
    """

    norm_names = ("norm1", "norm2", "norm1_out", "norm2_out")

    def forward(self, x):
        x = self._input(x)
        a = self.norm1_out.forward(self.self_attn.forward(self.norm1.forward(x)))
        n2, u = pre_add_norm_forward(self.res1, self.norm2, x, a)
        return self.res2.forward(u, self.norm2_out.forward(self.ffn.forward(n2)))

    def backward(self, dy):
        du, df = self.res2.backward(dy)
        dn2 = self.ffn.backward(self.norm2_out.backward(df))
        dx, da = pre_add_norm_backward(self.res1, self.norm2, dn2, du)
        g = self.norm1.backward(self.self_attn.backward(self.norm1_out.backward(da)))
        if dx is not None:
            g += dx
        return g
