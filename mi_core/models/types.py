"""The one type of a model mi_core's functions take: a hooked causal LM or a hooked classifier.

``HookedTransformer`` (a loaded causal LM, and the base of the decoder classifiers) or a
hooked encoder classifier (:class:`~mi_core.models.classifier.HookedEncoderClassifier`). Modules
import it under ``TYPE_CHECKING``: it names, it does not load anything.
"""

from __future__ import annotations

from typing import TypeAlias

from transformer_lens import HookedTransformer

from mi_core.models.classifier import HookedEncoderClassifier

__all__ = ["HookedModel"]

HookedModel: TypeAlias = HookedTransformer | HookedEncoderClassifier
