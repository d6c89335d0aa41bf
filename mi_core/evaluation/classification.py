"""Accuracy of a sequence classifier on pair data sets, with per-example predictions."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from mi_core.data import PairDataset, pair_batches
from mi_core.data.batches import NO_TEXT_SCORE, tokenize_prompts
from mi_core.data.prompt_tasks import PromptTask
from mi_core.data.text import TextTask
from mi_core.errors import ConfigError, DataError
from mi_core.evaluation.config import EvalConfig
from mi_core.tasks import NEXT_TOKEN

logger = logging.getLogger(__name__)

#: The keys of a tokenised pair batch a classifier's forward takes.
BATCH_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def _plain(value: Any) -> Any:
    """A JSON-ready value (NumPy / torch scalars as Python ones)."""
    return value.item() if hasattr(value, "item") else value


#: Per-example fields of a data set that say which source row an example is.
_IDENTIFIERS = ("pairID", "subcase", "idx", "id", "split")


@dataclass
class EvalResult:
    """One data set's evaluation: accuracy, and per example the label, prediction and logits."""

    dataset: str
    accuracy: float
    labels: Int[torch.Tensor, " n"]
    predictions: Int[torch.Tensor, " n"]
    logits: Float[torch.Tensor, "n label"]
    """Class logits; on a prompt task two columns, the answer's logit and its rival's."""
    meta: dict[str, list] = field(default_factory=dict)
    """The data set's per-example identifiers (HANS: ``pairID``, ``subcase``; GLUE: ``idx``;
    PAWS: ``id``), so a row maps back to its source when a selection is not the file's first
    rows (HANS subsets taken subcase by subcase)."""

    @property
    def n(self) -> int:
        return int(self.labels.shape[0])

    def prediction_rows(self) -> list[dict]:
        """One JSON-ready dict per example: dataset, index, the data set's identifiers, label,
        prediction, logits."""
        return [
            {
                "dataset": self.dataset,
                "index": i,
                **{k: _plain(values[i]) for k, values in self.meta.items()},
                "label": int(label),
                "prediction": int(pred),
                "logits": [round(float(x), 6) for x in logits],
            }
            for i, (label, pred, logits) in enumerate(
                zip(self.labels, self.predictions, self.logits, strict=True)
            )
        ]


def model_inputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict:
    """The keys of ``batch`` that ``model`` takes; Hugging Face models get only what they use.

    HF GPT-2 would embed token type ids as words and RoBERTa has a single type, so only BERT gets
    them; hooked classifiers ignore what their family does not use.
    """
    inputs = {k: batch[k] for k in BATCH_KEYS if k in batch}
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "model_type", None) != "bert":
        inputs.pop("token_type_ids", None)
    return inputs


