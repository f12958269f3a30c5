#!/usr/bin/env bash
# Builds resnorm beyond this machine's default toolchain and runs the kernel tests there:
#
#   tools/check_platforms.sh clang      the build with clang instead of gcc (OpenMP from
#                                       LLVM's libomp), then the kernel tests
#   tools/check_platforms.sh aarch64    a Debian arm64 root run under QEMU user-mode
#                                       emulation: its own gcc builds resnorm (the portable
#                                       vector level), then a subset of the kernel tests
#   tools/check_platforms.sh            both
#
# On demand, not in CI: the clang run takes about as long as a normal build plus the tests
# (14 minutes on a busy 2-core machine).  Emulation is slow: on the same machine the arm64
# root took 75 minutes to install the first time (it is kept for the next run, in
# $RESNORM_ARM64_ROOT), the emulated build 40 minutes, and the test subset below more.
# Needs root and Debian's packages: clang libomp-dev for clang; debootstrap
# qemu-user-static for aarch64 (the script installs them with apt-get when missing).
# Extra pytest arguments: RESNORM_PLATFORM_TESTS="tests/test_dropout.py -x".
# Prints one PASS or FAIL line per platform; exits 0 only when every platform passed.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python=${PYTHON:-python3}
arm64_root=${RESNORM_ARM64_ROOT:-/var/cache/resnorm-arm64/trixie}
suite=${RESNORM_ARM64_SUITE:-trixie}   # Debian 13: Python 3.13, NumPy 2, Cython 3
work="$(mktemp -d)"
mounts=()
cleanup() {
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT

# The kernels and everything they are checked with; the rest of the suite (torch, demos,
# benchmark, memory soak) does not depend on the compiler or the CPU.
kernel_tests=(tests/test_runtime.py tests/test_norms_reference.py tests/test_norms_gradients.py
    tests/test_norms_numerics.py tests/test_norms_threads.py tests/test_extreme_numerics.py
    tests/test_dropout.py tests/test_residual_add_norm.py tests/test_residual_scaled_gated.py
    tests/test_residual_levels.py tests/test_fast_path.py tests/test_nn_kernels.py)
# Under emulation every test runs about 10-30 times slower: the references and the
# threads/levels checks of the norms, dropout and fused residual kernels.
emulated_tests=(tests/test_runtime.py tests/test_norms_reference.py tests/test_norms_threads.py
    tests/test_dropout.py tests/test_residual_add_norm.py tests/test_nn_kernels.py)
# shellcheck disable=SC2206
extra=(${RESNORM_PLATFORM_TESTS:-})

need_packages() {  # apt-get install those of these Debian packages that are missing
    local missing=() p
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "platforms: installing ${missing[*]} (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}

# A digest of kernel outputs on fixed inputs: the same on every platform, as the kernels'
# reductions have one fixed lane structure and no FMA contraction on any of them.
digest() { "$@" "$root/tools/platform_digest.py"; }

check_clang() {
    need_packages clang libomp-dev || return 1
    local dest="$work/clang" start=$SECONDS
    echo "platforms: clang: building a copy with $(clang --version | head -n 1)"
    if ! CC=clang CXX=clang++ "$root/tools/build_copy.sh" "$dest"; then
        echo "platforms: FAIL clang: the build failed (log above)"
        return 1
    fi
    echo "platforms: clang: built in $((SECONDS - start)) s; compiler warnings:"
    grep -E "warning:" "$dest/build.log" | sort | uniq -c | sort -rn | head -n 20
    local status=0
    (cd "$dest" && PYTHONPATH="$dest/src" "$python" -c \
        "import resnorm; print('platforms: clang: openmp', resnorm.openmp_enabled(), 'level', resnorm.simd_level())" \
        && PYTHONPATH="$dest/src" "$python" -m pytest -q -p no:cacheprovider \
            "${extra[@]:-${kernel_tests[@]}}") || status=$?
    local ours theirs
    ours=$(PYTHONPATH="$dest/src" digest "$python") || status=1
    theirs=$(PYTHONPATH="$root/src" digest "$python" 2>/dev/null) || theirs=""
    compare_digest clang "$ours" "$theirs" || status=1
    [ $status -eq 0 ] && echo "platforms: PASS clang" || echo "platforms: FAIL clang"
    return $status
}

compare_digest() {  # name, this platform's digest, the in-place build's (may be empty)
    if [ -z "$3" ]; then
        printf '%s\n' "$2"
        echo "platforms: $1: no in-place build to compare the kernel digest with (build it first)"
    elif [ "$2" != "$3" ]; then
        echo "platforms: $1: kernel outputs differ from this machine's build (< here, > $1):"
        diff <(printf '%s\n' "$3") <(printf '%s\n' "$2") | grep '^[<>]'
        return 1
    else
        echo "platforms: $1: kernel outputs bitwise identical to this machine's build" \
            "(tools/platform_digest.py)"
    fi
}

register_qemu() {  # the aarch64 interpreter for binfmt_misc, so the chroot's programs run
    [ -e /proc/sys/fs/binfmt_misc/register ] \
        || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || return 1
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && return 0
    # F: the kernel opens the interpreter now, so it need not exist inside the chroot.
    cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
}

make_arm64_root() {
    [ -x "$arm64_root/usr/bin/python3" ] && [ -e "$arm64_root/.resnorm-ready" ] && return 0
    local mirror
    mirror=${RESNORM_DEBIAN_MIRROR:-$(awk '/^URIs:/ { print $2; exit }
        /^deb / { print $2; exit }' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
        2>/dev/null)}
    echo "platforms: aarch64: installing a Debian $suite arm64 root in $arm64_root (debootstrap)"
    rm -rf "$arm64_root" && mkdir -p "$arm64_root" || return 1
    debootstrap --arch=arm64 --variant=minbase \
        --include=python3,python3-dev,python3-numpy,python3-scipy,python3-pytest,python3-hypothesis,python3-threadpoolctl,cython3,python3-setuptools,gcc,libc6-dev \
        "$suite" "$arm64_root" "$mirror" > "$work/debootstrap.log" 2>&1 || {
        tail -n 30 "$work/debootstrap.log"
        echo "platforms: aarch64: debootstrap failed (log above)"
        return 1
    }
    touch "$arm64_root/.resnorm-ready"
}

check_aarch64() {
    need_packages debootstrap qemu-user-static || return 1
    register_qemu || { echo "platforms: FAIL aarch64: cannot register qemu-aarch64 (binfmt_misc)"; return 1; }
    make_arm64_root || { echo "platforms: FAIL aarch64: no arm64 root"; return 1; }
    mount -t proc proc "$arm64_root/proc" && mounts+=("$arm64_root/proc")
    mount --bind /dev "$arm64_root/dev" && mounts+=("$arm64_root/dev")
    # tools/build_copy.sh runs "$PYTHON setup.py ..." in the copy: this runs the root's
    # python3 there, inside the chroot.
    local build="$arm64_root/tmp/resnorm-build" start=$SECONDS
    rm -rf "$build"
    cat > "$work/python-arm64" <<EOF
#!/bin/sh
exec chroot "$arm64_root" /bin/sh -c 'cd "\$1" && shift && exec python3 "\$@"' sh "\${PWD#$arm64_root}" "\$@"
EOF
    chmod +x "$work/python-arm64"
    echo "platforms: aarch64: $(chroot "$arm64_root" uname -m), $(chroot "$arm64_root" gcc --version | head -n 1), $(chroot "$arm64_root" python3 -c 'import sys, numpy; print("Python", sys.version.split()[0], "NumPy", numpy.__version__)')"
    echo "platforms: aarch64: building (emulated: this takes a while)"
    if ! PYTHON="$work/python-arm64" "$root/tools/build_copy.sh" "$build"; then
        echo "platforms: FAIL aarch64: the build failed (log above; full log: $build/build.log)"
        return 1
    fi
    echo "platforms: aarch64: built in $((SECONDS - start)) s; compiler warnings:"
    grep -E "warning:" "$build/build.log" | sort | uniq -c | sort -rn | head -n 20
    local status=0 tests
    tests="${extra[*]:-${emulated_tests[*]}}"
    (cd "$build" && PYTHONPATH=src "$work/python-arm64" -c \
        "import resnorm; print('platforms: aarch64: openmp', resnorm.openmp_enabled(), 'level', resnorm.simd_level())" \
        && PYTHONPATH=src "$work/python-arm64" -m pytest -q -p no:cacheprovider --continue-on-collection-errors $tests) \
        || status=$?
    local ours theirs
    ours=$(cd "$build" && PYTHONPATH=src "$work/python-arm64" tools/platform_digest.py) || status=1
    theirs=$(PYTHONPATH="$root/src" digest "$python" 2>/dev/null) || theirs=""
    compare_digest aarch64 "$ours" "$theirs" || status=1
    [ $status -eq 0 ] && echo "platforms: PASS aarch64" || echo "platforms: FAIL aarch64"
    return $status
}

status=0
case "${1:-all}" in
    clang) check_clang || status=1 ;;
    aarch64) check_aarch64 || status=1 ;;
    all) check_clang || status=1; check_aarch64 || status=1 ;;
    *) echo "usage: tools/check_platforms.sh [clang|aarch64|all]" >&2; exit 2 ;;
esac
exit $status
