"""A pruning run's checkpoint: gates, lambdas, optimizer state and log rows in one file."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from mi_core.errors import (
    TrainingError,
)
from mi_core.io import (
    read_safetensors,
    write_safetensors,
)
from mi_core.pruning.hard_concrete import (
    HardConcrete,
)
from mi_core.pruning.lagrangian import (
    LagrangianController,
)

logger = logging.getLogger(__name__)


CHECKPOINT_KIND = "mi_core.PruneCheckpoint"


def save_checkpoint(
    path: Path,
    step: int,
    seed: int,
    gates: HardConcrete,
    controller: LagrangianController,
    optimizer: torch.optim.Optimizer,
    log: list[dict[str, Any]],
    scaler: torch.amp.GradScaler | None = None,
) -> None:
    """Write gates, lambdas, AdamW state (tensors), step, groups, the fp16 loss scaler's state
    and the log rows of the steps done (JSON), atomically: ``log.csv`` is written beside it, and
    a kill between the two writes cannot lose rows, which resume from here."""
    state = optimizer.state_dict()
    tensors = {
        "log_alpha": gates.log_alpha,
        "lambda_1": controller.lambda_1,
        "lambda_2": controller.lambda_2,
    }
    for param_id, param_state in state["state"].items():
        for key, value in param_state.items():
            tensors[f"optimizer.{param_id}.{key}"] = torch.as_tensor(value)
    info = {
        "step": step,
        "noise": {"seed": seed, "next_step": step},
        "groups": state["param_groups"],
    }
    if scaler is not None:
        info["scaler"] = scaler.state_dict()
    info["log"] = log
    write_safetensors(path, tensors, {"kind": CHECKPOINT_KIND, "state": json.dumps(info)})


def checkpoint_log(path: Path) -> list[dict[str, Any]]:
    """The log rows a checkpoint holds (checked by :func:`load_checkpoint`)."""
    _, metadata = read_safetensors(path)
    return json.loads(metadata["state"])["log"]


#: AdamW's implementation flags, which follow the device a run resumes on.
_OPTIMIZER_IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")


def load_checkpoint(
    path: Path,
    gates: HardConcrete,
    controller: LagrangianController,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None = None,
) -> int:
    """Restore what :func:`save_checkpoint` wrote; returns the number of steps already done.

    The fp16 loss scaler resumes at its saved scale (a checkpoint of an fp32 / bf16 run holds
    none and leaves ``scaler`` at its initial scale)."""
    tensors, metadata = read_safetensors(path)
    if metadata.get("kind") != CHECKPOINT_KIND:
        raise TrainingError(f"{path} is not a pruning checkpoint; delete it to start over")
    info = json.loads(metadata["state"])
    if "log" not in info:
        raise TrainingError(
            f"{path} is a pruning checkpoint of an older mi_core (it records no log rows): "
            "delete it and run the pruning run again"
        )
    if tensors["log_alpha"].shape != gates.log_alpha.shape:
        raise TrainingError(
            f"checkpoint {path} has {tensors['log_alpha'].numel()} gates but the model has "
            f"{gates.log_alpha.numel()}; it belongs to another model"
        )
    with torch.no_grad():
        gates.log_alpha.copy_(tensors["log_alpha"])
        controller.lambda_1.copy_(tensors["lambda_1"])
        controller.lambda_2.copy_(tensors["lambda_2"])
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, param_id, key = name.split(".", 2)
            opt_state.setdefault(int(param_id), {})[key] = value
    # how AdamW computes (fused on a GPU, foreach, ...) is this machine's choice, not the file's
    groups = [
        {**saved, **{k: current[k] for k in _OPTIMIZER_IMPLEMENTATION if k in current}}
        for saved, current in zip(info["groups"], optimizer.param_groups, strict=True)
    ]
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    if scaler is not None and info.get("scaler"):
        scaler.load_state_dict(info["scaler"])
    return int(info["step"])
