"""Build the compiled core of resnorm (Cython + a little C, OpenMP when available).

Environment switches:
  RESNORM_OPENMP=0   build without OpenMP (kernels then run on one thread)
  RESNORM_OPT        the optimisation level (default -O3; the sanitizer and valgrind
                     builds, the no-OpenMP build test and CI's wheel check use -O1: what
                     they check does not depend on it, and they build in half the time)
  RESNORM_CFLAGS     extra compiler flags appended verbatim (e.g. "-march=native", or
                     "-fsanitize=address,undefined" for tools/sanitize.sh)
  RESNORM_LDFLAGS    extra linker flags appended verbatim
"""
import glob
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "resnorm_c"))
import primitives  # noqa: E402  (the registry of the core's primitives)

# The C core, compiled once, into resnorm._core (the other modules import its tables).
CORE_SOURCES = [f"resnorm_c/core/{name}.c" for name in
                ("level_sse2", "level_avx2", "level_avx512", "level_avx512bf16",
                 "level_portable", "dispatch")]
# The Cython modules: the call path of the public functions (with their kernels), and the
# kernels of resnorm.nn.
KERNEL_MODULES = ["api", "layers"]

CYTHON_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "initializedcheck": False,
    "cdivision": True,
    "embedsignature": True,
}


def _compiler_kind(compiler):
    """'apple-clang', 'clang' or 'gcc' for the compiler setuptools will use (the core needs
    GCC or Clang: vector extensions and target attributes; MSVC cannot build it)."""
    if compiler.compiler_type == "msvc":
        sys.exit("resnorm: MSVC cannot build resnorm (the core needs GCC or Clang vector "
                 "extensions); use clang, or WSL on Windows")
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    cc = shlex.split(os.environ.get("CC", "")) or cc
    try:
        banner = subprocess.run(cc + ["--version"], capture_output=True, text=True).stdout
    except OSError:
        banner = ""
    if "clang" in banner:
        return "apple-clang" if sys.platform == "darwin" else "clang"
    return "gcc"


def _openmp_flags(kind):
    """(compile flags, link flags) that enable OpenMP for this compiler."""
    if kind == "apple-clang":
        return ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
    return ["-fopenmp"], ["-fopenmp"]


def _base_flags(kind):
    # No -ffast-math and no -march=native: results must be IEEE-exact and the wheel must run
    # on any x86-64. Wider vectors are reached through runtime dispatch (resnorm_c/core/
    # dispatch.c). -ffp-contract=off keeps a*b+c from becoming an FMA on some dispatch levels
    # only, so every level computes bitwise the same numbers.  -O3, though -O2 builds in half
    # the time with the same output bits: at -O2 the kernels are slower, up to twice as slow
    # (benchmarks/TUNING.md).
    # -g0: no debug information (Python's own CFLAGS ask for -g): it made the compiled core
    # 72 MB, and took compile time, for symbols a user never reads.
    opt = os.environ.get("RESNORM_OPT", "-O3")
    return [opt, "-g0", "-ffp-contract=off", "-fno-math-errno", "-Wno-unused-function"]


def _openmp_compiles(compiler, cflags, ldflags):
    """True when a tiny OpenMP program compiles and links with these flags."""
    code = textwrap.dedent(
        """
        #include <omp.h>
        int main(void) {
            int n = 0;
            #pragma omp parallel reduction(+:n)
            n += 1;
            return omp_get_max_threads() > 0 && n > 0 ? 0 : 1;
        }
        """
    )
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "check_openmp.c")
        with open(src, "w") as f:
            f.write(code)
        try:
            objs = compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
            compiler.link_executable(objs, os.path.join(tmp, "check_openmp"), extra_postargs=ldflags)
        except Exception:  # any compile or link error means: no usable OpenMP
            return False
    return True


def _compile_in_parallel(compiler, jobs):
    """Makes compiler.compile build the sources of one extension on `jobs` threads (the
    core's level files are independent compile units); distutils compiles them one by one."""
    serial = compiler.compile

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                extra_preargs=None, extra_postargs=None, depends=None):
        if len(sources) < 2:
            return serial(sources, output_dir, macros, include_dirs, debug, extra_preargs,
                          extra_postargs, depends)
        with ThreadPoolExecutor(jobs) as pool:
            parts = pool.map(lambda src: serial([src], output_dir, macros, include_dirs, debug,
                                                extra_preargs, extra_postargs, depends),
                             sources)
            return [obj for objs in parts for obj in objs]

    compiler.compile = compile


