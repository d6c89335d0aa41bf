"""The experiment report: one self-contained HTML page, a Markdown twin, tables as CSV.

:func:`write_report` reads only files under the report directory (the stages' CSV and JSON
outputs), so it can be re-run, or run on a directory built by hand or in a notebook. The
sections are rendered by :mod:`mi_core.viz.page`: the HTML page works offline (plotly.js is
included once in the page, every figure is a ``div`` that uses it, and the circuitsvis
attention views are inlined with their JavaScript bundle, also once). Figures follow the
paper: 2 (in-domain vs out-of-domain accuracy per subnetwork), 3 (per-subcase accuracy per
subnetwork), 4 (accuracy vs sparsity), 5 (head frequency heatmap), 6 (accuracy and effective
size over training), 7/8 (attention views) and 9 (attention classes); the ablation table is
Table 3/4.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from mi_core.data.pairs import display_name
from mi_core.io import write_csv, write_text
from mi_core.methods.heuristic_core.comparison import COMPARISON_FILES
from mi_core.methods.heuristic_core.layout import STAGES, ExperimentLayout
from mi_core.methods.heuristic_core.results import ExperimentTables
from mi_core.viz.page import ReportSection, format_value, render_html, render_markdown

__all__ = ["build_report", "display_name", "render_report", "write_report"]


# ---------------------------------------------------------------------- reading the stages
def _eval_names(subnetworks: pd.DataFrame) -> list[str]:
    return [c[len("acc_") :] for c in subnetworks.columns if c.startswith("acc_")]


def _eval_meta(
    tables: ExperimentTables, pretty: bool = False
) -> tuple[dict[str, int], dict[str, float]]:
    """Examples and chance accuracy per eval set, as a pruning run of the sweep recorded them;
    keyed by display name when ``pretty``. Empty without a finished run."""
    n, chance = dict(tables.eval_examples), dict(tables.chance_accuracy)
    if pretty:
        n = {display_name(k): v for k, v in n.items()}
        chance = {display_name(k): v for k, v in chance.items()}
    return n, chance


#: What each pruning profile is, and when its subnetworks can be trusted: a report's first line.
RECIPE_NOTES = {
    "paper": "the authors' recipe (princeton-nlp/Heuristic-Core's code), on their schedule.",
    "quick": "the authors' recipe on a 600-step schedule for a CPU. On 2 CPU cores it gave a "
    "subnetwork within 3 points of the full model for at most one seed in four "
    "(experiments/README.md): its subnetworks are not faithful; `cofi` is the CPU recipe that is.",
    "cofi": "CoFi's mechanics (the expected-L0 Lagrangian, exact discretisation), the recipe "
    "whose subnetworks are faithful on a CPU budget; the authors' recipe on a short schedule "
    "gave a faithful subnetwork for at most one seed in four (experiments/README.md) and needs "
    "their batch of 128 on a GPU: `--set pruning.profile=paper` (and `benchmarks/gpu_session.sh "
    "run recipe-full` when a GPU is there).",
}


def _overview(tables: ExperimentTables) -> ReportSection:
    section = ReportSection("Overview")
    config = tables.config
    if config:
        data, pruning = config.get("data", {}), config.get("pruning", {})
        lines = [
            f"- model: `{config.get('checkpoint') or config.get('model')}` "
            f"(task {config.get('task')})",
            f"- training data: `{data.get('train')}`; evaluation sets (in-domain first): "
            + ", ".join(f"{display_name(d)} (`{d}`)" for d in data.get("eval", [])),
            f"- pruning: sparsities {pruning.get('sparsities')}, seeds {pruning.get('seeds')}, "
            f"profile `{pruning.get('profile')}`, overrides {pruning.get('overrides') or {}}",
        ]
        profile = pruning.get("profile")
        lines.insert(0, f"**Pruning recipe: `{profile}`**: {RECIPE_NOTES.get(profile, '')}")
        if config.get("description"):
            lines.insert(1, config["description"])
        section.text("\n".join(lines))
    stages = [
        {
            "stage": info.get("stage"),
            "seconds": info.get("seconds"),
            "finished": info.get("finished"),
        }
        for info in tables.stages
    ]
    if stages:
        order = {name: i for i, name in enumerate(STAGES)}
        frame = pd.DataFrame(stages).sort_values("stage", key=lambda s: s.map(order))
        section.table(frame, "Stages finished (seconds each took when it ran).", digits=1)
    return section


def _file(tables: ExperimentTables, path: Path) -> str:
    """A results file as a caption names it: its path under the report folder."""
    return path.relative_to(tables.root).as_posix()


def _analysis(tables: ExperimentTables, role: str) -> Path:
    """The subnetwork comparison's file ``role`` (:data:`COMPARISON_FILES`)."""
    return tables.layout.analysis / COMPARISON_FILES[role]


