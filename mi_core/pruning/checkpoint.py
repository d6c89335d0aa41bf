"""A mask-learning run's checkpoint: gates, lambdas, optimizer state and log rows in one file.

One format for every mask kind (heads and MLPs, neurons, edges): the learnt tensors by name,
AdamW's state, the step, the log rows, and what the run must match to resume
(:func:`check_resumable`: its mask kind, settings and inputs, where the run records them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from mi_core.errors import (
    ConfigError,
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


def mask_tensors(gates: HardConcrete, controller: LagrangianController) -> dict[str, torch.Tensor]:
    """A mask-learning run's learnt tensors by their checkpoint names: ``log_alpha`` and the
    controller's lambdas (``lambda_1``, ``lambda_2``, and those of a second term where the
    kind has one, as edges' node gates)."""
    return {"log_alpha": gates.log_alpha, **dict(controller.named_parameters())}


def save_checkpoint(
    path: Path,
    step: int,
    tensors: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    log: list[dict[str, Any]],
    scaler: torch.amp.GradScaler | None = None,
    info: Mapping[str, Any] | None = None,
) -> None:
    """Write a mask-learning run's learnt ``tensors`` (gates and lambdas of any mask kind, by
    name), its AdamW state, step, the fp16 loss scaler's state, the log rows of the steps done
    and ``info`` (what the run must match to resume: its seed, settings, inputs), atomically,
    as one file: ``log.csv`` is written beside it, and a kill between the two writes cannot
    lose rows, which resume from here."""
    state = optimizer.state_dict()
    saved = {name: tensor.detach() for name, tensor in tensors.items()}
    for param_id, param_state in state["state"].items():
        for key, value in param_state.items():
            saved[f"optimizer.{param_id}.{key}"] = torch.as_tensor(value)
    record = {"step": step, "groups": state["param_groups"], **dict(info or {})}
    if scaler is not None:
        record["scaler"] = scaler.state_dict()
    record["log"] = log
    write_safetensors(path, saved, {"kind": CHECKPOINT_KIND, "state": json.dumps(record)})


def checkpoint_info(path: Path) -> dict[str, Any]:
    """What a checkpoint records besides its tensors: step, log rows and the ``info`` it was
    saved with (refused, in one line, when it is no checkpoint or an older mi_core's)."""
    _, metadata = read_safetensors(path)
    if metadata.get("kind") != CHECKPOINT_KIND:
        raise TrainingError(f"{path} is not a pruning checkpoint; delete it to start over")
    info = json.loads(metadata["state"])
    if "log" not in info:
        raise TrainingError(
            f"{path} is a pruning checkpoint of an older mi_core (it records no log rows): "
            "delete it and run the pruning run again"
        )
    return info


def checkpoint_log(path: Path) -> list[dict[str, Any]]:
    """The log rows a checkpoint holds."""
    return checkpoint_info(path)["log"]


#: AdamW's implementation flags, which follow the device a run resumes on.
_OPTIMIZER_IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")


def load_checkpoint(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None = None,
) -> int:
    """Restore what :func:`save_checkpoint` wrote into ``tensors`` (in place), the optimizer
    and the loss scaler; returns the number of steps already done.

    The fp16 loss scaler resumes at its saved scale (a checkpoint of an fp32 / bf16 run holds
    none and leaves ``scaler`` at its initial scale). AdamW's state goes where
    ``Optimizer.load_state_dict`` puts it for this machine's implementation (fused on a GPU,
    capturable, foreach), whatever the saving machine's was."""
    info = checkpoint_info(path)
    saved, _ = read_safetensors(path)
    for name, tensor in tensors.items():
        if name not in saved or saved[name].shape != tensor.shape:
            have = "none" if name not in saved else f"{saved[name].numel()}"
            raise TrainingError(
                f"checkpoint {path} has {have} {name} entries but the run has "
                f"{tensor.numel()}; it belongs to another model or mask kind"
            )
    with torch.no_grad():
        for name, tensor in tensors.items():
            tensor.copy_(saved[name])
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in saved.items():
        if name.startswith("optimizer."):
            _, param_id, key = name.split(".", 2)
            opt_state.setdefault(int(param_id), {})[key] = value
    # how AdamW computes (fused on a GPU, foreach, ...) is this machine's choice, not the file's
    groups = [
        {**kept, **{k: current[k] for k in _OPTIMIZER_IMPLEMENTATION if k in current}}
        for kept, current in zip(info["groups"], optimizer.param_groups, strict=True)
    ]
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    if scaler is not None and info.get("scaler"):
        scaler.load_state_dict(info["scaler"])
    return int(info["step"])


def check_resumable(
    path: Path,
    kind: str,
    settings: Mapping[str, Any],
    inputs: Mapping[str, Any],
    what: str,
    not_learnt: Collection[str] = (),
) -> None:
    """Refuse, in one line (:class:`ConfigError`), to resume the checkpoint at ``path`` for a
    run of mask ``kind`` with ``settings`` and ``inputs`` (fingerprints: the weights, the data)
    other than those it recorded; ``not_learnt`` settings (how often a run saves) may change.
    A checkpoint that records less (an older mi_core's) is refused too, naming what it lacks.
    ``what`` names the run in the message (``"edge-pruning"``)."""
    folder = path.parent

    def older(lacks: str) -> ConfigError:
        return ConfigError(
            f"{path} is an {what} state of an older mi_core (it records no {lacks}): delete "
            f"{folder} and run the {what} again"
        )

    try:
        info = checkpoint_info(path)
    except TrainingError:
        raise older("progress") from None
    if "config" not in info or "inputs" not in info:
        raise older("progress")
    if "mask_kind" not in info:
        raise older("mask kind")
    saved, saved_inputs = info["config"], info["inputs"]
    lacks = [k for k in sorted(settings) if k not in not_learnt and k not in saved]
    lacks += [f"{k} fingerprint" for k in sorted(inputs) if k not in saved_inputs]
    if lacks:
        raise older(", ".join(lacks))
    differ = ["mask kind"] if info["mask_kind"] != kind else []
    differ += sorted(
        k
        for k in set(saved) | set(settings)
        if k not in not_learnt and saved.get(k) != settings.get(k)
    )
    differ += [f"the {k}" for k in sorted(inputs) if saved_inputs[k] != inputs[k]]
    if differ:
        raise ConfigError(
            f"{folder} holds an {what} run with other settings ({', '.join(differ)}); use "
            "another folder, the same settings, or delete it to start over"
        )
