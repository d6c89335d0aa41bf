"""The linters CI holds the code to: ruff, and pyright (basic) against its recorded baseline.

pyright's baseline (``.basedpyright/baseline.json``) lists the type errors the code had when
pyright joined the checks; a change that adds one fails here, and the list may only shrink
(``MAX_BASELINE``). Numbers and why they are not 0: tests/README.md, "Types".
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The type errors the baseline may hold at most; lower it when fixes shrink the baseline.
MAX_BASELINE = 455


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"{name} is not installed in this environment (pip install -e '.[dev]')")
    return found


def test_ruff_finds_nothing():
    done = subprocess.run(
        [_tool("ruff"), "check", "mi_core", "tests", "benchmarks", "experiments"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]


@pytest.mark.slow
def test_pyright_finds_no_type_error_beyond_its_baseline():
    baseline = json.loads((REPO / ".basedpyright" / "baseline.json").read_text())
    assert sum(len(v) for v in baseline["files"].values()) <= MAX_BASELINE
    done = subprocess.run([_tool("basedpyright")], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:]


def test_the_scripts_import_only_names_that_exist():
    """benchmarks/ and experiments/ import mi_core inside their functions, where no import of
    the module finds a name that moved; every ``from mi_core... import name`` they hold must
    resolve (a module attribute, or a submodule)."""
    import ast
    import importlib

    missing = []
    for script in sorted(
        [*(REPO / "benchmarks").glob("*.py"), *(REPO / "experiments").glob("*.py")]
    ):
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mi_core"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    name = alias.name
                    if not hasattr(module, name):
                        try:
                            importlib.import_module(f"{node.module}.{name}")
                        except ImportError:
                            missing.append(f"{script.name}: {node.module}.{name}")
    assert missing == []
