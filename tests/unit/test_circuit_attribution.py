"""EAP, EAP-IG and exact patching: against gradients taken by hand and against each other."""

from __future__ import annotations

import pytest
import torch
from helpers import random_prompt_pairs, random_tokens, split_input_scores, tiny_model
from scipy.stats import spearmanr

from mi_core.circuits import Graph, attribute, edge_attribution, exact_patching, logit_difference
from mi_core.circuits.attribution import ig_alphas
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError, DataError
from mi_core.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _lm_pairs(n: int = 8, pos: int = 6, high: int = 90) -> PromptPairs:
    return random_prompt_pairs(n, pos, high)


def _classifier_pairs(n: int = 4, pos: int = 7) -> PromptPairs:
    """Random NLI classifier pairs: clean / corrupted ids, answer classes, no distractor."""
    return PromptPairs(
        clean_ids=random_tokens(n, pos, seed=1, low=1000, high=2000),
        corrupted_ids=random_tokens(n, pos, seed=2, low=1000, high=2000),
        attention_mask=torch.ones(n, pos, dtype=torch.long),
        answer=torch.arange(n) % 3,
        distractor=torch.full((n,), -1),
        position=torch.zeros(n, dtype=torch.long),
        kind="classifier",
    )


def test_eap_is_gradient_times_difference_by_hand(gpt2):
    pairs = _lm_pairs()
    graph = Graph.from_model(gpt2)
    scores = edge_attribution(gpt2, graph, pairs)
    # by hand, edge L0.H1 -> L1.H2.v: (corrupted - clean output of L0.H1) . d metric / d v_input
    z_name = "blocks.0.attn.hook_z"
    _, corrupt = gpt2.run_with_cache(pairs.corrupted_ids, names_filter=z_name)
    _, clean = gpt2.run_with_cache(pairs.clean_ids, names_filter=z_name)
    w_o = gpt2.blocks[0].attn.W_O[1].detach()
    delta = (corrupt[z_name][:, :, 1] - clean[z_name][:, :, 1]) @ w_o
    kept = {}

    def keep(v_input, hook):
        v_input.retain_grad()
        kept["v"] = v_input

    gpt2.set_use_split_qkv_input(True)
    try:
        with gpt2.hooks(fwd_hooks=[("blocks.1.hook_v_input", keep)]):
            logit_difference(gpt2(pairs.clean_ids), pairs).mean().backward()
    finally:
        gpt2.set_use_split_qkv_input(False)
        gpt2.zero_grad(set_to_none=True)
    expected = float((delta * kept["v"].grad[:, :, 2]).sum())
    got = float(scores[graph.edge_index("L0.H1->L1.H2.v")])
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert abs(expected) > 1e-4


@pytest.mark.parametrize("rule", ["left", "right"])
def test_eap_ig_is_the_mean_gradient_at_its_rule_s_points_by_hand(gpt2, rule):
    """EAP-IG of L0.H1 -> L1.H2.v with 3 steps: the difference times the mean gradient at the
    inputs ``corrupted + alpha (clean - corrupted)``, alpha in {0, 1/3, 2/3} (left: the authors'
    code, the default) or {1/3, 2/3, 1} (right: the paper's sum)."""
    pairs = _lm_pairs()
    graph = Graph.from_model(gpt2)
    alphas = [0.0, 1 / 3, 2 / 3] if rule == "left" else [1 / 3, 2 / 3, 1.0]
    assert ig_alphas(3, rule) == pytest.approx(alphas)
    scores = edge_attribution(gpt2, graph, pairs, steps=3, ig_rule=rule)
    z_name, embed = "blocks.0.attn.hook_z", "blocks.0.hook_resid_pre"
    _, corrupt = gpt2.run_with_cache(pairs.corrupted_ids, names_filter=[z_name, embed])
    _, clean = gpt2.run_with_cache(pairs.clean_ids, names_filter=[z_name, embed])
    w_o = gpt2.blocks[0].attn.W_O[1].detach()
    delta = (corrupt[z_name][:, :, 1] - clean[z_name][:, :, 1]) @ w_o
    grads = []
    gpt2.set_use_split_qkv_input(True)
    try:
        for alpha in alphas:
            kept = {}

            def start(x, hook, alpha=alpha):
                return corrupt[embed] + alpha * (clean[embed] - corrupt[embed])

            def keep(v_input, hook, kept=kept):
                v_input.retain_grad()
                kept["v"] = v_input

            with gpt2.hooks(fwd_hooks=[(embed, start), ("blocks.1.hook_v_input", keep)]):
                logit_difference(gpt2(pairs.clean_ids), pairs).mean().backward()
            grads.append(kept["v"].grad[:, :, 2])
    finally:
        gpt2.set_use_split_qkv_input(False)
        gpt2.zero_grad(set_to_none=True)
    expected = float((delta * torch.stack(grads).mean(0)).sum())
    got = float(scores[graph.edge_index("L0.H1->L1.H2.v")])
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-7)
    other_rule = "right" if rule == "left" else "left"
    other = edge_attribution(gpt2, graph, pairs, steps=3, ig_rule=other_rule)
    assert abs(float(other[graph.edge_index("L0.H1->L1.H2.v")]) - expected) > 1e-3 * abs(expected)


