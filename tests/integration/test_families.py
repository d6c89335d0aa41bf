"""Every model family of the table (mi_core.models.families.FAMILIES), each on its tiny random
checkpoint: the guarantees mi_core gives on GPT-2, OPT and Llama, family by family.

Logits against Hugging Face's (padding and an attention mask), the TransformerLens string API,
fast paths that never change a result, node masks against weight edits, separability's
statistics against a cache read by hand, circuit graphs that are exact where the family's
wiring is exact (parallel blocks have no edge from a layer's heads to its own MLP), EAP
against the split-input gradients, EAP-IG and edge pruning runs, and decoder classifiers
against Hugging Face's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from helpers import (
    SAME_ALGEBRA_FLOAT64,
    assert_float32_close,
    random_prompt_pairs,
    random_tokens,
    split_input_scores,
)

from mi_core.circuits import (
    EdgePruneSettings,
    Graph,
    edge_attribution,
    graph_error,
    prune_edges,
    to_mib,
)
from mi_core.errors import ConfigError, InterventionError, ModelLoadError
from mi_core.interventions import ComponentMask, ablate, compute_means
from mi_core.interventions.edges import EdgeMask, graph_switches, reference_hooks
from mi_core.interventions.edges.graph import reads_unnormed_stream
from mi_core.models import load_model
from mi_core.models.families import FAMILIES, family, family_of_model
from mi_core.models.loading import load_hf_causal_lm, load_hf_classifier
from mi_core.statistics import collect_activation_stats

pytestmark = pytest.mark.usefixtures("one_thread")

LM_KINDS = [f"{f.name}-lm" for f in FAMILIES if f.causal_lm]
CLS_KINDS = [f"{f.name}-cls" for f in FAMILIES if f.classifier and not f.encoder]
#: Families whose every sublayer output is added to the residual stream as it is: a graph
#: whose edges are exact, all kept or all removed.
GRAPH_KINDS = [f"{f.name}-lm" for f in FAMILIES if f.causal_lm and f.graph is not None]


@pytest.fixture(scope="module")
def lms(tiny_checkpoints):
    """Loaded tiny LMs by kind, each loaded once for the module."""

    class Loaded(dict):
        def __missing__(self, kind):
            self[kind] = model = load_model(tiny_checkpoints[kind])
            return model

    return Loaded()


def _same_algebra(tiny_checkpoints, kind: str, **options) -> tuple[torch.nn.Module, Any]:
    """The model of ``kind`` for comparing two computations of the same algebra, and the
    check: float64 and SAME_ALGEBRA_FLOAT64 (tests/README.md), except for mixtures of experts,
    whose TransformerLens router runs in float32 only (its softmax casts to float32), compared
    with assert_float32_close."""
    moe = family(kind.removesuffix("-lm")).moe
    dtype = torch.float32 if moe else torch.float64
    model = load_model(tiny_checkpoints[kind], dtype=dtype, **options)
    if moe:
        return model, assert_float32_close
    return model, lambda got, expected: torch.testing.assert_close(
        got, expected, **SAME_ALGEBRA_FLOAT64
    )


def _padded(n: int = 3, pos: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    ids = random_tokens(n, pos, seed=0, low=1000, high=2000)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # one right-padded row
    return ids, mask


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("kind", LM_KINDS)
def test_logprobs_equal_hugging_face_with_padding(tiny_checkpoints, lms, kind, side):
    """Every parameter of the tiny checkpoints is random (biases, norm gains, sinks), as a
    trained model's are. Left padding: Hugging Face is given the positions TransformerLens
    counts from each row's first real token (BLOOM's ALiBi takes them from the mask)."""
    import inspect

    model = lms[kind]
    hf, _ = load_hf_causal_lm(tiny_checkpoints[kind])
    ids, mask = _padded()
    if side == "left":
        mask = torch.ones_like(ids)
        mask[1, :4] = 0
    options = {}
    if "position_ids" in inspect.signature(hf.forward).parameters:
        options["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask).log_softmax(-1)
        theirs = hf(ids, attention_mask=mask, **options).logits.log_softmax(-1)
    real = mask.bool()
    assert (ours - theirs)[real].abs().max().item() < 1e-4
    assert family_of_model(model).causal_lm == hf.config.architectures[0]


@pytest.mark.parametrize("kind", LM_KINDS)
def test_the_transformer_lens_string_api_works(lms, kind):
    model = lms[kind]
    tokens = model.to_tokens("the cat sat")
    words = model.to_str_tokens("the cat sat")
    assert words == [model.tokenizer.decode([t]) for t in tokens[0].tolist()]
    assert "".join(words).replace(" ", "").find("thecatsat") >= 0
    logits, cache = model.run_with_cache("the cat sat")
    assert logits.shape == (*tokens.shape, model.cfg.d_vocab) and "blocks.2.attn.hook_z" in cache
    text = model.generate(
        "the cat", max_new_tokens=2, do_sample=False, verbose=False, stop_at_eos=False
    )
    assert text.replace(" ", "").startswith("thecat")  # Qwen2's test tokenizer adds no spaces
    assert len(model.to_tokens(text, prepend_bos=False)[0]) > 3


@pytest.mark.parametrize("kind", LM_KINDS)
def test_fast_paths_give_transformer_lens_values(tiny_checkpoints, kind):
    """Each family takes the fused forward only where it is exact; either way the values are
    TransformerLens's (with and without a padding mask). In float64, as two computations of
    the same algebra are compared (tests/README.md)."""
    fast, close = _same_algebra(tiny_checkpoints, kind)
    plain, _ = _same_algebra(tiny_checkpoints, kind, fast_paths=False)
    ids, mask = _padded()
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            close(fast(ids, **kwargs), plain(ids, **kwargs))


@pytest.mark.parametrize("kind", LM_KINDS)
def test_mlp_masks_remove_the_output_and_mean_fills_write_the_means(tiny_checkpoints, kind):
    """An MLP masked with the zero fill is its output removed; the mean fill writes the
    recorded means into ``hook_z`` and ``hook_mlp_out`` (heads against Hugging Face: below)."""
    model, close = _same_algebra(tiny_checkpoints, kind)
    ids, mask = _padded()
    removed = ComponentMask.from_removed(model, ["L1.H2", "L2.MLP"])
    only_mlp = ComponentMask.from_removed(model, ["L2.MLP"])
    with torch.no_grad(), ablate(model, only_mlp, fill="zero"):
        masked = model(ids, attention_mask=mask)

    def no_mlp(x, hook):
        return torch.zeros_like(x)

    with torch.no_grad():
        by_hand = model.run_with_hooks(
            ids, attention_mask=mask, fwd_hooks=[("blocks.2.hook_mlp_out", no_mlp)]
        )
    close(masked, by_hand)
    assert (masked - model(ids, attention_mask=mask)).abs().max() > 1e-3
    means = compute_means(model, [{"input_ids": ids, "attention_mask": mask}])
    with torch.no_grad(), ablate(model, removed, means, fill="mean"):
        _, cache = model.run_with_cache(ids, attention_mask=mask)
    z, out = cache["blocks.1.attn.hook_z"][:, :, 2], cache["blocks.2.hook_mlp_out"]
    torch.testing.assert_close(z, means.z[1, 2].to(z.dtype).expand(3, 11, -1))
    torch.testing.assert_close(out, means.mlp_out[2].to(out.dtype).expand(3, 11, -1))


def _model_and_hf_runs(tiny_checkpoints, kind: str, **options):
    """``kind``'s model as load_model loads it (value biases folded where it folds them),
    Hugging Face's model, their inputs, and two functions that run each and return what is
    compared: log-probabilities at the real tokens (LMs), class logits (classifiers)."""
    path = tiny_checkpoints[kind]
    model = load_model(path, **options)
    if kind.endswith("-lm"):
        hf, _ = load_hf_causal_lm(path)
        ids, mask = _padded()
        inputs = {"input_ids": ids, "attention_mask": mask}
        real = mask.bool()

        def ours():
            return model(ids, attention_mask=mask).log_softmax(-1)[real]

        def theirs():
            return hf(**inputs).logits.log_softmax(-1)[real]

        return model, hf, inputs, ours, theirs
    hf, tokenizer, _ = load_hf_classifier(path)
    batch = tokenizer(
        ["the cat sat on the mat", "a man plays"], ["a cat sat", "nobody plays"],
        padding=True, return_tensors="pt", return_token_type_ids=kind == "bert-cls",
    )  # fmt: skip
    inputs = dict(batch)
    return model, hf, inputs, lambda: model(**inputs), lambda: hf(**inputs).logits


@pytest.mark.parametrize("kind", [*LM_KINDS, *CLS_KINDS, "bert-cls", "roberta-cls"])
def test_zero_and_mean_head_ablation_equal_the_hugging_face_edit(tiny_checkpoints, kind):
    """A head removed with the zero fill writes nothing: Hugging Face with the head's slice of
    its output projection's input set to zero, whatever mi_core folded (the value biases of
    GPT-2, OPT, GPT-NeoX, GPT-J, GPT-Neo, Qwen2, Phi and BLOOM are folded out of ``hook_z``
    by default). The mean fill: that slice set to its mean over the same tokens."""
    from helpers import hf_head_means, hf_with_heads_replaced

    model, hf, inputs, ours, theirs = _model_and_hf_runs(tiny_checkpoints, kind)
    d_head = model.cfg.d_head
    removed = ComponentMask.from_removed(model, ["L1.H2"])
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        full = ours()
        with ablate(model, removed, fill="zero"):
            zero = ours()
        with hf_with_heads_replaced(hf, d_head, {(1, 2): None}):
            expected_zero = theirs()
        means = compute_means(model, [inputs])
        with ablate(model, removed, means, fill="mean"):
            mean = ours()
        head_mean = hf_head_means(hf, d_head, real, **inputs)[1, 2]
        with hf_with_heads_replaced(hf, d_head, {(1, 2): head_mean}):
            expected_mean = theirs()
    assert (zero - expected_zero).abs().max().item() < 1e-4
    assert (mean - expected_mean).abs().max().item() < 1e-4
    assert (zero - full).abs().max() > 1e-3 and (zero - mean).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["qwen2-lm", "phi-lm", "gpt-neox-lm"])
def test_every_zero_fill_removes_a_head_whatever_the_folding(tiny_checkpoints, kind):
    """On families with value biases, what a zero-filled head writes is nothing in every
    intervention: the ablation table, edge masks (the fused engine and the plain reference),
    EAP's zero baseline and separability's attention neurons give the same numbers with the
    biases folded into b_O (the default) and kept in hook_z."""
    from helpers import hf_with_heads_replaced

    from mi_core.circuits import exact_patching
    from mi_core.interventions.ablation_table import ablation_logits
    from mi_core.interventions.neurons import PruneMasks, zero_pruned_weights
    from mi_core.naming import Component
    from mi_core.tasks import NEXT_TOKEN

    path = tiny_checkpoints[kind]
    folded, kept = load_model(path), load_model(path, fold_value_biases=False)
    assert folded.value_biases_folded and not kept.value_biases_folded
    ids, mask = _padded()
    hf, _ = load_hf_causal_lm(path)
    with torch.no_grad(), hf_with_heads_replaced(hf, folded.cfg.d_head, {(1, 2): None}):
        no_head = hf(ids).logits.log_softmax(-1)  # TL centres the unembedding: log-probs
    close = {"atol": 1e-4, "rtol": 1e-4}

    # the ablation table of an answer model (the last token's logits)
    tables = []
    for model in (
        load_model(path, task=NEXT_TOKEN),
        load_model(path, task=NEXT_TOKEN, fold_value_biases=False),
    ):
        table = ablation_logits(model, [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}],
                                [Component(1, 2)], fill="zero")  # fmt: skip
        tables.append(table.singles[Component(1, 2)].log_softmax(-1))
    torch.testing.assert_close(tables[0], no_head[:, -1], **close)
    torch.testing.assert_close(tables[1], no_head[:, -1], **close)

    # edge masks: every edge out of L1.H2 removed, zero fill, fused and reference forwards
    graph = Graph.from_model(folded)
    sender = graph.head_sender(1, 2)
    weights = (graph.edges[:, 0] != sender).float()
    edge_mask = EdgeMask(graph, weights, "zero")
    for model in (folded, kept):
        for build in (edge_mask.hooks, lambda m: reference_hooks(m, edge_mask)):
            with torch.no_grad(), graph_switches(model), model.hooks(fwd_hooks=build(model)):
                torch.testing.assert_close(model(ids).log_softmax(-1), no_head, **close)

    # EAP with the zero baseline, and exact patching of a few edges with it
    pairs = random_prompt_pairs(4, 6, high=2000)
    scores = [edge_attribution(m, graph, pairs, fill="zero") for m in (folded, kept)]
    torch.testing.assert_close(scores[0], scores[1], atol=1e-5 * float(scores[1].abs().max()),
                               rtol=1e-4)  # fmt: skip
    some = [graph.edge_index("L1.H2->output"), graph.edge_index("L0.H1->L2.MLP")]
    exact = [exact_patching(m, graph, pairs, edges=some, fill="zero")[some] for m in (folded, kept)]
    torch.testing.assert_close(exact[0], exact[1], **close)

    # separability's attention pre-out neurons (zero fill), by hooks and by weight edits
    masks = PruneMasks.empty(folded)
    masks.attn_step[1, 2] = 1
    for model in (folded, kept):
        with torch.no_grad(), model.hooks(fwd_hooks=masks.hooks(model)):
            torch.testing.assert_close(model(ids).log_softmax(-1), no_head, **close)
    edited = zero_pruned_weights(load_model(path), masks)
    with torch.no_grad():
        torch.testing.assert_close(edited(ids).log_softmax(-1), no_head, **close)


def test_gpt_oss_keeps_its_value_biases_where_sinks_take_attention(tiny_checkpoints):
    """Folding a value bias into b_O assumes each attention row sums to one; GPT-OSS's sinks
    take part of it, so its value biases are never folded (log-probabilities: the test above
    with padding on both sides), and asking for the fold is refused."""
    path = tiny_checkpoints["gpt-oss-lm"]
    model = load_model(path)
    assert not model.value_biases_folded and (model.blocks[0].attn.b_V != 0).any()
    with pytest.raises(ConfigError, match="sinks.*fold_value_biases=False"):
        load_model(path, fold_value_biases=True)


@pytest.mark.parametrize("kind", LM_KINDS)
def test_separability_statistics_are_the_cache_read_by_hand(lms, kind):
    model = lms[kind]
    ids, mask = _padded()
    real = mask.bool()
    if family_of_model(model).moe:
        with pytest.raises(ConfigError, match="mixture-of-experts"):
            collect_activation_stats(model, ids, real)
        stats = collect_activation_stats(model, ids, real, sites=("attn",))
        assert stats.mlp is None and stats.attn is not None
        return
    stats = collect_activation_stats(model, ids, real)
    _, cache = model.run_with_cache(ids, attention_mask=mask)
    post = cache["blocks.1.mlp.hook_post"][real].double()  # gated or not: the MLP's neurons
    z = cache["blocks.2.attn.hook_z"][real].double()  # attention pre-out neurons
    assert stats.mlp is not None and stats.attn is not None
    # float32 activations, float64 sums: the two runs (padding mask or none) round apart
    close = {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(stats.mlp.running_mean[1], post.mean(0), **close)
    torch.testing.assert_close(stats.attn.running_mean[2], z.mean(0), **close)
    torch.testing.assert_close(stats.mlp.positive[1], (post > 0).double().sum(0))


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_edge_graphs_are_exact_and_the_fused_forward_is_the_reference(lms, kind):
    model = lms[kind]
    graph = Graph.from_model(model)
    family = family_of_model(model)
    assert graph.parallel == (family.graph == "parallel") and not graph.post_ln
    # OLMo-2 / 3: the heads' inputs are the split inputs themselves, with no norm before them
    assert reads_unnormed_stream(model) == (family.name in ("olmo2", "olmo3"))
    if family.graph == "post_norm_out":  # the norm's frozen scale leaves the weights as they were
        w_o = model.blocks[0].attn.W_O
        with graph_switches(model):
            assert model.blocks[0].attn.W_O is not w_o
        assert model.blocks[0].attn.W_O is w_o
    if graph.parallel:  # a layer's heads do not feed its own MLP
        assert graph.edge_index("L0.H1->L1.MLP") >= 0
        with pytest.raises(InterventionError, match="does not come before"):
            graph.edge_index("L1.H1->L1.MLP")
    else:
        assert graph.edge_index("L1.H1->L1.MLP") >= 0
    clean = {"input": random_tokens(3, 9, seed=0, low=1000, high=2000)}
    corrupted = {"input": random_tokens(3, 9, seed=1, low=1000, high=2000)}
    errors = graph_error(model, graph, clean, corrupted)
    assert errors["full"] < 1e-4 and errors["empty"] < 1e-4
    values = torch.rand(graph.n_edges, generator=torch.Generator().manual_seed(8))
    values[values < 0.3] = 0.0
    base = EdgeMask(graph, values, "corrupted").patching(model, **corrupted)
    results = []
    for reference in (True, False):
        weights = values.clone().requires_grad_(True)
        mask = EdgeMask(graph, weights, "corrupted", None, base.corrupted)
        with graph_switches(model):
            hooks = reference_hooks(model, mask) if reference else mask.hooks(model)
            with model.hooks(fwd_hooks=hooks):
                logits = model(**clean)
        (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
        results.append((logits.detach(), weights.grad))
    model.zero_grad(set_to_none=True)
    (expected, expected_grad), (got, grad) = results
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # float32 rounding: GPT-Neo's unscaled attention scores put the largest gap at 4e-6 of
    # the largest gradient; in float64 the two paths agree exactly
    scale = float(expected_grad.abs().max())
    torch.testing.assert_close(grad, expected_grad, atol=1e-5 * scale, rtol=1e-4)


def test_a_grouped_olmo2_equals_hugging_face(tiny_checkpoints, tmp_path):
    """OLMo-2 32B's kind: grouped keys and values, normalised across the key / value heads.
    TransformerLens's conversion split them into the query heads (its own error at load);
    mi_core converts them into their own heads. Its edge graph is refused: the key norm spans
    the grouped heads, so no query head has a key input of its own."""
    import transformers

    from mi_core.testing import randomise_parameters

    config = transformers.AutoConfig.from_pretrained(tiny_checkpoints["olmo2-lm"])
    config.num_key_value_heads = 2
    torch.manual_seed(1)
    hf = transformers.Olmo2ForCausalLM(config).eval()
    randomise_parameters(hf)
    hf.save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(tiny_checkpoints["olmo2-lm"]).save_pretrained(
        tmp_path
    )
    ids, right = _padded()
    left = torch.ones_like(ids)
    left[1, :4] = 0
    for options in ({}, {"fast_paths": False}):
        model = load_model(tmp_path, **options)
        assert model.cfg.n_key_value_heads == 2
        for mask in (right, left):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                ours = model(ids, attention_mask=mask).log_softmax(-1)
                theirs = hf(ids, attention_mask=mask, position_ids=positions).logits
            assert (ours - theirs.log_softmax(-1))[mask.bool()].abs().max().item() < 1e-4
    with pytest.raises(InterventionError, match="with grouped key / value heads: its key norm"):
        Graph.from_model(model)


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_eap_eap_ig_and_edge_pruning_run_on_every_family(lms, kind):
    """EAP equals the gradients TransformerLens's split inputs give, on each family's graph;
    EAP-IG and a short edge-pruning run reach their targets; the MIB export says whether the
    blocks are parallel."""
    model = lms[kind]
    graph = Graph.from_model(model)
    pairs = random_prompt_pairs(4, 6, high=2000)
    eap = edge_attribution(model, graph, pairs)
    expected = split_input_scores(model, graph, pairs)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(eap, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))
    ig = edge_attribution(model, graph, pairs, steps=2)
    assert torch.isfinite(ig).all() and not torch.equal(ig, eap)
    top = EdgeMask(graph, (eap.abs() >= eap.abs().median()).float())
    mib = to_mib(graph, eap, top, method="eap")
    assert mib["cfg"]["parallel_attn_mlp"] == graph.parallel
    assert json.loads(json.dumps(mib))["cfg"]["n_layers"] == 3
    config = EdgePruneSettings(sparsity=0.5, steps=4, sparsity_warmup_steps=2, batch_size=4)
    result = prune_edges(model, pairs, config, progress=False)
    assert result.circuit.n_kept == round(0.5 * graph.n_edges)
    # KL of a distribution with itself rounds to about -4e-8 at the first steps
    assert len(result.history) == 4 and all(h["kl"] > -1e-6 for h in result.history)


@pytest.mark.parametrize("kind", CLS_KINDS)
def test_decoder_classifiers_equal_hugging_face(tiny_checkpoints, kind):
    """Each family's ForSequenceClassification: logits of the last non-pad token, as
    Hugging Face pools, within 1e-4 (right padding)."""
    model = load_model(tiny_checkpoints[kind])
    hf, tokenizer, _ = load_hf_classifier(tiny_checkpoints[kind])
    batch = tokenizer(
        ["the cat sat on the mat", "a man plays"], ["a cat sat", "nobody plays"],
        padding=True, return_tensors="pt", return_token_type_ids=False,
    )  # fmt: skip
    assert (batch["attention_mask"] == 0).any()
    with torch.no_grad():
        theirs = hf(**batch).logits
        ours = model(**batch)
    assert ours.shape == (2, 3) and (ours - theirs).abs().max().item() < 1e-4


@pytest.mark.parametrize("kind", ["qwen2-lm", "gemma-lm", "gpt-neox-lm"])
def test_a_causal_lm_with_a_task_gets_a_seeded_head(tiny_checkpoints, kind):
    model = load_model(tiny_checkpoints[kind], task="mnli", seed=3)
    again = load_model(tiny_checkpoints[kind], task="mnli", seed=3)
    other = load_model(tiny_checkpoints[kind], task="mnli", seed=4)
    assert model.task == "mnli" and not model.head_from_checkpoint
    torch.testing.assert_close(model.head.score.weight, again.head.score.weight)
    assert not torch.equal(model.head.score.weight, other.head.score.weight)
    ids = random_tokens(2, 7, seed=0, low=1000, high=2000)
    assert model(input_ids=ids, attention_mask=torch.ones_like(ids)).shape == (2, 3)


def test_an_unsupported_family_names_the_supported_architectures(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]})
    )
    with pytest.raises(ModelLoadError, match="not supported; supported: .*Qwen2ForCausalLM"):
        load_model(tmp_path)


def test_the_docs_table_is_the_registry():
    """docs/models.md carries the families table as the registry makes it."""
    from helpers import REPO

    from mi_core.models.families import families_table

    assert families_table() in (REPO / "docs" / "models.md").read_text(encoding="utf-8")


def test_bfloat16_weights_keep_masks_scores_and_statistics_in_float32(tiny_checkpoints, lms):
    """A model loaded in bfloat16 (half the memory of float32) runs every method; what they
    compute from it stays float32 (EAP scores, edge-pruning gates) or float64 (means,
    statistics), and the EAP scores rank the edges as the float32 model's do."""
    from scipy.stats import spearmanr

    half = load_model(tiny_checkpoints["llama-lm"], dtype="bfloat16")
    full = lms["llama-lm"]
    ids, mask = _padded()
    with torch.no_grad():
        logits = half(ids, attention_mask=mask)
        assert logits.dtype == torch.bfloat16
        gap = logits.float().log_softmax(-1) - full(ids, attention_mask=mask).log_softmax(-1)
    assert 0 < gap[mask.bool()].abs().max() < 0.5  # bfloat16 rounding, no more
    removed = ComponentMask.from_removed(half, ["L1.H2", "L2.MLP"])
    means = compute_means(half, [{"input_ids": ids, "attention_mask": mask}])
    assert means.z.dtype == torch.float64
    with torch.no_grad(), ablate(half, removed, means, fill="mean"):
        assert (half(ids, attention_mask=mask) - logits).abs().max() > 0
    stats = collect_activation_stats(half, ids, mask.bool())
    assert stats.mlp is not None and stats.mlp.running_mean.dtype == torch.float64
    graph = Graph.from_model(half)
    pairs = random_prompt_pairs(4, 6, high=2000)
    scores = edge_attribution(half, graph, pairs)
    assert scores.dtype == torch.float32
    rho = spearmanr(scores.numpy(), edge_attribution(full, graph, pairs).numpy()).statistic
    assert rho > 0.9
    config = EdgePruneSettings(sparsity=0.5, steps=2, sparsity_warmup_steps=1, batch_size=4)
    assert prune_edges(half, pairs, config, progress=False).log_alpha.dtype == torch.float32


