"""Fine-tune a sequence classifier (AdamW, linear schedule) with checkpoints and resumption.

Training runs on the Hugging Face model (with its dropout), so every checkpoint is a plain
Hugging Face directory; evaluations use the same batches and scoring as ``mi-core eval``.
Re-running with the same output directory resumes from the last checkpoint; each step's
dropout is seeded from (seed, step), so a resumed run equals an uninterrupted one.

With ``group_by_length`` (the default) batches hold examples of similar length, in a shuffled
order, as Hugging Face's Trainer does with ``group_by_length``, so that less of each batch is
padding, which on a CPU costs what real tokens cost (the saving: benchmarks/README.md, Results,
"length-grouped batches"); each epoch draws new batches. The paper configs switch it off (the
authors' random batches).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from mi_core.data import load_pairs, pair_batches
from mi_core.data.pairs import same_data_set
from mi_core.devices import autocast, grad_scaler, matmul_precision, to_device
from mi_core.errors import ConfigError, DataError, ModelLoadError, TrainingError
from mi_core.evaluation import evaluate, model_inputs
from mi_core.io import check_replaceable, read_json, write_csv, write_json
from mi_core.models import load_hf_classifier
from mi_core.seeding import derive_seed
from mi_core.tasks import TASK_LABELS
from mi_core.training.checkpoints import (
    list_checkpoints,
    load_training_state,
    prune_training_states,
    resumable_checkpoints,
    save_checkpoint,
)
from mi_core.training.config import FinetuneConfig, FinetuneSettings  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)
METRICS = "metrics.csv"
#: Its columns: each eval set's accuracy at a step, and the examples it was measured on.
METRIC_COLUMNS = ("step", "dataset", "accuracy", "n")
TRAIN_LOSS = "train_loss.csv"  # step, loss, lr: every optimisation step
CONFIG = "finetune_config.json"


#: Settings a resumed run may change: where and how often it saves or evaluates, not what it
#: learns or measures.
RESUMABLE_CHANGES = frozenset(
    {"out", "save_every", "save_total_limit", "eval_batch_size", "device"}
)


#: What a finished run may change besides: it trains and evaluates no more, so nothing mixes.
FINISHED_CHANGES = frozenset({"eval", "max_eval_examples"})


def _finished(cfg: FinetuneConfig, out: Path) -> bool:
    """Whether ``out`` holds the run's last checkpoint (it trains and evaluates no more)."""
    return any(step == cfg.steps for step, _ in list_checkpoints(out))


def _check_resumable(cfg: FinetuneConfig, out: Path, finished: bool) -> None:
    """Refuse a folder holding a run with other settings: the data, the optimisation (the
    linear schedule depends on ``steps``) or, unless the run is finished, the evaluation
    (``metrics.csv`` would mix)."""
    saved = out / CONFIG
    if not saved.is_file():
        return
    before = read_json(saved)
    allowed = RESUMABLE_CHANGES | (FINISHED_CHANGES if finished else frozenset())
    now = asdict(cfg)
    lacks = [k for k in now if k not in before]
    if lacks:
        raise ConfigError(
            f"{saved} was written by an older mi_core (it has no {', '.join(lacks)}): run the "
            f"fine-tuning again in a new --out (or delete {out})"
        )
    changed = [k for k in now if k not in allowed and before[k] != now[k]]
    if changed:
        raise ConfigError(
            f"{out} holds a run with other settings ({', '.join(changed)}); "
            "use a new --out or the same settings to resume"
        )
    asked = [k for k in FINISHED_CHANGES if before[k] != now[k]]
    if finished and asked:  # accepted, but nothing is evaluated: say so and what to run
        log.warning(
            "%s is finished: its metrics keep the evaluation it trained with (%s); the %s "
            "asked now are not evaluated here (mi-core eval --model %s --data ...)",
            out, ", ".join(f"{k}={before[k]}" for k in asked),
            ", ".join(asked), out / f"checkpoint-{cfg.steps}",
        )  # fmt: skip


