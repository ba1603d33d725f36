"""Sphinx configuration for the torchrl data module docs.

Build with ``sphinx-build -W -b html docs/source docs/build/html`` (warnings are errors in CI). The repository
root goes on ``sys.path`` so the docs document the checkout itself, installed or not. No extension here
touches the network (no intersphinx): CI builds offline.
"""

from __future__ import annotations

import os
import sys

_REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, _REPO_ROOT)

import torchrl  # noqa: E402  (needs the path above)

project = "torchrl"
author = "torchrl contributors"
copyright = "torchrl contributors"
release = torchrl.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
]

# Google-style docstrings ("Args:", "Keyword Args:", "Examples:").
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# Base classes list their overridable class attributes under "Class attributes:" (rendered like "Args:").
napoleon_custom_sections = [("Class attributes", "params_style")]

autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
}
autodoc_member_order = "bysource"
# Keep signatures readable: defaults as written, annotations in the signature.
autodoc_preserve_defaults = True
autodoc_typehints = "signature"

# `sphinx-build -b doctest` runs the `>>>` blocks of the pages and of the autodoc'd docstrings.
doctest_global_setup = "import torch"

templates_path: list[str] = []
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []
html_title = f"torchrl {release}"
