# Arrays as the kernels see them (included by api.pyx): memory overlap, the rows view, and
# where a kernel writes its outputs.
#
# The kernels read and write C-contiguous, aligned rows through pointers.  An input in that
# layout is read in place; any other (strided, Fortran, misaligned, read-only ones are fine)
# is copied once.  An output buffer in that layout is written directly; any other is
# written through a fresh array that is then copied into it.


cdef inline void extents(cnp.ndarray a, char **lo, char **hi) noexcept:
    """The first byte a can touch and one past the last (the bounds np.may_share_memory
    compares); lo == hi for an empty array."""
    cdef char *data = <char *>cnp.PyArray_DATA(a)
    cdef Py_ssize_t low = 0, high = cnp.PyArray_ITEMSIZE(a), extent
    cdef int k
    for k in range(cnp.PyArray_NDIM(a)):
        if cnp.PyArray_DIM(a, k) == 0:
            lo[0] = hi[0] = data
            return
        extent = cnp.PyArray_STRIDE(a, k) * (cnp.PyArray_DIM(a, k) - 1)
        if extent > 0:
            high += extent
        else:
            low += extent
    lo[0] = data + low
    hi[0] = data + high


cdef inline bint spans_meet(char *alo, char *ahi, char *blo, char *bhi) noexcept:
    """The extents [alo, ahi) and [blo, bhi) overlap (an empty one overlaps nothing)."""
    return alo < ahi and blo < bhi and alo < bhi and blo < ahi


cpdef bint overlap(a, b):
    """Whether a and b may share memory (np.may_share_memory: their bounds overlap)."""
    cdef char *alo
    cdef char *ahi
    cdef char *blo
    cdef char *bhi
    if type(a) is not cnp.ndarray or type(b) is not cnp.ndarray:
        return np.may_share_memory(a, b)
    extents(<cnp.ndarray>a, &alo, &ahi)
    extents(<cnp.ndarray>b, &blo, &bhi)
    return spans_meet(alo, ahi, blo, bhi)


cdef inline bint kernel_layout(cnp.ndarray a) noexcept:
    return cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISALIGNED(a)


cdef inline cnp.ndarray contiguous(cnp.ndarray a):
    """a itself when C-contiguous and aligned, else one C-contiguous copy."""
    if kernel_layout(a):
        return a
    return cnp.PyArray_NewCopy(a, cnp.NPY_CORDER)


cdef inline cnp.ndarray as_rows(cnp.ndarray a, Py_ssize_t d=0):
    """a (C-contiguous and aligned) as its (N, D) rows, D = d (0: the last axis): a itself
    when it already is."""
    cdef cnp.npy_intp dims[2]
    cdef cnp.PyArray_Dims shape
    cdef int ndim = cnp.PyArray_NDIM(a)
    if d == 0:
        d = cnp.PyArray_DIM(a, ndim - 1)
    if ndim == 2 and cnp.PyArray_DIM(a, 1) == d:
        return a
    dims[1] = d
    dims[0] = cnp.PyArray_SIZE(a) // d
    shape.ptr = dims
    shape.len = 2
    return cnp.PyArray_Newshape(a, &shape, cnp.NPY_CORDER)


cdef inline cnp.ndarray new_like(cnp.ndarray x):
    """A new C-contiguous array of x's shape and dtype (uninitialised)."""
    return cnp.PyArray_EMPTY(cnp.PyArray_NDIM(x), cnp.PyArray_DIMS(x), cnp.PyArray_TYPE(x), 0)


cdef inline cnp.ndarray new_stats(Py_ssize_t n):
    """n float64 row statistics (uninitialised)."""
    cdef cnp.npy_intp dims[1]
    dims[0] = n
    return cnp.PyArray_EMPTY(1, dims, cnp.NPY_DOUBLE, 0)


cdef inline cnp.ndarray new_vector(Py_ssize_t d, int typenum):
    cdef cnp.npy_intp dims[1]
    dims[0] = d
    return cnp.PyArray_EMPTY(1, dims, typenum, 0)


cdef inline bint disjoint(cnp.ndarray a, b) noexcept:
    """a (contiguous) and b (a contiguous array or None) share no memory."""
    if b is None:
        return True
    cdef char *pa = <char *>cnp.PyArray_DATA(a)
    cdef char *pb = <char *>cnp.PyArray_DATA(<cnp.ndarray>b)
    return pa + cnp.PyArray_NBYTES(a) <= pb or pb + cnp.PyArray_NBYTES(<cnp.ndarray>b) <= pa


cdef inline cnp.ndarray ready_buffer(out, cnp.ndarray like):
    """out when it is exactly an ndarray the kernel can write directly as like's output:
    writeable, kernel layout, like's shape and type (the checks out_array makes, decided
    without Python code); None for anything else."""
    if (type(out) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>out) == cnp.PyArray_TYPE(like)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>out)
            and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>out) and kernel_layout(<cnp.ndarray>out)
            and same_shape(<cnp.ndarray>out, like)):
        return <cnp.ndarray>out
    return None


cdef inline cnp.ndarray output(out, cnp.ndarray like, dict inputs, str name):
    """Where the kernel writes the output `name` of like's shape and dtype: a new array (out
    None), out's own memory when it can take it, else a fresh array that finish() copies
    into out.  inputs: what out must not overlap unless it is exactly that input."""
    if out is None:
        return new_like(like)
    out_array(out, shape_of(like), like.dtype, inputs, name)
    if kernel_layout(<cnp.ndarray>out):
        return <cnp.ndarray>out
    return new_like(like)


cdef inline object finish(out, cnp.ndarray written):
    """The result: `written` (out None), or out, after copying `written` into it when the
    kernel could not write out directly."""
    if out is None:
        return written
    if written is not out:
        (<cnp.ndarray>out)[...] = written
    return out


def kernel_rows(a):
    """An ndarray as C-contiguous, aligned (N, D) rows: a view when it already is, else one
    copy (for resnorm.nn's layers, which hand rows to their own kernels)."""
    return as_rows(contiguous(a))
