"""What the numbers were measured on: CPU, build, library versions, load."""
import os
import platform
import sysconfig
import time
from importlib import metadata

import numpy as np

from .. import build_flags, get_num_threads, openmp_enabled, simd_level

# installed versions (Cython: the one installed now; cython_build: the one that built us)
_VERSIONED = ["numpy", "scipy", "torch", "numba", "onnxruntime", "onnx", "Cython",
              "matplotlib", "threadpoolctl"]
# They override what OpenBLAS (NumPy's BLAS) detects about the CPU.  The command line runs
# the benchmark without them and names what it left out in UNSET_MARK.
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
UNSET_MARK = "RESNORM_BENCH_UNSET"
# The CPU flags (as /proc/cpuinfo names them) that resnorm's SIMD level is chosen from at
# import: avx512bf16 needs all of them, avx512 all but avx512dq and avx512_bf16, avx2 needs
# avx2, fma and f16c.
LEVEL_FLAGS = ("sse2", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
               "avx512_bf16")
# Shorter than this, /proc/stat's clock ticks (10 ms) are too coarse to tell how many cores
# other processes kept busy (resnorm's thread rule samples no more often either).
MIN_SAMPLE_SECONDS = 0.05


def openblas_overrides(env):
    """The OPENBLAS_VARS set in env, {name: value}."""
    return {k: env[k] for k in OPENBLAS_VARS if k in env}


def without_openblas_overrides(env):
    """env without OPENBLAS_VARS, the names left out recorded in UNSET_MARK."""
    clean = {k: v for k, v in env.items() if k not in OPENBLAS_VARS}
    clean[UNSET_MARK] = ",".join(openblas_overrides(env))
    return clean


def _cpuinfo():
    """(model name, set of CPU flags) from /proc/cpuinfo (Linux), else what platform knows."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return model, flags


def _cache_sizes():
    """{'L1d': '48K', 'L2': '1024K', 'L3': '32768K'} from sysfs (Linux), else {}."""
    sizes = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            with open(f"{base}/{index}/level") as f:
                level = f.read().strip()
            with open(f"{base}/{index}/type") as f:
                kind = f.read().strip()
            with open(f"{base}/{index}/size") as f:
                size = f.read().strip()
            if kind != "Instruction":
                sizes[f"L{level}{'d' if kind == 'Data' else ''}"] = size
    except OSError:
        pass
    return sizes


def cache_bytes(size):
    """A sysfs cache size ('48K', '32M') in bytes (None when it does not read as one)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return int(size[:-1]) * units[size[-1].upper()] if size[-1:].isalpha() else int(size)
    except (KeyError, ValueError):
        return None


def largest_cache(caches):
    """Bytes of the largest cache of machine_info()'s 'caches' (None when none is known)."""
    sizes = [b for b in map(cache_bytes, caches.values()) if b]
    return max(sizes, default=None)


def _busy_seconds_of_my_cpus():
    """Seconds the CPUs this process may run on have been busy since boot (None where
    /proc/stat or the CPU affinity cannot be read)."""
    try:
        mine = os.sched_getaffinity(0)
        with open("/proc/stat") as f:
            lines = f.readlines()
    except (AttributeError, OSError):
        return None
    ticks = 0
    for line in lines:
        name, _, fields = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in mine:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields.split()[:8])
            ticks += user + nice + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_sample():
    """What free_cores compares: (wall clock, busy seconds of this process's CPUs, this
    process's CPU seconds, all its threads)."""
    return time.perf_counter(), _busy_seconds_of_my_cpus(), time.process_time()


def free_cores(start, end):
    """The cores other processes left free between two cpu_sample()s, as resnorm's thread
    rule counts them: the CPUs' busy time less this process's own, over the wall time, is
    the cores others used.  None when /proc/stat is not readable or the span is under
    MIN_SAMPLE_SECONDS."""
    wall = end[0] - start[0]
    if start[1] is None or end[1] is None or wall < MIN_SAMPLE_SECONDS:
        return None
    others = ((end[1] - start[1]) - (end[2] - start[2])) / wall
    cores = len(os.sched_getaffinity(0))
    return min(cores, max(0, int(cores - others + 0.5)))


def _version(dist):
    """Installed version of a distribution, without importing it (None when absent)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cython_build_version():
    """The Cython that generated the extension, read from the ABI module name of its
    function type ('_cython_3_3_1' -> '3.3.1'); None when it does not look like that."""
    module = type(simd_level).__module__
    return module[len("_cython_"):].replace("_", ".") if module.startswith("_cython_") else None


def load_average():
    """The 1-minute load average (None where the OS does not report it)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def machine_info():
    """CPU, cores, caches, SIMD, build flags, OpenMP, library versions, platform."""
    model, flags = _cpuinfo()
    simd_flags = [f for f in LEVEL_FLAGS if f in flags]
    versions = {name.lower(): _version(name) for name in _VERSIONED}
    versions["numpy"] = np.__version__
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "caches": _cache_sizes(),
        "cpu_simd_flags": simd_flags,
        "simd_level": simd_level(),
        "openmp": openmp_enabled(),
        "omp_max_threads": get_num_threads(),
        "build_flags": build_flags(),
        "compiler": sysconfig.get_config_var("CC"),
        "cython_build": _cython_build_version(),
        "python": platform.python_version(),
        "resnorm": _version("resnorm") or "source tree",
        **versions,
        "omp_env": {k: v for k, v in os.environ.items()
                    if k.startswith(("OMP_", "GOMP_", "OPENBLAS_", "MKL_", "NUMBA_"))},
        "openblas_unset": [k for k in os.environ.get(UNSET_MARK, "").split(",") if k],
        "platform": platform.platform(),
        "load_average": load_average(),
    }
