"""What a benchmark run produces: rows of measurements and the facts of the run, as
dataclasses that go to and come back from JSON unchanged."""
import json
from dataclasses import asdict, dataclass, field


# the peers, in the order of the table's columns
PEERS = ["numpy", "torch", "torch.compile", "numba", "onnxruntime"]
OK, WRONG, UNSUPPORTED = "ok", "wrong", "unsupported"
# resnorm's two output forms: writing into given outputs, allocating them
PREALLOCATED, ALLOCATING = FORMS = ("preallocated", "allocating")


def peer_result(status, us=None, error=None, note="", resnorm_us=None):
    """One peer's entry of a row: status OK (checked, then timed: us), WRONG (its output
    failed the check: error, not timed) or UNSUPPORTED (it could not run this case: note).
    resnorm_us: for a peer timed in rounds of its own (torch.compile, in its process),
    resnorm's times in those rounds, {"preallocated": us, "allocating": us}; the peer is
    compared with those."""
    result = {"status": status, "us": us, "error": error, "note": note}
    if resnorm_us is not None:
        result["resnorm_us"] = resnorm_us
    return result


def note_of(err):
    """An exception as a one-line note: what a peer that could not run a case says."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:160] if text else ''}"


def form_name(preallocated):
    """The name of resnorm's output form: PREALLOCATED (given outputs) or ALLOCATING."""
    return PREALLOCATED if preallocated else ALLOCATING


def own_form(by_form):
    """Of {form or peer name: value}, resnorm's preallocated form's, else its allocating
    form's, else None: the form a row's peers are compared with."""
    return by_form.get(PREALLOCATED) or by_form.get(ALLOCATING)


def resnorm_in_rounds(peer, form):
    """resnorm's time of `form` from a peer's own rounds (None: the peer was timed in the
    main rounds)."""
    return (peer.get("resnorm_us") or {}).get(form)


def fastest(peers, form, resnorm_us):
    """(name, vs best) of the peer fastest against resnorm's `form` (one of FORMS), timed
    at resnorm_us in the same rounds as the peers: vs best is the peer's time over
    resnorm's in that peer's rounds.  (None, None) if no peer was timed; without resnorm's
    time (its output was wrong), the peer fastest by time alone and None."""
    timed = {name: p for name, p in peers.items() if p["status"] == OK}
    if not timed:
        return None, None
    if resnorm_us is None:
        return min(timed, key=lambda name: timed[name]["us"]), None
    ratio = ratios(peers, form, resnorm_us)
    best = min(ratio, key=ratio.get)
    return best, ratio[best]


def ratios(peers, form, resnorm_us):
    """{name: the peer's time over resnorm's `form` (timed at resnorm_us in the same
    rounds as the peers)} of the peers that were timed, each against resnorm's time from
    that peer's rounds: above 1, resnorm was faster."""
    found = {}
    for name, p in peers.items():
        if p["status"] == OK:
            own = resnorm_in_rounds(p, form)
            found[name] = p["us"] / (resnorm_us if own is None else own)
    return found


@dataclass
class Row:
    """One op, shape, dtype, thread count and output form, with its peers from the same
    interleaved rounds (torch.compile: from rounds of its own process, with resnorm's
    forms).  Times are medians in microseconds; None where the output was wrong and so not
    timed."""
    op: str
    kind: str               # forward, backward or fused (add + norm forward)
    shape: tuple
    dtype: str
    threads: int
    preallocated: bool      # resnorm wrote into given outputs (False: it allocated them)
    resnorm_us: float | None
    resnorm_error: float    # against the float64 reference (see _check)
    traffic_bytes: int      # the op's minimum traffic
    gbps: float | None      # traffic / resnorm time
    copy_us: float          # np.copyto of traffic/2 bytes (it reads and writes them)
    copy_gbps: float
    copy_threads: int       # the copy ran on as many threads as the resnorm call
    x_copy: float | None    # gbps / copy_gbps = copy time / resnorm time
    peers: dict             # peer name -> peer_result(...); absent: no such peer
    best_peer: str | None   # the fastest peer that was timed
    vs_best: float | None   # best peer's time / resnorm's time (above 1: resnorm is faster)
    repeats: int
    # the cores other processes left free while the row's rounds ran (None: not measured,
    # e.g. rounds too short to tell); fewer than copy_threads: the times include waits
    free_cores: int | None = None
    in_cache: bool | None = None   # the op's traffic fits in the CPU's largest cache

    @property
    def busy(self):
        """Other processes held cores this row's threads needed while it was timed."""
        return self.free_cores is not None and self.copy_threads > self.free_cores


def one_per_cell(rows):
    """One row per (op, shape, dtype, threads): the preallocated one, or the allocating one
    where the rows hold no preallocated one."""
    chosen = {}
    for r in rows:
        key = (r.op, tuple(r.shape), r.dtype, r.threads)
        if key not in chosen or r.preallocated:
            chosen[key] = r
    return list(chosen.values())


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
    variant: str            # one of FORMS or a peer's name
    us: float | None        # None: not timed (status WRONG or UNSUPPORTED)
    calls: int              # calls per timing
    repeats: int            # timings; the median is reported
    status: str = OK
    error: float | None = None
    note: str = ""


@dataclass
class Results:
    meta: dict = field(default_factory=dict)      # command, date, duration, load, config
    machine: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    scaling: list = field(default_factory=list)
    latency: list = field(default_factory=list)

    def to_json(self, goals=None):
        data = {"meta": self.meta, "machine": self.machine,
                "rows": [asdict(r) for r in self.rows],
                "scaling": [asdict(r) for r in self.scaling],
                "latency": [asdict(r) for r in self.latency]}
        if goals is not None:
            data["goals"] = [{**asdict(g), "status": g.status} for g in goals]
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text):
        data = json.loads(text)

        def load(kind, items):
            return [kind(**{**d, "shape": tuple(d["shape"])}) for d in items]
        return cls(meta=data["meta"], machine=data["machine"], rows=load(Row, data["rows"]),
                   scaling=load(ScalingRow, data["scaling"]),
                   latency=load(LatencyRow, data["latency"]))
