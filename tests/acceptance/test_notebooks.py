"""Every notebook in notebooks/ runs top to bottom (offline) without an error."""

from __future__ import annotations

import nbformat
import pytest
from helpers import REPO
from nbclient import NotebookClient

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_notebooks_exist():
    assert len(NOTEBOOKS) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, data_dir, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        # per cell: generous for a loaded 2-core machine, still finite (the slowest cells'
        # times: benchmarks/README.md, "Notebook cells")
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors
    text = "".join(
        str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )
    # tqdm's notebook bars need ipywidgets (a dev dependency): without it, a warning
    assert "IProgress not found" not in text
    if "walkthrough_classifier()" in path.read_text(encoding="utf-8"):
        # a trained model's numbers, and the notebook says which model they come from
        assert "MiniLM fine-tuned on mnli" in text or "the demo's fine-tuned MiniLM" in text
