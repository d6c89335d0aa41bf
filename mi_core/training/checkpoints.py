"""Training checkpoints as Hugging Face directories plus a safetensors optimizer state.

``DIR/checkpoint-{step}/`` holds config.json, model.safetensors and the tokenizer files (so
``transformers`` and :func:`mi_core.load_model` open it) and ``trainer_state.json``. The
optimizer state (``optimizer.safetensors``, twice the model's size) is kept only in the two
newest checkpoints: the newest to resume from, the one before in case the newest is damaged
(:func:`prune_training_states`). A checkpoint is written to a temporary folder and renamed, so a
crash never leaves a half-written one.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from mi_core.errors import OutputError
from mi_core.io import read_json, user_umask, write_json

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optimizer.safetensors"


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``out_dir``, sorted by step."""
    out = []
    for path in Path(out_dir).glob("checkpoint-*"):
        match = _CHECKPOINT.match(path.name)
        if match and (path / TRAINER_STATE).is_file():
            out.append((int(match.group(1)), path))
    return sorted(out)


def save_checkpoint(
    out_dir: str | Path,
    step: int,
    model,
    tokenizer,
    optimizer: torch.optim.Optimizer,
    scheduler,
    state: dict,
) -> Path:
    """Write ``checkpoint-{step}`` atomically (HF model + tokenizer + optimizer + state)."""
    final = Path(out_dir) / f"checkpoint-{step}"
    tmp = Path(out_dir) / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tensors, meta = _flatten_optimizer(optimizer)
        save_file(tensors, str(tmp / OPTIMIZER_STATE))
        write_json(
            tmp / TRAINER_STATE,
            dict(state, step=step, optimizer=meta, scheduler=scheduler.state_dict()),
        )
        for path in tmp.iterdir():  # safetensors writes 0600: the user's umask decides
            path.chmod(0o666 & ~user_umask())
    except (OSError, SafetensorError) as exc:  # e.g. a full disk: no half folder left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"cannot write {final}: {exc}") from None
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


#: How many of the newest checkpoints keep their optimizer state.
KEEP_OPTIMIZER_STATES = 2


def resumable_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Checkpoints that hold an optimizer state (newest last)."""
    return [(s, p) for s, p in list_checkpoints(out_dir) if (p / OPTIMIZER_STATE).is_file()]


def prune_training_states(out_dir: str | Path, save_total_limit: int | None = None) -> None:
    """Drop the optimizer state of all but the newest :data:`KEEP_OPTIMIZER_STATES` checkpoints
    and, with ``save_total_limit``, whole checkpoints beyond the newest ``save_total_limit``
    (as Hugging Face's Trainer does)."""
    checkpoints = list_checkpoints(out_dir)
    for _, path in checkpoints[:-KEEP_OPTIMIZER_STATES]:
        (path / OPTIMIZER_STATE).unlink(missing_ok=True)
    if save_total_limit is not None:
        for _, path in checkpoints[:-save_total_limit]:
            shutil.rmtree(path)


def load_training_state(checkpoint: Path, optimizer: torch.optim.Optimizer, scheduler) -> dict:
    """Restore optimizer and scheduler from a checkpoint; return its trainer state."""
    state = read_json(checkpoint / TRAINER_STATE)
    tensors = load_file(str(checkpoint / OPTIMIZER_STATE))
    _restore_optimizer(optimizer, tensors, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state


def _flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Optimizer state as named tensors (no pickle) and JSON-able scalars."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict] = {}
    for index, entry in sd["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value) and value.dim() > 0:
                tensors[f"{index}.{key}"] = value.contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = float(value)
    return tensors, {"scalars": scalars, "param_groups": sd["param_groups"]}


def _restore_optimizer(optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    for index, scalars in meta["scalars"].items():
        for key, value in scalars.items():
            state.setdefault(int(index), {})[key] = torch.tensor(value)
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
