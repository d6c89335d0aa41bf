"""Component names and masks: parsing, validation, printing, save/load round trips."""

from __future__ import annotations

import json

import pytest
import torch
from transformer_lens import HookedTransformerConfig

from mi_core.errors import InterventionError
from mi_core.interventions import Component, ComponentMask, format_components, parse_components

CFG = HookedTransformerConfig(n_layers=12, d_model=64, n_ctx=16, d_head=16, n_heads=4, d_mlp=128)
BERT = HookedTransformerConfig(n_layers=12, d_model=96, n_ctx=16, d_head=8, n_heads=12, d_mlp=64)


def test_parse_heads_and_mlps():
    parsed = parse_components("L2.H5,L3.H7, L4.MLP", BERT)
    assert parsed == [Component(2, 5), Component(3, 7), Component(4)]
    assert [str(c) for c in parsed] == ["L2.H5", "L3.H7", "L4.MLP"]
    assert format_components(parsed) == "L2.H5,L3.H7,L4.MLP"
    # order: layer by layer, heads before the layer's MLP; duplicates collapse; case-insensitive
    assert parse_components("L4.MLP,l4.h0,L2.H5,L2.H5") == [
        Component(2, 5),
        Component(4, 0),
        Component(4),
    ]
    assert parse_components("") == []


@pytest.mark.parametrize("bad", ["L2H5", "L2.X5", "2.5", "L-1.H0", "L2.H", "L2.MLP3"])
def test_parse_rejects_malformed_names(bad):
    with pytest.raises(InterventionError, match="cannot parse component"):
        parse_components(bad)


def test_heads_as_the_integers_torch_and_numpy_hand_back():
    """``(layer, head)`` from argmax / topk / nonzero().tolist(): lists, NumPy and 0-d torch
    integers, a [2] tensor (a list had raised AttributeError, NumPy ints were refused)."""
    import numpy as np

    heads = [[1, 2], (np.int64(0), 3), (torch.tensor(2), torch.tensor(1)), torch.tensor([3, 0])]
    assert parse_components([*heads, "L4.MLP"], BERT) == [
        Component(0, 3), Component(1, 2), Component(2, 1), Component(3, 0), Component(4)
    ]  # fmt: skip
    for bad in [(1, 2, 3), (1.5, 2), (-1, 2), None, (True, 1)]:
        with pytest.raises(InterventionError, match="a head is a .layer, head. pair"):
            parse_components([bad])


def test_parse_rejects_components_outside_the_model():
    with pytest.raises(InterventionError, match=r"L12\.H0 does not exist: the model has 12 layers"):
        parse_components("L12.H0", BERT)
    with pytest.raises(InterventionError, match=r"L0\.H12 does not exist: .* 12 heads"):
        parse_components("L0.H12", BERT)
    with pytest.raises(InterventionError, match="L12.MLP"):
        ComponentMask.from_removed(BERT, "L12.MLP")


def test_from_removed_and_readouts():
    mask = ComponentMask.from_removed(CFG, "L2.H3,L0.H0,L7.MLP")
    assert mask.heads.shape == (12, 4) and mask.mlps.shape == (12,)
    assert mask.heads[2, 3] == 0 and mask.heads[0, 0] == 0 and mask.mlps[7] == 0
    assert float(mask.heads.sum() + mask.mlps.sum()) == 12 * 4 + 12 - 3
    assert mask.removed() == [Component(0, 0), Component(2, 3), Component(7)]
    assert mask.is_binary() and mask.partial() == {}
    assert mask.sparsity() == pytest.approx(3 / 60)
    assert str(mask) == "ComponentMask(12 layers x 4 heads; 3/60 removed: L0.H0,L2.H3,L7.MLP)"
    assert ComponentMask.ones(CFG).removed() == []


@pytest.mark.parametrize("suffix", [".json", ".safetensors"])
def test_save_load_round_trip(tmp_path, suffix):
    mask = ComponentMask.from_removed(CFG, "L2.H3,L11.MLP")
    mask.heads[5, 1] = 0.25  # a partial value survives both formats exactly
    mask.mlps[3] = 0.7
    path = mask.save(tmp_path / f"mask{suffix}")
    loaded = ComponentMask.load(path)
    assert loaded == mask
    assert loaded.partial() == {Component(5, 1): 0.25, Component(3): pytest.approx(0.7)}
    assert torch.equal(loaded.mlps, mask.mlps)


def test_json_is_readable(tmp_path):
    path = ComponentMask.from_removed(CFG, "L2.H3,L7.MLP").save(tmp_path / "mask.json")
    data = json.loads(path.read_text())
    assert data["removed"] == ["L2.H3", "L7.MLP"]
    assert (data["n_layers"], data["n_heads"], data["n_removed"]) == (12, 4, 2)
    assert "partial" not in data
    # hand-written JSON with only the essentials loads too
    path.write_text(json.dumps({"n_layers": 12, "n_heads": 4, "removed": ["L1.H1"]}))
    assert ComponentMask.load(path).removed() == [Component(1, 1)]


def test_mask_values_must_lie_in_unit_interval(tmp_path):
    with pytest.raises(InterventionError, match=r"1\.5 for L1\.H2 is outside \[0, 1\]"):
        ComponentMask(torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.5]]), torch.ones(2))
    with pytest.raises(InterventionError, match="L0.MLP is outside"):
        ComponentMask(torch.ones(2, 3), torch.tensor([-0.1, 1.0]))
    with pytest.raises(InterventionError, match="nan for L0.H0"):
        ComponentMask(torch.tensor([[float("nan")]]), torch.ones(1))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"n_layers": 2, "n_heads": 2, "partial": {"L1.H1": 2.0}}))
    with pytest.raises(InterventionError, match="outside"):
        ComponentMask.load(path)


def test_mask_shapes_are_checked():
    with pytest.raises(InterventionError, match="mask shapes do not fit"):
        ComponentMask(torch.ones(3, 4), torch.ones(2))
    with pytest.raises(InterventionError, match="mask shapes do not fit"):
        ComponentMask(torch.ones(12), torch.ones(12))
    mask = ComponentMask.ones(CFG)
    with pytest.raises(InterventionError, match=r"does not fit a model with 12 layers x 12 heads"):
        mask.check_model(BERT)


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(InterventionError, match="does not exist"):
        ComponentMask.load(tmp_path / "missing.json")
    with pytest.raises(InterventionError, match="expected .json or .safetensors"):
        ComponentMask.load(tmp_path / "mask.txt")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(InterventionError, match="not valid JSON"):
        ComponentMask.load(tmp_path / "junk.json")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(InterventionError, match="not a safetensors file"):
        ComponentMask.load(tmp_path / "junk.safetensors")
    with pytest.raises(InterventionError, match="use a .json or .safetensors name"):
        ComponentMask.ones(CFG).save(tmp_path / "mask.bin")
    assert not (tmp_path / "mask.bin").exists()


def test_grad_tensors_are_kept_and_detach_for_saving(tmp_path):
    heads = torch.full((12, 4), 0.5, requires_grad=True)
    mask = ComponentMask(heads, torch.ones(12))
    assert mask.heads is heads  # the mask holds the caller's tensor, so gradients reach it
    loaded = ComponentMask.load(mask.save(tmp_path / "m.safetensors"))
    assert not loaded.heads.requires_grad and torch.equal(loaded.heads, heads.detach())
