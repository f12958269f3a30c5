"""Every ```python block of README.md and docs/*.md runs on its own, in a fresh interpreter,
exactly as written (as a reader copies it: a block indented under a list item would not).

A block that imports an optional package (torch, matplotlib, ...) is skipped, with that
reason, when the package is not installed; any other failure fails the test, naming the
file and the line of the block.  The block is written to a file named after the document,
padded so that a traceback's line numbers are the document's line numbers.
"""
import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXTRA_PACKAGES, TORCH_NAMES

ROOT = Path(__file__).resolve().parent.parent
# examples may use optional packages: CI runs these again with them hidden (conftest.py)
pytestmark = pytest.mark.extras
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Packages a documentation example may use that resnorm does not require.
OPTIONAL = EXTRA_PACKAGES | TORCH_NAMES
TIMEOUT_S = 180  # generous on a loaded machine; the examples run in seconds

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)")


def python_blocks(path):
    """(first line of the code, 1-based; the code as written) of every python block in
    path."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m["fence"]
        close = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{%d,}[ \t]*$" % len(fence))
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if m["info"].lower() in ("python", "py", "python3"):
            blocks.append((i + 2, "\n".join(lines[i + 1:j]) + "\n"))
        i = j + 1
    return blocks


def _cases():
    for path in DOCUMENTS:
        name = path.relative_to(ROOT).as_posix()
        for line, code in python_blocks(path):
            yield pytest.param(name, line, code, id=f"{name}:{line}")


def imported_packages(code):
    """Top-level names of the packages a block imports (resnorm.torch counts as torch, and
    bfloat16 arrays or tensors, which resnorm views as ml_dtypes' arrays, as ml_dtypes)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    tops = {n.split(".")[0] for n in names}
    if any(n == "resnorm.torch" or n.startswith("resnorm.torch.") for n in names):
        tops.add("torch")
    if "bfloat16" in code:
        tops.add("ml_dtypes")
    return tops


def _absolute_pythonpath(env):
    """PYTHONPATH as absolute paths: the blocks run in a scratch directory."""
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(os.path.abspath(p) for p in parts)


@pytest.mark.parametrize("name, line, code", list(_cases()))
def test_doc_block_runs(name, line, code, tmp_path):
    try:
        needed = imported_packages(code)
    except SyntaxError as err:
        needed = err
    if isinstance(needed, SyntaxError):
        pytest.fail(f"{name}:{line}: the python block is not valid Python (line "
                    f"{line - 1 + (needed.lineno or 1)}: {needed.msg})", pytrace=False)
    missing = sorted(p for p in needed & OPTIONAL if importlib.util.find_spec(p) is None)
    if missing:
        pytest.skip(f"{name}:{line} needs {', '.join(missing)}, which is not installed")

    script = tmp_path / name
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("\n" * (line - 1) + code, encoding="utf-8")
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = _absolute_pythonpath(os.environ)
    try:
        proc = subprocess.run([sys.executable, name], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}:{line}: the python block did not finish in {TIMEOUT_S} s "
                    "(documentation examples must run in seconds)", pytrace=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        pytest.fail(f"{name}:{line}: the python block exited with status {proc.returncode} "
                    f"when run on its own:\n{tail}", pytrace=False)


def test_blocks_are_found():
    """The extractor sees the blocks (a broken parser must not pass by finding none)."""
    readme = python_blocks(ROOT / "README.md")
    assert readme, "no python block found in README.md"
    text = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    for line, code in readme:
        assert text[line - 2].strip() == "```python"
        assert code.splitlines()[0] == text[line - 1].strip()


def test_blocks_are_taken_as_written(tmp_path):
    # an indented block is kept indented, so that it fails to run as it would for a reader
    doc = tmp_path / "x.md"
    doc.write_text("* item\n\n  ```python\n  import os\n  if os:\n      pass\n  ```\n"
                   "```text\n```python inside text is not code\n```\n")
    assert python_blocks(doc) == [(4, "  import os\n  if os:\n      pass\n")]


def test_the_thread_pool_example_runs_as_written():
    doc = ROOT / "docs" / "reliability.md"
    text = doc.read_text(encoding="utf-8").splitlines()
    (line, code), = [b for b in python_blocks(doc) if "ThreadPoolExecutor" in b[1]]
    assert text[line - 2] == "```python" and code.splitlines()[0] == text[line - 1]
    compile(code, str(doc), "exec")
