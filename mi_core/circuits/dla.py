"""Direct logit attribution for post-LayerNorm classifiers (BERT, RoBERTa): approximate.

TransformerLens's ``decompose_resid`` / ``logit_attrs`` are refused on a post-LN encoder: its
residual stream is normalised after every sublayer, so it is no sum of component outputs. With
each token's LayerNorm scale frozen at its value in the run, every LayerNorm is affine and the
stream the classification head reads is again a sum: each sender's output (the embeddings, every
head, every MLP) carried through the LayerNorms after it, plus constants (the LayerNorms'
biases). This is the decomposition the edge graphs use (:class:`~mi_core.circuits.Graph`,
exact for the run: :func:`~mi_core.circuits.graph_error`).

A sender's **direct effect** on a label's logit is the change when its term is taken out of
that sum (its edge into the output zeroed, every other path kept): the logit minus the logit
without it. A linear head would make the effects add up to the logit's distance from the
constants' logit exactly; BERT's and RoBERTa's head (dense, tanh, out) does not, and
:attr:`DirectLogitAttribution.error` says by how much they miss, as ``graph_error`` says how
exactly a graph describes its model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch
from jaxtyping import Float, Int

from mi_core.errors import ConfigError
from mi_core.interventions.edges import EdgeMask, Graph, graph_switches
from mi_core.models.hook_context import hooked

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["DirectLogitAttribution", "direct_logit_attribution"]


@dataclass
class DirectLogitAttribution:
    """Each sender's direct effect on each example's chosen logit, and how far their sum is
    from the whole direct path's effect."""

    senders: list[str]
    effects: Float[torch.Tensor, "sender batch"]
    """The logit minus the logit with the sender's term zeroed, per example."""
    total: Float[torch.Tensor, " batch"]
    """The logit minus the logit with every sender's term zeroed (the constants alone)."""

    @property
    def error(self) -> float:
        """The largest ``|sum of the effects - total|`` over the examples: 0 for a linear
        head; the nonlinearity of the head (and only that) makes it larger."""
        return float((self.effects.sum(0) - self.total).abs().max())

    def frame(self) -> pd.DataFrame:
        """One row per sender: its mean direct effect and its standard deviation over the
        examples, largest ``|mean|`` first."""
        mean, std = self.effects.mean(1), self.effects.std(1, unbiased=False)
        table = pd.DataFrame({"sender": self.senders, "effect": mean, "std": std})
        return table.reindex(table["effect"].abs().sort_values(ascending=False).index)


def direct_logit_attribution(
    model: HookedModel,
    inputs: Mapping[str, torch.Tensor],
    labels: Int[torch.Tensor, " batch"] | None = None,
) -> DirectLogitAttribution:
    """Direct effects of every sender on the logit of ``labels`` (default: each example's
    predicted class) of a post-LayerNorm classifier on ``inputs`` (``input_ids``,
    ``attention_mask``, ...), with the LayerNorm scales frozen at the run (see the module
    docstring; approximate, with its :attr:`~DirectLogitAttribution.error`). One forward
    pass per sender."""
    graph = Graph.from_model(model)
    if not graph.post_ln:
        raise ConfigError(
            "direct_logit_attribution is for post-LayerNorm classifiers; a pre-LN model's "
            "residual stream is a sum already: use TransformerLens's cache.logit_attrs"
        )
    with torch.no_grad():
        full = model(**inputs)
        chosen = full.argmax(-1) if labels is None else labels.to(full.device)

        def logit_without(zeroed: list[int]) -> torch.Tensor:
            weights = torch.ones(graph.n_edges)
            weights[zeroed] = 0.0
            mask = EdgeMask(graph, weights, fill="zero")
            with graph_switches(model), hooked(model, mask.hooks(model)):
                logits = model(**inputs)
            return logits.gather(-1, chosen[:, None])[:, 0]

        logit = full.gather(-1, chosen[:, None])[:, 0]
        into_output = [graph.edge_index(f"{s}->output") for s in graph.senders]
        effects = torch.stack([logit - logit_without([edge]) for edge in into_output])
        total = logit - logit_without(into_output)
    return DirectLogitAttribution(list(graph.senders), effects.cpu(), total.cpu())
