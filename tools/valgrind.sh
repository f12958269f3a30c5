#!/usr/bin/env bash
# valgrind memcheck over tools/valgrind_smoke.py (every public kernel function, ~11,000
# calls per part), against a build of the extension with debug info in a temporary copy of
# the checkout, at the default SIMD level (valgrind hides AVX-512: avx2 on x86-64) with the
# smoke's thread-count part and at sse2 with its layouts part (the thread splits and the
# layout copies do not depend on the level; memcheck runs Python ~100 times slower).
# Prints CLEAN or DIRTY; exits 0 only when clean.
#
#   tools/valgrind.sh
#
# Every memcheck error (invalid read / write / free, use of an uninitialised value) and
# every definitely-lost leak record is sorted by tools/valgrind_errors.py: involving
# resnorm (a frame or an allocation origin in the extension), known noise of CPython 3.11
# and ld.so (and leaks not allocated through resnorm), or unexplained.  Clean means none
# of the first and none of the last.  A
# canary (tools/overflow_canary.py: the core writing past a 1-byte block) must be reported, or
# the run is DIRTY.  PYTHONMALLOC=malloc: pymalloc would hide Python objects from memcheck.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python=${PYTHON:-python3}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS
command -v valgrind >/dev/null || { echo "valgrind: not installed" >&2; exit 2; }

# -O1: valgrind's manual recommends it for memcheck (higher levels can raise false
# uninitialised-value reports), and it halves the build (93 s instead of 191 s here); the
# core's explicit vector loads and stores are the same.
echo "valgrind: building with -g -O1 into $work"
RESNORM_OPT=-O1 RESNORM_CFLAGS="-g" "$root/tools/build_copy.sh" "$work/src-copy"
echo "valgrind: built in $((SECONDS - start)) s"

# OMP_WAIT_POLICY=passive: memcheck runs one thread at a time, so an OpenMP thread spinning
# for work only takes turns from the one that has it (the smoke ran 25% faster passive).
memcheck() {  # memcheck NAME ARGS...: python ARGS under memcheck in the built copy
    local name=$1 log="$work/$1.log"
    shift
    (cd "$work/src-copy" && PYTHONMALLOC=malloc OMP_WAIT_POLICY=passive \
        PYTHONPATH="$work/src-copy/src" \
        timeout 3600 valgrind --tool=memcheck --track-origins=yes --leak-check=full \
        --show-leak-kinds=definite --num-callers=30 --log-file="$log" "$python" "$@") \
        >"$work/$name.out" 2>&1
}
sort_reports() {  # sort_reports NAME: "<ours> <known> <unexplained>"; details to NAME.txt
    "$python" "$root/tools/valgrind_errors.py" "$work/$1.log" 2>"$work/$1.txt"
}

# The three runs at once: memcheck runs a program on one host thread, and there are two
# levels to check (the canary is short).  Each writes NAME.log, NAME.out and NAME.rc.
t=$SECONDS
run() {  # run NAME RESNORM_CPU ARGS...
    local name=$1 level=$2
    shift 2
    if RESNORM_CPU=$level memcheck "$name" "$@"; then echo 0; else echo 1; fi >"$work/$name.rc"
}
run canary "" tools/overflow_canary.py &
run default "" tools/valgrind_smoke.py --part=threads &
run sse2 sse2 tools/valgrind_smoke.py --part=layouts &
wait
echo "valgrind: memcheck ran the canary and both levels in $((SECONDS - t)) s"

status=0
read -r ours _ _ < <(sort_reports canary)
if [ "$ours" -gt 0 ]; then
    echo "valgrind [canary]: the deliberate overflow is reported"
else
    echo "valgrind [canary]: the deliberate overflow was NOT reported" >&2
    status=1
fi
for level in default sse2; do
    if [ "$(cat "$work/$level.rc")" -ne 0 ]; then
        echo "valgrind [$level]: the smoke script failed" >&2
        status=1
    fi
    tail -n 1 "$work/$level.out"
    read -r ours known unexplained < <(sort_reports "$level")
    echo "valgrind [$level]: $ours reports involving resnorm, $unexplained unexplained," \
         "$known known CPython/ld.so"
    if [ "$ours" -ne 0 ] || [ "$unexplained" -ne 0 ]; then
        status=1
        head -n 150 "$work/$level.txt"
    fi
done
elapsed=$((SECONDS - start))
if [ "$status" -eq 0 ]; then
    echo "valgrind: CLEAN in ${elapsed} s"
else
    echo "valgrind: DIRTY in ${elapsed} s"
    exit 1
fi
