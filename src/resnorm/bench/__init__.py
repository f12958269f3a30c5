"""The benchmark suite behind ``python -m resnorm bench``.

For each (op, shape, dtype, threads) it times, interleaved round by round so that all see
the same machine state:

* resnorm's kernel, writing into preallocated outputs and allocating them (two rows),
* the same computation written in NumPy in the input dtype (what a NumPy user would write),
* PyTorch CPU on the same thread count, when torch is installed,
* ``np.copyto`` of the op's minimum traffic: the bandwidth reference.

Times are medians after warm-up.  GB/s counts the op's minimum traffic (each input read
once, each output written once); "x copy" is that bandwidth divided by copy bandwidth of the
same bytes.  The ops are memory-bound, so x copy near 1 means the kernel runs at the memory
limit.  Besides the table: thread scaling, small-call latency and the issue's target check.

Modules: _cases (what a case is; the op registry), _ops_norms / _ops_residual (the ops),
_timing, _run (the sections), _results (rows, JSON), _report (Markdown), _targets,
_machine, _plot (PNG, matplotlib).
"""
from . import _ops_norms, _ops_residual  # noqa: F401  (they fill the op registry)
from ._cases import Case, setup
from ._cases import ops as _ops
from ._machine import machine_info
from ._report import latency_table, markdown_table, report, scaling_table, targets_table
from ._results import LatencyRow, Results, Row, ScalingRow
from ._run import FULL_SHAPES, QUICK_OPS, QUICK_SHAPES, SECTIONS, run
from ._targets import evaluate as evaluate_targets
from ._timing import time_interleaved

OPS = _ops()

__all__ = [
    "Case", "evaluate_targets", "FULL_SHAPES", "latency_table",
    "LatencyRow", "machine_info", "markdown_table", "OPS", "QUICK_OPS", "QUICK_SHAPES",
    "report", "Results", "Row", "run", "scaling_table", "ScalingRow", "SECTIONS", "setup",
    "targets_table", "time_interleaved",
]
