"""Masks as hooks on tiny random TL encoders and decoders: identity, mean/zero fill, gradients."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformer_lens import HookedEncoder, HookedTransformer, HookedTransformerConfig

from mi_core.errors import InterventionError
from mi_core.interventions import (
    ComponentMask,
    ComponentMeans,
    Fill,
    ablate,
    compute_means,
    mask_hooks,
)

N_LAYERS, N_HEADS, D_HEAD, VOCAB = 3, 4, 8, 60


def _tiny(kind: str):
    cfg = HookedTransformerConfig(
        n_layers=N_LAYERS,
        d_model=N_HEADS * D_HEAD,
        n_ctx=24,
        d_head=D_HEAD,
        n_heads=N_HEADS,
        d_mlp=64,
        d_vocab=VOCAB,
        act_fn="gelu",
        normalization_type="LN",
        seed=0,
        attention_dir="bidirectional" if kind == "encoder" else "causal",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = HookedEncoder(cfg) if kind == "encoder" else HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # HookedEncoder leaves its weights uninitialised
        for name, p in model.named_parameters():
            if name.endswith(".w"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() > 1 else 0.1))
    return model.eval()


@pytest.fixture(scope="module", params=["encoder", "decoder"])
def tiny(request):
    """(kind, model, tokens, attention mask, means) with right padding in the batch."""
    model = _tiny(request.param)
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(1, VOCAB, (5, 12), generator=gen)
    mask = torch.ones_like(tokens)
    mask[1, 9:] = 0
    mask[3, 5:] = 0
    means = compute_means(model, [{"input_ids": tokens, "attention_mask": mask}], dataset="toy")
    return request.param, model, tokens, mask, means


def _forward(kind, model, tokens, mask, **kwargs):
    if kind == "encoder":
        return model(tokens, one_zero_attention_mask=mask, **kwargs)
    return model(tokens, attention_mask=mask, **kwargs)


def _cache(kind, model, tokens, mask):
    if kind == "encoder":
        return model.run_with_cache(tokens, one_zero_attention_mask=mask)
    return model.run_with_cache(tokens, attention_mask=mask)


def test_all_ones_mask_changes_nothing(tiny):
    kind, model, tokens, mask, means = tiny
    clean = _forward(kind, model, tokens, mask)
    ones = ComponentMask.ones(model)
    for skip in (True, False):  # with and without hooks on unmasked layers
        with ablate(model, ones, means, skip_unmasked=skip):
            assert torch.allclose(_forward(kind, model, tokens, mask), clean, atol=1e-6, rtol=0)
        with ablate(model, ones, fill="zero", skip_unmasked=skip):
            assert torch.allclose(_forward(kind, model, tokens, mask), clean, atol=1e-6, rtol=0)


def test_mean_ablated_head_outputs_its_mean_everywhere(tiny):
    kind, model, tokens, mask, means = tiny
    _, clean = _cache(kind, model, tokens, mask)
    with ablate(model, ComponentMask.from_removed(model, "L1.H2"), means):
        _, cache = _cache(kind, model, tokens, mask)
    z = cache["blocks.1.attn.hook_z"]
    expected = means.z[1, 2].float().expand(z.shape[0], z.shape[1], D_HEAD)
    assert torch.equal(z[:, :, 2], expected)  # every position, padding included
    # the other heads of the layer, and the layers before, are untouched
    assert torch.equal(z[:, :, [0, 1, 3]], clean["blocks.1.attn.hook_z"][:, :, [0, 1, 3]])
    assert torch.equal(cache["blocks.0.attn.hook_z"], clean["blocks.0.attn.hook_z"])
    assert not torch.allclose(cache["blocks.2.attn.hook_z"], clean["blocks.2.attn.hook_z"])


def test_mlp_ablation_fills_hook_mlp_out(tiny):
    kind, model, tokens, mask, means = tiny
    with ablate(model, ComponentMask.from_removed(model, "L0.MLP"), means):
        _, cache = _cache(kind, model, tokens, mask)
    out = cache["blocks.0.hook_mlp_out"]
    assert torch.equal(out, means.mlp_out[0].float().expand_as(out))
    with ablate(model, ComponentMask.from_removed(model, "L0.MLP"), fill="zero"):
        _, cache = _cache(kind, model, tokens, mask)
    assert torch.equal(cache["blocks.0.hook_mlp_out"], torch.zeros_like(out))


def test_partial_values_interpolate(tiny):
    kind, model, tokens, mask, means = tiny
    _, clean = _cache(kind, model, tokens, mask)
    heads = torch.ones(N_LAYERS, N_HEADS)
    heads[0, 1] = 0.25
    with ablate(model, ComponentMask(heads, torch.ones(N_LAYERS)), means):
        _, cache = _cache(kind, model, tokens, mask)
    x = clean["blocks.0.attn.hook_z"][:, :, 1]
    want = 0.25 * x + 0.75 * means.z[0, 1].float()
    assert torch.allclose(cache["blocks.0.attn.hook_z"][:, :, 1], want, atol=1e-6)


def test_masks_commute_with_run_with_cache(tiny):
    kind, model, tokens, mask, means = tiny
    component_mask = ComponentMask.from_removed(model, "L0.H3,L2.H0,L1.MLP")
    hooks = mask_hooks(model, component_mask, means)
    kwargs = {"one_zero_attention_mask": mask} if kind == "encoder" else {"attention_mask": mask}
    via_hooks = model.run_with_hooks(tokens, fwd_hooks=hooks, **kwargs)
    with ablate(model, component_mask, means):
        logits, cache = _cache(kind, model, tokens, mask)
    assert torch.allclose(logits, via_hooks, atol=1e-6, rtol=0)
    # a hook added *before* the mask (outer context) still sees the ablated activation
    seen = {}
    save = lambda x, hook: seen.__setitem__(hook.name, x.clone())
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", save)]):
        with ablate(model, component_mask, means):
            _forward(kind, model, tokens, mask)
    assert torch.equal(seen["blocks.0.attn.hook_z"], cache["blocks.0.attn.hook_z"])
    # leaving the context removes exactly the mask's hooks
    assert not any(hp.fwd_hooks for hp in model.hook_points())


def test_zero_and_mean_ablation_differ(tiny):
    kind, model, tokens, mask, means = tiny
    component_mask = ComponentMask.from_removed(model, "L1.H0,L1.H1")
    clean = _forward(kind, model, tokens, mask)
    with ablate(model, component_mask, means, Fill.MEAN):
        mean_logits = _forward(kind, model, tokens, mask)
    with ablate(model, component_mask, fill="zero"):
        zero_logits = _forward(kind, model, tokens, mask)
    assert (mean_logits - zero_logits).abs().max() > 1e-3
    assert (mean_logits - clean).abs().max() > 1e-3


def test_only_masked_layers_get_hooks(tiny):
    _, model, _, _, means = tiny
    with ablate(model, ComponentMask.from_removed(model, "L1.H2,L2.MLP"), means):
        hooked = sorted(name for name, hp in model.hook_dict.items() if hp.fwd_hooks)
    assert hooked == ["blocks.1.attn.hook_z", "blocks.2.hook_mlp_out"]
    requires_grad = ComponentMask(
        torch.ones(N_LAYERS, N_HEADS, requires_grad=True), torch.ones(N_LAYERS)
    )
    names = [name for name, _ in mask_hooks(model, requires_grad, means)]
    assert names == [f"blocks.{l}.attn.hook_z" for l in range(N_LAYERS)]


def test_gradients_reach_the_mask(tiny):
    kind, model, tokens, mask, means = tiny
    heads = torch.full((N_LAYERS, N_HEADS), 0.6, requires_grad=True)
    mlps = torch.full((N_LAYERS,), 0.6, requires_grad=True)
    component_mask = ComponentMask(heads, mlps)
    with ablate(model, component_mask, means):
        _forward(kind, model, tokens, mask).pow(2).mean().backward()
        assert heads.grad is not None and (heads.grad != 0).all()
        assert mlps.grad is not None and (mlps.grad != 0).all()
        # a pruning loop assigns a fresh sample each step; the hooks read it at call time
        log_alpha = torch.zeros(N_LAYERS, N_HEADS, requires_grad=True)
        component_mask.heads = torch.sigmoid(log_alpha)
        _forward(kind, model, tokens, mask).pow(2).mean().backward()
        assert log_alpha.grad is not None and (log_alpha.grad != 0).all()


def test_every_unit_fill_option_offers_the_fills_ablate_takes():
    """The ``fill`` options of the jobs that remove units (prune, eval, ablate, separability,
    heuristic-core) offer ``UNIT_FILLS``: the values of :class:`Fill`, and the edge fills but
    ``corrupted``."""
    from mi_core.evaluation.config import EvalConfig
    from mi_core.interventions.config import FILLS, UNIT_FILLS, AblationTableConfig
    from mi_core.methods.separability.config import SeparabilityConfig
    from mi_core.pruning.profiles import PruneConfig

    assert UNIT_FILLS == tuple(f.value for f in Fill)
    assert set(FILLS) - set(UNIT_FILLS) == {"corrupted"}
    for config, names in (
        (PruneConfig, ["fill"]),
        (EvalConfig, ["fill"]),
        (AblationTableConfig, ["fill"]),
        (SeparabilityConfig, ["ff_fill", "attn_fill", "fill"]),
    ):
        for name in names:
            assert config.__dataclass_fields__[name].metadata["choices"] == UNIT_FILLS


def test_bad_inputs(tiny):
    _, model, _, _, means = tiny
    with pytest.raises(InterventionError, match="mean ablation needs means"):
        ablate(model, ComponentMask.ones(model)).__enter__()
    wrong = ComponentMask(torch.ones(N_LAYERS + 1, N_HEADS), torch.ones(N_LAYERS + 1))
    with pytest.raises(InterventionError, match="does not fit a model with 3 layers x 4 heads"):
        ablate(model, wrong, means).__enter__()
    with pytest.raises(InterventionError, match="unknown fill 'resample'"):
        ablate(model, ComponentMask.ones(model), means, "resample").__enter__()
    other = ComponentMeans(
        z=torch.zeros(N_LAYERS, N_HEADS, D_HEAD + 1),
        mlp_out=torch.zeros(N_LAYERS, 32),
        model_name="other",
        fingerprint="0",
    )
    with pytest.raises(InterventionError, match="compute means for this model"):
        ablate(model, ComponentMask.ones(model), other).__enter__()
    assert not any(hp.fwd_hooks for hp in model.hook_points())
