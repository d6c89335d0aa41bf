"""Iterative separability pruning: score, remove the top fraction, re-measure, repeat.

Each step collects fresh activation statistics of the model *as pruned so far* on the focus and
the cripple data sets (their ``stats`` token windows), scores every remaining neuron by how much
more the cripple data set uses it (MLP neurons by ``ff_scoring``, attention pre-out neurons by
``attn_scoring``; the report's runs use ``freq`` and ``abs``), removes the top-scoring MLP
neurons and attention pre-out neurons (``attn_unit="neuron"``) or heads (``attn_unit="head"``,
neuron scores aggregated per head, or a fixed ``attn_heads_per_step``), and evaluates
next-token metrics on both data sets' ``heldout`` windows. Selection is global across layers.
How many units a step removes follows ``schedule``: ``"total"`` (the report) removes a
``frac`` share of *all* units each step, so ``1 / frac`` steps prune everything; ``"remaining"``
removes a share of those left, so the model shrinks geometrically. The random baseline removes
the same number of units per step, chosen by seeded random scores.

Removal is by hooks (:class:`~mi_core.interventions.neurons.PruneMasks`): zero, or the
neuron's mean on the focus data set (``ff_fill`` / ``attn_fill`` ``"mean"``; the report
found the mean offset on attention a "large bad effect", and the authors' runs use none: zero
is the default). A pre-out neuron carries its value bias, as the report's does (the model must
be loaded with ``fold_value_biases=False``). After every step the state -- masks and
trajectory rows -- is written to one safetensors file atomically, so a run that stops resumes
after its last finished step.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from transformer_lens import HookedTransformer

from mi_core.analysis.trajectory import relative_performance, trajectory_areas
from mi_core.errors import ConfigError, TrainingError
from mi_core.evaluation.next_token import METRICS, evaluate_next_token, most_frequent_tokens
from mi_core.interventions.neurons import PruneMasks
from mi_core.interventions.svd import svd_attention
from mi_core.io import read_safetensors, write_safetensors
from mi_core.methods.separability.config import (  # noqa: F401 (re-exported)
    EVAL_PROTOCOLS,
    JOB_FIELDS,
    LEARNED,
    SeparabilityConfig,
)
from mi_core.methods.separability.tokens import TaskTokens  # noqa: F401 (re-exported)
from mi_core.seeding import derive_seed
from mi_core.statistics.activations import ActivationStats, collect_activation_stats
from mi_core.statistics.scoring import (
    head_scores,
    n_to_prune_at,
    neuron_scores,
    random_scores,
    select_top,
)

logger = logging.getLogger(__name__)

STATE_FORMAT = "mi_core.separability.state/1"
RANDOM = "random"


@dataclass
class SeparabilityResult:
    """What a run produced: the trajectory rows, the masks, and the first step's scores."""

    config: SeparabilityConfig
    trajectory: pd.DataFrame
    masks: PruneMasks
    random_masks: PruneMasks | None
    first_scores: dict[str, torch.Tensor] = field(default_factory=dict)
    focus_name: str = "focus"
    cripple_name: str = "cripple"
    learned_masks: PruneMasks | None = None
    """The learned run's masks at its last step (``masks`` too when it is the only run)."""

    @property
    def method(self) -> str:
        """The name of the selective run in the trajectory's ``method`` column."""
        return self.config.method

    def run_frame(self, method: str | None = None) -> pd.DataFrame:
        """The trajectory rows of one method (default: the selective run)."""
        method = method or self.method
        return self.trajectory[self.trajectory["method"] == method].sort_values("step")

    def _end(self) -> dict[str, float]:
        """Each data set's top-1 at the last step, relative to the unpruned model's."""
        frame = self.run_frame()
        return {
            f"{role}_top1": float(
                relative_performance(frame[f"{role}_top1"].to_numpy(), "top1")[-1]
            )
            for role in ("focus", "cripple")
        }

    def summary(self) -> dict:
        """Areas and separability % per metric, for the run and the random baseline."""
        out = {
            "focus": self.focus_name,
            "cripple": self.cripple_name,
            "mode": self.config.mode,
            "steps_done": int(self.run_frame()["step"].max()),
            "config": self.config.pruning_options(),
            "pruned": {
                "ff_neurons": self.masks.n_ff_pruned,
                "attn_neurons": self.masks.n_attn_pruned,
                "attn_heads": self.masks.n_heads_pruned,
            },
            "areas": trajectory_areas(self.run_frame(), self.config.mode),
            "end": self._end(),
        }
        if self.random_masks is not None:
            out["random_areas"] = trajectory_areas(self.run_frame(RANDOM), self.config.mode)
        if self.config.selection == "both":
            frame = self.run_frame(LEARNED)
            out["learned_areas"] = trajectory_areas(frame, self.config.mode)
        out["findings"] = separability_findings(out)
        return out


