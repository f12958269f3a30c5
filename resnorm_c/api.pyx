# cython: boundscheck=True, wraparound=True
# (Python-level indexing here must check and wrap: shape[-1] of a tuple.  The kernels this
# module runs use raw pointers, which no directive touches.)
"""The call path of every public kernel function of resnorm: argument checks, the rows view,
output buffers and their overlap rules, the thread and streaming decision, scratch, the
kernel launch and the training cache, each done once, here, in compiled code.

The public functions here take the public signatures: resnorm.norms, resnorm.residual,
resnorm.gated_norm and resnorm.inverted_dropout declare them (signature, type hints, docstring) and export these
functions themselves (resnorm._compiled), so a call reaches C directly.  Layering: public
function -> this module -> the kernels (norm_kernels.pxd, add_norm_kernels.pxd,
residual_kernels.pxd, gated_norm_kernels.pxd) -> the row primitives of the core
(resnorm._core).  The pieces of this module:

  checks.pxi   every argument check and its error message (docs/input-checks.md)
  launch.pxi   thread count, streaming stores, the scratch pool
  arrays.pxi   memory overlap, the rows view, where outputs are written
  caches.pxi   the caches of the training forms, the dropout site, the residual scale
  this file    the public functions: norms, fused add + norm (api_residual.pxi), scaled
               and gated residuals and dropout (api_elementwise.pxi), the gated RMSNorm
               (api_gated_norm.pxi)

A call whose arguments are already final (exact ndarrays in C order, a Python float eps,
...) is decided by a few C tests per argument; anything else runs the general checks,
which convert, copy or raise.  Both lead to the same kernel call.
"""
cimport cython
cimport numpy as cnp
from cpython.mem cimport PyMem_RawFree, PyMem_RawMalloc
from libc.float cimport DBL_MIN, FLT_MIN
from libc.math cimport isfinite
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy, memset

import math
import numbers
import os
import warnings

import numpy as np

from add_norm_kernels cimport (add_norm_backward, add_norm_backward_scratch, add_norm_forward,
                               add_norm_mask_words)
from common cimport omp_get_max_threads, row_blocks
from dropout_masks cimport SEGMENT, mask_words, rn_dropout
from mixed_kernels cimport (backward_floats, forward_floats, mixed_backward, mixed_forward,
                           widen_params)
from gated_norm_kernels cimport (gated_norm_backward, gated_norm_backward_floats,
                                 gated_norm_dweight, gated_norm_forward,
                                 gated_norm_forward_floats)
from norm_kernels cimport layer_backward, layer_forward, rms_backward, rms_forward
from primitives cimport (element, half, real, rn_bf16, rn_f16, rn_from_float32, rn_import_core,
                         rn_narrow, rn_philox_uniforms, rn_to_float32)
from residual_kernels cimport (dropout_apply, dropout_mask, gated_backward,
                               gated_channel_backward, gated_forward, scaled_backward,
                               scaled_forward, sigmoid)

rn_import_core()
cnp.import_array()

include "checks.pxi"
include "launch.pxi"
include "arrays.pxi"
include "caches.pxi"


cdef inline void *data_of(a) noexcept:
    """The data of an array, NULL for None."""
    return NULL if a is None else cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline tuple shape_of(cnp.ndarray a):
    """a's shape as a Python tuple."""
    return (<object>a).shape


cdef inline bint is_f32(cnp.ndarray a) noexcept:
    return cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT


# The element type of an array the checks accepted, for the kernel calls of the functions
# that take the 16-bit types too (each casts its pointers to that type, once).
cdef enum Kind:
    KIND_F32, KIND_F64, KIND_BF16, KIND_F16


cdef inline Kind kind_of(cnp.ndarray a) noexcept:
    cdef int t = cnp.PyArray_TYPE(a)
    if t == cnp.NPY_FLOAT:
        return KIND_F32
    if t == cnp.NPY_DOUBLE:
        return KIND_F64
    return KIND_F16 if t == cnp.NPY_FLOAT16 else KIND_BF16


