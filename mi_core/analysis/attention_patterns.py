"""Classify attention heads by where their attention goes (the paper's Figure 9).

For every head and every (valid) query token we measure the attention mass on six key classes:

``overlap``
    keys in the *other* sentence whose token id equals the query's token id (lexical overlap).
    Encoders: both directions (premise -> hypothesis and back). Decoders (``causal=True``): only
    from the second sentence back to the first. Special tokens (separators, and the first token
    when ``first_is_special``) never count as overlap. Averaged only over queries that have at
    least one such key.
``prev`` / ``next``
    the key at position q-1 / q+1 (queries without one are not averaged; ``next`` never exists
    for a decoder, so it is NaN there).
``sep``
    keys whose id is one of ``sep_ids`` ([SEP], ``</s>``); averaged over queries that can see one.
``first``
    the first non-padding position ([CLS] / ``<s>`` / the attention sink of a decoder).
``self``
    the query's own position.

Language models on prompt tasks (``causal=True``) are scored on :data:`DECODER_CLASSES`:
``prev``, ``first`` (the BOS / attention sink) and ``self`` as above, and

``duplicate``
    earlier keys (``k < q``) holding the query's own token id (a duplicate-token head).
``induction``
    keys right after an earlier occurrence of the query's token (``ids[k - 1] == ids[q]``,
    ``k <= q``): where an induction head looks, to copy what followed last time.
``to_answer`` / ``to_distractor``
    from the prompt's last token (the answer position) only: keys holding the answer's /
    distractor's token id (for IOI: the indirect object's name and the subject's, the name
    mover's and the S-inhibition story's classes). Averaged over prompts where such a key
    exists.

The first token and separators are never duplicate, induction or answer keys.

Every mass is compared with the mass a *uniform* pattern over the same query's valid keys would
give (1/number of valid keys per key; for decoders the valid keys are the non-padding keys at or
before the query). Padding never counts: padded queries are skipped and padded keys are neither
class members nor part of the uniform baseline (mass a model puts on padded keys is dropped).

Classification rule (:func:`classify_heads`): the *dominant* class is the one with the largest
excess ``mean mass - uniform mass`` (classes with no contributing query are skipped); the head is
labelled with it when its mean mass is at least ``threshold`` (default 0.3) *and* its excess is
at least ``min_excess`` (default 0.1), otherwise ``other``. The excess condition keeps short
inputs, where e.g. two [SEP]s already hold a third of a uniform pattern, from being labelled.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mi_core.analysis.subnetworks import head_label, parse_head_label
from mi_core.data.batches import TokenizedPrompts
from mi_core.errors import ConfigError
from mi_core.models.classifier import StagedClassifier, batch_inputs
from mi_core.models.hook_context import hooked as hooks_held

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = [
    "ALL_CLASSES",
    "DECODER_CLASSES",
    "PATTERN_CLASSES",
    "PatternMassSums",
    "segment_ids_from_sep",
    "class_key_masks",
    "pattern_masses",
    "AttentionPatternScores",
    "classify_heads",
    "score_attention_patterns",
]

#: The attention-pattern classes a head is scored on (the paper's): to the same token in
#: the other sentence (overlap), the previous and next token, [SEP], the first token, itself.
PATTERN_CLASSES: tuple[str, ...] = ("overlap", "prev", "next", "sep", "first", "self")
#: The classes of a language model's head on prompts: previous token, duplicate token,
#: induction, the first token (BOS, the attention sink), itself, and from the answer position
#: to the answer's and the distractor's tokens (IOI: the indirect object and the subject).
DECODER_CLASSES: tuple[str, ...] = (
    "prev", "duplicate", "induction", "first", "self", "to_answer", "to_distractor",
)  # fmt: skip
#: Every class :func:`class_key_masks` knows.
ALL_CLASSES: tuple[str, ...] = PATTERN_CLASSES + DECODER_CLASSES[1:3] + DECODER_CLASSES[5:]


@dataclass
class PatternMassSums:
    """Per-class sums over contributing queries of one batch (one layer).

    ``mass[c]``: Float["head"], attention mass on class-c keys summed over contributing queries;
    ``uniform[c]``: scalar, the same sum for a uniform pattern (identical for every head);
    ``count[c]``: number of contributing queries. Means are ``mass / count``.
    """

    mass: dict[str, Float[Tensor, " head"]]
    uniform: dict[str, Float[Tensor, ""]]
    count: dict[str, int]


def _sep_list(sep_ids: Collection[int] | Tensor | int) -> list[int]:
    """Separator ids as a sorted list; one id (``tokenizer.sep_token_id``) is a list of one."""
    if isinstance(sep_ids, Tensor):
        sep_ids = sep_ids.reshape(-1).tolist()
    if isinstance(sep_ids, int):
        sep_ids = [sep_ids]
    return sorted(int(i) for i in sep_ids)


def _sep_tensor(sep_ids: Collection[int] | Tensor | int, device: torch.device) -> Tensor:
    return torch.as_tensor(_sep_list(sep_ids), dtype=torch.long, device=device)


def segment_ids_from_sep(
    input_ids: Int[Tensor, "batch pos"],
    sep_ids: Collection[int] | int,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> Int[Tensor, "batch pos"]:
    """Segment ids for models without token types (RoBERTa, GPT-2): 0 up to and including the
    first run of separator tokens among the non-padding positions, 1 after it.

    ``<s> A </s></s> B </s>`` -> 0 for ``<s> A </s></s>``, 1 for ``B </s>``. Padding is ignored
    when looking for the separator (GPT-2 often pads with its separator id) and gets segment 0.
    A row without a separator is all segment 0 (then nothing counts as overlap).
    """
    ids = torch.as_tensor(input_ids)
    valid = (
        torch.ones_like(ids, dtype=torch.bool)
        if attention_mask is None
        else torch.as_tensor(attention_mask, device=ids.device).bool()
    )
    is_sep = torch.isin(ids, _sep_tensor(sep_ids, ids.device)) & valid
    # Segment 1 starts at the first valid non-separator token after a separator has been seen.
    seen_sep = torch.cumsum(is_sep.long(), dim=-1) > 0
    starts_b = seen_sep & ~is_sep & valid
    segments = (torch.cumsum(starts_b.long(), dim=-1) > 0).long()
    return segments * valid.long()


def class_key_masks(
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    segment_ids: Int[Tensor, "batch pos"] | None,
    sep_ids: Collection[int] | int,
    *,
    first_is_special: bool = True,
    causal: bool = False,
    classes: Sequence[str] = PATTERN_CLASSES,
    answer_ids: Int[Tensor, " batch"] | None = None,
    distractor_ids: Int[Tensor, " batch"] | None = None,
) -> tuple[Bool[Tensor, "cls batch q k"], Bool[Tensor, "batch q k"]]:
    """Boolean (class, batch, query, key) membership, restricted to valid query/key pairs, and
    the valid pairs themselves (``allowed``: both non-padding, and ``k <= q`` when causal).
    ``answer_ids`` / ``distractor_ids``: each row's answer and distractor token, for the
    ``to_answer`` / ``to_distractor`` classes (rows without one have no such keys)."""
    ids = torch.as_tensor(input_ids)
    b, n = ids.shape
    device = ids.device
    valid = (
        torch.ones_like(ids, dtype=torch.bool)
        if attention_mask is None
        else torch.as_tensor(attention_mask, device=device).bool()
    )
    if segment_ids is None:
        segment_ids = segment_ids_from_sep(ids, sep_ids, valid)
    seg = torch.as_tensor(segment_ids, device=device).long()
    pos = torch.arange(n, device=device)
    allowed = valid[:, :, None] & valid[:, None, :]
    if causal:
        allowed = allowed & (pos[None, :, None] >= pos[None, None, :])
    is_sep = torch.isin(ids, _sep_tensor(sep_ids, device))
    first_idx = valid.long().argmax(dim=-1)  # first non-padding position per row
    is_first = pos[None, :] == first_idx[:, None]
    special = is_sep | (is_first if first_is_special else torch.zeros_like(is_sep))

    masks: list[Tensor] = []
    for name in classes:
        if name == "overlap":
            other = (
                seg[:, :, None] > seg[:, None, :] if causal else seg[:, :, None] != seg[:, None, :]
            )
            m = (ids[:, :, None] == ids[:, None, :]) & other
            m = m & ~special[:, :, None] & ~special[:, None, :]
        elif name == "prev":
            m = (pos[:, None] - 1 == pos[None, :]).expand(b, n, n)
        elif name == "next":
            m = (pos[:, None] + 1 == pos[None, :]).expand(b, n, n)
        elif name == "sep":
            m = is_sep[:, None, :].expand(b, n, n)
        elif name == "first":
            m = is_first[:, None, :].expand(b, n, n)
        elif name == "self":
            m = torch.eye(n, dtype=torch.bool, device=device).expand(b, n, n)
        elif name == "duplicate":
            earlier = pos[:, None] > pos[None, :]
            m = (ids[:, :, None] == ids[:, None, :]) & earlier & ~special[:, None, :]
        elif name == "induction":
            before = torch.cat([ids.new_full((b, 1), -1), ids[:, :-1]], dim=1)  # ids[k - 1]
            had = torch.cat([special.new_ones((b, 1)), special[:, :-1]], dim=1)
            m = (ids[:, :, None] == before[:, None, :]) & ~had[:, None, :] & ~special[:, :, None]
            m = m & ~special[:, None, :] & (pos[:, None] >= pos[None, :])
        elif name in ("to_answer", "to_distractor"):
            target = answer_ids if name == "to_answer" else distractor_ids
            last = valid.long().cumsum(-1).argmax(-1)  # each row's last real position
            is_last = pos[None, :] == last[:, None]  # [b, q]
            if target is None:
                m = torch.zeros(b, n, n, dtype=torch.bool, device=device)
            else:
                t = torch.as_tensor(target, device=device).long()
                holds = (ids == t[:, None]) & (t[:, None] >= 0) & ~special  # [b, k]
                m = is_last[:, :, None] & holds[:, None, :]
        else:
            raise ConfigError(f"unknown attention-pattern class {name!r}; use {ALL_CLASSES}")
        masks.append(m & allowed)
    return torch.stack(masks), allowed


def pattern_masses(
    pattern: Float[Tensor, "batch head q k"],
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    segment_ids: Int[Tensor, "batch pos"] | None,
    sep_ids: Collection[int] | int,
    *,
    first_is_special: bool = True,
    causal: bool = False,
    classes: Sequence[str] = PATTERN_CLASSES,
) -> PatternMassSums:
    """Attention mass per class, summed over the contributing queries of one batch.

    ``segment_ids``: BERT's ``token_type_ids``, or None to derive them with
    :func:`segment_ids_from_sep`. See the module docstring for the class definitions.
    """
    if pattern.ndim != 4 or pattern.shape[0] != input_ids.shape[0]:
        raise ConfigError(
            f"pattern must be [batch, head, q, k] matching input_ids {tuple(input_ids.shape)}; "
            f"got {tuple(pattern.shape)}"
        )
    device = pattern.device
    ids = torch.as_tensor(input_ids).to(device)
    mask = None if attention_mask is None else torch.as_tensor(attention_mask).to(device)
    seg = None if segment_ids is None else torch.as_tensor(segment_ids).to(device)
    members, allowed = class_key_masks(
        ids, mask, seg, sep_ids, first_is_special=first_is_special, causal=causal, classes=classes
    )
    mass, uniform, count = _stacked_sums(pattern, members, allowed)
    count = count.cpu()
    return PatternMassSums(
        mass={c: mass[i] for i, c in enumerate(classes)},
        uniform={c: uniform[i] for i, c in enumerate(classes)},
        count={c: int(count[i]) for i, c in enumerate(classes)},
    )


def _stacked_sums(
    pattern: Float[Tensor, "batch head q k"],
    members: Bool[Tensor, "cls batch q k"],
    allowed: Bool[Tensor, "batch q k"],
) -> tuple[Float[Tensor, "cls head"], Float[Tensor, " cls"], Int[Tensor, " cls"]]:
    """Mass per (class, head), uniform-pattern mass per class and contributing queries per
    class, all summed over the batch's queries."""
    weights = members.to(pattern.device, torch.float32)  # [c, b, q, k]
    mass = torch.einsum("bhqk,cbqk->ch", pattern.float(), weights)
    n_keys = allowed.to(pattern.device).sum(dim=-1).clamp(min=1).float()  # [b, q]
    uniform = (weights.sum(dim=-1) / n_keys).sum(dim=(1, 2))  # [c]
    count = members.any(dim=-1).sum(dim=(1, 2))  # [c]
    return mass, uniform, count