#: The report's separability of code from text (OPT and Galactica, top-1 trajectories).
REPORT_SEPARABILITY_PCT = (65.0, 75.0)


#: The run must bring the cripple data's top-1 below this share of its start for its area to be
#: judged: above it, the straight line that closes the trajectory at (0, 0) decides the area.
PRUNED_FAR_ENOUGH = 0.5


def separability_findings(summary: dict) -> list[dict]:
    """The report's finding against a run's summary, by a fixed rule.

    The separability is judged signed, in the direction the run aims for: the cripple data's
    performance falling faster than the focus data's (top-1 area above 1 in ``cripple`` mode,
    below 1 in ``focus`` mode). Reproduced when that signed separability reaches the report's
    lower bound (65 %) and, with a random baseline, exceeds the random run's. Not measurable
    when the run stopped with the cripple data's top-1 above :data:`PRUNED_FAR_ENOUGH` of its
    start (the report's trajectories run to the whole model). The row says how far the run
    pruned.
    """
    if "mode" not in summary or "area" not in summary["areas"]["top1"]:
        raise ConfigError(
            "a separability summary of an older mi_core (no mode or top-1 area): re-run "
            "mi-core separability to write it again"
        )
    sign = 1.0 if summary["mode"] == "cripple" else -1.0

    def signed(areas: dict) -> float:
        return sign * (float(areas["top1"]["area"]) - 1.0) * 100.0

    ours = signed(summary["areas"])
    rand = signed(summary["random_areas"]) if "random_areas" in summary else None
    low, high = REPORT_SEPARABILITY_PCT
    text = f"top-1 separability {ours:+.1f} % (+: the cripple data's top-1 fell first)"
    verdict = "reproduced" if ours >= low else "not reproduced"
    if rand is not None:
        text += f"; random pruning: {rand:+.1f} %"
        if not ours > rand:
            verdict = "not reproduced"
    end = summary.get("end")
    if end is not None:
        text += (
            f"; after {summary.get('steps_done', '?')} steps the cripple top-1 is at "
            f"{100 * end['cripple_top1']:.0f} % of its start, the focus top-1 at "
            f"{100 * end['focus_top1']:.0f} %"
        )
        if math.isfinite(end["cripple_top1"]) and end["cripple_top1"] > PRUNED_FAR_ENOUGH:
            text += (
                f" (above {100 * PRUNED_FAR_ENOUGH:.0f} %: the area is mostly the line that "
                "closes the trajectory; prune further)"
            )
            verdict = "not measurable here"
    if not math.isfinite(ours):
        verdict = "not measurable here"
    return [
        {
            "finding": "Pruning by activation statistics separates the two capabilities",
            "paper": f"{low:.0f}-{high:.0f} % separability, far above random pruning",
            "this run": text,
            "verdict": verdict,
        }
    ]


@dataclass
class _Steps:
    """What every step of a run reads: the model, both data sets, the tokens the skip50
    metrics leave out, the config, and where each new trajectory row goes."""

    model: HookedTransformer
    focus: TaskTokens
    cripple: TaskTokens
    skip: dict[str, torch.Tensor]
    config: SeparabilityConfig
    moe: bool
    progress: bool
    record: Callable[[dict], None]

    def evaluate(self, masks: PruneMasks) -> dict[str, float]:
        """Both data sets' held-out metrics with ``masks`` removed."""
        hooks = masks.hooks(self.model)
        row: dict[str, float] = {}
        for role, task in (("focus", self.focus), ("cripple", self.cripple)):
            result = evaluate_next_token(
                self.model,
                task.heldout,
                task.heldout_mask,
                skip_tokens=self.skip[role],
                fwd_hooks=hooks,
                batch_size=self.config.batch_size,
                progress=self.progress,
                desc=f"evaluate {task.name}",
            )
            if self.config.eval_protocol == "texts":
                result["loss"] = result["text_loss"]
            if not all(map(lambda m: result[m] == result[m], ("loss", "top1"))):
                raise TrainingError(f"evaluation on {task.name} gave NaN (no predictable tokens?)")
            for metric in (*METRICS, "n_tokens"):
                row[f"{role}_{metric}"] = result[metric]
        return row

    def step_row(self, method: str, step: int, masks: PruneMasks, thresholds=None) -> None:
        """Evaluate ``masks`` and record the row of ``method`` at ``step``."""
        extra = () if thresholds is None else (thresholds,)
        self.record({**_row(method, step, masks, *extra), **self.evaluate(masks)})

    def statistics(self, masks: PruneMasks, step: int) -> dict[str, ActivationStats]:
        """Both data sets' activation statistics of the model with ``masks`` removed."""
        hooks = masks.hooks(self.model)
        return {
            role: collect_activation_stats(
                self.model,
                task.stats,
                task.stats_mask,
                batch_size=self.config.batch_size,
                sites=_sites(self.config, step, self.moe),
                fwd_hooks=hooks,
                progress=self.progress,
                desc=f"statistics {task.name}",
                correct_top_k=self.config.stats_correct_top_k,
            )
            for role, task in (("focus", self.focus), ("cripple", self.cripple))
        }


