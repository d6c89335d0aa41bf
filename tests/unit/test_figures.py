"""Figures say what they show: names of single series, whole accuracy scales, widths that fit."""

from __future__ import annotations

import pandas as pd
import pytest

from mi_core.viz.figures import (
    accuracy_vs_sparsity,
    id_vs_ood_scatter,
    subcase_bars,
    training_dynamics,
)
from mi_core.viz.page import PAGE_WIDTH
from mi_core.viz.separability import trajectory_figure


def test_a_single_evaluation_set_keeps_its_name_and_a_small_change_looks_small():
    # one evaluation set whose accuracy moves by 1 example in 64
    long = pd.DataFrame(
        {"sparsity": [0.3, 0.5], "dataset": ["hans:so_swap"] * 2, "accuracy": [0.5, 0.5 - 1 / 64]}
    )
    fig = accuracy_vs_sparsity(long, full_model_acc={"hans:so_swap": 0.5})
    assert fig.layout.showlegend is True and fig.data[0].name == "hans:so_swap"
    assert list(fig.layout.yaxis.range) == [0.0, 1.02]  # the whole scale, not 0.484-0.5
    percent = subcase_bars(
        pd.DataFrame({"subnetwork": [1, 1], "subcase": ["a", "b"], "accuracy": [40.0, 41.0]})
    )
    assert list(percent.layout.yaxis.range) == [0.0, 102.0]
    scatter = id_vs_ood_scatter(
        pd.DataFrame({"mnli": [0.80, 0.81], "hans": [0.1, 0.5]}), {"mnli": 0.82}, "mnli", "hans"
    )
    assert scatter.layout.showlegend is True
    assert list(scatter.layout.xaxis.range) == list(scatter.layout.yaxis.range) == [0.0, 1.02]


def test_the_separability_figure_fits_its_report_page_and_names_each_areas_metric():
    rows = []
    for method in ("freq", "random"):
        for step in range(3):
            row = {"method": method, "step": step}
            for metric in ("top1", "top10", "skip50_top1", "skip50_top10", "loss"):
                for task in ("focus", "cripple"):
                    row[f"{task}_{metric}"] = 1.0 - 0.2 * step if metric != "loss" else 2 + step
            rows.append(row)
    fig = trajectory_figure(pd.DataFrame(rows))
    assert fig.layout.width <= PAGE_WIDTH  # the report page's content (figures.html)
    keys = ("no separation", "closing legs of the area (dotted)")
    names = {t.name for t in fig.data if t.showlegend is not False and t.name not in keys}
    expected = {f"{m}: {metric} area " for m in ("freq", "random") for metric in
                ("top1", "top10", "skip50_top1", "skip50_top10", "loss")}  # fmt: skip
    assert {name.rsplit("area ", 1)[0] + "area " for name in names} == expected
    # the legs the area closes with, (1, 1) to the first point and the last to (0, 0), drawn
    legs = [t for t in fig.data if str(t.name).endswith("closing legs of the area")]
    assert len(legs) == 2 * 5 and list(legs[0].x)[-1] == 0.0 and list(legs[0].x)[0] == 1.0
    # one colour per metric, one line style per method; "relative" is defined on the figure
    lines = {t.name: t.line for t in fig.data if " area " in str(t.name)}
    assert len({lines[f"freq: {m} area 1.00"].color for m in ("top1", "loss")}) == 2
    assert lines["freq: top1 area 1.00"].color == lines["random: top1 area 1.00"].color
    assert lines["freq: top1 area 1.00"].dash != lines["random: top1 area 1.00"].dash
    assert any(t.name == "closing legs of the area (dotted)" for t in fig.data)
    assert "relative: each metric over the unpruned model's" in fig.layout.title.text
    assert not any("no trajectory" in a.text for a in fig.layout.annotations)
    # an unpruned model that scores 0 on a metric has no relative trajectory: said, not blank
    zero = pd.DataFrame(rows).assign(focus_top1=0.0, cripple_top1=0.0)
    notes = [a.text for a in trajectory_figure(zero).layout.annotations]
    assert sum("no trajectory: the unpruned model's top1" in t for t in notes) == 1


