"""Ablation tables (the paper's Tables 3, 4 and 8): accuracy with heads and head sets removed.

Rows: ``None (full model)``, one row per listed head, ``Avg. (others)`` (mean and std over the
single ablations of every head not listed), each joint set, and each joint set's
superadditivity: its drop minus the sum of its heads' single drops, where drop = full accuracy -
ablated accuracy (positive means superadditive).

Single ablations reuse the clean run. Removing a head of layer ``l`` changes nothing before its
``hook_z``, so the residual stream entering every layer is computed once per batch, and the
ablations of layer ``l`` resume from it. Inside layer ``l`` the attention pattern and every
head's ``z`` are the clean ones too: the block runs once on the clean batch, and hooks turn its
``z`` into one copy per ablated head (batch ``[k * batch]``) just before the output projection, so
only the rest of layer ``l`` and the layers after it run per ablation. For encoder classifiers,
which read only the first token, the last block computes only that token's query and MLP. The
logits equal those of one full forward pass per ablation (the naive loop,
:func:`naive_ablation_logits`) up to float rounding; the tests hold them to 1e-5.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from mi_core.errors import ConfigError, InterventionError
from mi_core.interventions.ablation import Fill, ablate, head_fill_values, interpolate
from mi_core.interventions.components import (
    Component,
    all_heads,
    model_dims,
    parse_components,
)
from mi_core.interventions.config import AblationTableConfig
from mi_core.interventions.mask import ComponentMask
from mi_core.interventions.means import ComponentMeans
from mi_core.models.classifier import StagedClassifier, batch_inputs
from mi_core.models.hook_context import hooked
from mi_core.models.hooks import act_name

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

Batch = Mapping[str, torch.Tensor]
Logits = Float[torch.Tensor, "n label"]
HeadSet = tuple[Component, ...]

#: Tokens (copies x batch x positions) of stacked ablation copies run at once; bounds memory.
DEFAULT_MAX_TOKENS = 65536


@dataclass
class AblationLogits:
    """Class logits on one data set (in data set order): full model, each head, each head set."""

    full: Logits
    singles: dict[Component, Logits] = field(default_factory=dict)
    joints: dict[HeadSet, Logits] = field(default_factory=dict)

    def max_abs_diff(self, other: AblationLogits) -> float:
        """Largest absolute logit difference to ``other`` over every shared ablation."""
        diffs = [(self.full - other.full).abs().max()]
        diffs += [(v - other.singles[k]).abs().max() for k, v in self.singles.items()]
        diffs += [(v - other.joints[k]).abs().max() for k, v in self.joints.items()]
        return float(torch.stack(diffs).max())


def _check_heads(model: HookedModel, components: Iterable[Component]) -> None:
    cfg = model_dims(model)
    for c in components:
        c.check(cfg.n_layers, cfg.n_heads)
        if c.is_mlp:
            raise InterventionError(f"ablation tables ablate attention heads, not {c}")


class _Collector:
    """Gathers per-batch logits back into data set order (by ``batch["index"]`` if present)."""

    def __init__(self) -> None:
        self.parts: dict[Any, list[torch.Tensor]] = {}
        self.index: list[torch.Tensor] = []
        self.seen = 0

    def add_batch(self, batch: Batch, n: int) -> None:
        index = batch.get("index")
        self.index.append(
            torch.arange(self.seen, self.seen + n) if index is None else index.reshape(-1).cpu()
        )
        self.seen += n

    def add(self, key: Any, logits: torch.Tensor) -> None:
        self.parts.setdefault(key, []).append(logits.detach().float().cpu())

    def result(self) -> AblationLogits:
        if not self.index:
            raise InterventionError("cannot build an ablation table from an empty data set")
        order = torch.cat(self.index).argsort()
        gather = {key: torch.cat(parts)[order] for key, parts in self.parts.items()}
        full = gather.pop("full")
        singles = {k: v for k, v in gather.items() if isinstance(k, Component)}
        joints = {k: v for k, v in gather.items() if isinstance(k, tuple)}
        return AblationLogits(full, singles, joints)


@torch.inference_mode()
def ablation_logits(
    model: StagedClassifier,
    batches: Iterable[Batch],
    heads: Sequence[Component],
    joints: Sequence[HeadSet] = (),
    means: ComponentMeans | None = None,
    fill: str | Fill = Fill.MEAN,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    progress: bool = False,
    readout: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> AblationLogits:
    """Logits of the full model, of each single-head ablation and of each head set, fast.

    ``model`` is a hooked classifier run in stages (:class:`StagedClassifier`).
    ``readout(logits, index)`` keeps what the table needs of each batch's logits (a language
    model's: :meth:`~mi_core.data.TokenizedPrompts.answer_vs_rival`, two columns instead of
    its vocabulary, for every one of hundreds of ablations).
    """
    keep = (lambda logits, index: logits) if readout is None else readout
    fill = Fill.parse(fill)
    _check_heads(model, list(heads) + [c for s in joints for c in s])
    if fill is Fill.MEAN:
        if means is None:
            raise InterventionError("mean ablation needs means: pass means or use zero ablation")
        means.check_model(model, fingerprint=False)
    cfg = model_dims(model)
    by_layer: dict[int, list[int]] = {}
    for c in sorted(set(heads)):
        by_layer.setdefault(c.layer, []).append(c.head)
    joint_masks = [(s, ComponentMask.from_removed(model, list(s))) for s in joints]
    device = next(model.parameters()).device
    out = _Collector()
    for batch in tqdm(batches, desc="ablations", disable=not progress, unit="batch"):
        ids, mask, types = batch_inputs(model, batch, device)
        out.add_batch(batch, ids.shape[0])
        index = batch.get("index", torch.arange(ids.shape[0]))
        resid = model.embed_input(ids, mask, types)
        resid_pre = []
        for layer in range(cfg.n_layers):
            resid_pre.append(resid)
            resid = model.run_blocks(resid, mask, start=layer, stop=layer + 1)
        out.add("full", keep(model.classify(resid, mask), index))
        chunk = max(1, max_tokens // ids.numel())
        for layer, layer_heads in by_layer.items():
            for start in range(0, len(layer_heads), chunk):
                group = layer_heads[start : start + chunk]
                logits = _stacked_head_ablations(
                    model, resid_pre[layer], mask, layer, group, means, fill
                )
                for head, copy in zip(group, logits, strict=True):
                    out.add(Component(layer, head), keep(copy, index))
        for head_set, joint_mask in joint_masks:
            first = min(c.layer for c in head_set)
            with ablate(model, joint_mask, means, fill):
                resid = model.run_blocks(resid_pre[first], mask, start=first)
                out.add(head_set, keep(model.classify(resid, mask), index))
    return out.result()


def _stacked_head_ablations(
    model: HookedModel,
    resid_pre: Float[torch.Tensor, "batch pos d_model"],
    attention_mask: torch.Tensor,
    layer: int,
    heads: list[int],
    means: ComponentMeans | None,
    fill: Fill,
) -> Float[torch.Tensor, "copy batch label"]:
    """Logits with each of ``heads`` of ``layer`` removed in turn, from the clean ``resid_pre``."""
    k, batch = len(heads), resid_pre.shape[0]
    n_heads = model.cfg.n_heads
    keep = torch.ones(k, 1, 1, n_heads, 1, dtype=resid_pre.dtype, device=resid_pre.device)
    keep[torch.arange(k), 0, 0, torch.tensor(heads), 0] = 0.0

    def copies_of_z(z: torch.Tensor, hook: Any) -> torch.Tensor:
        # z is the clean batch [batch, ...] or already repeated [k * batch, ...]
        values = head_fill_values(model, means, fill, layer, z)
        return interpolate(z.unflatten(0, (-1, batch)), keep, values).flatten(0, 1)

    def split_copies(x: torch.Tensor, hook: Any) -> torch.Tensor:
        return x.unflatten(0, (k, batch))

    def merge_copies(x: torch.Tensor, hook: Any) -> torch.Tensor:
        return x.flatten(0, 1)

    cfg = model.cfg
    repeated_mask = attention_mask.repeat(k, 1)
    hooks = [(act_name("z", layer), copies_of_z)]
    if cfg.parallel_attn_mlp:
        # Attention and MLP both read resid_pre: there is no point inside the block to expand at.
        resid, block_mask = resid_pre.repeat(k, 1, 1), repeated_mask
    else:
        merge_at = "resid_post" if cfg.attn_only else "resid_mid"
        hooks += [
            (act_name("attn_out", layer), split_copies),
            (act_name(merge_at, layer), merge_copies),
        ]
        resid, block_mask = resid_pre, attention_mask
    with hooked(model, hooks + _readout_hooks(model)):
        resid = model.run_blocks(resid, block_mask, start=layer, stop=layer + 1)
        resid = model.run_blocks(resid, repeated_mask, start=layer + 1)
    return model.classify(resid, repeated_mask).unflatten(0, (k, batch))


def _readout_hooks(model: HookedModel) -> list[tuple[str, Any]]:
    """Hooks that make the last block compute only the token the encoder's head reads.

    An encoder classifier reads the first token of the last block's output, so in that block
    only its query (keys and values still come from every token) and its MLP input are needed.
    Decoder classifiers read a different position per row and get no such shortcut.
    """
    if not getattr(model, "is_encoder", False) or model.cfg.parallel_attn_mlp:
        return []
    last = model.cfg.n_layers - 1
    first_token = lambda x, hook: x[:, :1]
    merge_at = "resid_post" if model.cfg.attn_only else "resid_mid"
    return [(act_name("q", last), first_token), (act_name(merge_at, last), first_token)]


@torch.inference_mode()
def naive_ablation_logits(
    model: HookedModel,
    batches: Iterable[Batch],
    heads: Sequence[Component],
    joints: Sequence[HeadSet] = (),
    means: ComponentMeans | None = None,
    fill: str | Fill = Fill.MEAN,
) -> AblationLogits:
    """The same as :func:`ablation_logits` with one full forward pass per ablation (reference)."""
    masks: list[tuple[Any, ComponentMask | None]] = [("full", None)]
    masks += [(h, ComponentMask.from_removed(model, [h])) for h in heads]
    masks += [(s, ComponentMask.from_removed(model, list(s))) for s in joints]
    device = next(model.parameters()).device
    out = _Collector()
    for batch in batches:
        ids, mask, types = batch_inputs(model, batch, device)
        out.add_batch(batch, ids.shape[0])
        for key, component_mask in masks:
            if component_mask is None:
                out.add(key, model(ids, mask, types))
                continue
            with ablate(model, component_mask, means, fill):
                out.add(key, model(ids, mask, types))
    return out.result()


# ------------------------------------------------------------------------------------- table
#: Not plain "None": pandas reads that back from a CSV as a missing value.
FULL_ROW = "None (full model)"
OTHERS_ROW = "Avg. (others)"


def head_set_name(head_set: Iterable[Component]) -> str:
    """``L2.H5+L3.H7``: how a joint set is written on the command line and in tables."""
    return "+".join(str(c) for c in head_set)


def parse_head_set(
    spec: str | Sequence[Component | str | tuple[int, int]], cfg_or_model: Any
) -> HeadSet:
    """A joint set of heads of the model from ``"L2.H5+L3.H7+L4.H0"`` or a sequence of heads
    (components, names such as ``"L2.H5"`` or ``(layer, head)`` tuples)."""
    text = spec.replace("+", ",") if isinstance(spec, str) else list(spec)
    heads = tuple(parse_components(text, cfg_or_model))
    if len(heads) < 2:
        raise InterventionError(f"joint set {spec!r} needs at least two heads, e.g. L2.H5+L3.H7")
    _check_heads(cfg_or_model, heads)
    return heads


@dataclass
class AblationTable:
    """Accuracies (fractions) per data set: full model, single heads, joint sets.

    ``singles`` holds every head that was ablated; ``listed`` the ones shown as their own rows;
    the others make up the ``Avg. (others)`` row.
    """

    datasets: list[str]
    full: dict[str, float]
    singles: dict[Component, dict[str, float]]
    listed: list[Component]
    joints: dict[HeadSet, dict[str, float]] = field(default_factory=dict)
    n_examples: dict[str, int] = field(default_factory=dict)
    logits: dict[str, AblationLogits] = field(default_factory=dict, repr=False)
    averages_others: bool = True
    """Whether every unlisted head was ablated, so that ``Avg. (others)`` averages them all."""

    def others(self) -> list[Component]:
        """Ablated heads that are not listed: the heads averaged in ``Avg. (others)``."""
        listed = set(self.listed)
        return [c for c in sorted(self.singles) if c not in listed]

    def drop(self, accuracy: Mapping[str, float]) -> dict[str, float]:
        """Full accuracy minus ``accuracy``, per data set (positive: the ablation hurts)."""
        return {d: self.full[d] - accuracy[d] for d in self.datasets}

    def superadditivity(self, head_set: HeadSet) -> dict[str, float]:
        """Joint drop minus the sum of the single drops (positive: superadditive)."""
        joint = self.drop(self.joints[head_set])
        singles = [self.drop(self.singles[c]) for c in head_set]
        return {d: joint[d] - sum(s[d] for s in singles) for d in self.datasets}

    def others_stats(self) -> tuple[dict[str, float], dict[str, float]] | None:
        """Mean and std (population) of the single-ablation accuracies of the other heads."""
        others = self.others()
        if not others or not self.averages_others:
            return None
        values = {
            d: torch.tensor([self.singles[c][d] for c in others], dtype=torch.float64)
            for d in self.datasets
        }
        mean = {d: float(v.mean()) for d, v in values.items()}
        std = {d: float(v.std(unbiased=False)) for d, v in values.items()}
        return mean, std

    def frame(self) -> pd.DataFrame:
        """One row per ablation; per data set its accuracy, change and std, in percent.

        ``kind`` is ``full``, ``single``, ``others``, ``joint`` or ``superadditivity``; the
        superadditivity rows hold points (joint drop - sum of single drops) in the data set's
        column.
        """
        rows: list[dict[str, Any]] = []

        def add(name: str, kind: str, acc: Mapping[str, float], std: Mapping | None = None):
            row: dict[str, Any] = {"ablated": name, "kind": kind}
            for d in self.datasets:
                row[d] = 100 * acc[d]
                row[f"{d} change"] = 100 * (acc[d] - self.full[d])
                row[f"{d} std"] = 100 * std[d] if std is not None else math.nan
            rows.append(row)

        add(FULL_ROW, "full", self.full)
        for c in self.listed:
            add(str(c), "single", self.singles[c])
        stats = self.others_stats()
        if stats is not None:
            add(OTHERS_ROW, "others", *stats)
        for head_set, acc in self.joints.items():
            add(head_set_name(head_set), "joint", acc)
        for head_set in self.joints:
            sup = self.superadditivity(head_set)
            row = {
                "ablated": f"Superadditivity {head_set_name(head_set)}",
                "kind": "superadditivity",
            }
            for d in self.datasets:
                row.update({d: 100 * sup[d], f"{d} change": math.nan, f"{d} std": math.nan})
            rows.append(row)
        columns = ["ablated", "kind"] + [
            f"{d}{suffix}" for d in self.datasets for suffix in ("", " change", " std")
        ]
        return pd.DataFrame(rows, columns=columns)

    def display_frame(self) -> pd.DataFrame:
        """The paper's layout: ``61.2 (-3.4)`` per cell, ``83.9 ± 0.4 (-0.1)`` for the average."""
        frame = self.frame()
        out = pd.DataFrame({"Ablated": frame["ablated"]})
        for d in self.datasets:
            cells = []
            for _, row in frame.iterrows():
                value, change = f"{row[d]:.1f}", _signed(row[f"{d} change"])
                if row["kind"] == "full":
                    cells.append(value)
                elif row["kind"] == "superadditivity":
                    cells.append(_signed(row[d]))
                elif row["kind"] == "others":
                    cells.append(f"{value} ± {row[f'{d} std']:.1f} ({change})")
                else:
                    cells.append(f"{value} ({change})")
            out[d] = cells
        return out

    def markdown(self) -> str:
        """A Markdown table like the paper's (accuracy in %, signed change from the full model)."""
        frame = self.display_frame()
        header = "| " + " | ".join(frame.columns) + " |"
        rule = "|" + "|".join(["---"] + ["---:"] * (len(frame.columns) - 1)) + "|"
        body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(False)]
        note = (
            "Accuracy in %, change from the full model in points. Superadditivity = joint drop "
            "minus the sum of single drops (drop = full - ablated); positive is superadditive."
        )
        return "\n".join([header, rule, *body, "", note, f"Examples: {self._examples()}.", ""])

    def _examples(self) -> str:
        return ", ".join(f"{d}: n={self.n_examples.get(d, '?')}" for d in self.datasets)

    def html(self) -> str:
        """The same table as a standalone HTML page."""
        table = self.display_frame().to_html(index=False, border=0, classes="ablation-table")
        return (
            "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Ablation table</title>"
            "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
            "td,th{padding:4px 10px;text-align:right}td:first-child{text-align:left}"
            "tr:nth-child(even){background:#f4f4f4}</style></head><body>\n"
            f"{table}\n<p>Accuracy in %, change from the full model in points. Superadditivity "
            "= joint drop minus the sum of single drops; positive is superadditive.</p>\n"
            f"<p>Examples: {html.escape(self._examples())}.</p>\n</body></html>\n"
        )