def finetune(cfg: FinetuneConfig, progress: bool = True) -> pd.DataFrame:
    """Fine-tune ``cfg.model`` on ``cfg.train``; return the metrics table (step, dataset, accuracy).

    Writes ``checkpoint-{step}`` every ``save_every`` steps and at the end, ``metrics.csv``,
    ``train_loss.csv`` (each step's training loss and learning rate, written with each checkpoint)
    and ``training_dynamics.html`` (in-domain vs out-of-domain accuracy over steps).
    """
    out = Path(cfg.out)
    finished = _finished(cfg, out)
    _check_resumable(cfg, out, finished)
    train = load_pairs(cfg.train, max_examples=cfg.max_train_examples)
    if train.task != cfg.task:
        raise DataError(f"{cfg.train} is {train.task} data but --task is {cfg.task}")
    if len(train) == 0:
        raise DataError(f"{cfg.train} is empty")
    if train.num_labels != train.model_num_labels:
        # a 2-way (HANS-style) file: its label 1 (non-entailment) is the model's class 1
        # (neutral); training on it would teach the wrong class
        raise DataError(
            f"{cfg.train} has {train.num_labels} labels ({', '.join(train.label_names)}) but a "
            f"{cfg.task} model has {train.model_num_labels} classes; training needs labels in "
            f"the model's classes ({', '.join(TASK_LABELS[cfg.task])})"
        )
    evals = [load_pairs(spec, max_examples=cfg.max_eval_examples) for spec in cfg.eval]
    for ds in evals:
        if ds.task != cfg.task:
            raise DataError(f"eval set {ds.name} is for {ds.task} models, not {cfg.task}")

    in_domain = in_domain_sets(cfg.train, cfg.eval, [ds.name for ds in evals])
    checkpoints = resumable_checkpoints(out)
    device = cfg.torch_device()
    # the newest checkpoint whose weights read back (a damaged one: the one before it)
    while True:
        source = str(checkpoints[-1][1]) if checkpoints else cfg.model
        try:
            model, tokenizer, _ = load_hf_classifier(source, task=cfg.task, seed=cfg.seed)
            break
        except ModelLoadError as exc:
            if not checkpoints or "Permission denied" in str(exc):  # unreadable, not damaged
                raise
            if len(checkpoints) == 1:
                raise TrainingError(
                    f"no checkpoint in {out} has readable weights ({exc}); move them away to "
                    "start over"
                ) from None
            log.warning("%s cannot be loaded (%s); resuming from the checkpoint before it",
                        source, exc)  # fmt: skip
            checkpoints = checkpoints[:-1]
    model.to(device)
    if not finished:  # every record a step writes, before the first step (not after a save's worth)
        check_replaceable(out, (CONFIG, TRAIN_LOSS, METRICS, "training_dynamics.html"))
    out.mkdir(parents=True, exist_ok=True)
    if not finished:
        write_json(out / CONFIG, asdict(cfg))  # a finished run's record stays what it ran

    batches = pair_batches(
        train,
        tokenizer,
        batch_size=cfg.batch_size,
        max_length=cfg.max_length,
        shuffle=True,
        seed=cfg.seed,
        drop_last=len(train) >= cfg.batch_size,
        sort_by_length=cfg.group_by_length,
    )
    optimizer, scheduler = _optimizer(model, cfg)
    scaler = grad_scaler(device, cfg.precision)
    start = 0
    metrics = pd.DataFrame(columns=list(METRIC_COLUMNS))
    losses: list[dict[str, float]] = []
    if checkpoints:
        start, model, optimizer, scheduler = _resume(
            checkpoints, cfg, model, optimizer, scheduler, scaler
        )
        if (out / METRICS).is_file():
            try:
                metrics = pd.read_csv(out / METRICS)
                metrics = metrics[metrics["step"] <= start]
            except (ValueError, KeyError, pd.errors.ParserError) as exc:  # EmptyDataError too
                log.warning("%s is unreadable (%s); its rows before step %d are lost",
                            out / METRICS, exc, start)  # fmt: skip
                metrics = pd.DataFrame(columns=list(METRIC_COLUMNS))
        losses = _read_losses(out, start)
        log.info("resuming %s from step %d", out, start)
    elif evals:
        metrics = _record(metrics, 0, _evaluate_all(model, tokenizer, evals, cfg))
        _write_metrics(out, metrics, in_domain, evals)

    per_epoch = len(batches)
    epoch_batches: list[list[int]] = []
    bar = tqdm(total=cfg.steps, initial=start, desc="fine-tune", disable=not progress)
    model.train()
    for step in range(start, cfg.steps):
        epoch, position = divmod(step, per_epoch)
        if position == 0 or not epoch_batches:
            epoch_batches = batches.batch_indices(epoch)
        batch = to_device(batches.tokenized.collate(epoch_batches[position]), device)
        torch.manual_seed(derive_seed("finetune", cfg.seed, step))
        if device.type == "cuda":
            torch.cuda.manual_seed_all(derive_seed("finetune", cfg.seed, step))
        with matmul_precision(cfg.precision):  # tf32: the forward and the backward pass
            with autocast(device, cfg.precision):
                loss = model(**model_inputs(model, batch), labels=batch["labels"]).loss
            if not math.isfinite(loss.item()):
                raise TrainingError(
                    f"loss became {loss.item()} at step {step + 1}; the last good checkpoint is "
                    f"kept in {out} (lower --lr and re-run)"
                )
            if scaler is None:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            else:  # fp16: scaled loss, unscaled gradients clipped, inf-gradient steps skipped
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
        lr = scheduler.get_last_lr()[0]  # the rate this step used
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        done = step + 1
        losses.append({"step": done, "loss": loss.item(), "lr": lr})
        if done % cfg.save_every == 0 or done == cfg.steps:
            if evals:
                metrics = _record(metrics, done, _evaluate_all(model, tokenizer, evals, cfg))
            # the records first, then the checkpoint: a kill between the two leaves rows past
            # the checkpoint, which a resume drops and makes again (the other order lost them)
            write_csv(out / TRAIN_LOSS, pd.DataFrame(losses, columns=["step", "loss", "lr"]))
            _write_metrics(out, metrics, in_domain, evals)
            save_checkpoint(
                out,
                done,
                model,
                tokenizer,
                optimizer,
                scheduler,
                {
                    "seed": cfg.seed,
                    "loss": loss.item(),
                    **({"scaler": scaler.state_dict()} if scaler is not None else {}),
                },
            )
            prune_training_states(out, cfg.save_total_limit)
            model.train()
    bar.close()
    return metrics


