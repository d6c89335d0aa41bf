"""A short, stable hash of a model's weights, to tie saved means and masks to their model."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch
from torch import nn

#: id(model) -> its fingerprint (a list: empty until first computed), while a job holds it
_HELD: dict[int, list[str]] = {}


@contextlib.contextmanager
def fingerprint_held(model: nn.Module) -> Iterator[None]:
    """Inside, :func:`weights_fingerprint` of ``model`` is computed once and then reused: for a
    job that keeps the weights fixed while it checks them against several files (a sweep's runs,
    a group's folders, each with its means and reference logits). A nested scope uses the outer
    one's value. Not a cache across calls: weights edited in place (``W.data[...] = 0``) do not
    change a tensor's version counter, so only a scope that knows the weights are fixed may
    reuse the value."""
    key = id(model)
    if key in _HELD:
        yield
        return
    _HELD[key] = []
    try:
        yield
    finally:
        del _HELD[key]


#: Buffers derived from the config, not weights: TransformerLens extends its rotary tables
#: when a longer input comes (a forward of more than 2,048 tokens would change the hash).
DERIVED_BUFFERS = ("rotary_sin", "rotary_cos")


def weights_fingerprint(model: nn.Module) -> str:
    """blake2b over every parameter and buffer (names, shapes, float32 bytes) but the derived
    ones (:data:`DERIVED_BUFFERS`); 16 hex digits. Computed once inside
    :func:`fingerprint_held`."""
    held = _HELD.get(id(model))
    if held:
        return held[0]
    value = _weights_digest(model)
    if held is not None:
        held.append(value)
    return value


def _weights_digest(model: nn.Module) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for name, tensor in sorted(model.state_dict().items()):
        if not torch.is_floating_point(tensor) or name.endswith(DERIVED_BUFFERS):
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
