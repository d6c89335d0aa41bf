"""The computational graph and edge masks: names, exactness on every family, save / load."""

from __future__ import annotations

import pytest
import torch
from helpers import random_tokens, tiny_model
from transformer_lens import HookedTransformer, HookedTransformerConfig

from mi_core.errors import InterventionError
from mi_core.interventions import (
    EdgeMask,
    Graph,
    apply,
    graph_error,
    graph_switches,
    load_intervention,
    node_outputs,
    sender_means,
)
from mi_core.interventions.edges import _kernels, from_mib_name, reference_hooks, to_mib_name
from mi_core.interventions.edges._engine import masked_hooks, record_corrupted
from mi_core.models import load_model
from mi_core.models.hook_context import hooked

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoints_loaded(tiny_checkpoints):
    models = {}
    for kind in ("bert-cls", "roberta-cls", "gpt2-cls", "opt-lm", "llama-lm"):
        task = {"task": "mnli"} if kind.endswith("-cls") else {}
        models[kind] = load_model(tiny_checkpoints[kind], **task)
    return models


def _inputs(kind: str, seed: int) -> dict[str, torch.Tensor]:
    ids = random_tokens(3, 9, seed=seed, low=1000, high=2000)
    if kind.endswith("-cls"):
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0  # one padded example
        return {"input_ids": ids, "attention_mask": mask}
    return {"input": ids}


def test_graph_counts_and_names(gpt2):
    graph = Graph.from_model(gpt2)
    # senders: input + 2 x (4 heads + MLP); receivers: 2 x (12 qkv + MLP) + output
    assert (graph.n_senders, graph.n_receivers) == (11, 27)
    # input feeds all 27; layer-0 heads feed L0.MLP, 13 layer-1 receivers and output (15 each);
    # L0.MLP feeds 14; layer-1 heads feed L1.MLP and output (2 each); L1.MLP feeds output
    assert graph.n_edges == 27 + 4 * 15 + 14 + 4 * 2 + 1 == 110
    assert graph.edge_names[0] == "input->L0.H0.q"
    assert "L0.H1->L1.H2.k" in graph.edge_names
    assert "L0.H1->L0.MLP" in graph.edge_names
    assert "L1.H0->L1.H0.q" not in graph.edge_names
    assert [graph.edge_index(n) for n in graph.edge_names] == list(range(110))


def test_receiver_groups_are_ranges(gpt2):
    """Decoder EAP adds each group's scores by slicing: layer l-1's MLP input, then layer l's
    q, k, v inputs, must be consecutive receivers (and the last MLP right before the output)."""
    graph = Graph.from_model(gpt2)
    names = graph.receivers
    for layer in range(graph.n_layers):
        qkv = graph.qkv_receivers(layer)
        assert names[qkv][0] == f"L{layer}.H0.q" and names[qkv][-1] == f"L{layer}.H3.v"
        assert graph.mlp_receiver(layer) == qkv.stop and names[qkv.stop] == f"L{layer}.MLP"
    assert graph.output_receiver == graph.mlp_receiver(graph.n_layers - 1) + 1


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("L0.H1->L0.H2.q", "does not come before"),
        ("L5.H1->output", "2 layers of 4 heads"),
        ("L0.H9->output", "2 layers of 4 heads"),
        ("L0.H1-L1.MLP", "edges are named like"),
        ("L0.H1->L1.H2.x", "edges are named like"),
    ],
)
def test_bad_edge_names_are_refused_clearly(gpt2, name, says):
    graph = Graph.from_model(gpt2)
    with pytest.raises(InterventionError, match=says):
        EdgeMask.from_edges(graph, [name])


def test_a_model_without_a_graph_names_the_supported_families():
    cfg = HookedTransformerConfig(
        d_model=16,
        d_head=4,
        n_heads=4,
        n_layers=1,
        n_ctx=8,
        d_vocab=10,
        act_fn="gelu",
        attn_only=True,
        normalization_type="LN",
    )
    with pytest.raises(InterventionError, match="supported are decoders, sequential or parallel"):
        Graph.from_model(HookedTransformer(cfg))
    # a parallel block built by hand (no family) has the parallel graph
    cfg.attn_only, cfg.parallel_attn_mlp = False, True
    assert Graph.from_model(HookedTransformer(cfg)).parallel


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_full_graph_is_the_plain_forward_and_empty_graph_the_corrupted_one(kind):
    model = tiny_model(kind)
    graph = Graph.from_model(model)
    clean, corrupt = _inputs("lm", 0), _inputs("lm", 1)
    clean = {"input": clean["input"] % 90}
    corrupt = {"input": corrupt["input"] % 90}
    errors = graph_error(model, graph, clean, corrupt)
    assert errors["full"] < 1e-5 and errors["empty"] < 1e-5
    # the switches the graph turned on are off again
    assert not model.cfg.use_split_qkv_input and not model.cfg.use_hook_mlp_in


