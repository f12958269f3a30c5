"""Every script of examples/ runs on its own, in a fresh interpreter, and exits with status 0;
each says what it shows in its module docstring, stays short, and is shown in
docs/examples.md."""
import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# examples may use optional packages: CI runs these again with them hidden (conftest.py)
pytestmark = pytest.mark.extras
# Parametrized over the folder itself, so that a new script is run without being listed.
SCRIPTS = sorted((ROOT / "examples").glob("*.py"))
MAX_LINES = 40
TIMEOUT_S = 120


def test_the_examples_are_found():
    # a moved or emptied folder must not pass by running nothing
    assert len(SCRIPTS) >= 3, SCRIPTS


def _missing_imports(script):
    """The top-level modules a script imports that are not installed (torch and
    transformers are optional: their examples run where they are)."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    names = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for a in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_example_runs(script, tmp_path):
    missing = _missing_imports(script)
    if missing:
        pytest.skip(f"{script.name} needs {', '.join(missing)}, not installed")
    # a scratch directory: a script must not depend on being run from the checkout (the
    # package is found where it is installed, or through PYTHONPATH made absolute)
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(
        os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip(), "an example shows what it did"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_example_is_short_and_says_what_it_shows(script):
    text = script.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES, f"{script.name}: more than {MAX_LINES} lines"
    docstring = ast.get_docstring(ast.parse(text))
    assert docstring and len(docstring.split()) >= 8, f"{script.name}: no module docstring"


def test_every_example_is_on_the_examples_page():
    page = (ROOT / "docs" / "examples.md").read_text(encoding="utf-8")
    missing = [s.name for s in SCRIPTS if f"{{literalinclude}} ../examples/{s.name}" not in page]
    assert missing == []
