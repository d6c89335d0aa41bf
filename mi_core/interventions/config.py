"""The configs of the intervention jobs (``mi-core means``, ``mi-core ablate``): light, so a
command's ``--help`` imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mi_core.config import Config, option
from mi_core.devices import ModelPlacement
from mi_core.errors import ConfigError
from mi_core.tasks import TASKS

__all__ = ["FILLS", "UNIT_FILLS", "AblationTableConfig", "MeansConfig", "MeansSettings"]

#: What replaces a removed unit (a head, an MLP, a neuron): its mean activation or zero. The
#: values of :class:`~mi_core.interventions.Fill` and of every ``fill`` option that removes
#: units (``mi-core prune``, ``eval``, ``ablate``, ``separability``, heuristic-core's ablation).
UNIT_FILLS = ("mean", "zero")


@dataclass
class MeansSettings(Config):
    """Which data the means average over, and how it is batched."""

    data: str | None = None
    """Data spec to average over (default: the training split of the model's task)."""
    max_examples: int | None = None
    """Use only the first examples of the data set."""
    batch_size: int = 64
    """Examples per forward pass."""
    max_length: int = 128
    """Token limit per example."""
    by_position: bool = False
    """Also average each position on its own: a removed component is then filled with its
    mean at the token's position (for prompts of one template, where a position has one role;
    the default, as the paper, is one mean over every token)."""

    def validate(self) -> None:
        super().validate()
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, not {self.batch_size}")


@dataclass(kw_only=True)
class MeansConfig(MeansSettings, ModelPlacement):
    """The means job (``mi-core means``): a model's mean activations written to a file."""

    model: str
    """Checkpoint dir, hub name, or minilm."""
    task: str | None = option(None, choices=TASKS)
    """Task head to load (default: the checkpoint's own)."""
    out: str
    """Output file (.safetensors)."""

    def validate(self) -> None:
        super().validate()
        if Path(self.out).suffix.lower() != ".safetensors":
            raise ConfigError(f"--out {self.out}: means are written as .safetensors")


@dataclass(kw_only=True)
class AblationTableConfig(ModelPlacement):
    """The ablation-table job (``mi-core ablate``; the paper's Tables 3, 4 and 8)."""

    model: str
    """Checkpoint dir, hub name, or minilm."""
    task: str | None = option(None, choices=TASKS)
    """Task head to load (default: the checkpoint's own)."""
    means: str | None = None
    """Means file from mi-core means (needed for mean ablation)."""
    heads: str
    """Heads to list, e.g. L2.H3,L2.H5, or all."""
    joint: list[str] = option(default_factory=list, metavar="SET")
    """Sets of heads ablated together, e.g. L2.H5+L3.H7+L4.H0."""
    data: list[str] = option(metavar="DATA")
    """Data specs, e.g. mnli:validation_matched hans:so_swap."""
    out: str
    """Table CSV (.md and .html are written beside it)."""
    fill: str = option("mean", choices=UNIT_FILLS)
    """What replaces an ablated head: its mean activation or zero."""
    others: bool = False
    """Also ablate every unlisted head, one at a time, for the Avg. (others) row (one forward
    pass per head: slow on large models)."""
    batch_size: int = 64
    """Examples per forward pass."""
    max_length: int = 128
    """Token limit per example."""
    max_examples: int | None = None
    """Use only the first examples of each data set."""

    def validate(self) -> None:
        super().validate()
        if Path(self.out).suffix.lower() != ".csv":
            raise ConfigError(f"--out {self.out}: the table is written as .csv (with .md, .html)")
        if not self.heads.strip():
            raise ConfigError("--heads is empty; name heads (L2.H3,L2.H5) or all")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1, not {self.batch_size}")
        if self.fill == "mean" and not self.means:
            raise ConfigError(
                "mean ablation needs --means FILE (from mi-core means), or --fill zero"
            )


#: What replaces an edge mask's removed edge: a unit's fills (:data:`UNIT_FILLS`) or the
#: sender's output on the corrupted input of the pair.
FILLS = ("corrupted", "mean", "zero")
