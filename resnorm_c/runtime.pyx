"""Build and runtime facts of the compiled core: OpenMP, thread count, SIMD level."""
from common cimport RN_HAVE_OPENMP, omp_get_max_threads, rn_cpu_init, rn_level_name, rn_build_flags

rn_cpu_init()


def openmp_enabled():
    """True when the extension was compiled with OpenMP (else every kernel uses 1 thread)."""
    return bool(RN_HAVE_OPENMP)


def get_max_threads():
    """omp_get_max_threads() now: honours OMP_NUM_THREADS and threadpoolctl limits (1 without OpenMP)."""
    return omp_get_max_threads()


def simd_level():
    """The instruction-set level the row kernels dispatched to ('avx512', 'avx2', 'sse2', 'portable')."""
    return rn_level_name().decode()


def build_flags():
    """The C compiler flags the extension was built with."""
    return rn_build_flags().decode()
