#!/usr/bin/env bash
# Builds the source distribution and a wheel from it with `python -m build` (PyPA's build
# front end, installed here with pip into a throwaway venv), installs the wheel into a
# fresh venv and runs tools/wheel_smoke.py there, from outside the checkout, so that only
# the installed package can be imported.  Takes a few minutes (one compile of the core).
# The sdist is made from a copy of the checkout (tools/copy_checkout.sh), so no build
# product of the checkout can slip into it, and the checkout is not written to (CI runs
# this beside the test suite, whose install builds in the checkout).
#
#   tools/check_wheel.sh            dist/ is replaced by the new sdist and wheel (ignored by git)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python=${PYTHON:-python3}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS

"$python" -m venv "$work/build-venv"
"$work/build-venv/bin/pip" install --quiet build
echo "check_wheel: building the sdist and the wheel (python -m build)"
rm -rf "$root/dist"
"$root/tools/copy_checkout.sh" "$work/src-copy"
if ! "$work/build-venv/bin/python" -m build --outdir "$root/dist" "$work/src-copy" \
        > "$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log" >&2
    echo "check_wheel: python -m build failed" >&2
    exit 1
fi
wheel=$(ls "$root"/dist/resnorm-*.whl)
echo "check_wheel: built $(basename "$wheel") and $(cd "$root/dist" && ls resnorm-*.tar.gz) in $((SECONDS - start)) s"

"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet "$wheel"
(cd "$work" && "$work/venv/bin/python" "$root/tools/wheel_smoke.py")
echo "check_wheel: done in $((SECONDS - start)) s"