@pytest.mark.parametrize("kind", ["gpt2-cls", "opt-lm", "llama-lm", "bert-cls", "roberta-cls"])
def test_graph_exactness_on_every_family(checkpoints_loaded, kind):
    model = checkpoints_loaded[kind]
    graph = Graph.from_model(model)
    assert graph.post_ln == (kind in ("bert-cls", "roberta-cls"))
    errors = graph_error(model, graph, _inputs(kind, 0), _inputs(kind, 1))
    assert errors["full"] < 1e-5
    if graph.post_ln:
        # LayerNorm scales come from the masked run, not the corrupted one: a measured error
        assert 1e-4 < errors["empty"] < 0.1
    else:
        assert errors["empty"] < 1e-5


def test_one_removed_edge_patches_exactly_that_input(gpt2):
    graph = Graph.from_model(gpt2)
    clean, corrupt = random_tokens(2, 6, seed=3, high=90), random_tokens(2, 6, seed=4, high=90)
    # by hand: head 2 of layer 1 reads its value input with the embedding's clean part
    # replaced by the corrupted one
    _, cache = gpt2.run_with_cache(corrupt, names_filter="blocks.0.hook_resid_pre")
    _, clean_cache = gpt2.run_with_cache(clean, names_filter="blocks.0.hook_resid_pre")
    delta = clean_cache["blocks.0.hook_resid_pre"] - cache["blocks.0.hook_resid_pre"]

    def patch(v_input, hook):
        v_input[:, :, 2] -= delta
        return v_input

    gpt2.set_use_split_qkv_input(True)
    try:
        expected = gpt2.run_with_hooks(clean, fwd_hooks=[("blocks.1.hook_v_input", patch)])
    finally:
        gpt2.set_use_split_qkv_input(False)
    mask = ~EdgeMask.from_edges(graph, ["input->L1.H2.v"])
    with apply(gpt2, mask.patching(gpt2, corrupt)):
        got = gpt2(clean)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (got - gpt2(clean)).abs().max() > 1e-3  # the edge matters


def test_mean_fill_is_the_corrupted_fill_with_means_as_the_corrupted_run(gpt2):
    graph = Graph.from_model(gpt2)
    data = [{"input": random_tokens(4, 6, seed=s, high=90)} for s in range(2)]
    means = sender_means(gpt2, graph, data)
    outputs = node_outputs(gpt2, graph, data[0]["input"])
    torch.testing.assert_close(
        means[1],
        (outputs[1].mean((0, 1)) + node_outputs(gpt2, graph, data[1]["input"])[1].mean((0, 1))) / 2,
        atol=1e-5,
        rtol=0,
    )
    # a mask leaves pads out: the mean over padded batches is the mean over the real tokens
    padded = {"input": torch.cat([data[0]["input"], data[0]["input"][:, :2]], dim=1)}
    mask = torch.cat([torch.ones(4, 6), torch.zeros(4, 2)], dim=1)
    without_pads = sender_means(gpt2, graph, [data[0]])
    torch.testing.assert_close(sender_means(gpt2, graph, [padded], masks=[mask]), without_pads)
    clean = random_tokens(2, 6, seed=9, high=90)
    half = EdgeMask.top_k(graph, torch.arange(graph.n_edges).float(), 55, fill="mean", means=means)
    as_corrupt = EdgeMask(graph, half.weights).with_corrupted(
        means[:, None, None, :].expand(-1, 2, 6, -1)
    )
    with apply(gpt2, half):
        mean_filled = gpt2(clean)
    with apply(gpt2, as_corrupt):
        corrupt_filled = gpt2(clean)
    torch.testing.assert_close(mean_filled, corrupt_filled, atol=1e-5, rtol=0)
    # token ids instead of a list of forward keywords: one clear error, not a bare TypeError
    with pytest.raises(InterventionError, match="takes a list .* of batches"):
        sender_means(gpt2, graph, data[0]["input"])
    with pytest.raises(InterventionError, match="batch 0 is a Tensor"):
        sender_means(gpt2, graph, [data[0]["input"]])


def test_node_outputs_are_each_senders_output_and_a_short_forward_is_refused(gpt2):
    graph = Graph.from_model(gpt2)
    ids = random_tokens(2, 5, seed=3, high=90)
    reached = []
    # the forward stops at the last sender: the final norm (and the unembedding) never run
    with gpt2.hooks(fwd_hooks=[("ln_final.hook_normalized", lambda x, hook: reached.append(1))]):
        outputs = node_outputs(gpt2, graph, ids)
        assert not reached
        gpt2(ids)
        assert reached
    _, cache = gpt2.run_with_cache(ids)
    assert outputs.shape == (graph.n_senders, 2, 5, gpt2.cfg.d_model)
    torch.testing.assert_close(outputs[0], cache["blocks.0.hook_resid_pre"])
    for layer in range(graph.n_layers):
        z, w_o = cache[f"blocks.{layer}.attn.hook_z"], gpt2.blocks[layer].attn.W_O
        for head in range(graph.n_heads):
            by_hand = z[:, :, head] @ w_o[head]
            got = outputs[graph.head_sender(layer, head)]
            torch.testing.assert_close(got, by_hand, atol=1e-5, rtol=0)
        mlp = cache[f"blocks.{layer}.hook_mlp_out"]
        torch.testing.assert_close(outputs[graph.mlp_sender(layer)], mlp)
    # a forward that stops early leaves senders unwritten: refused, not returned uninitialised
    with pytest.raises(InterventionError, match="sender outputs"):
        node_outputs(gpt2, graph, ids, stop_at_layer=1)


