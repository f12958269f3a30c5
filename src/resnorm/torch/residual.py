"""torch.autograd.Functions for resnorm's fused residual kernels: add + norm with dropout
(Pre-Norm and Post-Norm), and inverted dropout.

Pre-Norm (resnorm.add_rms_norm / add_layer_norm):  h = residual + alpha * dropout(x, p, seed),
y = norm(h); apply returns (y, h): y feeds the next sublayer, h is the new residual stream.
One pass over memory: x and residual are read once, y and h written once.  Backward takes
the gradients of both outputs (that of h may be absent) and never stores the dropout mask:
the kernel regenerates it from (seed, index).  Post-Norm (resnorm.add_rms_norm_post /
add_layer_norm_post): y = norm(residual + alpha * dropout(x)) alone; h is not written, and
backward recomputes it.

alpha: a real number (fixed, no gradient), or a tensor of shape () or of a row's (D,) of
x's dtype (a learnable scalar / LayerScale vector: it gets a gradient when it requires
grad).  The norms' options: normalized_shape (a row spans those trailing axes; weight,
bias and a per-channel alpha have their shape) and zero_centered_weight (the gain 1 + w).
ctx keeps resnorm's cache (by reference: Pre-Norm h, Post-Norm x and residual; the float64
row statistics; x and alpha for a tensor alpha) and saves those tensors, the weight and a
tensor alpha, so that autograd catches an in-place change of any of them before backward.

Second derivatives: a backward asked to build a graph (create_graph=True) returns
differentiable torch expressions of the same formulas (resnorm.torch.composite), carrying
the values of resnorm's fused backward.
torch.compile / torch.jit.trace see the fused call as torch's add and resnorm's dropout and
norm operators.  torch.func transforms (vmap, grad, jvp) and forward-mode AD are refused
with a message that names the alternative.
"""
import numbers

import numpy as np
import torch

import resnorm

from . import _tensors as T
from . import composite, kernels, ops
from .functions import norm

_NO_TRANSFORMS = ("{name} does not support torch.func transforms (vmap, grad, jacrev, ...) "
                  "or forward-mode AD. Compose what it fuses instead: h = residual + alpha * "
                  "torch.nn.functional.dropout(x, p); y = resnorm.torch.{norm}(h, ...), "
                  "which supports them.")


def _resnorm_name(layer, prenorm):
    """The name of resnorm's fused function (its _forward and _backward forms) for (layer,
    prenorm), looked up at call time."""
    return ("add_layer_norm" if layer else "add_rms_norm") + ("" if prenorm else "_post")


def _refuse_transforms(name, norm_name):
    if T.functorch_active():
        raise RuntimeError(_NO_TRANSFORMS.format(name=f"resnorm.torch.{name}", norm=norm_name))


def saved_scale(alpha):
    """(the number alpha or None, the tensor alpha or None): a Function keeps a number on
    ctx and saves a tensor with save_for_backward, whose version check then covers it."""
    return (None, alpha) if isinstance(alpha, torch.Tensor) else (alpha, None)


def checked_seed(seed, p, training, name, module=None):
    """The seed of a dropout call of resnorm.torch.<name>, checked: required (not None)
    when a mask is drawn (p > 0 in training); a tensor seed (a 0-d int64 tensor, as the
    modules hold theirs) stays a tensor while a graph is recorded, which reads it when it
    runs, and is read as the int it holds otherwise.  module: the module that draws its
    own seeds, named in the message."""
    if seed is None:
        # a p out of [0, 1] is left to resnorm's own message
        if training and isinstance(p, numbers.Real) and 0 < p <= 1:
            also = f", or use resnorm.torch.{module}, which draws its own" if module else ""
            raise TypeError(
                f"resnorm.torch.{name}: seed is required when p > 0 in training: the "
                f"dropout mask is a function of (seed, element index), so one seed drops "
                f"the same elements on every call; pass a fresh seed per step and "
                f"layer{also}")
        return None
    if isinstance(seed, torch.Tensor):
        return ops.checked_seed_tensor(seed) if T.graph_capture() else ops.tensor_seed(seed)
    return seed


