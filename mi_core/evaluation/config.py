"""The evaluation job's config (``mi-core eval``): light, so a command's ``--help`` imports no
torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mi_core.config import option
from mi_core.devices import ModelPlacement
from mi_core.errors import ConfigError
from mi_core.interventions.config import UNIT_FILLS
from mi_core.tasks import TASKS

__all__ = ["EvalConfig"]


@dataclass(kw_only=True)
class EvalConfig(ModelPlacement):
    """The evaluation job (``mi-core eval``): accuracy on data sets, optionally of a
    subnetwork (components ablated by a mask file or by name)."""

    model: str
    """Checkpoint dir, hub name, or minilm."""
    task: str | None = option(None, choices=TASKS)
    """Task head to load (default: the checkpoint's own)."""
    data: list[str] = option(metavar="DATA")
    """Data specs, e.g. mnli:validation_matched hans:so_swap."""
    out: str
    """Results CSV (columns dataset, n, accuracy)."""
    predictions: str | None = None
    """Per-example predictions (JSONL): data set, index, the source row's identifiers (HANS
    pairID and subcase, GLUE idx, PAWS id and split), label, prediction and logits."""
    batch_size: int = 64
    """Examples per forward pass."""
    max_length: int = 128
    """Token limit per example."""
    max_examples: int | None = None
    """Use only the first examples of each data set."""
    means: str | None = None
    """Means file from mi-core means (for mean ablation)."""
    mask: str | None = None
    """Mask file (.safetensors or .json) of the subnetwork to evaluate."""
    ablate: str | None = None
    """Components to remove, e.g. L2.H5,L4.MLP."""
    fill: str = option("mean", choices=UNIT_FILLS)
    """What replaces a removed component: its mean activation or zero."""

    def validate(self) -> None:
        super().validate()
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1, not {self.batch_size}")
        if self.mask and self.ablate:
            raise ConfigError("give either --mask or --ablate, not both")
        if self.ablate is not None and not self.ablate.strip(" ,"):
            raise ConfigError(
                "--ablate is empty: name the components to remove (e.g. L2.H5,L4.MLP), or leave "
                "it out to evaluate the full model"
            )
        if self.predictions and Path(self.predictions).resolve() == Path(self.out).resolve():
            raise ConfigError("--predictions and --out name the same file; give two paths")
