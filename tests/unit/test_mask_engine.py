"""The one mask-learning engine: every registered objective with every kind of mask the pruning
loop learns (as test_families runs every family). For each pair: the value is zero with every
gate at 1, a gradient reaches the gates, a run removes exactly its target's count, and a run
killed after a checkpoint resumes to the bit-identical result. Neuron gates against the
neuron masks they become, and the cripple terms by hand. Edges (made per graph) run in the same
loop with every objective that compares answer logits."""

from __future__ import annotations

import pytest
import torch
from helpers import kill_at, random_prompt_pairs, random_tokens, tiny_model

from mi_core.circuits.prune import EdgePruneSettings, Edges, discretize_circuit
from mi_core.data import tokenize_pairs
from mi_core.data.batches import TokenizedFocusCripple, TokenizedText
from mi_core.errors import ConfigError
from mi_core.interventions import Graph
from mi_core.interventions.neurons import NeuronGates, PruneMasks
from mi_core.methods.separability.learned import binary_neuron_masks
from mi_core.pruning import make_prune_config
from mi_core.pruning.loop import discrete_mask, start_run, train_group
from mi_core.pruning.mask_kinds import COMPONENTS, MASK_KINDS, NEURONS
from mi_core.pruning.objectives import OBJECTIVES, Separate, resolve_objective
from mi_core.pruning.reference_logits import compute_reference_logits
from mi_core.pruning.step import StepMember

PAIRS = [(o, k) for o in OBJECTIVES for k in MASK_KINDS]
#: The objectives edges learn with: those comparing answer logits.
ANSWER_OBJECTIVES = [o.name for o in OBJECTIVES.values() if not o.every_position]


def _training_data(name: str, answer, ioi):
    """Data each objective is defined on: IOI prompts for the answer objectives, random text
    windows for every_position_kl, two texts for separate."""
    if name in ("answer_kl", "logit_diff"):
        return tokenize_pairs(ioi, answer.tokenizer)
    low = random_tokens(8, 12, seed=1, low=5, high=60).tolist()
    if name == "every_position_kl":
        return TokenizedText(low, [[0] * 12] * 8, [0] * 8, 12, 0, 0, [], "text:random")
    high = random_tokens(8, 12, seed=2, low=60, high=120).tolist()
    return TokenizedFocusCripple.join(low, high, 0, "low / high")


def _reference(objective, answer, tokens):
    return compute_reference_logits(answer, tokens) if objective.needs_reference else None


@pytest.mark.parametrize(("name", "kind_name"), PAIRS)
def test_every_objective_with_every_mask_kind(answer, ioi, name, kind_name, tmp_path):
    kind = MASK_KINDS[kind_name]
    tokens = _training_data(name, answer, ioi)
    objective = resolve_objective(name, tokens)
    targets = objective.targets(tokens, _reference(objective, answer, tokens))
    batch = tokens.collate(range(len(tokens)))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    index = torch.as_tensor(batch["index"])
    n = kind.n_gates(answer)
    mask = kind.blank(answer, torch.device("cpu"))
    with kind.applied(answer, mask, None, "zero"):
        kind.assign(mask, torch.ones(n))
        assert objective.per_example(answer, mask, inputs, targets, index).abs().max() < 1e-6
        z = torch.full((n,), 0.7, requires_grad=True)
        kind.assign(mask, z)
        objective.per_example(answer, mask, inputs, targets, index).mean().backward()
    assert z.grad is not None and z.grad.abs().max() > 0

    cfg = make_prune_config(
        "cofi", target_sparsity=0.3, seed=5, steps=6, batch_size=4, lr_log_alpha=0.8,
        checkpoint_every=3, eval_every=0, fill="zero", discretize="exact", objective=name,
    )  # fmt: skip
    runs = {}
    for label in ("whole", "killed"):
        state = start_run(answer, tokens, cfg, tmp_path / label, None, kind=kind)
        if label == "killed":
            state.callback = kill_at(2)  # after the checkpoint of step 3
            with pytest.raises(KeyboardInterrupt):
                train_group(answer, None, tokens, _reference(objective, answer, tokens),
                            [state], progress=False)  # fmt: skip
            state = start_run(answer, tokens, cfg, tmp_path / label, None, kind=kind)
            assert state.start == 3
        train_group(answer, None, tokens, _reference(objective, answer, tokens), [state],
                    progress=False)  # fmt: skip
        runs[label] = state
    whole, resumed = runs["whole"], runs["killed"]
    assert torch.equal(whole.gates.log_alpha, resumed.gates.log_alpha)
    assert [r[objective.column] for r in whole.rows] == [r[objective.column] for r in resumed.rows]
    assert whole.gates.log_alpha.shape == (n,)
    assert not torch.equal(whole.gates.log_alpha, torch.full((n,), cfg.log_alpha_init))
    # the binary mask removes exactly the target's count
    wanted = round(cfg.target_sparsity * n)
    if kind is COMPONENTS:
        binary, _ = discrete_mask(whole.gates.log_alpha.detach(), answer.cfg, 0.3, cfg, None)
        removed = int((binary.heads == 0).sum() + (binary.mlps == 0).sum())
    else:
        gates = NEURONS.blank(answer, torch.device("cpu"))
        masks = binary_neuron_masks(whole.gates.log_alpha, wanted, gates, 1)
        removed = masks.n_ff_pruned + masks.n_attn_pruned
    assert removed == wanted


