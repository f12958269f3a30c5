"""Multi-head self-attention, laid out as torch.nn.MultiheadAttention(batch_first=True)."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .. import _checks, _layers
from .._parallel import threads_for
from . import init
from ._blas import single_threaded_blas
from .init import Seed
from .linear import Linear
from .module import Module


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
                 dtype: DTypeLike = np.float32, seed: Seed = 0) -> None:
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
        self._cache = None

    def forward(self, x: ArrayLike) -> NDArray[np.floating]:
        x = _checks.module_input(x, "x", self.dtype, self.d_model, ndim=3)
        x = np.ascontiguousarray(x)
        b, t, d = x.shape
        qkv = np.empty((b, t, 3 * d), self.dtype)
        att = np.empty((b, self.n_heads, t, t), self.dtype)
        heads = np.empty((b, t, d), self.dtype)
        with single_threaded_blas() as parallel_gemm:
            _layers.linear_forward(qkv.reshape(-1, 3 * d), x.reshape(-1, d),
                                   self.in_proj_weight, self.in_proj_bias,
                                   threads_for(None, qkv.size), parallel_gemm)
            _layers.attention_forward(heads, att, qkv, self.causal,
                                      threads_for(None, att.size), parallel_gemm)
        self._cache = (x, qkv, att)
        return self.out_proj.forward(heads)

    def backward(self, dy: ArrayLike) -> NDArray[np.floating]:
        x, qkv, att = self._take_cache()
        dheads = self.out_proj.backward(dy)
        b, t, d = x.shape
        dqkv = np.empty_like(qkv)
        dx = np.empty_like(x)
        with single_threaded_blas() as parallel_gemm:
            # dP and then dS are written over a scratch buffer the size of att
            _layers.attention_backward(dqkv, np.empty_like(att), dheads, qkv, att, self.causal,
                                       threads_for(None, att.size), parallel_gemm)
            _layers.linear_backward(dx.reshape(-1, d), self.d_in_proj_weight,
                                    self.d_in_proj_bias, dqkv.reshape(-1, 3 * d),
                                    x.reshape(-1, d), self.in_proj_weight,
                                    threads_for(None, dqkv.size), parallel_gemm)
        return dx
