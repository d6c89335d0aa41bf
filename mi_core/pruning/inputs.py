"""A pruning job's inputs from paths or specs: the model, the data sets and the means.

The one place where paths become loaded objects (the CLI and Ray workers call it); the
library functions take what it returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mi_core.data import PairDataset, load_pairs
from mi_core.data.batches import NO_TEXT_SCORE
from mi_core.data.prompt_tasks import (
    EVAL_SEED,
    TRAIN_SEED,
    PromptTask,
    TaskData,
    check_task_specs,
    is_prompt_spec,
    load_task_data,
)
from mi_core.data.text import TextTask
from mi_core.errors import (
    ConfigError,
    DataError,
    InterventionError,
)
from mi_core.interventions import ComponentMeans, load_means
from mi_core.models.classifier import StagedClassifier
from mi_core.models.fingerprint import fingerprint_held
from mi_core.tasks import NEXT_TOKEN

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel
    from mi_core.pruning.profiles import PruneConfig

logger = logging.getLogger(__name__)


def is_prompt_data(data: Any) -> bool:
    """Whether ``data`` (a spec or a loaded set) is a prompt task or plain text, which a
    language model reads (:data:`~mi_core.tasks.NEXT_TOKEN`), rather than sentence pairs."""
    if isinstance(data, (PromptTask, TextTask)):
        return True
    return isinstance(data, (str, os.PathLike)) and is_prompt_spec(data)


def data_task(train: Any, task: str | None) -> str | None:
    """The task a job's model is loaded for: ``task`` as given, else next-token prediction
    when the training data is a prompt task."""
    if task is None and is_prompt_data(train):
        return NEXT_TOKEN
    return task


def check_named_inputs(train: Any, eval_sets: Sequence[Any], means: Any) -> None:
    """The data specs and means file a job names exist, checked before the model loads (so a
    typo'd spec fails at once, not after the load). Training and eval sets are all sentence
    pairs or all prompt tasks."""
    kinds = {is_prompt_data(d) for d in (train, *eval_sets)}
    if len(kinds) > 1:
        raise DataError(
            "training and eval sets must all be sentence pairs (a classifier's) or all prompt "
            "tasks (a language model's: ioi, ioi:abba, nli:<pair spec>, a .jsonl file of prompts)"
        )
    check_task_specs([s for s in (train, *eval_sets) if isinstance(s, (str, os.PathLike))])
    if isinstance(means, (str, os.PathLike)) and not Path(means).is_file():
        raise InterventionError(f"means file {means} does not exist; make one with mi-core means")


def load_model_input(
    model: HookedModel | str | os.PathLike[str], task: str | None, device: str = "auto"
) -> tuple[Any, str]:
    """A loaded model as given, or the model at a path / spec loaded on ``device``."""
    if isinstance(model, (str, os.PathLike)):
        from mi_core.devices import resolve_device
        from mi_core.models import load_model
        from mi_core.models.loading import loads_as_classifier

        if not loads_as_classifier(model, task) and task == NEXT_TOKEN:
            raise ConfigError(
                f"{os.fspath(model)} is not a causal language model (a sequence classifier or "
                "an encoder): prompt tasks (ioi, ioi:abba, nli:<pair spec>, a .jsonl file of "
                "prompts) are read from a language model's next-token logits; prune a "
                "classifier on sentence pairs (mnli:train, qqp:train, a pair file)"
            )
        if not loads_as_classifier(model, task):
            raise ConfigError(
                f"{os.fspath(model)} is a causal language model: node pruning runs on a "
                "sentence-pair classifier (name a --task to give it a classifier head) or, for "
                "a language model, on a prompt task (ioi, ioi:abba, nli:<pair spec>, a .jsonl "
                "file)"
            )
        return load_model(model, task=task, device=str(resolve_device(device))), os.fspath(model)
    check_model(model)
    return model, str(getattr(model, "model_name", "") or "model")


def check_model(model: object) -> None:
    """Refuse what is not a loaded hooked classifier with its tokenizer."""
    if not isinstance(model, StagedClassifier) or getattr(model, "tokenizer", None) is None:
        raise ConfigError("model must be a hooked classifier or a checkpoint path / model name")


def check_eval_names(evals: Sequence[TaskData]) -> list[str]:
    """The eval sets' names, which must differ (they key the accuracies)."""
    names = [d.name for d in evals]
    if len(set(names)) != len(names):
        raise ConfigError(f"eval sets must differ; got {names}")
    return names


def load_data_input(
    data: Any,
    task: str | None,
    max_examples: int | None,
    role: str,
    tokenizer: Any = None,
    seed: int = TRAIN_SEED,
) -> TaskData:
    """A job's data set as loaded (``max_examples`` of it): sentence pairs, a prompt task
    (IOI prompts generated from ``seed`` with ``tokenizer``'s one-token names) or, for
    training only, plain text (windows made with ``tokenizer``)."""
    if isinstance(data, (PairDataset, PromptTask, TextTask)):
        dataset = data.spread(max_examples) if max_examples is not None else data
    elif is_prompt_spec(data):
        dataset = load_task_data(data, max_examples, seed=seed, tokenizer=tokenizer)
    else:
        dataset = load_pairs(os.fspath(data), max_examples=max_examples, task=task)
    if task is not None and dataset.task != task:
        what = "a language model" if task == NEXT_TOKEN else f"a {task} classifier"
        kind = "prompt-task" if dataset.task == NEXT_TOKEN else f"{dataset.task}"
        raise DataError(
            f"{role} set {dataset.name} is {kind} data, but the model is {what}; use data of "
            "the model's task"
        )
    if len(dataset) == 0:
        raise DataError(f"{role} set {dataset.name} is empty")
    if role != "training" and isinstance(dataset, TextTask):
        raise DataError(NO_TEXT_SCORE.format(name=dataset.name))
    return dataset


def load_means_input(means: Any, model: HookedModel, fill: str) -> ComponentMeans | None:
    if means is None:
        if fill == "mean":
            raise ConfigError(
                "mean ablation needs --means (make them with mi-core means) or use --fill zero"
            )
        return None
    if isinstance(means, ComponentMeans):
        means.check_model(model)
        return means
    return load_means(means, model)


def load_inputs(
    model: HookedModel,
    task: str | None,
    means: Any,
    fill: str,
    train: Any,
    max_train_examples: int | None,
    eval_sets: Sequence[Any],
    max_eval_examples: int | None,
) -> tuple[str | None, ComponentMeans | None, TaskData, list[TaskData], list[str]]:
    """A job's task, means, training set and eval sets (whose names must differ), for a loaded
    ``model``: inside the job's :func:`fingerprint_held`, as means files check the weights."""
    task = getattr(model, "task", None) or task
    means_obj = load_means_input(means, model, fill)
    tokenizer = getattr(model, "tokenizer", None)
    train_set = load_data_input(train, task, max_train_examples, "training", tokenizer, TRAIN_SEED)
    evals = [
        load_data_input(d, task, max_eval_examples, "eval", tokenizer, EVAL_SEED) for d in eval_sets
    ]
    return task, means_obj, train_set, evals, check_eval_names(evals)


def means_identity(means: ComponentMeans | None) -> dict[str, Any] | None:
    if means is None:
        return None
    identity: dict[str, Any] = {
        "model_fingerprint": means.fingerprint,
        "dataset": means.dataset,
        "n_tokens": means.n_tokens,
    }
    if means.by_position:  # filled per position: another intervention than the same data's
        identity["by_position"] = True
    return identity


@dataclass(frozen=True)
class RunSources:
    """Where a run's inputs came from, as its ``config.json`` records them (informational: a
    resumed run must match the weights' fingerprint, the data and the means, not these)."""

    model: str
    task: str | None = None
    means_path: str | None = None
    max_eval_examples: int | None = None


@dataclass(frozen=True)
class PruneInputs:
    """A pruning job's inputs, loaded: what :func:`~mi_core.pruning.prune` takes."""

    model: HookedModel
    train: TaskData
    means: ComponentMeans | None
    eval_sets: list[TaskData]
    sources: RunSources


@contextlib.contextmanager
def resolve_inputs(
    model: HookedModel | str | os.PathLike[str],
    train: Any,
    means: Any,
    *,
    eval_sets: Sequence[Any] = (),
    fill: str = "mean",
    task: str | None = None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    device: str = "auto",
) -> Iterator[PruneInputs]:
    """Paths and specs (the CLI's, a Ray worker's) or loaded objects, as loaded objects: the
    data specs and the means file are checked before the model loads, the means against the
    model's weights. The one place where a pruning input is read from disk. A context: inside
    it the weights are held fixed, so their fingerprint is computed once for every check the
    caller then makes (:func:`~mi_core.models.fingerprint.fingerprint_held`)."""
    check_named_inputs(train, eval_sets, means)
    task = data_task(train, task)
    loaded, spec = load_model_input(model, task, device)
    with fingerprint_held(loaded):
        task, means_obj, train_set, evals, _ = load_inputs(
            loaded, task, means, fill, train, max_train_examples, eval_sets,
            max_eval_examples,
        )  # fmt: skip
        if isinstance(means, ComponentMeans):
            means_path = means.source  # the file it was read from, if any
        else:
            means_path = None if means is None else str(means)
        sources = RunSources(spec, task, means_path, max_eval_examples)
        yield PruneInputs(loaded, train_set, means_obj, evals, sources)


def check_loaded(model: object, train: object, means: object, eval_sets: Sequence[object]) -> None:
    """Refuse a path or spec where a loaded object is asked for, naming the function that
    takes paths."""
    given = [
        name
        for name, value in (("model", model), ("train", train), ("means", means))
        if isinstance(value, (str, os.PathLike))
    ]
    given += ["eval_sets"] if any(isinstance(d, (str, os.PathLike)) for d in eval_sets) else []
    if given:
        raise ConfigError(
            f"prune takes loaded objects ({', '.join(given)} given as a path or spec): load "
            "them with load_model / load_pairs / load_means, or call prune_run (paths, a run "
            "folder) or mi-core prune"
        )


def check_inputs(
    model: HookedModel,
    task_data: Any,
    means: ComponentMeans | None,
    eval_sets: Sequence[Any],
    config: PruneConfig,
    sources: RunSources | None,
) -> tuple[list[TaskData], list[str], RunSources]:
    """What :func:`~mi_core.pruning.prune` checks of its loaded inputs: no paths, a hooked
    classifier, data sets of the model's task that are not empty, eval sets of distinct names,
    means that fit the model (or none, with the zero fill); returns the eval sets, their names
    and the sources to record (by default: the model's name and task, the means' file)."""
    check_loaded(model, task_data, means, eval_sets)
    check_model(model)
    task = getattr(model, "task", None)
    load_data_input(task_data, task, None, "training")
    evals = [load_data_input(d, task, None, "eval") for d in eval_sets]
    names = check_eval_names(evals)
    if means is not None:
        means.check_model(model)
    elif config.fill == "mean":
        raise ConfigError("mean ablation needs means (load_means, mi-core means) or fill='zero'")
    if sources is None:
        name = str(getattr(model, "model_name", "") or "model")
        sources = RunSources(name, task, None if means is None else means.source)
    return evals, names, sources