def alpha_arg(alpha, x, wanted):
    """alpha as resnorm takes it: a number as is, a tensor as a NumPy view, except that a
    0-d tensor whose gradient is not wanted is passed as its (exact) value, so that
    resnorm neither keeps x nor computes dalpha for it."""
    alpha = T.scale_tensor(alpha, x)
    if not isinstance(alpha, torch.Tensor):
        return alpha
    if alpha.dim() == 0 and not wanted:
        return alpha.item()
    return T.view(alpha)


def _forward(ctx, layer, prenorm, x, residual, weight, bias, alpha, eps, p, seed, training,
             normalized_shape, zero_centered):
    """Checks, runs resnorm's fused forward; keeps its cache on ctx; returns (y, h)
    (Pre-Norm) or y (Post-Norm)."""
    x = T.input_tensor(x)
    residual = T.partner(residual, "residual", x)
    row = T.row_shape(normalized_shape, x)
    if normalized_shape is not None:
        T.trailing_axes(x, row, "x")
    T.param_tensor(weight, "weight", x, row)
    T.param_tensor(bias, "bias", x, row)
    eps = T.eps_for(eps, x)
    wants_alpha = ctx.needs_input_grad[3]
    options = dict(alpha=alpha_arg(alpha, x, wants_alpha), p=p, seed=seed, training=training,
                   normalized_shape=T.normalized_arg(row), zero_centered_weight=zero_centered,
                   n_threads=T.threads())
    params = (T.view(weight),) + ((T.view(bias),) if layer else ())
    forward = getattr(resnorm, _resnorm_name(layer, prenorm) + "_forward")
    out, ctx.cache = forward(T.view(x), T.view(residual), *params, eps, **options)
    ctx.eps, ctx.p, ctx.seed, ctx.training = eps, p, seed, training
    ctx.has_bias, ctx.axes, ctx.zero_centered = bias is not None, len(row), zero_centered
    ctx.set_materialize_grads(False)   # an unused h must not cost a tensor of zeros
    # backward reads alpha (dx = gh * alpha * ...): a tensor alpha is saved like the other
    # inputs it reads, so that autograd refuses a backward after an in-place change of it
    # (an optimizer step between forward and backward) instead of using the new values
    ctx.alpha, alpha_t = saved_scale(alpha)
    if prenorm:
        y, h = T.tensor(out[0]), T.tensor(out[1])
        ctx.save_for_backward(h, weight, x if wants_alpha else None, alpha_t)
        return y, h
    ctx.save_for_backward(residual, weight, x, alpha_t)
    return T.tensor(out)


def _backward(ctx, layer, prenorm, dy, dh):
    """The gradients of the Function's inputs (x, residual, weight, alpha, [bias,] then
    None for the rest), None where autograd wants none: resnorm's fused backward, or
    differentiable torch expressions when a graph is to be built."""
    *saved, alpha = ctx.saved_tensors   # also autograd's in-place check of what it reads
    alpha = ctx.alpha if alpha is None else alpha
    want = ctx.needs_input_grad
    dy_used = dy is not None
    drop = lambda t: dropout(t, ctx.p, seed=ctx.seed, training=ctx.training)  # noqa: E731
    if torch.is_grad_enabled():
        if prenorm:
            h, weight, x = saved
        else:   # h recomputed in torch operations, differentiable in x, residual, alpha
            residual, weight, x = saved
            h = residual + alpha * drop(x)
        grads = composite.add_norm_backward(
            dy, dh, h, x if want[3] else None, weight, ctx.has_bias, alpha, ctx.eps,
            layer, drop, ctx.axes, ctx.zero_centered)
        try:   # the kernel's values, the expressions' derivatives
            grads = composite.kernel_valued(grads, _kernel_backward(ctx, layer, prenorm,
                                                                    saved, dy, dh))
        except T.NoStorage:   # a dy with no storage to view: the expressions alone
            pass
    else:
        grads = _kernel_backward(ctx, layer, prenorm, saved, dy, dh)
    # y unused (only h reaches the loss): the weight and bias are not in the loss's graph,
    # so they get no gradient, as from torch's composition (not one of zeros)
    wanted = (*want[:2], want[2] and dy_used, want[3], layer and want[4] and dy_used)
    grads = tuple(g if w else None for g, w in zip(grads, wanted))
    return (grads if layer else grads[:4]) + (None,) * (len(want) - (5 if layer else 4))


