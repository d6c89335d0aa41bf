"""Node-level circuits (:mod:`mi_core.circuits.nodes`): node scores from edge scores against a
plain backward pass, node circuits by hand, the heuristic core's subnetworks as node scores,
and ``mi-core circuit evaluate --level node``."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import random_prompt_pairs, tiny_model

from mi_core.circuits import attribute
from mi_core.circuits.metrics import logit_difference
from mi_core.circuits.mib import MIB_PERCENTAGES, mib_circuits, mib_score
from mi_core.circuits.nodes import (
    NodeScores,
    load_scores,
    mib_node_circuits,
    neuron_attribution,
)
from mi_core.errors import InterventionError
from mi_core.interventions.edges import Graph
from mi_core.interventions.mask import ComponentMask
from mi_core.io import write_json, write_safetensors


def _node_attribution(model, pairs, graph, steps):
    """Each node's (corrupted - clean output) * d metric / d output per dimension, summed over
    positions and averaged over the pairs, the gradient averaged over EAP-IG's interpolations
    of the input (``alpha = k / steps``, from the corrupted input): by TransformerLens's own
    backward."""
    model.set_use_attn_result(True)
    names = ["blocks.0.hook_resid_pre"] + [
        name for layer in range(graph.n_layers)
        for name in (f"blocks.{layer}.attn.hook_result", f"blocks.{layer}.hook_mlp_out")
    ]  # fmt: skip
    inputs = {"attention_mask": pairs.attention_mask}
    _, clean = model.run_with_cache(pairs.clean_ids, names_filter=names, **inputs)
    _, corrupted = model.run_with_cache(pairs.corrupted_ids, names_filter=names, **inputs)
    grads = {name: torch.zeros_like(clean[name]) for name in names}
    embed = "blocks.0.hook_resid_pre"
    alphas = [k / steps for k in range(steps)] if steps > 1 else [1.0]
    for alpha in alphas:
        point = (corrupted[embed] + alpha * (clean[embed] - corrupted[embed])).requires_grad_(True)
        seen = {}

        def interpolate(x, hook, point=point, seen=seen):
            seen[hook.name] = point
            return point

        def keep(x, hook, seen=seen):
            seen[hook.name] = x

        hooks = [(embed, interpolate)] + [(n, keep) for n in names[1:]]
        logits = model.run_with_hooks(pairs.clean_ids, fwd_hooks=hooks, **inputs)
        metric = logit_difference(logits, pairs).mean()
        for name, grad in zip(names, torch.autograd.grad(metric, [seen[n] for n in names]),
                              strict=True):  # fmt: skip
            grads[name] += grad / len(alphas)
    model.set_use_attn_result(False)
    out = [((corrupted[embed] - clean[embed]) * grads[embed]).sum(dim=(0, 1))[None]]
    for layer in range(graph.n_layers):
        name = f"blocks.{layer}.attn.hook_result"
        out.append(((corrupted[name] - clean[name]) * grads[name]).sum(dim=(0, 1)))
        name = f"blocks.{layer}.hook_mlp_out"
        out.append(((corrupted[name] - clean[name]) * grads[name]).sum(dim=(0, 1))[None])
    return torch.cat(out).double()  # [sender, d_model]


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_node_and_neuron_scores_are_the_attribution_at_each_node_output(method):
    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(6, 7, high=90)
    graph = Graph.from_model(model)
    steps = 3 if method == "eap-ig" else 1
    expected = _node_attribution(model, pairs, graph, steps)
    # the edges' scores summed per node (mi_core's edge engine)
    nodes = NodeScores.from_edges(attribute(model, pairs, method=method, steps=steps,
                                            progress=False))  # fmt: skip
    assert nodes.level == "node"
    torch.testing.assert_close(nodes.scores, expected.sum(-1), atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(nodes.ranked(), -expected.sum(-1), atol=1e-4, rtol=1e-3)  # MIB's
    # each output dimension's (batched in twos: the sums run over batches)
    neurons = neuron_attribution(model, pairs, method, steps=steps, batch_size=4, progress=False)
    assert neurons.level == "neuron" and neurons.n_examples == 6
    torch.testing.assert_close(neurons.scores, expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(InterventionError, match="neuron attribution is"):
        neuron_attribution(model, pairs, "exact", progress=False)


def test_node_circuits_by_hand():
    graph = Graph(2, 2, 8)  # senders: input, L0.H0, L0.H1, L0.MLP, L1.H0, L1.H1, L1.MLP
    kept = torch.zeros(graph.n_senders, dtype=torch.bool)
    kept[[0, graph.head_sender(0, 1), graph.mlp_sender(1)]] = True
    edges = graph.node_edges(kept)
    names = {graph.edge_names[i] for i in edges.nonzero().flatten().tolist()}
    assert names == {
        "input->L0.H1.q", "input->L0.H1.k", "input->L0.H1.v", "input->L1.MLP", "input->output",
        "L0.H1->L1.MLP", "L0.H1->output", "L1.MLP->output",
    }  # fmt: skip
    with pytest.raises(InterventionError, match="node values"):
        graph.node_edges(kept[:3])
    # MIB's ranking: the top int(pct * n_scored) of the scored nodes, the unscored always in
    scores = torch.tensor([math.nan, 5.0, -9.0, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    circuits = mib_node_circuits(
        NodeScores(graph, scores, "mine", mib_sign=True), True, [0.0, 0.34]
    )
    assert circuits[0].sum() == 1  # input->output alone
    top2 = torch.zeros(graph.n_senders, dtype=torch.bool)
    top2[[0, 1, 2]] = True  # |-9| and 5: L0.H1 and L0.H0
    assert torch.equal(circuits[1], graph.node_edges(top2))
    signed = mib_node_circuits(NodeScores(graph, scores, "mine", mib_sign=True), False, [0.34])[0]
    top2[[2]], top2[[graph.mlp_sender(1)]] = False, True  # 5 and 4
    assert torch.equal(signed, graph.node_edges(top2))
    with pytest.raises(InterventionError, match="node scores for .* expected"):
        NodeScores(graph, scores[:3], "eap")


def _fake_sweep(root, graph, kept_by_run, log_alphas):
    """A pruning sweep's finished runs as mi-core sweep writes them (masks, metrics, gates)."""
    for i, (kept, log_alpha) in enumerate(zip(kept_by_run, log_alphas, strict=True)):
        run = root / "s0.50" / f"seed{i}"
        run.mkdir(parents=True)
        heads = kept[:, : graph.n_heads].float()
        ComponentMask(heads, kept[:, graph.n_heads].float()).save(run / "mask.safetensors")
        write_json(run / "metrics.json", {"target_sparsity": 0.5, "accuracy": {}})
        flat = torch.cat([log_alpha[:, : graph.n_heads].reshape(-1), log_alpha[:, -1]])
        write_safetensors(run / "checkpoint.safetensors", {"log_alpha": flat}, {})


