"""When does a fine-tuned model start to generalise out of domain? (The paper's section 4.)

The paper prunes "the checkpoint immediately before the model starts to generalize" and finds the
heuristic core already present in all of its subnetworks. :func:`pre_generalisation_checkpoint`
finds that checkpoint from the fine-tuning metrics: the out-of-domain accuracy (the mean over the
out-of-domain sets) *starts to rise* at the first evaluated step where it exceeds its value at
the first evaluation by more than ``margin`` (the paper's 3-point faithfulness margin, not a
value tuned here); the checkpoint wanted is the last saved one before that step.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from mi_core.errors import ConfigError


def pre_generalisation_checkpoint(
    metrics: pd.DataFrame,
    ood_sets: Sequence[str],
    saved_steps: Sequence[int],
    margin: float = 0.03,
) -> dict[str, float | int | None]:
    """``{"rise_step", "checkpoint_step", "ood_start", "ood_at_rise", "ood_at_checkpoint"}``.

    ``metrics``: columns ``step, dataset, accuracy`` (``mi-core finetune``'s ``metrics.csv``);
    ``saved_steps``: the steps with a checkpoint on disk. ``rise_step`` is None when the
    out-of-domain accuracy never rises (the model never leaves the heuristic regime);
    ``checkpoint_step`` is None when no checkpoint was saved before the rise.
    """
    missing = {"step", "dataset", "accuracy"} - set(metrics.columns)
    if missing:
        raise ConfigError(f"fine-tuning metrics lack columns {sorted(missing)}")
    ood = metrics[metrics["dataset"].isin(list(ood_sets))]
    if ood.empty:
        raise ConfigError(f"no fine-tuning metrics for the out-of-domain sets {list(ood_sets)}")
    curve = ood.groupby("step")["accuracy"].mean().sort_index()
    start = float(curve.iloc[0])
    rising = curve[curve > start + margin]
    out: dict[str, float | int | None] = {
        "rise_step": None,
        "checkpoint_step": None,
        "ood_start": start,
        "ood_at_rise": None,
        "ood_at_checkpoint": None,
    }
    if rising.empty:
        return out
    rise = int(rising.index[0])
    out.update(rise_step=rise, ood_at_rise=float(rising.iloc[0]))
    before = [s for s in saved_steps if s < rise]
    if before:
        step = max(before)
        out["checkpoint_step"] = step
        if step in curve.index:
            out["ood_at_checkpoint"] = float(curve.loc[step])
    return out
