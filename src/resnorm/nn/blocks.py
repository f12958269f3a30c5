"""Pre-Norm and Post-Norm Transformer encoder blocks.

Pre-Norm:   u = x + Dropout(Attn(Norm1(x)));   y = u + Dropout(FFN(Norm2(u)))
Post-Norm:  u = Norm1(x + Dropout(Attn(x)));   y = Norm2(u + Dropout(FFN(u)))

Parameter names and layouts are those of torch.nn.TransformerEncoderLayer(batch_first=True):
docs/blocks.md has the table.  The other block types: parallel.py, deepnorm.py, sandwich.py;
the stack of blocks: stack.py.
"""
from ._block import Block
from ._residual import (post_add_norm_backward, post_add_norm_forward, pre_add_norm_backward,
                        pre_add_norm_forward)


class PreNormBlock(Block):
    """u = x + Dropout(Attn(Norm1(x)));  y = u + Dropout(FFN(Norm2(u))).

    Options: norm "layer" | "rms"; residual "plain" | "scaled" | "gated" | "none" (see
    resnorm.nn._residual.Residual); dropout rate on both residual branches; attn_dropout
    rate on the attention probabilities; causal mask; activation "gelu" (erf) |
    "gelu_tanh"; eps of both norms; bias on every Linear and LayerNorm; alpha / gate:
    initial residual scale / gate logit.  d_ff defaults to 4*d_model.
    Backward returns dx and accumulates every parameter gradient.
    NumPy reference: resnorm.nn.reference.pre_norm_block.
    """

    def forward(self, x):
        x = self._input(x)
        a = self.self_attn.forward(self.norm1.forward(x))
        n2, u = pre_add_norm_forward(self.res1, self.norm2, x, a)
        return self.res2.forward(u, self.ffn.forward(n2))

    def backward(self, dy):
        du, df = self.res2.backward(dy)
        dx, da = pre_add_norm_backward(self.res1, self.norm2, self.ffn.backward(df), du)
        g = self.norm1.backward(self.self_attn.backward(da))   # fresh: safe to add into
        if dx is not None:
            g += dx
        return g


class PostNormBlock(Block):
    """u = Norm1(x + Dropout(Attn(x)));  y = Norm2(u + Dropout(FFN(u))).

    Same options as PreNormBlock.   NumPy reference: resnorm.nn.reference.post_norm_block.
    """

    # y = Norm(skip_scale * x + Dropout(F(x))): 1 here, DeepNorm's alpha in DeepNormBlock
    skip_scale = 1.0

    def forward(self, x):
        x = self._input(x)
        u = post_add_norm_forward(self.res1, self.norm1, x, self.self_attn.forward(x),
                                  self.skip_scale)
        return post_add_norm_forward(self.res2, self.norm2, u, self.ffn.forward(u),
                                     self.skip_scale)

    def backward(self, dy):
        du, df = post_add_norm_backward(self.res2, self.norm2, dy)
        g = self.ffn.backward(df)               # fresh: safe to add into
        if du is not None:
            g += du
        dx, da = post_add_norm_backward(self.res1, self.norm1, g)
        g = self.self_attn.backward(da)
        if dx is not None:
            g += dx
        return g
