"""The numba peer: the row loops a numba user writes for the same computations.

Each loop is plain Python over rows and columns, compiled with
``@njit(fastmath={'reassoc', 'contract'})`` (reassociation lets LLVM vectorise the row sums;
contraction gives FMAs), accumulating in the input dtype, writing into outputs allocated
once before timing.  Each is written once with ``prange`` over rows (or over blocks of rows
for the sums over rows) and compiled twice: serial ``@njit`` for calls that run on one
thread, ``@njit(parallel=True)`` with ``numba.set_num_threads(threads)`` for more.  The
thread count is the one resnorm's call runs on (resnorm keeps small calls on one thread;
so does this peer).  Compiled code is cached on disk (numba's cache=True) and every loop is
called once, to compile and check it, before it is timed.

Same computations as the resnorm ops with alpha = 1 and no dropout: the LayerNorm variance
is two-pass; Post-Norm recomputes x + residual instead of storing it; backward passes take
the forward's row statistics (in the input dtype) and, for Pre-Norm, the stored h.  One
forward loop serves both norms with their Pre-Norm and Post-Norm forms, and one backward
loop per norm its three forms: numba compiles each combination of None arguments
separately and drops the branches that test them, so every op gets the loop a user would
write for it alone.  The gated RMSNorm's loops (Mamba2's form: the gate before the norm,
one group per row) evaluate exp once per element: the forward keeps u = x * silu(gate) in
y between its two passes, the backward keeps sigmoid(gate) in dgate's row.  There is no
numba loop for the dropout ops: a numba user draws another random mask, so the result
could not be checked against resnorm's.
"""
import types

import numpy as np

FASTMATH = {"reassoc", "contract"}
prange = range   # numba.prange once _kernel has imported numba (the loops' parallel loop)
_compiled = {}


# --------------------------------------------------------------------------- forward
# res None: a plain norm of x.  res given: of h = res + x, stored in h (Pre-Norm) or, with
# h None, recomputed in every pass (Post-Norm).  rstd (and LayerNorm's mean) are always
# stored: the training form returns them, the inference form writes them to scratch
# (_norm_peer says why).

def _norm(x, res, w, b, eps, y, h, mean, rstd):
    """RMSNorm (b None: y = v * rstd * w) or LayerNorm (y = (v - mean) * rstd * w + b, the
    variance in a second pass over v - mean) of each row v."""
    n, d = x.shape
    one = x.dtype.type(1)
    inv_d = one / x.dtype.type(d)
    for i in prange(n):
        s = x.dtype.type(0)
        for j in range(d):
            v = x[i, j] if res is None else res[i, j] + x[i, j]
            if h is not None:
                h[i, j] = v
            s += v * v if b is None else v
        m = x.dtype.type(0) if b is None else s * inv_d
        if b is not None:
            s = x.dtype.type(0)
            for j in range(d):
                v = x[i, j] if res is None else (res[i, j] + x[i, j] if h is None else h[i, j])
                s += (v - m) * (v - m)
        r = one / np.sqrt(s * inv_d + eps)
        rstd[i] = r
        if b is not None:
            mean[i] = m
        for j in range(d):
            v = x[i, j] if res is None else (res[i, j] + x[i, j] if h is None else h[i, j])
            if b is None:
                y[i, j] = v * r * w[j]
            else:
                y[i, j] = (v - m) * r * w[j] + b[j]


def _gated_rms_norm(x, z, w, eps, y, rstd):
    """The gated RMSNorm of Mamba2 (gate before the norm): u = x * silu(z), y = u * rstd(u)
    * w.  u is stored in y by the first pass (one exp per element) and scaled there by the
    second."""
    n, d = x.shape
    one = x.dtype.type(1)
    inv_d = one / x.dtype.type(d)
    for i in prange(n):
        s = x.dtype.type(0)
        for j in range(d):
            u = x[i, j] * z[i, j] / (one + np.exp(-z[i, j]))
            y[i, j] = u
            s += u * u
        r = one / np.sqrt(s * inv_d + eps)
        rstd[i] = r
        for j in range(d):
            y[i, j] = y[i, j] * r * w[j]


