"""A short, stable hash of a model's weights, to tie saved means and masks to their model."""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def weights_fingerprint(model: nn.Module) -> str:
    """blake2b over every parameter and buffer (names, shapes, float32 bytes); 16 hex digits."""
    digest = hashlib.blake2b(digest_size=8)
    for name, tensor in sorted(model.state_dict().items()):
        if not torch.is_floating_point(tensor):
            continue
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