def test_edge_mask_saves_loads_and_refuses_what_it_cannot_do(gpt2, tmp_path):
    graph = Graph.from_model(gpt2)
    mask = EdgeMask.from_edges(graph, ["input->L1.H2.v", "L0.MLP->output"])
    assert mask.n_kept == 2 and mask.kept == ["input->L1.H2.v", "L0.MLP->output"]
    assert mask.sparsity == pytest.approx(1 - 2 / 110)
    path = mask.save(tmp_path / "circuit.safetensors")
    again = load_intervention(path)
    assert isinstance(again, EdgeMask) and again.graph == graph and again.kept == mask.kept
    with pytest.raises(InterventionError, match="needs the corrupted run"):
        with apply(gpt2, mask):  # refused on entering, before any forward
            gpt2(random_tokens(2, 6, high=90))
    short = node_outputs(gpt2, graph, random_tokens(2, 5, high=90))
    with pytest.raises(InterventionError, match="pad both to one shape"):
        with apply(gpt2, mask.with_corrupted(short)):
            gpt2(random_tokens(2, 6, high=90))
    with pytest.raises(InterventionError, match="needs means"):
        EdgeMask.full(graph, fill="mean")
    bound = mask.with_corrupted(node_outputs(gpt2, graph, random_tokens(2, 6, high=90)))
    with pytest.raises(InterventionError, match="use apply"):  # switches off: refused, not wrong
        gpt2.run_with_hooks(random_tokens(2, 6, high=90), fwd_hooks=bound.hooks(gpt2))
    other = Graph.from_model(tiny_model("llama"))
    assert other == graph  # same shape of graph: a mask of one fits the other
    with pytest.raises(InterventionError, match="needs 110 weights"):
        EdgeMask(graph, torch.ones(3))


def test_mib_names_round_trip(gpt2):
    graph = Graph.from_model(gpt2)
    assert to_mib_name("L0.H1->L1.H2.q") == "a0.h1->a1.h2<q>"
    assert to_mib_name("input->L1.MLP") == "input->m1"
    assert to_mib_name("L1.MLP->output") == "m1->logits"
    assert all(from_mib_name(to_mib_name(n)) == n for n in graph.edge_names)


def test_greedy_circuits_are_connected_to_the_output_and_top_k_need_not_be(gpt2):
    graph = Graph.from_model(gpt2)
    scores = torch.zeros(graph.n_edges)
    scores[graph.edge_index("input->L0.H1.q")] = 5.0  # large, but L0.H1 reaches nothing kept
    scores[graph.edge_index("L1.MLP->output")] = 1.0
    scores[graph.edge_index("L0.H2->L1.MLP")] = 0.5
    top = EdgeMask.top_k(graph, scores, 2)
    assert top.kept == ["input->L0.H1.q", "L1.MLP->output"]
    greedy = EdgeMask.greedy(graph, scores, 3)
    # output <- L1.MLP <- L0.H2, then (all else 0) the first edge into L0.H2; L0.H1 never joins
    assert set(greedy.kept) == {"L1.MLP->output", "L0.H2->L1.MLP", "input->L0.H2.q"}
    # every kept edge ends at the output or at a node some kept edge leaves from
    senders = {name.split("->")[0] for name in greedy.kept}
    for name in greedy.kept:
        receiver = name.split("->")[1]
        node = receiver[:-2] if receiver.endswith((".q", ".k", ".v")) else receiver
        assert node == "output" or node in senders


