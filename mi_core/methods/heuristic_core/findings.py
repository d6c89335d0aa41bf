"""Which of the paper's findings a heuristic-core run reproduces: one row per claim, with numbers.

Each claim of Bhaskar, Friedman and Chen (2024) is checked against the files of a finished run
by a fixed rule, written here before any run was looked at and never adjusted to a result:

=============================  ==========================================================
claim                          reproduced when
=============================  ==========================================================
agree in-domain                every subnetwork of the lowest sparsity is within 3 points
                               of the full model in-domain (the paper's faithfulness margin)
spread out-of-domain           the widest out-of-domain range across those of them within 3
                               points in-domain (at least two) exceeds their in-domain range
                               by at least 10 points
a core far above chance        some head is kept by every subnetwork and a Poisson count
                               with the paper's random-intersection mean reaches the core's
                               size with probability below 0.01
frequencies agree              Spearman's rho between two sparsities' head frequencies is
                               positive with p < 0.05
core heads are shallow         at least one core head attends mostly to tokens repeated
                               across the pair (the ``overlap`` attention class)
core ablation hurts OOD        ablating some core head lowers out-of-domain accuracy at
                               least 3 points more than in-domain accuracy
joint ablation superadditive   some joint ablation lowers an out-of-domain accuracy, by at
                               least 3 points more than the sum of its heads' single drops
                               (superadditivity >= 3, the margin of the single-head claim, and
                               a joint drop > 0: ablations that all raise accuracy against a
                               ceiling are not superadditive harm); the row names the set and
                               gives the mean over every out-of-domain set beside it
effective size rises           out-of-domain effective size correlates positively with the
                               full model's out-of-domain accuracy over checkpoints
core before generalisation     every head of the final core is in every subnetwork of the
                               checkpoint before out-of-domain accuracy starts to rise
=============================  ==========================================================

A claim that the run cannot test says so and why: e.g. an out-of-domain drop cannot be measured
when the full model's out-of-domain accuracy is already near 0 (it never left the heuristic
regime), subnetworks cannot agree or spread, nor can ablations hurt, when the full model is
within 3 points of chance in-domain (1 / the task's labels; there is no behaviour to keep),
and effective size needs the ``effective_size`` stage.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pandas as pd

from mi_core.errors import MiCoreError
from mi_core.methods.heuristic_core.comparison import SubnetworkComparison
from mi_core.methods.heuristic_core.effective_size import dataset_name
from mi_core.methods.heuristic_core.results import ExperimentTables
from mi_core.tasks import TASK_NUM_LABELS

#: Verdicts a finding can get.
REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE = "reproduced", "not reproduced", "not measurable here"
#: Below this out-of-domain accuracy of the full model, a drop cannot be measured.
HEURISTIC_REGIME = 0.05
#: The columns of :func:`heuristic_core_findings`.
COLUMNS = ("finding", "paper", "this run", "verdict")


def _num(value: Any) -> float:
    """A float from a CSV cell (empty or unparsable: NaN)."""
    return float(pd.to_numeric(value, errors="coerce"))


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _row(finding: str, paper: str, this_run: str, verdict: str) -> dict[str, str]:
    return {"finding": finding, "paper": paper, "this run": this_run, "verdict": verdict}


def _names(runs: pd.DataFrame) -> list[str]:
    return [c[len("acc_") :] for c in runs.columns if c.startswith("acc_")]


def _subnetwork_findings(
    runs: pd.DataFrame, in_domain: list[str] | None = None, chance: float | None = None
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """``in_domain``: the in-domain sets (their accuracy is averaged, as the authors average
    MNLI matched and mismatched); default: the first evaluation set. ``chance``: the task's
    chance accuracy (1 / labels), when known."""
    names = _names(runs)
    ids = [n for n in (in_domain or []) if n in names] or names[:1]
    ood = [n for n in names if n not in ids]
    full = {n: float(runs[f"full_acc_{n}"].iloc[0]) for n in names}
    full_id = sum(full[n] for n in ids) / len(ids)
    at_lowest = runs[runs["sparsity"] == runs["sparsity"].min()]
    sparsity = float(at_lowest["sparsity"].iloc[0])
    # a run whose gates never left the full model removed nothing: it is the full model, and
    # would "agree" with it trivially
    pruned = at_lowest["n_removed"].astype(float) > 0 if "n_removed" in at_lowest else None
    lowest = at_lowest if pruned is None else at_lowest[pruned]
    unpruned = len(at_lowest) - len(lowest)
    left_out = (
        f"; {unpruned} of {len(at_lowest)} runs at {sparsity:.0%} removed nothing (their gates "
        "did not converge) and are left out"
        if unpruned
        else ""
    )
    id_acc = lowest[[f"acc_{n}" for n in ids]].astype(float).mean(axis=1)
    gaps = full_id - id_acc
    faithful = gaps <= 0.03 + 1e-12
    within = int(faithful.sum())
    at_chance = chance is not None and full_id < chance + 0.03
    why_chance = (
        f"; the full model is within 3 points of chance in-domain, or below it "
        f"({_pct(full_id)}, chance {_pct(chance or 0.0)}): there is no behaviour to agree on"
    )
    if len(lowest) < 2 or at_chance:
        verdict = NOT_MEASURABLE
    else:
        verdict = REPRODUCED if within == len(lowest) else NOT_REPRODUCED
    rows = [
        _row(
            "Subnetworks agree in-domain",
            "all 12 subnetworks at 50 % within 2-3 points of the full model (MNLI 83.3 -> 81.3 "
            "mean)",
            f"{within} of {len(lowest)} subnetworks at {sparsity:.0%} within 3 points"
            + (
                f" (full {_pct(full_id)}, largest gap {100 * float(gaps.max()):.1f} points)"
                if len(lowest)
                else ""
            )
            + left_out
            + ("; need 2 pruned subnetworks" if len(lowest) < 2 else "")
            + (why_chance if at_chance else ""),
            verdict,
        )
    ]
    context = {"full": full, "in_domain": ids, "ood": ood,
               "at_chance": why_chance[2:] if at_chance else None}  # fmt: skip
    if not ood:
        rows.append(
            _row(
                "Subnetworks spread out-of-domain",
                "Embed-If from 4.1 % to 50.2 % across 50 % subnetworks",
                "no out-of-domain set was evaluated",
                NOT_MEASURABLE,
            )
        )
        return rows, context
    spread = "Subnetworks spread out-of-domain"
    paper = "Embed-If from 4.1 % to 50.2 % across 50 % subnetworks (in-domain within ~1 point)"
    if at_chance:
        rows.append(_row(spread, paper, why_chance[2:], NOT_MEASURABLE))
        return rows, context
    agreeing = lowest[faithful.to_numpy()]
    if len(agreeing) < 2:
        text = f"{within} of {len(lowest)} subnetworks at {sparsity:.0%} agree in-domain (need 2)"
        rows.append(_row(spread, paper, text, NOT_MEASURABLE))
        return rows, context
    id_range = float(id_acc[faithful].max() - id_acc[faithful].min())
    ranges = {n: float(agreeing[f"acc_{n}"].max() - agreeing[f"acc_{n}"].min()) for n in ood}
    widest = max(ranges, key=ranges.get)
    rows.append(
        _row(
            spread,
            paper,
            f"{widest}: range {100 * ranges[widest]:.1f} points across the {len(agreeing)} "
            f"subnetworks at {sparsity:.0%} within 3 points in-domain; their in-domain range "
            f"{100 * id_range:.1f} points",
            REPRODUCED if ranges[widest] - id_range >= 0.10 else NOT_REPRODUCED,
        )
    )
    return rows, context


def _core_findings(comparison: SubnetworkComparison | None) -> list[dict[str, str]]:
    from scipy.stats import poisson

    rows: list[dict[str, str]] = []
    if comparison is None:
        return rows
    summary = comparison.core_table
    if len(summary):
        all_row = summary[summary["group"].astype(str) == "all"].iloc[0]
        n_core = int(all_row["n_core"])
        # chance from the heads the subnetworks really keep and from the paper's m/n = 1 - target,
        # whichever is larger: subnetworks that kept more heads than the target implies (MLPs
        # count towards the sparsity, or the gates did not converge) share more by chance
        expected = max(
            _num(all_row["expected_random_intersection"]),
            _num(all_row.get("expected_random_intersection_paper", 0.0)),
        )
        tail = float(poisson.sf(n_core - 1, expected)) if n_core > 0 else 1.0
        rows.append(
            _row(
                "A core of heads kept by every subnetwork, far above chance",
                "9 heads in all 24 BERT MNLI subnetworks; 7.7e-5 expected for random ones",
                f"{n_core} heads in all {int(all_row['n_subnetworks'])} subnetworks; "
                f"{expected:.2g} expected at random (P = {tail:.2g})",
                REPRODUCED if n_core > 0 and tail < 0.01 else NOT_REPRODUCED,
            )
        )
    spearman = comparison.spearman
    if len(spearman):
        first = spearman.iloc[0]
        rho, p = _num(first["spearman_rho"]), _num(first["p_value"])
        pair = f"{_num(first['sparsity_a']):g} vs {_num(first['sparsity_b']):g}"
        if math.isnan(rho):
            text, verdict = f"{pair}: a frequency map is constant, rho undefined", NOT_MEASURABLE
        else:
            text = f"rho {rho:.2f} (p = {p:.2g}), {pair}"
            verdict = REPRODUCED if rho > 0 and p < 0.05 else NOT_REPRODUCED
        rows.append(
            _row(
                "Head frequencies agree between sparsities",
                "Spearman rho 0.82 (MNLI 50 % vs 70 %; QQP 0.74)",
                text,
                verdict,
            )
        )
    return rows


def _attention_finding(table: pd.DataFrame | None) -> dict[str, str] | None:
    if table is None:
        return None
    paper = "4 of the 9 core heads attend to tokens repeated across premise and hypothesis"
    if len(table) and str(table["chosen_as"].iloc[0]) == "most frequent":
        return _row(
            "Core heads compute shallow features",
            paper,
            "no head is kept by every subnetwork, so there is no core to classify",
            NOT_MEASURABLE,
        )
    classes = table["pattern_class"].astype(str)
    overlap = int((classes == "overlap").sum())
    counts = ", ".join(f"{k} {v}" for k, v in classes.value_counts().items())
    return _row(
        "Core heads compute shallow features",
        paper,
        f"{overlap} of {len(table)} core heads are overlap heads (classes: {counts})",
        REPRODUCED if overlap > 0 else NOT_REPRODUCED,
    )


def _ablation_findings(table: pd.DataFrame | None, context: dict[str, Any]) -> list[dict[str, str]]:
    if table is None or not context.get("ood"):
        return []
    ids, ood, full = context["in_domain"], context["ood"], context["full"]
    ood_cols = [n for n in ood if n in table.columns]
    if any(n not in table.columns for n in ids) or not ood_cols:
        return []
    full_ood = sum(full[n] for n in ood_cols) / len(ood_cols)
    regime = full_ood < HEURISTIC_REGIME or context.get("at_chance") is not None
    why = context.get("at_chance") or (
        f"the full model never leaves the heuristic regime (out-of-domain {_pct(full_ood)}): "
        "there is no out-of-domain accuracy to lose"
    )
    singles = table[table["kind"] == "single"]
    rows = []
    if len(singles):
        id_drop = -sum(singles[f"{n} change"].astype(float) for n in ids) / len(ids)
        ood_drop = -sum(singles[f"{n} change"].astype(float) for n in ood_cols) / len(ood_cols)
        excess = ood_drop - id_drop
        best = int(excess.idxmax())
        text = (
            f"{singles.loc[best, 'ablated']}: out-of-domain {-ood_drop[best]:+.1f}, in-domain "
            f"{-id_drop[best]:+.1f} points"
        )
        rows.append(
            _row(
                "Ablating a core head hurts out-of-domain more than in-domain",
                "L4.H0: SO-Swap -41.3, Prep -31.7 points; MNLI -0.4",
                text if not regime else f"{text}; {why}",
                NOT_MEASURABLE
                if regime
                else (REPRODUCED if float(excess[best]) >= 3 else NOT_REPRODUCED),
            )
        )
    sup = table[table["kind"] == "superadditivity"]
    if len(sup):
        joints = table[table["kind"] == "joint"].set_index("ablated")
        candidates = []  # (superadditivity, joint drop, head set, data set)
        for _, row in sup.iterrows():
            name = str(row["ablated"]).removeprefix("Superadditivity ")
            for n in ood_cols:
                joint = joints[f"{n} change"].get(name, math.nan) if len(joints) else math.nan
                candidates.append((float(row[n]), -float(joint), name, n))
        # the claim: a joint ablation that hurts, by more than its singles together, by at least
        # the 3-point margin the single-head finding uses (the paper's faithfulness margin); on
        # the set where it is largest (the paper's example is SO-Swap), with the mean over every
        # out-of-domain set beside it, so a best-of-many pick is visible as one
        best = max(candidates, key=lambda c: (c[0] >= 3 and c[1] > 0, c[0]))
        value, drop, name, data = best
        harms = value >= 3 and drop > 0
        mean = sum(c[0] for c in candidates if c[2] == name) / len(ood_cols)
        text = (
            f"{name} on {data}: superadditivity {value:+.1f} points, joint change "
            f"{-drop:+.1f} points"
            + ("" if drop > 0 else " (the joint ablation does not hurt)")
            + f"; mean superadditivity over the {len(ood_cols)} out-of-domain sets {mean:+.1f}"
        )
        rows.append(
            _row(
                "Joint ablation of core heads is superadditive",
                "L2.H5+L3.H7+L4.H0 together: SO-Swap 3.6 % (from 86.7 %), far below the singles",
                text + (f"; {why}" if regime else ""),
                NOT_MEASURABLE if regime else (REPRODUCED if harms else NOT_REPRODUCED),
            )
        )
    return rows


def _effective_size_finding(
    sizes: pd.DataFrame | None,
    full: pd.DataFrame | None,
    in_domain: list[str] | None = None,
    ood_sets: list[str] | None = None,
) -> dict[str, str]:
    """``ood_sets``: the sets the stage averaged into its out-of-domain target, by
    ``full_accuracy.csv``'s names; without them, every set but the ``in_domain`` ones (default:
    the first)."""
    paper = "out-of-domain effective size rises from 30 % to ~93 % as the model generalises"
    name = "Effective size rises with generalisation"
    if sizes is None or full is None:
        return _row(name, paper, "the effective_size stage was not run", NOT_MEASURABLE)
    ood = sizes[sizes["target"] == "ood"].sort_values("step")
    if len(ood) < 3:
        return _row(name, paper, f"{len(ood)} checkpoints (need 3)", NOT_MEASURABLE)
    from scipy.stats import spearmanr

    names = list(dict.fromkeys(full["dataset"]))
    ids = [n for n in (in_domain or []) if n in names] or names[:1]
    sets = [n for n in (ood_sets or []) if n in names] or [n for n in names if n not in ids]
    if not sets:
        return _row(name, paper, "no out-of-domain set was evaluated", NOT_MEASURABLE)
    acc = full[full["dataset"].isin(sets)].groupby("step")["accuracy"].mean()
    acc = acc.reindex(ood["step"]).to_numpy()
    if math.isclose(float(acc.max()), float(acc.min())):
        return _row(name, paper, "out-of-domain accuracy never changes", NOT_MEASURABLE)
    rho = float(spearmanr(acc, ood["effective_size"].to_numpy()).statistic)
    text = (
        f"out-of-domain effective size {ood['effective_size'].iloc[0]:.0f} % -> "
        f"{ood['effective_size'].iloc[-1]:.0f} %; Spearman with out-of-domain accuracy {rho:.2f}"
    )
    if float(max(acc)) < HEURISTIC_REGIME:
        return _row(name, paper, f"{text}; the model never generalises", NOT_MEASURABLE)
    return _row(name, paper, text, REPRODUCED if rho > 0 else NOT_REPRODUCED)


def _core_before_finding(info: dict[str, Any] | None) -> dict[str, str]:
    name = "The core is there before the model generalises"
    paper = "the 9 core heads are in all subnetworks of the checkpoint before generalisation"
    if info is None:
        return _row(name, paper, "the core_before stage was not run", NOT_MEASURABLE)
    if info.get("rise_step") is None:
        return _row(
            name,
            paper,
            f"out-of-domain accuracy never rises (from its floor "
            f"{_pct(info.get('ood_floor', info.get('ood_start')))}): the model "
            "never generalises",
            NOT_MEASURABLE,
        )
    if info.get("checkpoint_step") is None:
        return _row(name, paper, "no checkpoint saved before the rise", NOT_MEASURABLE)
    final, present = info["final_core"], info["final_core_present"]
    if not final:
        return _row(name, paper, "the final model has no core", NOT_MEASURABLE)
    if info.get("n_subnetworks") == 0:
        return _row(
            name,
            paper,
            f"none of checkpoint {info['checkpoint_step']}'s subnetworks removed anything",
            NOT_MEASURABLE,
        )
    return _row(
        name,
        paper,
        f"{len(present)} of the {len(final)} final core heads in all subnetworks of checkpoint "
        f"{info['checkpoint_step']} (rise at step {info['rise_step']})",
        REPRODUCED if len(present) == len(final) else NOT_REPRODUCED,
    )


def _in_domain_names(config: dict[str, Any] | None, known: list[str]) -> list[str] | None:
    """The in-domain sets of the experiment (its config's ``data.in_domain``), by the names the
    result tables use (``known``); None when the experiment does not say."""
    if config is None:
        return None
    specs = config.get("data", {}).get("in_domain")
    if not specs:
        return None
    try:
        return [dataset_name(spec, known, task=config.get("task")) for spec in specs]
    except MiCoreError:  # a data set no longer at hand: fall back to the first set
        return None


def _ood_names(config: dict[str, Any] | None, known: list[str]) -> list[str] | None:
    """The sets the effective-size stage averaged into its out-of-domain target (its ``ood``,
    else the out-of-domain eval sets outside its ``groups``), by the names the tables use."""
    if config is None:
        return None
    es, data = config.get("effective_size") or {}, config.get("data") or {}
    specs = es.get("ood")
    if not specs:
        evals = list(data.get("eval") or [])
        in_domain = list(data.get("in_domain") or evals[:1])
        grouped = {d for sets in (es.get("groups") or {}).values() for d in sets}
        specs = [d for d in evals if d not in in_domain and d not in grouped]
    try:
        return [dataset_name(spec, known, task=config.get("task")) for spec in specs]
    except MiCoreError:  # a data set no longer at hand
        return None


def heuristic_core_findings(results: str | os.PathLike[str] | ExperimentTables) -> pd.DataFrame:
    """The findings table of a run (its report directory, or its tables already read; columns
    :data:`COLUMNS`; empty without a finished analysis)."""
    if not isinstance(results, ExperimentTables):
        results = ExperimentTables.load(results)
    runs = results.runs
    if runs is None or runs.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    task = (results.config or {}).get("task")
    chance = 1.0 / TASK_NUM_LABELS[task] if task in TASK_NUM_LABELS else None
    rows, context = _subnetwork_findings(
        runs, _in_domain_names(results.config, _names(runs)), chance
    )
    rows += _core_findings(results.comparison)
    attention = _attention_finding(results.attention_classes)
    if attention is not None:
        rows.append(attention)
    rows += _ablation_findings(results.ablation, context)
    full = results.full_accuracy
    full_ids = (
        None
        if full is None
        else _in_domain_names(results.config, list(dict.fromkeys(full["dataset"])))
    )
    full_ood = (
        None if full is None else _ood_names(results.config, list(dict.fromkeys(full["dataset"])))
    )
    rows.append(_effective_size_finding(results.effective_size, full, full_ids, full_ood))
    rows.append(_core_before_finding(results.core_before))
    return pd.DataFrame(rows, columns=list(COLUMNS))