def _kernel_backward(ctx, layer, prenorm, saved, dy, dh):
    """resnorm's fused backward: (dx, dresidual, dweight, dalpha, dbias) as tensors."""
    dy = torch.zeros_like(saved[0]) if dy is None else dy
    args = (T.view(dy), T.view(dh)) if prenorm else (T.view(dy),)
    backward = getattr(resnorm, _resnorm_name(layer, prenorm) + "_backward")
    dx, dres, dw, *rest = backward(*args, ctx.cache, n_threads=T.threads())
    db, dalpha = (rest[0], rest[1]) if layer else (None, rest[0])
    return tuple(T.tensor(g) for g in (dx, dres, dw, dalpha, db))


def _fused_function(name, layer, prenorm, doc):
    """The torch.autograd.Function of one fused kernel: apply(x, residual, weight, alpha,
    [bias,] eps, p, seed, training, normalized_shape=None, zero_centered=False) returns
    (y, h) (Pre-Norm) or y (Post-Norm); bias follows alpha, so that every one of them has
    x, residual, weight, alpha first."""
    if layer:
        def forward(ctx, x, residual, weight, alpha, bias, eps, p, seed, training,
                    normalized_shape=None, zero_centered=False):
            return _forward(ctx, True, prenorm, x, residual, weight, bias, alpha, eps, p, seed,
                            training, normalized_shape, zero_centered)
    else:
        def forward(ctx, x, residual, weight, alpha, eps, p, seed, training,
                    normalized_shape=None, zero_centered=False):
            return _forward(ctx, False, prenorm, x, residual, weight, None, alpha, eps, p, seed,
                            training, normalized_shape, zero_centered)
    if prenorm:
        def backward(ctx, dy, dh):
            return _backward(ctx, layer, True, dy, dh)
    else:
        def backward(ctx, dy):
            return _backward(ctx, layer, False, dy, None)

    def jvp(ctx, *tangents):
        raise RuntimeError(_NO_TRANSFORMS.format(
            name=f"resnorm.torch.{_resnorm_name(layer, prenorm)}",
            norm="layer_norm" if layer else "rms_norm"))
    return type(name, (torch.autograd.Function,),
                {"__doc__": doc, "__module__": __name__, "__qualname__": name,
                 "forward": staticmethod(forward), "backward": staticmethod(backward),
                 "jvp": staticmethod(jvp)})


AddRMSNormFunction = _fused_function("AddRMSNormFunction", False, True, """\
h = residual + alpha * dropout(x);  y = h * rstd * w,  rstd = 1/sqrt(mean(h^2) + eps).

Backward: gh = dh + rstd*(g - hn*mean(g*hn)), g = dy*w, hn = h*rstd; dresidual = gh;
dx = gh * alpha * keep/(1-p); dweight = sum dy*hn; dalpha = sum gh * dropout(x).
NumPy reference: resnorm.reference.add_rms_norm_forward / add_rms_norm_backward.
apply(x, residual, weight or None, alpha, eps, p, seed, training, normalized_shape=None,
zero_centered=False) -> (y, h).
""")

AddLayerNormFunction = _fused_function("AddLayerNormFunction", True, True, """\
h = residual + alpha * dropout(x);  y = (h - mean) * rstd * w + b.

Backward: hhat = (h-mean)*rstd, g = dy*w, gh = dh + rstd*(g - mean(g) - hhat*mean(g*hhat));
dresidual = gh; dx = gh * alpha * keep/(1-p); dweight = sum dy*hhat; dbias = sum dy;
dalpha = sum gh * dropout(x).
NumPy reference: resnorm.reference.add_layer_norm_forward / add_layer_norm_backward.
apply(x, residual, weight or None, alpha, bias or None, eps, p, seed, training,
normalized_shape=None, zero_centered=False) -> (y, h).
""")

