"""Sphinx extension that writes the generated reference pages before Sphinx reads the sources.

- ``reference/api/<package>.rst``: one page per public package, one autodoc entry per name in
  the package's ``__all__``. The packages export lazily (``mi_core.lazy``), so
  ``automodule :members:`` would see nothing: the names are listed from ``__all__``. A name
  exported by several packages is documented once, on the page of the package closest to the
  module that defines it; the other pages link to that entry.
- ``reference/cli.rst``: every ``mi-core`` subcommand (and sub-subcommand) with its ``--help``,
  from :func:`mi_core.cli.build_parser`.

- ``tutorials/<name>.ipynb``: a copy of each notebook in ``notebooks/`` (stored without
  outputs), which nbsphinx renders as a tutorial page (``docs/conf.py``: executed when
  ``MI_CORE_DOCS_EXECUTE=1``, as ``make docs`` sets it). With ``MI_CORE_DOCS_NOTEBOOKS``
  (comma-separated names or globs, e.g. ``01_*``) only those notebooks are executed; the others
  are marked ``"nbsphinx": {"execute": "never"}`` in their copies and render without outputs.

Broken cross-references fail the build: a Python reference that resolves to no documented
entry (``:func:``, ``:class:``, a signature's type) is looked up as Python: as a dotted name,
relative to the module and class it is written in, among the names every ``mi_core`` module
defines or imports (``TYPE_CHECKING`` imports included), and in the libraries the signatures
use. A name that is found is a reference to an undocumented helper or to another library (no
inventory is fetched: the build is offline) and passes; one found nowhere (a typo, a renamed
function) is a warning, which ``-W`` makes an error.

The generated folders are ``docs/reference`` and ``docs/tutorials`` (ignored by git); run
standalone (``python docs/_ext/mi_core_docs.py``) to write them without building the site.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import fnmatch
import functools
import importlib
import importlib.util
import inspect
import json
import os
import pkgutil
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The public packages, in the order of the API reference.
PACKAGES: tuple[str, ...] = (
    "mi_core",
    "mi_core.models",
    "mi_core.models.families",
    "mi_core.data",
    "mi_core.interventions",
    "mi_core.interventions.edges",
    "mi_core.pruning",
    "mi_core.circuits",
    "mi_core.analysis",
    "mi_core.statistics",
    "mi_core.evaluation",
    "mi_core.training",
    "mi_core.viz",
    "mi_core.methods.heuristic_core",
    "mi_core.methods.separability",
)

GENERATED = Path(__file__).resolve().parent.parent / "reference"
#: The notebooks, and where the site's tutorial pages are copied from them.
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"


@dataclass(frozen=True)
class Entry:
    """A public name of a package: where it is documented, and with which directive."""

    package: str  # the package whose __all__ lists it
    name: str
    home: str  # the package whose page documents it
    directive: str  # autofunction, autoclass, autodata, or "module" (a subpackage)
    target: str  # the documented dotted name (the anchor id in the HTML)


def _defining_module(obj: Any) -> str | None:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module = getattr(obj, "__module__", None)
    return module if isinstance(module, str) and module.startswith("mi_core") else None


def _directive(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj) and getattr(obj, "__module__", "").startswith("mi_core"):
        return "autoclass"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "autofunction"
    return "autodata"


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split("."), b.split("."), strict=False):
        if x != y:
            break
        n += 1
    return n


def public_entries() -> list[Entry]:
    """Every (package, name) of :data:`PACKAGES`' ``__all__``, with the page documenting it."""
    exports: dict[str, list[tuple[str, Any]]] = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        exports[package] = [(name, getattr(module, name)) for name in module.__all__]

    def home_of(package: str, name: str, obj: Any) -> str:
        if isinstance(obj, types.ModuleType):
            return obj.__name__
        defined = _defining_module(obj)
        if defined is None:  # a constant: documented where it is listed
            return package
        owners = [p for p in PACKAGES if any(n == name and o is obj for n, o in exports[p])]
        # the exporting package closest to the defining module; ties: the deeper package
        return max(owners, key=lambda p: (_common_prefix(p, defined), p.count(".")))

    entries = []
    for package in PACKAGES:
        for name, obj in exports[package]:
            home = home_of(package, name, obj)
            directive = _directive(obj)
            target = home if directive == "module" else f"{home}.{name}"
            entries.append(Entry(package, name, home, directive, target))
    return entries


def _page_name(package: str) -> str:
    return package