def test_the_heuristic_cores_subnetworks_as_node_scores(tmp_path):
    graph = Graph(2, 2, 8)
    # per layer [H0, H1, MLP]; L0.H0 in both runs, L1.H1 in one, the rest in none or one
    first = torch.tensor([[1, 0, 1], [0, 1, 1]], dtype=torch.bool)
    second = torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    gates = [torch.tensor([[3.0, -1.0, 2.0], [-2.0, 1.0, 0.5]]),
             torch.tensor([[4.0, 0.5, 1.0], [-3.0, -1.0, -0.5]])]  # fmt: skip
    _fake_sweep(tmp_path, graph, [first, second], gates)
    nodes = NodeScores.from_subnetworks(graph, tmp_path)
    assert nodes.method == "heuristic-core" and nodes.n_examples == 2 and nodes.mib_sign
    assert math.isnan(float(nodes.scores[0]))  # the input: never pruned, unscored
    share = (first.double() + second.double()).reshape(-1) / 2
    tie = torch.stack(gates).sigmoid().mean(0).reshape(-1).double() / 3
    torch.testing.assert_close(nodes.scores[1:], share + tie)
    # the count decides first: L0.MLP (in both) above L0.H1 (in one), whatever the gates
    assert nodes.scores[graph.mlp_sender(0)] > nodes.scores[graph.head_sender(0, 1)]
    nodes.save(tmp_path / "nodes.safetensors")
    back = load_scores(tmp_path / "nodes.safetensors")
    assert isinstance(back, NodeScores) and back.graph == graph and back.method == nodes.method
    assert back.mib_sign and back.n_examples == 2
    torch.testing.assert_close(back.scores, nodes.scores, equal_nan=True)
    with pytest.raises(InterventionError, match="subnetworks in"):
        NodeScores.from_subnetworks(Graph(3, 2, 8), tmp_path)


def test_edge_pruning_gates_are_not_summed_into_node_scores():
    from mi_core.circuits import EdgeScores

    graph = Graph(2, 2, 8)
    gates = EdgeScores(graph, torch.zeros(graph.n_edges), "edge-pruning", 1)
    with pytest.raises(InterventionError, match="not additive"):
        NodeScores.from_edges(gates)
    with pytest.raises(InterventionError, match="not additive"):
        mib_circuits(gates, True, MIB_PERCENTAGES, "node")