def _lines(fig, axis):
    """(position, annotation) of the layout lines along ``axis`` ("y": horizontal)."""
    texts = [a.text for a in fig.layout.annotations]
    shapes = [s for s in fig.layout.shapes if (s.y0 == s.y1 if axis == "y" else s.x0 == s.x1)]
    return [(s.y0 if axis == "y" else s.x0, t) for s, t in zip(shapes, texts, strict=False)]


def test_accuracy_axes_state_n_and_draw_the_chance_line():
    long = pd.DataFrame({"sparsity": [0.3, 0.5] * 2, "dataset": ["mnli"] * 2 + ["so_swap"] * 2,
                         "accuracy": [0.7, 0.6, 0.1, 0.2]})  # fmt: skip
    n, chance = {"mnli": 300, "so_swap": 1000}, {"mnli": 1 / 3, "so_swap": 1 / 2}
    fig = accuracy_vs_sparsity(long, n=n, chance=chance)
    assert [t.name for t in fig.data] == ["mnli (n=300)", "so_swap (n=1,000)"]
    lines = _lines(fig, "y")
    assert (pytest.approx(1 / 3), "chance 1/3 (mnli)") in lines
    assert (0.5, "chance 1/2 (so_swap)") in lines
    without = accuracy_vs_sparsity(long)  # nothing known, nothing drawn
    assert [t.name for t in without.data] == ["mnli", "so_swap"] and not without.layout.shapes
    scatter = id_vs_ood_scatter(
        pd.DataFrame({"mnli": [0.80, 0.81], "so_swap": [0.1, 0.5]}), None, "mnli", "so_swap",
        n=n, chance=chance,
    )  # fmt: skip
    assert scatter.layout.xaxis.title.text == "mnli (n=300) accuracy (in-domain)"
    assert scatter.data[0].name == "so_swap (n=1,000)"
    assert _lines(scatter, "x")[0][0] == pytest.approx(1 / 3)
    bars = subcase_bars(
        pd.DataFrame({"subnetwork": [1], "subcase": ["so_swap"], "accuracy": [40.0]}),
        n=n, chance=chance,
    )  # fmt: skip
    assert list(bars.data[0].x) == ["so_swap (n=1,000)"]
    assert _lines(bars, "y") == [(50.0, "chance 1/2")]  # a percent scale gets a percent line
    dynamics = training_dynamics(
        pd.DataFrame({"step": [0, 100], "dataset": ["mnli"] * 2, "accuracy": [0.33, 0.34]}),
        n=n, chance=chance,
    )  # fmt: skip
    assert dynamics.data[0].name == "mnli (n=300)"
    assert list(dynamics.layout.yaxis.range) == [0.0, 1.02]


