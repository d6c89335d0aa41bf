"""What a learned mask minimises besides its sparsity penalty: one protocol, one registry.

An :class:`Objective` has a name (``PruneConfig.objective``, ``--objective``), says whether it
needs the full model's logits cached per example (:attr:`~Objective.needs_reference`), which
training data it takes (:meth:`~Objective.check`, one line before any work for a wrong
pairing), the ``log.csv`` column of its value (:attr:`~Objective.column`), and gives its value
per example under the mask the step has set (:meth:`~Objective.per_example`). Every objective
is zero with every gate at 1 (the masked model is the full model).

- ``answer_kl``: ``KL(full || masked)`` of the class distribution, or of a language model's
  next token at the answer position (the heuristic-core paper's objective).
- ``every_position_kl``: that KL at every position of plain text, averaged over the window's
  real tokens (a task-free subnetwork); the full model's distributions are computed in the
  step, as examples x positions x vocabulary is too large to cache.
- ``logit_diff``: ``(LD(masked) - LD(full))^2``, LD the answer's logit minus the distractor's
  (no distractor: minus the mean logit), the quantity circuit benchmarks score circuits by
  (MIB's faithfulness is a ratio of logit differences). Squared so that it is smooth and
  zero at the full model; prompt tasks only.
- ``separate`` (learned separability): on windows of two texts, the KL to the full model at
  every position of the *focus* text's windows, plus ``weight`` times a cripple term on the
  *cripple* text's: ``uniform`` (default), the cross-entropy of the masked next-token
  distribution to the uniform one, less the full model's (minimised where the model predicts
  nothing: bounded, with no threshold to choose); or ``capped``, minus the rise of the
  next-token loss over the full model's, capped at ``cap`` nats a token (a loss that rises
  without bound would be met by confident wrong predictions; the cap stops paying for damage
  past it). Both are zero at the full model, so every objective is.

``auto`` (the default) is ``every_position_kl`` on plain text, ``separate`` on focus and cripple
text, and ``answer_kl`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float

from mi_core.data.batches import (
    CRIPPLE,
    TokenizedFocusCripple,
    TokenizedPairs,
    TokenizedPrompts,
    TokenizedText,
)
from mi_core.devices import autocast
from mi_core.errors import ConfigError
from mi_core.models.dropout import dropout_suspended
from mi_core.pruning.constants import AUTO_OBJECTIVE, CRIPPLE_TERMS
from mi_core.pruning.objective import every_position_kl, kl_per_example

if TYPE_CHECKING:
    from mi_core.interventions import ComponentMask
    from mi_core.interventions.neurons import NeuronGates
    from mi_core.models.types import HookedModel

__all__ = [
    "AUTO",
    "OBJECTIVES",
    "AnswerKL",
    "EveryPositionKL",
    "LogitDiff",
    "Objective",
    "Separate",
    "Targets",
    "objective_names",
    "resolve_objective",
]

#: The default objective: chosen by the training data's kind (see the module docstring).
AUTO = AUTO_OBJECTIVE
#: The kinds of training data (:func:`data_kind`).
PLAIN_TEXT, PROMPT_TASK, SENTENCE_PAIRS = "plain text", "a prompt task", "sentence pairs"
FOCUS_AND_CRIPPLE = "focus and cripple text"


@dataclass
class Targets:
    """What an objective compares the masked model with, for every training example: the full
    model's cached logits (``[n, classes]``, None where the objective computes its own), and a
    prompt task's answer and distractor ids (``[n]``; distractor -1: none), and each window's
    role where two texts are trained on together (``[n]``, :data:`~mi_core.data.batches.FOCUS`
    or :data:`~mi_core.data.batches.CRIPPLE`)."""

    logits: Float[torch.Tensor, "n label"] | None = None
    answers: torch.Tensor | None = None
    distractors: torch.Tensor | None = None
    roles: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Targets:
        """These targets on ``device``."""
        return Targets(*(None if t is None else t.to(device) for t in self._tensors()))

    def _tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.logits, self.answers, self.distractors, self.roles


class Objective:
    """One objective (see the module docstring); subclasses set the class attributes and
    :meth:`per_example`."""

    name: ClassVar[str]
    needs_reference: ClassVar[bool]
    """Whether it reads the full model's logits cached once per training example."""
    column: ClassVar[str]
    """The ``log.csv`` column (and ``final_<column>`` metric) its value is written under."""
    takes: ClassVar[str]
    """The training data it takes, in words (the refusal of another names it)."""
    every_position: ClassVar[bool] = False
    """Whether it reads the logits of every position (a batch's memory grows with them);
    otherwise it compares the masked and the full model's answer logits (:meth:`compare`), as
    every mask kind's prompt data can (edge circuits included)."""

    kinds: ClassVar[frozenset[str]]
    """The kinds of training data it is defined on (:func:`data_kind`)."""

    def accepts(self, tokenized: TokenizedPairs) -> bool:
        """Whether it is defined on ``tokenized``'s kind of data."""
        return data_kind(tokenized) in self.kinds

    def check(self, tokenized: TokenizedPairs) -> None:
        """Refuse, in one line, training data it is not defined on."""
        if not self.accepts(tokenized):
            raise ConfigError(
                f"objective {self.name} takes {self.takes}; {tokenized.name or 'the training set'}"
                f" is {data_kind(tokenized)} (objectives for it: {', '.join(usable(tokenized))})"
            )

    def targets(self, tokenized: TokenizedPairs, logits: torch.Tensor | None) -> Targets:
        """The per-example targets of a run on ``tokenized`` (``logits``: the full model's,
        cached, where :attr:`needs_reference`)."""
        if self.needs_reference and logits is None:
            raise ConfigError(f"objective {self.name} needs the full model's logits")
        return Targets(logits if self.needs_reference else None)

    def per_example(
        self,
        model: HookedModel,
        mask: ComponentMask | NeuronGates,
        inputs: Mapping[str, torch.Tensor],
        targets: Targets,
        index: torch.Tensor,
        precision: str = "fp32",
    ) -> Float[torch.Tensor, " batch"]:
        """Its value for each example of ``inputs`` (rows ``index`` of the training set), the
        model running under ``mask`` as the step set it; float32, with a gradient."""
        assert targets.logits is not None
        logits = _masked_logits(model, inputs, precision)
        rows = _rows(targets, index)
        return self.compare(logits, targets.logits[index].to(logits), *rows)

    def compare(
        self,
        masked: Float[torch.Tensor, "batch label"],
        full: Float[torch.Tensor, "batch label"],
        answers: torch.Tensor | None,
        distractors: torch.Tensor | None,
    ) -> Float[torch.Tensor, " batch"]:
        """Its value per example from the masked and the full model's answer logits (and the
        answer and distractor ids, where it reads them)."""
        raise NotImplementedError(f"objective {self.name} does not compare answer logits")


