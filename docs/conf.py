"""Sphinx configuration of resnorm's documentation site.

Build it with tools/build_docs.sh (warnings are errors).  The pages are the Markdown files
of docs/ as they are (MyST); the API reference is generated from the numpydoc docstrings
of the installed resnorm, so the package must be importable, resnorm.torch included
(torch must be installed: pip install torch --index-url https://download.pytorch.org/whl/cpu).
"""
import importlib.util
import re

from docutils import nodes
from sphinx.transforms import SphinxTransform

# Fail with the fix instead of a cryptic autodoc import warning later on.
for _package in ("resnorm", "torch"):
    if importlib.util.find_spec(_package) is None:
        raise RuntimeError(f"the API reference documents the installed resnorm, resnorm.torch "
                           f"included, and {_package} is not installed: pip install . "
                           f"(resnorm), then the CPU wheel of torch: pip install torch "
                           f"--index-url https://download.pytorch.org/whl/cpu")

import resnorm  # noqa: E402

project = "resnorm"
author = "resnorm contributors"
copyright = "resnorm contributors"
version = release = resnorm.__version__

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# docs/img holds the figures the pages show (copied where a page shows one), not pages
exclude_patterns = ["_build", "img"]
templates_path = ["_templates"]

# `name` in a docstring links to that object when it is documented, else shows as code
# (as in NumPy's documentation)
default_role = "autolink"

# the pages link to each other's sections by their GitHub anchors (rms_norm.md#options-...)
myst_heading_anchors = 3

# The docstrings write every type in their numpydoc sections: signatures without the
# annotations stay readable.  numpydoc's per-class tables of members would link to a
# generated page per member; the members are documented under their class instead.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
# A method without a docstring of its own is left out rather than shown with its base
# class's: for resnorm.torch that text is torch's (about torch.autograd.Function in
# general), and resnorm.nn's modules share the forward/backward of nn.Module, documented
# there once.
autodoc_inherit_docstrings = False
numpydoc_show_class_members = False

html_theme = "pydata_sphinx_theme"
html_title = f"resnorm {release}"
html_theme_options = {
    # the root page groups the pages under captions, which the theme's header and section
    # sidebar do not show: the sidebar shows the whole table of contents instead
    "navbar_center": [],
    "show_toc_level": 2,
}
html_sidebars = {"**": ["sidebar-site-toc.html"]}
html_show_sourcelink = False


# tools/doc_numbers.py marks each number it regenerates in the pages with HTML comments,
# <!--n:key-->value<!--/n-->.  In running text a browser hides them; inside a code span
# (the demos' and explain mode's commands) Markdown shows them as text, so the site
# drops them there.
_NUMBER_MARKER = re.compile(r"<!--n:[\w.-]+-->|<!--/n-->")


class _DropNumberMarkers(SphinxTransform):
    default_priority = 500

    def apply(self, **kwargs):
        for literal in self.document.findall(nodes.literal):
            text = literal.astext()
            if _NUMBER_MARKER.search(text):
                literal[:] = [nodes.Text(_NUMBER_MARKER.sub("", text))]


def setup(app):
    app.add_transform(_DropNumberMarkers)
