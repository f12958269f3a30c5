"""What a benchmark run produces: rows of measurements and the facts of the run, as
dataclasses that go to and come back from JSON unchanged."""
import json
from dataclasses import asdict, dataclass, field


@dataclass
class Row:
    """One op, shape, dtype, thread count and output form, with its peers from the same
    interleaved rounds.  Times are medians in microseconds."""
    op: str
    kind: str               # forward, backward or fused Pre-Norm
    shape: tuple
    dtype: str
    threads: int
    preallocated: bool      # resnorm wrote into given outputs (False: it allocated them)
    resnorm_us: float
    traffic_bytes: int      # the op's minimum traffic
    gbps: float             # traffic / resnorm time
    copy_us: float          # np.copyto of traffic/2 bytes (it reads and writes them)
    copy_gbps: float
    copy_threads: int       # the copy ran on as many threads as the resnorm call
    x_copy: float           # gbps / copy_gbps = copy time / resnorm time
    numpy_us: float
    vs_numpy: float         # numpy time / resnorm time
    torch_us: float | None
    vs_torch: float | None
    repeats: int


@dataclass
class ScalingRow:
    """resnorm time of one op on `threads` threads, interleaved with the other counts."""
    op: str
    shape: tuple
    dtype: str
    threads: int
    us: float
    gbps: float
    x_copy: float           # against np.copyto of the same bytes on as many threads
    speedup: float          # time on 1 thread / time on `threads`
    repeats: int


@dataclass
class LatencyRow:
    """Microseconds per call from Python of a small call (argument checks included)."""
    op: str
    shape: tuple
    dtype: str
    variant: str            # "preallocated", "allocating" or "torch"
    us: float
    calls: int              # calls per timing
    repeats: int            # timings; the median is reported


@dataclass
class Results:
    meta: dict = field(default_factory=dict)      # command, date, duration, load, config
    machine: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    scaling: list = field(default_factory=list)
    latency: list = field(default_factory=list)

    def to_json(self, targets=None):
        data = {"meta": self.meta, "machine": self.machine,
                "rows": [asdict(r) for r in self.rows],
                "scaling": [asdict(r) for r in self.scaling],
                "latency": [asdict(r) for r in self.latency]}
        if targets is not None:
            data["targets"] = [{**asdict(t), "status": t.status} for t in targets]
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text):
        data = json.loads(text)

        def load(kind, items):
            return [kind(**{**d, "shape": tuple(d["shape"])}) for d in items]
        return cls(meta=data["meta"], machine=data["machine"], rows=load(Row, data["rows"]),
                   scaling=load(ScalingRow, data["scaling"]),
                   latency=load(LatencyRow, data["latency"]))
