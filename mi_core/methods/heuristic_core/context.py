"""What the stages of the heuristic-core experiment share: the config, the report directory's
layout, and the inputs they load once (the fine-tuned model, its means, the evaluation sets).

Each stage (:mod:`~mi_core.methods.heuristic_core.stages`) is a function of an
:class:`ExperimentContext`; :class:`~.pipeline.HeuristicCoreExperiment` is one that also keys,
skips and runs the stages.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mi_core.errors import ConfigError
from mi_core.methods.heuristic_core.comparison import SubnetworkComparison
from mi_core.methods.heuristic_core.config import ExperimentConfig
from mi_core.methods.heuristic_core.layout import ExperimentLayout
from mi_core.pruning.sweeps import SweepResult, load_sweep
from mi_core.tasks import NEXT_TOKEN

if TYPE_CHECKING:
    from mi_core.interventions import ComponentMeans
    from mi_core.models.types import HookedModel

__all__ = ["ExperimentContext"]


class ExperimentContext:
    """One config's inputs under the report directory ``out``, loaded when first used."""

    def __init__(
        self, config: ExperimentConfig, out: str | os.PathLike[str], *, progress: bool = True
    ) -> None:
        self.config = config
        self.out = Path(out)
        self.layout = ExperimentLayout(self.out)
        self.progress = progress
        self.device = str(config.torch_device())
        self._model: HookedModel | None = None
        self._means: Any = None
        self._eval_sets: list[Any] | None = None

    @property
    def model_path(self) -> str:
        """The fine-tuned model: the given checkpoint or the fine-tuning run's last one (a
        language model as it is, for a prompt task)."""
        if self.config.checkpoint is not None:
            return self.config.checkpoint
        from mi_core.training.checkpoints import list_checkpoints

        found = list_checkpoints(self.layout.finetune)
        if not found:
            raise ConfigError(f"no checkpoint in {self.layout.finetune}; run the finetune stage")
        return str(found[-1][1])

    @property
    def model(self) -> Any:
        """The fine-tuned model, loaded on the config's device."""
        if self._model is None:
            from mi_core.models import load_model

            self._model = load_model(self.model_path, task=self.config.task, device=self.device)
        return self._model

    @property
    def means_path(self) -> Path:
        """The means file: the config's, or the one the means stage writes."""
        if self.config.means.path is not None:
            return Path(self.config.means.path)
        return self.layout.means

    @property
    def means(self) -> Any:
        """The fine-tuned model's means, read from :attr:`means_path` (checked against it)."""
        if self._means is None:
            from mi_core.interventions import load_means

            self._means = load_means(self.means_path, self.model)
        return self._means

    def forget_means(self) -> None:
        """Drop the means read so far: the next use reads :attr:`means_path` again (after the
        means stage replaced it)."""
        self._means = None

    @property
    def train_cap(self) -> int | None:
        """Training examples a pruning run takes (None: all)."""
        return self.config.pruning.max_train_examples or self.config.data.max_train_examples

    @property
    def eval_cap(self) -> int | None:
        """Examples of each evaluation set a pruning run takes (None: all)."""
        return self.config.pruning.max_eval_examples or self.config.data.max_eval_examples

    def load_data(self, spec: str, max_examples: int | None, *, train: bool = False) -> Any:
        """A data set of the config: sentence pairs of its task, or a prompt task (IOI prompts
        drawn from the training or the evaluation seed, as a pruning job draws them)."""
        from mi_core.data.prompt_tasks import EVAL_SEED, TRAIN_SEED, load_task_data

        if self.config.task == NEXT_TOKEN:
            seed = TRAIN_SEED if train else EVAL_SEED
            return load_task_data(spec, max_examples, tokenizer=self.model.tokenizer, seed=seed)
        from mi_core.data import load_pairs

        return load_pairs(spec, max_examples=max_examples, task=self.config.task)

    @property
    def eval_sets(self) -> list[Any]:
        """The evaluation sets (capped as for pruning), in-domain first."""
        if self._eval_sets is None:
            self._eval_sets = [
                self.load_data(spec, self.eval_cap) for spec in self.config.data.eval
            ]
        return self._eval_sets

    def prune_grid(
        self,
        out: Path,
        sparsities: list[float],
        seeds: list[int],
        model: HookedModel | str | None = None,
        means: Path | None = None,
    ) -> None:
        """Prune at every sparsity x seed with the config's pruning: the fine-tuned model and
        its means, or ``model`` (a loaded model, or a checkpoint path for Ray) and ``means``."""
        from mi_core.interventions import load_means
        from mi_core.pruning.sweeps import run_sweep

        p, ray = self.config.pruning, self.config.pruning.executor == "ray"
        if model is None:
            model = self.model_path if ray else self.model
        loaded: str | ComponentMeans
        if ray:  # Ray workers read the means themselves
            loaded = str(means or self.means_path)
        elif means is None:  # read once, shared with the ablation and core_edges stages
            loaded = self.means
        else:  # a checkpoint's own means (core_before)
            loaded = load_means(means, model)
        run_sweep(
            model,
            self.config.data.train,
            out,
            sparsities,
            seeds,
            means=loaded,
            eval_sets=list(self.config.data.eval),
            profile=p.profile,
            overrides=p.overrides,
            task=self.config.task,
            max_train_examples=self.train_cap,
            max_eval_examples=self.eval_cap,
            progress=self.progress,
            device=self.config.device,
            **p.execution(),
        )

    def load_sweep(self) -> SweepResult:
        """The sweep's finished runs of this config's sparsities and seeds."""
        p = self.config.pruning
        return load_sweep(self.layout.sweep, sparsities=p.sparsities, seeds=p.seeds)

    def chosen_heads(self) -> tuple[list[str], str]:
        """The heads to inspect and why: ``(heads, "config" | "core" | "most frequent")``."""
        from mi_core.methods.heuristic_core.attention import choose_heads

        comparison = SubnetworkComparison.load(self.layout.analysis)
        core = comparison.core
        a = self.config.attention
        heads = choose_heads(core, comparison.frequency, a.heads, a.max_heads)
        reason = "config" if a.heads else ("core" if core else "most frequent")
        return heads, reason