def test_the_two_eap_ig_rules_on_an_encoder_differ_by_the_end_points(tiny_checkpoints):
    """Left minus right is (g(0) - g(1)) / steps . difference, so it halves from 2 to 4 steps:
    on the encoder path too, where the left rule records the clean run in a pass of its own."""
    model = load_model(tiny_checkpoints["bert-cls"], task="mnli")
    graph = Graph.from_model(model)
    pairs = _classifier_pairs()
    run = {
        (steps, rule): edge_attribution(model, graph, pairs, steps=steps, ig_rule=rule).double()
        for steps in (2, 4)
        for rule in ("left", "right")
    }
    two = run[2, "left"] - run[2, "right"]
    four = run[4, "left"] - run[4, "right"]
    assert two.abs().max() > 1e-3 * run[2, "right"].abs().max()
    torch.testing.assert_close(two, 2 * four, rtol=1e-4, atol=1e-6 * float(two.abs().max()))
    with pytest.raises(ConfigError, match="rule"):
        edge_attribution(model, graph, pairs, steps=2, ig_rule="midpoint")


def test_eap_on_a_post_ln_encoder_carries_the_difference_through_layer_norm(tiny_checkpoints):
    model = load_model(tiny_checkpoints["bert-cls"], task="mnli")
    graph = Graph.from_model(model)
    pairs = _classifier_pairs()
    scores = edge_attribution(model, graph, pairs)
    # by hand, edge L0.H1 -> L1.MLP: through ln1 and ln2 of layer 0 and ln1 of layer 1, each
    # with its clean scale frozen; the MLP's input gradient from its pre-activation's
    names = ["blocks.0.attn.hook_z", "blocks.0.ln1.hook_scale", "blocks.0.ln2.hook_scale",
             "blocks.1.ln1.hook_scale"]  # fmt: skip
    _, clean = model.run_with_cache(**pairs.clean, names_filter=lambda n: n in names)
    _, corrupt = model.run_with_cache(**pairs.corrupted, names_filter=lambda n: n in names)
    w_o = model.blocks[0].attn.W_O[1].detach()
    delta = (corrupt[names[0]][:, :, 1] - clean[names[0]][:, :, 1]) @ w_o
    for name, ln in zip(names[1:], [model.blocks[0].ln1, model.blocks[0].ln2,
                                    model.blocks[1].ln1], strict=True):  # fmt: skip
        delta = (delta - delta.mean(-1, keepdim=True)) / clean[name] * ln.w.detach()
    kept = {}

    def keep(pre, hook):
        pre.retain_grad()
        kept["pre"] = pre

    with model.hooks(fwd_hooks=[("blocks.1.mlp.hook_pre", keep)]):
        logit_difference(model(**pairs.clean), pairs).mean().backward()
    model.zero_grad(set_to_none=True)
    grad_in = kept["pre"].grad @ model.blocks[1].mlp.W_in.detach().T
    expected = float((delta * grad_in).sum())
    got = float(scores[graph.edge_index("L0.H1->L1.MLP")])
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert abs(expected) > 1e-5
    # and EAP ranks edges as exact patching does (reported in the notes)
    exact = exact_patching(model, graph, pairs)
    assert spearmanr(scores, exact).statistic > 0.6


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_eap_ranks_edges_as_exact_patching_does(kind):
    model = tiny_model(kind)
    pairs = _lm_pairs()
    graph = Graph.from_model(model)
    eap = edge_attribution(model, graph, pairs)
    exact = exact_patching(model, graph, pairs)
    rho = spearmanr(eap, exact).statistic
    # measured: 0.83 (GPT-2) and 0.65 (Llama) over all 110 edges, the near-zero ones included
    assert rho > 0.5