# The norms of this many 16-bit rows and more take their 16-bit weight and bias widened to
# float32 once per call (the mixed kernels' passes then load float32 parameters) where the
# 16-bit kernels widen them at every row, forward and backward.
cdef enum:
    WIDENED_PARAMS_MIN_ROWS = 16


cdef inline bint widens(Kind ek, bint mixed, Py_ssize_t n, bint params) noexcept nogil:
    """Whether a norm of n rows of kind ek takes its parameters widened to float32 once per
    call, for the mixed kernels (mixed: the parameters are float32 already; params: a weight
    or a bias is given): the mixed kernels convert no parameter per row, which repays the
    one pass over the parameters from WIDENED_PARAMS_MIN_ROWS rows on, forward and backward
    (measurements: benchmarks/TUNING.md)."""
    return ((ek == KIND_BF16 or ek == KIND_F16) and not mixed and params
            and n >= WIDENED_PARAMS_MIN_ROWS)


cdef inline Py_ssize_t row_length(cnp.ndarray a) noexcept:
    return cnp.PyArray_DIM(a, cnp.PyArray_NDIM(a) - 1)


cdef inline Py_ssize_t row_size(cnp.ndarray a, int k) noexcept:
    """The elements of one row of a whose rows span its last k axes."""
    cdef Py_ssize_t d = 1
    cdef int j, ndim = cnp.PyArray_NDIM(a)
    for j in range(ndim - k, ndim):
        d *= cnp.PyArray_DIM(a, j)
    return d


cdef inline object vector_of(p):
    """An optional parameter (weight, bias, alpha) as the kernels take it: a (D,) vector in
    their layout (a copy when p is not in it; a view of p's elements when p spans several
    normalised axes)."""
    if p is None:
        return None
    cdef cnp.ndarray a = contiguous(<cnp.ndarray>p)
    return a if cnp.PyArray_NDIM(a) == 1 else cnp.PyArray_Ravel(a, cnp.NPY_CORDER)


cdef inline object gain_of(w, bint zero_centered):
    """The weight as the kernels apply it: w, or 1 + w (rounded once in w's dtype, as
    Gemma's module computes it in float32) for a zero-centred weight."""
    if w is None or not zero_centered:
        return w
    return np.add(w, 1, dtype=w.dtype)


cdef inline bint zero_centered_of(value) except -1:
    """flag(value, "zero_centered_weight"), deciding the default at once."""
    return False if value is False else flag(value, "zero_centered_weight")


cdef inline int axes_of(normalized_shape, cnp.ndarray x) except -1:
    """norm_axes(normalized_shape, x.shape), deciding None at once."""
    return 1 if normalized_shape is None else norm_axes(normalized_shape, shape_of(x))


cdef inline not_shared(out, str out_name, tuple names, tuple kept, str why):
    """out must share no memory with any of kept (the arrays a cache keeps for backward)."""
    cdef Py_ssize_t k
    if out is None:
        return
    for k in range(len(kept)):
        if kept[k] is not None and overlap(out, kept[k]):
            raise ValueError(why.format(out=out_name, name=names[k]))


# =========================================================================== norms

cdef tuple RMS_INPUTS = ("x", "weight")
cdef tuple LAYER_INPUTS = ("x", "weight", "bias")
cdef str TRAINING_OUT = ("{out} must not share memory with {name} in the training form: "
                         "the cache keeps the inputs for backward")
cdef str CACHE_OUT = ("{out} must not share memory with the cache's {name}: "
                      "pass out=dy or a separate buffer")


cdef inline void norm_forward_rows(bint layer, element *y, double *mean, double *rstd,
                                   const void *x, const void *w, const void *b, Py_ssize_t n,
                                   Py_ssize_t d, double eps, int nt, bint stream) noexcept nogil:
    """The norm kernels for y's element type (x, w, b are of that type)."""
    if layer:
        layer_forward(y, mean, rstd, <const element *>x, <const element *>w,
                      <const element *>b, n, d, eps, nt, stream)
    else:
        rms_forward(y, rstd, <const element *>x, <const element *>w, n, d, eps, nt, stream)


