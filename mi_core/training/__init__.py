"""Fine-tuning sequence classifiers, with checkpoints that Hugging Face and mi_core both open."""

from mi_core.training.finetune import FinetuneConfig, FinetuneSettings, finetune

__all__ = ["FinetuneConfig", "FinetuneSettings", "finetune"]