def test_eap_ig_with_one_step_is_eap_and_more_steps_change_it(gpt2):
    pairs = _lm_pairs()
    graph = Graph.from_model(gpt2)
    eap = edge_attribution(gpt2, graph, pairs)
    torch.testing.assert_close(edge_attribution(gpt2, graph, pairs, steps=1), eap)
    ig = edge_attribution(gpt2, graph, pairs, steps=4)
    assert (ig - eap).abs().max() > 1e-3


def test_attribute_averages_batches_and_refuses_bad_input(gpt2):
    pairs = _lm_pairs(n=8)
    whole = attribute(gpt2, pairs, method="eap", batch_size=8, progress=False)
    halves = attribute(gpt2, pairs, method="eap", batch_size=4, progress=False)
    torch.testing.assert_close(whole.scores, halves.scores, atol=1e-6, rtol=1e-4)
    assert whole.n_examples == 8 and len(whole.top(3)) == 3
    assert 0 < whole.circuit(10).n_kept <= 10  # connected: at most 10
    assert whole.circuit(10, connected=False).n_kept == 10
    with pytest.raises(ConfigError, match="unknown attribution method"):
        attribute(gpt2, pairs, method="acdc")
    with pytest.raises(DataError, match="corrupted set needs the same examples and lengths"):
        PromptPairs(
            pairs.clean_ids, pairs.corrupted_ids[:, :5], pairs.attention_mask, pairs.answer,
            pairs.distractor, pairs.position,
        )  # fmt: skip


@pytest.mark.parametrize("kind", ["gpt2", "llama", "opt-lm", "llama-lm"])
def test_decoder_eap_from_the_unsplit_forward_equals_split_input_gradients(kind, tiny_checkpoints):
    """The decoder EAP takes per-head input gradients by hand (through W_Q / W_K / W_V and
    the norm); they equal TransformerLens's split inputs' on every family (LayerNorm with and
    without bias, RMSNorm, grouped-query attention)."""
    model = tiny_model(kind) if kind in ("gpt2", "llama") else load_model(tiny_checkpoints[kind])
    pairs = _lm_pairs(high=90 if kind in ("gpt2", "llama") else 2000)
    graph = Graph.from_model(model)
    got = edge_attribution(model, graph, pairs)
    expected = split_input_scores(model, graph, pairs)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6 * float(expected.abs().max()))
    assert not model.cfg.use_split_qkv_input  # the switches are restored


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize(("steps", "fill"), [(3, "corrupted"), (2, "mean"), (1, "zero")])
def test_decoder_eap_ig_and_every_fill_equal_the_split_input_path(steps, fill, kind):
    """EAP-IG and the mean / zero fills through the decoder path equal the generic path that
    reads TransformerLens's split per-head inputs, for RMSNorm with grouped key / value heads
    and LayerNorm, each with a gain (and shift) that is not 1 (and 0). In float64: the two
    paths sum in other orders, and in float32 each is within about 1e-6 of the largest score
    from the exact one (measured: 1.7e-7 and 1.8e-7 of 0.20), so their float32 difference is
    rounding."""
    from mi_core.circuits.attribution import _sweep_attribution, fill_outputs
    from mi_core.interventions import sender_means

    model = tiny_model(kind)
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for block in model.blocks:
            block.ln1.w.copy_(1 + 0.5 * torch.randn(block.ln1.w.shape, generator=gen))
            if hasattr(block.ln1, "b"):
                block.ln1.b.copy_(0.5 * torch.randn(block.ln1.b.shape, generator=gen))
    model.to(torch.float64)
    model.cfg.dtype = torch.float64
    pairs = _lm_pairs()
    graph = Graph.from_model(model)
    means = sender_means(model, graph, [pairs.clean]) if fill == "mean" else None
    got = edge_attribution(model, graph, pairs, steps=steps, fill=fill, means=means)
    reference = fill_outputs(model, graph, pairs, fill, means)
    expected = _sweep_attribution(
        model, graph, pairs, logit_difference, ig_alphas(steps), reference
    )
    model.zero_grad(set_to_none=True)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6 * float(expected.abs().max()))


