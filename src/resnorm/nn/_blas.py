"""One thread pool: resnorm.nn runs its matrix products inside its own OpenMP loops.

A Linear or attention kernel cuts its products into tasks (row blocks, heads) and runs them
in one OpenMP loop, each task calling a single-threaded gemm (resnorm_c/layers.pyx).  BLAS
must then not thread the calls itself: scipy's OpenBLAS, entered from two OpenMP threads
while set to two threads of its own, ran 32 attention heads in 215 ms instead of 0.33 ms
(this machine, 2 cores).  So for the duration of each such kernel call every BLAS library
in the process is held at one thread (threadpoolctl; about 4 microseconds per library per
call), and restored afterwards.

Without threadpoolctl (or when it finds no BLAS it can control) the kernels are told
parallel_gemm=False: each product is then one gemm call made from one thread, which BLAS
may thread itself.  Results are then up to that BLAS (OpenBLAS's last bits change with its
thread count); with the single-threaded BLAS they are bitwise identical for any OpenMP
thread count.

Not for concurrent forward/backward calls from several Python threads: the BLAS thread
count is process-wide state.
"""
try:
    from threadpoolctl import ThreadpoolController
except ImportError:  # optional dependency: fall back to BLAS's own threading
    ThreadpoolController = None

_libraries = None


def _blas_libraries():
    """threadpoolctl's controllers of every BLAS loaded in the process (found once)."""
    global _libraries
    if _libraries is None:
        _libraries = ([] if ThreadpoolController is None else
                      list(ThreadpoolController().select(user_api="blas").lib_controllers))
    return _libraries


class single_threaded_blas:
    """``with single_threaded_blas() as parallel_gemm:`` holds every BLAS at one thread
    inside the block; parallel_gemm says whether it could (pass it to the kernel)."""

    def __enter__(self):
        libraries = _blas_libraries()
        self._saved = [(lib, lib.get_num_threads()) for lib in libraries]
        for lib, n in self._saved:
            if n != 1:
                lib.set_num_threads(1)
        return bool(libraries)

    def __exit__(self, *exc):
        for lib, n in self._saved:
            if n != 1:
                lib.set_num_threads(n)
        return False
