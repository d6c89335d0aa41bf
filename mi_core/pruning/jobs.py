"""The pruning jobs: one run (``mi-core prune``) and a sweep (``mi-core sweep``), one config each.

A job names its model, means and data as paths / specs, a profile, and ``overrides``: the
:class:`~mi_core.pruning.profiles.PruneConfig` fields that differ from the profile (each one is
also a flag). :func:`run_prune_job` and :func:`run_sweep_job` take the config whole::

    config = SweepConfig(model="runs/ft/checkpoint-3000", means="means.safetensors",
                         train="mnli:train", eval=["mnli:validation_matched", "hans:so_swap"],
                         out="runs/sweep", sparsities=[0.5, 0.7], seeds=list(range(1, 13)))
    result = run_sweep_job(config)  # a SweepResult: result.runs, result.masks
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mi_core.config import Config, option
from mi_core.devices import DeviceOption
from mi_core.errors import ConfigError
from mi_core.pruning.constants import EXECUTORS
from mi_core.pruning.profiles import (
    PROFILES,
    PruneConfig,
    make_prune_config,
    parse_seed_spec,
    parse_sparsity_spec,
)
from mi_core.tasks import TASKS

if TYPE_CHECKING:  # the jobs import them when they run: the configs stay light
    from mi_core.pruning.result import PruneResult
    from mi_core.pruning.sweeps import SweepResult

__all__ = [
    "EXECUTION_FIELDS",
    "PruneJobSettings",
    "PruneRunConfig",
    "SweepConfig",
    "SweepExecution",
    "run_prune_job",
    "run_sweep_job",
]


@dataclass(kw_only=True)
class SweepExecution(Config):
    """Where and how the runs of a sweep execute: here one after another, here in batched
    groups trained together, or as Ray tasks. Changes where runs compute, never what."""

    executor: str = option("local", choices=EXECUTORS)
    """local: one run after another here; batched: --group-size runs trained together through
    one forward / backward pass here; ray: each run (or group of --group-size runs) a Ray task."""
    group_size: int | None = None
    """Runs trained together by the batched executor (default: as many as memory allows) or per
    Ray task (default 1)."""
    ray_address: str | None = None
    """Ray cluster address (default: a local Ray instance)."""
    num_cpus_per_run: float = 1.0
    """Ray CPUs per task."""
    num_gpus_per_run: float = 0.0
    """Ray GPUs per task (fractions share a GPU)."""

    def validate(self) -> None:
        super().validate()
        if self.group_size is not None and self.group_size < 1:
            raise ConfigError(f"group_size must be at least 1, got {self.group_size}")
        if self.group_size not in (None, 1) and self.executor == "local":
            raise ConfigError("group_size needs executor batched or ray (local runs one by one)")
        if self.num_cpus_per_run <= 0 or self.num_gpus_per_run < 0:
            raise ConfigError("num_cpus_per_run must be > 0 and num_gpus_per_run >= 0")

    def execution(self) -> dict[str, Any]:
        """These settings as keyword arguments of :func:`~mi_core.pruning.sweeps.run_sweep`."""
        return {f: getattr(self, f) for f in EXECUTION_FIELDS}


#: The fields of :class:`SweepExecution` (they change where runs execute, not their results).
EXECUTION_FIELDS = ("executor", "group_size", "ray_address", "num_cpus_per_run", "num_gpus_per_run")


@dataclass(kw_only=True)
class PruneJobSettings(DeviceOption):
    """What every pruning job names: the model, its means, the data and the recipe."""

    model: str
    """Fine-tuned checkpoint dir, hub name, or minilm."""
    task: str | None = option(None, choices=TASKS)
    """Model task if ambiguous."""
    means: str | None = None
    """Means .safetensors from mi-core means (needed for mean ablation)."""
    train: str
    """Training data spec: sentence pairs (mnli:train), a prompt task (ioi:abba) or, for a
    language model, plain text (text:wikitext: the KL at every position)."""
    eval: list[str] = option(default_factory=list, metavar="DATA")
    """Eval sets; the first is in-domain."""
    out: str
    """Output directory."""
    profile: str = option("paper", choices=PROFILES)
    """paper: the authors' recipe; quick: the same on a short schedule; cofi: CoFi's mechanics
    on the paper's schedule."""
    overrides: dict[str, Any] = option(default_factory=dict, cli=False)
    """PruneConfig fields that differ from the profile (the recipe flags set them)."""
    max_train_examples: int | None = None
    """Use only the first training examples."""
    max_eval_examples: int | None = None
    """Use only the first examples of every eval set."""

    def validate(self) -> None:
        super().validate()
        make_prune_config(self.profile, 0.5, 0, **self.overrides)  # names and values checked


@dataclass(kw_only=True)
class PruneRunConfig(PruneJobSettings):
    """One pruning run (``mi-core prune``): resumes when re-run; a finished run only reports."""

    sparsity: float
    """Target sparsity in (0, 1)."""
    seed: int = 42
    """Seed of the run."""

    def prune_config(self) -> PruneConfig:
        """The run's hyperparameters: the profile at this sparsity and seed, with overrides."""
        return make_prune_config(self.profile, self.sparsity, self.seed, **self.overrides)

    def validate(self) -> None:
        super().validate()
        self.prune_config()


@dataclass(kw_only=True)
class SweepConfig(PruneJobSettings, SweepExecution):
    """One pruning run per (sparsity, seed) (``mi-core sweep``); finished runs are skipped."""

    sparsities: list[float] = option(parse=parse_sparsity_spec, metavar="SPEC")
    """Target sparsities, e.g. 0.5,0.7 or 0.05:0.7:0.05."""
    seeds: list[int] = option(parse=parse_seed_spec, metavar="SPEC")
    """Seeds: 42-53 or 1,2,5 name them; a bare count N means seeds 0 to N-1."""

    def validate(self) -> None:
        super().validate()
        if not self.sparsities or not self.seeds:
            raise ConfigError("a sweep needs at least one sparsity and one seed")


def run_prune_job(config: PruneRunConfig, *, progress: bool = True) -> PruneResult:
    """Run (or resume, or report) the pruning run of ``config`` under ``config.out``."""
    from mi_core.pruning.run import prune_run

    return prune_run(
        config.model,
        config.train,
        config.out,
        config.prune_config(),
        means=config.means,
        eval_sets=config.eval,
        task=config.task,
        max_train_examples=config.max_train_examples,
        max_eval_examples=config.max_eval_examples,
        progress=progress,
        device=config.device,
    )


def run_sweep_job(config: SweepConfig, *, progress: bool = True) -> SweepResult:
    """Run every missing run of ``config``'s sweep; return its runs (metrics table and masks,
    ``SweepResult.load(config.out)``, as :func:`~mi_core.pruning.sweeps.sweep` returns them)."""
    from mi_core.pruning.sweeps import SweepResult, run_sweep

    run_sweep(
        config.model,
        config.train,
        config.out,
        config.sparsities,
        config.seeds,
        means=config.means,
        eval_sets=config.eval,
        profile=config.profile,
        overrides=config.overrides,
        task=config.task,
        max_train_examples=config.max_train_examples,
        max_eval_examples=config.max_eval_examples,
        progress=progress,
        device=config.device,
        **config.execution(),
    )
    return SweepResult.load(config.out, config.sparsities, config.seeds)
