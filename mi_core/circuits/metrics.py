"""Metrics a circuit is scored and judged by, per example, from a model's output logits."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer
from transformer_lens.components import Unembed
from transformer_lens.utilities import apply_softcap

from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError
from mi_core.models.fast_paths import FastUnembed, fast_unembed

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = [
    "answer_accuracy",
    "METRICS",
    "Metric",
    "answer_logits",
    "kl_divergence",
    "logit_difference",
    "metric_logits",
    "reads_answer_logits",
]

#: ``metric(logits, pairs) -> [batch]``.
Metric = Callable[[torch.Tensor, PromptPairs], Float[torch.Tensor, " batch"]]


def answer_logits(logits: torch.Tensor, pairs: PromptPairs) -> Float[torch.Tensor, "batch vocab"]:
    """The logits that count: each example's ``position`` for a language model, the class
    logits for a classifier."""
    if logits.dim() == 3:
        return logits[torch.arange(logits.shape[0], device=logits.device), pairs.position]
    return logits


def reads_answer_logits(metric: Metric) -> Metric:
    """Mark ``metric`` as reading a language model's logits only through :func:`answer_logits`
    (each example's ``position``): the circuit methods then hand it the ``[batch, vocab]``
    logits of those positions alone (:func:`metric_logits`), not ``[batch, pos, vocab]``."""
    metric.reads_answer_logits = True  # type: ignore[attr-defined]
    return metric


def metric_logits(
    model: HookedModel, pairs: PromptPairs, metric: Metric | None = None
) -> torch.Tensor:
    """``model``'s output on ``pairs``' clean inputs, as ``metric`` needs it.

    For a language model (``pairs.kind == "lm"``) and a metric marked by
    :func:`reads_answer_logits` (or ``None``: the caller reads :func:`answer_logits`), the
    blocks run as usual (every hook on them fires) and the final norm and the unembedding are
    applied at each example's ``position`` only: ``[batch, vocab]``, which
    :func:`answer_logits` passes through. The unembedding of every position is most of a small
    model's forward and backward beyond its blocks (SmolLM2 at 8 x 64 tokens: 512 x 49,152
    logits, 100 MB, and their gradient); hooks on ``ln_final`` and ``unembed`` see
    ``[batch, 1, ...]``. Otherwise (a classifier, a model whose unembedding is not
    TransformerLens's, an unmarked metric): ``model(**pairs.clean)``."""
    positions_only = metric is None or getattr(metric, "reads_answer_logits", False)
    plain_lm = (  # not a classifier's head, nor an unembedding of the user's own
        isinstance(model, HookedTransformer)
        and type(getattr(model, "unembed", None)) in (Unembed, FastUnembed)
    )
    if not (positions_only and pairs.kind == "lm" and plain_lm):
        return model(**pairs.clean)
    resid = model(**pairs.clean, stop_at_layer=model.cfg.n_layers)
    rows = torch.arange(resid.shape[0], device=resid.device)
    picked = resid[rows, pairs.position.to(resid.device)][:, None]  # [batch, 1, d_model]
    if model.cfg.normalization_type is not None:  # as TransformerLens's forward (per position)
        picked = model.ln_final(picked)
    # without TransformerLens's per-call copy of W_U^T (113 MB for SmolLM2), also for a model
    # not loaded by mi_core; its hooks fire as in TransformerLens's forward, on [batch, 1, ...]
    logits = fast_unembed(model.unembed, picked)
    return apply_softcap(logits, model.cfg.output_logits_soft_cap)[:, 0]


@reads_answer_logits
def logit_difference(
    logits: Float[torch.Tensor, "batch *pos vocab"], pairs: PromptPairs
) -> Float[torch.Tensor, " batch"]:
    """Answer logit minus distractor logit (IOI: indirect object minus subject).

    For a classifier whose ``distractor`` is negative: the label's logit minus the mean of the
    other labels' logits.
    """
    scores = answer_logits(logits, pairs).float()
    rows = torch.arange(scores.shape[0], device=scores.device)
    answer = scores[rows, pairs.answer]
    # row by row, with no branch on the device's values (a GPU would wait for them); pairs
    # may stay on the CPU while the model runs on a GPU
    given = pairs.distractor.to(scores.device)
    distractor = scores[rows, given.clamp(min=0)]
    others = (scores.sum(-1) - answer) / (scores.shape[-1] - 1)
    return answer - torch.where(given >= 0, distractor, others)


@reads_answer_logits
def answer_accuracy(
    logits: Float[torch.Tensor, "batch *pos vocab"], pairs: PromptPairs
) -> Float[torch.Tensor, " batch"]:
    """1 where the answer wins, per example: its logit above the distractor's, or (no
    distractor, a negative ``distractor``) the highest of all; 0 otherwise."""
    scores = answer_logits(logits, pairs).float()
    rows = torch.arange(scores.shape[0], device=scores.device)
    answer = scores[rows, pairs.answer.to(scores.device)]
    given = pairs.distractor.to(scores.device)
    beats_rival = answer > scores[rows, given.clamp(min=0)]
    top = scores.argmax(-1) == pairs.answer.to(scores.device)
    return torch.where(given >= 0, beats_rival, top).float()


def kl_divergence(
    logits: Float[torch.Tensor, "batch *pos vocab"],
    reference: Float[torch.Tensor, "batch *pos vocab"],
    pairs: PromptPairs,
) -> Float[torch.Tensor, " batch"]:
    """``KL(reference || logits)`` of the answer distributions, per example (the pruning
    objectives' KL, :func:`~mi_core.pruning.objective.kl_per_example`)."""
    from mi_core.pruning.objective import kl_per_example

    return kl_per_example(
        answer_logits(reference, pairs).float(), answer_logits(logits, pairs).float()
    )


METRICS = {"logit-diff": logit_difference}


def get_metric(name: str) -> Metric:
    """A metric by name (``logit-diff``)."""
    if name not in METRICS:
        raise ConfigError(f"unknown circuit metric {name!r}; choose one of {sorted(METRICS)}")
    return METRICS[name]