AddRMSNormPostFunction = _fused_function("AddRMSNormPostFunction", False, False, """\
Post-Norm: y = rms_norm(residual + alpha * dropout(x)), h not written.

Backward: AddRMSNormFunction's with dh = 0, h recomputed from x and residual.
NumPy reference: resnorm.reference.add_rms_norm_post_forward / add_rms_norm_post_backward.
apply: as AddRMSNormFunction's, -> y.
""")

AddLayerNormPostFunction = _fused_function("AddLayerNormPostFunction", True, False, """\
Post-Norm: y = layer_norm(residual + alpha * dropout(x)), h not written.

Backward: AddLayerNormFunction's with dh = 0, h recomputed from x and residual.
NumPy reference: resnorm.reference.add_layer_norm_post_forward /
add_layer_norm_post_backward.  apply: as AddLayerNormFunction's, -> y.
""")


class DropoutFunction(torch.autograd.Function):
    """y = x * keep / (1 - p),  keep_k = [Philox uniform(seed, k) >= floor(p * 2**32)].

    Backward: dx = dy * keep / (1 - p), the mask regenerated from (seed, k): nothing is saved
    (the backward is this Function again, so it is differentiable any number of times).
    Forward-mode AD: the tangent gets the same mask.
    NumPy reference: resnorm.reference.dropout_forward / dropout_backward.
    apply(x, p, seed) (training mode; see resnorm.torch.dropout for eval and p = 0).
    """

    @staticmethod
    def forward(ctx, x, p, seed):
        ctx.p, ctx.seed = p, seed
        return kernels.dropout(T.input_tensor(x), p, seed)

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            return DropoutFunction.apply(dy, ctx.p, ctx.seed), None, None
        return kernels.dropout(dy, ctx.p, ctx.seed), None, None

    @staticmethod
    def jvp(ctx, dx, _dp, _dseed):
        return DropoutFunction.apply(dx, ctx.p, ctx.seed)


_FUNCTIONS = {(False, True): AddRMSNormFunction, (True, True): AddLayerNormFunction,
              (False, False): AddRMSNormPostFunction, (True, False): AddLayerNormPostFunction}


def fused(layer, prenorm, x, residual, weight, bias, eps, normalized_shape, zero_centered,
          alpha, p, seed, training):
    """One fused add + norm: (y, h) for Pre-Norm, y for Post-Norm (what every fused
    function and module of resnorm.torch runs)."""
    name = _resnorm_name(layer, prenorm)
    _refuse_transforms(name, "layer_norm" if layer else "rms_norm")
    seed = checked_seed(seed, p, training, name,
                        ("AddLayerNorm" if layer else "AddRMSNorm") + ("" if prenorm else "Post"))
    # Gemma's 16-bit gain, formed in float32: the fused kernels take it as a float32 weight
    gain = zero_centered and T.float32_gain(layer, x, weight)
    if gain:
        weight, zero_centered = T.gemma_gain(weight), False
    if T.graph_capture() or (not gain and isinstance(x, torch.Tensor)
                             and T.mixed_params(x, weight, bias if layer else None)):
        # recorded as torch's add and resnorm's dropout and norm operators; and float32
        # parameters beside 16-bit rows (torch.autocast): torch's own composition there
        # (dropout(x) rounded, then x + r rounded), and the norm resnorm's mixed one
        h = residual + alpha * dropout(x, p, seed=seed, training=training)
        y = norm(layer, h, weight, bias, eps, None, normalized_shape, zero_centered)
        return (y, h) if prenorm else y
    args = (x, residual, weight, alpha) + ((bias,) if layer else ())
    return _FUNCTIONS[layer, prenorm].apply(*args, eps, p, seed, training, normalized_shape,
                                            zero_centered)


