"""Reading a sweep directory, comparing its subnetworks, and the self-contained report.

The sweep here is built by hand (masks with known answers in the layout ``mi-core sweep``
writes), so the glue that reads it is checked against numbers worked out on paper; attention
classes, views and the ablation table run for real on a tiny random BERT.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from mi_core.data import load_pairs
from mi_core.errors import ConfigError
from mi_core.interventions import Component, ComponentMask
from mi_core.io import read_json, write_json
from mi_core.methods.heuristic_core.ablation import (
    resolve_joint_sets,
    run_core_ablation,
    top_heads_by_drop,
)
from mi_core.methods.heuristic_core.attention import (
    attention_classes,
    attention_views,
    choose_heads,
    write_views,
)
from mi_core.methods.heuristic_core.comparison import compare_subnetworks, write_comparison
from mi_core.methods.heuristic_core.report import (
    build_report,
    display_name,
    render_report,
    write_report,
)
from mi_core.methods.heuristic_core.results import ExperimentTables
from mi_core.pruning.sweeps import load_sweep
from mi_core.viz.attention_html import attention_view_fragment
from mi_core.viz.page import _split_circuitsvis, markdown_table

pytestmark = pytest.mark.usefixtures("one_thread")

N_LAYERS, N_HEADS = 3, 4
EVAL = ["mnli:validation_matched", "hans:ln_subject/object_swap", "hans:cn_embedded_under_if"]
# Kept heads per (sparsity, seed). L0.H0 and L1.H1 are in every subnetwork (the core);
# L2.H3 is in every 0.3 subnetwork but no 0.6 one.
KEPT = {
    0.3: {
        1: ["L0.H0", "L1.H1", "L2.H3", "L0.H1", "L0.H2", "L1.H0", "L1.H2", "L2.H0"],
        2: ["L0.H0", "L1.H1", "L2.H3", "L0.H1", "L0.H3", "L1.H0", "L2.H1", "L2.H2"],
        3: ["L0.H0", "L1.H1", "L2.H3", "L0.H2", "L1.H3", "L2.H0", "L2.H1", "L1.H2"],
    },
    0.6: {
        1: ["L0.H0", "L1.H1", "L0.H1", "L1.H0"],
        2: ["L0.H0", "L1.H1", "L0.H2", "L2.H0"],
        3: ["L0.H0", "L1.H1", "L0.H1", "L2.H1"],
    },
}
FULL = {EVAL[0]: 0.80, EVAL[1]: 0.70, EVAL[2]: 0.30}


def _accuracy(sparsity: float, seed: int) -> dict[str, float]:
    return {EVAL[0]: 0.8 - sparsity / 10, EVAL[1]: 0.7 - sparsity + seed / 100, EVAL[2]: 0.1 * seed}


def make_fake_sweep(root) -> None:
    """A finished sweep in the layout of mi_core.pruning.sweeps.run_sweep (and one unfinished)."""
    for sparsity, seeds in KEPT.items():
        for seed, kept in seeds.items():
            run = root / f"s{sparsity:.2f}" / f"seed{seed}"
            heads = torch.zeros(N_LAYERS, N_HEADS)
            for label in kept:
                layer, head = (int(x[1:]) for x in label.split("."))
                heads[layer, head] = 1.0
            mask = ComponentMask(heads, torch.ones(N_LAYERS))
            mask.save(run / ("mask.json" if seed == 2 else "mask.safetensors"))
            write_json(
                run / "metrics.json",
                {
                    "target_sparsity": sparsity,
                    "achieved_sparsity": mask.sparsity(),
                    "n_removed": len(mask.removed()),
                    "accuracy": _accuracy(sparsity, seed),
                    "full_accuracy": FULL,
                    "eval_examples": {name: 300 for name in EVAL},
                    "chance_accuracy": {EVAL[0]: 1 / 3, EVAL[1]: 0.5, EVAL[2]: 0.5},
                    "reached_target": False,
                },
            )
    (root / "s0.60" / "seed4").mkdir(parents=True)  # unfinished: no metrics.json
    write_json(root / "full_model.json", FULL)


@pytest.fixture()
def sweep(tmp_path):
    make_fake_sweep(tmp_path / "sweep")
    return tmp_path / "sweep"


def test_load_sweep_reads_masks_and_metrics_of_finished_runs(sweep):
    results = load_sweep(sweep)
    assert list(zip(results.runs.sparsity, results.runs.seed, strict=True)) == [
        (0.3, 1),
        (0.3, 2),
        (0.3, 3),
        (0.6, 1),
        (0.6, 2),
        (0.6, 3),
    ]
    assert results.eval_names == EVAL
    assert results.full_accuracy == FULL
    assert results.runs["acc_hans:cn_embedded_under_if"].tolist() == pytest.approx(
        [0.1, 0.2, 0.3] * 2
    )
    assert results.runs["full_acc_mnli:validation_matched"].tolist() == [0.8] * 6
    assert results.runs["n_removed"].tolist() == [4, 4, 4, 8, 8, 8]
    assert results.head_masks(0.6).shape == (3, N_LAYERS, N_HEADS)
    assert int(results.head_masks().sum()) == 3 * 8 + 3 * 4
    long = results.accuracy_long()
    assert len(long) == 6 * 3 and set(long.columns) == {
        "sparsity",
        "seed",
        "subnetwork",
        "dataset",
        "accuracy",
    }
    only = load_sweep(sweep, sparsities=[0.6], seeds=[1, 3])
    assert only.runs.seed.tolist() == [1, 3] and only.sparsities == [0.6]


def test_load_sweep_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_sweep(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no finished pruning runs"):
        load_sweep(tmp_path / "empty")


def test_comparison_matches_hand_computed_answers(sweep, tmp_path):
    results = load_sweep(sweep)
    comparison = compare_subnetworks(results)
    assert comparison.core == ["L0.H0", "L1.H1"]
    assert comparison.cores["0.3"] == ["L0.H0", "L1.H1", "L2.H3"]
    freq = comparison.frequency.set_index("label")
    assert freq.loc["L2.H3", "count_0.3"] == 3 and freq.loc["L2.H3", "count_0.6"] == 0
    assert freq.loc["L0.H1", "count_all"] == 4
    summary = comparison.core_table.set_index("group")
    n = N_LAYERS * N_HEADS
    assert summary.loc["0.3", "expected_random_intersection"] == pytest.approx(n * (8 / n) ** 3)
    assert summary.loc["0.6", "expected_random_intersection"] == pytest.approx(n * (4 / n) ** 3)
    assert summary.loc["all", "expected_random_intersection"] == pytest.approx(
        n * (8 / n) ** 3 * (4 / n) ** 3
    )
    assert summary.loc["all", "n_core"] == 2
    # the paper's figure takes m / n = 1 - target sparsity
    assert summary.loc["0.3", "expected_random_intersection_paper"] == pytest.approx(n * 0.7**3)
    assert summary.loc["all", "expected_random_intersection_paper"] == pytest.approx(
        n * 0.7**3 * 0.4**3
    )

    # Spearman against scipy on the frequency maps built here from KEPT
    def freqs(s):
        return [sum(label in kept for kept in KEPT[s].values()) / 3 for label in freq.index]

    expected = spearmanr(freqs(0.3), freqs(0.6))
    row = comparison.spearman.iloc[0]
    assert (row.sparsity_a, row.sparsity_b) == (0.3, 0.6)
    assert row.spearman_rho == pytest.approx(expected.statistic)
    assert row.p_value == pytest.approx(expected.pvalue)
    assert row.n_core_both == 2
    heat = comparison.heatmaps[("0.3", "0.6")]
    assert int(heat.sum()) == n and int(heat[3, 3]) == 2

    paths = write_comparison(results, comparison, tmp_path / "analysis")
    core_heads = pd.read_csv(paths["core_heads"])
    assert core_heads.label.tolist() == ["L0.H0", "L1.H1", "L2.H3"]
    assert core_heads.in_core_all.tolist() == [True, True, False]
    assert set(core_heads.columns) >= {"in_core_0.3", "in_core_0.6", "freq_0.3", "freq_0.6"}
    heat_csv = pd.read_csv(tmp_path / "analysis" / "heatmap_0.3_vs_0.6.csv")
    assert heat_csv.iloc[:, 1:].to_numpy().sum() == n


def test_choose_heads_falls_back_to_the_most_frequent(sweep):
    comparison = compare_subnetworks(load_sweep(sweep))
    assert choose_heads(["L1.H1"], comparison.frequency) == ["L1.H1"]
    assert choose_heads([], comparison.frequency, max_heads=3) == ["L0.H0", "L1.H1", "L0.H1"]
    assert choose_heads(["L1.H1"], comparison.frequency, ["L2.H2"]) == ["L2.H2"]
    with pytest.raises(ConfigError):
        choose_heads([], comparison.frequency, ["head two"])


def test_joint_sets_resolve_core_top3_and_explicit_lists():
    drops = {"L0.H0": 0.1, "L1.H1": 0.3, "L2.H3": 0.2, "L0.H2": 0.25}
    assert top_heads_by_drop(drops) == ["L1.H1", "L0.H2", "L2.H3"]
    raises = {"L0.H0": -0.4, "L1.H1": 0.3, "L2.H3": 0.0, "L0.H2": 0.0}  # |effect|, then order
    assert top_heads_by_drop(raises) == ["L0.H0", "L1.H1", "L0.H2"]
    heads = list(drops)
    sets = resolve_joint_sets(
        ["core", "top3", ["L2.H3", "L1.H1", "L0.H2"], ["L0.H0"]], heads, drops
    )
    assert sets == [("L0.H0", "L0.H2", "L1.H1", "L2.H3"), ("L0.H2", "L1.H1", "L2.H3")]
    with pytest.raises(ConfigError, match="single-head"):
        resolve_joint_sets(["top3"], heads)


@pytest.fixture(scope="module")
def hans(data_dir):
    return load_pairs("hans:so_swap", max_examples=12)


def test_attention_classes_and_views_of_chosen_heads(tiny, hans, tmp_path):
    heads = ["L0.H0", "L2.H3"]
    table = attention_classes(tiny, hans, heads, batch_size=4)
    assert table.label.tolist() == heads
    assert {"pattern_class", "overlap_mass", "sep_mass", "dataset"} <= set(table.columns)
    views = attention_views(tiny, hans, heads, n_views=2)
    assert len(views) == 2 and views[0]["heads"] == heads
    n = len(views[0]["tokens"])
    pattern = torch.tensor(views[0]["pattern"])
    assert pattern.shape == (2, n, n)
    assert torch.allclose(pattern.sum(-1), torch.ones(2, n), atol=1e-4)  # rows are softmaxes
    assert views[0]["tokens"][0] == "[CLS]"
    paths = write_views(views, tmp_path)
    page = paths[0].read_text()
    assert "CircuitsVis.render(" in page and not re.search(r"<script[^>]*src=", page)


def test_core_ablation_table_with_joint_and_superadditivity_rows(tiny, hans, tmp_path):
    datasets = [load_pairs("mnli:validation_matched", max_examples=12), hans]
    heads = ["L0.H0", "L1.H2", "L2.H3", "L2.H0"]
    table = run_core_ablation(
        tiny, datasets, heads, ["core", "top3"], fill="zero", batch_size=8, out=tmp_path
    )
    frame = pd.read_csv(tmp_path / "ablation_table.csv")
    assert (
        frame.kind.tolist()
        == ["full"] + ["single"] * 4 + ["others"] + ["joint"] * 2 + ["superadditivity"] * 2
    )
    # top3: the three heads with the largest mean drop on the out-of-domain set (HANS)
    drop = {
        h: table.full[hans.name] - table.singles[c][hans.name]
        for h, c in zip(heads, [Component.parse(h) for h in heads], strict=True)
    }
    ranked = sorted(drop, key=lambda h: (-abs(drop[h]), Component.parse(h)))
    top3 = tuple(sorted(ranked[:3], key=Component.parse))
    assert list(table.joints) == [
        tuple(Component.parse(h) for h in sorted(heads, key=Component.parse)),
        tuple(Component.parse(h) for h in top3),
    ]
    for joint in table.joints:
        superadd = table.superadditivity(joint)[hans.name]
        joint_drop = table.full[hans.name] - table.joints[joint][hans.name]
        singles = sum(table.full[hans.name] - table.singles[c][hans.name] for c in joint)
        assert superadd == pytest.approx(joint_drop - singles)
    assert len(table.others()) == N_LAYERS * N_HEADS - 4
    for name in ("ablation_display.csv", "ablation_table.md", "note.md"):
        assert (tmp_path / name).is_file()
    assert "Joint sets: L0.H0+L1.H2+L2.H0+L2.H3" in (tmp_path / "note.md").read_text()


def test_circuitsvis_fragment_splits_into_bundle_and_view():
    fragment = attention_view_fragment(["a", "b"], torch.full((1, 2, 2), 0.5), ["L0.H0"])
    bundle, view = _split_circuitsvis(fragment)
    assert "var CircuitsVis=" in bundle and "CircuitsVis.render(" not in bundle
    assert view.startswith("<div id=") and "></div>" in view and "CircuitsVis.render(" in view
    assert _split_circuitsvis("<p>no script</p>") is None


def test_markdown_table_and_display_names():
    frame = pd.DataFrame({"name": ["a|b", "c"], "n_core": [2.0, 3.0], "rho": [0.5, float("nan")]})
    text = markdown_table(frame, digits=2)
    assert text.splitlines()[0] == "| name | n_core | rho |"
    assert "| a\\|b | 2 | 0.50 |" in text and "| c | 3 |  |" in text
    assert display_name("hans:ln_subject/object_swap") == "SO-Swap"
    assert display_name("mnli:validation_matched") == "mnli:validation_matched"


def test_report_from_a_finished_directory_is_self_contained(sweep, tiny, hans, tmp_path):
    root = sweep.parent
    results = load_sweep(sweep)
    write_comparison(results, compare_subnetworks(results), root / "analysis")
    heads = ["L0.H0", "L1.H1"]
    table = attention_classes(tiny, hans, heads, batch_size=4)
    table.insert(1, "chosen_as", "core")
    (root / "attention").mkdir()
    table.to_csv(root / "attention" / "attention_classes.csv", index=False)
    write_views(attention_views(tiny, hans, heads, n_views=2), root / "attention")
    run_core_ablation(tiny, [hans], heads, ["core"], fill="zero", out=root / "ablation")
    html_path, md_path = write_report(root)
    page = html_path.read_text()
    assert not re.search(r"<script[^>]*\bsrc\s*=", page)  # nothing loaded from anywhere
    assert page.count("Plotly.newPlot(") >= 5  # Figures 2, 3 (x2), 4, 5, 9
    assert len(re.findall(r"\* plotly\.js v\d", page)) == 1  # plotly.js once
    assert page.count("var CircuitsVis=") == 1  # the circuitsvis bundle once ...
    assert page.count("CircuitsVis.render(") == 2  # ... and two views
    markdown = md_path.read_text()
    for heading in ("## Subnetworks", "## Shared heads", "## Attention patterns", "## Ablating"):
        assert heading in markdown
    assert "**2 heads are kept by all 6 subnetworks**" in markdown
    expected = (N_LAYERS * N_HEADS) * (8 / 12) ** 3 * (4 / 12) ** 3
    assert f"{expected:.3f}" in markdown
    assert "SO-Swap" in markdown and "full model" in markdown
    # the report read everything through one typed loader, the inverse of the stages' writers
    tables = ExperimentTables.load(root)
    assert tables.comparison is not None and tables.comparison.core == heads
    pd.testing.assert_frame_equal(tables.attention_classes, table, check_dtype=False)
    assert tables.ablation is not None and "None (full model)" in set(tables.ablation["ablated"])
    assert tables.effective_size is None and tables.core_before is None  # stages not run
    assert tables.finetune_metrics is None and tables.grid_runs is None
    assert tables.eval_examples == {name: 300 for name in EVAL}
    assert tables.chance_accuracy[EVAL[0]] == pytest.approx(1 / 3)
    assert "(n=300)" in page.replace("\\u002f", "/")  # the report's figures state n
    title, sections = build_report(tables)
    assert [s.title for s in sections] == [s.title for s in build_report(root)[1]]
    assert title == build_report(root)[0]


def test_report_and_findings_parse_no_file_themselves():
    """Results are parsed in one place (ExperimentTables, SubnetworkComparison.load)."""
    import inspect

    from mi_core.methods.heuristic_core import findings, report

    for module in (report, findings):
        source = inspect.getsource(module)
        assert "read_csv" not in source and "read_json" not in source, module.__name__


def test_the_effective_size_caption_names_the_method_that_made_the_table():
    """The default table is the authors' (per seed, then mean); the caption had described the
    paper's rule (the mean over seeds judged) for every table."""
    from mi_core.methods.heuristic_core.report import _effective_size_rule

    authors = pd.DataFrame({"target": ["id"], "effective_size": [60.0], "method": ["authors"]})
    paper = pd.DataFrame({"target": ["id"], "effective_size": [60.0]})
    assert "authors' script" in _effective_size_rule(authors)
    assert "then the mean over seeds" in _effective_size_rule(authors)
    assert "paper's text" in _effective_size_rule(paper)
    assert "mean accuracy over seeds" in _effective_size_rule(paper)


