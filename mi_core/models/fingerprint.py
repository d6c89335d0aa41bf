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


def tensor_fingerprint(tensor: torch.Tensor) -> str:
    """blake2b over one tensor's shape and values (as float64, so ids and floats alike); 16
    hex digits: ties a saved run to the data or means it learnt from."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(str(tuple(tensor.shape)).encode())
    digest.update(tensor.detach().to(torch.float64).cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
