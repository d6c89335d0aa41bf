"""What a pruning run produces, and the columns of its log."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from mi_core.interventions import ComponentMask

logger = logging.getLogger(__name__)


#: The columns of a run's ``log.csv`` with a KL objective; another objective's value takes the
#: place of ``kl`` under its own column (:func:`log_columns`).
LOG_COLUMNS = (
    "step",
    "loss",
    "kl",
    "penalty",
    "expected_sparsity",
    "target_sparsity",
    "sampled_sparsity",
    "lambda_1",
    "lambda_2",
    "lr_factor",
    "grad_norm",
    "eval_accuracy",
    "eval_sparsity",
)


def log_columns(column: str = "kl") -> tuple[str, ...]:
    """``log.csv``'s columns for an objective whose value is logged as ``column``."""
    return tuple(column if c == "kl" else c for c in LOG_COLUMNS)


#: A run "reached" its target when the sparsity it optimised (sampled or expected, averaged over
#: the last tenth of its steps) lies this close to it.
TARGET_TOLERANCE = 0.05
#: Callback after every step: ``callback(step, row)`` with the step's ``log.csv`` row.
StepCallback = Callable[[int, dict[str, float]], None]


@dataclass
class PruneResult:
    """What a finished run produced (also on disk under ``run_dir``, when it has one)."""

    run_dir: Path | None
    mask: ComponentMask
    """The binary subnetwork (1 = kept)."""
    log_alpha: torch.Tensor | None
    """The learnt gate parameters, flat: every head (row-major), then every MLP (None when a
    finished run's checkpoint was deleted)."""
    metrics: dict[str, Any]
    resumed_from: int | None = None
    """The checkpoint step this call started from (None: from scratch or already complete)."""
    already_complete: bool = False
    log: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def achieved_sparsity(self) -> float:
        return float(self.metrics["achieved_sparsity"])

    @property
    def accuracy(self) -> dict[str, float]:
        """The binary subnetwork's accuracy per eval set."""
        return dict(self.metrics["accuracy"])

    @property
    def full_accuracy(self) -> dict[str, float]:
        """The full model's accuracy per eval set."""
        return dict(self.metrics["full_accuracy"])


def final_sparsity(log: pd.DataFrame, estimate: str) -> float | None:
    """The sparsity a run ended at: its ``estimate`` (``"sampled"`` or ``"expected"``) averaged
    over the last tenth of the steps (sampled sparsity is noisy step to step)."""
    if not len(log):
        return None
    tail = log[f"{estimate}_sparsity"].iloc[-max(1, len(log) // 10) :]
    return float(tail.mean())
