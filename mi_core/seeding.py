"""One way to derive seeds: every random stream of a run comes from a name, its seed and a position.

A run's seed alone would give every epoch the same data order and every step the same noise;
``seed + epoch`` would give seed 2's first epoch seed 1's second. :func:`derive_seed` hashes
the stream's name, the seed and the position (epoch, step, ...) together, so no two streams of a
sweep share a generator state and nothing about them has to be saved to resume: the stream of
step ``k`` is a function of ``k``.

The streams, by name:

``("prune", seed, step)``, ``("prune", "dropout", seed, step)``, ``("prune", "init", seed, 0)``
    a node-pruning run's hard-concrete noise, dropout and initial ``log_alpha``;
``("batches", seed, epoch)``
    the data order of shuffled batches (fine-tuning and pruning);
``("finetune", seed, step)``
    fine-tuning's dropout at each step;
``("circuit", seed, step)``, ``("circuit", "order", seed, epoch)``
    an edge-pruning run's gate noise and data order;
``("separability", "random", seed, step, site)``
    the random-pruning baseline's scores.
"""

from __future__ import annotations

import hashlib

__all__ = ["derive_seed"]


def derive_seed(*parts: str | int) -> int:
    """A 63-bit seed for ``torch.Generator().manual_seed``: the SHA-256 of
    ``"mi_core." + ":".join(parts)``, e.g. ``derive_seed("batches", seed, epoch)``."""
    tag = "mi_core." + ":".join(str(part) for part in parts)
    digest = hashlib.sha256(tag.encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