def _resume(checkpoints, cfg: FinetuneConfig, model, optimizer, scheduler, scaler=None):
    """Restore the newest checkpoint whose training state reads back; say so when a damaged one
    is skipped. Returns ``(step, model, optimizer, scheduler)`` (the model of the checkpoint
    resumed from); an fp16 loss ``scaler`` continues from the checkpoint's scale."""
    for index in range(len(checkpoints) - 1, -1, -1):
        step, path = checkpoints[index]
        if index < len(checkpoints) - 1:  # an older checkpoint: its own weights and optimizer
            try:
                model, _, _ = load_hf_classifier(str(path), task=cfg.task, seed=cfg.seed)
            except ModelLoadError as exc:
                if "Permission denied" in str(exc):
                    raise
                log.warning("%s: the weights are damaged (%s); trying the checkpoint before it",
                            path, exc)  # fmt: skip
                continue
            model.to(cfg.torch_device())
            optimizer, scheduler = _optimizer(model, cfg)
        try:
            info = load_training_state(path, optimizer, scheduler)
            start = info["step"]
        except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
            log.warning(
                "%s: the training state is damaged (%s); trying the checkpoint before it",
                path,
                type(exc).__name__,
            )
            continue
        if scaler is not None and info.get("scaler"):
            scaler.load_state_dict(info["scaler"])
        if index < len(checkpoints) - 1:
            log.warning("resuming from %s; the newer checkpoints are redone", path)
        log.info("resuming %s from step %d", path.parent, start)
        return start, model, optimizer, scheduler
    raise TrainingError(
        f"no checkpoint in {checkpoints[-1][1].parent} has a readable training state; "
        "move them away to start over"
    )


def _read_losses(out: Path, start: int) -> list[dict[str, float]]:
    """The training losses of steps 1..``start`` from an earlier run's ``train_loss.csv`` (empty
    when it is missing or unreadable: the checkpoints are what resuming needs)."""
    path = out / TRAIN_LOSS
    if not path.is_file():
        return []
    try:
        table = pd.read_csv(path)
        table = table[table["step"] <= start][["step", "loss", "lr"]]
    except (OSError, ValueError, KeyError, pd.errors.ParserError) as exc:
        log.warning("%s is unreadable (%s); its losses before step %d are lost", path, exc, start)
        return []
    return table.to_dict("records")


def _optimizer(model, cfg: FinetuneConfig):
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.999),
        eps=1e-8,
    )
    return optimizer, get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, cfg.steps)


def _evaluate_all(model, tokenizer, evals, cfg: FinetuneConfig) -> dict[str, tuple[float, int]]:
    """Accuracy and examples per eval set."""
    model.eval()
    return {
        ds.name: (
            evaluate(
                model, ds, tokenizer, batch_size=cfg.eval_batch_size, max_length=cfg.max_length
            ).accuracy,
            len(ds),
        )
        for ds in evals
    }


def _record(
    metrics: pd.DataFrame, step: int, accuracies: dict[str, tuple[float, int]]
) -> pd.DataFrame:
    rows = pd.DataFrame(
        [
            {"step": step, "dataset": name, "accuracy": acc, "n": n}
            for name, (acc, n) in accuracies.items()
        ],  # fmt: skip
        columns=list(METRIC_COLUMNS),
    )
    return rows if metrics.empty else pd.concat([metrics, rows], ignore_index=True)


def in_domain_sets(train: str, specs: Sequence[str], names: Sequence[str]) -> list[str]:
    """The names (``names``, one per spec) of the eval sets of ``train``'s data set (MNLI matched
    and mismatched for ``mnli:train``), else the first: the in-domain lines of the figure."""
    same = [name for spec, name in zip(specs, names, strict=True) if same_data_set(spec, train)]
    return same or list(names[:1])


def _write_metrics(out: Path, metrics: pd.DataFrame, in_domain: list[str], evals) -> None:
    """metrics.csv, and the figure of in-domain (first --eval set) vs out-of-domain accuracy
    (each set with its n and chance level)."""
    write_csv(out / METRICS, metrics)
    if metrics.empty:
        return
    from mi_core.viz.figures import training_dynamics, write_figure_html

    figure = training_dynamics(
        metrics,
        id_datasets=in_domain,
        n={d.name: len(d) for d in evals},
        chance={d.name: d.chance_accuracy for d in evals},
    )
    write_figure_html(figure, out / "training_dynamics.html")
