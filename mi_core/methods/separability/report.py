"""Write a separability run's results: trajectory CSV, summary JSON, figures, pruned components."""

from __future__ import annotations

import os
from pathlib import Path

from mi_core.io import write_csv, write_json, write_text
from mi_core.methods.separability.run import SeparabilityResult
from mi_core.statistics.constants import DIFFERENCE_SCORINGS
from mi_core.viz.page import ReportSection, render_html
from mi_core.viz.separability import score_distribution_figure, trajectory_figure

#: Files :func:`write_separability_outputs` writes, by role.
OUTPUT_FILES = {
    "trajectory": "trajectory.csv",
    "summary": "summary.json",
    "figures": "figures.html",
    "masks": "masks.safetensors",
    "listing": "pruned.json",
    "random_masks": "random_masks.safetensors",
}


def figures_html(result: SeparabilityResult, include_plotlyjs: bool | str = True) -> str:
    """One standalone HTML page (:func:`mi_core.viz.page.render_html`): the trajectories and
    the first step's score distributions. ``include_plotlyjs``: as ``render_html`` takes it
    (``True``: inlined, the page works offline; ``"cdn"``: linked)."""
    trajectories = ReportSection("Trajectories").figure(
        trajectory_figure(
            result.trajectory,
            result.config.mode,
            focus_name=result.focus_name,
            cripple_name=result.cripple_name,
        )
    )
    scores = ReportSection("Scores at the first step")
    labels = {"mlp": "MLP neurons (mlp.hook_post)", "attn": "attention pre-out neurons (hook_z)"}
    scoring = {"mlp": result.config.ff_scoring, "attn": result.config.attn_scoring}
    for site, values in result.first_scores.items():
        scores.figure(
            score_distribution_figure(
                values,
                title=f"log10 {scoring.get(site, site)} score ({result.cripple_name} vs "
                f"{result.focus_name}), {labels.get(site, site)}, step 1",
                difference=scoring.get(site) in DIFFERENCE_SCORINGS,
            )
        )
    sections = [trajectories, *([scores] if scores.blocks else [])]
    title = f"Separability: {result.cripple_name} vs {result.focus_name}"
    return render_html(title, sections, include_plotlyjs=include_plotlyjs)


def write_separability_outputs(
    result: SeparabilityResult,
    out_dir: str | os.PathLike[str],
    extra_summary: dict | None = None,
    include_plotlyjs: bool | str = True,
) -> dict[str, Path]:
    """Write every output file of a run into ``out_dir`` (atomically, each); return the paths."""
    out = Path(out_dir)
    paths = {role: out / name for role, name in OUTPUT_FILES.items()}
    write_csv(paths["trajectory"], result.trajectory)
    write_json(paths["summary"], {**(extra_summary or {}), **result.summary()})
    write_text(paths["figures"], figures_html(result, include_plotlyjs))
    meta = {"focus": result.focus_name, "cripple": result.cripple_name}
    result.masks.save(paths["masks"], metadata=meta)
    result.masks.save_listing(paths["listing"])
    if result.random_masks is not None:
        result.random_masks.save(paths["random_masks"], metadata={**meta, "method": "random"})
    else:
        paths.pop("random_masks")
    return paths
