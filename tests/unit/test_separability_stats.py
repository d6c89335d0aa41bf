"""Streaming activation statistics equal direct computations on cached activations."""

from __future__ import annotations

import pytest
import torch
from helpers import random_tokens

from mi_core.errors import ConfigError, DataError
from mi_core.statistics.activations import (
    STATISTICS,
    ActivationStats,
    NeuronStats,
    collect_activation_stats,
)

SITE_HOOKS = {"mlp": "blocks.{}.mlp.hook_post", "attn": "blocks.{}.attn.hook_z"}


def direct_statistics(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The six statistics over the first axis, computed plainly in float64."""
    x = x.double()
    return {
        "freq": (x > 0).double().mean(0),
        "mean": x.mean(0),
        "abs": x.abs().mean(0),
        "sqrt": x.abs().sqrt().mean(0),
        "std": x.std(0, correction=0),
        "rms": x.square().mean(0).sqrt(),
    }


def cached(decoder, tokens, site: str, token_mask=None) -> torch.Tensor:
    """``[n_layers, tokens, *neurons]`` activations of ``site`` at the real token positions."""
    _, cache = decoder.run_with_cache(tokens)
    layers = []
    for layer in range(decoder.cfg.n_layers):
        act = cache[SITE_HOOKS[site].format(layer)]
        rows = act.reshape(-1, *act.shape[2:])
        layers.append(rows if token_mask is None else rows[token_mask.reshape(-1)])
    return torch.stack(layers)


@pytest.mark.parametrize("batch_size", [64, 3])  # one batch; many batches (Chan merge)
def test_statistics_equal_direct_computation(decoder, batch_size):
    tokens = random_tokens(10, 12, seed=1)
    stats = collect_activation_stats(decoder, tokens, batch_size=batch_size)
    assert stats.n_tokens == tokens.numel()
    for site in ("mlp", "attn"):
        acts = cached(decoder, tokens, site)
        part = getattr(stats, site)
        for layer in range(decoder.cfg.n_layers):
            expected = direct_statistics(acts[layer])
            for name in STATISTICS:
                where = f"{site} layer {layer} {name}"
                torch.testing.assert_close(
                    part.statistic(name)[layer],
                    expected[name],
                    atol=1e-6,
                    rtol=1e-6,
                    msg=lambda m, where=where: f"{where}: {m}",
                )


def test_std_is_a_standard_deviation_not_a_variance():
    stats = NeuronStats.zeros(1, (3,))
    x = torch.tensor([[0.0, 1.0, -4.0], [4.0, 1.0, 4.0], [8.0, 1.0, 0.0]])
    stats.update(0, x)
    std = stats.std[0]
    torch.testing.assert_close(std, x.double().std(0, correction=0))
    assert std[0] == pytest.approx((32 / 3) ** 0.5)  # variance would be 10.67
    assert std[1] == 0.0
    torch.testing.assert_close(stats.var[0], std.square())


def test_chan_merge_equals_one_pass_and_is_order_free():
    generator = torch.Generator().manual_seed(0)
    x = 3.0 + 2.0 * torch.randn(1000, 5, generator=generator, dtype=torch.float64)
    whole = NeuronStats.zeros(1, (5,))
    whole.update(0, x)
    parts = []
    for chunk in torch.split(x, [1, 7, 300, 2, 690]):
        part = NeuronStats.zeros(1, (5,))
        part.update(0, chunk)
        parts.append(part)
    merged = parts[0]
    for part in parts[1:]:
        merged = merged.merge(part)
    reverse = parts[-1]
    for part in reversed(parts[:-1]):
        reverse = reverse.merge(part)
    expected = direct_statistics(x)
    for name in STATISTICS:
        for candidate in (whole, merged, reverse):
            torch.testing.assert_close(
                candidate.statistic(name)[0], expected[name], atol=1e-10, rtol=1e-10
            )
    # merging with empty statistics changes nothing
    empty = NeuronStats.zeros(1, (5,))
    torch.testing.assert_close(empty.merge(whole).std, whole.std)


def test_large_offset_does_not_lose_the_variance():
    # float32 activations far from zero: the centred pass keeps the small spread exact
    x = (1000.0 + torch.tensor([[0.5], [-0.5], [0.25], [-0.25]])).float()
    stats = NeuronStats.zeros(1, (1,))
    stats.update(0, x)
    assert float(stats.std[0, 0]) == pytest.approx(x.double().std(correction=0).item(), rel=1e-6)


def test_merge_of_collections_equals_one_collection(decoder):
    tokens = random_tokens(8, 10, seed=2)
    one = collect_activation_stats(decoder, tokens, batch_size=8)
    halves = collect_activation_stats(decoder, tokens[:3], batch_size=2).merge(
        collect_activation_stats(decoder, tokens[3:], batch_size=4)
    )
    for site in ("mlp", "attn"):
        for name in STATISTICS:
            torch.testing.assert_close(
                getattr(halves, site).statistic(name),
                getattr(one, site).statistic(name),
                atol=1e-6,
                rtol=1e-6,
            )


def test_padding_is_excluded(decoder):
    # right-padded windows of different lengths against each sequence run alone, unpadded
    lengths = [12, 5, 9, 1]
    tokens = random_tokens(len(lengths), 12, seed=3)
    mask = torch.arange(12)[None, :] < torch.tensor(lengths)[:, None]
    padded = tokens.masked_fill(~mask, 0)
    with_mask = collect_activation_stats(decoder, padded, mask, batch_size=4)
    alone = None
    for row, length in zip(tokens, lengths, strict=True):
        part = collect_activation_stats(decoder, row[None, :length], batch_size=1)
        alone = part if alone is None else alone.merge(part)
    assert with_mask.n_tokens == sum(lengths)
    for site in ("mlp", "attn"):
        acts = cached(decoder, padded, site, mask)
        for name in STATISTICS:
            ours = getattr(with_mask, site).statistic(name)
            separately = getattr(alone, site).statistic(name)
            torch.testing.assert_close(ours, separately, atol=1e-5, rtol=1e-5)
            for layer in range(decoder.cfg.n_layers):
                torch.testing.assert_close(
                    ours[layer], direct_statistics(acts[layer])[name], atol=1e-6, rtol=1e-6
                )


def test_collection_skips_final_norm_and_unembedding(decoder, monkeypatch):
    calls = []
    for module in (decoder.unembed, decoder.ln_final):
        monkeypatch.setattr(module, "forward", lambda *a, **k: calls.append(1))
    collect_activation_stats(decoder, random_tokens(2, 6), batch_size=2)
    assert calls == []


def test_memory_does_not_grow_with_tokens(decoder):
    small = collect_activation_stats(decoder, random_tokens(1, 4), batch_size=1)
    large = collect_activation_stats(decoder, random_tokens(40, 16), batch_size=5)
    assert large.n_tokens == 640
    assert {k: v.shape for k, v in small.state_dict().items()} == {
        k: v.shape for k, v in large.state_dict().items()
    }


def test_sites_state_dict_roundtrip_and_shapes(decoder):
    cfg = decoder.cfg
    stats = collect_activation_stats(decoder, random_tokens(2, 5), sites=("attn",))
    assert stats.mlp is None
    assert stats.attn.shape == (cfg.n_layers, cfg.n_heads, cfg.d_head)
    back = ActivationStats.from_state_dict(stats.state_dict())
    torch.testing.assert_close(back.attn.rms, stats.attn.rms)
    assert back.mlp is None
    with pytest.raises(ConfigError):
        stats.merge(collect_activation_stats(decoder, random_tokens(2, 5), sites=("mlp",)))


def test_bad_input_is_reported(decoder):
    with pytest.raises(ConfigError):
        collect_activation_stats(decoder, random_tokens(2, 5), sites=("resid",))
    with pytest.raises(DataError):
        collect_activation_stats(decoder, random_tokens(2, 5)[0])
    with pytest.raises(DataError):
        collect_activation_stats(decoder, random_tokens(2, 5), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ConfigError):
        NeuronStats.zeros(1, (2,)).statistic("variance")


def test_float64_and_bfloat16_activations():
    stats = NeuronStats.zeros(1, (4,))
    x = torch.randn(50, 4, dtype=torch.float64)
    stats.update(0, x.to(torch.bfloat16))
    expected = direct_statistics(x.to(torch.bfloat16).double())
    torch.testing.assert_close(stats.mean[0], expected["mean"], atol=1e-6, rtol=1e-6)


def test_statistics_see_the_pruned_model_when_masks_are_given(decoder):
    from mi_core.interventions.neurons import PruneMasks

    cfg = decoder.cfg
    masks = PruneMasks.empty(decoder)
    ff = torch.zeros(cfg.n_layers, cfg.d_mlp, dtype=torch.bool)
    ff[0, :5] = True
    attn = torch.zeros(cfg.n_layers, cfg.n_heads, cfg.d_head, dtype=torch.bool)
    attn[1, 2, :3] = True
    fills = torch.full((cfg.n_layers, cfg.n_heads, cfg.d_head), 0.75)
    masks.prune(1, ff, attn, attn_fill=fills)
    stats = collect_activation_stats(decoder, random_tokens(3, 8), fwd_hooks=masks.hooks(decoder))
    assert stats.mlp.mean_abs[0, :5].abs().max() == 0 and stats.mlp.mean_abs[0, 5:].min() > 0
    torch.testing.assert_close(
        stats.attn.mean[1, 2, :3], torch.full((3,), 0.75, dtype=torch.float64)
    )
    assert stats.attn.std[1, 2, :3].max() < 1e-6 and stats.attn.std[1, 2, 3:].min() > 0
