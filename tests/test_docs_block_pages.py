"""The Python blocks of the block-type pages run on their own (each in a fresh process)."""
import pathlib
import re
import subprocess
import sys

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
PAGES = ["parallel_residual.md", "deepnorm.md", "sandwich_norm.md"]
BLOCKS = [(page, i, code) for page in PAGES
          for i, code in enumerate(re.findall(r"```python\n(.*?)```",
                                              (DOCS / page).read_text(), re.S))]


@pytest.mark.parametrize("page, i, code", BLOCKS, ids=[f"{p}:{i}" for p, i, _ in BLOCKS])
def test_python_block_runs(page, i, code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr


def test_every_page_has_an_example_and_is_linked_from_blocks_md():
    assert {page for page, _, _ in BLOCKS} == set(PAGES)
    index = (DOCS / "blocks.md").read_text()
    assert all(f"]({page})" in index for page in PAGES)