cdef inline void norm_backward_rows(bint layer, element *dx, element *dw, element *db,
                                    double *red, double *wpart, double *bpart, const void *dy,
                                    const void *x, const void *w, const double *mean,
                                    const double *rstd, Py_ssize_t n, Py_ssize_t d, int nt,
                                    bint stream) noexcept nogil:
    """The norm backward kernels for dx's element type (dw, db, dy, x, w are of that type)."""
    if layer:
        layer_backward(dx, dw, db, red, red + n, wpart, bpart, <const element *>dy,
                       <const element *>x, <const element *>w, mean, rstd, n, d, nt, stream)
    else:
        rms_backward(dx, dw, red, wpart, <const element *>dy, <const element *>x,
                     <const element *>w, rstd, n, d, nt, stream)


cdef inline void mixed_norm_forward_rows(bint layer, Kind ek, void *y, double *mean,
                                         double *rstd, const void *x, const void *w,
                                         const void *b, Py_ssize_t n, Py_ssize_t d, double eps,
                                         int nt, bint stream, bint widen,
                                         float *buf) noexcept nogil:
    """The norm kernels of 16-bit rows with float32 parameters (mixed_kernels.pxd); widen:
    the parameters w, b are 16-bit, widened here into buf (2 d floats) once for all rows."""
    cdef float *wf = <float *>w
    cdef float *bf = <float *>b
    if widen:
        wf = buf if w != NULL else NULL
        bf = buf + d if b != NULL else NULL
    if ek == KIND_BF16:
        if widen:
            widen_params(wf, bf, <const rn_bf16 *>w, <const rn_bf16 *>b, d)
        mixed_forward(layer, <rn_bf16 *>y, mean, rstd, <const rn_bf16 *>x, wf, bf,
                      <const rn_bf16 *>w, <const rn_bf16 *>b, widen, n, d, eps, nt, stream, buf)
    else:
        if widen:
            widen_params(wf, bf, <const rn_f16 *>w, <const rn_f16 *>b, d)
        mixed_forward(layer, <rn_f16 *>y, mean, rstd, <const rn_f16 *>x, wf, bf,
                      <const rn_f16 *>w, <const rn_f16 *>b, widen, n, d, eps, nt, stream, buf)


