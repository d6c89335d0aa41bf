"""Effective size: how large must a subnetwork be to stay faithful to the full model?

Input is a tidy table with one row per pruned subnetwork and evaluation dataset::

    checkpoint (or step) | sparsity | seed | dataset | accuracy

and the full (unpruned) model's accuracy per (checkpoint, dataset). For each checkpoint and each
evaluation target D we compute the largest faithful sparsity and
``effective_size = 100 - 100 * sparsity`` (percent of prunable components kept).

Targets D (the caller names which datasets are which):

- ``id``: mean accuracy over the in-domain datasets (usually one);
- ``ood``: mean accuracy over the out-of-domain datasets (several are averaged equally);
- ``mixed``: the equally weighted mix, ``(id + ood) / 2``;
- any further named group of datasets (``groups``, e.g. GPT-2's ``ood_e``: the entailment
  subcases of Figure 16): the mean over its datasets, a target of its own and part of neither
  ``id``, ``ood`` nor ``mixed``.

Rules (the paper: "within 3 %"; "prune to multiples of 5 % and pick the highest one that yields a
faithful subnetwork"):

- accuracies are first averaged over seeds per (checkpoint, sparsity, dataset), then combined
  over datasets as above; the full model's accuracy is combined the same way;
- *faithful* is one-sided: ``mean accuracy >= full accuracy - margin`` (a subnetwork that beats
  the full model is faithful). ``margin`` is in the accuracy's own units (0.03 for fractions,
  3 for percent);
- the effective sparsity is the **largest faithful sparsity**, with no monotonicity requirement
  (a lower sparsity that happens to fall outside the margin does not disqualify a higher one);
- if no sparsity is faithful, the effective size is 100 (only the full model is faithful).

That is the paper's text (:data:`METHODS` ``"paper"``). The authors' script
(``mnli-effective-size.py`` in princeton-nlp/Heuristic-Core) computes it differently, and
``method="authors"`` (the default) follows it:

- *per seed*: each seed's accuracies are combined over datasets (``mixed`` is the plain mean over
  *all* the datasets, in-domain and out-of-domain alike, as the script averages its six cases);
- faithful is strict: ``accuracy > full accuracy - margin``, in exact arithmetic: an accuracy
  exactly ``margin`` below the full model's is not faithful (the script's raw float comparison
  calls some of those faithful by rounding, e.g. ``0.80 > 0.83 - 0.03``; mi_core does not copy
  that accident);
- each seed gets its own largest faithful sparsity (0 when none: effective size 100), and the
  effective size is the mean of the seeds' effective sizes (``effective_size_std`` their spread).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from mi_core.errors import ConfigError

__all__ = ["METHODS", "TARGETS", "faithfulness_table", "effective_size"]

#: Which accuracy a subnetwork must keep to count as faithful: in-domain, out-of-domain,
#: or both (mixed).
TARGETS: tuple[str, ...] = ("id", "ood", "mixed")
#: ``"authors"``: their script (per seed, strict, then mean); ``"paper"``: the paper's text.
METHODS: tuple[str, ...] = ("authors", "paper")
_TOL = 1e-12


def _checkpoint_col(frame: pd.DataFrame, checkpoint_col: str | None) -> str:
    if checkpoint_col is not None:
        if checkpoint_col not in frame.columns:
            raise ConfigError(f"column {checkpoint_col!r} missing; have {list(frame.columns)}")
        return checkpoint_col
    for name in ("checkpoint", "step"):
        if name in frame.columns:
            return name
    raise ConfigError(f"need a 'checkpoint' or 'step' column; have {list(frame.columns)}")


def _full_frame(full_accuracy: Any, ckpt: str) -> pd.DataFrame:
    """Normalise the full model's accuracies to columns (ckpt, dataset, accuracy)."""
    if isinstance(full_accuracy, pd.DataFrame):
        frame = full_accuracy
        col = ckpt if ckpt in frame.columns else _checkpoint_col(frame, None)
        missing = {"dataset", "accuracy"} - set(frame.columns)
        if missing:
            raise ConfigError(f"full-model table lacks columns {sorted(missing)}")
        return frame.rename(columns={col: ckpt})[[ckpt, "dataset", "accuracy"]]
    if isinstance(full_accuracy, Mapping):
        rows = []
        for key, value in full_accuracy.items():
            if isinstance(value, Mapping):  # {checkpoint: {dataset: acc}}
                rows += [(key, d, float(a)) for d, a in value.items()]
            elif isinstance(key, tuple) and len(key) == 2:  # {(checkpoint, dataset): acc}
                rows.append((key[0], key[1], float(value)))
            else:
                raise ConfigError(
                    "full-model accuracy must be a DataFrame, {(checkpoint, dataset): acc} or "
                    "{checkpoint: {dataset: acc}}"
                )
        return pd.DataFrame(rows, columns=[ckpt, "dataset", "accuracy"])
    raise ConfigError("full-model accuracy must be a DataFrame or a mapping")