def _finetune_section(tables: ExperimentTables) -> ReportSection | None:
    from mi_core.viz.figures import training_dynamics

    metrics = tables.finetune_metrics
    if metrics is None or metrics.empty:
        return None
    from mi_core.methods.heuristic_core.findings import _in_domain_names

    names = [str(d) for d in dict.fromkeys(metrics["dataset"])]
    # the experiment's data.in_domain (MNLI matched and mismatched in the paper configs);
    # without it the first set, which fine-tuning evaluates first
    in_domain = [display_name(d) for d in _in_domain_names(tables.config, names) or names[:1]]
    pretty = metrics.assign(dataset=metrics["dataset"].map(display_name))
    section = ReportSection("Fine-tuning")
    _, chance = _eval_meta(tables, pretty=True)
    # the examples fine-tuning evaluated on (its own cap, not the sweep's)
    n = dict(zip(pretty["dataset"], pretty["n"], strict=True)) if "n" in pretty else {}
    section.figure(
        training_dynamics(pretty, id_datasets=in_domain, n=n, chance=chance),
        "In-domain and out-of-domain accuracy of the full model during fine-tuning "
        f"({_file(tables, tables.layout.finetune_metrics)}).",
    )
    last = metrics[metrics["step"] == metrics["step"].max()]
    section.table(
        last.assign(dataset=last["dataset"].map(display_name)).reset_index(drop=True),
        "Accuracy of the fine-tuned model (last checkpoint).",
    )
    return section


