"""How much does another process holding a core cost a multi-threaded call, and what helps?

With the default n_threads=None a call runs on every core.  When another process keeps one
core busy, the thread that shares its core must wait for the scheduler before it can reach
the barrier at the end of the parallel region, and the whole call waits with it: a
(512, 1024) float32 rms_norm that takes tens of microseconds on a quiet 2-core machine can
take milliseconds.  This script reproduces that and measures the remedies:

  default         n_threads=None, the OpenMP runtime as configured by the environment
  passive         OMP_WAIT_POLICY=passive: idle OpenMP threads sleep at once (no spinning)
  spin-10k        GOMP_SPINCOUNT=10000: spin briefly (libgomp's default is 300000), then sleep
  passive-import  OMP_WAIT_POLICY=passive set in os.environ just before `import resnorm`
                  and removed after it (what resnorm could do itself at import)
  torch-first     as passive-import, but torch is imported first (it loads its own OpenMP
                  runtime; does resnorm's runtime still see the setting?)
  dynamic         schedule(dynamic, 16) instead of static in the norm kernels (a separate
                  build: --dynamic-build DIR makes it there the first time, ~5 minutes)
  loadavg         n_threads = cores - round(1-minute load average of the others), per call
  procstat        n_threads = cores not busy with other processes, from /proc/stat deltas
                  sampled at most every 50 ms (our own CPU time subtracted)
  adaptive        n_threads=None, but after a call slower than 4x the one-thread estimate,
                  one thread for the next 100 ms
  one-thread      n_threads=1

Each configuration runs in a fresh process (OpenMP reads its environment once, when it is
loaded), interleaved with the others, for each background load:

  none            no extra process
  pinned          one busy-looping process pinned to the last core
  free            one busy-looping process the scheduler may move

    python benchmarks/thread_contention.py                      # all of the above
    python benchmarks/thread_contention.py --loads pinned --configs default passive one-thread
    python benchmarks/thread_contention.py --dynamic-build /tmp/resnorm-dynamic

Prints, per load, the median, 90th and 99th percentile and mean time per call in
microseconds and the mean thread count.  On a shared machine the "none" rows include
whatever else runs: read them together with the load average printed at the start.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("default", "passive", "spin-10k", "passive-import", "torch-first", "dynamic",
           "loadavg", "procstat", "adaptive", "one-thread")
LOADS = ("none", "pinned", "free")
ENV = {"passive": {"OMP_WAIT_POLICY": "passive"}, "spin-10k": {"GOMP_SPINCOUNT": "10000"}}


# --------------------------------------------------------------------------- team sizing

class ProcStat:
    """Cores not busy with other processes, from /proc/stat, re-sampled every `period` s."""

    def __init__(self, period=0.05):
        self.period = period
        self.cores = len(os.sched_getaffinity(0))
        self.last = self._sample()
        self.free = self.cores

    @staticmethod
    def _sample():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + fields[4]                      # idle + iowait, in clock ticks
        own = sum(os.times()[:2])                         # our user + system seconds
        return time.monotonic(), sum(fields) - idle, own

    def threads(self):
        now = time.monotonic()
        if now - self.last[0] >= self.period:
            sample = self._sample()
            wall = sample[0] - self.last[0]
            busy = (sample[1] - self.last[1]) / os.sysconf("SC_CLK_TCK")   # core-seconds
            others = max(0.0, busy - (sample[2] - self.last[2])) / wall
            self.free = max(1, min(self.cores, round(self.cores - others)))
            self.last = sample
        return self.free


class LoadAvg:
    """cores - round(1-minute load average minus our own threads)."""

    def __init__(self):
        self.cores = len(os.sched_getaffinity(0))

    def threads(self):
        others = os.getloadavg()[0] - 1.0                 # this process counts as one
        return max(1, min(self.cores, round(self.cores - others)))


class Adaptive:
    """All cores until a call is much slower than one thread would have been."""

    def __init__(self, one_thread_seconds, factor=4.0, hold=0.1):
        self.limit = factor * one_thread_seconds
        self.hold = hold
        self.until = 0.0

    def threads(self):
        return 1 if time.monotonic() < self.until else None

    def observe(self, seconds, n_threads):
        if n_threads is None and seconds > self.limit:
            self.until = time.monotonic() + self.hold


# --------------------------------------------------------------------------- one process

def child(spec):
    """Times `calls` calls of one configuration; prints a JSON line of per-call times."""
    name = spec["config"]
    if name == "torch-first":
        import torch  # noqa: F401  (loads torch's own OpenMP runtime first)
    if name in ("passive-import", "torch-first"):
        os.environ["OMP_WAIT_POLICY"] = "passive"
    import numpy as np

    import resnorm
    if name in ("passive-import", "torch-first"):
        del os.environ["OMP_WAIT_POLICY"]
    shape = tuple(spec["shape"])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    w = np.ones(shape[-1], np.float32)
    out = np.empty_like(x)

    def one_thread_time():
        t = []
        for _ in range(50):
            t0 = time.perf_counter()
            resnorm.rms_norm(x, w, out=out, n_threads=1)
            t.append(time.perf_counter() - t0)
        return statistics.median(t)

    policy = {"loadavg": LoadAvg, "procstat": ProcStat}.get(name)
    sizer = policy() if policy else None
    adaptive = Adaptive(one_thread_time()) if name == "adaptive" else None
    fixed = 1 if name == "one-thread" else None
    times, threads = [], []
    for i in range(spec["warmup"] + spec["calls"]):
        t0 = time.perf_counter()
        n = sizer.threads() if sizer else adaptive.threads() if adaptive else fixed
        resnorm.rms_norm(x, w, out=out, n_threads=n)
        dt = time.perf_counter() - t0
        if adaptive:
            adaptive.observe(dt, n)
        if i >= spec["warmup"]:
            times.append(dt)
            threads.append(resnorm.get_num_threads() if n is None else n)
        if spec["gap_us"]:
            end = time.perf_counter() + spec["gap_us"] * 1e-6
            while time.perf_counter() < end:   # other work of the caller, between calls
                pass
    print(json.dumps({"times": times, "threads": threads}))


# --------------------------------------------------------------------------- the driver

def start_load(kind):
    if kind == "none":
        return None
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    if kind == "pinned":
        os.sched_setaffinity(hog.pid, {max(os.sched_getaffinity(0))})
    time.sleep(0.5)      # let it settle on its core
    return hog


def make_dynamic_build(dest):
    """A copy of the checkout whose norm kernels use schedule(dynamic, 16); built once."""
    dest = Path(dest)
    if (dest / "src" / "resnorm").exists() and list((dest / "src" / "resnorm").glob("_norms*.so")):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "--null", "-T", "-", "-cf", str(dest / "src.tar")], input=files,
                   cwd=ROOT, check=True)
    subprocess.run(["tar", "-xf", "src.tar"], cwd=dest, check=True)
    pyx = dest / "resnorm_c" / "norms.pyx"
    text = pyx.read_text()
    pyx.write_text(text.replace('prange(n, schedule="static"',
                                'prange(n, schedule="dynamic", chunksize=16'))
    print(f"building the schedule(dynamic) copy in {dest} (a few minutes)", file=sys.stderr)
    with open(dest / "build.log", "w") as log:
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=dest,
                       stdout=log, stderr=subprocess.STDOUT, check=True)
    return dest


def run_config(config, args, dynamic_src):
    env = dict(os.environ)
    env.update(ENV.get(config, {}))
    if config == "dynamic":
        env["PYTHONPATH"] = str(dynamic_src / "src")
    spec = {"config": config, "shape": args.shape, "calls": args.calls, "warmup": args.warmup,
            "gap_us": args.gap_us}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{config}: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(times, threads):
    us = sorted(t * 1e6 for t in times)
    q = statistics.quantiles(us, n=100)
    return {"median": statistics.median(us), "p90": q[89], "p99": q[98],
            "mean": statistics.fmean(us), "threads": statistics.fmean(threads)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--loads", nargs="+", choices=LOADS, default=list(LOADS))
    parser.add_argument("--shape", type=lambda s: [int(v) for v in s.split("x")],
                        default=[512, 1024], help="default 512x1024 (float32 rms_norm)")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per run")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of every configuration per load, interleaved")
    parser.add_argument("--gap-us", type=float, default=0.0,
                        help="busy-wait between calls (the caller's own work), microseconds")
    parser.add_argument("--dynamic-build", default=str(Path("/tmp") / "resnorm-dynamic"),
                        help="where the schedule(dynamic) copy is built (config 'dynamic')")
    parser.add_argument("--json", help="also write every summary to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))

    dynamic_src = make_dynamic_build(args.dynamic_build) if "dynamic" in args.configs else None
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; load average {os.getloadavg()[0]:.2f} before the run; "
          f"rms_norm {args.shape[0]}x{args.shape[1]} float32 with out=, {args.calls} calls "
          f"per run, {args.rounds} runs interleaved, gap {args.gap_us:g} us\n")
    results = {}
    for load in args.loads:
        hog = start_load(load)
        try:
            runs = {c: {"times": [], "threads": []} for c in args.configs}
            for _ in range(args.rounds):
                for config in args.configs:
                    r = run_config(config, args, dynamic_src)
                    runs[config]["times"] += r["times"]
                    runs[config]["threads"] += r["threads"]
        finally:
            if hog:
                hog.kill()
                hog.wait()
        print(f"### background load: {load}\n")
        print("| config | median us | p90 us | p99 us | mean us | mean threads |")
        print("|---|---|---|---|---|---|")
        for config in args.configs:
            s = summary(runs[config]["times"], runs[config]["threads"])
            results[f"{load}/{config}"] = s
            print(f"| {config} | {s['median']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} | "
                  f"{s['mean']:.1f} | {s['threads']:.2f} |")
        print()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
