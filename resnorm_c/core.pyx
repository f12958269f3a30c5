"""The compiled core: the row primitives at every SIMD level (resnorm_c/core/), the one
dispatch decision, made here at import, and the build and runtime facts.

The other extension modules do not compile the primitives again: they import the tables of
the chosen level from this module (resnorm_c/core/core.h, a capsule named _ops).
"""
from cpython.pycapsule cimport PyCapsule_New

from common cimport RN_HAVE_OPENMP, omp_get_max_threads
from primitives cimport rn_ops

cdef extern from "dispatch.h":
    const rn_ops *rn_core_select()
    const char *rn_core_level_name()
    const char *const *rn_core_level_names(int *count)
    const char *rn_core_build_flags()

_ops = PyCapsule_New(<void *>rn_core_select(), "resnorm._core._ops", NULL)


def openmp_enabled():
    """True when the extension was compiled with OpenMP (else every kernel uses 1 thread)."""
    return bool(RN_HAVE_OPENMP)


def get_max_threads():
    """omp_get_max_threads() now: honours OMP_NUM_THREADS and threadpoolctl limits (1 without OpenMP)."""
    return omp_get_max_threads()


def simd_level():
    """The instruction-set level the core dispatched to ('avx512bf16', 'avx512', 'avx2', 'sse2',
    'portable')."""
    return rn_core_level_name().decode()


def simd_levels():
    """Every level this build has, narrowest first (RESNORM_CPU may cap the choice at one)."""
    cdef int count = 0
    cdef const char *const *names = rn_core_level_names(&count)
    return tuple(names[i].decode() for i in range(count))


def build_flags():
    """The C compiler flags the core was built with."""
    return rn_core_build_flags().decode()