@pytest.mark.parametrize("kind", ["gpt2-cls", "llama-lm", "bert-cls"])
@pytest.mark.parametrize("state", ["start", "middle", "end"])
def test_hard_concrete_masks_skip_exact_gates_with_the_same_values_and_gradients(
    checkpoints_loaded, kind, state, monkeypatch
):
    """``hard_concrete=True`` reads only the senders with a removed or undecided edge; the
    logits and the gradients of log_alpha equal the dense path's."""
    from mi_core.pruning.hard_concrete import sample_hard_concrete

    model = checkpoints_loaded[kind]
    graph = Graph.from_model(model)
    gen = torch.Generator().manual_seed(3)
    init = {"start": 5.0, "middle": 3.0, "end": -5.0}[state]
    log_alpha = torch.randn(graph.n_edges, generator=gen) + init
    if state == "end":  # a few edges kept, as at 95 % sparsity
        log_alpha[torch.randperm(graph.n_edges, generator=gen)[: graph.n_edges // 20]] = 5.0
    z = sample_hard_concrete(log_alpha, generator=torch.Generator().manual_seed(4))
    exact = float(((z == 0) | (z == 1)).float().mean())
    assert exact > {"start": 0.9, "middle": 0.6, "end": 0.9}[state]
    clean, corrupted = _inputs(kind, 0), _inputs(kind, 1)
    read = {False: 0, True: 0}  # sender rows the masked forward and backward read
    gather = _kernels._gather

    def counting(stacked, rows, deltas):
        out = gather(stacked, rows, deltas)
        read[sparse] += out.shape[0]
        return out

    monkeypatch.setattr(_kernels, "_gather", counting)
    results = []
    for sparse in (False, True):
        leaf = log_alpha.clone().requires_grad_(True)
        weights = sample_hard_concrete(leaf, generator=torch.Generator().manual_seed(4))
        mask = EdgeMask(graph, weights).patching(model, **corrupted)
        with (
            graph_switches(model),
            model.hooks(fwd_hooks=masked_hooks(model, mask, hard_concrete=sparse)),
        ):
            logits = model(**clean)
        (logits[..., -1] * torch.arange(1, logits.shape[0] + 1)[:, None]).sum().backward()
        results.append((logits.detach(), leaf.grad))
    (dense_logits, dense_grad), (sparse_logits, sparse_grad) = results
    torch.testing.assert_close(sparse_logits, dense_logits, atol=1e-5, rtol=1e-5)
    assert dense_grad.abs().max() > 0
    torch.testing.assert_close(sparse_grad, dense_grad, atol=1e-6, rtol=1e-4)
    if state != "middle":  # most gates exact: fewer senders read (decoders read a whole
        # block in place once a sixth of it is needed, cheaper than gathering: on a 2-layer
        # model that is more often than not; and the dense path's layer groups read the
        # block once for several points: 116 rows here, 128 one point at a time)
        assert read[True] < (0.5 if kind == "bert-cls" else 0.75) * read[False]
    model.zero_grad(set_to_none=True)


def test_default_masks_keep_every_gradient_and_hard_concrete_ones_run_unsplit_layers(
    gpt2, checkpoints_loaded
):
    """A plain edge mask at exactly 1 still gives every edge its gradient (gradient-based
    attribution from a full mask). A decoder never runs TransformerLens's per-head copies
    of the stream (each head's input is projected by hand); an encoder under a hard-concrete
    mask runs a layer with nothing removed through the shared input. The switch is back on
    after the forward either way."""
    graph = Graph.from_model(gpt2)
    clean = {"input": random_tokens(3, 9, seed=0, high=90)}
    corrupted = {"input": random_tokens(3, 9, seed=1, high=90)}
    weights = torch.ones(graph.n_edges, requires_grad=True)
    mask = EdgeMask(graph, weights).patching(gpt2, **corrupted)
    with graph_switches(gpt2), gpt2.hooks(fwd_hooks=mask.hooks(gpt2)):
        gpt2(**clean)[:, -1].sum().backward()
    qkv = [i for i, name in enumerate(graph.edge_names) if name.endswith((".q", ".k", ".v"))]
    assert bool((weights.grad[qkv] != 0).all())

    for model, kind in ((gpt2, "gpt2"), (checkpoints_loaded["bert-cls"], "bert-cls")):
        graph = Graph.from_model(model)
        clean = _inputs(kind, 0) if kind != "gpt2" else clean
        corrupted = _inputs(kind, 1) if kind != "gpt2" else corrupted
        values = torch.ones(graph.n_edges)
        values[graph.edge_index("L0.H1->L1.H2.k")] = 0.0  # layer 1 needs per-head inputs
        fired: list[str] = []

        def count(x, hook, fired=fired):
            fired.append(hook.name)

        counting = [(f"blocks.{layer}.hook_q_input", count) for layer in range(graph.n_layers)]
        results = []
        for sparse in (False, True):
            bound = EdgeMask(graph, values).patching(model, **corrupted)
            with torch.no_grad(), graph_switches(model):
                hooks = masked_hooks(model, bound, hard_concrete=sparse)
                with model.hooks(fwd_hooks=[*counting, *hooks]):
                    fired.clear()
                    results.append(model(**clean))
                assert model.cfg.use_split_qkv_input
                if kind == "gpt2":
                    assert fired == []
                else:
                    assert fired == (
                        ["blocks.1.hook_q_input"]
                        if sparse
                        else [f"blocks.{i}.hook_q_input" for i in range(graph.n_layers)]
                    )
        torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-5)
        assert (results[0] - model(**clean)).abs().max() > 1e-4  # the edge matters


@pytest.mark.parametrize("frozen", [False, True], ids=["trainable", "frozen"])
@pytest.mark.parametrize("kind", ["gpt2", "llama", "gpt2-cls", "opt-lm", "llama-lm"])
def test_decoder_heads_projected_by_hand_equal_transformer_lens_split_inputs(
    checkpoints_loaded, kind, frozen
):
    """The masked forward of a decoder (each head's input normalised and projected by hand)
    equals the reference forward (``reference_hooks``: TransformerLens's per-head inputs with
    the same edges removed, no code shared with the fused engine), in values and in
    the gradients of the edge weights: LayerNorm with gain and bias and RMSNorm with grouped
    key / value heads (random 2-layer models), and the folded LNPre / RMSPre of loaded
    checkpoints; with trainable weights (autograd's backward) and frozen ones (edge pruning:
    the backward written by hand)."""
    model = tiny_model(kind) if kind in ("gpt2", "llama") else checkpoints_loaded[kind]
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(not frozen)
    graph = Graph.from_model(model)
    if kind in ("gpt2", "llama"):
        gen = torch.Generator().manual_seed(6)
        with torch.no_grad():  # a gain and a shift (LayerNorm) that are not 1 and 0
            for block in model.blocks:
                block.ln1.w.copy_(1 + 0.5 * torch.randn(block.ln1.w.shape, generator=gen))
                if hasattr(block.ln1, "b"):
                    block.ln1.b.copy_(0.5 * torch.randn(block.ln1.b.shape, generator=gen))
        clean = {"input": random_tokens(3, 9, seed=0, high=90)}
        corrupted = {"input": random_tokens(3, 9, seed=1, high=90)}
    else:
        clean, corrupted = _inputs(kind, 0), _inputs(kind, 1)
    gen = torch.Generator().manual_seed(5)
    values = torch.rand(graph.n_edges, generator=gen)
    values[values < 0.3] = 0.0  # some edges exactly removed, some exactly kept
    values[values > 0.8] = 1.0
    outputs = node_outputs(model, graph, **corrupted)
    grads = []
    for reference in (False, True):
        weights = values.clone().requires_grad_(True)
        mask = EdgeMask(graph, weights).with_corrupted(outputs)
        with graph_switches(model):
            hooks = reference_hooks(model, mask) if reference else mask.hooks(model)
            with model.hooks(fwd_hooks=hooks):
                logits = model(**clean)
        (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
        grads.append((logits.detach(), weights.grad))
    (ours, our_grad), (expected, expected_grad) = grads
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    scale = float(expected_grad.abs().max())  # float32 rounding of sums this large
    assert scale > 0
    torch.testing.assert_close(our_grad, expected_grad, atol=1e-6 * scale, rtol=1e-4)
    assert (ours - model(**clean)).abs().max() > 1e-3  # the mask changes the logits
    for p in trainable:
        p.requires_grad_(True)
    model.zero_grad(set_to_none=True)


def test_connected_keeps_only_edges_on_an_input_to_output_path():
    graph = Graph(n_layers=2, n_heads=1, d_model=4)
    names = [
        "input->L0.H0.q",  # on the path input -> L0.H0 -> L1.MLP -> output
        "L0.H0->L1.MLP",
        "L1.MLP->output",
        "L0.MLP->output",  # L0.MLP reads nothing kept: cut off from the input
        "input->L1.H0.v",  # L1.H0 feeds nothing kept: reaches no output
        "L0.MLP->L1.H0.k",  # both ends dead
    ]
    kept = EdgeMask.from_edges(graph, names).weights > 0.5
    connected = EdgeMask(graph, graph.connected(kept).float())
    assert sorted(connected.kept) == sorted(names[:3])
    assert torch.equal(graph.connected(graph.connected(kept)), graph.connected(kept))
    everything = torch.ones(graph.n_edges, dtype=torch.bool)
    assert torch.equal(graph.connected(everything), everything)
    assert not graph.connected(torch.zeros(graph.n_edges, dtype=torch.bool)).any()


def test_edges_off_every_path_change_nothing_with_the_corrupted_fill(gpt2):
    """The pruning :meth:`Graph.connected` does is a no-op for the circuit's output."""
    from helpers import random_prompt_pairs

    graph = Graph.from_model(gpt2)
    pairs = random_prompt_pairs(6, 7, 90)
    scores = torch.randn(graph.n_edges, generator=torch.Generator().manual_seed(3))
    top = EdgeMask.top_k(graph, scores, 40)
    pruned = EdgeMask(graph, graph.connected(top.weights > 0.5).float())
    assert 0 < pruned.n_kept < top.n_kept  # the test is about something

    def logits(mask):
        with torch.no_grad(), graph_switches(gpt2):
            bound = mask.patching(gpt2, pairs.corrupted_ids)
            with gpt2.hooks(fwd_hooks=bound.hooks(gpt2)):
                return gpt2(pairs.clean_ids)

    torch.testing.assert_close(logits(pruned), logits(top), atol=1e-5, rtol=0)
    assert (logits(EdgeMask.empty(graph)) - logits(top)).abs().max() > 1e-3
    # a circuit's score counts the edges that matter beside the ones it keeps
    from mi_core.circuits import evaluate_circuit

    whole, part = (evaluate_circuit(gpt2, mask, pairs) for mask in (top, pruned))
    assert (whole.n_edges, whole.n_connected) == (top.n_kept, pruned.n_kept)
    assert part.n_edges == part.n_connected == pruned.n_kept
    assert whole.metric == pytest.approx(part.metric, abs=1e-5)


def test_from_order_takes_edge_ids_and_refuses_masks_and_bad_ids(gpt2):
    graph = Graph.from_model(gpt2)
    mask = EdgeMask.from_order(graph, [3, 0, 7])
    assert mask.n_kept == 3 and mask.kept == [graph.edge_names[i] for i in (0, 3, 7)]
    with pytest.raises(InterventionError, match="edge ids"):
        EdgeMask.from_order(graph, torch.zeros(graph.n_edges, dtype=torch.bool))
    with pytest.raises(InterventionError, match=r"must lie in \[0"):
        EdgeMask.from_order(graph, [graph.n_edges])
    with pytest.raises(InterventionError, match=r"must lie in \[0"):
        EdgeMask.from_order(graph, [-1])


@pytest.mark.parametrize("kind", ["gpt2-cls", "llama-lm", "bert-cls"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "hard-concrete"])
@pytest.mark.parametrize("weights", ["trainable", "frozen"])
def test_a_corrupted_run_bound_by_z_gives_the_patched_values_and_gradients(
    checkpoints_loaded, kind, sparse, weights
):
    """Edge pruning and circuit evaluation bind the corrupted run with its heads kept as
    ``hook_z`` (``record_corrupted``: each head's difference is ``(z - z') W_O``): the masked
    logits and the gradients of log_alpha equal those of :meth:`EdgeMask.patching`, with and
    without gradients; a corrupted run of another shape is refused as before. With the weights
    frozen (as ``prune_edges`` runs), a decoder writes each layer's head differences straight
    into the side-by-side buffer (``_HeadsInto``), with its own backward."""
    import contextlib
    from unittest import mock

    from mi_core.models.frozen import frozen

    model = checkpoints_loaded[kind]
    graph = Graph.from_model(model)
    log_alpha = torch.randn(graph.n_edges, generator=torch.Generator().manual_seed(5)) + 1.0
    clean, corrupted = _inputs(kind, 0), _inputs(kind, 1)
    results = []
    held = frozen(model) if weights == "frozen" else contextlib.nullcontext()
    into = _kernels._HeadsInto.apply
    with held, mock.patch.object(_kernels._HeadsInto, "apply", side_effect=into) as calls:
        _bound_by_z_runs(model, graph, log_alpha, clean, corrupted, sparse, results)
    # the direct write is taken exactly where it applies: a decoder's frozen weights
    assert calls.called == (weights == "frozen" and not graph.post_ln)
    _check_bound_by_z(model, graph, clean, corrupted, results)


def _bound_by_z_runs(model, graph, log_alpha, clean, corrupted, sparse, results):
    from mi_core.pruning.hard_concrete import sample_hard_concrete

    for by_z in (False, True):
        leaf = log_alpha.clone().requires_grad_(True)
        weights = sample_hard_concrete(leaf, generator=torch.Generator().manual_seed(6))
        mask = EdgeMask(graph, weights)
        run = record_corrupted(model, graph, **corrupted) if by_z else None
        if not by_z:
            mask = mask.patching(model, **corrupted)
        with graph_switches(model):
            hooks = masked_hooks(model, mask, hard_concrete=sparse, corrupted=run)
            with model.hooks(fwd_hooks=hooks):
                logits = model(**clean)
                with torch.no_grad():
                    no_grad_logits = model(**clean)
        (logits[..., -1] * torch.arange(1, logits.shape[0] + 1)[:, None]).sum().backward()
        results.append((logits.detach(), no_grad_logits, leaf.grad))


def _check_bound_by_z(model, graph, clean, corrupted, results):
    (logits, no_grad, grad), (z_logits, z_no_grad, z_grad) = results
    assert (logits - model(**clean)).abs().max() > 1e-3  # the mask changes the output
    torch.testing.assert_close(z_logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(z_no_grad, no_grad, atol=1e-5, rtol=1e-5)
    assert grad.abs().max() > 0
    torch.testing.assert_close(z_grad, grad, atol=1e-6, rtol=1e-4)
    model.zero_grad(set_to_none=True)

    # a recorded run fills a corrupted-fill mask only; it replaces the mask's own outputs
    from dataclasses import replace

    mask = EdgeMask(graph, torch.rand(graph.n_edges, generator=torch.Generator().manual_seed(7)))
    run = record_corrupted(model, graph, **corrupted)
    with (
        graph_switches(model),
        pytest.raises(InterventionError, match="fills a corrupted-fill edge mask, not a zero"),
    ):
        masked_hooks(model, replace(mask, fill="zero"), corrupted=run)
    other = {k: v.flip(0) for k, v in corrupted.items()}
    with torch.no_grad(), graph_switches(model):
        stale = mask.patching(model, **other)  # the run given wins over the bound outputs
        with model.hooks(fwd_hooks=masked_hooks(model, stale, corrupted=run)):
            got = model(**clean)
        with model.hooks(fwd_hooks=mask.patching(model, **corrupted).hooks(model)):
            expected = model(**clean)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

    shorter = {k: v[:, :7] for k, v in corrupted.items()}
    run = record_corrupted(model, graph, **shorter)
    with (
        pytest.raises(InterventionError, match="3 x 7 .* but the clean run 3 x 9"),
        graph_switches(model),
        model.hooks(fwd_hooks=masked_hooks(model, EdgeMask.full(graph), corrupted=run)),
        torch.no_grad(),
    ):
        model(**clean)


def test_two_edge_masks_at_once_are_refused_and_a_and_b_removes_both(gpt2):
    """Each edge mask subtracts its removed edges' differences from the receivers' inputs:
    two at once would subtract an edge both remove twice (applying the empty mask twice
    gave 0.03 off the corrupted run). apply refuses a second one; a & b removes either's."""
    graph = Graph.from_model(gpt2)
    clean, corrupt = random_tokens(2, 6, seed=3, high=90), random_tokens(2, 6, seed=4, high=90)
    a = ~EdgeMask.from_edges(graph, ["input->L1.H2.v", "L0.MLP->L1.H0.q"]).patching(gpt2, corrupt)
    b = ~EdgeMask.from_edges(graph, ["input->L1.H2.v", "L0.H1->L1.MLP"]).patching(gpt2, corrupt)
    with pytest.raises(InterventionError, match="an edge mask is already applied"):
        with apply(gpt2, a, b):
            gpt2(clean)  # never reached: the second mask is refused on entering
    with apply(gpt2, a), pytest.raises(InterventionError, match="apply one mask, a & b"):
        with apply(gpt2, b):
            gpt2(clean)
    both = a & b
    assert sorted(set(graph.edge_names) - set(both.kept)) == sorted(
        ["input->L1.H2.v", "L0.MLP->L1.H0.q", "L0.H1->L1.MLP"]
    )
    with apply(gpt2, both):  # the model is clean again: one mask applies
        got = gpt2(clean)
    with apply(gpt2, EdgeMask.empty(graph).patching(gpt2, corrupt)):
        torch.testing.assert_close(gpt2(clean), gpt2(corrupt), atol=1e-5, rtol=0)
    assert (got - gpt2(clean)).abs().max() > 1e-4
    with pytest.raises(InterventionError, match="corrupted fill & one with zero fill"):
        a & EdgeMask.from_edges(graph, [], fill="zero")  # noqa: B018


def test_edge_mask_algebra_on_kept_edges(gpt2):
    """``a | b`` keeps what either keeps, ``a & b`` what both keep, ``a - b`` what ``a`` keeps
    and ``b`` does not; weights between 0 and 1 combine as max, min and min(a, 1 - b)."""
    graph = Graph.from_model(gpt2)
    a = EdgeMask.from_edges(graph, ["input->L0.H0.q", "L0.H1->L1.MLP", "L1.MLP->output"])
    b = EdgeMask.from_edges(graph, ["L0.H1->L1.MLP", "L0.MLP->L1.H0.q"])
    assert sorted((a | b).kept) == sorted(
        ["input->L0.H0.q", "L0.H1->L1.MLP", "L1.MLP->output", "L0.MLP->L1.H0.q"]
    )
    assert (a & b).kept == ["L0.H1->L1.MLP"]
    assert sorted((a - b).kept) == ["L1.MLP->output", "input->L0.H0.q"]
    assert (b - a).kept == ["L0.MLP->L1.H0.q"]
    soft_a, soft_b = torch.zeros(graph.n_edges), torch.zeros(graph.n_edges)
    soft_a[:3], soft_b[:3] = torch.tensor([0.75, 1.0, 0.25]), torch.tensor([0.5, 1.0, 0.0])
    soft = EdgeMask(graph, soft_a) - EdgeMask(graph, soft_b)
    assert soft.weights[:3].tolist() == [0.5, 0.0, 0.25]
    means = torch.zeros(graph.n_senders, graph.d_model)
    mean_a = EdgeMask.from_edges(graph, ["input->L0.H0.q"], fill="mean", means=means)
    assert (mean_a - mean_a).fill == "mean" and (mean_a - mean_a).means is means
    with pytest.raises(InterventionError, match="corrupted fill - one with mean fill"):
        a - mean_a  # noqa: B018
    smaller = EdgeMask.full(Graph(1, graph.n_heads, graph.d_model))
    with pytest.raises(InterventionError, match=r"two different graphs cannot be combined \(-\)"):
        a - smaller  # noqa: B018


@pytest.mark.parametrize("kind", ["gpt2-cls", "llama-lm"])
def test_folded_head_weights_are_kept_until_a_weight_changes(checkpoints_loaded, kind):
    """A decoder's per-head inputs stack ``W_Q`` / ``W_K`` / ``W_V`` (with ``ln1``'s gain) once
    per layer inside a run (a ``reusing_buffers(fixed_weights=True)`` block: edge pruning folds
    once a run, not once a step); a weight changed in place is folded again, a model without
    biases adds none, nothing is kept past the block, and a user's own block (which may edit
    weights through ``.data``, unseen by version counters) keeps nothing."""
    import copy

    from mi_core.buffers import reusing_buffers
    from mi_core.models.frozen import frozen

    model = copy.deepcopy(checkpoints_loaded[kind])
    graph = Graph.from_model(model)
    weights = torch.ones(graph.n_edges)
    weights[graph.edge_index("L0.H1->L1.H2.q")] = 0  # layer 1's heads read their own inputs
    mask = EdgeMask(graph, weights, "zero")
    clean = _inputs(kind, 0)
    attn = model.blocks[1].attn

    def run() -> torch.Tensor:
        with torch.no_grad(), graph_switches(model), hooked(model, mask.hooks(model)):
            return model(**clean)

    if kind == "gpt2-cls":  # the random checkpoint's biases are 0: give layer 1 a query bias
        with torch.no_grad():
            attn.b_Q.add_(0.1)
    with frozen(model), reusing_buffers() as workspace:  # a user's block: nothing is kept
        first = run()
        assert len(workspace.memo) == 0
        attn.W_Q.data.mul_(2.0)  # an edit no version counter sees
        edited = run()
        attn.W_Q.data.div_(2.0)
    assert (edited - first).abs().max() > 1e-4
    with frozen(model), reusing_buffers(fixed_weights=True) as workspace:  # a run's block
        first = run()
        held = workspace.memo[attn]
        assert run().equal(first) and workspace.memo[attn] is held
        assert (held[2] is None) == (kind == "llama-lm")  # zero biases are not added
        with torch.no_grad():
            attn.W_Q.mul_(1.5)  # in place: the fold must be redone
        changed = run()
        assert workspace.memo[attn] is not held
    assert len(workspace.memo) == 0  # dropped with the block
    with frozen(model):
        torch.testing.assert_close(changed, run(), atol=0, rtol=0)  # = folded afresh
    assert (changed - first).abs().max() > 1e-4


@pytest.mark.parametrize("fill", ["corrupted", "mean"])
@pytest.mark.parametrize("kind", ["gpt2-cls", "opt-lm", "llama-lm", "bert-cls", "roberta-cls"])
def test_the_fused_masked_forward_equals_the_reference_on_every_family(
    checkpoints_loaded, kind, fill
):
    """The fused engine (``EdgeMask.hooks``, and edge pruning's hard-concrete path with the
    corrupted run recorded as ``hook_z``) against the plain statement of the method
    (``reference_hooks``): the same logits and the same gradients of the edge weights, on a
    pre-LN decoder of each family and on both post-LN encoders, with weights between 0 and 1,
    exact 0s and exact 1s."""
    model = checkpoints_loaded[kind]
    graph = Graph.from_model(model)
    clean, corrupted = _inputs(kind, 0), _inputs(kind, 1)
    values = torch.rand(graph.n_edges, generator=torch.Generator().manual_seed(8))
    values[values < 0.3] = 0.0
    values[values > 0.8] = 1.0
    means = sender_means(model, graph, [corrupted]) if fill == "mean" else None
    base = EdgeMask(graph, values, fill, means)
    if fill == "corrupted":
        base = base.patching(model, **corrupted)
    probe = None
    results = {}
    for path in ("reference", "fused", "pruning"):
        weights = values.clone().requires_grad_(True)
        mask = EdgeMask(graph, weights, fill, means, base.corrupted)
        with graph_switches(model):
            if path == "reference":
                hooks = reference_hooks(model, mask)
            elif path == "fused":
                hooks = mask.hooks(model)
            else:
                run = record_corrupted(model, graph, **corrupted) if fill == "corrupted" else None
                hooks = masked_hooks(model, mask, hard_concrete=True, corrupted=run)
            with model.hooks(fwd_hooks=hooks):
                logits = model(**clean)
        if probe is None:
            probe = torch.linspace(-1, 1, logits.shape[-1])
        (logits * probe).sum().backward()
        results[path] = (logits.detach(), weights.grad)
    expected, expected_grad = results["reference"]
    assert (expected - model(**clean)).abs().max() > 1e-3  # the mask changes the output
    scale = float(expected_grad.abs().max())
    assert scale > 0
    for path in ("fused", "pruning"):
        got, grad = results[path]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        # float32 sums of many edges' terms, in another order on each path: ~20 ulp of the
        # largest gradient (random norm gains and biases make the terms unequal)
        torch.testing.assert_close(grad, expected_grad, atol=1e-5 * scale, rtol=1e-4)
    model.zero_grad(set_to_none=True)
