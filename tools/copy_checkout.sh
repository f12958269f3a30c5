#!/usr/bin/env bash
# Copies this checkout's tracked and untracked files (not ignored ones: no build products,
# no generated C) to DEST, which it creates.  The checkout itself is only read, so a copy
# can be built while the checkout is in use (CI builds copies while a test suite runs).
#
#   tools/copy_checkout.sh DEST
set -euo pipefail
dest=${1:?usage: tools/copy_checkout.sh DEST}
root="$(cd "$(dirname "$0")/.." && pwd)"

mkdir -p "$dest"
git -C "$root" ls-files -z --cached --others --exclude-standard \
    | (cd "$root" && tar --null -T - -cf -) | tar -xf - -C "$dest"
