"""DeepNorm (Wang, Ma, Dong, Huang, Zhang, Wei, "DeepNet: Scaling Transformers to 1,000
Layers", 2022): Post-Norm with the skip connection up-weighted by a constant alpha and
four of the sublayer weights down-scaled by beta at initialisation.

    u = LN(alpha * x + Dropout(Attn(x)));   y = LN(alpha * u + Dropout(FFN(u)))

alpha and beta are the paper's for an encoder-only stack of N blocks (its Table / Figure 2
"Encoder-only (e.g., BERT)" row):  alpha = (2N)^(1/4),  beta = (8N)^(-1/4).  The
decoder-only row is the same formula with the decoder depth M, so these values also serve a
causal stack.  The encoder-decoder values are not implemented.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from .. import _checks
from . import init
from ._block import Activation, Block, NormKind, block_doc
from .blocks import PostNormBlock
from .init import Seed


def deepnorm_constants(n_layers: int) -> tuple[float, float]:
    """(alpha, beta) of DeepNorm for an encoder-only stack of n_layers blocks:
    alpha = (2 n_layers)^(1/4), beta = (8 n_layers)^(-1/4).

    Parameters
    ----------
    n_layers : int
        Blocks in the stack (each one attention and one feed-forward sublayer), >= 1.

    Returns
    -------
    (float, float)
        alpha, the weight of the skip connection, and beta, the gain of the initial
        feed-forward, value and output-projection weights.

    Raises
    ------
    TypeError, ValueError
        n_layers is not an int >= 1.

    Examples
    --------
    >>> from resnorm import nn
    >>> [round(v, 4) for v in nn.deepnorm_constants(18)]
    [2.4495, 0.2887]
    """
    n = _checks.positive_int(n_layers, "n_layers")
    return (2.0 * n) ** 0.25, (8.0 * n) ** -0.25


def deepnorm_init(block: Block, beta: float, rng: np.random.Generator) -> None:
    """Re-initialises a block's sublayer weights in place as the paper's deepnorm_init.

    Xavier-normal with gain beta for the feed-forward weights (linear1, linear2), the value
    projection (rows 2D..3D of in_proj_weight) and out_proj; gain 1 for the query and key
    projections (rows 0..D and D..2D, each its own (D, D) matrix, as the paper's separate
    q_proj and k_proj); every Linear bias 0, so that the scaled weights alone set the
    size of the branch outputs.  Norm parameters are left as they are.

    Parameters
    ----------
    block : PreNormBlock, PostNormBlock, ParallelBlock, SandwichBlock or DeepNormBlock
        Any block with self_attn and the linear1 / linear2 feed-forward network.
    beta : float
        The gain (deepnorm_constants gives the paper's).
    rng : numpy.random.Generator
        Where the weights are drawn from.

    Returns
    -------
    None

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> block = nn.PostNormBlock(64, 4, dtype=np.float64)
    >>> nn.deepnorm_init(block, 0.25, np.random.default_rng(0))
    >>> bool(abs(block.ffn.linear2.weight.std() / (0.25 * (2 / (64 + 256)) ** 0.5) - 1) < 0.05)
    True
    """
    d = block.d_model
    w = block.self_attn.in_proj_weight
    for rows, gain in ((slice(0, 2 * d), 1.0), (slice(2 * d, 3 * d), beta)):
        w[rows] = init.normal(rng, w[rows].shape, gain * init.xavier_std(d, d), w.dtype)
    for linear in (block.self_attn.out_proj, block.ffn.linear1, block.ffn.linear2):
        out_f, in_f = linear.weight.shape
        linear.weight[:] = init.normal(rng, linear.weight.shape,
                                       beta * init.xavier_std(in_f, out_f), linear.weight.dtype)
    for name, p in block.params().items():
        if name.startswith(("self_attn.", "linear")) and name.endswith("bias"):
            p.fill(0)


@block_doc
class DeepNormBlock(PostNormBlock):
    """A DeepNorm block over inputs (B, T, D): ``u = Norm1(alpha x + Dropout(Attn(x)))``,
    ``y = Norm2(alpha u + Dropout(FFN(u)))``, its weights initialised by `deepnorm_init`
    with gain beta.

    The residual is always the plain sum, with the skip connection scaled by alpha.
    Backward is Post-Norm's with the skip scaled: per sum ``h = alpha x + d``,
    ``dh = Norm'(dy)``, ``dx = alpha dh`` (plus the branch's input gradient), ``dd = dh``.
    It runs on the fused Post-Norm kernels as ``norm(x + d / alpha)`` with
    ``eps / alpha^2``, the same function forward and backward (see docs/deepnorm.md).
    Parameter names are PostNormBlock's (torch's TransformerEncoderLayer names); every
    Linear bias starts at 0.  NumPy twin: ``resnorm.nn.reference.deepnorm_block``.

    Parameters
    ----------
    n_layers : int
        The depth N of the stack the block belongs to: ``alpha = (2N)^(1/4)`` and
        ``beta = (8N)^(-1/4)`` (`deepnorm_constants`, the paper's encoder-only formulas).
    alpha, beta : float, optional
        Override the formula values (both > 0), for ablations.
    norm : {"layer", "rms"}, default "layer"
        LayerNorm (the paper's) or RMSNorm for norm1 and norm2.
    eps : float, default 1e-5
        eps of both norms, applied to ``alpha x + d`` as in the formula.

    Attributes
    ----------
    alpha, beta : float
        The values in use.

    See Also
    --------
    deepnorm_constants, deepnorm_init

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> deep = nn.DeepNormBlock(16, 2, n_layers=18, seed=0)
    >>> round(deep.alpha, 4), round(deep.beta, 4)
    (2.4495, 0.2887)
    >>> float(np.abs(deep.params()["linear1.bias"]).max())      # deepnorm_init zeroes biases
    0.0
    >>> y = deep.forward(np.ones((1, 4, 16), np.float32))
    >>> deep.backward(np.ones_like(y)).shape
    (1, 4, 16)
    >>> stack = nn.TransformerStack(18, 16, 2, block="deepnorm", seed=0)
    >>> stack.layers[0].alpha == deep.alpha and stack.norm is None
    True
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *, n_layers: int,
                 alpha: float | None = None, beta: float | None = None,
                 norm: NormKind = "layer", dropout: float = 0.0, attn_dropout: float = 0.0,
                 causal: bool = True, activation: Activation = "gelu", eps: float = 1e-5,
                 bias: bool = True, dtype: DTypeLike = np.float32, seed: Seed = 0) -> None:
        rng = init.generator(seed)
        super().__init__(d_model, n_heads, d_ff, norm=norm, residual="plain", dropout=dropout,
                         attn_dropout=attn_dropout, causal=causal, activation=activation,
                         eps=eps, bias=bias, dtype=dtype, seed=rng)
        alpha0, beta0 = deepnorm_constants(n_layers)
        self.n_layers = int(n_layers)
        self.alpha = alpha0 if alpha is None else _positive(alpha, "alpha")
        self.beta = beta0 if beta is None else _positive(beta, "beta")
        self.skip_scale = self.alpha
        deepnorm_init(self, self.beta, rng)


def _positive(v: float, name: str) -> float:
    v = _checks.real_value(v, name)
    if not v > 0:
        raise ValueError(f"{name} must be > 0, got {v}")
    return v
