"""The checkpoint's dropout, put back into a hooked classifier as hooks.

TransformerLens models have no dropout modules, but the authors of the heuristic-core paper prune
in train mode: the masked model runs with the checkpoint's dropout while the full model's logits
(the KL target) come from eval mode. :func:`dropout_hooks` returns hooks that apply dropout where
Hugging Face applies it:

========================  ==========================================  =======================
where                      BERT / RoBERTa                              GPT-2
========================  ==========================================  =======================
embeddings                 after the embedding LayerNorm               after token + position
attention probabilities    ``attention_probs_dropout_prob``            ``attn_pdrop``
attention output           before the residual add (``hook_attn_out``) ``resid_pdrop``
MLP output                 before the residual add (``hook_mlp_out``)  ``resid_pdrop``
classification head        pooled output; RoBERTa also its input       none (``score`` only)
========================  ==========================================  =======================

Dropout draws from torch's global generator: seed it (e.g. per step) for reproducible runs.
Hooks at ``hook_pattern`` make attention take TransformerLens's step-by-step path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from mi_core.models.hook_context import prepended_hooks
from mi_core.models.hooks import act_name

if TYPE_CHECKING:
    from transformer_lens.hook_points import HookedRootModule

Hook = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class DropoutRates:
    """Dropout probabilities of a sequence classifier, read from its Hugging Face config."""

    embed: float = 0.0
    attention: float = 0.0
    hidden: float = 0.0
    head_input: float = 0.0
    """Dropout on the classified token before the head (RoBERTa's classification head)."""
    pooled: float = 0.0
    """Dropout on the pooled (tanh) output before the output layer (BERT and RoBERTa)."""

    @classmethod
    def from_hf_config(cls, config: Any) -> DropoutRates:
        """The rates of a sequence classifier's config: BERT / RoBERTa's fields, or a
        decoder's (each family names them its own way: ``attn_pdrop``, ``attention_dropout``,
        ...; a rate the config does not name is 0)."""
        if config.model_type not in ("bert", "roberta"):
            return cls(
                embed=_rate(config, "embd_pdrop", "embed_dropout"),
                attention=_rate(config, "attn_pdrop", "attention_dropout"),
                hidden=_rate(config, "resid_pdrop", "resid_dropout", "hidden_dropout"),
            )
        hidden = float(config.hidden_dropout_prob)
        classifier = getattr(config, "classifier_dropout", None)
        classifier = hidden if classifier is None else float(classifier)
        return cls(
            embed=hidden,
            attention=float(config.attention_probs_dropout_prob),
            hidden=hidden,
            head_input=classifier if config.model_type == "roberta" else 0.0,
            pooled=classifier,
        )

    @property
    def any(self) -> bool:
        """True when some rate is positive."""
        return any(
            p > 0 for p in (self.embed, self.attention, self.hidden, self.head_input, self.pooled)
        )


def _rate(config: Any, *names: str) -> float:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


#: Nesting depth of :func:`dropout_suspended` (dropout hooks pass their input through while
#: it is positive).
_SUSPENDED = [0]


def _dropout(p: float) -> Hook:
    def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
        if _SUSPENDED[0]:
            return x
        return F.dropout(x, p, training=True)

    return hook


@contextlib.contextmanager
def dropout_suspended() -> Iterator[None]:
    """Inside it, the hooks of :func:`train_dropout` drop nothing: a full-model pass in the
    middle of a training step (the pruning objective's per-step reference on plain text) runs
    without dropout, as the cached reference logits are computed."""
    _SUSPENDED[0] += 1
    try:
        yield
    finally:
        _SUSPENDED[0] -= 1


def dropout_hooks(
    model: HookedRootModule, rates: DropoutRates | None = None
) -> list[tuple[str, Hook]]:
    """``(hook name, hook)`` pairs applying ``rates`` (default: the model's ``dropout_rates``)."""
    rates = rates if rates is not None else getattr(model, "dropout_rates", None) or DropoutRates()
    hooks: list[tuple[str, Hook]] = []
    if rates.embed > 0:
        hooks.append((act_name("resid_pre", 0), _dropout(rates.embed)))
    for layer in range(model.cfg.n_layers):
        if rates.attention > 0:
            hooks.append((act_name("pattern", layer), _dropout(rates.attention)))
        if rates.hidden > 0:
            hooks.append((act_name("attn_out", layer), _dropout(rates.hidden)))
            hooks.append((act_name("mlp_out", layer), _dropout(rates.hidden)))
    if rates.head_input > 0:
        hooks.append(("head.hook_in", _dropout(rates.head_input)))
    if rates.pooled > 0:
        hooks.append(("head.hook_pooled", _dropout(rates.pooled)))
    return hooks


@contextlib.contextmanager
def train_dropout(
    model: HookedRootModule, enabled: bool = True, rates: DropoutRates | None = None
) -> Iterator[Any]:
    """Context manager: inside it, ``model`` runs with its checkpoint's dropout.

    The hooks go *before* every hook already at their hook points (e.g. a mask entered earlier
    with :func:`~mi_core.interventions.ablate`), so an MLP's output is dropped out first and then
    masked, as in the authors' code. ``enabled=False`` does nothing.
    """
    with prepended_hooks(model, dropout_hooks(model, rates) if enabled else []):
        yield model