def add_rms_norm(x, residual, weight=None, eps=1e-6, *, normalized_shape=None,
                 zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True):
    """Pre-Norm:  h = residual + alpha * dropout(x),  y = rms_norm(h, weight, eps).

    Differentiable (AddRMSNormFunction), also twice.

    Parameters
    ----------
    x, residual : torch.Tensor
        CPU tensors (float32, float64, float16 or bfloat16) of one shape (..., D) and
        dtype: the sublayer's output and the residual stream.
    weight : torch.Tensor or None
        (D,) (or normalized_shape) of x's dtype; float32 beside float16/bfloat16 x
        (torch.autocast) computes torch's unfused composition: h = residual + alpha *
        dropout(x) as torch evaluates it (each operation rounded to x's dtype), then
        rms_norm(h, weight) with the float32 weight.
    eps : float or None
        None: torch.finfo(x.dtype).eps (float32's for float16 and bfloat16).
    normalized_shape : int or sequence of int, optional
        The normalised trailing axes, as in torch (None: the last axis); weight and a
        per-channel alpha then have this shape.
    zero_centered_weight : bool
        The gain is 1 + weight (Gemma), formed as rms_norm forms it (add_layer_norm's as
        layer_norm's).
    alpha : float or torch.Tensor
        A number (fixed), or a tensor of shape () or (D,) of x's dtype (learnable).
    p : float
        Dropout probability of x, in [0, 1].
    seed : int, torch.Tensor or None
        The dropout seed, an int in [0, 2**64) (or a 0-d torch.int64 tensor holding its
        bits, which torch.compile reads inside the graph): the mask is a function of
        (seed, element index), so one seed drops the same elements on every call.
        Required when p > 0 in training (TypeError without it): pass a fresh seed per
        step and layer, or use the module (AddRMSNorm, AddLayerNorm, AddRMSNormPost,
        AddLayerNormPost), which draws its own.  None (the default) for p = 0 or
        training=False.
    training : bool
        False turns dropout off.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        (y, h): the normalised output and the new residual stream.

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message (TypeError: no seed with p > 0 in
        training); RuntimeError inside torch.func transforms.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> y, h = rt.add_rms_norm(torch.ones(1, 2), torch.tensor([[2.0, 3.0]]), eps=1e-12)
    >>> h
    tensor([[3., 4.]])
    >>> x, r = torch.ones(2, 4), torch.zeros(2, 4)
    >>> for step in range(2):   # dropout: a fresh seed per step (and per layer)
    ...     y, h = rt.add_rms_norm(x, r, p=0.5, seed=1000 * step)
    >>> sorted(set(h.flatten().tolist()))   # dropped, or kept and scaled by 1 / (1 - p)
    [0.0, 2.0]

    NumPy reference: resnorm.reference.add_rms_norm_forward.
    """
    return fused(False, True, x, residual, weight, None, eps, normalized_shape,
                 zero_centered_weight, alpha, p, seed, training)


def add_layer_norm(x, residual, weight=None, bias=None, eps=1e-5, *, normalized_shape=None,
                   zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True):
    """Pre-Norm:  h = residual + alpha * dropout(x),  y = layer_norm(h, weight, bias, eps).

    Differentiable (AddLayerNormFunction), also twice.  Arguments as add_rms_norm, plus
    bias (D,) (or normalized_shape) or None.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        (y, h).

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message (TypeError: no seed with p > 0 in
        training); RuntimeError inside torch.func transforms.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> y, h = rt.add_layer_norm(torch.ones(1, 2), torch.tensor([[0.0, 2.0]]), eps=1e-12)
    >>> y
    tensor([[-1.,  1.]])

    NumPy reference: resnorm.reference.add_layer_norm_forward.
    """
    return fused(True, True, x, residual, weight, bias, eps, normalized_shape,
                 zero_centered_weight, alpha, p, seed, training)


