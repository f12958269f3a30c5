"""The parallel-residual block (GPT-J, GPT-NeoX, PaLM): attention and the feed-forward
network read the same block input, and both outputs are added to it at once.

One shared norm (GPT-J, PaLM):  n = Norm1(x);  y = x + Dropout(Attn(n)) + Dropout(FFN(n))
Two norms (GPT-NeoX):           y = x + Dropout(Attn(Norm1(x))) + Dropout(FFN(Norm2(x)))
"""
from .. import _checks
from ._block import Block


class ParallelBlock(Block):
    """A parallel-residual block: y = x + Dropout(Attn(Norm1(x))) + Dropout(FFN(Norm(x))),
    Norm = Norm1 with shared_norm=True (GPT-J, PaLM), Norm2 otherwise (GPT-NeoX).

    The two sums are res1 (h = x + r1(attention branch)) and res2 (y = h + r2(FFN branch)).
    Backward: dFFN = r2'(dy) and dh = dy; dx_skip and dAttn from res1; then with one norm
    dx = dx_skip + Norm1'(Attn'(dAttn) + FFN'(dFFN)) (the shared norm's backward runs once,
    on the sum), with two dx = dx_skip + Norm1'(Attn'(dAttn)) + Norm2'(FFN'(dFFN)).
    NumPy reference: resnorm.nn.reference.parallel_block.

    Parameters
    ----------
    d_model, n_heads, d_ff : int
        Width, attention heads (a divisor of d_model), FFN hidden size (default 4 d_model).
    shared_norm : bool
        True (default): one norm, parameters norm1.*; False: norm1 before attention and
        norm2 before the FFN, both reading x.
    norm : {"layer", "rms"}
        LayerNorm or RMSNorm.
    residual : {"plain", "scaled", "gated", "none"}
        Each branch added as is, scaled by its own learnable alpha (res1.alpha,
        res2.alpha), or gated per channel (res1.gate, res2.gate); "none" drops the skip
        connection: y = r1 + r2.
    dropout, attn_dropout : float
        Dropout on both branches / on the attention probabilities.
    causal, activation, eps, bias, alpha, gate, dtype, seed
        As PreNormBlock.

    Raises
    ------
    TypeError
        shared_norm is not a bool; any other option of the wrong type.
    ValueError
        residual, norm or activation not one of the values above; d_model not a multiple
        of n_heads; a dropout rate outside [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> neox = nn.ParallelBlock(16, 2, shared_norm=False, seed=0)
    >>> [n for n in neox.params() if n.startswith("norm")]
    ['norm1.weight', 'norm1.bias', 'norm2.weight', 'norm2.bias']
    >>> x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    >>> y = neox.forward(x)
    >>> neox.backward(np.ones_like(y)).shape
    (2, 3, 16)
    """

    def __init__(self, d_model, n_heads, d_ff=None, *, shared_norm=True, **options):
        self.shared_norm = _checks.flag(shared_norm, "shared_norm")
        self.norm_names = ("norm1",) if self.shared_norm else ("norm1", "norm2")
        super().__init__(d_model, n_heads, d_ff, **options)

    def residual_kinds(self, residual):
        # without a skip connection the second sum still adds the two branches
        return residual, "plain" if residual == "none" else residual

    def forward(self, x):
        x = self._input(x)
        n1 = self.norm1.forward(x)
        n2 = n1 if self.shared_norm else self.norm2.forward(x)
        h = self.res1.forward(x, self.self_attn.forward(n1))
        return self.res2.forward(h, self.ffn.forward(n2))

    def backward(self, dy):
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
