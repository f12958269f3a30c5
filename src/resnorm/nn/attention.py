"""Multi-head self-attention, laid out as torch.nn.MultiheadAttention(batch_first=True)."""
import numpy as np

from .. import _checks, _layers
from .._parallel import threads_for
from ..inverted_dropout import dropout_spec
from . import init
from ._blas import single_threaded_blas
from .dropout import Dropout
from .linear import Linear
from .module import Module

# Query rows per block of a causal head: block [i0, i1) computes scores against keys
# 0 .. i1 only (resnorm_c/layers.pyx), so the products shrink to (1 + CAUSAL_BLOCK/T) / 2
# of the full ones; smaller blocks cut more but make each gemm call smaller.
CAUSAL_BLOCK = 32


class CausalSelfAttention(Module):
    """y = out_proj(concat_h Dropout(softmax(q_h k_h^T / sqrt(dh) [+ causal mask])) v_h)

    with q | k | v = x @ in_proj_weight^T + in_proj_bias  (x: (B, T, D), H heads, dh = D/H;
    head h uses columns h*dh .. (h+1)*dh of q, k and v).  causal=True masks key j > query i,
    and the masked half of the scores is not computed (query rows in blocks of
    causal_block = CAUSAL_BLOCK rows, each against the keys it sees; causal_block = 0
    computes the full scores, as a reference for benchmarks).  dropout: rate on the attention
    probabilities (training mode), with resnorm.dropout's counter-based mask of the
    (B, H, T, T) probabilities and a fresh seed per forward, as torch's
    MultiheadAttention(dropout=p) drops them.

    Backward (resnorm_c/layers.pyx attention_backward): through out_proj, then per head,
    with M the dropout multipliers (regenerated from the seed):  dP = (dO v^T) M,
    dv = (P M)^T dO, dS = P (dP - rowsum(P dP)) / sqrt(dh), dq = dS k, dk = dS^T q,
    then through the input projection.
    Caches: x, qkv (B, T, 3D), the probabilities P (B, H, T, T), the dropout seed (no
    mask); out_proj caches the concatenated heads (B, T, D).
    Parameters (torch names): in_proj_weight (3D, D) ~ xavier_uniform, in_proj_bias (3D,) = 0,
    out_proj.weight (D, D) ~ U(+-1/sqrt(D)), out_proj.bias (D,) = 0.
    NumPy reference: resnorm.nn.reference.attention_forward / attention_backward.
    """

    def __init__(self, d_model, n_heads, *, causal=True, bias=True, dropout=0.0,
                 dtype=np.float32, seed=0):
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

    def _dropout_arg(self):
        """The kernels' dropout argument: None, or a fresh seed's spec (as a dict)."""
        d = self.attn_dropout
        return dropout_spec(d.p, d.next_seed(), True).kernel_arg() if d.active else None

    def forward(self, x):
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

    def backward(self, dy):
        x, qkv, att, dropout = self._take_cache()
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
