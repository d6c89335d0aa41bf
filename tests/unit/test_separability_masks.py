"""Pruning masks: hooks and weight editing agree; the OV-SVD rewrite changes no output."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import random_tokens, tiny_model

from mi_core.errors import ConfigError, InterventionError
from mi_core.interventions.neurons import PruneMasks, is_grouped_query, zero_pruned_weights
from mi_core.interventions.svd import svd_attention


def random_masks(decoder, seed: int = 0, frac: float = 0.3, fills: bool = False) -> PruneMasks:
    cfg = decoder.cfg
    generator = torch.Generator().manual_seed(seed)
    masks = PruneMasks.empty(decoder)
    for step in (1, 2):
        masks.prune(
            step,
            torch.rand(cfg.n_layers, cfg.d_mlp, generator=generator) < frac / 2,
            torch.rand(cfg.n_layers, cfg.n_heads, cfg.d_head, generator=generator) < frac / 2,
            ff_fill=(torch.randn(cfg.n_layers, cfg.d_mlp, generator=generator) if fills else None),
            attn_fill=(
                torch.randn(cfg.n_layers, cfg.n_heads, cfg.d_head, generator=generator)
                if fills
                else None
            ),
        )
    return masks


@pytest.mark.parametrize("fills", [False, True], ids=["zero", "mean"])
def test_weight_zeroing_equals_hook_masking(decoder, fills):
    tokens = random_tokens(3, 16, seed=5)
    masks = random_masks(decoder, fills=fills)
    assert masks.n_ff_pruned > 0 and masks.n_attn_pruned > 0
    with torch.no_grad():
        unpruned = decoder(tokens)
        hooked = decoder.run_with_hooks(tokens, fwd_hooks=masks.hooks(decoder))
        edited = zero_pruned_weights(copy.deepcopy(decoder), masks)(tokens)
    assert (hooked - unpruned).abs().max() > 1e-2  # the pruning does something
    torch.testing.assert_close(edited, hooked, atol=1e-4, rtol=0)


def test_weight_zeroing_touches_the_documented_weights(decoder):
    masks = PruneMasks.empty(decoder)
    ff = torch.zeros(decoder.cfg.n_layers, decoder.cfg.d_mlp, dtype=torch.bool)
    ff[1, 3] = True
    attn = torch.zeros(
        decoder.cfg.n_layers, decoder.cfg.n_heads, decoder.cfg.d_head, dtype=torch.bool
    )
    attn[0, 1, 2] = True
    masks.prune(1, ff, attn)
    edited = zero_pruned_weights(copy.deepcopy(decoder), masks)
    mlp, block0 = edited.blocks[1].mlp, edited.blocks[0].attn
    assert mlp.W_in[:, 3].abs().sum() == 0 and mlp.b_in[3] == 0 and mlp.W_out[3].abs().sum() == 0
    assert mlp.W_in[:, 4].abs().sum() > 0
    assert block0.W_O[1, 2].abs().sum() == 0 and block0.W_O[1, 1].abs().sum() > 0
    if is_grouped_query(decoder):
        # the value column is shared with head 0 (same key-value group), which keeps it
        assert block0.W_V[1, :, 2].abs().sum() > 0
    else:
        assert block0.W_V[1, :, 2].abs().sum() == 0 and block0.b_V[1, 2] == 0


def test_gqa_shared_value_column_is_zeroed_once_the_whole_group_lost_it():
    decoder = tiny_model("llama")
    group = decoder.cfg.n_heads // decoder.cfg.n_key_value_heads
    masks = PruneMasks.empty(decoder)
    attn = torch.zeros(2, decoder.cfg.n_heads, decoder.cfg.d_head, dtype=torch.bool)
    attn[0, :group, 5] = True  # every head of key-value group 0
    masks.prune(1, attn=attn)
    tokens = random_tokens(2, 10, seed=7)
    edited = zero_pruned_weights(copy.deepcopy(decoder), masks)
    attn0 = edited.blocks[0].attn
    assert attn0._W_V[0, :, 5].abs().sum() == 0 and attn0._b_V[0, 5] == 0
    assert attn0._W_V[1, :, 5].abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(
            edited(tokens),
            decoder.run_with_hooks(tokens, fwd_hooks=masks.hooks(decoder)),
            atol=1e-4,
            rtol=0,
        )


def test_svd_leaves_outputs_unchanged(decoder):
    tokens = random_tokens(3, 16, seed=6)
    rewritten = svd_attention(copy.deepcopy(decoder))
    with torch.no_grad():
        before, after = decoder(tokens), rewritten(tokens)
        twice = svd_attention(copy.deepcopy(rewritten))(tokens)
    torch.testing.assert_close(after, before, atol=1e-4, rtol=0)
    torch.testing.assert_close(twice, before, atol=1e-4, rtol=0)
    # the weights did change, and the value bias went along with them
    assert (rewritten.blocks[0].attn.W_V - decoder.blocks[0].attn.W_V).abs().max() > 1e-3
    assert (rewritten.blocks[0].attn.b_V - decoder.blocks[0].attn.b_V).abs().max() > 1e-3


def test_svd_basis_is_the_singular_directions():
    decoder = tiny_model("gpt2")
    rewritten = svd_attention(copy.deepcopy(decoder))
    for layer in range(decoder.cfg.n_layers):
        for head in range(decoder.cfg.n_heads):
            w_v = rewritten.blocks[layer].attn.W_V[head].double()
            w_o = rewritten.blocks[layer].attn.W_O[head].double()
            original = decoder.blocks[layer].attn
            ov = original.W_V[head].double() @ original.W_O[head].double()
            singular = torch.linalg.svdvals(ov)[: decoder.cfg.d_head]
            eye = torch.eye(decoder.cfg.d_head, dtype=torch.float64)
            torch.testing.assert_close(w_v.T @ w_v, eye, atol=1e-5, rtol=0)  # W_V' = U
            gram = w_o @ w_o.T  # W_O' = S V^T: orthogonal rows with norms S, largest first
            torch.testing.assert_close(gram, torch.diag(singular.square()), atol=1e-4, rtol=1e-4)


def test_svd_then_pruning_by_weights_equals_hooks():
    decoder = svd_attention(tiny_model("llama"))
    masks = random_masks(decoder, seed=3, fills=True)
    tokens = random_tokens(2, 12, seed=8)
    with torch.no_grad():
        torch.testing.assert_close(
            zero_pruned_weights(copy.deepcopy(decoder), masks)(tokens),
            decoder.run_with_hooks(tokens, fwd_hooks=masks.hooks(decoder)),
            atol=1e-4,
            rtol=0,
        )


def test_svd_refuses_rank_deficient_heads():
    decoder = tiny_model("gpt2")
    with torch.no_grad():
        decoder.blocks[0].attn.W_V[0, :, 0] = 0
    with pytest.raises(ConfigError, match="rank-deficient"):
        svd_attention(decoder)


def test_prune_keeps_first_step_and_fill(decoder):
    cfg = decoder.cfg
    masks = PruneMasks.empty(decoder)
    sel = torch.zeros(cfg.n_layers, cfg.d_mlp, dtype=torch.bool)
    sel[0, :3] = True
    masks.prune(1, ff=sel, ff_fill=torch.full((cfg.n_layers, cfg.d_mlp), 2.0))
    sel2 = torch.zeros_like(sel)
    sel2[0, 2:5] = True
    masks.prune(2, ff=sel2, ff_fill=torch.full((cfg.n_layers, cfg.d_mlp), 7.0))
    assert masks.ff_step[0, :6].tolist() == [1, 1, 1, 2, 2, 0]
    assert masks.ff_fill[0, :6].tolist() == [2.0, 2.0, 2.0, 7.0, 7.0, 0.0]
    assert masks.n_ff_pruned == 5 and masks.n_steps == 2
    with pytest.raises(InterventionError):
        masks.prune(0, ff=sel)
    with pytest.raises(InterventionError):
        masks.prune(3, ff=sel[:, :4])


def test_masks_save_load_listing(decoder, tmp_path):
    masks = random_masks(decoder, fills=True)
    path = masks.save(tmp_path / "masks.safetensors", metadata={"note": "x"})
    loaded = PruneMasks.load(path)
    for name, tensor in masks.tensors().items():
        torch.testing.assert_close(loaded.tensors()[name], tensor)
    listing = masks.listing()
    assert listing["n_ff_pruned"] == masks.n_ff_pruned
    n_listed = sum(len(v) for step in listing["steps"] for v in step["ff"].values())
    assert n_listed == masks.n_ff_pruned
    assert [s["step"] for s in listing["steps"]] == [1, 2]
    other = tiny_model("gpt2", seed=0)
    other.cfg.d_mlp = 64  # a decoder of another shape
    with pytest.raises(InterventionError, match="do not fit"):
        loaded.hooks(other)
    with pytest.raises(InterventionError):
        PruneMasks.load(tmp_path / "missing.safetensors")


def test_whole_heads_are_counted(decoder):
    masks = PruneMasks.empty(decoder)
    attn = torch.zeros(
        decoder.cfg.n_layers, decoder.cfg.n_heads, decoder.cfg.d_head, dtype=torch.bool
    )
    attn[1, 2] = True
    attn[0, 0, 0] = True
    masks.prune(1, attn=attn)
    assert masks.n_heads_pruned == 1
    assert masks.listing()["heads_fully_pruned"] == [[1, 2]]


def test_masks_files_carry_kind_and_version_and_old_files_are_refused(decoder, tmp_path):
    from mi_core.interventions import load_intervention
    from mi_core.io import read_safetensors, write_safetensors

    masks = random_masks(decoder, seed=4)
    path = masks.save(tmp_path / "m.safetensors")
    tensors, metadata = read_safetensors(path)
    assert metadata["kind"] == "mi_core.PruneMasks" and metadata["format_version"] == "1"
    # format 1 names the fills by their former name
    assert sorted(tensors) == ["attn_offset", "attn_step", "ff_offset", "ff_step"]
    assert torch.equal(tensors["ff_offset"], masks.ff_fill)
    assert "format" not in metadata
    assert PruneMasks.load(path) == masks and load_intervention(path) == masks
    # a file of an older mi_core, its "format" tag in place of kind / format_version: one line
    # that says what to re-run, through PruneMasks.load and load_intervention alike
    old = write_safetensors(
        tmp_path / "old.safetensors",
        masks.tensors(),
        metadata={"format": "mi_core.interventions.neurons/1"},
    )
    older = r"a masks file of an older mi_core .*: re-run mi-core separability to write it again"
    with pytest.raises(InterventionError, match=older):
        PruneMasks.load(old)
    with pytest.raises(InterventionError, match=older):
        load_intervention(old)
    newer = write_safetensors(
        tmp_path / "new.safetensors",
        masks.tensors(),
        metadata={"kind": "mi_core.PruneMasks", "format_version": "9"},
    )
    with pytest.raises(InterventionError, match="format '9'"):
        PruneMasks.load(newer)