def test_a_split_over_devices_this_machine_lacks_is_one_clear_error(tiny_checkpoints):
    with pytest.raises(ModelLoadError, match="n_devices=2 splits the model over 2 CUDA devices"):
        load_model(tiny_checkpoints["llama-lm"], n_devices=2)
    with pytest.raises(ModelLoadError, match="splits causal language models"):
        load_model(tiny_checkpoints["llama-cls"], n_devices=2)
    with pytest.raises(ConfigError, match="n_devices must be a positive integer"):
        load_model(tiny_checkpoints["llama-lm"], n_devices=0)


def test_jobs_that_read_large_models_take_their_weights_dtype_and_split():
    from mi_core.circuits.config import CircuitData
    from mi_core.devices import ModelPlacement
    from mi_core.evaluation.config import EvalConfig
    from mi_core.interventions.config import AblationTableConfig, MeansConfig
    from mi_core.methods.separability.config import SeparabilityConfig

    for job in (CircuitData, EvalConfig, AblationTableConfig, MeansConfig, SeparabilityConfig):
        assert issubclass(job, ModelPlacement)
    placement = ModelPlacement(device="cpu", weights="bfloat16")
    assert placement.load_options() == {"device": "cpu", "dtype": "bfloat16", "n_devices": 1}
    for bad in ({"weights": "int8"}, {"n_devices": 0}):
        with pytest.raises(ConfigError):
            ModelPlacement(device="cpu", **bad).validate()


def test_separability_on_a_mixture_of_experts_prunes_attention_neurons_only(tiny_checkpoints):
    from helpers import tasks

    from mi_core.methods.separability.run import SeparabilityConfig, run_separability

    model = load_model(tiny_checkpoints["mixtral-lm"], fold_value_biases=False)
    focus, cripple = tasks()
    with pytest.raises(ConfigError, match="no MLP neurons to score"):
        run_separability(model, focus, cripple, SeparabilityConfig(steps=1, batch_size=4))
    config = SeparabilityConfig(steps=2, ff_frac=0.0, attn_frac=0.1, batch_size=4)
    result = run_separability(model, focus, cripple, config)
    frame = result.run_frame()
    assert frame["ff_pruned"].tolist() == [0, 0, 0]
    assert frame["attn_pruned"].iloc[-1] > frame["attn_pruned"].iloc[0] == 0
