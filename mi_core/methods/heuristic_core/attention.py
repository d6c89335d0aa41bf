"""Attention patterns of chosen heads: their classes over a data set (Figure 9) and example views
(Figures 7 and 8) as offline circuitsvis HTML.

The classes come from :mod:`mi_core.analysis.attention_patterns` (mass on overlapping tokens,
previous / next token, separators, the first token, self, compared with a uniform pattern).
Views are stored as data (``views.json``: tokens, the chosen heads' patterns) and rendered with
:func:`mi_core.viz.attention_view_fragment`, so a report can re-render them without the model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from mi_core.analysis.attention_patterns import classify_heads, score_attention_patterns
from mi_core.analysis.subnetworks import parse_head_label
from mi_core.data import pair_batches
from mi_core.data.batches import TokenizedPrompts, tokenize_pairs
from mi_core.data.prompt_tasks import PromptTask, TaskData
from mi_core.data.text import TextTask
from mi_core.errors import ConfigError
from mi_core.io import read_json, write_json
from mi_core.methods.heuristic_core.layout import ATTENTION_VIEWS
from mi_core.models.hook_context import hooked
from mi_core.models.hooks import act_name
from mi_core.viz.attention_html import write_attention_html

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = [
    "attention_classes",
    "attention_views",
    "choose_heads",
    "read_views",
    "separator_ids",
    "write_views",
]


def choose_heads(
    core: Sequence[str],
    frequency: pd.DataFrame,
    explicit: Sequence[str] | None = None,
    max_heads: int = 12,
) -> list[str]:
    """The heads to inspect: ``explicit`` if given, else the core, else (an empty core) the
    ``max_heads`` most frequently kept heads over all subnetworks (``freq_all`` column)."""
    if explicit:
        for label in explicit:
            parse_head_label(label)
        return list(explicit)
    if core:
        return list(core)
    ranked = frequency.sort_values(["freq_all", "layer", "head"], ascending=[False, True, True])
    return list(ranked["label"].head(max_heads))


def separator_ids(tokenizer: Any) -> list[int]:
    """Token ids that separate the two sentences: ``[SEP]`` / ``</s>``, or eos for decoders."""
    ids = {getattr(tokenizer, "sep_token_id", None), getattr(tokenizer, "eos_token_id", None)}
    ids.discard(None)
    if not ids:
        raise ConfigError("the tokenizer has neither a sep nor an eos token to split pairs at")
    return sorted(int(i) for i in ids)


def attention_classes(
    model: HookedModel,
    dataset: TaskData,
    heads: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int = 128,
    threshold: float = 0.3,
    min_excess: float = 0.1,
) -> pd.DataFrame:
    """One row per head of ``heads``: mean attention mass per class, its uniform baseline and
    the head's ``pattern_class`` (:func:`mi_core.analysis.classify_heads`); a prompt task's
    heads on the decoder classes (previous token, duplicate, induction, first token, self, to
    the answer / distractor: :data:`~mi_core.analysis.attention_patterns.DECODER_CLASSES`)."""
    if not heads:
        raise ConfigError("no heads to classify")
    tokenized = tokenize_pairs(dataset, model.tokenizer, max_length)
    batches = pair_batches(tokenized, batch_size=batch_size)
    prompts = tokenized if isinstance(tokenized, TokenizedPrompts) else None
    scores = score_attention_patterns(
        model, batches, sep_ids=separator_ids(model.tokenizer), heads=list(heads), prompts=prompts
    )
    table = classify_heads(scores, threshold, min_excess=min_excess, heads=list(heads))
    table.insert(0, "dataset", dataset.name)
    return table


def _grab(store: dict[int, torch.Tensor], layer: int):
    def hook(pattern: torch.Tensor, hook: Any) -> None:
        store[layer] = pattern[0].detach().float().cpu()

    return hook


@torch.no_grad()
def attention_views(
    model: HookedModel,
    dataset: TaskData,
    heads: Sequence[str],
    n_views: int = 2,
    *,
    max_length: int = 128,
) -> list[dict[str, Any]]:
    """The chosen heads' attention patterns on the first ``n_views`` pairs of ``dataset``:
    one dict per pair with ``title``, ``tokens``, ``heads`` and ``pattern`` (head, q, k lists)."""
    index = [parse_head_label(h) for h in heads]
    layers = sorted({layer for layer, _ in index})
    causal = not bool(getattr(model, "is_encoder", True))
    device = next(model.parameters()).device
    views = []
    for i in range(min(n_views, len(dataset))):
        tokenized = tokenize_pairs(dataset.subset([i]), model.tokenizer, max_length)
        batch = tokenized.collate([0])
        captured: dict[int, torch.Tensor] = {}
        hooks = [(act_name("pattern", layer), _grab(captured, layer)) for layer in layers]
        was_training = model.training
        model.eval()
        try:
            with hooked(model, hooks):
                model(
                    batch["input_ids"].to(device),
                    batch["attention_mask"].to(device),
                    batch["token_type_ids"].to(device),
                )
        finally:
            model.train(was_training)
        pattern = torch.stack([captured[layer][head] for layer, head in index])
        tokens = model.tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
        if isinstance(dataset, PromptTask):
            example = dataset.examples[i]
            rival = f" vs {example.distractor!r}" if example.distractor is not None else ""
            title = f"{dataset.name} #{i} (answer {example.answer!r}{rival}): {example.prompt}"
        elif isinstance(dataset, TextTask):
            title = f"{dataset.name} #{i} (window of {len(dataset.windows[i])} tokens)"
        else:
            pair = dataset[i]
            label = dataset.label_names[pair["label"]]
            title = f"{dataset.name} #{i} ({label}): {pair['text_a']} | {pair['text_b']}"
        views.append(
            {
                "dataset": dataset.name,
                "index": i,
                "title": title,
                "tokens": [str(t) for t in tokens],
                "heads": list(heads),
                "causal": causal,
                "pattern": pattern.tolist(),
            }
        )
    return views


def write_views(views: Sequence[dict[str, Any]], out: str | os.PathLike[str]) -> list[Path]:
    """Save ``views.json`` and one standalone offline page per view (``view_<i>.html``)."""
    out = Path(out)
    write_json(out / ATTENTION_VIEWS, list(views))
    paths = []
    for i, view in enumerate(views):
        paths.append(
            write_attention_html(
                out / f"view_{i}.html",
                view["tokens"],
                torch.tensor(view["pattern"]),
                view["heads"],
                title=view["title"],
                causal=view.get("causal", False),
            )
        )
    return paths


def read_views(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The views saved by :func:`write_views` (``views.json``), or [] if there are none."""
    path = Path(path)
    return list(read_json(path)) if path.is_file() else []
