"""Sphinx configuration of the mi_core documentation site (``make docs``).

The API and CLI reference pages are generated at build time by ``_ext/mi_core_docs.py``
into ``reference/`` (ignored by git), and the notebooks are copied into ``tutorials/`` (ignored
by git), which nbsphinx renders as the Tutorials pages. The notebooks are stored without
outputs and executed when the site is built: ``MI_CORE_DOCS_EXECUTE=1`` (``make docs`` sets it)
runs each one (``MI_CORE_DOCS_NOTEBOOKS=01_*,03_*`` only those); without it the pages show the
code and text only (the test of the site builds so; the acceptance tests run every notebook).
The site loads nothing from the network: the theme's assets are copied into
``_build/html/_static``, nbsphinx loads no require.js, widget manager or MathJax, and the
tutorials' plotly figures load ``_static/plotly.min.js`` (``_ext/tutorial_kernel.py``).
"""

from __future__ import annotations

import os
import shutil
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
    "nbsphinx",
    "mi_core_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]

# nbsphinx: the tutorials (tutorials/*.ipynb, copied from ../notebooks by mi_core_docs)
EXECUTE = os.environ.get("MI_CORE_DOCS_EXECUTE", "") not in ("", "0")
nbsphinx_execute = "always" if EXECUTE else "never"
# per cell, as tests/acceptance/test_notebooks.py: generous for a loaded 2-core machine, still
# finite (the slowest cells' times: benchmarks/README.md, "Notebook cells")
nbsphinx_timeout = 900
nbsphinx_allow_errors = False
nbsphinx_kernel_name = "python3"
# a temporary working folder and plotly figures that load plotly.js from _static
nbsphinx_execute_arguments = [
    f"--IPKernelApp.exec_files={[str(HERE / '_ext' / 'tutorial_kernel.py')]!r}",
]
# offline: no require.js, no jupyter-widgets manager from a CDN (the notebooks' outputs are
# self-contained HTML; tqdm's widget bars are turned off below)
nbsphinx_requirejs_path = ""
nbsphinx_widgets_path = ""
# and no MathJax from a CDN on every tutorial page: the notebooks hold no equations (a page with
# math in its Markdown would still load it, and fail the site's test)
nbsphinx_assume_equations = False
if EXECUTE:
    os.environ.setdefault("TQDM_DISABLE", "1")  # the kernels inherit it: no progress bars
# nbsphinx converts Markdown cells with pandoc: the docs extra's pypandoc-binary ships one
if shutil.which("pandoc") is None:
    try:
        import pypandoc

        _bundled = Path(pypandoc.__file__).parent / "files"
        if (_bundled / "pandoc").exists():
            os.environ["PATH"] = f"{_bundled}{os.pathsep}{os.environ.get('PATH', '')}"
    except ImportError:
        pass

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