def _logits(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output


@torch.no_grad()
def predict_logits(
    model: torch.nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    n: int,
    progress: str | None = None,
    forward: Callable | None = None,
) -> Float[torch.Tensor, "n label"]:
    """Class logits for every example, put back in data set order by each batch's ``index``."""
    out: torch.Tensor | None = None
    if forward is None:
        from mi_core.devices import to_device

        device = next(model.parameters()).device

        def forward(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return _logits(model(**to_device(model_inputs(model, batch), device)))

    for batch in tqdm(batches, desc=progress, disable=progress is None, leave=False):
        logits = forward(batch).float().cpu()
        if out is None:
            out = torch.empty(n, logits.shape[-1])
        out[batch["index"]] = logits
    if out is None:
        raise ValueError("no batches to evaluate")
    return out


def evaluate(
    model: torch.nn.Module,
    dataset: PairDataset | PromptTask | TextTask,
    tokenizer=None,
    batch_size: int = 64,
    max_length: int = 128,
    progress: bool = False,
    *,
    mask: Any | None = None,
    means: Any | None = None,
    fill: str = "mean",
    batches: Sequence[dict[str, torch.Tensor]] | None = None,
) -> EvalResult:
    """Accuracy of ``model`` on ``dataset`` (model classes mapped to the data set's labels).

    ``tokenizer`` defaults to ``model.tokenizer``. Examples are batched by length, which wastes
    little compute on padding. With ``mask`` (a :class:`~mi_core.interventions.ComponentMask`
    or a :class:`~mi_core.interventions.Subnetwork`) the subnetwork is evaluated: removed
    components are replaced by ``fill``, ``"mean"`` (``means``: mean ablation) or ``"zero"``
    (a Subnetwork carries its own). ``batches``: the data set's batches already made
    (``list(pair_batches(dataset, ...))``), for a caller that evaluates the same examples many
    times.
    """

    if mask is not None:
        from mi_core.interventions import Subnetwork, apply

        subnetwork = mask if isinstance(mask, Subnetwork) else Subnetwork(mask, fill, means)
        with apply(model, subnetwork):
            return evaluate(
                model, dataset, tokenizer, batch_size, max_length, progress, batches=batches
            )
    if len(dataset) == 0:
        raise DataError(f"{dataset.name} is empty; nothing to evaluate")
    if isinstance(dataset, TextTask):
        raise DataError(NO_TEXT_SCORE.format(name=dataset.name))
    if isinstance(dataset, PromptTask):
        return _evaluate_prompts(model, dataset, tokenizer, batch_size, max_length, progress,
                                 batches)  # fmt: skip
    n_labels = getattr(model, "num_labels", None)
    if n_labels is not None and n_labels != len(dataset.prediction_map):
        raise DataError(  # else a 2-class QQP model would score MNLI pairs without a word
            f"{dataset.name} is {dataset.task} data ({len(dataset.prediction_map)} classes) but "
            f"the model has {n_labels} classes"
        )
    was_training = model.training
    model.eval()
    if batches is None:
        batches = pair_batches(
            dataset,
            tokenizer or model.tokenizer,
            batch_size=batch_size,
            max_length=max_length,
            sort_by_length=True,
        )
    try:
        logits = predict_logits(model, batches, len(dataset), dataset.name if progress else None)
    finally:
        model.train(was_training)
    accuracy = dataset.score(logits)  # checks the logits' classes against the data set's
    predictions = dataset.predictions_to_labels(logits.argmax(-1))
    labels = dataset.label_tensor()
    ids = {k: list(v) for k, v in dataset.meta.items() if k in _IDENTIFIERS}
    return EvalResult(dataset.name, accuracy, labels, predictions, logits, ids)


def _evaluate_prompts(
    model: torch.nn.Module,
    task: PromptTask,
    tokenizer: Any,
    batch_size: int,
    max_length: int,
    progress: bool,
    batches: Iterable[dict[str, torch.Tensor]] | None,
) -> EvalResult:
    """:func:`evaluate` on a prompt task: ``model`` reads next-token logits at the answer
    position (:class:`~mi_core.models.HookedAnswerModel`); accuracy is the answer beating its
    distractor (or top-1 without one); ``labels`` are the answer tokens, ``predictions`` the
    top tokens and ``logits`` two columns, the answer's logit and its rival's
    (:meth:`~mi_core.data.TokenizedPrompts.answer_vs_rival`), not the vocabulary's."""
    if getattr(model, "task", None) != NEXT_TOKEN:
        raise DataError(
            f"{task.name} is a prompt task: evaluate it with a language model loaded with "
            f"task='{NEXT_TOKEN}' (load_model(path, task='{NEXT_TOKEN}'))"
        )
    tokenized = tokenize_prompts(task, tokenizer or model.tokenizer, max_length)
    was_training = model.training
    model.eval()
    if batches is None:
        batches = pair_batches(tokenized, batch_size=batch_size, sort_by_length=True)
    try:
        logits = predict_logits(model, batches, len(task), task.name if progress else None)
    finally:
        model.train(was_training)
    accuracy = float(tokenized.accuracy(logits).mean())
    labels = torch.tensor(tokenized.labels)
    contest = tokenized.answer_vs_rival(logits, torch.arange(len(task)))
    return EvalResult(task.name, accuracy, labels, logits.argmax(-1), contest, {})


def results_frame(results: Iterable[EvalResult]) -> pd.DataFrame:
    """The ``dataset, n, accuracy`` table of several evaluations."""
    return pd.DataFrame(
        [{"dataset": r.dataset, "n": r.n, "accuracy": r.accuracy} for r in results],
        columns=["dataset", "n", "accuracy"],
    )


__all__ = ["EvalResult", "evaluate", "model_inputs", "predict_logits", "results_frame"]


def run_eval(config: EvalConfig, *, progress: bool = True) -> list[EvalResult]:
    """Evaluate the model (or its subnetwork) of ``config``; write the table and predictions."""
    import contextlib
    import json

    from mi_core.data import load_pairs
    from mi_core.data.prompt_tasks import check_task_specs, load_task_data
    from mi_core.interventions import ComponentMask, ablate, load_means
    from mi_core.interventions.components import parse_components
    from mi_core.io import atomic_path, write_csv
    from mi_core.models import load_model
    from mi_core.models.loading import warn_if_random_head

    prompts = check_task_specs(config.data)
    if not prompts:
        datasets = [load_pairs(spec, max_examples=config.max_examples) for spec in config.data]
    # the files and names the intervention reads, before the model loads
    mask = ComponentMask.load(config.mask) if config.mask else None
    if config.ablate:
        parse_components(config.ablate)
    if config.means and not Path(config.means).is_file():
        raise ConfigError(f"means file {config.means} does not exist; make one with mi-core means")
    if prompts:  # a language model on prompt tasks
        model = load_model(config.model, task=NEXT_TOKEN, **config.load_options())
        datasets = [
            load_task_data(spec, config.max_examples, tokenizer=model.tokenizer)
            for spec in config.data
        ]
    else:
        task = config.task or datasets[0].task
        model = load_model(config.model, task=task, **config.load_options())
    for ds in datasets:
        if ds.task != model.task:
            raise ConfigError(f"{ds.name} is {ds.task} data but the model is a {model.task} model")
    warn_if_random_head(model, config.model)
    if config.ablate:
        mask = ComponentMask.from_removed(model, config.ablate)
    means = load_means(config.means, model) if config.means else None
    if mask is not None and config.fill == "mean" and means is None:
        raise ConfigError("mean ablation needs --means FILE (from mi-core means), or --fill zero")
    context = ablate(model, mask, means, config.fill) if mask else contextlib.nullcontext()
    with context:
        results = [
            evaluate(
                model,
                ds,
                batch_size=config.batch_size,
                max_length=config.max_length,
                progress=progress,
            )
            for ds in datasets
        ]
    write_csv(config.out, results_frame(results))
    if config.predictions:
        with atomic_path(config.predictions) as tmp, open(tmp, "w", encoding="utf-8") as handle:
            for result in results:
                for row in result.prediction_rows():
                    handle.write(json.dumps(row) + "\n")
    return results