def _row(method: str, step: int, masks: PruneMasks, thresholds=(float("nan"),) * 2) -> dict:
    return {
        "method": method,
        "step": step,
        "ff_pruned": masks.n_ff_pruned,
        "attn_pruned": masks.n_attn_pruned,
        "heads_pruned": masks.n_heads_pruned,
        "ff_threshold": thresholds[0],
        "attn_threshold": thresholds[1],
    }


def _select(
    scores: dict[str, torch.Tensor],
    masks: PruneMasks,
    config: SeparabilityConfig,
    step: int,
) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[float, float]]:
    """Units to remove at ``step``: (MLP selection, pre-out selection, thresholds)."""
    ff_sel = attn_sel = None
    ff_thr = attn_thr = float("nan")

    def count(keep: torch.Tensor, frac: float) -> int:
        return n_to_prune_at(step, keep.numel(), int(keep.sum()), frac, config.schedule)

    if config.ff_frac > 0:
        remaining = masks.ff_keep
        ff_sel, ff_thr = select_top(scores["mlp"], remaining, count(remaining, config.ff_frac))
    if config.prunes_attention:
        keep = masks.attn_keep
        if config.attn_unit == "neuron":
            attn_sel, attn_thr = select_top(scores["attn"], keep, count(keep, config.attn_frac))
        else:
            heads_left = keep.all(dim=-1)
            if config.attn_heads_per_step:
                k = min(config.attn_heads_per_step, int(heads_left.sum()))
            else:
                k = count(heads_left, config.attn_frac)
            per_head = scores["attn"]
            if per_head.ndim == 3:
                per_head = head_scores(per_head, config.head_aggregation)
            head_sel, attn_thr = select_top(per_head, heads_left, k)
            attn_sel = head_sel[..., None].expand_as(keep).clone()
    return ff_sel, attn_sel, (ff_thr, attn_thr)


def _sites(config: SeparabilityConfig, step: int, moe: bool = False) -> tuple[str, ...]:
    if step == 1:  # both, so that the first scores can be plotted whatever is pruned
        return ("attn",) if moe else ("mlp", "attn")
    return tuple(
        site for site, on in (("mlp", config.ff_frac > 0), ("attn", config.prunes_attention)) if on
    )


def _save_state(
    path: Path,
    config: SeparabilityConfig,
    identity: dict,
    rows: list[dict],
    masks: PruneMasks,
    random_masks: PruneMasks | None,
    first_scores: dict[str, torch.Tensor],
    learned_masks: PruneMasks | None = None,
) -> None:
    tensors = masks.tensors("selective.")
    if random_masks is not None:
        tensors.update(random_masks.tensors("random."))
    if learned_masks is not None:
        tensors.update(learned_masks.tensors("learned."))
    tensors.update({f"scores.{k}": v.float().cpu() for k, v in first_scores.items()})
    write_safetensors(
        path,
        tensors,
        metadata={
            "format": STATE_FORMAT,
            "config": json.dumps(config.pruning_options(), sort_keys=True),
            "identity": json.dumps(identity, sort_keys=True),
            "rows": json.dumps(rows),
        },
    )


def check_state(
    state_path: str | os.PathLike[str], config: SeparabilityConfig, identity: dict | None = None
) -> int:
    """The last finished step saved at ``state_path`` (-1: no state yet).

    Raises :class:`ConfigError` when the state belongs to a run with other options or identity,
    so that a resuming command can fail before loading any model or data.
    """
    path = Path(state_path)
    if not path.exists():
        return -1
    # before the model is loaded its fingerprint is unknown: run_separability checks it
    rows = _load_state(path, config, dict(identity or {}), unknown=("model_fingerprint",))[0]
    return max(r["step"] for r in rows) if rows else -1