def test_cli_evaluates_a_sweeps_subnetworks_at_the_node_level(tmp_path, capsys, tiny_checkpoints):
    from mi_core.circuits.job import load_circuit_pairs
    from mi_core.cli import main
    from mi_core.models import load_model

    model_path = str(tiny_checkpoints["gpt2-lm"])
    model = load_model(model_path)
    graph = Graph.from_model(model)
    generator = torch.Generator().manual_seed(3)
    shape = (graph.n_layers, graph.n_heads + 1)
    runs = [torch.rand(shape, generator=generator) > 0.5 for _ in range(3)]
    _fake_sweep(tmp_path / "sweep", graph, runs, [torch.randn(shape, generator=generator)
                                                  for _ in range(3)])  # fmt: skip
    out = tmp_path / "nodes"
    argv = ["circuit", "evaluate", "--model", model_path, "--n-examples", "16", "--no-progress",
            "--scores", str(tmp_path / "sweep"), "--level", "node", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "heuristic-core scores at the node level" in capsys.readouterr().out
    summary = json.loads((out / "mib_score.json").read_text())
    nodes = load_scores(out / "node_scores.safetensors")
    judge = load_circuit_pairs(model, "ioi", 16).split(0.5)[1]
    signed = mib_score(model, nodes, judge, level="node", absolute=False)
    assert summary["level"] == "node" and summary["cpr"] == pytest.approx(signed.cpr, abs=1e-9)
    assert summary["rankings"]["signed"]["faithfulness"] == pytest.approx(signed.faithfulness)
    # a folder at the edge level: one line, exit 2
    argv[argv.index("--level") + 1] = "edge"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scored per node" in err[0]


def test_output_masks_patch_each_output_dimension(tmp_path):
    from mi_core.interventions import apply, load_intervention
    from mi_core.interventions.edges import OutputMask, node_outputs

    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(4, 6, high=90)
    graph = Graph.from_model(model)
    with torch.no_grad():
        clean, corrupted = model(**pairs.clean), model(**pairs.corrupted)
        ones = torch.ones(graph.n_senders, graph.d_model)
        with apply(model, OutputMask(graph, ones).patching(model, **pairs.corrupted)):
            kept = model(**pairs.clean)
        with apply(model, OutputMask(graph, 0 * ones).patching(model, **pairs.corrupted)):
            none = model(**pairs.clean)
        torch.testing.assert_close(kept, clean)
        torch.testing.assert_close(none, corrupted, atol=1e-4, rtol=1e-4)  # every output patched
        # one dimension of one head: the head's output there is the corrupted run's, and the
        # rest of every output is what the patched run computes
        weights = ones.clone()
        head = graph.head_sender(1, 2)
        weights[head, 3] = 0.0
        outputs_corrupted = node_outputs(model, graph, **pairs.corrupted)
        seen = {}
        with apply(model, OutputMask(graph, weights).with_corrupted(outputs_corrupted)):
            model.run_with_hooks(**pairs.clean, fwd_hooks=[
                ("blocks.1.attn.hook_z", lambda z, hook: seen.setdefault("z", z.clone())),
                ("blocks.1.hook_attn_out", lambda x, hook: seen.setdefault("out", x.clone())),
            ])  # fmt: skip
        w_o, b_o = model.blocks[1].attn.W_O, model.blocks[1].attn.b_O
        results = torch.einsum("bphe,hem->hbpm", seen["z"], w_o)
        results[2, :, :, 3] = outputs_corrupted[head, :, :, 3]
        torch.testing.assert_close(seen["out"], results.sum(0) + b_o, atol=1e-5, rtol=1e-5)
        # the mean fill: the same arithmetic with the means
        means = torch.randn(graph.n_senders, graph.d_model)
        with apply(model, OutputMask(graph, 0 * ones, "mean", means=means)):
            filled = model.run_with_hooks(**pairs.clean, fwd_hooks=[
                ("blocks.0.hook_resid_pre", lambda x, hook: seen.setdefault("input", x.clone()))
            ])  # fmt: skip
        torch.testing.assert_close(seen["input"], means[0].expand_as(seen["input"]))
        assert not torch.allclose(filled, clean)
    mask = OutputMask(graph, weights, "mean", means=means)
    back = load_intervention(mask.save(tmp_path / "mask.safetensors"))
    assert isinstance(back, OutputMask) and torch.equal(back.weights, weights)
    assert torch.equal(back.means, means) and back.graph == graph
    with pytest.raises(InterventionError, match="corrupted run"):
        OutputMask(graph, weights).hooks(model)
    with pytest.raises(InterventionError, match="weights of shape"):
        OutputMask(graph, weights[:3])
    with pytest.raises(InterventionError, match="means of shape"):
        OutputMask(graph, weights, "mean")
