"""The stages of the heuristic-core experiment, described once, as data.

Each :class:`Stage` names what it reads (upstream stages), what it writes (paths under the
report directory), when it is part of an experiment, the settings its key hashes, and the
:class:`~mi_core.methods.heuristic_core.pipeline.HeuristicCoreExperiment` method that runs it.
The pipeline runs them in this order; the report and the CLI read their names and order here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mi_core.methods.heuristic_core.config import ExperimentConfig
from mi_core.pruning.jobs import EXECUTION_FIELDS

#: Pruning settings that change where a run executes, not what it computes (not in keys).
_EXECUTION = EXECUTION_FIELDS


def _pruning(c: ExperimentConfig) -> dict[str, Any]:
    return {k: v for k, v in asdict(c.pruning).items() if k not in _EXECUTION}


def _finetune(c: ExperimentConfig) -> tuple:
    settings = None if c.finetune is None else asdict(c.finetune)
    return (c.model, c.task, c.checkpoint, asdict(c.data), settings)


@dataclass(frozen=True)
class Stage:
    """One resumable step of the experiment."""

    name: str
    description: str
    inputs: tuple[str, ...]
    """Upstream stages: their keys enter this stage's key, so a change there re-runs it."""
    outputs: tuple[str, ...]
    """What it writes, relative to the report directory."""
    settings: Callable[[ExperimentConfig], tuple]
    """The config values its key hashes (with the upstream keys)."""
    enabled: Callable[[ExperimentConfig], bool] = lambda c: True
    """Whether this experiment runs it (``"off"`` otherwise)."""

    @property
    def run(self) -> str:
        """The :class:`HeuristicCoreExperiment` method that runs the stage."""
        return f"_run_{self.name}"


STAGE_SPECS: tuple[Stage, ...] = (
    Stage(
        "finetune",
        "fine-tune the pretrained model, saving checkpoints (unless a checkpoint is given)",
        (),
        ("finetune/",),
        _finetune,
        lambda c: c.finetune is not None,
    ),
    Stage(
        "means",
        "mean activations of every head and MLP on the training set",
        ("finetune",),
        ("means.safetensors",),
        lambda c: (asdict(c.means),),
        lambda c: c.means.path is None,
    ),
    Stage(
        "sweep",
        "one pruning run per (sparsity, seed)",
        ("means",),
        ("sweep/",),
        lambda c: (_pruning(c),),
    ),
    Stage(
        "analysis",
        "head frequencies, cores, Spearman agreement, chance intersections, heatmaps",
        ("sweep",),
        ("analysis/",),
        lambda c: (),
    ),
    Stage(
        "attention",
        "attention classes of the core heads and example views",
        ("analysis",),
        ("attention/",),
        lambda c: (asdict(c.attention),),
    ),
    Stage(
        "ablation",
        "single and joint ablations of the core heads",
        ("analysis", "means"),
        ("ablation/",),
        lambda c: (asdict(c.ablation),),
    ),
    Stage(
        "effective_size",
        "effective size over fine-tuning checkpoints",
        ("finetune",),
        ("effective_size/",),
        lambda c: (_pruning(c), asdict(c.effective_size)),
        lambda c: c.effective_size.enabled,
    ),
    Stage(
        "grid",
        "Figure 4: the fine-tuned model pruned on a sparsity x seed grid",
        ("means",),
        ("grid/",),
        lambda c: (_pruning(c), asdict(c.grid)),
        lambda c: c.grid.enabled,
    ),
    Stage(
        "core_before",
        "the core of the last checkpoint before the model generalises",
        ("analysis",),
        ("core_before/",),
        # the rule's version: summaries measured from the step-0 evaluation are re-made
        lambda c: (_pruning(c), asdict(c.core_before), "rise from the trained floor"),
        lambda c: c.core_before.enabled,
    ),
    Stage(
        "core_edges",
        "edges into and out of the core heads, in subnetworks that generalise and that do not",
        ("analysis", "means"),
        ("core_edges/",),
        lambda c: (asdict(c.core_edges),),
        lambda c: c.core_edges.enabled,
    ),
    Stage(
        "report",
        "the self-contained HTML report, its Markdown twin and the findings table",
        (
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
        ),
        ("report.html", "report.md", "findings.csv"),
        lambda c: (),
    ),
)

#: The stage names, in the order they run.
STAGES: tuple[str, ...] = tuple(stage.name for stage in STAGE_SPECS)
STAGE_BY_NAME: dict[str, Stage] = {stage.name: stage for stage in STAGE_SPECS}
