"""The core before generalisation (the paper's section 4): is the final core there already?

The fine-tuning metrics say where the out-of-domain accuracy starts to rise from its trained
floor (:func:`~mi_core.analysis.generalisation.pre_generalisation_checkpoint`); the last saved
checkpoint before the rise is pruned at the sweep's sparsities and seeds, and the heads every
one of its subnetworks keeps (its core) are compared with the final model's core. Each
checkpoint is pruned in a folder of its own (``checkpoint-<step>/``: its means and its sweep),
so a rule or margin that picks another checkpoint starts afresh there and finished runs of the
same checkpoint are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from mi_core.analysis.generalisation import pre_generalisation_checkpoint
from mi_core.analysis.subnetworks import core_heads

if TYPE_CHECKING:
    from mi_core.pruning.sweeps import SweepResult

__all__ = ["pruned_core", "run_core_before"]


def pruned_core(sweep: SweepResult) -> tuple[list[str], int, int]:
    """``(core, n_subnetworks, n_left_out)``: the heads every subnetwork of ``sweep`` keeps,
    over the subnetworks that removed something. One that removed nothing (gates that never
    moved) holds every head trivially: it is left out, as the findings leave it out of
    agreement."""
    pruned = (sweep.runs["n_removed"].astype(int) > 0).tolist()
    masks = sweep.head_masks()  # in the order of sweep.runs
    kept = masks[torch.tensor(pruned, dtype=torch.bool)]
    core = core_heads(kept) if len(kept) else []
    return core, int(kept.shape[0]), int(masks.shape[0] - kept.shape[0])


def run_core_before(
    metrics: pd.DataFrame,
    checkpoints: Mapping[int, Path],
    ood_names: Sequence[str],
    final_core: Sequence[str],
    out: Path,
    *,
    margin: float,
    prune: Callable[[Path, Path], SweepResult],
    root: Path,
) -> dict[str, Any]:
    """The summary of the core before generalisation (see the module docstring).

    ``metrics``: the fine-tuning metrics (``step, dataset, accuracy``); ``checkpoints``: the
    saved checkpoints by step; ``ood_names``: the out-of-domain sets as the metrics name them;
    ``final_core``: the fine-tuned model's core. ``prune(checkpoint, folder)`` prunes the
    chosen checkpoint in ``folder`` (under ``out``) and returns its sweep; the summary names
    that folder relative to ``root`` (the report directory).
    """
    found = pre_generalisation_checkpoint(metrics, list(ood_names), sorted(checkpoints), margin)
    summary: dict[str, Any] = {**found, "ood_sets": list(ood_names)}
    summary["final_core"] = list(final_core)
    step = found["checkpoint_step"]
    if step is not None:
        where = out / f"checkpoint-{step}"
        core, n_subnetworks, n_left_out = pruned_core(prune(checkpoints[step], where))
        summary.update(
            core=core,
            n_subnetworks=n_subnetworks,
            n_left_out=n_left_out,
            run_folder=str(where.relative_to(root)),
            final_core_present=[h for h in summary["final_core"] if h in core],
        )
    return summary