def _subnetwork_sections(tables: ExperimentTables) -> list[ReportSection]:
    from mi_core.viz.figures import (
        accuracy_vs_sparsity,
        frequency_heatmap_figure,
        subcase_bars,
        subnetworks_figure,
    )

    runs = tables.runs
    if runs is None or runs.empty:
        return []
    names = _eval_names(runs)
    pretty = {n: display_name(n) for n in names}
    full = {n: float(runs[f"full_acc_{n}"].iloc[0]) for n in names if f"full_acc_{n}" in runs}
    sizes, chance = _eval_meta(tables)
    sizes_p, chance_p = _eval_meta(tables, pretty=True)
    sections = []

    gen = ReportSection("Subnetworks: in-domain vs out-of-domain (Figures 2-4)")
    table = runs.rename(columns={f"acc_{n}": pretty[n] for n in names})
    shown = ["subnetwork", "achieved_sparsity", "n_removed", "mlps_removed"]
    shown += [pretty[n] for n in names]
    full_row = {"subnetwork": "full model", **{pretty[n]: full.get(n) for n in names}}
    gen.table(
        pd.concat([pd.DataFrame([full_row]), table[shown]], ignore_index=True).reindex(
            columns=shown
        ),
        f"Accuracy of every subnetwork ({_file(tables, _analysis(tables, 'subnetworks'))}); the "
        "first row is the full model.",
    )
    gen.figure(
        subnetworks_figure(
            runs.rename(columns={f"acc_{n}": f"acc_{pretty[n]}" for n in names}),
            [pretty[n] for n in names],
            {pretty[n]: v for n, v in full.items()},
            n=sizes_p,
            chance=chance_p,
        ).update_layout(title="Figure 2: in-domain vs out-of-domain accuracy per subnetwork"),
        f"x: {pretty[names[0]]} accuracy; y: each out-of-domain set; labelled lines: the full "
        "model (dashed, dotted) and chance (grey, dash-dot).",
    )
    if len(names) > 1:
        for sparsity, group in runs.groupby("sparsity", sort=True):
            long = group.melt(
                id_vars=["subnetwork"],
                value_vars=[f"acc_{n}" for n in names[1:]],
                var_name="subcase",
                value_name="accuracy",
            )
            long["subcase"] = long["subcase"].str[len("acc_") :].map(pretty)
            gen.figure(
                subcase_bars(
                    long,
                    full_model_acc={pretty[n]: full[n] for n in names[1:] if n in full},
                    title=f"Figure 3: out-of-domain accuracy per subnetwork at sparsity "
                    f"{sparsity:g}",
                    n=sizes_p,
                    chance=chance_p,
                ),
                "Out-of-domain accuracy of each subnetwork of one sparsity, per subcase (the "
                "paper finds that different subnetworks generalise to different subcases; the "
                "findings table says whether this run does).",
            )
    grid = tables.grid_runs
    source, where = (runs, "the sweep") if grid is None or grid.empty else (grid, "grid/")
    long = source.melt(
        id_vars=["sparsity", "seed"],
        value_vars=[f"acc_{n}" for n in names if f"acc_{n}" in source],
        var_name="dataset",
        value_name="accuracy",
    )
    long["dataset"] = long["dataset"].str[len("acc_") :].map(pretty)
    gen.figure(
        accuracy_vs_sparsity(
            long,
            full_model_acc={pretty[n]: a for n, a in full.items()},
            title="Figure 4: accuracy vs sparsity (mean ± std over seeds)",
            n=sizes_p,
            chance=chance_p,
        ),
        f"Subnetworks of {where} ({source['sparsity'].nunique()} sparsities x "
        f"{source['seed'].nunique()} seeds). Dotted lines: the full model.",
    )
    sections.append(gen)

    core = ReportSection("Shared heads: frequency, the core, chance (Figure 5)")
    comparison = tables.comparison
    summary = None if comparison is None else comparison.core_table
    if summary is not None:
        all_row = summary[summary["group"].astype(str) == "all"]
        if not all_row.empty:
            r = all_row.iloc[0]
            paper = float(r.get("expected_random_intersection_paper", float("nan")))
            heads = str(r["core_heads"]) or "none"
            core.text(
                f"**{int(r['n_core'])} heads are kept by all {int(r['n_subnetworks'])} "
                f"subnetworks** (the heuristic core): {heads}. Independent random subnetworks "
                f"keeping as many heads would share "
                f"{format_value(float(r['expected_random_intersection']), 3)} heads on average "
                f"(the paper's count, m/n = 1 - target sparsity: {format_value(paper, 3)})."
            )
        core.table(
            summary,
            "Per sparsity and over all subnetworks: heads kept on average, the heads kept by "
            "every subnetwork (core) and the expected intersection of as many random "
            "subnetworks, n (m/n)^k, with m the heads kept on average and, as the paper "
            "computes it, m = n (1 - target sparsity) "
            f"({_file(tables, _analysis(tables, 'core_summary'))}).",
        )
    spearman = None if comparison is None else comparison.spearman
    if spearman is not None and not spearman.empty:
        core.table(
            spearman,
            "Spearman's rho between the head frequencies of two sparsities "
            f"({_file(tables, _analysis(tables, 'spearman'))}).",
        )
    for (a, b), counts in ({} if comparison is None else comparison.heatmaps).items():
        core.figure(
            frequency_heatmap_figure(
                counts.numpy(),
                label_a=f"sparsity {a}",
                label_b=f"sparsity {b}",
                title=f"Figure 5: heads by how many subnetworks keep them ({a} vs {b})",
            ),
            "Entry (i, j): heads kept by i subnetworks at the first sparsity and j at the "
            "second; the top-right cell is the shared core.",
        )
    core_heads = None if comparison is None else comparison.core_heads_table()
    if core_heads is not None and not core_heads.empty:
        core.table(
            core_heads,
            "Heads in a core, with their frequencies "
            f"({_file(tables, _analysis(tables, 'core_heads'))}).",
        )
    sections.append(core)
    return sections


def _span(values: pd.Series) -> str:
    """``a to b`` over the finite values (one number when they agree to 2 decimals)."""
    low, high = format_value(float(values.min()), 2), format_value(float(values.max()), 2)
    return low if low == high else f"{low} to {high}"