def _head_index(heads: Iterable[str | tuple[int, int]] | None) -> list[tuple[int, int]] | None:
    if heads is None:
        return None
    out = []
    for h in heads:
        out.append(parse_head_label(h) if isinstance(h, str) else (int(h[0]), int(h[1])))
    return out


class AttentionPatternScores:
    """Streaming accumulator of per-class attention masses for every head of every layer.

    Add batches with :meth:`add` (one layer's pattern at a time) and read the means with
    :meth:`to_frame` or :func:`classify_heads`. Holds only per-head sums, never the patterns.
    """

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        *,
        sep_ids: Collection[int] | int,
        causal: bool = False,
        first_is_special: bool = True,
        classes: Sequence[str] = PATTERN_CLASSES,
    ) -> None:
        self.n_layers, self.n_heads = int(n_layers), int(n_heads)
        self.sep_ids = _sep_list(sep_ids)
        self.causal = bool(causal)
        self.first_is_special = bool(first_is_special)
        self.classes = tuple(classes)
        c = len(self.classes)
        self.mass = torch.zeros(c, self.n_layers, self.n_heads, dtype=torch.float64)
        self.uniform = torch.zeros(c, self.n_layers, dtype=torch.float64)
        self.count = torch.zeros(c, self.n_layers, dtype=torch.long)
        self.layers_seen: set[int] = set()
        #: default rows of :meth:`to_frame` (None: every head of every layer seen)
        self.heads: list[tuple[int, int]] | None = None

    def key_masks(
        self,
        input_ids: Int[Tensor, "batch pos"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        segment_ids: Int[Tensor, "batch pos"] | None = None,
        answer_ids: Int[Tensor, " batch"] | None = None,
        distractor_ids: Int[Tensor, " batch"] | None = None,
    ) -> tuple[Bool[Tensor, "cls batch q k"], Bool[Tensor, "batch q k"]]:
        """:func:`class_key_masks` with this scorer's settings; compute once per batch and pass
        to :meth:`add` for every layer."""
        return class_key_masks(
            input_ids,
            attention_mask,
            segment_ids,
            self.sep_ids,
            first_is_special=self.first_is_special,
            causal=self.causal,
            classes=self.classes,
            answer_ids=answer_ids,
            distractor_ids=distractor_ids,
        )

    def add(
        self,
        layer: int,
        pattern: Float[Tensor, "batch head q k"],
        input_ids: Int[Tensor, "batch pos"] | None = None,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        segment_ids: Int[Tensor, "batch pos"] | None = None,
        *,
        key_masks: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        """Add one batch's pattern of one layer (give ``input_ids`` etc., or the batch's
        precomputed :meth:`key_masks`)."""
        if not 0 <= layer < self.n_layers:
            raise ConfigError(f"layer {layer} outside 0..{self.n_layers - 1}")
        if pattern.ndim != 4 or pattern.shape[1] != self.n_heads:
            raise ConfigError(
                f"pattern must be [batch, {self.n_heads}, q, k]; got {tuple(pattern.shape)}"
            )
        if key_masks is None:
            if input_ids is None:
                raise ConfigError("AttentionPatternScores.add needs input_ids or key_masks")
            ids = torch.as_tensor(input_ids).to(pattern.device)
            if ids.shape[0] != pattern.shape[0] or ids.shape[1] != pattern.shape[-1]:
                raise ConfigError(
                    f"pattern {tuple(pattern.shape)} does not match input_ids {tuple(ids.shape)}"
                )
            mask = None if attention_mask is None else torch.as_tensor(attention_mask)
            seg = None if segment_ids is None else torch.as_tensor(segment_ids)
            key_masks = self.key_masks(
                ids,
                None if mask is None else mask.to(pattern.device),
                None if seg is None else seg.to(pattern.device),
            )
        mass, uniform, count = _stacked_sums(pattern.detach(), *key_masks)
        self.mass[:, layer] += mass.double().cpu()
        self.uniform[:, layer] += uniform.double().cpu()
        self.count[:, layer] += count.cpu()
        self.layers_seen.add(int(layer))

    def add_sums(self, layer: int, sums: PatternMassSums) -> None:
        """Add precomputed sums (from :func:`pattern_masses`) for ``layer``."""
        if not 0 <= layer < self.n_layers:
            raise ConfigError(f"layer {layer} outside 0..{self.n_layers - 1}")
        for i, c in enumerate(self.classes):
            self.mass[i, layer] += sums.mass[c].detach().double().cpu()
            self.uniform[i, layer] += float(sums.uniform[c])
            self.count[i, layer] += int(sums.count[c])
        self.layers_seen.add(int(layer))

    def to_frame(self, heads: Iterable[str | tuple[int, int]] | None = None) -> pd.DataFrame:
        """One row per head (``heads``, else ``self.heads``, else every head of the layers seen):
        ``layer, head, label`` and per class ``c``: ``c_mass`` (mean over contributing
        queries), ``c_uniform`` (the same for a uniform pattern), ``c_ratio`` (mass / uniform),
        ``c_excess`` (mass - uniform) and ``c_n`` (contributing queries). Means are NaN where
        no query contributes."""
        wanted = _head_index(heads) if heads is not None else self.heads
        if wanted is None:
            wanted = [(lay, h) for lay in sorted(self.layers_seen) for h in range(self.n_heads)]
        rows = []
        for layer, head in wanted:
            if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
                raise ConfigError(f"head {head_label(layer, head)} is outside the model")
            row: dict[str, Any] = {"layer": layer, "head": head, "label": head_label(layer, head)}
            for i, c in enumerate(self.classes):
                n = int(self.count[i, layer])
                mean = float(self.mass[i, layer, head]) / n if n else float("nan")
                base = float(self.uniform[i, layer]) / n if n else float("nan")
                row[f"{c}_mass"] = mean
                row[f"{c}_uniform"] = base
                row[f"{c}_ratio"] = mean / base if n and base > 0 else float("nan")
                row[f"{c}_excess"] = mean - base
                row[f"{c}_n"] = n
            rows.append(row)
        return pd.DataFrame(rows)


def classify_heads(
    scores: AttentionPatternScores | pd.DataFrame,
    threshold: float = 0.3,
    *,
    min_excess: float = 0.1,
    classes: Sequence[str] | None = None,
    heads: Iterable[str | tuple[int, int]] | None = None,
) -> pd.DataFrame:
    """Per-head table (see :meth:`AttentionPatternScores.to_frame`) plus ``dominant`` (class
    with the largest mass - uniform), ``dominant_mass``, ``dominant_excess`` and
    ``pattern_class``: ``dominant`` if its mean mass >= ``threshold`` and its excess >=
    ``min_excess``, else ``"other"``. ``scores`` may also be a saved ``to_frame()`` table
    (then ``heads`` filters its ``label`` column)."""
    if isinstance(scores, AttentionPatternScores):
        frame = scores.to_frame(heads)
    else:
        frame = scores.copy()
        if heads is not None:
            labels = [h if isinstance(h, str) else head_label(*h) for h in heads]
            frame = frame[frame["label"].isin(labels)].reset_index(drop=True)
    if classes is None:
        classes = [c for c in ALL_CLASSES if f"{c}_excess" in frame.columns]
    if not classes:
        raise ConfigError("no '<class>_excess' columns to classify by")
    excess = frame[[f"{c}_excess" for c in classes]].to_numpy(dtype=float)
    mass = frame[[f"{c}_mass" for c in classes]].to_numpy(dtype=float)
    filled = np.where(np.isnan(excess), -np.inf, excess)
    best = filled.argmax(axis=1) if len(frame) else np.zeros(0, dtype=int)
    rows = np.arange(len(frame))
    best_excess = filled[rows, best]
    best_mass = mass[rows, best]
    dominant = np.array(classes, dtype=object)[best]
    has_any = np.isfinite(best_excess)
    frame["dominant"] = np.where(has_any, dominant, None)
    frame["dominant_mass"] = np.where(has_any, best_mass, np.nan)
    frame["dominant_excess"] = np.where(has_any, best_excess, np.nan)
    keep = has_any & (best_mass >= threshold) & (best_excess >= min_excess)
    frame["pattern_class"] = np.where(keep, dominant, "other")
    return frame


# --------------------------------------------------------------------------- running a model

_FORWARD_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def _find_hooked(model: HookedModel) -> Any:
    """The TransformerLens module that owns ``blocks.{l}.attn.hook_pattern``."""
    inner = (getattr(model, name, None) for name in ("model", "encoder", "transformer"))
    for candidate in (model, *inner):
        if callable(getattr(candidate, "hooks", None)) and hasattr(candidate, "cfg"):
            return candidate
    raise ConfigError(
        "score_attention_patterns needs a TransformerLens model (with .hooks() and .cfg), or an "
        "object whose .model is one"
    )


def _is_causal(model: HookedModel, hooked: Any) -> bool:
    """Whether the model's attention is causal: a hooked classifier knows (``is_encoder``);
    any other TransformerLens model says so in its config."""
    for candidate in (model, hooked):
        if isinstance(candidate, StagedClassifier):
            return not candidate.is_encoder
    return getattr(hooked.cfg, "attention_dir", "causal") != "bidirectional"


def _segments(batch: Mapping[str, Any], sep_ids: Collection[int]) -> Tensor:
    """token_type_ids for rows that use them (any non-zero on a valid position), otherwise
    segments derived from the first separator."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    derived = segment_ids_from_sep(ids, sep_ids, mask)
    types = batch.get("token_type_ids")
    if types is None:
        return derived
    types = torch.as_tensor(types, device=ids.device).long()
    valid = torch.ones_like(types, dtype=torch.bool) if mask is None else mask.bool()
    uses_types = ((types != 0) & valid).any(dim=-1, keepdim=True)
    return torch.where(uses_types, types, derived)


def score_attention_patterns(
    model: HookedModel,
    batches: Iterable[Mapping[str, Any]],
    *,
    sep_ids: Collection[int] | int,
    heads: Iterable[str | tuple[int, int]] | None = None,
    causal: bool | None = None,
    first_is_special: bool = True,
    forward: Callable[[Mapping[str, Any]], Any] | None = None,
    max_batches: int | None = None,
    prompts: TokenizedPrompts | None = None,
    classes: Sequence[str] | None = None,
) -> AttentionPatternScores:
    """Run ``model`` over ``batches`` with hooks on ``blocks.{l}.attn.hook_pattern`` and
    accumulate per-class attention masses (nothing but per-head sums is kept).

    ``model`` is a TransformerLens model (or an object whose ``.model`` is one); each batch is a
    mapping with ``input_ids``, ``attention_mask`` and optionally ``token_type_ids``, moved to
    the model's device and passed as ``model(input_ids=..., attention_mask=...,
    token_type_ids=...)`` (keys that are absent or None are left out) unless ``forward(batch)``
    is given. ``heads`` restricts the hooked layers (and the rows later read from the result).
    ``causal`` defaults to ``not model.is_encoder``, else ``cfg.attention_dir != "bidirectional"``.
    ``prompts``: the tokenised prompt task the batches come from (their ``index`` rows), whose
    answer and distractor tokens the ``to_answer`` / ``to_distractor`` classes read; the
    classes default to :data:`DECODER_CLASSES` with prompts, :data:`PATTERN_CLASSES` without.
    """
    hooked = _find_hooked(model)
    cfg = hooked.cfg
    if causal is None:
        causal = _is_causal(model, hooked)
    wanted = _head_index(heads)
    layers = sorted({lay for lay, _ in wanted}) if wanted else list(range(cfg.n_layers))
    if classes is None:
        classes = DECODER_CLASSES if prompts is not None else PATTERN_CLASSES
    scores = AttentionPatternScores(
        cfg.n_layers, cfg.n_heads, sep_ids=sep_ids, causal=causal,
        first_is_special=first_is_special, classes=classes,
    )  # fmt: skip
    answers = None if prompts is None else torch.tensor(prompts.labels)
    rivals = None
    if prompts is not None and prompts.distractors is not None:
        rivals = torch.tensor(prompts.distractors)
    try:
        device = next(hooked.parameters()).device
    except (StopIteration, AttributeError):
        device = torch.device("cpu")
    current: dict[str, Any] = {}

    def make_hook(layer: int) -> Callable[..., None]:
        def hook(pattern: Tensor, hook: Any) -> None:
            if current.get("key_masks") is None:  # once per batch, shared by every layer
                index = current["index"]
                current["key_masks"] = scores.key_masks(
                    current["input_ids"].to(pattern.device),
                    None if current["mask"] is None else current["mask"].to(pattern.device),
                    current["segment_ids"].to(pattern.device),
                    None if answers is None else answers[index].to(pattern.device),
                    None if rivals is None else rivals[index].to(pattern.device),
                )
            scores.add(layer, pattern, key_masks=current["key_masks"])

        return hook

    from mi_core.models.hooks import act_name

    fwd_hooks = [(act_name("pattern", layer), make_hook(layer)) for layer in layers]
    training = getattr(hooked, "training", False)
    if hasattr(hooked, "eval"):
        hooked.eval()
    try:
        with torch.no_grad(), hooks_held(hooked, fwd_hooks):
            for i, raw in enumerate(batches):
                if max_batches is not None and i >= max_batches:
                    break
                batch = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in raw.items()}
                if getattr(hooked, "infer_inputs", None) is not None:  # what model(ids) infers
                    ids, mask, types = batch_inputs(hooked, batch, device)
                    batch = {**batch, "input_ids": ids, "attention_mask": mask}
                    if types is not None:
                        batch["token_type_ids"] = types
                current["input_ids"] = batch["input_ids"]
                current["mask"] = batch.get("attention_mask")
                current["segment_ids"] = _segments(batch, scores.sep_ids)
                current["key_masks"] = None
                if prompts is not None and "index" not in batch:
                    raise ConfigError("with prompts, each batch needs its rows' index")
                current["index"] = None if prompts is None else batch["index"].cpu()
                if forward is not None:
                    forward(batch)
                else:
                    model(**{k: batch[k] for k in _FORWARD_KEYS if batch.get(k) is not None})
    finally:
        if training and hasattr(hooked, "train"):
            hooked.train()
    scores.heads = wanted
    return scores