class AnswerKL(Objective):
    """``KL(full || masked)`` of the answer distribution (the heuristic-core paper's)."""

    name = "answer_kl"
    needs_reference = True
    column = "kl"
    takes = "sentence pairs or a prompt task"
    kinds = frozenset({SENTENCE_PAIRS, PROMPT_TASK})

    def compare(self, masked, full, answers, distractors):
        return kl_per_example(full, masked)


class EveryPositionKL(Objective):
    """The KL to the full model at every position of plain text (a task-free subnetwork)."""

    name = "every_position_kl"
    needs_reference = False
    every_position = True
    column = "kl"
    takes = "plain text (text:wikitext, text:python, text:<path>)"
    kinds = frozenset({PLAIN_TEXT})

    def per_example(self, model, mask, inputs, targets, index, precision="fp32"):
        return full_and_masked_kl(model, mask, inputs, precision)


class LogitDiff(Objective):
    """The squared gap to the full model's answer-minus-distractor logit difference."""

    name = "logit_diff"
    needs_reference = True
    column = "logit_diff_gap"
    takes = "a prompt task with answers (ioi, ioi:abba, nli:<pair spec>, a .jsonl of prompts)"
    kinds = frozenset({PROMPT_TASK})

    def targets(self, tokenized: TokenizedPairs, logits: torch.Tensor | None) -> Targets:
        assert isinstance(tokenized, TokenizedPrompts)
        base = super().targets(tokenized, logits)
        answers = torch.tensor(tokenized.labels)
        rivals = tokenized.distractors
        distractors = torch.tensor(rivals) if rivals is not None else torch.full_like(answers, -1)
        return Targets(base.logits, answers, distractors)

    def compare(self, masked, full, answers, distractors):
        assert answers is not None and distractors is not None
        gap = logit_difference(masked, answers, distractors)
        return (gap - logit_difference(full, answers, distractors)) ** 2


