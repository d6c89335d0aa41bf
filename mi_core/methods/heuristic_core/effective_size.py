"""Effective size over training (paper Figure 6): prune every fine-tuning checkpoint.

For each ``DIR/checkpoint-{step}`` (or each hub revision ``name@stepN`` of a model, Pythia's
training checkpoints: ``revisions``): mean activations on the training set (unless given), a
pruning sweep at every sparsity and seed (:func:`mi_core.pruning.sweeps.run_sweep`, so finished runs
are skipped and the runs can go to Ray), then :func:`mi_core.analysis.effective_size` on the
accuracies: the largest sparsity that stays within ``margin`` of that checkpoint's full model on
the in-domain set, the out-of-domain sets and their mix (``method`` ``authors``, the default:
each seed's largest faithful sparsity, then the mean over seeds; ``paper``: the mean accuracy
over seeds); effective size = 100 - that sparsity in percent. Layout of ``OUT``::

    checkpoint-{step}/means.safetensors     (unless means were given)
    checkpoint-{step}/sweep/                (a sweep directory)
    accuracy.csv         step, sparsity, seed, dataset, accuracy (every subnetwork)
    full_accuracy.csv    step, dataset, accuracy (every checkpoint's full model)
    faithfulness.csv     step, target, sparsity, accuracy, accuracy_std, n_seeds, full,
                         faithful, faithful_seeds (judged by the effective size's method)
    effective_size.csv   step, target, full_accuracy, faithful_sparsity, accuracy, effective_size
    effective_size.html  the figure (accuracy and effective size over steps)
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from mi_core.analysis.effective_size import effective_size, faithfulness_table
from mi_core.data.pairs import same_data_set
from mi_core.errors import ConfigError
from mi_core.io import read_json, write_csv
from mi_core.methods.heuristic_core.config import (  # noqa: F401 (re-exported)
    EffectiveSizeConfig,
    EffectiveSizeOptions,
    parse_checkpoint_steps,
    parse_groups,
)
from mi_core.methods.heuristic_core.layout import EFFECTIVE_SIZE_FILES
from mi_core.training.checkpoints import list_checkpoints

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

logger = logging.getLogger(__name__)

__all__ = [
    "EffectiveSizeResult",
    "find_checkpoints",
    "run_effective_size",
    "select_checkpoints",
]


@dataclass
class EffectiveSizeResult:
    """The tables :func:`run_effective_size` wrote (also on disk under ``out``)."""

    out: Path
    accuracy: pd.DataFrame
    full_accuracy: pd.DataFrame
    faithfulness: pd.DataFrame
    effective_size: pd.DataFrame


def find_checkpoints(
    checkpoints_dir: str | os.PathLike[str], revisions: Sequence[str] | None = None
) -> list[tuple[int, Path | str]]:
    """The complete ``checkpoint-{step}`` directories under ``checkpoints_dir``, by step: a
    fine-tuning run's (with their trainer state), or any Hugging Face folders so named (a
    language model's training checkpoints, saved with ``save_pretrained``).

    With ``revisions``, ``checkpoints_dir`` is a hub model id and each revision a checkpoint
    (``name@revision``, as :func:`~mi_core.models.load_model` reads it) whose step is the
    revision's number: Pythia's ``step1000``."""
    if revisions:
        return _hub_checkpoints(os.fspath(checkpoints_dir), revisions)
    root = Path(checkpoints_dir)
    if not root.is_dir():
        raise ConfigError(f"checkpoint directory {root} does not exist")
    found: list[tuple[int, Path | str]] = list(list_checkpoints(root))
    if not found:
        found = sorted(
            (int(path.name.removeprefix("checkpoint-")), path)
            for path in root.glob("checkpoint-*")
            if path.name.removeprefix("checkpoint-").isdigit() and (path / "config.json").is_file()
        )
    if not found:
        raise ConfigError(
            f"no checkpoint-<step> directories in {root}; point --checkpoints at a fine-tuning "
            "output directory (mi-core finetune --out)"
        )
    return found


def _hub_checkpoints(name: str, revisions: Sequence[str]) -> list[tuple[int, Path | str]]:
    if Path(name).expanduser().exists() or "@" in name:
        raise ConfigError(
            f"with revisions, the checkpoints are a hub model id (e.g. EleutherAI/pythia-160m), "
            f"not {name!r}"
        )
    found: dict[int, str] = {}
    for revision in revisions:
        numbers = re.findall(r"\d+", revision)
        if not numbers:
            raise ConfigError(
                f"revision {revision!r} names no training step; give revisions such as step1000"
            )
        step = int(numbers[-1])
        if step in found:
            raise ConfigError(f"revisions {found[step]!r} and {revision!r} share step {step}")
        found[step] = revision
    return [(step, f"{name}@{found[step]}") for step in sorted(found)]


def select_checkpoints(
    checkpoints: Sequence[tuple[int, Path | str]],
    steps: Sequence[int] | None = None,
    max_checkpoints: int | None = None,
) -> list[tuple[int, Path | str]]:
    """Keep the checkpoints of ``steps`` (all if None), then at most ``max_checkpoints`` of them,
    evenly spaced and always including the first and the last."""
    chosen = list(checkpoints)
    if steps is not None:
        have = {step for step, _ in chosen}
        missing = sorted(set(steps) - have)
        if missing:
            raise ConfigError(f"no checkpoint for step(s) {missing}; have steps {sorted(have)}")
        chosen = [c for c in chosen if c[0] in set(steps)]
    if max_checkpoints is not None and len(chosen) > max_checkpoints:
        if max_checkpoints == 1:
            return [chosen[-1]]
        last = len(chosen) - 1
        picks = sorted({round(i * last / (max_checkpoints - 1)) for i in range(max_checkpoints)})
        chosen = [chosen[i] for i in picks]
    return chosen


def _means_for(template: str | None, step: int, n_checkpoints: int) -> str | None:
    if template is None:
        return None
    if "{step}" in template:
        return template.format(step=step)
    if n_checkpoints > 1:
        raise ConfigError(
            "means are specific to one checkpoint: give --means with {step} in the path "
            "(e.g. means/checkpoint-{step}.safetensors) or leave it out to compute them"
        )
    return template


def compute_checkpoint_means(
    model: HookedModel, train: str, path: Path, max_examples: int | None
) -> Path:
    """Mean activations of ``model`` on ``train`` (at most ``max_examples`` pairs or prompts),
    saved."""
    from mi_core.data import load_pairs, pair_batches
    from mi_core.data.prompt_tasks import TRAIN_SEED, is_prompt_spec, load_task_data
    from mi_core.interventions import compute_means

    if is_prompt_spec(train):  # a language model's checkpoint: its training prompts or text
        dataset = load_task_data(train, max_examples, seed=TRAIN_SEED, tokenizer=model.tokenizer)
    else:
        task: str | None = getattr(model, "task", None)
        dataset = load_pairs(train, max_examples=max_examples, task=task)
    means = compute_means(
        model, pair_batches(dataset, model.tokenizer, batch_size=64), dataset=dataset.name
    )
    return means.save(path)


def run_effective_size(
    checkpoints_dir: str | os.PathLike[str],
    train: str,
    eval_sets: Sequence[str],
    out: str | os.PathLike[str],
    sparsities: Sequence[float],
    seeds: Sequence[int],
    *,
    means: str | None = None,
    ood_sets: Sequence[str] | None = None,
    margin: float = 0.03,
    method: str = "authors",
    profile: str = "paper",
    overrides: Mapping[str, Any] | None = None,
    task: str | None = None,
    steps: Sequence[int] | None = None,
    max_checkpoints: int | None = None,
    revisions: Sequence[str] | None = None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    executor: str = "local",
    group_size: int | None = None,
    ray_address: str | None = None,
    num_cpus_per_run: float = 1.0,
    num_gpus_per_run: float = 0.0,
    device: str = "auto",
    progress: bool = True,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> EffectiveSizeResult:
    """Prune every checkpoint at every sparsity and seed; write and return the effective sizes.

    ``eval_sets``: in-domain first; ``ood_sets`` (default: the sets after the first that are
    not of ``train``'s data set, so ``mnli:validation_mismatched`` stays in-domain for
    ``mnli:train``) are averaged into the out-of-domain target, ``groups`` (e.g.
    ``{"ood_e": [...]}``, GPT-2's entailment subcases) into targets of their own, every other
    eval set into the in-domain one (the authors average ``validation_matched`` and
    ``validation_mismatched``). ``method``: the
    authors' script or the paper's text (:mod:`mi_core.analysis.effective_size`). ``means``: a
    means file per checkpoint, as a path with ``{step}`` in it (one file is allowed for a single
    checkpoint); without it means are computed on ``train`` for every checkpoint. Re-running
    skips every finished pruning run. With the local executor every checkpoint is loaded once,
    on ``device``. ``revisions``: ``checkpoints_dir`` is a hub model id and these its
    checkpoints (:func:`find_checkpoints`).
    """
    from mi_core.devices import resolve_device
    from mi_core.models import load_model
    from mi_core.pruning.inputs import data_task
    from mi_core.pruning.sweeps import run_sweep

    task = data_task(train, task)  # prompt tasks and text: the checkpoints are LMs read as such

    eval_sets = list(eval_sets)
    if len(eval_sets) < 2:
        raise ConfigError("effective size needs an in-domain and at least one out-of-domain set")
    grouped = [d for sets in (groups or {}).values() for d in sets]
    ood = (
        list(ood_sets)
        if ood_sets is not None
        else [d for d in eval_sets[1:] if d not in grouped and not same_data_set(d, train)]
    )
    if not ood or eval_sets[0] in ood or any(d not in eval_sets for d in ood):
        raise ConfigError(f"the out-of-domain sets {ood} must be eval sets after the first")
    if any(d not in eval_sets or d in ood or d == eval_sets[0] for d in grouped):
        raise ConfigError(
            f"the sets of groups {dict(groups or {})} must be eval sets after the first, and "
            "not out-of-domain ones"
        )
    if not 0 <= margin < 1:
        raise ConfigError(f"--margin must lie in [0, 1) (accuracy fractions), got {margin}")
    chosen = select_checkpoints(
        find_checkpoints(checkpoints_dir, revisions), steps, max_checkpoints
    )
    if executor != "ray":
        device = str(resolve_device(device))
    out = Path(out)
    accuracy_rows: list[dict[str, Any]] = []
    full_rows: list[dict[str, Any]] = []
    for number, (step, checkpoint) in enumerate(chosen, 1):
        logger.info("effective size: checkpoint %d/%d (step %d)", number, len(chosen), step)
        step_dir = out / f"checkpoint-{step}"
        model: HookedModel | None = None
        if executor != "ray":
            model = load_model(checkpoint, task=task, device=device)
        means_path = _means_for(means, step, len(chosen))
        if means_path is None:
            computed = step_dir / "means.safetensors"
            if not computed.is_file():
                if model is None:
                    model = load_model(checkpoint, task=task, device=device)
                compute_checkpoint_means(model, train, computed, max_train_examples)
            means_path = str(computed)
        sweep_dir = step_dir / "sweep"
        table = run_sweep(
            str(checkpoint) if executor == "ray" else model,
            train,
            sweep_dir,
            sparsities,
            seeds,
            means=means_path,
            eval_sets=eval_sets,
            profile=profile,
            overrides=overrides,
            task=task,
            max_train_examples=max_train_examples,
            max_eval_examples=max_eval_examples,
            executor=executor,
            group_size=group_size,
            ray_address=ray_address,
            num_cpus_per_run=num_cpus_per_run,
            num_gpus_per_run=num_gpus_per_run,
            progress=progress,
            device=device,
        )
        full = read_json(sweep_dir / "full_model.json")
        names = [c[len("acc_") :] for c in table.columns if c.startswith("acc_")]
        for _, row in table.iterrows():
            for name in names:
                accuracy_rows.append(
                    {
                        "step": step,
                        "sparsity": row["sparsity"],
                        "seed": row["seed"],
                        "dataset": name,
                        "accuracy": row[f"acc_{name}"],
                    }
                )
        full_rows += [{"step": step, "dataset": n, "accuracy": full[n]} for n in names if n in full]
    seen = {r["dataset"] for r in accuracy_rows}
    return summarize_effective_size(
        out,
        pd.DataFrame(accuracy_rows, columns=["step", "sparsity", "seed", "dataset", "accuracy"]),
        pd.DataFrame(full_rows, columns=["step", "dataset", "accuracy"]),
        id_sets=[dataset_name(d, seen) for d in eval_sets if d not in ood and d not in grouped],
        ood_sets=[dataset_name(d, seen) for d in ood],
        margin=margin,
        method=method,
        groups={k: [dataset_name(d, seen) for d in v] for k, v in (groups or {}).items()},
    )


def dataset_name(spec: str, known: Collection[str] = (), task: str | None = None) -> str:
    """The data set name a spec evaluates under: ``spec`` itself when it is among the ``known``
    names (specs and names agree for registered sets), else the name its loader gives it."""
    from mi_core.data.prompt_tasks import is_prompt_spec

    if spec in known or (is_prompt_spec(spec) and not spec.endswith(".jsonl")):
        return spec  # a built-in prompt task is named by its spec
    if is_prompt_spec(spec):
        return Path(spec).stem
    from mi_core.data import load_pairs

    return load_pairs(spec, max_examples=1, task=task).name


def summarize_effective_size(
    out: str | os.PathLike[str],
    accuracy: pd.DataFrame,
    full_accuracy: pd.DataFrame,
    *,
    id_sets: Sequence[str],
    ood_sets: Sequence[str],
    margin: float = 0.03,
    method: str = "authors",
    groups: Mapping[str, Sequence[str]] | None = None,
) -> EffectiveSizeResult:
    """Faithfulness and effective size (by ``method``) from the tidy accuracy tables; writes the
    CSVs and the figure under ``out``."""
    from mi_core.viz.figures import effective_size_over_training, write_figure_html

    out = Path(out)
    kwargs = dict(
        id_datasets=list(id_sets), ood_datasets=list(ood_sets), margin=margin, groups=groups
    )
    faithful = faithfulness_table(  # judged as the effective size is (``method``)
        accuracy, full_accuracy, checkpoint_col="step", method=method, **kwargs
    )
    sizes = effective_size(accuracy, full_accuracy, checkpoint_col="step", method=method, **kwargs)
    files = EFFECTIVE_SIZE_FILES
    write_csv(out / files["accuracy"], accuracy)
    write_csv(out / files["full_accuracy"], full_accuracy)
    write_csv(out / files["faithfulness"], faithful)
    write_csv(out / files["effective_size"], sizes)
    figure = effective_size_over_training(full_accuracy, sizes, step_col="step")
    write_figure_html(figure, out / files["figure"])
    return EffectiveSizeResult(out, accuracy, full_accuracy, faithful, sizes)


def run_effective_size_job(
    config: EffectiveSizeConfig, *, progress: bool = True
) -> EffectiveSizeResult:
    """Run (or finish) the effective-size job of ``config``; write and return the tables."""
    return run_effective_size(
        config.checkpoints,
        config.train,
        config.eval,
        config.out,
        config.sparsities,
        config.seeds,
        means=config.means,
        ood_sets=config.ood,
        margin=config.margin,
        method=config.method,
        profile=config.profile,
        overrides=config.overrides,
        task=config.task,
        steps=config.steps,
        max_checkpoints=config.max_checkpoints,
        revisions=config.revisions,
        max_train_examples=config.max_train_examples,
        max_eval_examples=config.max_eval_examples,
        device=config.device,
        **config.execution(),
        progress=progress,
        groups=config.groups,
    )
