"""The token windows a separability run reads for one data set."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int

from mi_core.errors import DataError


@dataclass
class TaskTokens:
    """One data set's token windows: ``stats`` for statistics, ``heldout`` for metrics.

    The two parts must not share tokens (:func:`mi_core.data.token_windows` with
    ``split="stats"`` and ``split="heldout"`` guarantees it). Masks mark real tokens (``None``:
    no padding).
    """

    name: str
    stats: Int[torch.Tensor, "n pos"]
    heldout: Int[torch.Tensor, "m pos"]
    stats_mask: Bool[torch.Tensor, "n pos"] | None = None
    heldout_mask: Bool[torch.Tensor, "m pos"] | None = None

    def __post_init__(self) -> None:
        if self.stats.numel() == 0 or self.heldout.numel() == 0:
            raise DataError(
                f"{self.name}: both the stats and the heldout windows must be non-empty"
            )