def _signed(points: float) -> str:
    """``+1.2`` / ``-3.4``; a change that rounds to zero is ``+0.0``, never ``-0.0``."""
    return f"{round(points, 1) + 0.0:+.1f}"


def ablation_table(
    model: HookedModel,
    datasets: Sequence[Any],
    heads: str | Sequence[Component | str | tuple[int, int]] | None = None,
    joints: Sequence[str | Sequence[Component | str | tuple[int, int]]] = (),
    means: ComponentMeans | None = None,
    fill: str | Fill = Fill.MEAN,
    *,
    batch_size: int = 64,
    max_length: int = 128,
    others: bool = False,
    progress: bool = False,
) -> AblationTable:
    """Build the table for ``datasets`` (:class:`~mi_core.data.PairDataset`).

    ``heads`` are the listed rows (None: every head), as components, names (``"L2.H5,L4.H0"``)
    or ``(layer, head)`` tuples; ``joints`` are head sets, each ``"L2.H5+L3.H7"`` or a
    sequence of heads in any of those forms (``["L2.H5", "L4.H0"]``).
    With ``others``, every other head is ablated too, one at a time, for the
    ``Avg. (others)`` row (one pass per head: only when asked); without it there is no such
    row (a joint set's heads are ablated singly for its superadditivity, but an Avg. row of a
    few of them would look like an average of every other head).
    """
    if heads is not None:
        heads = parse_components(heads, model)
    joints = [parse_head_set(j, model) for j in joints]
    from mi_core.data import pair_batches
    from mi_core.data.batches import TokenizedPrompts, task_scorer, tokenize_pairs

    every = all_heads(model)
    listed = every if heads is None else sorted(set(heads))
    _check_heads(model, listed)
    ablated = set(listed) | {c for s in joints for c in s}
    if others:
        ablated |= set(every)
    if not datasets:
        raise InterventionError("an ablation table needs at least one data set")
    names = [ds.name for ds in datasets]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise InterventionError(f"data set {twice} is given twice; give each data set once")
    table = AblationTable(
        datasets=[ds.name for ds in datasets],
        full={},
        singles={c: {} for c in ablated},
        listed=listed,
        joints={tuple(s): {} for s in joints},
        averages_others=others,
    )
    for ds in datasets:
        if len(ds) == 0:
            raise InterventionError(f"data set {ds.name} is empty; nothing to ablate on")
        tokenized = tokenize_pairs(ds, model.tokenizer, max_length)
        batches = pair_batches(tokenized, batch_size=batch_size, sort_by_length=True)
        readout = tokenized.answer_vs_rival if isinstance(tokenized, TokenizedPrompts) else None
        logits = ablation_logits(
            model, batches, sorted(ablated), joints, means, fill, progress=progress,
            readout=readout,
        )  # fmt: skip
        table.logits[ds.name] = logits
        table.n_examples[ds.name] = len(ds)
        score = task_scorer(ds, tokenized)
        table.full[ds.name] = score(logits.full)
        for c, values in logits.singles.items():
            table.singles[c][ds.name] = score(values)
        for s, values in logits.joints.items():
            table.joints[s][ds.name] = score(values)
    return table