def _pruning_section(tables: ExperimentTables) -> ReportSection | None:
    """How the sweep's runs trained: sparsity against target, and the subnetwork's accuracy as
    it stood every ``eval_every`` steps."""
    from mi_core.methods.heuristic_core.results import pruning_runs
    from mi_core.viz.figures import pruning_dynamics

    logs, summary = tables.pruning_logs, tables.pruning_summary
    if logs is None and summary is None:  # tables built in memory: the runs' own folders
        logs, summary = pruning_runs(tables.runs)
    if (logs is None or logs.empty) and (summary is None or summary.empty):
        return None
    section = ReportSection("Pruning runs: did the gates settle?")
    if summary is not None and not summary.empty:
        met = summary["reached_target"].astype(bool)
        section.text(
            f"**{int(met.sum())} of {len(met)} runs met their target** (the sparsity each "
            "optimised, averaged over its last tenth of steps, within 0.05)."
        )
        gap = (summary["final_sampled_sparsity"] - summary["final_expected_sparsity"]).dropna()
        if len(gap):
            section.text(
                "The sampled minus the expected sparsity (the probability that a gate is "
                f"exactly 0) at the end: {_span(gap)}. A large positive gap means a run met a "
                "sampled target with half-open gates, so its discrete subnetwork is a model the "
                "run never trained (see experiments/README.md on the `quick` profile)."
            )
        section.table(summary, "One row per run, from its metrics.json.")
    if logs is not None and not logs.empty:
        runs = tables.runs
        names = _eval_names(runs) if runs is not None and not runs.empty else []
        first = names[0] if names else None
        full = None
        if first is not None and f"full_acc_{first}" in runs:
            full = float(runs[f"full_acc_{first}"].iloc[0])
        section.figure(
            pruning_dynamics(
                logs, full_accuracy=full, eval_name=display_name(first) if first else None
            ),
            "Top: each run's sampled (solid) and expected (dotted) sparsity against its target "
            "(grey). Bottom (when the runs evaluated as they trained): the subnetwork as it "
            "stood every `eval_every` steps, on the first evaluation set; dashed: the full "
            "model.",
        )
    return section


def _attention_section(tables: ExperimentTables) -> ReportSection | None:
    import torch

    from mi_core.analysis.attention_patterns import ALL_CLASSES
    from mi_core.methods.heuristic_core.attention import read_views
    from mi_core.viz.attention_html import attention_view_fragment
    from mi_core.viz.figures import attention_class_chart

    table = tables.attention_classes
    if table is None:
        return None
    section = ReportSection("Attention patterns of the core (Figures 7-9)")
    chosen = str(table["chosen_as"].iloc[0]) if "chosen_as" in table and len(table) else ""
    dataset = str(table["dataset"].iloc[0]) if "dataset" in table and len(table) else ""
    if chosen == "most frequent":
        section.text(
            "No head is kept by every subnetwork, so the most frequently kept heads are shown "
            "instead of a core."
        )
    columns = ["label", "pattern_class", "dominant", "dominant_mass", "dominant_excess"]
    columns += [f"{c}_mass" for c in ALL_CLASSES if f"{c}_mass" in table.columns]
    section.table(
        table[[c for c in columns if c in table.columns]],
        f"Mean attention mass per key class over `{display_name(dataset)}`; a head is labelled "
        "with its dominant class when the mass is high and well above a uniform pattern "
        f"({_file(tables, tables.layout.attention_classes)}).",
    )
    if len(table):
        section.figure(
            attention_class_chart(
                table, show_uniform=True, title="Figure 9: attention mass by token class"
            ),
            "Bars: mean attention mass on each key class; markers: a uniform pattern's.",
        )
    for i, view in enumerate(read_views(tables.layout.attention_views)):
        fragment = attention_view_fragment(
            view["tokens"],
            torch.tensor(view["pattern"]),
            view["heads"],
            causal=view.get("causal", False),
        )
        section.view(
            fragment,
            f"Example {i + 1} ({display_name(view['dataset'])}): "
            f"{view['title'].split(': ', 1)[-1]}",
        )
    return section


def _short_head_set(name: str, limit: int = 4) -> str:
    """``L1.H9+L3.H5+...`` with more than ``limit`` heads -> ``12 heads (L1.H9+...+L5.H11)``."""
    prefix, _, heads = name.rpartition(" ")
    parts = heads.split("+")
    if len(parts) <= limit:
        return name
    short = f"{len(parts)} heads ({parts[0]}+...+{parts[-1]})"
    return f"{prefix} {short}" if prefix else short


def _ablation_section(tables: ExperimentTables) -> ReportSection | None:
    if tables.ablation_display is None:
        return None
    table = tables.ablation_display.copy()
    section = ReportSection("Ablating the core (Tables 3/4)")
    if tables.ablation_note is not None:
        section.text(tables.ablation_note)
    first = table.columns[0]
    table[first] = table[first].map(_short_head_set)
    section.table(
        table.rename(columns={c: display_name(c) for c in table.columns}),
        "Accuracy in % with each head ablated from the full model (change in points), the "
        "average and std over every other head, joint ablations, and their superadditivity: "
        "the joint drop minus the sum of the single drops (positive = superadditive). Numbers: "
        f"{_file(tables, tables.layout.ablation_file('table'))}.",
    )
    return section


