"""Plain NumPy float64 twins of the nn kernels and blocks, written to be read.

Each function computes in float64 what its compiled counterpart computes, with the same
names and in the same order, favouring clarity over speed.  Tests compare the modules
against these; parameters are passed as a dict with the modules' (torch's) names.

Shapes: x (B, T, D); H heads of size dh = D / H; qkv (B, T, 3D); att (B, H, T, T).
"""
import numpy as np

from .. import reference as norm_reference


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


# --------------------------------------------------------------------------- Linear

def linear_forward(x, weight, bias=None):
    """y = x @ W^T + b,  W: (out, in)."""
    y = _f64(x) @ _f64(weight).T
    return y if bias is None else y + _f64(bias)


def linear_backward(dy, x, weight):
    """(dx, dweight, dbias) of y = x @ W^T + b:  dx = dy W,  dW = dy^T x,  db = sum_rows dy."""
    dy, x, w = _f64(dy), _f64(x), _f64(weight)
    dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    return dy @ w, dy2.T @ x2, dy2.sum(axis=0)


# --------------------------------------------------------------------------- GELU

def _normal_cdf(x):
    """Phi(x) = 0.5 (1 + erf(x / sqrt 2)), written as 0.5 erfc(-x / sqrt 2): the same
    function, without the cancellation of 1 + erf(x) for x << 0."""
    from scipy.special import erfc
    return 0.5 * erfc(-x / np.sqrt(2.0))


def gelu(x, approximate="none"):
    """x Phi(x) = 0.5 x (1 + erf(x/sqrt 2)), or 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).

    The tanh form is computed as x sigmoid(2u), the same function (0.5 (1 + tanh u) =
    sigmoid(2u)) without the cancellation of 1 + tanh(u) for x << 0.
    """
    from scipy.special import expit
    x = _f64(x)
    if approximate == "tanh":
        return x * expit(2.0 * _gelu_tanh_u(x))
    return x * _normal_cdf(x)


def _gelu_tanh_u(x):
    return np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)


def gelu_backward(dy, x, approximate="none"):
    """dy * gelu'(x).  Exact: Phi(x) + x phi(x).  tanh form: 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x),
    t = tanh(u), written with s = sigmoid(2u): s + 2 x s (1 - s) u'(x)."""
    from scipy.special import expit
    dy, x = _f64(dy), _f64(x)
    if approximate == "tanh":
        u = _gelu_tanh_u(x)
        s, one_minus_s = expit(2.0 * u), expit(-2.0 * u)
        du = np.sqrt(2.0 / np.pi) * (1.0 + 3 * 0.044715 * x**2)
        return dy * (s + 2.0 * x * s * one_minus_s * du)
    cdf = _normal_cdf(x)                                   # Phi(x)
    pdf = np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)      # phi(x)
    return dy * (cdf + x * pdf)


# --------------------------------------------------------------------------- softmax

def causal_mask(t):
    """(T, T) bool, True where query i may see key j (j <= i)."""
    return np.tril(np.ones((t, t), dtype=bool))


def softmax(s, scale=1.0, causal=False):
    """Row softmax of scale * s over the last axis; causal: masked entries are 0."""
    z = scale * _f64(s)
    if causal:
        z = np.where(causal_mask(z.shape[-1]), z, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)                  # stable: largest exponent is 0
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_backward(dp, p, scale=1.0):
    """ds = scale * p * (dp - sum_j p_j dp_j), for p = softmax(scale * s)."""
    dp, p = _f64(dp), _f64(p)
    return scale * p * (dp - np.sum(p * dp, axis=-1, keepdims=True))


# --------------------------------------------------------------------------- attention

def split_heads(qkv, n_heads):
    """q, k, v each (B, H, T, dh) from qkv (B, T, 3D)."""
    b, t, d3 = qkv.shape
    d = d3 // 3
    q, k, v = (_f64(a).reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)
               for a in np.split(qkv, 3, axis=-1))
    return q, k, v


def merge_heads(a):
    """(B, H, T, dh) -> (B, T, D), heads side by side."""
    b, h, t, dh = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


def attention_forward(qkv, n_heads, causal=True, dropout_p=0.0, dropout_seed=0):
    """(out, att): att = softmax(q k^T / sqrt(dh)) per head, out = concat_h dropout(att) v.

    Dropout on the probabilities (dropout_p > 0) uses the mask resnorm.dropout gives the
    (B, H, T, T) array att under dropout_seed (resnorm.reference.dropout_forward); att is
    returned before dropout."""
    q, k, v = split_heads(qkv, n_heads)
    scale = 1.0 / np.sqrt(q.shape[-1])
    att = softmax(q @ k.transpose(0, 1, 3, 2), scale, causal)
    dropped, _ = norm_reference.dropout_forward(att, dropout_p, dropout_seed)
    return merge_heads(dropped @ v), att