cdef object norm_forward(bint layer, x, weight, bias, eps, normalized_shape, zero_centered,
                         out, n_threads, bint training):
    """rms_norm / layer_norm, and with training their _forward forms (returning a cache)."""
    cdef cnp.ndarray xa = float_array(x, "x", True)
    cdef int k = axes_of(normalized_shape, xa)
    # float32 for float32 parameters beside 16-bit x, else None (x's dtype)
    pdt = mixed_params(xa, weight, bias if layer else None)
    wp = param_of(weight, xa, "weight", k, pdt)
    bp = param_of(bias, xa, "bias", k, pdt) if layer else None
    cdef double e = eps_of(eps, xa)
    cdef bint zc = zero_centered_of(zero_centered)
    cdef int nt = threads_of(n_threads)
    cdef tuple inputs = (xa, wp, bp) if layer else (xa, wp)
    cdef tuple names = LAYER_INPUTS if layer else RMS_INPUTS
    if training:
        not_shared(out, "out", names, inputs, TRAINING_OUT)
    w = gain_of(vector_of(wp), zc)
    b = vector_of(bp)
    cdef cnp.ndarray rows = contiguous(xa)
    cdef cnp.ndarray y = new_like(xa) if out is None else None
    if y is None:
        check_out(out, xa, names, inputs, "out")
        y = <cnp.ndarray>out if kernel_layout(<cnp.ndarray>out) else new_like(xa)
    cdef Py_ssize_t size = cnp.PyArray_SIZE(rows), d = row_size(rows, k), n = size // d
    nt = team(nt, size)
    cdef bint stream = streams_over(y, None, rows, None)
    cdef Kind ek = kind_of(rows)
    # 16-bit parameters of many rows: widened to float32 once, for the mixed kernels
    cdef bint widen = widens(ek, pdt is not None, n, w is not None or b is not None)
    cdef Scratch scratch = None
    cdef cnp.ndarray mean = None, rstd = None
    cdef double *pmean = NULL
    cdef double *prstd
    cdef float *buf = NULL
    # scratch: the row statistics (inference), the widened rows (mixed, one per thread) or
    # the widened parameters
    cdef Py_ssize_t nstats = 0 if training else 2 * n
    cdef Py_ssize_t nbuf = 2 * d if widen else 0 if pdt is None else nt * forward_floats(d)
    if nstats + nbuf:
        scratch = lend(nstats * sizeof(double) + nbuf * sizeof(float))
        buf = <float *>(scratch.data + nstats * sizeof(double))
    if training:
        rstd = new_stats(n)
        prstd = <double *>cnp.PyArray_DATA(rstd)
        if layer:
            mean = new_stats(n)
            pmean = <double *>cnp.PyArray_DATA(mean)
    else:
        prstd = <double *>scratch.data
        pmean = prstd + n
    cdef void *py = cnp.PyArray_DATA(y)
    cdef void *px = cnp.PyArray_DATA(rows)
    cdef void *pw = data_of(w)
    cdef void *pb = data_of(b)
    saved = release_gil(size)
    if pdt is not None or widen:
        mixed_norm_forward_rows(layer, ek, py, pmean, prstd, px, pw, pb, n, d, e, nt, stream,
                                widen, buf)
    elif ek == KIND_F32:
        norm_forward_rows(layer, <float *>py, pmean, prstd, px, pw, pb, n, d, e, nt, stream)
    elif ek == KIND_F64:
        norm_forward_rows(layer, <double *>py, pmean, prstd, px, pw, pb, n, d, e, nt, stream)
    elif ek == KIND_BF16:
        norm_forward_rows(layer, <rn_bf16 *>py, pmean, prstd, px, pw, pb, n, d, e, nt, stream)
    else:
        norm_forward_rows(layer, <rn_f16 *>py, pmean, prstd, px, pw, pb, n, d, e, nt, stream)
    take_gil_back(saved)
    if scratch is not None:
        scratch.give_back()
    result = finish(out, y)
    if not training:
        return result
    if layer:
        return result, layer_norm_cache(as_rows(rows, d), w, b is not None, mean, rstd,
                                        shape_of(xa), k, pdt)
    return result, rms_norm_cache(as_rows(rows, d), w, rstd, shape_of(xa), k, pdt)


cdef inline bint shape_is(cnp.ndarray a, shape) noexcept:
    """a's shape equals `shape`, a tuple of ints (False for anything else)."""
    cdef int k, ndim = cnp.PyArray_NDIM(a)
    if type(shape) is not tuple or len(<tuple>shape) != ndim:
        return False
    for k in range(ndim):
        s = (<tuple>shape)[k]
        if type(s) is not int or <Py_ssize_t>s != cnp.PyArray_DIM(a, k):
            return False
    return True


cdef inline bint is_rows_of(a, cnp.ndarray rows) noexcept:
    """a is exactly an array of rows' shape and type in the kernels' layout."""
    return (type(a) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.PyArray_TYPE(rows)
            and same_shape(<cnp.ndarray>a, rows) and kernel_layout(<cnp.ndarray>a))


cdef inline bint is_param_of(p, cnp.ndarray rows) noexcept:
    """p is None or exactly a (D,) vector of rows' type in the kernels' layout."""
    return p is None or (type(p) is cnp.ndarray
                         and cnp.PyArray_TYPE(<cnp.ndarray>p) == cnp.PyArray_TYPE(rows)
                         and cnp.PyArray_NDIM(<cnp.ndarray>p) == 1
                         and cnp.PyArray_DIM(<cnp.ndarray>p, 0) == cnp.PyArray_DIM(rows, 1)
                         and kernel_layout(<cnp.ndarray>p))


