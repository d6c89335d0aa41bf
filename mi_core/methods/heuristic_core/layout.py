"""Where every file of a heuristic-core experiment lives, named once.

The stages write through these paths and :class:`~.results.ExperimentTables` reads them back
(the report, the findings and :class:`~.pipeline.HeuristicCoreResult` read through it), so a
file's name is spelled in one place::

    layout = ExperimentLayout("runs/bert-report")
    comparison = SubnetworkComparison.load(layout.analysis)
    tables = ExperimentTables.load(layout.root)   # every stage's results, typed
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ABLATION_FILES", "EFFECTIVE_SIZE_FILES", "STAGES", "ExperimentLayout"]

#: The stages, in the order they run; each leaves ``stages/<name>.json`` when it finishes.
#: :data:`~.stages.STAGE_SPECS` describes each, in this order; the names live here, with the
#: files, because the report orders them and the report stage's run function imports the
#: report (the table importing it back would be a cycle).
STAGES: tuple[str, ...] = (
    "finetune",
    "means",
    "sweep",
    "analysis",
    "attention",
    "ablation",
    "effective_size",
    "grid",
    "core_before",
    "core_edges",
    "report",
)

#: The ablation stage's files (``run_core_ablation``).
ABLATION_FILES = {
    "table": "ablation_table.csv",
    "display": "ablation_display.csv",
    "markdown": "ablation_table.md",
    "note": "note.md",
    "examples": "examples.json",
}
#: The effective-size stage's files (``run_effective_size``).
EFFECTIVE_SIZE_FILES = {
    "accuracy": "accuracy.csv",
    "full_accuracy": "full_accuracy.csv",
    "faithfulness": "faithfulness.csv",
    "effective_size": "effective_size.csv",
    "figure": "effective_size.html",
}
ATTENTION_CLASSES = "attention_classes.csv"
ATTENTION_VIEWS = "views.json"
SUMMARY = "summary.json"


@dataclass(frozen=True)
class ExperimentLayout:
    """The paths under one experiment's report directory."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / "experiment.json"

    @property
    def stages(self) -> Path:
        return self.root / "stages"

    def stage_marker(self, stage: str) -> Path:
        """The file a finished stage leaves (its key and outputs)."""
        return self.stages / f"{stage}.json"

    @property
    def finetune(self) -> Path:
        return self.root / "finetune"

    @property
    def finetune_metrics(self) -> Path:
        return self.finetune / "metrics.csv"

    @property
    def means(self) -> Path:
        return self.root / "means.safetensors"

    @property
    def sweep(self) -> Path:
        return self.root / "sweep"

    @property
    def analysis(self) -> Path:
        return self.root / "analysis"

    @property
    def attention(self) -> Path:
        return self.root / "attention"

    @property
    def attention_classes(self) -> Path:
        return self.attention / ATTENTION_CLASSES

    @property
    def attention_views(self) -> Path:
        return self.attention / ATTENTION_VIEWS

    @property
    def ablation(self) -> Path:
        return self.root / "ablation"

    def ablation_file(self, role: str) -> Path:
        """``table``, ``display``, ``markdown``, ``note`` or ``examples`` (n per data set)."""
        return self.ablation / ABLATION_FILES[role]

    @property
    def effective_size(self) -> Path:
        return self.root / "effective_size"

    def effective_size_file(self, role: str) -> Path:
        """``accuracy``, ``full_accuracy``, ``faithfulness``, ``effective_size``, ``figure``."""
        return self.effective_size / EFFECTIVE_SIZE_FILES[role]

    @property
    def grid(self) -> Path:
        return self.root / "grid"

    @property
    def core_before(self) -> Path:
        return self.root / "core_before"

    @property
    def core_before_summary(self) -> Path:
        return self.core_before / SUMMARY

    @property
    def core_edges(self) -> Path:
        return self.root / "core_edges"

    @property
    def core_edges_table(self) -> Path:
        """Every edge touching the core, per subnetwork: ``subnetwork, group, ood_accuracy,
        edge, sender, receiver, direction, score``."""
        return self.core_edges / "edges.csv"

    @property
    def core_edges_summary(self) -> Path:
        """Per subnetwork and direction (into / out of / within the core): ``sum |score|``."""
        return self.core_edges / "summary.csv"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def findings(self) -> Path:
        return self.root / "findings.csv"
