"""The benchmark suite behind ``python -m resnorm bench``.

For each (op, shape, dtype, threads) it times, interleaved round by round so that all see
the same machine state:

* resnorm's kernel, writing into preallocated outputs and allocating them (two rows),
* its peers, each when installed: NumPy (what a NumPy user would write), torch eager,
  torch.compile (in its own process), a numba row loop, ONNX Runtime,
* ``np.copyto`` of the op's minimum traffic: the bandwidth reference.

Every output (resnorm's and each peer's) is checked against the float64 reference first;
a wrong one is reported as wrong and not timed.  Times are medians after warm-up.  GB/s
counts the op's minimum traffic (each input read once, each output written once); "x copy"
is that bandwidth divided by copy bandwidth of the same bytes (marked where the op's data
fits in the CPU's caches: there it compares cache bandwidth); "vs best" is the fastest
peer's time over resnorm's.  Each row records the cores other processes left free while it
was timed, counted as resnorm's thread rule counts them; a row whose threads needed more
is marked busy.  The report's first paragraph names the peers compared and those left out
(with how to install them).  Besides the table: thread scaling, small-call latency and,
when asked, the library's speed goals.

Modules: _cases (what a case is; the op registry), _ops_norms / _ops_residual (the ops),
_peers (which peers, installed or not), _peers_numba / _peers_onnx / _peers_torch (the
peers), _check (outputs against the reference), _timing, _copy, _run (the sections),
_results (rows, JSON), _report (Markdown), _goals, _machine, _plot (PNG, matplotlib).
"""
from . import _ops_norms, _ops_residual  # noqa: F401  (they fill the op registry)
from ._cases import Case, setup
from ._cases import ops as _ops
from ._goals import evaluate as evaluate_goals
from ._machine import machine_info
from ._report import goals_table, latency_table, markdown_table, report, scaling_table
from ._results import PEERS, LatencyRow, Results, Row, ScalingRow
from ._run import FULL_SHAPES, QUICK_OPS, QUICK_SHAPES, SECTIONS, run
from ._timing import time_interleaved

OPS = _ops()

__all__ = [
    "Case", "evaluate_goals", "FULL_SHAPES", "goals_table", "latency_table", "LatencyRow",
    "machine_info", "markdown_table", "OPS", "PEERS", "QUICK_OPS", "QUICK_SHAPES", "report",
    "Results", "Row", "run", "scaling_table", "ScalingRow", "SECTIONS", "setup",
    "time_interleaved",
]
