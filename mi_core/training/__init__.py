"""Fine-tuning sequence classifiers, with checkpoints that Hugging Face and mi_core both open."""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
    from mi_core.training.finetune import FinetuneConfig, FinetuneSettings, finetune
    from mi_core.training.walkthrough import walkthrough_classifier

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "FinetuneConfig": "mi_core.training.config",
    "FinetuneSettings": "mi_core.training.config",
    "finetune": "mi_core.training.finetune",
    "walkthrough_classifier": "mi_core.training.walkthrough",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


__all__ = ["FinetuneConfig", "FinetuneSettings", "finetune", "walkthrough_classifier"]
