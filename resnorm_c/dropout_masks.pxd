# The dropout mask inside the kernels: a site (rn_dropout), and its keep bits, made a slice at
# a time by the counter-based Philox generator (core/philox.h).
#
# Element k (flat C-order index) is kept when its Philox-4x32-10 uniform, a function of
# (seed, k), passes the threshold; the mask is regenerated in backward, never stored between
# the passes, and identical for any thread count.  Inside a kernel it is a bit string, 1 bit
# per element (a row's mask stays in L1 beside the row), made one row ahead: a thread
# generates the mask of its next row slice by slice during the current row's write pass,
# which waits on streamed stores draining to memory and leaves the core time to spare.
from libc.stdint cimport uint32_t, uint64_t

from primitives cimport rn_dropout_bits

cdef enum:
    SEGMENT = 1024        # elements per slice of a write pass (see above)


cdef struct rn_dropout:
    # on = 0: no dropout.  Else element k is kept when its Philox uniform is >= threshold,
    # and kept values are multiplied by scale = 1/(1-p).
    bint on
    uint64_t seed
    uint32_t threshold
    double scale


cdef inline const rn_dropout *active(const rn_dropout *dp) noexcept nogil:
    """dp when it drops anything, else NULL."""
    return dp if dp.on else NULL


cdef inline Py_ssize_t mask_words(Py_ssize_t d) noexcept nogil:
    """64-bit words that hold the keep bits of d consecutive elements starting anywhere in
    a group, plus a word of padding for the readers' 8-byte loads."""
    return (d + 63) // 64 + 2


cdef inline uint64_t extend_bits(uint64_t *words, const rn_dropout *dp, uint64_t first_group,
                                 uint64_t made, uint64_t end) noexcept nogil:
    """Makes the keep bits of the groups from `made` up to the one holding flat element
    end - 1, into words (word j: group first_group + j); returns the new `made`."""
    cdef uint64_t need = (end + 63) // 64
    if need > made:
        rn_dropout_bits(words + (made - first_group), dp.seed, made, need - made, dp.threshold)
    return need if need > made else made