def _scaled_residual(x, f, alpha, h):
    n, d = x.shape
    for i in prange(n):
        for j in range(d):
            h[i, j] = x[i, j] + alpha[j] * f[i, j]


def _gated_residual(x, f, g, h):
    n, d = x.shape
    one = x.dtype.type(1)
    for i in prange(n):
        for j in range(d):
            h[i, j] = x[i, j] + f[i, j] / (one + np.exp(-g[i, j]))


# --------------------------------------------------------------------------- backward
# The norm at h = x (res None; Pre-Norm passes its stored h as x) or h = res + x (Post-Norm,
# recomputed).  dh given (Pre-Norm): added to the norm's gradient.  dres given: the fused
# forms' dresidual, equal to dx (alpha = 1, no dropout).  Sums over rows: each block of
# rows adds into its own row of `part` (one row per thread), then the blocks are added up.

def _rms_norm_backward(dy, x, res, dh, w, rstd, dx, dres, dw, part):
    n, d = x.shape
    blocks = part.shape[0]
    inv_d = x.dtype.type(1) / x.dtype.type(d)
    for k in prange(blocks):
        part[k, :] = 0
        for i in range(k * n // blocks, (k + 1) * n // blocks):
            r = rstd[i]
            c = x.dtype.type(0)
            for j in range(d):
                v = x[i, j] if res is None else res[i, j] + x[i, j]
                c += dy[i, j] * w[j] * v
            c = c * r * r * inv_d
            for j in range(d):
                v = x[i, j] if res is None else res[i, j] + x[i, j]
                g = r * (dy[i, j] * w[j] - v * c)
                if dh is not None:
                    g += dh[i, j]
                dx[i, j] = g
                if dres is not None:
                    dres[i, j] = g
                part[k, j] += dy[i, j] * v * r
    for j in range(d):
        dw[j] = part[:, j].sum()


def _layer_norm_backward(dy, x, res, dh, w, mean, rstd, dx, dres, dw, db, part_w, part_b):
    n, d = x.shape
    blocks = part_w.shape[0]
    inv_d = x.dtype.type(1) / x.dtype.type(d)
    for k in prange(blocks):
        part_w[k, :] = 0
        part_b[k, :] = 0
        for i in range(k * n // blocks, (k + 1) * n // blocks):
            m, r = mean[i], rstd[i]
            sg = x.dtype.type(0)
            sgx = x.dtype.type(0)
            for j in range(d):
                v = x[i, j] if res is None else res[i, j] + x[i, j]
                sg += dy[i, j] * w[j]
                sgx += dy[i, j] * w[j] * (v - m) * r
            sg *= inv_d
            sgx *= inv_d
            for j in range(d):
                v = x[i, j] if res is None else res[i, j] + x[i, j]
                xhat = (v - m) * r
                g = r * (dy[i, j] * w[j] - sg - xhat * sgx)
                if dh is not None:
                    g += dh[i, j]
                dx[i, j] = g
                if dres is not None:
                    dres[i, j] = g
                part_w[k, j] += dy[i, j] * xhat
                part_b[k, j] += dy[i, j]
    for j in range(d):
        dw[j] = part_w[:, j].sum()
        db[j] = part_b[:, j].sum()


def _gated_rms_norm_backward(dy, x, z, w, rstd, dx, dz, dw, part):
    """With s = sigmoid(z), a = z * s, u = x * a: du = r * (dy * w - u * r^2 mean(dy * w *
    u)), dx = du * a, dz = du * x * (s + a * (1 - s)), dw = sum over rows of dy * u * r.
    The first pass keeps s in dz's row (one exp per element), the second reads it back."""
    n, d = x.shape
    blocks = part.shape[0]
    one = x.dtype.type(1)
    inv_d = one / x.dtype.type(d)
    for k in prange(blocks):
        part[k, :] = 0
        for i in range(k * n // blocks, (k + 1) * n // blocks):
            r = rstd[i]
            c = x.dtype.type(0)
            for j in range(d):
                s = one / (one + np.exp(-z[i, j]))
                dz[i, j] = s
                c += dy[i, j] * w[j] * x[i, j] * z[i, j] * s
            c = c * r * r * inv_d
            for j in range(d):
                s = dz[i, j]
                a = z[i, j] * s
                u = x[i, j] * a
                du = r * (dy[i, j] * w[j] - u * c)
                dx[i, j] = du * a
                dz[i, j] = du * x[i, j] * (s + a * (one - s))
                part[k, j] += dy[i, j] * u * r
    for j in range(d):
        dw[j] = part[:, j].sum()


def _scaled_residual_backward(dh, f, alpha, dx, df, dalpha, part):
    n, d = dh.shape
    blocks = part.shape[0]
    for k in prange(blocks):
        part[k, :] = 0
        for i in range(k * n // blocks, (k + 1) * n // blocks):
            for j in range(d):
                dx[i, j] = dh[i, j]
                df[i, j] = alpha[j] * dh[i, j]
                part[k, j] += dh[i, j] * f[i, j]
    for j in range(d):
        dalpha[j] = part[:, j].sum()


def _gated_residual_backward(dh, f, g, dx, df, dg):
    n, d = dh.shape
    one = dh.dtype.type(1)
    for i in prange(n):
        for j in range(d):
            s = one / (one + np.exp(-g[i, j]))
            dx[i, j] = dh[i, j]
            df[i, j] = s * dh[i, j]
            dg[i, j] = dh[i, j] * f[i, j] * s * (one - s)


# --------------------------------------------------------------------------- binding

def _kernel(loop, threads):
    """loop compiled for `threads` threads (serial for one), numba's team size set."""
    global prange
    import numba

    prange = numba.prange
    parallel = threads > 1
    if parallel:
        numba.set_num_threads(threads)
    key = (loop.__name__, parallel)
    if key not in _compiled:
        fn = _renamed(loop, "_parallel") if parallel else loop
        try:
            _compiled[key] = numba.njit(fastmath=FASTMATH, parallel=parallel, cache=True)(fn)
        except RuntimeError:   # no writable cache directory: compile in every run
            _compiled[key] = numba.njit(fastmath=FASTMATH, parallel=parallel)(fn)
    return _compiled[key]


def _renamed(loop, suffix):
    """A copy of loop under another name.  numba's disk cache tells functions apart by
    name and bytecode, not by compile options: without this, the parallel build would load
    the serial one's machine code from the cache."""
    fn = types.FunctionType(loop.__code__, loop.__globals__, loop.__name__ + suffix)
    fn.__qualname__ = loop.__qualname__ + suffix
    return fn


def _peer(loop, args, returns, partials=()):
    """bind(threads, used) of loop(*args, *partial sums), returning `returns` (the outputs
    in resnorm's order): `partials` lists the column counts of the per-thread partial sums
    (one row per thread, allocated per thread count)."""
    dtype = args[0].dtype

    def bind(threads, used):
        f = _kernel(loop, used)
        call_args = tuple(args) + tuple(np.empty((used, d), dtype) for d in partials)

        def call():
            f(*call_args)
            return returns
        return call
    return bind


def rms_norm(x, w, eps, stats=False, res=None, prenorm=False):
    """rms_norm (res None), Pre-Norm add_rms_norm or Post-Norm add_rms_norm_post; stats:
    the training form (rstd too)."""
    return _norm_peer(x, res, w, None, eps, prenorm, stats)


def layer_norm(x, w, b, eps, stats=False, res=None, prenorm=False):
    """layer_norm (res None), Pre-Norm add_layer_norm or Post-Norm add_layer_norm_post;
    stats: the training form (mean and rstd too)."""
    return _norm_peer(x, res, w, b, eps, prenorm, stats)


def _norm_peer(x, res, w, b, eps, prenorm, stats):
    # The loop always stores the row statistics (into scratch when the op does not return
    # them): without that store, LLVM (numba 0.68) leaves the scaling loop scalar, and the
    # same loop takes 1.3-1.6x as long at (1, 4096) and 1.05-1.15x at (2048, 768).  A user
    # who timed both would keep the faster one.
    y = np.empty_like(x)
    h = np.empty_like(x) if prenorm else None
    rstd = np.empty(x.shape[0], x.dtype)
    mean = np.empty(x.shape[0], x.dtype) if b is not None else None
    returns = tuple(a for a in (y, h) + ((mean, rstd) if stats else ()) if a is not None)
    return _peer(_norm, (x, res, w, b, x.dtype.type(eps), y, h, mean, rstd), returns)


def gated_rms_norm(x, z, w, eps, stats=False):
    """gated_rms_norm (gate before the norm, one group per row); stats: the training form
    (rstd too).  rstd is stored in both forms, as _norm_peer explains."""
    y, rstd = np.empty_like(x), np.empty(x.shape[0], x.dtype)
    return _peer(_gated_rms_norm, (x, z, w, x.dtype.type(eps), y, rstd),
                 (y, rstd) if stats else (y,))


def scaled_residual(x, f, alpha):
    h = np.empty_like(x)
    return _peer(_scaled_residual, (x, f, alpha, h), (h,))


def gated_residual(x, f, g):
    h = np.empty_like(x)
    return _peer(_gated_residual, (x, f, g, h), (h,))


def rms_norm_backward(dy, x, w, rstd, res=None, dh=None, fused=False):
    """(dx, dweight); fused: (dx, dresidual, dweight) of add_rms_norm (dh given, x the
    stored h) or add_rms_norm_post (res given)."""
    dx, dw = np.empty_like(x), np.empty_like(w)
    dres = np.empty_like(x) if fused else None
    returns = (dx, dres, dw) if fused else (dx, dw)
    return _peer(_rms_norm_backward, (dy, x, res, dh, w, rstd, dx, dres, dw), returns,
                 [len(w)])


def layer_norm_backward(dy, x, w, mean, rstd, res=None, dh=None, fused=False):
    """(dx, dweight, dbias); fused: (dx, dresidual, dweight, dbias), as rms_norm_backward."""
    dx, dw, db = np.empty_like(x), np.empty_like(w), np.empty_like(w)
    dres = np.empty_like(x) if fused else None
    returns = (dx, dres, dw, db) if fused else (dx, dw, db)
    return _peer(_layer_norm_backward, (dy, x, res, dh, w, mean, rstd, dx, dres, dw, db),
                 returns, [len(w)] * 2)


def gated_rms_norm_backward(dy, x, z, w, rstd):
    """(dx, dgate, dweight) of gated_rms_norm from the forward's rstd (in x's dtype)."""
    dx, dz, dw = np.empty_like(x), np.empty_like(x), np.empty_like(w)
    return _peer(_gated_rms_norm_backward, (dy, x, z, w, rstd, dx, dz, dw), (dx, dz, dw),
                 [len(w)])


def scaled_residual_backward(dh, f, alpha):
    dx, df, dalpha = np.empty_like(dh), np.empty_like(dh), np.empty_like(alpha)
    return _peer(_scaled_residual_backward, (dh, f, alpha, dx, df, dalpha), (dx, df, dalpha),
                 [len(alpha)])


def gated_residual_backward(dh, f, g):
    dx, df, dg = np.empty_like(dh), np.empty_like(dh), np.empty_like(dh)
    return _peer(_gated_residual_backward, (dh, f, g, dx, df, dg), (dx, df, dg))