cdef check_norm_cache(cache, x, weight, mean, rstd, shape, axes, param_dtype, bint layer):
    """The fields of a norm cache as its forward function made them (mean: LayerNorm's)."""
    cdef Py_ssize_t n = 0, d = 0
    cdef int t = 0, tp = 0
    cdef bint ok = (type(x) is cnp.ndarray and is_element_type(cnp.PyArray_TYPE(<cnp.ndarray>x))
                    and shape_ok(shape, axes, &n, &d))
    if ok:
        t = cnp.PyArray_TYPE(<cnp.ndarray>x)
        tp = param_type(param_dtype, t)
        ok = (tp >= 0 and cache_field(x, ROWS, True, n, d, t)
              and cache_field(weight, VECTOR, False, n, d, tp)
              and cache_field(mean, STATS, layer, n, d, t)
              and cache_field(rstd, STATS, True, n, d, t))
    if not ok:
        raise edited_cache(cache)


cdef inline void mixed_backward_rows(bint layer, Kind ek, void *dx, void *dw, void *db,
                                     double *red, double *wpart, double *bpart,
                                     const void *dy, const void *x, const void *w,
                                     const double *mean, const double *rstd, Py_ssize_t n,
                                     Py_ssize_t d, int nt, bint stream, bint widen,
                                     float *buf) noexcept nogil:
    """The norm backward kernels of 16-bit rows with float32 parameters (mixed_kernels.pxd);
    buf: nt * backward_floats(d) floats.  widen: the weight w is 16-bit, widened here once
    for all rows into buf (d floats: its rare rows take the 16-bit kernels, which need no
    rows' buffer), and dw, db are 16-bit."""
    cdef float *wf = <float *>w
    if widen:
        wf = buf
        buf = NULL
    if ek == KIND_BF16:
        if widen:
            widen_params(wf, NULL, <const rn_bf16 *>w, NULL, d)
        mixed_backward(layer, <rn_bf16 *>dx, dw, db, red, wpart, bpart, <const rn_bf16 *>dy,
                       <const rn_bf16 *>x, wf, <const rn_bf16 *>w if widen else NULL, mean,
                       rstd, n, d, nt, stream, buf)
    else:
        if widen:
            widen_params(wf, NULL, <const rn_f16 *>w, NULL, d)
        mixed_backward(layer, <rn_f16 *>dx, dw, db, red, wpart, bpart, <const rn_f16 *>dy,
                       <const rn_f16 *>x, wf, <const rn_f16 *>w if widen else NULL, mean,
                       rstd, n, d, nt, stream, buf)


