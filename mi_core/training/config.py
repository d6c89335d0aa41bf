"""The fine-tuning job's config: light, so ``mi-core finetune --help`` imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from mi_core.config import Config, option
from mi_core.devices import PRECISIONS, DeviceOption
from mi_core.errors import ConfigError
from mi_core.tasks import TASKS

__all__ = ["FinetuneConfig", "FinetuneSettings"]


@dataclass
class FinetuneSettings(Config):
    """How to fine-tune (AdamW, linear schedule; the paper's: lr 2e-5, batch 32).

    The heuristic-core experiment's ``finetune`` section; :class:`FinetuneConfig` adds the
    model, the data and the output directory.
    """

    steps: int
    """Optimizer steps."""
    save_every: int = 500
    """Steps between checkpoints (the last step is always saved)."""
    lr: float = 2e-5
    """Peak learning rate."""
    batch_size: int = 32
    """Examples per step."""
    seed: int = 0
    """Seed of the classifier head, the data order and dropout."""
    max_length: int = 128
    """Token limit per example."""
    warmup_steps: int = 0
    """Steps of linear learning-rate warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    eval_batch_size: int = 64
    """Batch size of the evaluations."""
    max_eval_examples: int | None = None
    """Cap on every evaluation set (the first rows are kept)."""
    max_train_examples: int | None = None
    """Cap on the training examples."""
    group_by_length: bool = True
    """Batches of examples of similar length (as Hugging Face's Trainer with group_by_length);
    off: batches drawn uniformly at random."""
    save_total_limit: int | None = None
    """Keep only the newest this many checkpoints (default: all of them, as effective size
    over training needs). The optimizer state is kept in the newest two only."""
    precision: str = option("fp32", choices=PRECISIONS)
    """fp32; tf32 (float32 tensors, matrix products in TensorFloat-32 on GPUs that have it); or
    autocast of the forward pass to bf16 or fp16 (with loss scaling). Weights and optimizer
    state stay float32."""

    def validate(self) -> None:
        super().validate()
        for name in ("steps", "save_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.save_total_limit is not None and self.save_total_limit < 2:
            raise ConfigError(
                f"save_total_limit must be at least 2 (resuming falls back to the checkpoint "
                f"before the newest), got {self.save_total_limit}"
            )
        if self.batch_size < 1 or self.eval_batch_size < 1 or not (0 < self.lr < 1):
            raise ConfigError("batch_size and eval_batch_size must be >= 1 and lr in (0, 1)")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be at least 0, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be at least 0, got {self.weight_decay}")
        for name in ("max_eval_examples", "max_train_examples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1 (or null), got {value}")


@dataclass(kw_only=True)
class FinetuneConfig(FinetuneSettings, DeviceOption):
    """A fine-tuning job: the settings, the model, the data, where to write (saved as
    ``finetune_config.json``) and the device."""

    model: str
    """Checkpoint dir, hub name, or minilm."""
    task: str = option(choices=TASKS)
    """The pair task of the classifier head."""
    train: str
    """Training data spec, e.g. mnli:train."""
    out: str
    """Output directory: checkpoints, metrics.csv, training_dynamics.html."""
    eval: list[str] = option(default_factory=list, metavar="DATA")
    """Evaluation sets; the first is in-domain."""