def _api_page(package: str, entries: list[Entry]) -> str:
    module = importlib.import_module(package)
    title = f"``{package}``"
    lines = [title, "=" * len(title), "", f".. automodule:: {package}", "   :no-members:", ""]
    own = [e for e in entries if e.package == package and e.home == package]
    elsewhere = [e for e in entries if e.package == package and e.home != package]
    if elsewhere:
        lines += [
            "Also exported here, documented on the page of the package that defines them:",
            "",
        ]
        for e in elsewhere:
            role = {"module": "mod", "autoclass": "class", "autofunction": "func"}.get(
                e.directive, "data"
            )
            shown = e.name if e.directive != "module" else e.target
            lines.append(f"- ``{package}.{e.name}``: :{role}:`{shown} <{e.target}>`")
        lines.append("")
    if own:
        lines += ["Names", "-----", ""]
        for e in own:
            if e.directive == "autodata":
                lines += _data_entry(module, e)
                continue
            lines.append(f".. {e.directive}:: {e.target}")
            if e.directive == "autoclass":
                lines += ["   :members:", "   :show-inheritance:"]
            lines.append("")
    return "\n".join(lines)


def _data_entry(module: types.ModuleType, e: Entry) -> list[str]:
    """A constant: autodoc would show the docstring of its type (``dict``'s, ``tuple``'s), so
    the entry is written out, with the ``#:`` comment above its definition as its text."""
    from sphinx.pycode import ModuleAnalyzer

    value = getattr(module, e.name)
    defined = getattr(module, "_lazy_names", {}).get(e.name, e.package)
    try:
        docs = ModuleAnalyzer.for_module(defined).find_attr_docs()
    except Exception:  # noqa: BLE001 - no source: the entry has no text
        docs = {}
    text = list(docs.get(("", e.name), []))
    shown = repr(value) if not hasattr(value, "__origin__") else str(value)
    shown = " ".join(shown.split())
    if len(shown) > 100:
        shown = shown[:97] + "..."
    if inspect.isclass(value):  # a type alias (jaxtyping's Float[Tensor, ...])
        shown = getattr(value, "__name__", shown)
    lines = [f".. py:data:: {e.name}", f"   :module: {e.home}"]
    if not inspect.isclass(value):
        lines.append(f"   :type: {type(value).__name__}")
    if e.name != "__version__":
        lines.append(f"   :value: {shown}")
    lines.append("")
    lines += [f"   {line}".rstrip() for line in text]
    lines.append("")
    return lines


def _parser_sections(parser: argparse.ArgumentParser, words: list[str]) -> list[tuple[str, str]]:
    """(``mi-core word ...``, its help) for ``parser`` and every subparser below it."""
    sections = [(" ".join(words), parser.format_help())]
    for action in parser._actions:  # argparse has no public API for the subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                sections += _parser_sections(sub, [*words, name])
    return sections


def cli_page() -> str:
    from mi_core.cli import COMMANDS, build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "86"  # the width of furo's code blocks
    try:
        sections = _parser_sections(build_parser(), ["mi-core"])
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    lines = [
        "CLI reference",
        "=============",
        "",
        "Generated from the parsers (:func:`mi_core.cli.build_parser`) when the site is built:",
        "each section is the command's ``--help``.",
        "",
    ]
    summaries = {f"mi-core {c}": s for c, (_, s) in COMMANDS.items()}
    for words, text in sections:
        lines += [
            f".. _cli-{words.replace(' ', '-')}:",
            "",
            f"``{words}``",
            "-" * (len(words) + 4),
            "",
        ]
        if words in summaries:
            summary = summaries[words].replace("--", "-\\-")  # not an en dash
            lines += [summary[0].upper() + summary[1:] + ".", ""]
        lines += [".. code-block:: text", ""]
        lines += [f"   {line}".rstrip() for line in text.rstrip().splitlines()]
        lines.append("")
    return "\n".join(lines)


def write_generated(out: Path = GENERATED) -> None:
    entries = public_entries()
    api = out / "api"
    api.mkdir(parents=True, exist_ok=True)
    pages = {f"{_page_name(p)}.rst": _api_page(p, entries) for p in PACKAGES}
    index = [
        "API reference",
        "=============",
        "",
        "Every name that ``mi_core`` and its public subpackages export (their ``__all__``).",
        "",
        ".. toctree::",
        "   :maxdepth: 1",
        "",
        *[f"   {_page_name(p)}" for p in PACKAGES],
        "",
    ]
    pages["index.rst"] = "\n".join(index)
    pages["../cli.rst"] = cli_page()
    for name, text in pages.items():
        path = api / name
        # rewrite only what changed, so an incremental build re-reads only those pages
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def copy_notebooks(src: Path = NOTEBOOKS, out: Path = TUTORIALS) -> list[str]:
    """Copy ``src/*.ipynb`` into ``out`` (removing copies whose notebook is gone); with
    ``MI_CORE_DOCS_NOTEBOOKS`` set, the copies of the notebooks it does not name are marked
    not to be executed. Returns the names of the tutorials."""
    out.mkdir(parents=True, exist_ok=True)
    notebooks = sorted(src.glob("*.ipynb"))
    names = [p.stem for p in notebooks]
    for stale in out.glob("*.ipynb"):
        if stale.stem not in names:
            stale.unlink()
    selected = [g.strip() for g in os.environ.get("MI_CORE_DOCS_NOTEBOOKS", "").split(",")]
    selected = [g for g in selected if g]
    for path in notebooks:
        text = path.read_text(encoding="utf-8")
        if selected and not any(fnmatch.fnmatch(path.stem, g) for g in selected):
            notebook = json.loads(text)
            notebook.setdefault("metadata", {})["nbsphinx"] = {"execute": "never"}
            text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
        target = out / path.name
        # rewrite only what changed, so an incremental build re-reads only those pages
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
    return names


