"""When does a fine-tuned model start to generalise out of domain? (The paper's section 4.)

The paper prunes "the checkpoint immediately before the model starts to generalize" and finds the
heuristic core already present in all of its subnetworks. :func:`pre_generalisation_checkpoint`
finds that checkpoint from the fine-tuning metrics: the out-of-domain accuracy (the mean over the
out-of-domain sets) *starts to rise* at the first evaluated step where it exceeds its *floor* --
the lowest value of the trained model at the evaluations before it -- by more than ``margin``
(the paper's 3-point faithfulness margin, not a value tuned here); the checkpoint wanted is the
last saved one before that step.

The evaluation at step 0 (the pre-trained body with an untrained classifier head) is not part of
the curve: a random head that answers mostly "non-entailment" already scores high on HANS, whose
subcases are all non-entailment, and the fine-tuned model first falls from there into the
heuristic regime (the paper's Figure 6 and the authors' checkpoint evaluation start at step 500,
the first saved checkpoint). Measured from that value, a model that generalises late would never
rise above it. The floor is taken over what came before each step, so a dip before the rise is
measured from its bottom.
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
    """``{"rise_step", "checkpoint_step", "ood_floor", "ood_at_rise", "ood_at_checkpoint",
    "ood_untrained"}``.

    ``metrics``: columns ``step, dataset, accuracy`` (``mi-core finetune``'s ``metrics.csv``);
    ``saved_steps``: the steps with a checkpoint on disk. ``rise_step`` is None when the
    out-of-domain accuracy never rises (the model never leaves the heuristic regime);
    ``checkpoint_step`` is None when no checkpoint was saved before the rise. ``ood_floor`` is
    the floor the rise was measured from (the lowest trained value before it; the lowest of
    all when it never rises); ``ood_untrained`` the step-0 value, reported, not used.
    """
    missing = {"step", "dataset", "accuracy"} - set(metrics.columns)
    if missing:
        raise ConfigError(f"fine-tuning metrics lack columns {sorted(missing)}")
    ood = metrics[metrics["dataset"].isin(list(ood_sets))]
    if ood.empty:
        raise ConfigError(f"no fine-tuning metrics for the out-of-domain sets {list(ood_sets)}")
    full_curve = ood.groupby("step")["accuracy"].mean().sort_index()
    untrained = float(full_curve.loc[0]) if 0 in full_curve.index else None
    curve = full_curve[full_curve.index > 0]
    out: dict[str, float | int | None] = {
        "rise_step": None,
        "checkpoint_step": None,
        "ood_floor": float(curve.min()) if len(curve) else None,
        "ood_at_rise": None,
        "ood_at_checkpoint": None,
        "ood_untrained": untrained,
    }
    # the lowest trained value before each step (the first trained evaluation has none)
    floor = curve.cummin().shift(1)
    rising = curve[curve > floor + margin]
    if rising.empty:
        return out
    rise = int(rising.index[0])
    out.update(rise_step=rise, ood_at_rise=float(rising.iloc[0]), ood_floor=float(floor.loc[rise]))
    before = [s for s in saved_steps if s < rise]
    if before:
        step = max(before)
        out["checkpoint_step"] = step
        if step in curve.index:
            out["ood_at_checkpoint"] = float(curve.loc[step])
    return out
