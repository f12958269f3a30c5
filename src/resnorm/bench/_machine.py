"""What the numbers were measured on: CPU, build, library versions, load."""
import os
import platform
import sysconfig
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
    simd_flags = [f for f in ("sse2", "avx", "avx2", "fma", "avx512f", "avx512bw") if f in flags]
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
