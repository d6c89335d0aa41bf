"""A model's weights fingerprint: computed once inside a job that holds the weights fixed (a
sweep checks it against every run's means and reference logits), never reused outside one."""

from __future__ import annotations

import torch

import mi_core.models.fingerprint as fingerprint
from mi_core.models.fingerprint import fingerprint_held, weights_fingerprint


def _counting(monkeypatch) -> list[int]:
    calls = []
    digest = fingerprint._weights_digest

    def counted(model):
        calls.append(id(model))
        return digest(model)

    monkeypatch.setattr(fingerprint, "_weights_digest", counted)
    return calls


def test_the_fingerprint_is_computed_once_inside_a_scope_and_fresh_outside(monkeypatch):
    calls = _counting(monkeypatch)
    model, other = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with fingerprint_held(model):
        first = weights_fingerprint(model)
        with fingerprint_held(model):  # a nested job uses the outer value
            assert weights_fingerprint(model) == first
        assert weights_fingerprint(model) == first
        weights_fingerprint(other)  # another model is not held
        weights_fingerprint(other)
    assert calls == [id(model), id(other), id(other)]
    # outside a scope, an in-place edit through .data (no version-counter bump) is seen
    model.weight.data[0, 0] += 1.0
    assert weights_fingerprint(model) != first
    with fingerprint_held(model):  # a new scope computes it afresh
        assert weights_fingerprint(model) != first
    assert len(calls) == 5


def test_a_long_input_does_not_change_a_rotary_models_fingerprint():
    """TransformerLens extends its rotary tables on a longer input; they are derived from the
    config, so the weights' fingerprint ignores them (means stay valid for the model)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=1, d_model=16, d_head=4, n_heads=4, d_vocab=50, n_ctx=4096,
        act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
        rotary_dim=4, gated_mlp=True, d_mlp=32,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    table = model.blocks[0].attn.rotary_cos.shape[0]
    before = weights_fingerprint(model)
    model(torch.zeros(1, table + 8, dtype=torch.long))
    assert model.blocks[0].attn.rotary_cos.shape[0] > table  # the table grew ...
    assert weights_fingerprint(model) == before  # ... and the fingerprint did not move
    model.blocks[0].attn.W_Q.data[0, 0, 0] += 1.0
    assert weights_fingerprint(model) != before