cdef object norm_backward(bint layer, dy, cache, out, n_threads):
    """rms_norm_backward / layer_norm_backward."""
    cdef type kind = LayerNormCache if layer else RMSNormCache
    if type(cache) is not kind and not isinstance(cache, kind):
        raise TypeError(f"cache must be the {kind.__name__} returned by the forward "
                        f"function, got {type(cache).__name__}")
    # the fields read in C (the type was checked above)
    cdef LayerNormCache lc
    cdef RMSNormCache rc
    mean, has_bias = None, False
    if layer:
        lc = <LayerNormCache>cache
        x, weight, shape, axes, rstd = lc.x, lc.weight, lc.shape, lc.axes, lc.rstd
        mean, has_bias, pdt = lc.mean, lc.has_bias, lc.param_dtype
    else:
        rc = <RMSNormCache>cache
        x, weight, shape, axes, rstd = rc.x, rc.weight, rc.shape, rc.axes, rc.rstd
        pdt = rc.param_dtype
    check_norm_cache(cache, x, weight, mean, rstd, shape, axes, pdt, layer)
    cdef cnp.ndarray xr = <cnp.ndarray>x
    cdef cnp.ndarray dya
    if type(dy) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>dy) == cnp.PyArray_TYPE(xr) \
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>dy) and shape_is(<cnp.ndarray>dy, shape):
        dya = <cnp.ndarray>dy
    else:
        dya = like_array(dy, "dy", shape, xr.dtype)
    cdef int nt = threads_of(n_threads)
    cdef cnp.ndarray rows = contiguous(dya)
    cdef cnp.ndarray dx = new_like(dya) if out is None else None
    if dx is None:
        check_out(out, dya, ("dy",), (dya,), "out")
        # the cache must stay valid for another call
        if layer:
            not_shared(out, "out", ("x", "weight", "mean", "rstd"), (x, weight, mean, rstd),
                       CACHE_OUT)
        else:
            not_shared(out, "out", ("x", "weight", "rstd"), (x, weight, rstd), CACHE_OUT)
        dx = <cnp.ndarray>out if kernel_layout(<cnp.ndarray>out) else new_like(dya)
    cdef Py_ssize_t n = cnp.PyArray_DIM(xr, 0), d = cnp.PyArray_DIM(xr, 1), nb = row_blocks(n)
    nt = team(nt, n * d)
    cdef bint stream = streams(cnp.PyArray_NBYTES(dx))
    cdef int tp = cnp.PyArray_TYPE(xr) if pdt is None else cnp.NPY_FLOAT
    dw = None if weight is None else new_vector(d, tp)
    db = new_vector(d, tp) if layer and has_bias else None
    cdef Kind ek = kind_of(xr)
    # a 16-bit weight of many rows: widened to float32 once, for the mixed kernels
    cdef bint widen = widens(ek, pdt is not None, n, weight is not None)
    # scratch: two row reductions per row, the dweight / dbias partial rows, then the
    # widened rows (mixed, per thread) or the widened weight
    cdef Py_ssize_t parts = (dw is not None) + (db is not None)
    cdef Py_ssize_t ndouble = 2 * n + parts * nb * d
    cdef Py_ssize_t nbuf = d if widen else 0 if pdt is None else nt * backward_floats(d)
    cdef Scratch scratch = lend(ndouble * sizeof(double) + nbuf * sizeof(float))
    cdef double *red = <double *>scratch.data
    cdef double *wpart = red + 2 * n
    cdef double *bpart = wpart + (nb * d if dw is not None else 0)
    cdef float *buf = <float *>(red + ndouble)
    cdef void *pdx = cnp.PyArray_DATA(dx)
    cdef void *pdw = data_of(dw)
    cdef void *pdb = data_of(db)
    cdef void *pdy = cnp.PyArray_DATA(rows)
    cdef void *px = cnp.PyArray_DATA(xr)
    cdef void *pw = data_of(weight)
    cdef const double *pmean = <const double *>data_of(mean)
    cdef const double *prstd = <const double *>cnp.PyArray_DATA(<cnp.ndarray>rstd)
    saved = release_gil(n * d)
    if pdt is not None or widen:
        mixed_backward_rows(layer, ek, pdx, pdw, pdb, red, wpart, bpart, pdy, px, pw, pmean,
                            prstd, n, d, nt, stream, widen, buf)
    elif ek == KIND_F32:
        norm_backward_rows(layer, <float *>pdx, <float *>pdw, <float *>pdb, red, wpart,
                           bpart, pdy, px, pw, pmean, prstd, n, d, nt, stream)
    elif ek == KIND_F64:
        norm_backward_rows(layer, <double *>pdx, <double *>pdw, <double *>pdb, red, wpart,
                           bpart, pdy, px, pw, pmean, prstd, n, d, nt, stream)
    elif ek == KIND_BF16:
        norm_backward_rows(layer, <rn_bf16 *>pdx, <rn_bf16 *>pdw, <rn_bf16 *>pdb, red,
                           wpart, bpart, pdy, px, pw, pmean, prstd, n, d, nt, stream)
    else:
        norm_backward_rows(layer, <rn_f16 *>pdx, <rn_f16 *>pdw, <rn_f16 *>pdb, red, wpart,
                           bpart, pdy, px, pw, pmean, prstd, n, d, nt, stream)
    take_gil_back(saved)
    scratch.give_back()
    if axes != 1:   # the parameters' gradients in the normalised axes' shape
        dw = None if dw is None else dw.reshape(cache.normalized_shape)
        db = None if db is None else db.reshape(cache.normalized_shape)
    if layer:
        return finish(out, dx), dw, db
    return finish(out, dx), dw


def rms_norm(x, weight=None, eps=1e-6, *, normalized_shape=None, zero_centered_weight=False,
             out=None, n_threads=None):
    return norm_forward(False, x, weight, None, eps, normalized_shape, zero_centered_weight,
                        out, n_threads, False)


