"""Separability's attention pre-out neurons carry their value bias, as the report's do: causal
LMs load with the value biases folded into the output bias by default (TransformerLens's
habit), which drops them from ``hook_z``; the separability job loads without folding and the
library refuses a folded model for attention pruning."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import tasks

from mi_core.errors import ConfigError
from mi_core.methods.separability.run import SeparabilityConfig, run_separability
from mi_core.models import load_model
from mi_core.statistics.activations import collect_activation_stats


@pytest.fixture(scope="module")
def opt_with_value_biases(tiny_checkpoints, tmp_path_factory):
    """The tiny OPT with random (nonzero) biases on every projection."""
    path = tmp_path_factory.mktemp("opt-biases") / "opt"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoints["opt-lm"])
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("proj.bias"):
                param.normal_(0.0, 0.5)
    hf.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(tiny_checkpoints["opt-lm"]).save_pretrained(path)
    return path, hf.eval()


def test_value_biases_stay_in_hook_z_when_asked(opt_with_value_biases, monkeypatch, tmp_path):
    monkeypatch.setenv("MI_CORE_CACHE_DIR", str(tmp_path / "cache"))
    path, hf = opt_with_value_biases
    folded = load_model(path)
    kept = load_model(path, fold_value_biases=False)
    assert folded.value_biases_folded and not kept.value_biases_folded
    assert (folded.blocks[0].attn.b_V == 0).all() and (kept.blocks[0].attn.b_V != 0).any()
    ids = torch.randint(5, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    expected = hf(ids).logits.log_softmax(-1)
    for model in (folded, kept):  # the same function either way, as Hugging Face's
        torch.testing.assert_close(model(ids).log_softmax(-1), expected, atol=1e-4, rtol=0)
    # the pre-out neuron: z without the bias when folded, z with it when kept
    _, a = folded.run_with_cache(ids, names_filter="blocks.0.attn.hook_z")
    _, b = kept.run_with_cache(ids, names_filter="blocks.0.attn.hook_z")
    bias = kept.blocks[0].attn.b_V.detach()  # [head, d_head]
    torch.testing.assert_close(
        b["blocks.0.attn.hook_z"], a["blocks.0.attn.hook_z"] + bias, atol=1e-5, rtol=0
    )
    # the processed-weight cache keeps the two apart and says which it holds
    again = load_model(path, fold_value_biases=False)
    assert not again.value_biases_folded and torch.equal(again.blocks[0].attn.b_V, bias)
    assert load_model(path).value_biases_folded


def test_separability_refuses_folded_value_biases_for_attention(opt_with_value_biases):
    path, _ = opt_with_value_biases
    focus, cripple = tasks(seed=3)
    config = SeparabilityConfig(steps=1, ff_frac=0.1, attn_frac=0.1, batch_size=8)
    with pytest.raises(ConfigError, match="fold_value_biases=False"):
        run_separability(load_model(path), focus, cripple, config)
    # MLP pruning alone does not read hook_z: allowed
    mlp_only = SeparabilityConfig(steps=1, ff_frac=0.1, batch_size=8)
    assert run_separability(load_model(path), focus, cripple, mlp_only).masks.n_ff_pruned > 0
    kept = load_model(path, fold_value_biases=False)
    stats = collect_activation_stats(kept, focus.stats)
    # the statistics include the bias: with it, mean |z| differs from the folded model's
    folded_stats = collect_activation_stats(load_model(path), focus.stats)
    assert not torch.allclose(stats.attn.mean_abs, folded_stats.attn.mean_abs, atol=1e-3)
    assert run_separability(kept, focus, cripple, config).masks.n_attn_pruned > 0