@pytest.mark.parametrize("name", ["every_position_kl", "separate"])
def test_neuron_runs_trained_together_equal_the_runs_alone(answer, ioi, name):
    """A batched group takes neuron masks (one row of gates per example, as heads and MLPs):
    each run of the group learns what it learns alone, the shorter run stopping at its own
    last step."""
    tokens = _training_data(name, answer, ioi)
    configs = [
        make_prune_config("cofi", target_sparsity=s, seed=seed, steps=steps, batch_size=4,
                          lr_log_alpha=0.8, eval_every=0, fill="zero", objective=name,
                          dropout=False)
        for s, seed, steps in ((0.3, 1, 5), (0.3, 2, 5), (0.6, 1, 3))
    ]  # fmt: skip

    def states():
        return [start_run(answer, tokens, c, None, None, kind=NEURONS) for c in configs]

    alone = states()
    for state in alone:
        train_group(answer, None, tokens, None, [state], progress=False)
    together = states()
    train_group(answer, None, tokens, None, together, progress=False)
    column = resolve_objective(name, tokens).column
    for a, t in zip(alone, together, strict=True):
        assert (t.gates.log_alpha - a.gates.log_alpha).abs().max() < 1e-4
        assert [r[column] for r in t.rows] == pytest.approx([r[column] for r in a.rows], abs=1e-5)
        assert len(t.rows) == t.cfg.steps
    assert (together[0].gates.log_alpha - together[1].gates.log_alpha).abs().max() > 1e-3


@pytest.mark.parametrize("nodes", [None, 0.5], ids=["edges", "edges+nodes"])
@pytest.mark.parametrize("name", ANSWER_OBJECTIVES)
def test_edges_with_every_answer_objective(name, nodes, tmp_path):
    """The edge kind in the one loop: zero at every gate 1 (the step's objective value with
    log_alpha far above the stretch, where every sampled gate is exactly 1), a gradient
    reaching the gates, the exact count kept, and a bit-identical resume after a kill."""
    model = tiny_model("gpt2")
    pairs = random_prompt_pairs(16, 6, high=90)
    graph = Graph.from_model(model)
    settings = EdgePruneSettings(sparsity=0.7, node_sparsity=nodes, steps=6, batch_size=8,
                                 checkpoint_every=3, lr_warmup_steps=0, objective=name)  # fmt: skip
    kind = Edges(graph, settings)
    objective = kind.objective(name, pairs)
    n = kind.n_gates(model)
    assert n == graph.n_edges + (graph.n_senders if nodes else 0)
    targets = kind.targets(model, objective, pairs, None)
    mask = kind.blank(model, torch.device("cpu"))
    with kind.applied(model, mask, None, settings.fill):
        for log_alpha, zero in ((100.0, True), (0.0, False)):
            gates = kind.gates(settings, model)
            with torch.no_grad():
                gates.log_alpha.fill_(log_alpha)
            member = StepMember(gates, kind.controller(), 0.5, torch.Generator().manual_seed(0))
            row = kind.step(model, mask, member, pairs, [list(range(8))], targets, objective,
                            "fp32")  # fmt: skip
            assert (abs(row["objective"]) < 1e-9) is zero, row
            assert gates.log_alpha.grad is not None
            assert (gates.log_alpha.grad.abs().max() > 0) is not zero

    runs = {}
    for label in ("whole", "killed"):
        identity = {"config": settings.to_dict(), "inputs": {"pairs": "fixed"}}

        def start(label=label, identity=identity):
            return start_run(model, pairs, settings, tmp_path / label, None,
                             kind=Edges(graph, settings), identity=identity,
                             what="edge-pruning")  # fmt: skip

        state = start()
        if label == "killed":
            state.callback = kill_at(3)  # after the checkpoint of step 3
            with pytest.raises(KeyboardInterrupt):
                train_group(model, None, pairs, None, [state], progress=False)
            state = start()
            assert state.start == 3
        train_group(model, None, pairs, None, [state], progress=False)
        runs[label] = state
    whole, resumed = runs["whole"], runs["killed"]
    assert torch.equal(whole.gates.log_alpha, resumed.gates.log_alpha)
    assert [r[objective.column] for r in whole.rows] == [r[objective.column] for r in resumed.rows]
    log_alpha = whole.gates.log_alpha.detach()
    weights, kept = discretize_circuit(
        graph, log_alpha[: graph.n_edges], 0.7, log_alpha[graph.n_edges :] if nodes else None,
        nodes,
    )  # fmt: skip
    wanted = round(0.3 * graph.n_edges)
    if nodes:  # the edges kept are among those leaving the nodes kept, as many as there are
        assert len(kept) == round(0.5 * graph.n_senders)
        leaving = sum(graph.senders[int(i)] in kept for i in graph.edges[:, 0])
        wanted = min(wanted, leaving)
    assert int(weights.sum()) == wanted


