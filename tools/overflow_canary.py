# A deliberate heap-buffer overflow in the compiled core, which tools/sanitize.sh and
# tools/valgrind.sh must report (else their checks are not working): the core's exported
# rn_core_level_names(int *count) writes an int through a pointer to a 1-byte block.
# The public API never makes such a call.
import ctypes

from resnorm import _core

core = ctypes.CDLL(_core.__file__)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
block = libc.malloc(1)
core.rn_core_level_names.argtypes = [ctypes.c_void_p]
core.rn_core_level_names(block)