def _effective_size_section(tables: ExperimentTables) -> ReportSection | None:
    from mi_core.viz.figures import effective_size_over_training

    sizes, full = tables.effective_size, tables.full_accuracy
    if sizes is None or full is None:
        return None
    section = ReportSection("Effective size over training (Figure 6)")
    section.figure(
        effective_size_over_training(
            full.assign(dataset=full["dataset"].map(display_name)),
            sizes,
            step_col="step",
            title="Figure 6: accuracy and effective size over training",
        ),
        _effective_size_rule(sizes),
    )
    section.table(
        sizes,
        "Effective size per checkpoint and target "
        f"({_file(tables, tables.layout.effective_size_file('effective_size'))}).",
    )
    return section


def _effective_size_rule(sizes: pd.DataFrame) -> str:
    """How the effective sizes shown were computed (the table says which method made it)."""
    if "method" in sizes.columns and (sizes["method"] == "authors").all():
        return (
            "Effective size as the authors' script computes it: for each seed, 100 minus the "
            "largest sparsity whose accuracy stays strictly within the margin of the "
            "checkpoint's full model, then the mean over seeds; in-domain is the mean of the "
            "in-domain sets, out-of-domain of the others, mixed the mean of every set."
        )
    return (
        "Effective size as the paper's text defines it: 100 minus the largest sparsity whose "
        "mean accuracy over seeds stays within the margin of the checkpoint's full model; "
        "mixed is the equal mix of in-domain and out-of-domain."
    )


def _left_out(info: dict[str, Any]) -> str:
    n = int(info.get("n_left_out") or 0)
    return f" ({n} that removed nothing left out)" if n else ""


def _core_before_section(tables: ExperimentTables) -> ReportSection | None:
    info = tables.core_before
    if info is None:
        return None
    section = ReportSection("The core before generalisation (section 4)")
    floor = f"its floor (its lowest value after step 0: {format_value(info['ood_floor'], 3)}"
    if info.get("rise_step") is None:
        section.text(
            f"The full model's out-of-domain accuracy never rose more than the margin above "
            f"{floor}): it never left the heuristic regime, so there is no checkpoint before "
            "generalisation to prune."
        )
    elif info.get("checkpoint_step") is None:
        section.text(
            f"Out-of-domain accuracy rose at step {info['rise_step']}, before the first saved "
            "checkpoint: save checkpoints more often to look before it."
        )
    else:
        present = info.get("final_core_present", [])
        section.text(
            f"Out-of-domain accuracy starts to rise at step {info['rise_step']} "
            f"from {floor} -> {format_value(info['ood_at_rise'], 3)}); checkpoint "
            f"{info['checkpoint_step']} is the last before it. Its {info['n_subnetworks']} "
            f"subnetworks share {len(info['core'])} heads: {' '.join(info['core']) or 'none'}"
            f"{_left_out(info)}. "
            f"Of the final model's core ({' '.join(info['final_core']) or 'none'}), "
            f"{len(present)} are already there: {' '.join(present) or 'none'} "
            f"({_file(tables, tables.layout.core_before_summary)})."
        )
    return section


def _core_edges_section(tables: ExperimentTables) -> ReportSection | None:
    summary = tables.core_edges
    if summary is None or summary.empty:
        return None
    section = ReportSection("Edges around the core (circuits)")
    fill = str(summary["fill"].iloc[0])
    carries = {
        "mean": "its sender's mean output over training pairs (mean ablation)",
        "corrupted": "the counterpart pair's activation",
        "zero": "zero",
    }.get(fill, fill)
    section.text(
        "Edge-attribution scores (the estimated change of the entailment logit when an edge "
        f"carries {carries}) of every edge into or out of the core heads, with each subnetwork "
        "applied: total |score| per direction, for the subnetworks that generalise best and "
        f"worst out of domain ({_file(tables, tables.layout.core_edges_table)} has every edge)."
    )
    index = ["subnetwork", "group", "ood_accuracy"]
    gap_columns = [c for c in ("full", "empty", "gap_se", "small_gap") if c in summary]
    wide = summary.pivot_table(index=index, columns="direction", values="abs_score").reset_index()
    if gap_columns:
        gaps = summary[["subnetwork", *gap_columns]].drop_duplicates("subnetwork")
        wide = wide.merge(gaps, on="subnetwork", how="left")
    section.table(
        wide,
        "Sum of |score| over the edges touching the core, per direction; full / empty: the "
        "entailment logit (against the others) of the subnetwork and of its empty circuit, "
        "gap_se the standard error of their difference.",
    )
    if "small_gap" in summary:
        noisy = sorted(set(summary.loc[summary["small_gap"].astype(bool), "subnetwork"]))
        if noisy:
            which = ", ".join(map(str, noisy))
            one = len(noisy) == 1
            section.text(
                f"With the {fill} fill, the empty circuit{'' if one else 's'} of {which} "
                f"{'is' if one else 'are'} within noise of the subnetwork itself (a gap under a "
                "tenth of the metric or within two standard errors): the fill does not "
                f"measurably move {'it' if one else 'them'}, so the edge scores there describe "
                "noise, not a circuit."
            )
    return section