def test_the_report_says_whether_each_pruning_run_met_its_target(sweep, tmp_path, tmp_path_factory):
    from mi_core.viz.figures import pruning_dynamics

    root = sweep.parent
    results = load_sweep(sweep)
    write_comparison(results, compare_subnetworks(results), root / "analysis")
    # two runs' logs: 0.30 / seed 1 settled (sampled = expected), 0.60 / seed 1 did not
    ends = {(0.3, 1): (0.30, 0.29, True), (0.6, 1): (0.58, 0.31, True)}
    for (sparsity, seed), (sampled, expected, reached) in ends.items():
        run = sweep / f"s{sparsity:.2f}" / f"seed{seed}"
        steps = range(10)
        pd.DataFrame(
            {
                "step": steps,
                "kl": 0.1,
                "target_sparsity": [min(sparsity, sparsity * s / 5) for s in steps],
                "sampled_sparsity": [sampled * s / 9 for s in steps],
                "expected_sparsity": [expected * s / 9 for s in steps],
                "eval_accuracy": [0.7 if s % 5 == 4 else None for s in steps],
            }
        ).to_csv(run / "log.csv", index=False)
        metrics = read_json(run / "metrics.json")
        metrics.update(
            steps=10, reached_target=reached, final_sampled_sparsity=sampled,
            final_expected_sparsity=expected, final_kl=0.1,
        )  # fmt: skip
        write_json(run / "metrics.json", metrics)
    tables = ExperimentTables.load(root)
    assert sorted(tables.pruning_logs["run"].unique()) == ["s=0.3 seed=1", "s=0.6 seed=1"]
    summary = tables.pruning_summary.set_index("subnetwork")
    assert summary.loc["s=0.6 seed=1", "final_expected_sparsity"] == 0.31
    assert not summary.loc["s=0.3 seed=2", "reached_target"]
    _, markdown = render_report(tables)
    assert "## Pruning runs: did the gates settle?" in markdown
    assert "**2 of 6 runs met their target**" in markdown
    assert "at the end: 0.01 to 0.27." in markdown  # the sampled minus the expected sparsity
    fig = pruning_dynamics(tables.pruning_logs, full_accuracy=0.8)
    names = [trace.name for trace in fig.data]
    assert names.count("target") == 2 and names.count("s=0.6 seed=1: accuracy") == 1
    accuracy = next(t for t in fig.data if t.name == "s=0.6 seed=1: accuracy")
    assert list(accuracy.x) == [4, 9] and list(accuracy.y) == [0.7, 0.7]  # probed steps only
    assert len(fig.layout.shapes) == 1 and fig.layout.shapes[0].y0 == 0.8  # the full model
    # logs without evaluations: one panel
    alone = pruning_dynamics(tables.pruning_logs.drop(columns="eval_accuracy"))
    assert not any(t.name.endswith("accuracy") for t in alone.data)
    assert "yaxis2" not in alone.layout.to_plotly_json()
    # a long run is drawn from 400 steps, its last kept; one target line per schedule
    long = pd.DataFrame({"run": "a", "step": range(1000), "sampled_sparsity": 0.5,
                         "expected_sparsity": 0.4, "target_sparsity": 0.5})  # fmt: skip
    thin = pruning_dynamics(pd.concat([long, long.assign(run="b")]))
    assert [len(t.x) for t in thin.data] == [400, 400, 400, 400, 400]
    assert thin.data[0].x[-1] == 999

    # in memory (a notebook's tables, no report directory): the runs' recorded folders
    in_memory = ExperimentTables(root=tmp_path / "nowhere", runs=tables.runs)
    assert "**2 of 6 runs met their target**" in render_report(in_memory)[1]
    # the report directory copied elsewhere reads its own runs (the recorded run_dir is gone)
    import shutil

    moved = tmp_path_factory.mktemp("moved") / "report"
    shutil.copytree(root, moved)
    shutil.rmtree(root)
    copy = ExperimentTables.load(moved)
    assert sorted(copy.pruning_logs["run"].unique()) == ["s=0.3 seed=1", "s=0.6 seed=1"]
    assert "**2 of 6 runs met their target**" in render_report(copy)[1]
    # a run of an older mi_core (metrics without reached_target, a log without the sampled
    # sparsity) is refused in one line that says to run it again, not drawn around
    run = moved / "sweep" / "s0.30" / "seed2"
    metrics = read_json(run / "metrics.json")
    write_json(run / "metrics.json", {k: v for k, v in metrics.items() if k != "reached_target"})
    with pytest.raises(ConfigError, match=r"older mi_core \(it has no reached_target\): delete"):
        ExperimentTables.load(moved)
    write_json(run / "metrics.json", metrics)
    for log_path in (moved / "sweep").glob("*/*/log.csv"):
        pd.read_csv(log_path).drop(columns="sampled_sparsity").to_csv(log_path, index=False)
    with pytest.raises(ConfigError, match=r"older mi_core \(it has no sampled_sparsity\)"):
        ExperimentTables.load(moved)