def attention_backward(dout, qkv, att, n_heads, dropout_p=0.0, dropout_seed=0):
    """dqkv (B, T, 3D) of attention_forward (the same dropout_p and dropout_seed)."""
    q, k, v = split_heads(qkv, n_heads)
    b, t, d = dout.shape
    do = _f64(dout).reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)
    att = _f64(att)
    dropped, keep = norm_reference.dropout_forward(att, dropout_p, dropout_seed)
    dp = norm_reference.dropout_backward(do @ v.transpose(0, 1, 3, 2), keep, dropout_p)
    dv = dropped.transpose(0, 1, 3, 2) @ do                # dv = dropout(P)^T dO
    ds = softmax_backward(dp, att, 1.0 / np.sqrt(q.shape[-1]))
    dq = ds @ k                                            # dq = dS k
    dk = ds.transpose(0, 1, 3, 2) @ q                      # dk = dS^T q
    return np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)


def self_attention(x, p, n_heads, causal=True, prefix="self_attn."):
    """The CausalSelfAttention module: in projection, attention, out projection."""
    qkv = linear_forward(x, p[prefix + "in_proj_weight"], p.get(prefix + "in_proj_bias"))
    heads, _ = attention_forward(qkv, n_heads, causal)
    return linear_forward(heads, p[prefix + "out_proj.weight"], p.get(prefix + "out_proj.bias"))


# --------------------------------------------------------------------------- blocks

def feed_forward(x, p, activation="gelu"):
    h = linear_forward(x, p["linear1.weight"], p.get("linear1.bias"))
    a = gelu(h, "tanh" if activation == "gelu_tanh" else "none")
    return linear_forward(a, p["linear2.weight"], p.get("linear2.bias"))


def norm(x, p, name, kind="layer", eps=1e-5):
    """RMSNorm or LayerNorm with the parameters name.weight (and name.bias)."""
    if kind == "rms":
        return norm_reference.rms_norm_forward(x, p[name + ".weight"], eps)[0]
    return norm_reference.layer_norm_forward(x, p[name + ".weight"], p.get(name + ".bias"),
                                             eps)[0]


def residual(x, f, p, name, kind="plain"):
    """h = x + f | x + alpha f | x + sigmoid(gate) f | f (no dropout here)."""
    f = _f64(f)
    if kind == "none":
        return f
    if kind == "scaled":
        return _f64(x) + _f64(p[name + ".alpha"])[0] * f
    if kind == "gated":
        return _f64(x) + f / (1.0 + np.exp(-_f64(p[name + ".gate"])))
    return _f64(x) + f


def pre_norm_block(x, p, n_heads, norm_kind="layer", residual_kind="plain", causal=True,
                   activation="gelu", eps=1e-5):
    """u = x + Attn(Norm1(x));  y = u + FFN(Norm2(u))   (dropout off)."""
    a = self_attention(norm(x, p, "norm1", norm_kind, eps), p, n_heads, causal)
    u = residual(x, a, p, "res1", residual_kind)
    f = feed_forward(norm(u, p, "norm2", norm_kind, eps), p, activation)
    return residual(u, f, p, "res2", residual_kind)


def post_norm_block(x, p, n_heads, norm_kind="layer", residual_kind="plain", causal=True,
                    activation="gelu", eps=1e-5):
    """u = Norm1(x + Attn(x));  y = Norm2(u + FFN(u))   (dropout off)."""
    a = self_attention(x, p, n_heads, causal)
    u = norm(residual(x, a, p, "res1", residual_kind), p, "norm1", norm_kind, eps)
    f = feed_forward(u, p, activation)
    return norm(residual(u, f, p, "res2", residual_kind), p, "norm2", norm_kind, eps)


def parallel_block(x, p, n_heads, norm_kind="layer", residual_kind="plain", causal=True,
                   activation="gelu", eps=1e-5, shared_norm=True):
    """y = x + Attn(Norm1(x)) + FFN(Norm(x)), Norm = Norm1 (shared_norm) or Norm2; the
    sums are res1 then res2 (residual "none": y = Attn(..) + FFN(..))   (dropout off)."""
    n1 = norm(x, p, "norm1", norm_kind, eps)
    n2 = n1 if shared_norm else norm(x, p, "norm2", norm_kind, eps)
    h = residual(x, self_attention(n1, p, n_heads, causal), p, "res1", residual_kind)
    return residual(h, feed_forward(n2, p, activation), p, "res2",
                    "plain" if residual_kind == "none" else residual_kind)


def deepnorm_block(x, p, n_heads, alpha, norm_kind="layer", causal=True, activation="gelu",
                   eps=1e-5):
    """u = Norm1(alpha x + Attn(x));  y = Norm2(alpha u + FFN(u))   (dropout off)."""
    x = _f64(x)
    u = norm(alpha * x + self_attention(x, p, n_heads, causal), p, "norm1", norm_kind, eps)
    return norm(alpha * u + feed_forward(u, p, activation), p, "norm2", norm_kind, eps)


def sandwich_block(x, p, n_heads, norm_kind="layer", residual_kind="plain", causal=True,
                   activation="gelu", eps=1e-5):
    """u = x + Norm1_out(Attn(Norm1(x)));  y = u + Norm2_out(FFN(Norm2(u)))   (dropout off)."""
    a = norm(self_attention(norm(x, p, "norm1", norm_kind, eps), p, n_heads, causal), p,
             "norm1_out", norm_kind, eps)
    u = residual(x, a, p, "res1", residual_kind)
    f = norm(feed_forward(norm(u, p, "norm2", norm_kind, eps), p, activation), p, "norm2_out",
             norm_kind, eps)
    return residual(u, f, p, "res2", residual_kind)