def _combine(
    per_dataset: pd.DataFrame,
    keys: list[str],
    id_sets: list[str],
    ood_sets: list[str],
    mixed_over_all: bool = False,
    groups: Mapping[str, Sequence[str]] | None = None,
):
    """Per key group: id = mean over id_sets, ood = mean over ood_sets, mixed = their mean (or
    the mean over every dataset with ``mixed_over_all``). Groups that lack one of the datasets
    get NaN for the affected targets."""
    wide = per_dataset.pivot_table(index=keys, columns="dataset", values="accuracy")
    grouped = [d for sets in (groups or {}).values() for d in sets]
    for name in id_sets + ood_sets + grouped:
        if name not in wide.columns:
            wide[name] = np.nan
    out = pd.DataFrame(index=wide.index)
    out["id"] = wide[id_sets].mean(axis=1, skipna=False)
    out["ood"] = wide[ood_sets].mean(axis=1, skipna=False)
    if mixed_over_all:
        out["mixed"] = wide[id_sets + ood_sets].mean(axis=1, skipna=False)
    else:
        out["mixed"] = (out["id"] + out["ood"]) / 2
    for name, sets in (groups or {}).items():
        out[name] = wide[list(sets)].mean(axis=1, skipna=False)
    return out


def _targets(groups: Mapping[str, Sequence[str]] | None) -> tuple[str, ...]:
    extra = tuple(groups or {})
    clash = sorted(set(extra) & set(TARGETS))
    if clash:
        raise ConfigError(f"group names {clash} clash with the targets {list(TARGETS)}")
    return TARGETS + extra


def _check_results(
    results: pd.DataFrame,
    id_datasets: str | Sequence[str],
    ood_datasets: str | Sequence[str],
    checkpoint_col: str | None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[str], list[str], str]:
    """The in-domain and out-of-domain set lists and the checkpoint column, checked."""
    id_sets = [id_datasets] if isinstance(id_datasets, str) else list(id_datasets)
    ood_sets = [ood_datasets] if isinstance(ood_datasets, str) else list(ood_datasets)
    if not id_sets or not ood_sets:
        raise ConfigError("name at least one in-domain and one out-of-domain dataset")
    ckpt = _checkpoint_col(results, checkpoint_col)
    missing = {"sparsity", "seed", "dataset", "accuracy"} - set(results.columns)
    if missing:
        raise ConfigError(f"results table lacks columns {sorted(missing)}")
    grouped = [d for sets in (groups or {}).values() for d in sets]
    unknown = set(id_sets + ood_sets + grouped) - set(results["dataset"])
    if unknown:
        raise ConfigError(f"datasets {sorted(unknown)} do not occur in the results table")
    return id_sets, ood_sets, ckpt