def rms_norm_forward(x, weight=None, eps=1e-6, *, normalized_shape=None, zero_centered_weight=False,
                     out=None, n_threads=None):
    return norm_forward(False, x, weight, None, eps, normalized_shape, zero_centered_weight,
                        out, n_threads, True)


def rms_norm_backward(dy, cache, *, out=None, n_threads=None):
    return norm_backward(False, dy, cache, out, n_threads)


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, normalized_shape=None,
               zero_centered_weight=False, out=None, n_threads=None):
    return norm_forward(True, x, weight, bias, eps, normalized_shape, zero_centered_weight,
                        out, n_threads, False)


def layer_norm_forward(x, weight=None, bias=None, eps=1e-5, *, normalized_shape=None,
                       zero_centered_weight=False, out=None, n_threads=None):
    return norm_forward(True, x, weight, bias, eps, normalized_shape, zero_centered_weight,
                        out, n_threads, True)


def layer_norm_backward(dy, cache, *, out=None, n_threads=None):
    return norm_backward(True, dy, cache, out, n_threads)


include "api_residual.pxi"
include "api_elementwise.pxi"
include "api_gated_norm.pxi"


def to_float32(float[::1] out, x):
    """out[k] := x[k] as float32, for a contiguous 1-d x of an element dtype: the core's
    conversion at the dispatched level, whole vectors and single elements (for tests)."""
    cdef cnp.ndarray xa = float_array(x, "x", True)
    cdef Py_ssize_t n = cnp.PyArray_SIZE(xa)
    if cnp.PyArray_NDIM(xa) != 1 or not kernel_layout(xa) or out.shape[0] != n:
        raise ValueError("x must be a contiguous vector of out's length")
    cdef void *px = cnp.PyArray_DATA(xa)
    cdef Kind ek = kind_of(xa)
    with nogil:
        if ek == KIND_F32:
            rn_to_float32(&out[0], <const float *>px, n)
        elif ek == KIND_F64:
            rn_to_float32(&out[0], <const double *>px, n)
        elif ek == KIND_BF16:
            rn_to_float32(&out[0], <const rn_bf16 *>px, n)
        else:
            rn_to_float32(&out[0], <const rn_f16 *>px, n)


cdef inline void round_into(element *out, const real *x, Py_ssize_t n,
                            bint stream) noexcept nogil:
    if real is float:
        rn_from_float32(out, x, n, stream)
    else:
        rn_narrow(out, x, n)


def rounded(out, const real[::1] x, bint stream=False):
    """out[k] := x[k] rounded once to out's element dtype (round to nearest even), for a
    contiguous 1-d out, at the dispatched level (for tests): float32 x through the core's
    conversion (non-temporal stores when stream is true), float64 x through its narrowing
    of the sums over rows (dweight, dbias; stream not used)."""
    cdef cnp.ndarray oa = float_array(out, "out", True)
    cdef Py_ssize_t n = x.shape[0]
    if (cnp.PyArray_NDIM(oa) != 1 or not kernel_layout(oa) or not cnp.PyArray_ISWRITEABLE(oa)
            or cnp.PyArray_SIZE(oa) != n):
        raise ValueError("out must be a writeable contiguous vector of x's length")
    cdef void *po = cnp.PyArray_DATA(oa)
    cdef Kind ek = kind_of(oa)
    with nogil:
        if ek == KIND_F32:
            round_into(<float *>po, &x[0], n, stream)
        elif ek == KIND_F64:
            round_into(<double *>po, &x[0], n, stream)
        elif ek == KIND_BF16:
            round_into(<rn_bf16 *>po, &x[0], n, stream)
        else:
            round_into(<rn_f16 *>po, &x[0], n, stream)


def philox_uniforms(uint32_t[::1] u, uint64_t seed, uint64_t start):
    """u[k] := the 32-bit Philox uniform of flat element start + k (for tests and teaching).
    NumPy reference: resnorm.reference.dropout_uniforms."""
    if u.shape[0] == 0:
        return
    with nogil:
        rn_philox_uniforms(&u[0], seed, start, u.shape[0])
