#!/usr/bin/env bash
# Copies this checkout (tracked and untracked files, not ignored ones: no build products)
# to DEST and builds the extension there in place, with RESNORM_CFLAGS / RESNORM_LDFLAGS
# from the environment.  The checkout's own build is left alone.
#
#   tools/build_copy.sh DEST        then run with PYTHONPATH=DEST/src
#
# Used by tools/sanitize.sh and tools/valgrind.sh.  The build log is DEST/build.log.
set -euo pipefail
dest=${1:?usage: tools/build_copy.sh DEST}
root="$(cd "$(dirname "$0")/.." && pwd)"
python=${PYTHON:-python3}

mkdir -p "$dest"
git -C "$root" ls-files -z --cached --others --exclude-standard \
    | (cd "$root" && tar --null -T - -cf -) | tar -xf - -C "$dest"
if ! (cd "$dest" && "$python" setup.py build_ext --inplace >build.log 2>&1); then
    tail -n 30 "$dest/build.log" >&2
    echo "build_copy: the build failed (log: $dest/build.log)" >&2
    exit 1
fi
