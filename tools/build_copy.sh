#!/usr/bin/env bash
# Copies this checkout to DEST (tools/copy_checkout.sh) and builds the extension there in
# place, with RESNORM_OPT / RESNORM_CFLAGS / RESNORM_LDFLAGS from the environment.  The
# checkout's own build is left alone.
#
#   tools/build_copy.sh DEST        then run with PYTHONPATH=DEST/src
#
# Used by tools/sanitize.sh and tools/valgrind.sh.  The build log is DEST/build.log.
set -euo pipefail
dest=${1:?usage: tools/build_copy.sh DEST}
root="$(cd "$(dirname "$0")/.." && pwd)"
python=${PYTHON:-python3}

"$root/tools/copy_checkout.sh" "$dest"
if ! (cd "$dest" && "$python" setup.py build_ext --inplace >build.log 2>&1); then
    tail -n 30 "$dest/build.log" >&2
    echo "build_copy: the build failed (log: $dest/build.log)" >&2
    exit 1
fi
