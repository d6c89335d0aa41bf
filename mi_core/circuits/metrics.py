"""Metrics a circuit is scored and judged by, per example, from a model's output logits."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Float

from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError

__all__ = ["METRICS", "Metric", "answer_logits", "kl_divergence", "logit_difference"]

#: ``metric(logits, pairs) -> [batch]``.
Metric = Callable[[torch.Tensor, PromptPairs], Float[torch.Tensor, " batch"]]


def answer_logits(logits: torch.Tensor, pairs: PromptPairs) -> Float[torch.Tensor, "batch vocab"]:
    """The logits that count: each example's ``position`` for a language model, the class
    logits for a classifier."""
    if logits.dim() == 3:
        return logits[torch.arange(logits.shape[0], device=logits.device), pairs.position]
    return logits


def logit_difference(logits: torch.Tensor, pairs: PromptPairs) -> Float[torch.Tensor, " batch"]:
    """Answer logit minus distractor logit (IOI: indirect object minus subject).

    For a classifier whose ``distractor`` is negative: the label's logit minus the mean of the
    other labels' logits.
    """
    scores = answer_logits(logits, pairs).float()
    rows = torch.arange(scores.shape[0], device=scores.device)
    answer = scores[rows, pairs.answer]
    if bool((pairs.distractor >= 0).all()):
        return answer - scores[rows, pairs.distractor]
    others = (scores.sum(-1) - answer) / (scores.shape[-1] - 1)
    return answer - others


def kl_divergence(
    logits: torch.Tensor, reference: torch.Tensor, pairs: PromptPairs
) -> Float[torch.Tensor, " batch"]:
    """``KL(reference || logits)`` of the answer distributions, per example."""
    log_p = F.log_softmax(answer_logits(reference, pairs).float(), dim=-1)
    log_q = F.log_softmax(answer_logits(logits, pairs).float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


METRICS = {"logit-diff": logit_difference}


def get_metric(name: str) -> Metric:
    """A metric by name (``logit-diff``)."""
    if name not in METRICS:
        raise ConfigError(f"unknown circuit metric {name!r}; choose one of {sorted(METRICS)}")
    return METRICS[name]