def add_rms_norm_post(x, residual, weight=None, eps=1e-6, *, normalized_shape=None,
                      zero_centered_weight=False, alpha=1.0, p=0.0, seed=None, training=True):
    """Post-Norm:  y = rms_norm(residual + alpha * dropout(x), weight, eps).

    Differentiable (AddRMSNormPostFunction), also twice.  Arguments as add_rms_norm.

    Returns
    -------
    torch.Tensor
        y (the sum is not written: backward recomputes it).

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message (TypeError: no seed with p > 0 in
        training); RuntimeError inside torch.func transforms.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.add_rms_norm_post(torch.ones(1, 2), torch.tensor([[2.0, 3.0]]), eps=1e-12)
    tensor([[0.8485, 1.1314]])

    NumPy reference: resnorm.reference.add_rms_norm_post_forward.
    """
    return fused(False, False, x, residual, weight, None, eps, normalized_shape,
                 zero_centered_weight, alpha, p, seed, training)


def add_layer_norm_post(x, residual, weight=None, bias=None, eps=1e-5, *,
                        normalized_shape=None, zero_centered_weight=False, alpha=1.0, p=0.0,
                        seed=None, training=True):
    """Post-Norm:  y = layer_norm(residual + alpha * dropout(x), weight, bias, eps).

    Differentiable (AddLayerNormPostFunction), also twice.  Arguments as add_layer_norm.

    Returns
    -------
    torch.Tensor
        y.

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message (TypeError: no seed with p > 0 in
        training); RuntimeError inside torch.func transforms.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.add_layer_norm_post(torch.ones(1, 2), torch.tensor([[0.0, 2.0]]), eps=1e-12)
    tensor([[-1.,  1.]])

    NumPy reference: resnorm.reference.add_layer_norm_post_forward.
    """
    return fused(True, False, x, residual, weight, bias, eps, normalized_shape,
                 zero_centered_weight, alpha, p, seed, training)


def dropout(x, p, *, seed=None, training=True):
    """Inverted dropout: y = x * keep / (1 - p) in training; x itself in eval mode and for
    p = 0 (as torch.nn.functional.dropout).

    Differentiable (DropoutFunction) any number of times, and in forward mode.

    Parameters
    ----------
    x : torch.Tensor
        float32/float64 CPU tensor of any shape.
    p : float
        Probability in [0, 1] of dropping an element.
    seed : int, torch.Tensor or None
        In [0, 2**64) (or a 0-d torch.int64 tensor holding its bits, which torch.compile
        reads inside the graph): the mask is a function of (seed, element index), the
        same on any thread count, so one seed drops the same elements on every call.
        Required when p > 0 in training (TypeError without it): draw a fresh one per call
        and step.  None (the default) for p = 0 or training=False.
    training : bool
        False: no dropout.

    Returns
    -------
    torch.Tensor
        y (x itself when dropout is off).

    Raises
    ------
    TypeError, ValueError
        A bad argument, named in the message (TypeError: no seed with p > 0 in
        training).

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> x = torch.ones(4)
    >>> rt.dropout(x, 0.5, training=False) is x
    True
    >>> sorted(set(rt.dropout(torch.ones(100), 0.5, seed=7).tolist()))
    [0.0, 2.0]

    NumPy reference: resnorm.reference.dropout_forward.
    """
    x = T.input_tensor(x)
    seed = checked_seed(seed, p, training, "dropout")
    if T.graph_capture():
        if not training or p == 0:
            return x
        if isinstance(seed, torch.Tensor):
            return ops.seeded_dropout(x, p, seed)[0]
        return ops.dropout(x, p, ops.dropout_seed(seed))
    if training is False or p == 0:
        # no kernel runs: resnorm checks p, seed and training on a one-element array
        resnorm.dropout(np.zeros(1, T.numpy_dtype(x.dtype)), p, seed=seed,
                        training=training)
        return x
    if T.functorch_active():
        raise RuntimeError("resnorm.torch.dropout does not support torch.func transforms: "
                           "its mask is a function of the element index, not of the sample; "
                           "use torch.nn.functional.dropout inside vmap / grad")
    return DropoutFunction.apply(x, p, seed)