def test_edges_in_one_column_of_the_circuit_graph_do_not_overlap():
    """MLPs share one column (and a head index shares one across layers): straight edges from
    L0.MLP to L1.MLP and to L3.MLP lay on top of each other; bowed by length they part."""
    import torch

    from mi_core.interventions import EdgeMask, Graph
    from mi_core.viz import circuit_graph_figure

    graph = Graph(n_layers=4, n_heads=2, d_model=8)
    names = ["L0.MLP->L1.MLP", "L0.MLP->L3.MLP", "L0.H1->L2.H1.v"]
    scores = torch.zeros(graph.n_edges)
    for i, name in enumerate(names):
        scores[graph.edge_names.index(name)] = 1.0 + i
    figure = circuit_graph_figure(graph, scores, EdgeMask.from_edges(graph, names))
    hover = next(t for t in figure.data if t.name == "edges")
    points = zip(hover.text, hover.x, hover.y, strict=True)
    middle = {text.split("<br>")[0]: (x, y) for text, x, y in points}
    mlp_x = graph.n_heads + 0.5
    near, far = middle["L0.MLP->L1.MLP"], middle["L0.MLP->L3.MLP"]
    assert mlp_x < near[0] < far[0]  # both bow out of the column, the longer one further
    assert middle["L0.H1->L2.H1.v"][0] > 1.0  # a head's column too
    lines = [t for t in figure.data if t.mode == "lines"]
    assert sum(len(t.x) for t in lines) == 3 * (9 + 1)  # curves of 9 points, not segments
    # a head into its own layer's MLP bows above its row of heads, not through them
    wide = Graph(n_layers=2, n_heads=12, d_model=8)
    edge = "L1.H0->L1.MLP"
    one = torch.zeros(wide.n_edges)
    one[wide.edge_names.index(edge)] = 1.0
    flat = circuit_graph_figure(wide, one, EdgeMask.from_edges(wide, [edge]))
    curve = next(t for t in flat.data if t.mode == "lines")
    ys = [y for y in curve.y if y is not None]
    assert min(ys) >= 2.0 and max(ys) < 4.0  # the heads' row is y = 2, the next layer's 4
    # a caller's own title still says when edges are left out of the picture
    mask = EdgeMask.from_edges(graph, names)
    titled = circuit_graph_figure(graph, scores, mask, max_edges=2, title="eap circuit")
    assert "eap circuit" in titled.layout.title.text
    assert "2 of 3 kept edges shown" in titled.layout.title.text
    whole = circuit_graph_figure(graph, scores, mask, title="eap circuit")
    assert whole.layout.title.text == "eap circuit"


def test_fine_tuning_draws_every_set_of_the_training_data_as_in_domain():
    """MNLI mismatched is in-domain for mnli:train (the authors average it with matched); the
    training-dynamics figure had drawn it as out-of-domain."""
    from mi_core.training.finetune import in_domain_sets

    specs = ["mnli:validation_matched", "mnli:validation_mismatched", "hans:so_swap"]
    names = ["mnli:validation_matched", "mnli:validation_mismatched", "hans:ln_subject/object_swap"]
    assert in_domain_sets("mnli:train", specs, names) == names[:2]
    assert in_domain_sets("my_pairs.jsonl", specs, names) == names[:1]  # a file: the first
    assert in_domain_sets("qqp:train", ["qqp:validation", "paws_qqp:adv"], ["q", "p"]) == ["q"]


def test_the_score_histogram_counts_what_it_cannot_draw_and_names_differences():
    """Zeros (the reference's score of a neuron the cripple set never uses) have no log10: they
    had been drawn at -30, squeezing every real score into one column; a mean_diff score is a
    difference, not a ratio."""
    import torch

    from mi_core.viz.separability import score_distribution_figure

    scores = torch.tensor([[0.5, 2.0, 0.0, 4.0], [1.0, float("inf"), 8.0, 0.25]])
    fig = score_distribution_figure(scores, title="freq")
    assert fig.layout.xaxis.range is None or min(fig.layout.xaxis.range) > -2
    assert min(fig.data[0].x) > -1 and max(fig.data[0].x) < 1  # log10 of 0.25 .. 8
    assert "1 scores of 0" in fig.layout.title.text
    assert "1 infinite or undefined" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "log10(cripple / focus)" and fig.layout.shapes
    diff = score_distribution_figure(scores.clamp(max=1.0), title="mean_diff", difference=True)
    assert diff.layout.xaxis.title.text == "log10 |cripple - focus|" and not diff.layout.shapes