def test_eap_ignores_use_attn_in(gpt2):
    pairs = _lm_pairs()
    graph = Graph.from_model(gpt2)
    plain = edge_attribution(gpt2, graph, pairs)
    gpt2.cfg.use_attn_in = True
    try:
        torch.testing.assert_close(edge_attribution(gpt2, graph, pairs), plain)
        assert gpt2.cfg.use_attn_in  # restored
    finally:
        gpt2.cfg.use_attn_in = False


@pytest.mark.parametrize("kind", ["bert-cls", "roberta-cls"])
def test_encoder_eap_from_projection_gradients_equals_split_inputs(kind, tiny_checkpoints):
    """Post-LN encoders keep query / key / value gradients at the projections (a d_head-wide
    copy per head instead of a d_model-wide one); the scores equal the split inputs' path."""
    from mi_core.circuits.attribution import _sweep_attribution, fill_outputs

    model = load_model(tiny_checkpoints[kind], task="mnli")
    graph = Graph.from_model(model)
    pairs = _classifier_pairs()
    got = edge_attribution(model, graph, pairs, steps=2)
    reference = fill_outputs(model, graph, pairs, "corrupted", None)
    expected = _sweep_attribution(model, graph, pairs, logit_difference, ig_alphas(2), reference)
    model.zero_grad(set_to_none=True)
    assert expected.abs().max() > 1e-4
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6 * float(expected.abs().max()))
    assert not model.cfg.use_split_qkv_input


@pytest.mark.parametrize("selection", ["greedy", "top-k"])
def test_connected_selection_spends_the_budget_on_connected_edges(gpt2, selection):
    from mi_core.circuits import circuit_order, select_circuit

    graph = Graph.from_model(gpt2)
    scores = torch.randn(graph.n_edges, generator=torch.Generator().manual_seed(0))
    k = 30
    plain = select_circuit(graph, scores, k, selection, connected=False)
    circuit = select_circuit(graph, scores, k, selection)
    kept = circuit.weights > 0.5
    assert plain.n_kept == k and circuit.n_kept <= k
    assert torch.equal(graph.connected(kept), kept)  # every edge on an input-to-output path
    # more connected edges than the plain top-k's connected part
    assert circuit.n_kept > int(graph.connected(plain.weights > 0.5).sum())
    # it holds the connected part of the longest prefix of the order that fits in k (a linear
    # scan), and then at most what later edges of the order add within k
    order = circuit_order(graph, scores, selection)
    best = None
    for m in range(graph.n_edges + 1):
        prefix = torch.zeros(graph.n_edges, dtype=torch.bool)
        prefix[order[:m]] = True
        part = graph.connected(prefix)
        if int(part.sum()) <= k:
            best = part
    assert bool((kept | ~best).all())  # best is inside the circuit


