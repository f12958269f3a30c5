#!/usr/bin/env bash
# Builds the documentation site (Sphinx: the pages of docs/ and the API reference from the
# installed resnorm's docstrings) with every warning an error, and prints where it went.
#
#   tools/build_docs.sh [OUTDIR]     (default: _build/html in docs/, which git ignores)
#
# Needs: resnorm installed (pip install .), torch (its CPU wheel: pip install torch
# --index-url https://download.pytorch.org/whl/cpu), and pip install -r docs/requirements.txt.
# --keep-going: one run reports every warning, not only the first.  -E: every page is read
# again, so a docstring changed in the installed package is never served from the cache.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/docs/_build/html}"
python=${PYTHON:-python3}

"$python" -m sphinx -W --keep-going -E -q -b html "$root/docs" "$out"
echo "docs: built $out/index.html"