def test_figure_4_draws_no_error_bar_for_one_seed_and_figure_5_counts_whole_subnetworks():
    import numpy as np
    import pandas as pd
    import torch

    from mi_core.viz import accuracy_vs_sparsity
    from mi_core.viz.figures import frequency_heatmap_figure

    one = pd.DataFrame({"sparsity": [0.5], "dataset": ["mnli"], "accuracy": [0.8]})
    fig = accuracy_vs_sparsity(one)
    assert list(fig.layout.xaxis.range) == [0, 1]  # no negative sparsities around one point
    assert "a single seed" in fig.layout.xaxis.title.text
    assert np.isnan(fig.data[0].error_y.array[0])  # no bar, not a bar of 0
    two = pd.concat([one, one.assign(accuracy=0.7)])
    assert accuracy_vs_sparsity(two).layout.xaxis.title.text == "sparsity"
    heat = frequency_heatmap_figure(torch.tensor([[1, 0, 0], [0, 2, 0], [0, 0, 3]]))
    assert list(heat.layout.xaxis.tickvals) == [0, 1, 2] and heat.data[0].colorbar.title.text


def test_figure_9_puts_each_uniform_marker_over_its_own_class_bar():
    """The uniform baselines had all sat at the centre of a head's bar group, in colours of
    their own: no marker could be matched to its class."""
    import pandas as pd

    from mi_core.viz.figures import attention_class_chart

    rows = [{"label": "L2.H5", "prev_mass": 0.5, "prev_uniform": 0.1, "sep_mass": 0.2,
             "sep_uniform": 0.3}]  # fmt: skip
    fig = attention_class_chart(pd.DataFrame(rows), classes=["prev", "sep"], show_uniform=True)
    assert fig.layout.scattermode == "group" and fig.layout.barmode == "group"
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    marks = [t for t in fig.data if t.type == "scatter"]
    assert [m.offsetgroup for m in marks] == [bars["prev"].offsetgroup, bars["sep"].offsetgroup]
    assert [m.showlegend for m in marks] == [True, False]  # one legend entry for the ticks


def test_a_figure_of_missing_values_says_so():
    import pandas as pd

    from mi_core.viz import accuracy_vs_sparsity
    from mi_core.viz.figures import id_vs_ood_scatter

    nan = float("nan")
    empty = accuracy_vs_sparsity(
        pd.DataFrame({"sparsity": [0.5], "dataset": ["mnli"], "accuracy": [nan]})
    )
    assert any("every value is missing" in a.text for a in empty.layout.annotations)
    scatter = id_vs_ood_scatter(pd.DataFrame({"mnli": [nan], "hans": [nan]}), None, "mnli", "hans")
    assert any("every value is missing" in a.text for a in scatter.layout.annotations)
    fine = accuracy_vs_sparsity(
        pd.DataFrame({"sparsity": [0.5], "dataset": ["mnli"], "accuracy": [0.8]})
    )
    assert not any("missing" in str(a.text) for a in fine.layout.annotations)


def test_pruning_dynamics_of_many_runs_are_small_multiples():
    """Twelve runs overlaid in one panel could not be told apart: from five runs on, each run
    has its own sparsity panel and, when probed, its own accuracy panel below it."""
    from mi_core.viz.figures import PRUNING_LOG_COLUMNS, pruning_dynamics

    rows = []
    for k in range(12):
        for step in range(0, 100, 10):
            row = dict.fromkeys(PRUNING_LOG_COLUMNS, 0.0) | {"run": f"run {k}", "step": step}
            row["eval_accuracy"] = 0.5 + 0.01 * k if step % 50 == 0 else float("nan")
            rows.append(row)
    fig = pruning_dynamics(pd.DataFrame(rows), full_accuracy=0.6)
    axes = {(t.xaxis, t.yaxis) for t in fig.data}
    assert len(axes) == 24  # a sparsity and an accuracy panel per run
    assert [a.text for a in fig.layout.annotations][:4] == ["run 0", "run 1", "run 2", "run 3"]
    assert sum(bool(t.showlegend) for t in fig.data) == 4  # one key per kind of line
    few = pruning_dynamics(pd.DataFrame([r for r in rows if r["run"] in ("run 0", "run 1")]))
    assert len({(t.xaxis, t.yaxis) for t in few.data}) == 2  # overlaid: sparsity, accuracy