def test_a_connected_circuit_fills_its_budget_past_an_overshooting_edge():
    """k = 2: the ranking's third edge completes a chain of three (too many), so the prefix
    that fits has no connected edge at all; the fourth edge alone fits and joins."""
    from mi_core.circuits import select_circuit

    graph = Graph(n_layers=2, n_heads=1, d_model=4)
    scores = torch.zeros(graph.n_edges)
    chain = ["L0.H0->L1.MLP", "L1.MLP->output", "input->L0.H0.q", "input->output"]
    for value, name in zip((4.0, 3.0, 2.0, 1.0), chain, strict=True):
        scores[graph.edge_index(name)] = value
    circuit = select_circuit(graph, scores, 2, "top-k")
    assert circuit.kept == ["input->output"]
    assert sorted(select_circuit(graph, scores, 3, "top-k").kept) == sorted(chain[:3])


def test_signed_selection_leaves_out_edges_that_raise_the_metric(gpt2):
    from mi_core.circuits import select_circuit

    graph = Graph.from_model(gpt2)
    scores = torch.zeros(graph.n_edges)
    helps = graph.edge_index("input->output")  # removing it lowers the metric: -2
    hurts = graph.edge_index("L1.MLP->output")  # removing it raises the metric: +3
    scores[helps], scores[hurts] = -2.0, 3.0
    for selection in ("greedy", "top-k"):
        absolute = select_circuit(graph, scores, 1, selection, connected=False)
        signed = select_circuit(graph, scores, 1, selection, signed=True, connected=False)
        assert absolute.kept == ["L1.MLP->output"]
        assert signed.kept == ["input->output"]
    with pytest.raises(ConfigError, match="signed=True"):
        select_circuit(graph, scores, 1, absolute=False)


def test_curve_area_and_difference_by_hand():
    """MIB's CPR (area under faithfulness) and CMD (area under |1 - faithfulness|)."""
    from mi_core.circuits import CircuitScore, curve_area, curve_difference

    def row(fraction, faithfulness):
        return CircuitScore(n_edges=0, fraction=fraction, metric=0.0, full=1.0, empty=0.0,
                            faithfulness=faithfulness, kl=0.0)  # fmt: skip

    rows = [row(1.0, 1.0), row(0.0, 0.0), row(0.5, 1.5)]  # any order
    assert curve_area(rows) == pytest.approx(0.5 * 1.5 / 2 + 0.5 * 2.5 / 2)  # 1.0
    # overshooting by 0.5 costs what undershooting by 0.5 does
    assert curve_difference(rows) == pytest.approx(0.5 * 1.5 / 2 + 0.5 * 0.5 / 2)  # 0.5
    assert curve_difference([row(0.0, 1.0), row(1.0, 1.0)]) == 0.0


def test_logit_difference_by_hand_row_by_row():
    """A distractor token where one is given, else the mean of the other logits, per row."""
    logits = torch.tensor([[1.0, 4.0, 2.0], [3.0, 0.0, 6.0], [2.0, 5.0, -1.0]])
    pairs = PromptPairs(
        clean_ids=torch.zeros(3, 2, dtype=torch.long),
        corrupted_ids=torch.zeros(3, 2, dtype=torch.long),
        attention_mask=torch.ones(3, 2, dtype=torch.long),
        answer=torch.tensor([1, 2, 0]),
        distractor=torch.tensor([2, -1, 1]),
        position=torch.zeros(3, dtype=torch.long),
        kind="classifier",
    )
    expected = [4.0 - 2.0, 6.0 - (3.0 + 0.0) / 2, 2.0 - 5.0]
    assert logit_difference(logits, pairs).tolist() == pytest.approx(expected)
    # pairs left on the CPU while the logits are elsewhere (a GPU; "meta" stands in for it)
    assert logit_difference(logits.to("meta"), pairs).shape == (3,)


