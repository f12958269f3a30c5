# A prefetch past the end of an array, which tools/sanitize.sh must report (else its check
# of the kernels' prefetches is not working): in a build with RN_CHECKED_PREFETCH each line
# the core would prefetch is read instead (core/vec.h).  The float32 `sum` primitive is
# called on the only row of a 64-float block with ahead = 1, as if another row followed:
# it reads the next row's lines, past the block.  The kernels never make such a call.
import ctypes
import os
import sys

from resnorm import _core

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "resnorm_c"))
from primitives import PRIMITIVES   # noqa: E402  (the layout of the generated tables)

core = ctypes.CDLL(_core.__file__)
core.rn_core_select.restype = ctypes.c_void_p
table = core.rn_core_select()
# rn_ops: the untyped table (rn_ops_any) first, then rn_ops_f32, whose first member is sum
assert [p.name for p in PRIMITIVES if p.typed][0] == "sum"
n_any = sum(not p.typed for p in PRIMITIVES)
sum_f32 = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_ssize_t)(
    ctypes.c_void_p.from_address(table + n_any * ctypes.sizeof(ctypes.c_void_p)).value)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
d = 64
row = libc.malloc(d * 4)
ctypes.memset(row, 0, d * 4)
sum_f32(row, d, 1)