def faithfulness_table(
    results: pd.DataFrame,
    full_accuracy: Any,
    *,
    id_datasets: str | Sequence[str],
    ood_datasets: str | Sequence[str],
    margin: float = 0.03,
    checkpoint_col: str | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    method: str = "authors",
) -> pd.DataFrame:
    """One row per (checkpoint, target, sparsity): ``accuracy`` (mean over seeds, combined over
    the target's datasets), ``accuracy_std`` (std over seeds of the per-seed combined accuracy),
    ``n_seeds``, ``full_accuracy``, ``faithful`` and ``faithful_seeds``. See the module
    docstring for the rules of each ``method``: with ``"paper"`` ``faithful`` judges the mean
    over seeds; with ``"authors"`` (what :func:`effective_size` computes by default) ``mixed``
    is the mean over every dataset, each seed is judged strictly, and ``faithful`` is True when
    every seed is (``faithful_seeds`` counts them; each seed's largest faithful sparsity is what
    the authors' effective size averages)."""
    if method not in METHODS:
        raise ConfigError(f"effective-size method must be one of {METHODS}, got {method!r}")
    authors = method == "authors"
    id_sets, ood_sets, ckpt = _check_results(
        results, id_datasets, ood_datasets, checkpoint_col, groups
    )
    targets = _targets(groups)

    # Mean over seeds per dataset first (robust to a seed missing one dataset), then combine.
    seed_mean = results.groupby([ckpt, "sparsity", "dataset"], as_index=False)["accuracy"].mean()
    combined = _combine(seed_mean, [ckpt, "sparsity"], id_sets, ood_sets, authors, groups)
    per_seed = _combine(results, [ckpt, "sparsity", "seed"], id_sets, ood_sets, authors, groups)
    spread = per_seed.groupby(level=[0, 1]).agg(["std", "count"])

    full = _combine(_full_frame(full_accuracy, ckpt), [ckpt], id_sets, ood_sets, authors, groups)
    rows = []
    for (checkpoint, sparsity), accs in combined.iterrows():
        if checkpoint not in full.index:
            raise ConfigError(f"no full-model accuracy for checkpoint {checkpoint!r}")
        for target in targets:
            acc = float(accs[target])
            full_acc = float(full.loc[checkpoint, target])
            seeds = per_seed.loc[(checkpoint, sparsity), target].dropna()
            if authors:  # each seed, strictly (the authors' script)
                per_seed_ok = seeds > full_acc - margin + _TOL
            else:
                per_seed_ok = seeds >= full_acc - margin - _TOL
            rows.append(
                {
                    ckpt: checkpoint,
                    "target": target,
                    "sparsity": sparsity,
                    "accuracy": acc,
                    "accuracy_std": float(spread.loc[(checkpoint, sparsity), (target, "std")]),
                    "n_seeds": int(spread.loc[(checkpoint, sparsity), (target, "count")]),
                    "full_accuracy": full_acc,
                    "faithful": bool(per_seed_ok.all() and len(seeds))
                    if authors
                    else bool(acc >= full_acc - margin - _TOL),
                    "faithful_seeds": int(per_seed_ok.sum()),
                }
            )
    return pd.DataFrame(rows).sort_values([ckpt, "target", "sparsity"], ignore_index=True)


