"""Classification heads that sit on top of a hooked body, with their own hook points."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import nn
from transformer_lens.hook_points import HookPoint


class PooledClassificationHead(nn.Module):
    """dense -> tanh -> out on one token: BERT's pooler + classifier, RoBERTa's classification head.

    ``hook_in`` sees the token's residual stream (where RoBERTa's head applies dropout),
    ``hook_pooled`` the tanh output (BERT's "pooled output", where both apply dropout).
    """

    def __init__(self, d_model: int, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, num_labels)
        self.hook_in = HookPoint()
        self.hook_pooled = HookPoint()

    def forward(
        self, x: Float[torch.Tensor, "batch d_model"]
    ) -> Float[torch.Tensor, "batch label"]:
        return self.out(self.hook_pooled(torch.tanh(self.dense(self.hook_in(x)))))


class LinearClassificationHead(nn.Module):
    """A bias-free linear score on one token: GPT-2's ``score`` head."""

    def __init__(self, d_model: int, num_labels: int):
        super().__init__()
        self.score = nn.Linear(d_model, num_labels, bias=False)

    def forward(
        self, x: Float[torch.Tensor, "batch d_model"]
    ) -> Float[torch.Tensor, "batch label"]:
        return self.score(x)
