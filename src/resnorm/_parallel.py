"""How many threads a call uses and when it streams its output past the caches.

The rule is the compiled call path's (resnorm_c/launch.pxi), applied there to every kernel
call; resnorm.nn and the benchmark ask it here.  PARALLEL_MIN_ELEMENTS (below it a call runs
on one thread) and STREAM_MIN_BYTES (outputs from this size on are written with streaming
stores) read and set the limits the call path uses, for experiments and tests: results are
the same for any value, only speed changes.
"""
import sys
import types

from ._api import (launch_limits, set_launch_limits, stream_output, stream_output_over,
                   threads_for)

__all__ = ["PARALLEL_MIN_ELEMENTS", "STREAM_MIN_BYTES", "streams", "streams_over",
           "threads_for"]

streams = stream_output
streams_over = stream_output_over


class _Limits(types.ModuleType):
    """This module, with the two limits as properties of the call path's values."""

    @property
    def PARALLEL_MIN_ELEMENTS(self):
        return launch_limits()[0]

    @PARALLEL_MIN_ELEMENTS.setter
    def PARALLEL_MIN_ELEMENTS(self, value):
        set_launch_limits(value, None)

    @property
    def STREAM_MIN_BYTES(self):
        return launch_limits()[1]

    @STREAM_MIN_BYTES.setter
    def STREAM_MIN_BYTES(self, value):
        set_launch_limits(None, value)


sys.modules[__name__].__class__ = _Limits
