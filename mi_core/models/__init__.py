"""Hooked models: classifiers with task heads (BERT, RoBERTa, GPT-2) and causal LMs."""

from mi_core.models.classifier import (
    HookedClassifier,
    HookedDecoderClassifier,
    HookedEncoderClassifier,
    PairTokens,
    StagedClassifier,
)
from mi_core.models.embedded import EMBEDDED_MODELS
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
    resolve_source,
)

__all__ = [
    "EMBEDDED_MODELS",
    "HookedClassifier",
    "HookedDecoderClassifier",
    "HookedEncoderClassifier",
    "PairTokens",
    "SUPPORTED_ARCHITECTURES",
    "StagedClassifier",
    "TASK_LABEL_NAMES",
    "TASK_NUM_LABELS",
    "hooked_causal_lm_from_hf",
    "hooked_classifier_from_hf",
    "load_hf_causal_lm",
    "load_hf_classifier",
    "load_model",
    "resolve_source",
    "weights_fingerprint",
]
