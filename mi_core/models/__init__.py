"""Hooked models: classifiers with task heads (BERT, RoBERTa, GPT-2) and causal LMs."""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
    from mi_core.models.classifier import (
        HookedAnswerModel,
        HookedClassifier,
        HookedDecoderClassifier,
        HookedEncoderClassifier,
        PairTokens,
        StagedClassifier,
    )
    from mi_core.models.embedded import EMBEDDED_MODELS
    from mi_core.models.fast_paths import disable_fast_paths
    from mi_core.models.fingerprint import weights_fingerprint
    from mi_core.models.loading import (
        SUPPORTED_ARCHITECTURES,
        TASK_LABEL_NAMES,
        TASK_NUM_LABELS,
        hooked_causal_lm_from_hf,
        hooked_classifier_from_hf,
        load_hf_causal_lm,
        load_hf_classifier,
        load_model,
    )
    from mi_core.models.sources import resolve_source

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "HookedAnswerModel": "mi_core.models.classifier",
    "HookedClassifier": "mi_core.models.classifier",
    "HookedDecoderClassifier": "mi_core.models.classifier",
    "HookedEncoderClassifier": "mi_core.models.classifier",
    "PairTokens": "mi_core.models.classifier",
    "StagedClassifier": "mi_core.models.classifier",
    "EMBEDDED_MODELS": "mi_core.models.embedded",
    "disable_fast_paths": "mi_core.models.fast_paths",
    "weights_fingerprint": "mi_core.models.fingerprint",
    "SUPPORTED_ARCHITECTURES": "mi_core.models.loading",
    "TASK_LABEL_NAMES": "mi_core.models.loading",
    "TASK_NUM_LABELS": "mi_core.models.loading",
    "hooked_causal_lm_from_hf": "mi_core.models.loading",
    "hooked_classifier_from_hf": "mi_core.models.loading",
    "load_hf_causal_lm": "mi_core.models.loading",
    "load_hf_classifier": "mi_core.models.loading",
    "load_model": "mi_core.models.loading",
    "resolve_source": "mi_core.models.sources",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


__all__ = [
    "EMBEDDED_MODELS",
    "HookedAnswerModel",
    "HookedClassifier",
    "HookedDecoderClassifier",
    "HookedEncoderClassifier",
    "PairTokens",
    "SUPPORTED_ARCHITECTURES",
    "StagedClassifier",
    "TASK_LABEL_NAMES",
    "TASK_NUM_LABELS",
    "disable_fast_paths",
    "hooked_causal_lm_from_hf",
    "hooked_classifier_from_hf",
    "load_hf_causal_lm",
    "load_hf_classifier",
    "load_model",
    "resolve_source",
    "weights_fingerprint",
]