class BuildExt(build_ext):
    """build_ext that picks optimisation and OpenMP flags for the compiler in use, and
    compiles on every core (extensions side by side, and the core's sources side by side):
    pip passes no -j, and the build takes minutes on one core."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self):
        _compile_in_parallel(self.compiler, os.cpu_count() or 1)
        kind = _compiler_kind(self.compiler)
        cflags, ldflags = _base_flags(kind), []
        want_openmp = os.environ.get("RESNORM_OPENMP", "1") != "0"
        if want_openmp:
            omp_c, omp_l = _openmp_flags(kind)
            if _openmp_compiles(self.compiler, omp_c, omp_l):
                cflags += omp_c
                ldflags += omp_l
            else:
                want_openmp = False
                bar = "!" * 78
                sys.stderr.write(
                    f"\n{bar}\nresnorm: OpenMP was not found for compiler '{kind}'.\n"
                    "resnorm: building WITHOUT OpenMP: every kernel will run on ONE thread.\n"
                    "resnorm: install OpenMP (e.g. libomp on macOS) and rebuild for threads.\n"
                    f"{bar}\n\n"
                )
        else:
            sys.stderr.write("resnorm: RESNORM_OPENMP=0, building without OpenMP (1 thread).\n")
        cflags += shlex.split(os.environ.get("RESNORM_CFLAGS", ""))
        ldflags += shlex.split(os.environ.get("RESNORM_LDFLAGS", ""))
        for ext in self.extensions:
            ext.extra_compile_args = cflags
            ext.extra_link_args = ldflags
            ext.define_macros.append(("RESNORM_BUILD_FLAGS", '"%s"' % " ".join(cflags)))
        # An up-to-date build in build/ is reused (a second `pip install ".[extra]"` compiles
        # nothing), but only if it was made with these flags: RESNORM_OPENMP=0 or sanitizer
        # flags after a plain build must rebuild everything.
        stamp = os.path.join(self.build_temp, "resnorm-build-flags.txt")
        flags = "\n".join(cflags + ["--link"] + ldflags + [sys.version]) + "\n"
        if _read(stamp) != flags:
            self.force = True
        super().build_extensions()
        os.makedirs(self.build_temp, exist_ok=True)
        with open(stamp, "w") as f:
            f.write(flags)


def _read(path):
    """The text of a file, or None when there is none."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cython_outputs_current(module):
    """True when resnorm_c/<module>.c was generated after the last change of any Cython
    source of resnorm_c (.pyx, .pxd, .pxi): then it is compiled as it is.  Cython's own
    dependency check also counts NumPy's and Cython's declarations, which pip's build
    isolation installs afresh for every build, so each `pip install` regenerated every
    module and recompiled the whole core."""
    generated = f"resnorm_c/{module}.c"
    if not os.path.exists(generated):
        return False
    sources = [p for ext in ("pyx", "pxd", "pxi") for p in glob.glob(f"resnorm_c/*.{ext}")]
    return os.path.getmtime(generated) > max(os.path.getmtime(p) for p in sources)


def _extension(name, sources):
    # depends: a changed C header rebuilds the core (setuptools tracks only the sources)
    depends = sorted(glob.glob("resnorm_c/core/*.h")) if name == "core" else []
    return Extension(f"resnorm._{name}", sources, depends=depends,
                     include_dirs=["resnorm_c", "resnorm_c/core", numpy.get_include()],
                     define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])


def _cython(module):
    """The source of a Cython module: its generated C when that is current, else the .pyx
    (cythonize then generates the C)."""
    return f"resnorm_c/{module}.{'c' if _cython_outputs_current(module) else 'pyx'}"


primitives.generate()  # resnorm_c/core/primitives.h and resnorm_c/primitives.pxd
extensions = [_extension("core", [_cython("core")] + CORE_SOURCES)]
extensions += [_extension(name, [_cython(name)]) for name in KERNEL_MODULES]
# resnorm.torch's NumPy views of tensor memory (no torch headers: it sees addresses)
extensions += [Extension("resnorm.torch._storage", [_cython("torch_storage")],
                         include_dirs=[numpy.get_include()],
                         define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])]

setup(
    ext_modules=cythonize(extensions, compiler_directives=CYTHON_DIRECTIVES),
    cmdclass={"build_ext": BuildExt},
)
