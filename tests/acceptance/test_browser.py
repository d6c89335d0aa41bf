"""Figures, attention views and the report in a real browser (headless Chromium), offline.

Skipped where no Chromium is installed (``apt-get install chromium``). The browser runs with
every network request sent to a closed port, so a page that needs the network does not render.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pandas as pd
import pytest
import torch

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")


def rendered(path) -> str:
    """The page's DOM after its scripts ran, with the network unreachable."""
    result = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
            "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--virtual-time-budget=8000", "--dump-dom", path.resolve().as_uri(),
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return result.stdout


def plotly_titles(dom: str) -> list[str]:
    return re.findall(r'class="gtitle"[^>]*>([^<]*)<', dom)


def test_a_figure_renders_offline_with_its_titles(tmp_path):
    from mi_core.viz.figures import accuracy_vs_sparsity, write_figure_html

    long = pd.DataFrame(
        {"sparsity": [0.3, 0.3, 0.5, 0.5], "dataset": ["mnli", "hans"] * 2,
         "accuracy": [0.8, 0.5, 0.78, 0.3]}
    )  # fmt: skip
    full = {"mnli": 0.82, "hans": 0.6}
    figure = accuracy_vs_sparsity(long, full_model_acc=full, title="Accuracy vs sparsity")
    dom = rendered(write_figure_html(figure, tmp_path / "figure.html"))
    assert "<title>Accuracy vs sparsity</title>" in dom
    assert plotly_titles(dom) == ["Accuracy vs sparsity"]


def test_an_attention_view_renders_offline(tmp_path):
    from mi_core.viz import write_attention_html

    tokens = ["[CLS]", "doctor", "advised", "[SEP]"]
    pattern = torch.softmax(torch.randn(2, 4, 4), dim=-1)
    path = write_attention_html(tmp_path / "view.html", tokens, pattern, ["L2.H5", "L4.H0"],
                                title="SO-Swap example")  # fmt: skip
    dom = rendered(path)
    assert "<title>SO-Swap example</title>" in dom
    assert '<canvas role="img"' not in path.read_text()  # only the rendered page has them
    assert dom.count('<canvas role="img"') == 3  # a thumbnail per head and the zoomed head
    assert re.search(r"<h4[^>]*>L4\.H0</h4>", dom)


def test_the_report_renders_offline_with_its_figures(tiny_checkpoints, data_dir, tmp_path):
    from mi_core.methods.heuristic_core import ExperimentConfig, run_heuristic_core

    spec = {
        "name": "tiny-browser",
        "checkpoint": str(tiny_checkpoints["bert-cls"]),
        "task": "mnli",
        "data": {
            "train": "mnli:train",
            "eval": ["mnli:validation_matched", "hans:so_swap", "hans:embed_if"],
            "max_train_examples": 32,
            "max_eval_examples": 16,
        },
        "pruning": {
            "sparsities": [0.3, 0.5],
            "seeds": [1, 2],
            "profile": "quick",
            "overrides": {"steps": 6, "batch_size": 8, "checkpoint_every": 3},
        },
        "attention": {"max_examples": 8, "n_views": 1},
    }
    result = run_heuristic_core(ExperimentConfig.from_dict(spec), tmp_path / "r", progress=False)
    dom = rendered(result.out / "report.html")
    assert "<title>Heuristic core: tiny-browser</title>" in dom
    titles = plotly_titles(dom)
    assert any(t.startswith("Figure 2") for t in titles) and any("Figure 5" in t for t in titles)
    drawn = dom.count('<div class="plot-container plotly" ')  # the bundle's source has none
    assert drawn == len(titles) >= 5  # every figure drew, each with its title


def test_a_circuit_graph_renders_offline(tmp_path):
    from mi_core.interventions import EdgeMask, Graph
    from mi_core.io import write_text
    from mi_core.viz import circuit_graph_html

    graph = Graph(n_layers=2, n_heads=4, d_model=8)
    scores = torch.linspace(-1, 1, graph.n_edges)
    page = circuit_graph_html(graph, scores, EdgeMask.top_k(graph, scores, 12), title="IOI circuit")
    dom = rendered(write_text(tmp_path / "circuit.html", page))
    assert "<title>IOI circuit</title>" in dom
    assert plotly_titles(dom) == ["IOI circuit"]
    assert "L1.MLP" in dom  # node labels drawn
