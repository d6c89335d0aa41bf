"""Sphinx configuration of the mi_core documentation site (``make docs``).

The API and CLI reference pages are generated at build time by ``_ext/mi_core_docs.py``
into ``reference/`` (ignored by git). The site loads nothing from the network: the theme's
assets are copied into ``_build/html/_static``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))
# importing mi_core's subpackages must not go online or pick up a terminal's width
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import mi_core  # noqa: E402

project = "mi_core"
author = "mi_core contributors"
copyright = "mi_core contributors"  # noqa: A001
release = version = mi_core.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "myst_parser",
    "mi_core_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

# autodoc: signatures with their type hints, members in source order
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_default_options = {"undoc-members": False}
add_module_names = False
python_use_unqualified_type_names = True
# The docstrings' cross-references often name private helpers or use module-relative names
# (:func:`apply` inside mi_core.interventions); those render as code without a link.
nitpicky = False

myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

html_theme = "furo"
html_title = f"mi_core {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False
pygments_style = "sphinx"
pygments_dark_style = "monokai"