def test_one_data_set_has_one_name_and_each_figure_its_own_n(tmp_path):
    """``hans:so_swap`` was also ``hans:ln_subject/object_swap`` and ``SO-Swap`` in one report;
    the fine-tuning figure's legend said n=300 (the sweep's) where fine-tuning evaluated 200."""
    from mi_core.data.pairs import display_name
    from mi_core.methods.heuristic_core.report import _finetune_section

    assert display_name("hans:so_swap") == display_name("hans:ln_subject/object_swap") == "SO-Swap"
    assert display_name("HANS:SO-Swap") == "SO-Swap"
    assert display_name("mnli:validation_matched") == "mnli:validation_matched"
    assert display_name("mine.jsonl") == "mine.jsonl"
    sets = ["mnli:validation_matched", "hans:ln_subject/object_swap"]
    metrics = pd.DataFrame(
        {"step": [0, 0, 100, 100], "n": 200, "dataset": sets * 2, "accuracy": [0.3, 0, 0.6, 0.1]}
    )
    tables = ExperimentTables(root=tmp_path, finetune_metrics=metrics,
                              eval_examples={"hans:ln_subject/object_swap": 300})  # fmt: skip
    (figure, _caption) = next(p for kind, p in _finetune_section(tables).blocks if kind == "figure")
    names = {trace.name for trace in figure.data if trace.name}
    assert "SO-Swap (n=200) (OOD)" in names and not any("n=300" in name for name in names)
