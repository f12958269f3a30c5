"""NumPy views of memory that a torch tensor owns, made in C (resnorm.torch._storage).

resnorm.torch hands resnorm's functions NumPy views of tensors.  ``Tensor.numpy()`` makes
one in about a microsecond (argument parsing and checks), which is most of what a
decode-sized norm costs through a module; this makes the view of a C-contiguous tensor
from its address and shape in a fraction of that.  The caller (resnorm.torch._tensors.view)
vouches for what only torch can tell: that the tensor is a dense, contiguous CPU tensor
of that dtype, with no lazy negation, owning its shape's elements from that address.
The view is read-only (resnorm reads inputs and never writes into them) and keeps the
tensor alive through its base, as ``Tensor.numpy()`` does.

This module imports nothing from torch: it sees an address, a shape and an object.
"""
cimport numpy as cnp
from cpython.ref cimport Py_INCREF

cnp.import_array()


cdef extern from "numpy/arrayobject.h":
    # steals a reference to descr (NumPy's C API, which Cython's numpy declarations lack)
    object PyArray_NewFromDescr(type subtype, cnp.dtype descr, int nd, cnp.npy_intp *dims,
                                cnp.npy_intp *strides, void *data, int flags, object obj)


def contiguous_view(Py_ssize_t address, shape, cnp.dtype dtype, base):
    """The read-only C-contiguous array of `shape` (a tuple of sizes) and `dtype` at
    `address`, whose base is `base` (the tensor that owns the memory)."""
    cdef Py_ssize_t ndim = len(shape), k
    cdef cnp.npy_intp dims[cnp.NPY_MAXDIMS]
    if ndim > cnp.NPY_MAXDIMS:
        raise ValueError(f"shape has {ndim} axes, more than NumPy's {cnp.NPY_MAXDIMS}")
    for k in range(ndim):
        dims[k] = shape[k]
    Py_INCREF(dtype)   # PyArray_NewFromDescr steals a reference to the descriptor
    a = PyArray_NewFromDescr(cnp.ndarray, dtype, <int>ndim, dims, NULL, <void *>address,
                             cnp.NPY_ARRAY_C_CONTIGUOUS, None)
    Py_INCREF(base)    # PyArray_SetBaseObject steals a reference to the base
    cnp.PyArray_SetBaseObject(a, base)
    return a
