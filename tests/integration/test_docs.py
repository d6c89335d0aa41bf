"""The documentation site (``make docs``): it builds with warnings as errors, every public name
has an entry on an API page, the CLI page lists every subcommand, every notebook is a tutorial
page, and no page loads anything from the network. The site is built here without executing the
notebooks (``MI_CORE_DOCS_EXECUTE`` unset): tests/acceptance/test_notebooks.py runs them."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(
            importlib.util.find_spec(m) is None
            for m in ("sphinx", "myst_parser", "furo", "nbsphinx")
        ),
        reason="the docs extra is not installed (pip install -e '.[docs]')",
    ),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    html, doctrees = out / "html", out / "doctrees"
    env = {k: v for k, v in os.environ.items() if k != "MI_CORE_DOCS_EXECUTE"}
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(doctrees), str(DOCS), str(html)],
        capture_output=True, text=True, cwd=ROOT, timeout=600, env=env,
    )  # fmt: skip
    assert result.returncode == 0, f"sphinx-build -W failed:\n{result.stdout}\n{result.stderr}"
    return html


def _extension():
    """The docs build's extension, docs/_ext/mi_core_docs.py, imported as Sphinx imports it."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        return importlib.import_module("mi_core_docs")
    finally:
        sys.path.remove(str(DOCS / "_ext"))


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))


def test_every_public_name_has_an_entry(site: Path) -> None:
    gen = _extension()
    api = site / "reference" / "api"
    ids = {page.stem: _ids(page) for page in api.glob("*.html")}
    every = set().union(*ids.values())
    missing = []
    for package in gen.PACKAGES:
        names = importlib.import_module(package).__all__
        entries = {e.name: e for e in gen.public_entries() if e.package == package}
        assert set(names) == set(entries), package
        for name in names:
            entry = entries[name]
            anchor = f"module-{entry.target}" if entry.directive == "module" else entry.target
            if anchor not in ids.get(entry.home, set()):
                missing.append(f"{package}.{name} (expected #{anchor} on {entry.home}.html)")
    assert not missing, "public names without an API entry:\n" + "\n".join(missing)
    # and every package has its own page
    assert {f"module-{p}" for p in gen.PACKAGES} <= every


def test_cli_page_lists_every_subcommand(site: Path) -> None:
    from mi_core.cli import COMMANDS

    text = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    for command in COMMANDS:
        assert f'id="cli-mi-core-{command}"' in text, command
        assert f"usage: mi-core {command}" in text, command


def test_every_notebook_is_a_tutorial_page(site: Path) -> None:
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks
    index = (site / "index.html").read_text(encoding="utf-8")
    for notebook in notebooks:
        page = site / "tutorials" / f"{notebook.stem}.html"
        assert page.exists(), notebook.name
        text = page.read_text(encoding="utf-8")
        # the notebook's code is on its page, and the index's Tutorials toctree links to it
        first_code = next(
            "".join(c["source"]).strip().splitlines()[0]
            for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code" and "".join(c["source"]).strip()
        )
        words = re.findall(r"\w+", first_code)
        plain = re.sub(r"<[^>]+>", "", text)
        assert all(w in plain for w in words), (notebook.name, first_code)
        assert f'href="tutorials/{notebook.stem}.html"' in index, notebook.name


def test_no_page_loads_from_the_network(site: Path) -> None:
    remote = re.compile(
        r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//", re.I
    )
    offenders = [
        str(page.relative_to(site))
        for page in site.rglob("*.html")
        if remote.search(page.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"pages that load a network resource: {offenders}"


def test_every_public_name_says_what_it_is() -> None:
    """An exported function, class or package has a docstring of its own, and an exported
    constant a ``#:`` comment (what autodoc shows) above its assignment: an undocumented public
    name fails here, as the issue asks the site's build to."""
    public_entries = _extension().public_entries
    sources = [p.read_text(encoding="utf-8").splitlines() for p in (ROOT / "mi_core").rglob("*.py")]

    def commented(name: str) -> bool:
        assignment = re.compile(rf"^{re.escape(name)}(\s*:[^=]+)?\s*=")
        return any(
            i > 0 and lines[i - 1].lstrip().startswith("#:")
            for lines in sources
            for i, line in enumerate(lines)
            if assignment.match(line)
        )

    undocumented = []
    for entry in public_entries():
        if entry.home != entry.package:
            continue  # documented on the page of the package that defines it
        obj = getattr(importlib.import_module(entry.package), entry.name)
        if entry.directive == "autodata":
            ok = commented(entry.name)
        else:
            ok = bool((obj.__doc__ or "").strip())
        if not ok:
            undocumented.append(entry.target)
    assert undocumented == []


def test_a_broken_cross_reference_is_found_and_an_undocumented_one_is_not():
    """The build's check (docs/_ext/mi_core_docs.py): a reference that names nothing anywhere
    is broken; one to an undocumented helper, a TYPE_CHECKING import or another library is not."""
    ext = _extension()
    assert ext._resolves("mi_core.pruning.prune", None, None)
    assert ext._resolves("run_targets", "mi_core.pruning.run", None)  # a helper, by short name
    assert ext._resolves("HookedModel", "mi_core.pruning.step", None)  # a TYPE_CHECKING import
    assert ext._resolves("pd.DataFrame", None, None) and ext._resolves("torch.Tensor", None, None)
    assert ext._resolves("Graph.connected", "mi_core.circuits", None)
    assert not ext._resolves("mi_core.pruning.prune_everything", None, None)
    assert not ext._resolves("prune_evrything", "mi_core.pruning.run", None)
    assert not ext._resolves("mi_core.no_such_module.thing", None, None)