@pytest.mark.parametrize("fill", ["zero", "mean"])
def test_binary_neuron_gates_are_the_neuron_masks_they_become(answer, fill):
    """Gates of 0 / 1 inside ``NeuronGates.applied`` give the logits of the PruneMasks that
    ``removed`` makes of them (zero and mean fills), and a soft gate interpolates."""
    tokens = random_tokens(3, 9, seed=4, high=120)
    generator = torch.Generator().manual_seed(0)
    fills = PruneMasks.empty(answer)
    if fill == "mean":
        fills.ff_fill = torch.randn(fills.ff_fill.shape, generator=generator)
        fills.attn_fill = torch.randn(fills.attn_fill.shape, generator=generator)
    gates = NeuronGates.ones(answer, fills=fills)
    keep = torch.rand(gates.n_gates, generator=generator) > 0.3
    masks = gates.removed(keep)
    assert masks.n_ff_pruned + masks.n_attn_pruned == int((~keep).sum())
    with torch.no_grad():
        expected = answer.run_with_hooks(tokens, fwd_hooks=masks.hooks(answer))
        full = answer(tokens)
        with gates.applied(answer):
            gates.assign(keep.float())
            got = answer(tokens)
            with gates.kept_all():
                assert torch.allclose(answer(tokens), full, atol=1e-6)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (got - full).abs().max() > 1e-3


def test_neuron_gates_take_one_row_per_example(answer):
    tokens = random_tokens(2, 7, seed=6, high=120)
    gates = NeuronGates.ones(answer)
    rows = torch.ones(2, gates.n_gates)
    rows[1, : gates.n_gates // 2] = 0.0
    with torch.no_grad(), gates.applied(answer):
        gates.assign(rows)
        both = answer(tokens)
        gates.assign(rows[1])
        second = answer(tokens[1:])
    full = answer(tokens[:1])
    torch.testing.assert_close(both[:1], full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[1:], second, atol=1e-5, rtol=1e-5)


def test_the_cripple_terms_by_hand():
    full = torch.tensor([[[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]]])
    masked = torch.tensor([[[0.0, 0.0, 0.0], [1.0, -1.0, 3.0]]])
    ids = torch.tensor([[1, 2]])
    attention = torch.ones(1, 2)
    log_full, log_masked = full.log_softmax(-1), masked.log_softmax(-1)
    uniform = Separate("uniform").cripple(full, masked, ids, attention)
    # CE(U, masked) - CE(U, full), averaged over both positions
    by_hand = (-log_masked.mean(-1) + log_full.mean(-1)).mean()
    assert float(uniform) == pytest.approx(float(by_hand), rel=1e-6)
    # capped: position 0 predicts token 2; the loss rise there, capped at `cap`, negated
    rise = float(log_full[0, 0, 2] - log_masked[0, 0, 2])
    for cap in (0.1, 10.0):
        capped = Separate("capped", cap=cap).cripple(full, masked, ids, attention)
        assert float(capped) == pytest.approx(-min(rise, cap), rel=1e-6)
    assert float(Separate("uniform").cripple(full, full, ids, attention)) == 0.0


def test_separate_takes_focus_and_cripple_text_only(answer, ioi):
    with pytest.raises(ConfigError, match="objective separate takes focus and cripple text"):
        resolve_objective("separate", tokenize_pairs(ioi, answer.tokenizer))
    both = TokenizedFocusCripple.join([[1, 2]], [[3, 4]], 0)
    assert resolve_objective("auto", both).name == "separate"
    with pytest.raises(ConfigError, match="cripple term must be one of"):
        Separate("nope")
    with pytest.raises(ConfigError, match="counts every unit once|count every unit once"):
        from mi_core.pruning.step import sparsity_weights

        sparsity_weights(answer, "params", NEURONS)