def _on_builder_inited(app: Any) -> None:
    write_generated()
    copy_notebooks()


def _on_build_finished(app: Any, exception: Exception | None) -> None:
    """plotly.js for the executed tutorials' figures (``tutorial_kernel.py``), from the
    installed plotly: the site loads nothing from the network."""
    if exception is not None or app.builder.format != "html":
        return
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        return
    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    (static / "plotly.min.js").write_text(get_plotlyjs(), encoding="utf-8")


#: Libraries whose names the docstrings and signatures refer to without a module.
_EXTERNAL = ("torch", "torch.nn", "typing", "collections.abc", "jaxtyping", "pandas", "numpy",
             "pathlib", "os", "argparse", "transformer_lens", "transformers")  # fmt: skip


def _import_dotted(name: str) -> bool:
    """Whether ``name`` is an importable module or an attribute chain of one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # noqa: BLE001 (not a module: try a shorter prefix)
            continue
        with warnings.catch_warnings():  # deprecated attributes (numpy's np.str) warn
            warnings.simplefilter("ignore")
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                return False
        return True
    return False


@functools.cache
def _known_names() -> frozenset[str]:
    """Every name an ``mi_core`` module defines or imports (also under ``TYPE_CHECKING``), and
    the names of the libraries of :data:`_EXTERNAL` and builtins."""
    import mi_core

    names: set[str] = set(dir(builtins))
    for lib in _EXTERNAL:
        try:
            names.update(dir(importlib.import_module(lib)))
        except ImportError:
            continue
    for info in pkgutil.walk_packages(mi_core.__path__, "mi_core."):
        spec = importlib.util.find_spec(info.name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[-1] for a in node.names)
                if isinstance(node, ast.ImportFrom) and node.module:
                    names.add(node.module.split(".")[-1])
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
        names.add(info.name.rsplit(".", 1)[-1])
    return frozenset(names)


#: The import aliases the code writes library names with.
_ALIASES = {"pd": "pandas", "np": "numpy", "nn": "torch.nn", "F": "torch.nn.functional",
            "go": "plotly.graph_objects", "px": "plotly.express"}  # fmt: skip


@functools.cache
def _resolves(target: str, module: str | None, cls: str | None) -> bool:
    """Whether a Python reference names something (see the module docstring)."""
    target = target.lstrip(".~")
    if not target or "[" in target or " " in target:  # a signature's generic, e.g. dict[str
        return True
    first, dot, rest = target.partition(".")
    if not dot and hasattr(builtins, target):
        return True
    if first in _ALIASES:
        target = _ALIASES[first] + dot + rest
    scopes = [""]
    if module:
        parts = module.split(".")
        scopes += [".".join(parts[:i]) + "." for i in range(len(parts), 0, -1)]
        if cls:
            scopes.insert(1, f"{module}.{cls}.")
    scopes += ["mi_core."] + [f"{lib}." for lib in _EXTERNAL]
    if any(_import_dotted(scope + target) for scope in scopes):
        return True
    first = target.split(".")[0]
    return first in _known_names() and ("." not in target or first[:1].isupper())


def _on_missing_reference(app: Any, env: Any, node: Any, contnode: Any) -> None:
    """Warn about a Python reference that names nothing (returns None: Sphinx goes on)."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not _resolves(target, node.get("py:module"), node.get("py:class")):
        from sphinx.util import logging as sphinx_logging

        sphinx_logging.getLogger(__name__).warning(
            "broken cross-reference: %s %r names nothing (a typo or a renamed name?)",
            node.get("reftype", "ref"), target, location=node,
        )  # fmt: skip
    return None


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _on_builder_inited)
    app.connect("build-finished", _on_build_finished)
    app.connect("missing-reference", _on_missing_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    write_generated()
    copy_notebooks()