def _load_state(
    path: Path, config: SeparabilityConfig, identity: dict, unknown: tuple[str, ...] = ()
):
    """The saved rows, masks and first scores; refuses a state of other options or identity
    (``unknown``: identity keys not known yet, left out of the comparison)."""
    try:
        tensors, metadata = read_safetensors(path)
    except Exception as exc:  # noqa: BLE001 - a damaged file is reported as such
        raise ConfigError(f"{path} cannot be read as a separability state ({exc})") from None
    if metadata.get("format") != STATE_FORMAT:
        raise ConfigError(
            f"{path} is not a separability state file; remove it or use another --out"
        )
    # every state of this code records its score formula (run_separability adds it); one
    # without it is of an older mi_core (another formula, pre-out neurons without value biases)
    recorded = json.loads(metadata.get("identity", "{}"))
    if "score" not in recorded:
        raise ConfigError(
            f"{path} is a separability state of an older mi_core (it records no score formula) "
            "and cannot resume: re-run mi-core separability in another output directory"
        )
    saved = {**json.loads(metadata["config"]), **recorded}
    if "fill" not in saved:  # its options under their former names (ff_offset, ...)
        raise ConfigError(
            f"{path} is a separability state of an older mi_core (it records no fill) and "
            "cannot resume: re-run mi-core separability in another output directory"
        )
    wanted = {**config.pruning_options(), "score": SCORE_FORMULA, **identity}
    for key in unknown:
        if key not in wanted:
            saved.pop(key, None)
    if saved["score"] != wanted["score"]:
        raise ConfigError(
            f"{path} is a run whose neurons were scored by {saved['score']}, not "
            f"{wanted['score']}: resuming would mix the two in one trajectory; use another "
            "output directory"
        )
    if saved != wanted:
        changed = sorted(k for k in {*saved, *wanted} if saved.get(k) != wanted.get(k))
        raise ConfigError(
            f"{path} belongs to a run with other options ({', '.join(changed)} differ); re-run "
            "with the same options to resume, or use another output directory"
        )
    masks = PruneMasks.from_tensors(tensors, "selective.")
    random_masks = (
        PruneMasks.from_tensors(tensors, "random.") if "random.ff_step" in tensors else None
    )
    learned = PruneMasks.from_tensors(tensors, "learned.") if "learned.ff_step" in tensors else None
    first_scores = {
        k.removeprefix("scores."): v for k, v in tensors.items() if k.startswith("scores.")
    }
    return json.loads(metadata["rows"]), masks, random_masks, first_scores, learned


#: The score a run's steps rank neurons by (recorded in its state): the reference's ratio.
SCORE_FORMULA = "cripple / (focus + eps)"


