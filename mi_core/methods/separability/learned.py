"""Learned separability: neuron masks trained to keep one text and lose another.

The report removes the neurons whose activation statistics say the cripple text uses them more
than the focus text; the heuristic-core method learns masks. This puts the two together: one
hard-concrete gate per MLP neuron and per attention pre-out neuron (the report's units,
:data:`~mi_core.pruning.mask_kinds.NEURONS`), trained by the one pruning loop against the
``separate`` objective (:class:`~mi_core.pruning.objectives.Separate`: the KL to the full model
at every position of the focus text, plus a cripple term on the cripple text) on both texts'
statistics windows, the units removed zero- or mean-filled as the report's run fills them.

The trajectory is the report's: at trajectory step ``k`` the masks are trained on from where
step ``k - 1`` left them, ``learn_steps`` optimizer steps toward the sparsity at which as many
units are removed as the statistics method removes by step ``k`` (MLP and pre-out neurons
together: the masks choose the split), then made binary by removing exactly that many units,
those with the lowest ``log_alpha``, and both held-out sets are evaluated. The training
checkpoints at the end of every trajectory step into its own run folder, so a killed run
resumes to the bit-identical result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from transformer_lens import HookedTransformer

from mi_core.data.batches import TokenizedFocusCripple
from mi_core.errors import ConfigError
from mi_core.interventions.neurons import NeuronGates, PruneMasks
from mi_core.methods.separability.config import SeparabilityConfig
from mi_core.methods.separability.tokens import TaskTokens
from mi_core.pruning.loop import start_run, train_group
from mi_core.pruning.mask_kinds import NEURONS
from mi_core.pruning.objectives import Separate
from mi_core.pruning.profiles import PruneConfig, make_prune_config
from mi_core.statistics.activations import collect_activation_stats
from mi_core.statistics.scoring import n_to_prune_at

__all__ = ["learned_prune_config", "learned_unit_counts", "run_learned"]

logger = logging.getLogger(__name__)


def learned_unit_counts(config: SeparabilityConfig, n_ff: int, n_attn: int) -> list[int]:
    """The units (MLP and pre-out neurons together) the statistics method has removed after
    each of ``config.steps`` steps, by its schedule: the learned run removes as many."""
    ff_left, attn_left, out = n_ff, n_attn, []
    for step in range(1, config.steps + 1):
        ff_left -= n_to_prune_at(step, n_ff, ff_left, config.ff_frac, config.schedule)
        attn_left -= n_to_prune_at(step, n_attn, attn_left, config.attn_frac, config.schedule)
        out.append(n_ff + n_attn - ff_left - attn_left)
    return out


def learned_prune_config(config: SeparabilityConfig, target: float, steps: int) -> PruneConfig:
    """The pruning run behind the learned masks, at ``target`` until optimizer step ``steps``:
    CoFi's mechanics (expected-L0 sparsity, a constant learning rate, no clipping, the exact
    discretisation), the separability config's batch, window, seed and learning rate; no
    dropout (the report's model runs in eval mode)."""
    return make_prune_config(
        "cofi",
        min(max(target, 1e-6), 1.0 - 1e-6),
        config.seed,
        steps=steps,
        warmup_steps=0,
        lr_warmup_steps=0,
        batch_size=config.batch_size,
        grad_accumulation=1,
        lr_log_alpha=config.learn_lr,
        lr_lambda=1.0,
        max_length=config.window,
        eval_every=0,
        checkpoint_every=config.learn_steps,
        eval_batch_size=config.batch_size,
        dropout=False,
        objective=Separate.name,
    )


def _windows(task: TaskTokens) -> list[list[int]]:
    """A data set's statistics windows as token lists (padding dropped)."""
    if task.stats_mask is None:
        return task.stats.tolist()
    return [row[keep].tolist() for row, keep in zip(task.stats, task.stats_mask, strict=True)]


def _fills(
    model: HookedTransformer, focus: TaskTokens, config: SeparabilityConfig
) -> PruneMasks | None:
    """What replaces a removed unit: its mean on the focus text (measured once, on the full
    model) where the config fills by the mean; None: zero."""
    if "mean" not in (config.ff_fill, config.attn_fill):
        return None
    stats = collect_activation_stats(
        model, focus.stats, focus.stats_mask, batch_size=config.batch_size
    )
    fills = PruneMasks.empty(model)
    for name, values in config.mean_fills(stats).items():
        setattr(fills, name, values.cpu())
    return fills


def binary_neuron_masks(
    log_alpha: torch.Tensor, n_removed: int, gates: NeuronGates, step: int
) -> PruneMasks:
    """The ``n_removed`` units with the lowest ``log_alpha`` removed at ``step`` (ties by
    position), as :class:`PruneMasks` with ``gates``' fills."""
    keep = torch.ones(log_alpha.numel(), dtype=torch.bool)
    if n_removed > 0:
        order = torch.argsort(log_alpha.detach().cpu().float(), stable=True)
        keep[order[:n_removed]] = False
    return gates.removed(keep, step)


def run_learned(
    model: HookedTransformer,
    focus: TaskTokens,
    cripple: TaskTokens,
    config: SeparabilityConfig,
    done: int,
    run_dir: Path | None,
    on_step: Callable[[int, PruneMasks], None],
    progress: bool = False,
) -> None:
    """Train the learned masks through trajectory steps ``done + 1`` to ``config.steps``
    (module docstring), calling ``on_step(step, masks)`` with each step's binary masks.
    ``run_dir``: the training's checkpoint folder (None: none is written)."""
    if config.svd:
        logger.info("learned masks gate the OV-SVD basis's pre-out neurons")
    fills = _fills(model, focus, config)
    tokenized = TokenizedFocusCripple.join(
        _windows(focus),
        _windows(cripple),
        getattr(model.tokenizer, "pad_token_id", None) or 0,  # windows are unpadded
        name=f"{focus.name} / {cripple.name}",
    )
    gates = NEURONS.blank(model, torch.device("cpu"), fills)
    objective = Separate(config.cripple_term, config.cripple_cap, config.cripple_weight)
    n_ff, n_attn = gates.ff_fill.numel(), gates.attn_fill.numel()
    counts = learned_unit_counts(config, n_ff, n_attn)
    total = n_ff + n_attn
    first = learned_prune_config(config, counts[0] / total, config.learn_steps)
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
    state = start_run(model, tokenized, first, run_dir, None, kind=NEURONS, objective=objective,
                      fills=fills)  # fmt: skip
    for step in range(done + 1, config.steps + 1):
        end = step * config.learn_steps
        if state.start > end:
            raise ConfigError(
                f"{run_dir}: the learned masks' checkpoint is at optimizer step {state.start}, "
                f"past trajectory step {step}'s {end}; remove the folder to train them again"
            )
        state.cfg = learned_prune_config(config, counts[step - 1] / total, end)
        if state.start < end:
            train_group(model, None, tokenized, None, [state], progress)
            if state.error is not None:
                raise state.error
            state.start = end
        on_step(step, binary_neuron_masks(state.gates.log_alpha, counts[step - 1], gates, step))
