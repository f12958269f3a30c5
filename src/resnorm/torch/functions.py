"""Differentiable RMSNorm and LayerNorm on CPU tensors: the functional forms, their
torch.autograd.Functions, and the choice of path for each call.

Which path a call takes (``norm``), cheapest first:

* no gradient wanted (torch.no_grad, inference_mode, or no input requires grad): resnorm's
  inference function straight into a fresh tensor, no autograd node;
* gradients wanted: the autograd Function (forward and backward kernels, first order);
* torch.compile or torch.jit.trace recording a graph: the custom operators of
  resnorm.torch.ops, so resnorm appears as one node of the graph; except a call of at most
  _tensors.COMPILED_EXPRESSION_MAX elements inside torch.compile (a decode step's rows),
  which is recorded as the float64 torch expression (composite.norm_float64) for Inductor
  to fuse: an operator costs more than such a norm inside a compiled graph;
* inside torch.func transforms or a forward-mode AD dual level: the Function through
  torch's full machinery, which calls its vmap / jvp rules.

Second derivatives: a backward asked to build a graph (create_graph=True, and everything
under torch.func.grad) returns resnorm.torch.composite's differentiable expressions, so
double backward is exact (checked with torch.autograd.gradgradcheck); outside torch.func
they carry the values of resnorm's backward kernel, as a backward without a graph returns.
"""
import torch

from . import _tensors as T
from . import composite, kernels, ops


class _NormFunction(torch.autograd.Function):
    """The apply of both norm Functions: outside torch.func transforms it skips
    Function.apply's per-call signature binding (which costs as much as a small norm);
    inside them it is torch's Function.apply, which dispatches to the vmap / jvp rules."""

    @classmethod
    def apply(cls, *args):
        if not isinstance(args[0], torch.Tensor):   # (the callers above check the rest)
            T.input_tensor(args[0])   # raises the TypeError that names x
        if T.functorch_active():
            return super().apply(*args)
        return super(torch.autograd.Function, cls).apply(*args)


def _vmap(cls, info, in_dims, x, params, eps, options):
    """The vmap rule of both Functions: the batch dimension becomes more rows of x (x is
    expanded when only a parameter is batched); batched parameters are applied with torch
    operations after an unweighted norm (the kernels take one weight)."""
    x_dim, param_dims = in_dims[0], in_dims[1:1 + len(params)]
    b = info.batch_size
    x = x.movedim(x_dim, 0) if x_dim is not None else x.expand(b, *x.shape)
    if all(d is None for d in param_dims):
        y, cache = cls.apply(x, *params, eps, None, *options)
    else:
        # 16-bit x: as the kernels compute it, the float32 norm of the widened rows, the
        # parameters applied in float32 (torch's promotion) and the output rounded once
        half = x.dtype in T.HALF_DTYPES
        y, cache = cls.apply(x.float() if half else x, *([None] * len(params)), eps, None,
                             *options)
        normalized_shape, zero_centered = options
        row = T.row_shape(normalized_shape, x)
        shape = (b,) + (1,) * (x.dim() - 1 - len(row)) + row
        for op, p, d in zip((torch.mul, torch.add), params, param_dims):
            if p is not None:
                p = p if d is None else p.movedim(d, 0).reshape(shape)
                y = op(y, composite.gain(p, zero_centered) if op is torch.mul else p)
        y = y.to(x.dtype) if half else y
    return (y, cache), (0, None)


def _setup(ctx, x, weight, bias, eps, normalized_shape, zero_centered, output):
    """The common setup_context: the cache for the kernels, x and weight for autograd's
    in-place check and for the differentiable backward."""
    ctx.cache, ctx.eps, ctx.has_bias = output[1], eps, bias is not None
    ctx.axes = 1 if normalized_shape is None else len(normalized_shape)
    ctx.zero_centered = zero_centered
    ctx.save_for_backward(x, weight)
    if T.transforms_active():   # a jvp may follow
        ctx.save_for_forward(x, weight)


def _jvp(ctx, layer, dx, dweight, dbias):
    x, weight = ctx.saved_tensors
    return composite.norm_jvp(x, weight, ctx.eps, layer, dx, dweight, dbias, ctx.axes,
                              ctx.zero_centered), None


def _rms_kernel_backward(ctx, dy):
    return kernels.rms_norm_backward(dy, ctx.cache)


