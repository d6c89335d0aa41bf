"""One seed-derivation helper and one length-grouped batcher (fine-tuning and pruning)."""

from __future__ import annotations

import hashlib

import torch

from mi_core.data import PairBatches, length_grouped_batches
from mi_core.data.batches import TokenizedPairs
from mi_core.seeding import derive_seed


def _tokenized(lengths: list[int]) -> TokenizedPairs:
    ids = [[5] * n for n in lengths]
    return TokenizedPairs(
        input_ids=ids, token_type_ids=[[0] * n for n in lengths], labels=[0] * len(lengths),
        max_length=128, pad_token_id=0, n_truncated=0, truncated=[],
    )  # fmt: skip


def test_derive_seed_is_the_hash_of_its_parts():
    digest = hashlib.sha256(b"mi_core.prune:3:17").digest()
    assert derive_seed("prune", 3, 17) == int.from_bytes(digest[:8], "little") & (2**63 - 1)
    assert 0 <= derive_seed("batches", 0, 0) < 2**63


def test_streams_of_neighbouring_seeds_do_not_coincide():
    # seed + epoch made seed 2's first epoch seed 1's second
    assert derive_seed("batches", 2, 0) != derive_seed("batches", 1, 1)
    assert derive_seed("prune", 1, 0) != derive_seed("prune", "dropout", 1, 0)
    batches = PairBatches(_tokenized([8] * 64), batch_size=8, shuffle=True, seed=1)
    other = PairBatches(_tokenized([8] * 64), batch_size=8, shuffle=True, seed=2)
    assert batches.batch_indices(1) != other.batch_indices(0)


def test_shuffled_length_grouped_batches_are_the_one_batcher():
    lengths = torch.randint(3, 60, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    batches = PairBatches(
        _tokenized(lengths), batch_size=16, shuffle=True, seed=4, drop_last=True,
        sort_by_length=True,
    )  # fmt: skip
    for epoch in range(2):
        assert batches.batch_indices(epoch) == length_grouped_batches(lengths, 16, 4, epoch)
    # composition changes between epochs (a global sort would keep it fixed)
    first = {tuple(sorted(b)) for b in batches.batch_indices(0)}
    second = {tuple(sorted(b)) for b in batches.batch_indices(1)}
    assert first != second
    kept = PairBatches(_tokenized(lengths), batch_size=16, shuffle=True, sort_by_length=True)
    assert sum(len(b) for b in kept.batch_indices(0)) == 300  # drop_last off keeps the rest


def test_the_number_of_grouped_batches_is_what_iteration_yields():
    for n in (5, 16, 40):
        batches = PairBatches(_tokenized([8] * n), batch_size=16, shuffle=True, drop_last=True,
                              sort_by_length=True)  # fmt: skip
        assert len(batches) == len(list(batches))