def run_ablation_table(config: AblationTableConfig, *, progress: bool = True) -> AblationTable:
    """Load the model and data of ``config``, build the table, write its CSV, Markdown and
    HTML (beside ``config.out``)."""
    from mi_core.data import load_pairs
    from mi_core.data.prompt_tasks import check_task_specs, load_task_data
    from mi_core.interventions.components import parse_components
    from mi_core.interventions.means import load_means
    from mi_core.io import check_replaceable, write_csv, write_text
    from mi_core.models import load_model
    from mi_core.models.loading import warn_if_random_head
    from mi_core.tasks import NEXT_TOKEN

    out = Path(config.out)  # the table's three files, before any work (not only the .csv)
    check_replaceable(out.parent, [out.name, out.with_suffix(".md").name,
                                   out.with_suffix(".html").name])  # fmt: skip
    if check_task_specs(config.data):  # a language model on prompt tasks
        model = load_model(config.model, task=NEXT_TOKEN, **config.load_options())
        datasets = [
            load_task_data(spec, config.max_examples, tokenizer=model.tokenizer)
            for spec in config.data
        ]
    else:
        datasets = [load_pairs(spec, max_examples=config.max_examples) for spec in config.data]
        task = config.task or datasets[0].task
        model = load_model(config.model, task=task, **config.load_options())
    for ds in datasets:
        if ds.task != model.task:
            raise ConfigError(f"{ds.name} is {ds.task} data but the model is a {model.task} model")
    warn_if_random_head(model, config.model, "the accuracies of this table")
    every = config.heads.strip().lower() == "all"
    heads = None if every else parse_components(config.heads, model)
    joints = [parse_head_set(text, model) for text in config.joint]
    means = load_means(config.means, model) if config.means else None
    table = ablation_table(
        model,
        datasets,
        heads,
        joints,
        means,
        config.fill,
        batch_size=config.batch_size,
        max_length=config.max_length,
        others=config.others,
        progress=progress,
    )
    out = Path(config.out)
    write_csv(out, table.frame())
    write_text(out.with_suffix(".md"), table.markdown())
    write_text(out.with_suffix(".html"), table.html())
    return table