class RMSNormFunction(_NormFunction):
    """y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps) over a row (the last axis, or the
    normalised axes).

    ``RMSNormFunction.apply(x, weight, eps, views=None, normalized_shape=None,
    zero_centered=False) -> (y, cache)``: x (..., D), weight (D,) (or normalized_shape, a
    tuple of x's trailing axes) or None, eps a positive float; views: optional
    (weight_view,), the NumPy view of the weight its caller already holds (a module's);
    zero_centered: the gain is 1 + weight.  cache is resnorm's RMSNormCache (NumPy views of
    x and the gain, the float64 rstd of each row), what backward consumes.
    resnorm.torch.rms_norm checks the arguments and returns y alone.

    Backward: dx = rstd * (g - xn * mean(g*xn)), g = dy*w, xn = x*rstd; dw = sum_rows dy*xn.
    NumPy reference: resnorm.reference.rms_norm_forward / rms_norm_backward.
    Supports double backward, forward-mode AD (jvp) and torch.func.vmap.
    """

    @classmethod
    def apply(cls, x, *args):
        # torch.nn.RMSNorm saves no tensor of an x that needs no gradient, so it takes an
        # inference tensor beside a weight that requires grad; this Function saves x (and
        # its cache views x), which autograd refuses for an inference tensor: a normal copy
        # (anything but a tensor goes on as it is, to the checks that name it)
        inference = isinstance(x, torch.Tensor) and x.is_inference()
        return super().apply(x.clone() if inference else x, *args)

    @staticmethod
    def forward(x, weight, eps, views=None, normalized_shape=None, zero_centered=False):
        return kernels.rms_norm_forward(x, weight, eps, views and views[0],
                                        normalized_shape=normalized_shape,
                                        zero_centered_weight=zero_centered)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, eps, _views, normalized_shape, zero_centered = _padded(inputs, 3)
        _setup(ctx, x, weight, None, eps, normalized_shape, zero_centered, output)

    @staticmethod
    def backward(ctx, dy, _dcache):
        return composite.gradients(ctx, dy, False, _rms_kernel_backward)

    @staticmethod
    def jvp(ctx, dx, dweight, *_rest):
        return _jvp(ctx, False, dx, dweight, None)

    @staticmethod
    def vmap(info, in_dims, x, weight, eps, views=None, normalized_shape=None,
             zero_centered=False):
        return _vmap(RMSNormFunction, info, in_dims, x, (weight,), eps,
                     (normalized_shape, zero_centered))


def _padded(inputs, n):
    """A Function's inputs with the optional ones (views, normalized_shape, zero_centered)
    at their defaults when not passed; n: the required ones."""
    return tuple(inputs) + (None, None, False)[len(inputs) - n:]


def _layer_kernel_backward(ctx, dy):
    return kernels.layer_norm_backward(dy, ctx.cache)


