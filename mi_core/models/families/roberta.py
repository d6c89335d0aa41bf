"""RoBERTa: BERT's encoder with positions offset past the padding index and one token type;
classifiers score through their own dense + out_proj head."""

from __future__ import annotations

from typing import Any

import transformers

from mi_core.models.families import bert
from mi_core.models.families._base import TINY, Family


def tiny(common: dict[str, Any]) -> transformers.RobertaConfig:
    """A three-layer RoBERTa."""
    return transformers.RobertaConfig(
        **TINY, max_position_embeddings=130, type_vocab_size=1, hidden_act="gelu", **common
    )


FAMILY = Family(
    name="roberta",
    model_types=("roberta",),
    causal_lm=None,
    classifier="RobertaForSequenceClassification",
    bodies=("RobertaModel", "RobertaForMaskedLM"),
    body="roberta",
    config=bert.config,
    convert=None,
    tiny=tiny,
    graph="encoder",
    encoder=True,
    exact=bert.FAMILY.exact,
    extra={"tl_architecture": "BertForMaskedLM"},
)
