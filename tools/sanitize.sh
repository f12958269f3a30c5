#!/usr/bin/env bash
# The test suite against a build of the extension with AddressSanitizer and
# UndefinedBehaviorSanitizer (out-of-bounds and use-after-free accesses, signed overflow,
# misaligned or null pointers...).  The build goes into a temporary copy of the checkout;
# the in-place build is left alone.  Prints CLEAN or DIRTY; exits 0 only when clean.
#
#   tools/sanitize.sh                    the whole suite (tests/)
#   tools/sanitize.sh tests/test_memory.py -x      any pytest arguments instead
#   SANITIZE_COPY=DIR tools/sanitize.sh --build-only    only the build, into DIR
#   SANITIZE_COPY=DIR tools/sanitize.sh ARGS...         the suite against DIR's build
#
# With SANITIZE_COPY, the instrumented copy lives in DIR (kept) rather than in a temporary
# folder, and a copy already built there (DIR/.sanitize-built) is reused: CI builds it
# beside the plain suite, on the core that suite leaves free, and runs it later.
#
# Needs GCC (or set CC and RESNORM_ASAN_LIB for clang) with libasan / libubsan.
# CPython itself is not instrumented: libasan is LD_PRELOADed, CPython's own allocations
# go through malloc (PYTHONMALLOC=malloc) so that ASan sees Python objects too, and leak
# detection is off (CPython does not free everything at exit).  A report from any
# process, including the suite's subprocesses, counts: reports go to files that are
# checked at the end.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python=${PYTHON:-python3}
cc=${CC:-cc}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS

copy=${SANITIZE_COPY:-$work/src-copy}
# RN_CHECKED_PREFETCH: the kernels read each line they would prefetch (core/vec.h), so a
# prefetch past the end of an array is reported too
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
flags="$flags -DRN_CHECKED_PREFETCH"
if [ -e "$copy/.sanitize-built" ]; then
    echo "sanitize: using the build in $copy"
else
    # -O1: the level AddressSanitizer's documentation asks for.  Every load and store of
    # the source is still instrumented (a higher level can only remove some), and
    # instrumenting the large generated C of the Cython modules at -O3 took most of this
    # stage's time.
    echo "sanitize: building with -O1 $flags into $copy"
    RESNORM_OPT=-O1 RESNORM_CFLAGS="$flags" RESNORM_LDFLAGS="-fsanitize=address,undefined" \
        "$root/tools/build_copy.sh" "$copy"
    touch "$copy/.sanitize-built"
    echo "sanitize: built in $((SECONDS - start)) s"
fi
if [ "${1:-}" = "--build-only" ]; then
    exit 0
fi

asan_lib=${RESNORM_ASAN_LIB:-$("$cc" -print-file-name=libasan.so)}
if [ ! -e "$asan_lib" ]; then
    echo "sanitize: libasan not found ($asan_lib); set RESNORM_ASAN_LIB" >&2
    exit 2
fi
# libstdc++ goes in right after libasan: loaded later (by a C++ extension such as
# matplotlib's ft2font or torch), ASan's __cxa_throw interceptor finds no real function
# and the first C++ exception aborts the process ("CHECK failed: ... real___cxa_throw").
cxx_lib=$("$cc" -print-file-name=libstdc++.so.6)
preload="$asan_lib"
if [ -e "$cxx_lib" ]; then
    preload="$asan_lib $cxx_lib"
fi
mkdir "$work/reports"
status=0
(
    cd "$copy"
    export LD_PRELOAD="$preload" PYTHONMALLOC=malloc PYTHONPATH="$copy/src"
    export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:log_path=$work/reports/asan"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$work/reports/ubsan"
    # --capture=sys: UBSan writes its reports to stderr (not to log_path when it runs in
    # ASan's runtime), and pytest's default fd-level capture would swallow them with the
    # process it halts
    "$python" -m pytest -q -p no:cacheprovider --capture=sys "${@:-tests}"
) || status=$?

# Canaries: the sanitizers must catch a real error, else a clean run means nothing.
# canary NAME SCRIPT WHAT runs SCRIPT (in tools), which must be reported as a
# heap-buffer-overflow.
canary() {
    mkdir "$work/$1"
    (
        cd "$copy"
        export LD_PRELOAD="$preload" PYTHONMALLOC=malloc PYTHONPATH="$copy/src"
        export ASAN_OPTIONS="detect_leaks=0:log_path=$work/$1/asan"
        "$python" "tools/$2"
    ) >/dev/null 2>&1 && canary_status=0 || canary_status=$?
    if [ "$canary_status" -eq 0 ] || ! grep -qs "heap-buffer-overflow" "$work/$1"/*; then
        echo "sanitize: the canary $3 was NOT reported: the check is not working" >&2
        status=3
    else
        echo "sanitize: canary $3 reported as expected"
    fi
}
# the core writing past a 1-byte block
canary canary overflow_canary.py "overflow"
# a prefetch past the end of an array (RN_CHECKED_PREFETCH, above)
canary prefetch-canary prefetch_canary.py "prefetch past an array"

reports=$(find "$work/reports" -type f | wc -l)
if [ "$reports" -gt 0 ]; then
    for f in "$work"/reports/*; do echo "---- $f"; head -n 60 "$f"; done
fi
elapsed=$((SECONDS - start))
if [ "$status" -eq 0 ] && [ "$reports" -eq 0 ]; then
    echo "sanitize: CLEAN (pytest passed, no sanitizer report) in ${elapsed} s"
else
    echo "sanitize: DIRTY (pytest exit status $status, $reports sanitizer report files) in ${elapsed} s"
    exit 1
fi