class LayerNormFunction(_NormFunction):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps) over a row.

    ``LayerNormFunction.apply(x, weight, bias, eps, views=None, normalized_shape=None,
    zero_centered=False) -> (y, cache)``: weight, bias (D,) (or normalized_shape) or None
    independently; views: optional (weight_view, bias_view) the caller already holds;
    cache is resnorm's LayerNormCache (views of x and the gain, the float64 mean and rstd
    of each row), what backward consumes.  resnorm.torch.layer_norm checks the arguments
    and returns y alone.

    Backward: xhat = (x-mean)*rstd, g = dy*w: dx = rstd*(g - mean(g) - xhat*mean(g*xhat)),
    dw = sum_rows dy*xhat, db = sum_rows dy.
    NumPy reference: resnorm.reference.layer_norm_forward / layer_norm_backward.
    Supports double backward, forward-mode AD (jvp) and torch.func.vmap.
    """

    @staticmethod
    def forward(x, weight, bias, eps, views=None, normalized_shape=None, zero_centered=False):
        return kernels.layer_norm_forward(x, weight, bias, eps, *(views or ()),
                                          normalized_shape=normalized_shape,
                                          zero_centered_weight=zero_centered)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, eps, _views, normalized_shape, zero_centered = _padded(inputs, 4)
        _setup(ctx, x, weight, bias, eps, normalized_shape, zero_centered, output)

    @staticmethod
    def backward(ctx, dy, _dcache):
        return composite.gradients(ctx, dy, True, _layer_kernel_backward)

    @staticmethod
    def jvp(ctx, dx, dweight, dbias, *_rest):
        return _jvp(ctx, True, dx, dweight, dbias)

    @staticmethod
    def vmap(info, in_dims, x, weight, bias, eps, views=None, normalized_shape=None,
             zero_centered=False):
        return _vmap(LayerNormFunction, info, in_dims, x, (weight, bias), eps,
                     (normalized_shape, zero_centered))


def norm(layer, x, weight, bias, eps, views=None, normalized_shape=None, zero_centered=False):
    """One norm call on the cheapest path that computes it (see the module docstring).

    layer: LayerNorm (else RMSNorm, bias None).  views: NumPy views (weight, bias) the
    caller already holds for these parameters (a module's ParamViews), or None.
    normalized_shape: None (the last axis) or torch's argument (an int or a sequence of
    x's trailing sizes); zero_centered: the gain is 1 + weight.
    """
    if zero_centered and T.float32_gain(layer, x, weight):   # Gemma's, 16-bit
        weight, zero_centered = T.gemma_gain(weight), False
    if normalized_shape is None and views is None and not T.graph_capture():
        y = T.norm_infer(layer, x, weight, bias, eps, zero_centered, T.NUMPY_DTYPES)
        if y is not None:   # an inference call whose arguments the kernel takes as they are
            return y
    x = T.input_tensor(x)
    eps = T.eps_for(eps, x)
    row = T.row_shape(normalized_shape, x)
    if normalized_shape is not None:
        T.trailing_axes(x, row, "x")
    T.param_tensor(weight, "weight", x, row)
    T.param_tensor(bias, "bias", x, row)
    ns = T.normalized_arg(row)
    if T.graph_capture():
        if T.records_expression(x):
            return composite.norm_float64(x, weight, bias, eps, layer, len(row),
                                          zero_centered)
        if layer:
            return ops.layer_norm(x, weight, bias, eps, len(row), zero_centered)[0]
        return ops.rms_norm(x, weight, eps, len(row), zero_centered)[0]
    if not (T.wants_grad(x, weight, bias) or T.transforms_active()):
        try:
            options = dict(normalized_shape=ns, zero_centered_weight=zero_centered)
            if layer:
                return kernels.layer_norm(x, *(views or (T.view(weight), T.view(bias))), eps,
                                          **options)
            return kernels.rms_norm(x, views[0] if views else T.view(weight), eps, **options)
        except T.NoStorage:
            pass   # a batched tensor outside torch.func: the Function's rules take it
    if layer:
        return LayerNormFunction.apply(x, weight, bias, eps, views, ns, zero_centered)[0]
    return RMSNormFunction.apply(x, weight, eps, views, ns, zero_centered)[0]


def rms_norm(x, weight=None, eps=1e-6, *, normalized_shape=None, zero_centered_weight=False):
    """y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps), over the last axis of x (..., D)
    (or the trailing axes of normalized_shape together).

    Differentiable (RMSNormFunction), also twice, and under torch.compile, torch.func.vmap
    and forward-mode AD.

    Parameters
    ----------
    x : torch.Tensor
        float32, float64, float16 or bfloat16 CPU tensor of shape (..., D); the 16-bit
        types are computed in float32 and rounded once.
    weight : torch.Tensor or None
        (D,) (or normalized_shape) of x's dtype, or None (w = 1); float32 beside
        float16/bfloat16 x (torch.autocast): the float32 norm rounded once to x's dtype,
        the weight's gradient float32.
    eps : float or None
        Added to mean(x^2); None means torch.finfo(x.dtype).eps (float32's for float16 and
        bfloat16, which are computed in float32), as in torch.
    normalized_shape : int or sequence of int, optional
        The normalised trailing axes, as in torch.nn.functional.rms_norm (e.g. (5, 64) for
        x of shape (..., 5, 64)); None: the last axis.
    zero_centered_weight : bool
        The gain is 1 + weight (Gemma's RMSNorm), formed in the weight's dtype, and in
        float32 for a float16 or bfloat16 weight, as Gemma's module forms it.

    Returns
    -------
    torch.Tensor
        y, a new tensor of x's shape and dtype.

    Raises
    ------
    TypeError
        x or weight not a tensor, not on the CPU, not dense, or of another dtype.
    ValueError
        weight of the wrong shape, x without a last axis, eps not finite and > 0.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> x = torch.tensor([[3.0, 4.0]])
    >>> rt.rms_norm(x, eps=1e-12)
    tensor([[0.8485, 1.1314]])
    >>> rt.rms_norm(torch.ones(2, 2, 3), torch.zeros(2, 3), normalized_shape=(2, 3),
    ...             zero_centered_weight=True)[0, 0]
    tensor([1.0000, 1.0000, 1.0000])

    NumPy reference: resnorm.reference.rms_norm_forward.
    """
    return norm(False, x, weight, None, eps, None, normalized_shape, zero_centered_weight)


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, normalized_shape=None,
               zero_centered_weight=False):
    """y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps), over the last axis of x
    (or the trailing axes of normalized_shape together).

    Differentiable (LayerNormFunction), also twice, and under torch.compile, torch.func.vmap
    and forward-mode AD.

    Parameters
    ----------
    x : torch.Tensor
        float32, float64, float16 or bfloat16 CPU tensor of shape (..., D), as for
        rms_norm.
    weight, bias : torch.Tensor or None
        (D,) (or normalized_shape) of x's dtype, or None, independently; float32 beside
        float16/bfloat16 x, as for rms_norm's weight.
    eps : float or None
        Added to the (biased) variance; None means torch.finfo(x.dtype).eps (float32's
        for float16 and bfloat16).
    normalized_shape : int or sequence of int, optional
    zero_centered_weight : bool
        The gain is 1 + weight, rounded once in the weight's dtype, also for float16 and
        bfloat16 (as Nemotron's LayerNorm1P forms it).

    Returns
    -------
    torch.Tensor
        y, a new tensor of x's shape and dtype.

    Raises
    ------
    TypeError, ValueError
        As rms_norm.

    Examples
    --------
    >>> import torch, resnorm.torch as rt
    >>> rt.layer_norm(torch.tensor([[1.0, 3.0]]), eps=1e-12)
    tensor([[-1.,  1.]])

    NumPy reference: resnorm.reference.layer_norm_forward.
    """
    return norm(True, x, weight, bias, eps, None, normalized_shape, zero_centered_weight)