def run_separability(
    model: HookedTransformer,
    focus: TaskTokens,
    cripple: TaskTokens,
    config: SeparabilityConfig,
    *,
    state_path: str | os.PathLike[str] | None = None,
    identity: dict | None = None,
    progress: bool = False,
    on_step: Callable[[dict], None] | None = None,
) -> SeparabilityResult:
    """Run iterative separability pruning of ``model`` (see the module docstring).

    With ``config.svd`` the model's attention is first rewritten in its OV-SVD basis
    (:func:`~mi_core.interventions.svd.svd_attention`, in place; outputs unchanged). With
    ``state_path`` the run saves its state there after every step and, when the file exists
    (from a run with the same options and the same ``identity``, a JSON-ready dict naming what
    else must match, e.g. the model and data), resumes after the last finished step.
    ``on_step`` is called with each new trajectory row.
    """
    identity = dict(identity or {})
    identity.setdefault("score", SCORE_FORMULA)  # a state of another formula cannot resume
    if getattr(model, "value_biases_folded", False) and (config.prunes_attention or config.svd):
        raise ConfigError(
            "the model's value biases were folded into its output bias (load_model's default "
            "for causal LMs), so hook_z leaves them out: the attention pre-out statistics would "
            "miss them and a removed neuron would keep its bias; load it with "
            "load_model(..., fold_value_biases=False), as mi-core separability does"
        )
    moe = bool(model.cfg.num_experts)
    if moe and config.ff_frac > 0:
        raise ConfigError(
            "a mixture-of-experts MLP (Mixtral, OLMoE, GPT-OSS) has no MLP neurons to score (each "
            "expert has its own and sees only the tokens routed to it): prune attention only "
            "(ff_frac 0 and attn_frac > 0; mi-core separability --ff-frac 0 --attn-frac F)"
        )
    if config.svd:
        svd_attention(model, combine_biases=config.svd_combine_biases)
    skip = {
        role: most_frequent_tokens(task.stats, task.stats_mask, config.skip_top)
        for role, task in (("focus", focus), ("cripple", cripple))
    }
    state_path = Path(state_path) if state_path is not None else None
    if state_path is not None and state_path.exists():
        rows, masks, random_masks, first_scores, learned_masks = _load_state(
            state_path, config, identity
        )
        logger.info("resuming %s after step %d", state_path, max(r["step"] for r in rows))
    else:
        rows, first_scores, learned_masks = [], {}, None
        masks = PruneMasks.empty(model)
        random_masks = PruneMasks.empty(model) if config.random_baseline else None
    statistics = config.selection != "learned"
    # the runs of the step loop below: the statistics' and the random baseline
    looped = [config.statistics_method] * statistics + [RANDOM] * (random_masks is not None)

    def save() -> None:
        if state_path is not None:
            _save_state(
                state_path, config, identity, rows, masks, random_masks, first_scores,
                learned_masks,
            )  # fmt: skip

    def record(row: dict) -> None:
        rows.append(row)
        if on_step is not None:
            on_step(row)

    run = _Steps(model, focus, cripple, skip, config, moe, progress, record)
    if not rows:
        base = run.evaluate(masks)
        learned = [LEARNED] if config.selection != "statistics" else []
        for method in (*looped, *learned):
            record({**_row(method, 0, masks), **base})
        save()

    done = min((max(r["step"] for r in rows if r["method"] == m) for m in looped), default=0)
    steps = range(done + 1, config.steps + 1 if looped else 1)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, total=config.steps, initial=done, desc="separability steps")
    for step in steps:
        if statistics:
            _statistics_step(run, masks, step, first_scores)
        if random_masks is not None:
            _random_step(run, random_masks, step)
        save()

    if config.selection != "statistics":
        from mi_core.methods.separability.learned import run_learned

        learned_done = max(r["step"] for r in rows if r["method"] == LEARNED)
        run_dir = None if state_path is None else state_path.parent / LEARNED_DIR

        def learned_step(step: int, learned: PruneMasks) -> None:
            nonlocal learned_masks
            learned_masks = learned
            run.step_row(LEARNED, step, learned)
            save()

        run_learned(model, focus, cripple, config, learned_done, run_dir, learned_step, progress)

    return SeparabilityResult(
        config=config,
        trajectory=pd.DataFrame(rows),
        masks=masks if statistics else (learned_masks or masks),
        random_masks=random_masks,
        first_scores=first_scores,
        focus_name=focus.name,
        cripple_name=cripple.name,
        learned_masks=learned_masks,
    )


#: The learned run's training state (a pruning run folder: checkpoint and log) under the
#: separability output directory.
LEARNED_DIR = "learned"


def _statistics_step(
    run: _Steps, masks: PruneMasks, step: int, first_scores: dict[str, torch.Tensor]
) -> None:
    """One step of the report's method: statistics of the model as pruned so far, scores,
    the top units removed, both data sets evaluated (``masks`` updated in place)."""
    config = run.config
    collected = run.statistics(masks, step)
    scores = neuron_scores(
        collected["focus"],
        collected["cripple"],
        config.ff_scoring,
        config.eps,
        attn_scoring=config.attn_scoring,
    )
    if step == 1:
        first_scores.update({k: v.float().cpu() for k, v in scores.items()})
    ff_sel, attn_sel, thresholds = _select(scores, masks, config, step)
    masks.prune(step, ff_sel, attn_sel, **config.mean_fills(collected["focus"]))
    run.step_row(config.statistics_method, step, masks, thresholds)


def _random_step(run: _Steps, random_masks: PruneMasks, step: int) -> None:
    """One step of the random baseline: as many units as the method removes, chosen by
    seeded random scores."""
    config = run.config
    shapes = {"mlp": random_masks.ff_step.shape, "attn": random_masks.attn_step.shape}
    rand = {
        site: random_scores(
            tuple(shape),
            seed=derive_seed("separability", "random", config.seed, step, site),
        )
        for site, shape in shapes.items()
    }
    focus_stats = None
    if "mean" in (config.ff_fill, config.attn_fill):
        focus_stats = collect_activation_stats(
            run.model,
            run.focus.stats,
            run.focus.stats_mask,
            batch_size=config.batch_size,
            sites=_sites(config, step + 1, run.moe),
            fwd_hooks=random_masks.hooks(run.model),
            correct_top_k=config.stats_correct_top_k,
        )
    if config.attn_unit == "head":
        rand["attn"] = rand["attn"][..., 0]
    r_ff, r_attn, _ = _select(rand, random_masks, config, step)
    random_masks.prune(step, r_ff, r_attn, **config.mean_fills(focus_stats))
    run.step_row(RANDOM, step, random_masks)