def effective_size(
    results: pd.DataFrame,
    full_accuracy: Any,
    *,
    id_datasets: str | Sequence[str],
    ood_datasets: str | Sequence[str],
    margin: float = 0.03,
    checkpoint_col: str | None = None,
    sparsity_unit: str = "auto",
    method: str = "authors",
    groups: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """One row per (checkpoint, target): ``full_accuracy``, ``faithful_sparsity`` (the largest
    faithful sparsity, NaN if none; with ``method="authors"`` the mean over seeds of each seed's),
    ``accuracy`` at it (``"paper"`` only), ``effective_size`` in percent (``100 - sparsity %``;
    100 when nothing is faithful); ``"authors"`` adds ``effective_size_std`` over seeds,
    ``n_seeds`` and ``method``. See the module docstring for both methods.

    ``sparsity_unit``: ``"fraction"`` (0.5), ``"percent"`` (50) or ``"auto"`` (percent when any
    sparsity exceeds 1).
    """
    if method not in METHODS:
        raise ConfigError(f"effective-size method must be one of {METHODS}, got {method!r}")
    if sparsity_unit == "auto":
        sparsity_unit = "percent" if float(results["sparsity"].max()) > 1 else "fraction"
    if sparsity_unit not in ("fraction", "percent"):
        raise ConfigError(f"sparsity_unit must be fraction, percent or auto; got {sparsity_unit}")
    scale = 1.0 if sparsity_unit == "percent" else 100.0
    if method == "authors":
        return _effective_size_per_seed(
            results, full_accuracy, id_datasets, ood_datasets, margin, checkpoint_col, scale, groups
        )
    table = faithfulness_table(
        results,
        full_accuracy,
        id_datasets=id_datasets,
        ood_datasets=ood_datasets,
        margin=margin,
        checkpoint_col=checkpoint_col,
        groups=groups,
        method="paper",
    )
    ckpt = table.columns[0]
    rows = []
    for (checkpoint, target), group in table.groupby([ckpt, "target"], sort=False):
        faithful = group[group["faithful"]]
        row = {ckpt: checkpoint, "target": target, "full_accuracy": group["full_accuracy"].iloc[0]}
        if faithful.empty:
            row.update(faithful_sparsity=np.nan, accuracy=np.nan, effective_size=100.0)
        else:
            best = faithful.loc[faithful["sparsity"].idxmax()]
            row.update(
                faithful_sparsity=best["sparsity"],
                accuracy=best["accuracy"],
                effective_size=100.0 - scale * float(best["sparsity"]),
            )
        rows.append(row)
    return _order(pd.DataFrame(rows), ckpt, groups)


def _order(
    out: pd.DataFrame, ckpt: str, groups: Mapping[str, Sequence[str]] | None = None
) -> pd.DataFrame:
    out["target"] = pd.Categorical(out["target"], categories=list(_targets(groups)), ordered=True)
    out = out.sort_values([ckpt, "target"], ignore_index=True)
    out["target"] = out["target"].astype(str)
    return out


def _effective_size_per_seed(
    results: pd.DataFrame,
    full_accuracy: Any,
    id_datasets: str | Sequence[str],
    ood_datasets: str | Sequence[str],
    margin: float,
    checkpoint_col: str | None,
    scale: float,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """The authors' script: per seed, strict faithfulness, largest faithful sparsity, then mean."""
    id_sets, ood_sets, ckpt = _check_results(
        results, id_datasets, ood_datasets, checkpoint_col, groups
    )
    targets = _targets(groups)
    per_seed = _combine(results, [ckpt, "seed", "sparsity"], id_sets, ood_sets, True, groups)
    full = _combine(_full_frame(full_accuracy, ckpt), [ckpt], id_sets, ood_sets, True, groups)
    rows = []
    for checkpoint, by_checkpoint in per_seed.groupby(level=0, sort=True):
        if checkpoint not in full.index:
            raise ConfigError(f"no full-model accuracy for checkpoint {checkpoint!r}")
        for target in targets:
            full_acc = float(full.loc[checkpoint, target])
            sparsities = []
            for _, by_seed in by_checkpoint[target].groupby(level=1):
                accs = by_seed.droplevel([0, 1])
                faithful = accs[accs > full_acc - margin + _TOL]
                sparsities.append(float(faithful.index.max()) if len(faithful) else 0.0)
            sizes = [100.0 - scale * s for s in sparsities]
            rows.append(
                {
                    ckpt: checkpoint,
                    "target": target,
                    "full_accuracy": full_acc,
                    "faithful_sparsity": float(np.mean(sparsities)),
                    "accuracy": np.nan,
                    "effective_size": float(np.mean(sizes)),
                    "effective_size_std": float(np.std(sizes, ddof=1)) if len(sizes) > 1 else 0.0,
                    "n_seeds": len(sizes),
                    "method": "authors",
                }
            )
    return _order(pd.DataFrame(rows), ckpt, groups)