def _findings_section(findings: pd.DataFrame) -> ReportSection | None:
    if findings.empty:
        return None
    section = ReportSection("Findings: what this run reproduces")
    section.text(
        "Each claim of the paper against this run, judged by a fixed rule (see "
        "`mi_core/methods/heuristic_core/findings.py`). A verdict needs evidence: a full model "
        "above chance, converged runs, an effect of two standard errors computed from n, enough "
        "subnetworks; without it the claim is **inconclusive**, with the reason. A claim with "
        "under half the paper's effect is **reproduced, weaker**; one the run cannot test says "
        "why."
    )
    section.table(findings, "The paper's numbers are BERT-base on MNLI unless stated.")
    return section


def _files_section(root: Path) -> ReportSection:
    """Every table and figure the stages left, read from the layout's folders (no file name is
    repeated here: a stage that writes a new file shows up by itself)."""
    layout = ExperimentLayout(root)
    folders = (
        layout.finetune, layout.sweep, layout.analysis, layout.attention, layout.ablation,
        layout.effective_size, layout.grid, layout.core_before, layout.core_edges,
    )  # fmt: skip
    lines = []
    for folder in folders:
        for path in sorted(folder.glob("*")):
            if path.is_file() and path.suffix in (".csv", ".html", ".md"):
                lines.append(f"- `{path.relative_to(root).as_posix()}`")
    section = ReportSection("Files")
    section.text("\n".join(lines) or "No files.")
    return section


def build_report(
    results: str | os.PathLike[str] | ExperimentTables, findings: pd.DataFrame | None = None
) -> tuple[str, list[ReportSection]]:
    """The report's title and sections from an experiment's results (its report directory, or
    its tables already read) and its ``findings`` (computed from the results when None)."""
    from mi_core.methods.heuristic_core.findings import heuristic_core_findings

    tables = results if isinstance(results, ExperimentTables) else ExperimentTables.load(results)
    if findings is None:
        findings = heuristic_core_findings(tables)
    config, root = tables.config, tables.root
    title = f"Heuristic core: {config.get('name', root.name) if config else root.name}"
    sections = [_overview(tables)]
    for part in (
        _findings_section(findings),
        _finetune_section(tables),
        *_subnetwork_sections(tables),
        _pruning_section(tables),
        _attention_section(tables),
        _ablation_section(tables),
        _effective_size_section(tables),
        _core_before_section(tables),
        _core_edges_section(tables),
    ):
        if part is not None:
            sections.append(part)
    if root.is_dir():  # tables built in memory have no files to list
        sections.append(_files_section(root))
    return title, sections


def render_report(
    results: str | os.PathLike[str] | ExperimentTables, findings: pd.DataFrame | None = None
) -> tuple[str, str]:
    """The report as text, nothing written: self-contained offline HTML and its Markdown twin,
    from a report directory or from tables built in memory (a notebook's sweep and comparison:
    ``ExperimentTables(root=Path("mine"), runs=result.runs, comparison=comparison)``)."""
    title, sections = build_report(results, findings)
    return render_html(title, sections), render_markdown(title, sections)


def write_report(root: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``report.html`` (self-contained, offline) and ``report.md`` under ``root``."""
    from mi_core.methods.heuristic_core.findings import heuristic_core_findings

    tables = ExperimentTables.load(root)
    layout = tables.layout
    findings = heuristic_core_findings(tables)
    title, sections = build_report(tables, findings)
    if not findings.empty:
        write_csv(layout.findings, findings)
    html_path = write_text(layout.report_html, render_html(title, sections))
    md_path = write_text(layout.report_md, render_markdown(title, sections))
    return html_path, md_path
