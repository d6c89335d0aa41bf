"""Frozen weights for the span of a ``with`` block: methods that learn masks or take gradients
with respect to activations never need the weights' gradients (nor autograd's copies of the
activations those gradients would need)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def frozen(model: torch.nn.Module, eval_mode: bool = True) -> Iterator[None]:
    """``requires_grad=False`` on every weight inside (and eval mode, unless ``eval_mode`` is
    False); both restored afterwards (the mode only when it was changed)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    for p, _ in flags:
        p.requires_grad_(False)
    if eval_mode:
        model.eval()
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        if eval_mode:
            model.train(was_training)