@pytest.mark.parametrize("per_product", [1, 2])
def test_decoder_eap_scores_groups_side_by_side_as_one_at_a_time(per_product, monkeypatch):
    """Receiver groups scored several per product (the default) equal each group's own
    product, whether a block fills (1 or 2 per product on a 2-layer model's 3 groups) or
    is scored at the end of the backward pass (the default 4).

    Two blockings of the same algebra, compared in float64 so that the tolerance stays tight:
    in float32 they round differently on some CPUs (tests/README.md)."""
    import mi_core.circuits.attribution as attribution

    model = tiny_model("llama", dtype=torch.float64)
    graph = Graph.from_model(model)
    pairs = random_prompt_pairs(4, 5, high=90)
    together = edge_attribution(model, graph, pairs, steps=2)
    monkeypatch.setattr(attribution, "_GROUPS_PER_PRODUCT", per_product)
    alone = edge_attribution(model, graph, pairs, steps=2)
    assert together.abs().max() > 1e-4
    torch.testing.assert_close(alone, together, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_metric_reading_answer_logits_gets_those_positions_alone(kind):
    """``logit_difference`` reads the logits through ``answer_logits``: the circuit methods
    unembed each example's ``position`` only ([batch, vocab]). Those logits are the full
    forward's at the positions, every hook on the blocks still fires, and EAP / EAP-IG scores
    equal those of the same metric given the whole output. Positions differ per example."""
    from mi_core.circuits.metrics import answer_logits, metric_logits

    model = tiny_model(kind)
    pairs = _lm_pairs()
    pairs = PromptPairs(
        clean_ids=pairs.clean_ids, corrupted_ids=pairs.corrupted_ids,
        attention_mask=pairs.attention_mask, answer=pairs.answer, distractor=pairs.distractor,
        position=torch.arange(len(pairs)) % pairs.clean_ids.shape[1],
    )  # fmt: skip
    seen = []
    hooks = [(f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", lambda x, hook: seen.append(1)),
             ("unembed.hook_out", lambda x, hook: seen.append(tuple(x.shape)))]  # fmt: skip
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        full = model(**pairs.clean)
        picked = metric_logits(model, pairs, logit_difference)
    assert picked.shape == (len(pairs), model.cfg.d_vocab)
    assert seen == [1, full.shape, 1, (len(pairs), 1, model.cfg.d_vocab)]  # every hook fires
    torch.testing.assert_close(picked, answer_logits(full, pairs), rtol=1e-5, atol=1e-5)

    def whole_output(logits, pairs):  # the same metric, unmarked: gets [batch, pos, vocab]
        assert logits.dim() == 3
        return logit_difference(logits, pairs)

    assert metric_logits(model, pairs, whole_output).shape == full.shape
    graph = Graph.from_model(model)
    for steps in (1, 2):
        shapes = []
        spy = ("unembed.hook_out", lambda x, hook, shapes=shapes: shapes.append(x.shape[1]))
        with model.hooks(fwd_hooks=[spy]):
            fast = edge_attribution(model, graph, pairs, logit_difference, steps=steps)
        assert set(shapes) == {1}  # EAP unembedded the answer positions alone
        plain = edge_attribution(model, graph, pairs, whole_output, steps=steps)
        assert plain.abs().max() > 1e-3
        torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-5 * float(plain.abs().max()))


@pytest.mark.parametrize("change", ["soft-cap", "no-final-norm"])
def test_answer_logits_follow_the_forward_with_a_soft_cap_or_no_final_norm(change):
    """``metric_logits`` does what TransformerLens's forward does after the blocks: the final
    norm only where the model has one, and the output soft cap (Gemma's) where it is set."""
    from mi_core.circuits.metrics import answer_logits, metric_logits

    model = tiny_model("llama")
    if change == "soft-cap":
        model.cfg.output_logits_soft_cap = 2.0
    else:
        model.cfg.normalization_type = None  # the forward then skips ln_final
    pairs = _lm_pairs()
    with torch.no_grad():
        full = answer_logits(model(**pairs.clean), pairs)
        picked = metric_logits(model, pairs, logit_difference)
    if change == "soft-cap":
        assert full.abs().max() <= 2.0
    torch.testing.assert_close(picked, full, rtol=1e-5, atol=1e-5)
