"""Multi-head self-attention, laid out as torch.nn.MultiheadAttention(batch_first=True)."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _checks, _layers
from .._parallel import threads_for
from ..inverted_dropout import dropout_spec
from . import init
from ._blas import single_threaded_blas
from .dropout import Dropout
from .init import Seed
from .linear import Linear
from .module import Module

# Query rows per block of a causal head: block [i0, i1) computes scores against keys
# 0 .. i1 only (resnorm_c/layers.pyx), so the products shrink to (1 + CAUSAL_BLOCK/T) / 2
# of the full ones; smaller blocks cut more but make each gemm call smaller.
CAUSAL_BLOCK = 32


class CausalSelfAttention(Module):
    """Multi-head self-attention, optionally causal, over inputs (B, T, D).

    ``y = out_proj(concat_h softmax(q_h k_h^T / sqrt(dh) [+ causal mask]) v_h)`` with
    ``q | k | v = x @ in_proj_weight.T + in_proj_bias``, H heads of width dh = D/H (head h
    uses columns h*dh .. (h+1)*dh of q, k and v), as ``torch.nn.MultiheadAttention``
    with ``batch_first=True``.  Backward goes through out_proj, then per head
    ``dP = dO v^T``, ``dv = P^T dO``, ``dS = P (dP - rowsum(P dP)) / sqrt(dh)``,
    ``dq = dS k``, ``dk = dS^T q``, then through the input projection.  Caches x, qkv
    (B, T, 3D) and the probabilities P (B, H, T, T); out_proj caches the concatenated
    heads.  NumPy twin: ``resnorm.nn.reference.attention_forward`` / ``attention_backward``.

    A causal head does not compute the masked half of the scores: query rows go in blocks
    of ``causal_block`` (``CAUSAL_BLOCK``) rows, each against the keys it sees
    (``causal_block = 0`` computes the full scores, as a reference for benchmarks).  With
    ``dropout`` the attention probabilities are dropped in training mode with
    resnorm.dropout's counter-based mask of the (B, H, T, T) probabilities and a fresh seed
    per forward, as torch's ``MultiheadAttention(dropout=p)`` drops them; backward uses the
    dropout multipliers M, regenerated from the seed: ``dP = (dO v^T) M``,
    ``dv = (P M)^T dO``.

    Parameters
    ----------
    d_model : int
        D, the model width; a multiple of `n_heads`.
    n_heads : int
        H, the number of heads.
    causal : bool, default True
        Mask key j > query i (torch's ``is_causal``).
    bias : bool, default True
        Whether the projections have biases.
    dropout : float, default 0.0
        Dropout rate of the attention probabilities (training mode only).
    dtype : {numpy.float32, numpy.float64}, default numpy.float32
        The dtype of the parameters and of the inputs.
    seed : int, numpy.random.SeedSequence or numpy.random.Generator, default 0
        Initialisation, as torch: ``in_proj_weight`` (3D, D) xavier-uniform,
        ``in_proj_bias`` (3D,) zero, ``out_proj.weight`` (D, D) U(+-1/sqrt(D)),
        ``out_proj.bias`` zero.

    Raises
    ------
    TypeError
        If a size is not an int, `dtype` is not float32 or float64, or `seed` is of
        another type.
    ValueError
        If a size is not positive, or `d_model` is not a multiple of `n_heads`.

    Examples
    --------
    >>> import numpy as np
    >>> from resnorm import nn
    >>> attn = nn.CausalSelfAttention(8, 2, seed=0)
    >>> x = np.random.default_rng(0).standard_normal((1, 5, 8)).astype(np.float32)
    >>> y = attn.forward(x)
    >>> y.shape
    (1, 5, 8)
    >>> x[0, 4] += 1                       # a change at the last position ...
    >>> bool(np.array_equal(attn.forward(x)[0, :4], y[0, :4]))   # ... is not seen before it
    True
    >>> attn.backward(np.ones_like(y)).shape
    (1, 5, 8)
    """

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = True, bias: bool = True,
                 dropout: float = 0.0, dtype: DTypeLike = np.float32, seed: Seed = 0) -> None:
        super().__init__()
        self.d_model = _checks.positive_int(d_model, "d_model")
        self.n_heads = _checks.positive_int(n_heads, "n_heads")
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got d_model={d_model}, "
                             f"n_heads={n_heads}")
        self.causal = bool(causal)
        self.dtype = _checks.float_dtype(dtype)
        rng = init.generator(seed)
        d = self.d_model
        w = init.uniform(rng, (3 * d, d), init.xavier_bound(d, 3 * d), self.dtype)
        self.in_proj_weight, self.d_in_proj_weight = self.add_param("in_proj_weight", w)
        self.in_proj_bias = self.d_in_proj_bias = None
        if bias:
            self.in_proj_bias, self.d_in_proj_bias = self.add_param(
                "in_proj_bias", np.zeros(3 * d, self.dtype))
        self.out_proj = self.add_module("out_proj", Linear(d, d, bias, dtype=self.dtype,
                                                           seed=rng))
        if bias:
            self.out_proj.bias.fill(0)   # torch.nn.MultiheadAttention zeroes it
        # spawned, not drawn: the weights of a block are the same with or without dropout
        self.attn_dropout = self.add_module("attn_dropout", Dropout(
            _checks.probability(dropout, "dropout"), seed=rng.spawn(1)[0]))
        self.causal_block = CAUSAL_BLOCK   # 0: full scores (what the benchmark compares)
        self._cache = None

    def _dropout_arg(self) -> dict | None:
        """The kernels' dropout argument: None, or a fresh seed's spec (as a dict)."""
        d = self.attn_dropout
        return dropout_spec(d.p, d.next_seed(), True).kernel_arg() if d.active else None

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = _checks.module_input(x, "x", self.dtype, self.d_model, ndim=3)
        x = np.ascontiguousarray(x)
        b, t, d = x.shape
        qkv = np.empty((b, t, 3 * d), self.dtype)
        att = np.empty((b, self.n_heads, t, t), self.dtype)
        heads = np.empty((b, t, d), self.dtype)
        dropout = self._dropout_arg()
        with single_threaded_blas() as parallel_gemm:
            _layers.linear_forward(qkv.reshape(-1, 3 * d), x.reshape(-1, d),
                                   self.in_proj_weight, self.in_proj_bias,
                                   threads_for(None, qkv.size), parallel_gemm)
            _layers.attention_forward(heads, att, qkv, self.causal,
                                      threads_for(None, att.size), parallel_gemm,
                                      self.causal_block, dropout)
        self._cache = (x, qkv, att, dropout)
        return self.out_proj.forward(heads)

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        with self._backward_cache() as (x, qkv, att, dropout):
            dheads = self.out_proj.backward(dy)
        b, t, d = x.shape
        dqkv = np.empty_like(qkv)
        dx = np.empty_like(x)
        with single_threaded_blas() as parallel_gemm:
            # dP and then dS are written over a scratch buffer the size of att
            _layers.attention_backward(dqkv, np.empty_like(att), dheads, qkv, att, self.causal,
                                       threads_for(None, att.size), parallel_gemm,
                                       self.causal_block, dropout)
            _layers.linear_backward(dx.reshape(-1, d), self.d_in_proj_weight,
                                    self.d_in_proj_bias, dqkv.reshape(-1, 3 * d),
                                    x.reshape(-1, d), self.in_proj_weight,
                                    threads_for(None, dqkv.size), parallel_gemm)
        return dx