def logit_difference(
    logits: Float[torch.Tensor, "batch vocab"], answers: torch.Tensor, distractors: torch.Tensor
) -> Float[torch.Tensor, " batch"]:
    """Each row's answer logit minus its distractor's (distractor -1: minus the mean of the
    other logits), as the circuit metric :func:`~mi_core.circuits.logit_difference` defines
    it."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    answers, distractors = answers.to(logits.device), distractors.to(logits.device)
    answer = logits[rows, answers]
    others = (logits.sum(-1) - answer) / (logits.shape[-1] - 1)
    return answer - torch.where(distractors >= 0, logits[rows, distractors.clamp(min=0)], others)


def _rows(targets: Targets, index: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """The answer and distractor ids of rows ``index`` (None where the targets hold none)."""
    return tuple(None if t is None else t[index] for t in (targets.answers, targets.distractors))


def _masked_logits(
    model: HookedModel, inputs: Mapping[str, torch.Tensor], precision: str
) -> torch.Tensor:
    device = next(model.parameters()).device
    with autocast(device, precision):
        logits = model(**inputs)
    return logits.float()


def full_and_masked_kl(
    model: HookedModel,
    mask: ComponentMask | NeuronGates,
    inputs: Mapping[str, torch.Tensor],
    precision: str = "fp32",
) -> Float[torch.Tensor, " batch"]:
    """Each example's KL at every position (:func:`every_position_kl`) between the full model
    and the model under ``mask`` (the values the step put there), on plain text."""
    full, masked, attention = full_and_masked_logits(model, mask, inputs, precision)
    return every_position_kl(full, masked, attention)


def full_and_masked_logits(
    model: HookedModel,
    mask: ComponentMask | NeuronGates,
    inputs: Mapping[str, torch.Tensor],
    precision: str = "fp32",
) -> tuple[
    Float[torch.Tensor, "batch pos vocab"],
    Float[torch.Tensor, "batch pos vocab"],
    Float[torch.Tensor, "batch pos"],
]:
    """The full model's and the masked model's next-token logits at every position (float32)
    and the attention mask (ones where none was given).

    The full model's pass runs with every gate at 1 (``mask.kept_all()``: a gate of 1 leaves
    each unit's activation as it is, ``1 * x + 0 * fill``), without gradients and without
    dropout; then the masked pass, whose graph the loss is taken through. A language model
    loaded for a task reads them through ``every_position_logits``; a plain causal LM
    (TransformerLens's, as separability loads) is called on the ids."""
    device = next(model.parameters()).device
    ids, attention = inputs["input_ids"], inputs.get("attention_mask")
    reading = _position_logits(model)

    with mask.kept_all(), torch.no_grad(), dropout_suspended(), autocast(device, precision):
        full = reading(ids, attention)
    with autocast(device, precision):
        masked = reading(ids, attention)
    if attention is None:
        attention = torch.ones(ids.shape, device=ids.device)
    return full.float(), masked.float(), attention


def _position_logits(model: HookedModel) -> Callable[..., torch.Tensor]:
    """How ``model`` gives next-token logits at every position of right-padded ids."""
    reading = getattr(model, "every_position_logits", None)
    if reading is not None:
        return reading
    if not hasattr(model, "unembed"):
        raise ConfigError(
            "plain text is pruned against a language model's next-token distributions; "
            "load the model with task='next_token'"
        )
    return lambda ids, attention: model(ids, attention_mask=attention)


class Separate(Objective):
    """Keep the focus text, lose the cripple text (learned separability; module docstring)."""

    name = "separate"
    needs_reference = False
    every_position = True
    column = "separation_loss"
    takes = "focus and cripple text (mi-core separability --method learned)"
    kinds = frozenset({FOCUS_AND_CRIPPLE})

    def __init__(self, cripple_term: str = "uniform", cap: float = 2.0, weight: float = 1.0):
        if cripple_term not in CRIPPLE_TERMS:
            raise ConfigError(f"cripple term must be one of {CRIPPLE_TERMS}, got {cripple_term!r}")
        if not (cap > 0 and weight > 0):
            raise ConfigError(f"cap and weight must be positive, got {cap} and {weight}")
        self.cripple_term, self.cap, self.weight = cripple_term, float(cap), float(weight)

    def targets(self, tokenized: TokenizedPairs, logits: torch.Tensor | None) -> Targets:
        return Targets(roles=torch.tensor(tokenized.labels))

    def per_example(self, model, mask, inputs, targets, index, precision="fp32"):
        assert targets.roles is not None
        full, masked, attention = full_and_masked_logits(model, mask, inputs, precision)
        keep = every_position_kl(full, masked, attention)
        lose = self.cripple(full, masked, inputs["input_ids"], attention)
        return torch.where(
            targets.roles[index].to(keep.device) == CRIPPLE, self.weight * lose, keep
        )

    def cripple(
        self,
        full: Float[torch.Tensor, "batch pos vocab"],
        masked: Float[torch.Tensor, "batch pos vocab"],
        ids: torch.Tensor,
        attention: torch.Tensor,
    ) -> Float[torch.Tensor, " batch"]:
        """The cripple term of each window, averaged over its real positions (zero at the full
        model)."""
        log_full, log_masked = full.log_softmax(-1), masked.log_softmax(-1)
        if self.cripple_term == "uniform":
            per_token = log_full.mean(-1) - log_masked.mean(-1)  # CE(U, masked) - CE(U, full)
            real = attention.to(per_token.dtype)
        else:
            after = ids[:, 1:, None]
            rise = (log_full[:, :-1].gather(-1, after) - log_masked[:, :-1].gather(-1, after))[
                ..., 0
            ]
            per_token = -rise.clamp(max=self.cap)
            real = (attention[:, 1:] * attention[:, :-1]).to(per_token.dtype)
        return (per_token * real).sum(-1) / real.sum(-1).clamp(min=1)


#: Every objective by name (``auto`` is resolved by :func:`resolve_objective`).
OBJECTIVES: dict[str, Objective] = {
    o.name: o for o in (AnswerKL(), EveryPositionKL(), LogitDiff(), Separate())
}


def objective_names() -> tuple[str, ...]:
    """The names ``PruneConfig.objective`` takes: ``auto`` and every registered objective."""
    return (AUTO, *OBJECTIVES)


def usable(tokenized: TokenizedPairs) -> list[str]:
    """The objectives defined on ``tokenized``'s kind of data."""
    return [name for name, o in OBJECTIVES.items() if o.accepts(tokenized)]


def data_kind(tokenized: TokenizedPairs) -> str:
    """``tokenized``'s kind of data, in words: plain text, a prompt task or sentence pairs."""
    if isinstance(tokenized, TokenizedFocusCripple):
        return FOCUS_AND_CRIPPLE
    if isinstance(tokenized, TokenizedText):
        return PLAIN_TEXT
    if isinstance(tokenized, TokenizedPrompts):
        return PROMPT_TASK
    return SENTENCE_PAIRS


def resolve_objective(name: str, tokenized: TokenizedPairs) -> Objective:
    """The objective ``name`` (``auto``: by the data's kind) checked against ``tokenized``."""
    if name == AUTO:
        name = {FOCUS_AND_CRIPPLE: Separate.name, PLAIN_TEXT: EveryPositionKL.name}.get(
            data_kind(tokenized), AnswerKL.name
        )
    objective = OBJECTIVES.get(name)
    if objective is None:
        raise ConfigError(f"unknown objective {name!r}; expected one of {objective_names()}")
    objective.check(tokenized)
    return objective


def objective_column(name: str) -> str:
    """The ``log.csv`` column of the objective named ``name`` (``auto`` resolves to one of the
    KL objectives, both logged as ``kl``)."""
    if name == AUTO:
        return AnswerKL.column
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown objective {name!r}; expected one of {objective_names()}")
    return OBJECTIVES[name].column


def answer_objective(name: str, what: str = "edge pruning") -> Objective:
    """The objective ``name`` for prompt pairs compared at the answer (``auto``: answer_kl),
    as edge pruning learns circuits; another is refused in one line."""
    if name == AUTO:
        name = AnswerKL.name
    objective = OBJECTIVES.get(name)
    if objective is None:
        raise ConfigError(f"unknown objective {name!r}; expected one of {objective_names()}")
    if objective.every_position:
        answers = [n for n, o in OBJECTIVES.items() if not o.every_position]
        raise ConfigError(
            f"objective {name} takes {objective.takes}; {what} learns on prompt pairs "
            f"(objectives for them: {', '.join(answers)})"
        )
    return objective


def log_row(objective: Objective, row: Mapping[str, Any]) -> dict[str, Any]:
    """A step's values with the objective's value under its column."""
    out = dict(row)
    out[objective.column] = out.pop("objective")
    return out
