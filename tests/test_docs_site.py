"""The documentation site builds with every warning an error (tools/build_docs.sh), its API
reference documents every public name, and the gallery shows every committed figure.

The build needs sphinx, numpydoc, myst-parser and pydata-sphinx-theme (docs/requirements.txt)
and torch (the API reference of resnorm.torch): without one of them it is skipped, saying
which.  It takes about 20 s, so it carries the `docs` mark: `pytest -m "not docs"` leaves
it out.
"""
import inspect
import os
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

import resnorm
import resnorm.accuracy
import resnorm.demos
import resnorm.nn
from resnorm import reference

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parent.parent
BUILD_NEEDS = {"sphinx": "docs/requirements.txt", "numpydoc": "docs/requirements.txt",
               "myst_parser": "docs/requirements.txt",
               "pydata_sphinx_theme": "docs/requirements.txt",
               "torch": "the API reference of resnorm.torch"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site's directory (built once for the tests of this file)."""
    for module, why in BUILD_NEEDS.items():
        pytest.importorskip(module, reason=f"the docs build needs {module} ({why})")
    out = tmp_path_factory.mktemp("docs") / "html"
    proc = subprocess.run(["bash", str(ROOT / "tools" / "build_docs.sh"), str(out)],
                          env=dict(os.environ, PYTHON=sys.executable), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"the docs build failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_the_site_builds_with_warnings_as_errors(site):
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")}
    assert pages and all((site / f"{page}.html").is_file() for page in pages)
    assert (site / "api" / "resnorm.html").is_file()


def test_the_api_reference_documents_every_public_name(site):
    from sphinx.util.inventory import InventoryFile

    import resnorm.torch
    with open(site / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", posixpath.join)
    documented = {name for objects in inventory.values() for name in objects}
    public = [f"{module.__name__}.{name}" for module in
              (resnorm, resnorm.nn, resnorm.torch, resnorm.accuracy) for name in module.__all__]
    public += [f"resnorm.reference.{name}" for name, obj in vars(reference).items()
               if not name.startswith("_") and inspect.isfunction(obj)
               and obj.__module__ == reference.__name__]
    assert len(public) > 100
    assert [name for name in public if name not in documented] == []


def test_the_gallery_shows_every_figure_and_every_demo():
    gallery = (ROOT / "docs" / "gallery.md").read_text(encoding="utf-8")
    figures = sorted(p.name for p in (ROOT / "docs" / "img").glob("*.png"))
    assert figures and [f for f in figures if f"](img/{f})" not in gallery] == []
    assert [d for d in resnorm.demos.DEMOS
            if f"`python -m resnorm demo {d}`" not in gallery] == []
