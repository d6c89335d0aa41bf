"""Faults a fault sweep and a new user found: each through the command line (one stderr line
without a traceback, a non-zero exit, earlier files untouched) or the library call behind it."""

from __future__ import annotations

import os
import tempfile

import pandas as pd
import pytest

from mi_core.cli import main

SWEEP = ["sweep", "--model", "m", "--train", "mnli:train", "--sparsities", "0.5", "--seeds", "1-1"]


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("mi-core: error: "), err
    return err[0]


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A temporary directory of the test's own, standing in for the machine's shared /tmp."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    return shared


def test_the_output_lock_cannot_be_turned_into_a_write_anywhere(tmp_path, capsys, private_tmp):
    """The lock lived in a folder every user shares, opened with "a+" and truncated: another
    user's link there made a run overwrite any file its user could write. Now it lives in this
    user's own 0700 folder, is opened without following a link, and is refused otherwise."""
    from mi_core.errors import OutputError
    from mi_core.io import output_lock

    victim = tmp_path / "thesis.tex"
    victim.write_text("precious")
    out = tmp_path / "sweep"
    # another user's folder (a link to theirs) where this user's lock folder belongs
    planted = tmp_path / "attacker"
    planted.mkdir(mode=0o777)
    folder = private_tmp / f"mi_core-locks-{os.getuid()}"
    folder.symlink_to(planted)
    assert main([*SWEEP, "--out", str(out)]) == 2
    assert "is not a folder of this user's" in _one_error(capsys)
    assert list(planted.iterdir()) == [] and not out.exists()

    # this user's folder, left open to others: closed on first use
    folder.unlink()
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    with output_lock(out):
        assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    # a link planted at the lock's own name, to the victim's file: refused, file untouched
    (lock,) = folder.iterdir()
    lock.unlink()
    lock.symlink_to(victim)
    with pytest.raises(OutputError, match="cannot open the output lock"):
        with output_lock(out):
            pass
    assert main([*SWEEP, "--out", str(out)]) == 2
    assert "cannot open the output lock" in _one_error(capsys)
    assert victim.read_text() == "precious"


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another user needs root")
def test_a_lock_folder_of_another_user_is_refused(tmp_path, capsys, private_tmp):
    folder = private_tmp / f"mi_core-locks-{os.getuid()}"
    folder.mkdir(mode=0o700)
    os.chown(folder, os.getuid() + 4242, -1)
    assert main([*SWEEP, "--out", str(tmp_path / "sweep")]) == 2
    assert "is not a folder of this user's" in _one_error(capsys)
    assert list(folder.iterdir()) == []


HOSTILE = "<svg onload=alert(9)>"


def test_every_page_writer_escapes_the_names_it_is_given(tmp_path, llama):
    """A data file named ``<svg onload=alert(9)>.jsonl`` ran script in the separability
    page's title; every page mi_core writes escapes every name that reaches it."""
    import plotly.graph_objects as go
    import torch
    from helpers import random_tokens

    from mi_core.interventions.ablation_table import AblationTable
    from mi_core.interventions.edges import Graph
    from mi_core.methods.heuristic_core.report import ReportSection, _render_html
    from mi_core.methods.separability import SeparabilityConfig, run_separability
    from mi_core.methods.separability.report import figures_html
    from mi_core.methods.separability.run import TaskTokens
    from mi_core.naming import Component
    from mi_core.viz.attention_html import attention_view_html
    from mi_core.viz.circuits import circuit_graph_html
    from mi_core.viz.figures import write_figure_html

    focus = TaskTokens(HOSTILE, random_tokens(4, 8, 1), random_tokens(2, 8, 2))
    cripple = TaskTokens(f"{HOSTILE}.jsonl", random_tokens(4, 8, 3), random_tokens(2, 8, 4))
    result = run_separability(llama, focus, cripple, SeparabilityConfig(steps=1, ff_frac=0.1))
    head = Component.parse("L0.H1")
    table = AblationTable([HOSTILE], {HOSTILE: 0.5}, {head: {HOSTILE: 0.4}}, [head])
    section = ReportSection(HOSTILE)
    frame = pd.DataFrame({HOSTILE: [HOSTILE]})
    section.blocks += [("text", HOSTILE), ("table", (frame, HOSTILE, 2))]
    graph = Graph.from_model(llama)
    pages = {
        "separability": figures_html(result, include_plotlyjs=False),
        "report": _render_html(HOSTILE, [section]),
        "ablation table": table.html(),
        "circuit": circuit_graph_html(graph, torch.zeros(graph.n_edges), title=HOSTILE),
        "attention": attention_view_html(
            [HOSTILE, "b"], torch.full((2, 2, 2), 0.5), title=HOSTILE
        ),
        "figure": write_figure_html(
            go.Figure(layout={"title": HOSTILE}), tmp_path / "f.html", include_plotlyjs=False,
            title=HOSTILE,
        ).read_text(),
    }  # fmt: skip
    for name, page in pages.items():
        assert HOSTILE not in page and "<svg onload" not in page, name
        assert "&lt;svg onload=alert(9)&gt;" in page or "\\u003csvg" in page, name
