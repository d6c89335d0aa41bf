"""Circuits refined by gradient-guided edge swaps (:mod:`mi_core.circuits.refine`): the
gradient at a circuit against finite differences of the masked forward, and each target's
refinement against the exact metric of what it returns."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import random_prompt_pairs, tiny_model

from mi_core.circuits import circuit_gradient, refine_circuit, refine_mib_circuits
from mi_core.circuits.evaluate import masked_metrics
from mi_core.circuits.metrics import logit_difference
from mi_core.circuits.mib import MIB_PERCENTAGES, mib_score
from mi_core.circuits.refine import held_out_error
from mi_core.errors import ConfigError
from mi_core.interventions.edges import EdgeMask, Graph


@pytest.fixture(scope="module")
def setup():
    """A tiny GPT-2, random pairs, its graph and a random connected circuit of it."""
    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(6, 7, high=90)
    graph = Graph.from_model(model)
    kept = torch.rand(graph.n_edges, generator=torch.Generator().manual_seed(0)) < 0.3
    return model, pairs, graph, graph.connected(kept)


def _baselines(model, graph, pairs):
    """Each pair's metric in the full model and the empty circuit's mean metric."""
    return {"full": _values(model, graph, torch.ones(graph.n_edges), pairs),
            "empty": _metric(model, graph, torch.zeros(graph.n_edges), pairs)}  # fmt: skip


def _values(model, graph, weights, pairs):
    mask = EdgeMask(graph, weights.float())
    [(values, _)], _ = masked_metrics(model, [mask], pairs, logit_difference, 4)
    return values


def _metric(model, graph, weights, pairs):
    return float(_values(model, graph, weights, pairs).double().mean())


def _squared_error(model, graph, weights, pairs, full):
    return float(((_values(model, graph, weights, pairs) - full) ** 2).mean())


def _held_out_error(model, graph, weights, pairs, full):
    difference = _values(model, graph, weights, pairs).double() - full.double()
    return held_out_error(float(difference.mean()), float((difference**2).mean()), len(pairs))


@pytest.mark.parametrize("objective", ["mean", "squared error"])
def test_circuit_gradient_is_the_masked_forward_s_derivative(setup, objective):
    model, pairs, graph, kept = setup
    full = _baselines(model, graph, pairs)["full"] if objective == "squared error" else None

    def value_of(weights):
        if full is None:
            return _metric(model, graph, weights, pairs)
        return _squared_error(model, graph, weights, pairs, full)

    value, grad = circuit_gradient(model, graph, kept, pairs, batch_size=4, against=full)
    assert value == pytest.approx(value_of(kept), abs=1e-5)
    eps = 1e-3
    for edge in [int(torch.nonzero(kept)[0]), int(torch.nonzero(~kept)[0]),
                 int(grad.abs().argmax())]:  # fmt: skip
        up, down = kept.float().clone(), kept.float().clone()
        up[edge] += eps
        down[edge] -= eps
        estimate = (value_of(up) - value_of(down)) / (2 * eps)
        assert float(grad[edge]) == pytest.approx(estimate, rel=1e-3, abs=1e-4)


def test_refining_for_cpr_raises_the_faithfulness_within_the_budget(setup):
    model, pairs, graph, kept = setup
    budget = int(kept.sum())
    ends = _baselines(model, graph, pairs)
    refined, history = refine_circuit(model, graph, kept, pairs, budget, "cpr", rounds=4, **ends)
    assert int(refined.sum()) <= budget
    assert torch.equal(graph.connected(refined), refined)
    full, empty = float(ends["full"].double().mean()), ends["empty"]
    faithfulness = [(v - empty) / (full - empty) for v in history]
    assert faithfulness[-1] > faithfulness[0]  # a random circuit leaves room
    assert history[-1] == pytest.approx(_metric(model, graph, refined, pairs), abs=1e-5)


def test_held_out_error_by_hand():
    # 8 pairs: a quarter of the variance (squared - bias ** 2 = 3) joins the bias squared
    assert held_out_error(1.0, 4.0, 8) == pytest.approx(0.75 * 1.0 + 0.25 * 4.0)
    assert held_out_error(1.0, 4.0, 2) == pytest.approx(4.0)  # two pairs: all of it


def test_refining_for_cmd_lowers_the_expected_held_out_error(setup):
    model, pairs, graph, kept = setup
    ends = _baselines(model, graph, pairs)
    budget = int(kept.sum()) + 20  # room to add what the random circuit lacks
    refined, history = refine_circuit(model, graph, kept, pairs, budget, "cmd", rounds=4, **ends)
    assert history[-1] < history[0]
    assert history[-1] == pytest.approx(
        _held_out_error(model, graph, refined, pairs, ends["full"]), abs=1e-5
    )
    # from the whole graph CMD has nothing to gain; CPR goes past the model by dropping edges
    whole = torch.ones(graph.n_edges, dtype=torch.bool)
    for_cmd, _ = refine_circuit(model, graph, whole, pairs, graph.n_edges, "cmd", **ends)
    for_cpr, _ = refine_circuit(model, graph, whole, pairs, graph.n_edges, "cpr", **ends)
    assert torch.equal(for_cmd, whole)
    full, empty = float(ends["full"].double().mean()), ends["empty"]
    faithfulness = (_metric(model, graph, for_cpr, pairs) - empty) / (full - empty)
    assert faithfulness > 1.05 and int(for_cpr.sum()) < graph.n_edges


def test_refine_mib_circuits_keeps_every_size_s_budget(setup):
    model, pairs, graph, _ = setup
    scores = torch.rand(graph.n_edges, generator=torch.Generator().manual_seed(1))
    start = [EdgeMask.top_k(graph, scores, int(p * graph.n_edges)) if p * graph.n_edges >= 1
             else EdgeMask.empty(graph) for p in MIB_PERCENTAGES]  # fmt: skip
    refined = refine_mib_circuits(model, start, pairs, "cpr", rounds=2, batch_size=4)
    for pct, circuit in zip(MIB_PERCENTAGES[:-1], refined, strict=False):
        assert circuit.n_kept <= int(pct * graph.n_edges)
    assert refined[-1].n_kept == graph.n_edges
    before = mib_score(model, [EdgeMask(graph, graph.connected(c.weights > 0.5).float())
                               for c in start[:-1]] + [start[-1]], pairs)  # fmt: skip
    after = mib_score(model, refined, pairs)
    assert after.cpr >= before.cpr


def test_refine_refuses_what_it_cannot_do(setup):
    model, pairs, graph, kept = setup
    ends = _baselines(model, graph, pairs)
    with pytest.raises(ConfigError, match="target must be"):
        refine_circuit(model, graph, kept, pairs, 10, "kl", **ends)
    with pytest.raises(ConfigError, match="score the same"):
        refine_circuit(model, graph, kept, pairs, 10, "cmd", full=torch.ones(len(pairs)),
                       empty=1.0)  # fmt: skip
    with pytest.raises(ConfigError, match="full-model values for"):
        refine_circuit(model, graph, kept, pairs, 10, "cmd", full=torch.ones(2), empty=0.0)
    with pytest.raises(ConfigError, match="full-model values for"):
        circuit_gradient(model, graph, kept, pairs, against=torch.ones(1))
    with pytest.raises(ConfigError, match="kept flags"):
        circuit_gradient(model, graph, kept[:5], pairs)
    with pytest.raises(ConfigError, match="over its budget"):
        refine_circuit(model, graph, kept, pairs, 1, "cpr", **ends)
    zeros = [EdgeMask.full(graph, "zero")] * len(MIB_PERCENTAGES)
    with pytest.raises(ConfigError, match="corrupted-fill circuits"):
        refine_mib_circuits(model, zeros, pairs)
    with pytest.raises(ConfigError, match="one circuit per MIB size"):
        refine_mib_circuits(model, zeros[:2], pairs)


def test_cli_evaluates_and_submits_the_circuits_made(tmp_path, capsys, tiny_checkpoints):
    """``circuit evaluate --circuits chosen|refined``: each metric's circuits made on the
    finding pairs, written, and judged on the held-out ones; ``circuit submit --circuits``
    writes them as MIB's nine circuits."""
    from mi_core.circuits import EdgeScores
    from mi_core.circuits.job import load_circuit_pairs
    from mi_core.cli import main
    from mi_core.models import load_model

    model_path = str(tiny_checkpoints["gpt2-lm"])
    common = ["--model", model_path, "--n-examples", "16", "--no-progress"]
    assert main(["circuit", "attribute", *common, "--method", "eap", "--out",
                 str(tmp_path / "eap")]) == 0  # fmt: skip
    scores_file = str(tmp_path / "eap" / "scores.safetensors")
    summaries = {}
    for kind in ("chosen", "refined"):
        out = tmp_path / kind
        assert main(["circuit", "evaluate", *common, "--scores", scores_file, "--circuits", kind,
                     "--refine-rounds", "2", "--out", str(out)]) == 0  # fmt: skip
        assert f"{kind} for cpr, circuits in {out}/circuits/cpr" in capsys.readouterr().out
        summaries[kind] = json.loads((out / "mib_score.json").read_text())
    model = load_model(model_path)
    find, judge = load_circuit_pairs(model, "ioi", 16).split(0.5)
    graph = EdgeScores.load(scores_file).graph
    made = {}
    for kind, summary in summaries.items():
        assert summary["circuits"] == kind
        for target, ranking in (("cpr", "signed"), ("cmd", "absolute")):
            folder = tmp_path / kind / "circuits" / target
            circuits = [EdgeMask.load(folder / f"{p:g}.safetensors") for p in MIB_PERCENTAGES[:-1]]
            for pct, circuit in zip(MIB_PERCENTAGES, circuits, strict=False):
                assert circuit.n_kept <= int(pct * graph.n_edges)
            circuits.append(EdgeMask.full(graph))
            judged = mib_score(model, circuits, judge)  # the held-out pairs judge what was made
            assert summary[target] == pytest.approx(getattr(judged, target), abs=1e-9)
            assert summary["rankings"][ranking]["faithfulness"] == pytest.approx(
                judged.faithfulness
            )
            made[kind, target] = (mib_score(model, circuits, find), circuits)
    # refining moves the finding pairs' numbers the way each metric wants
    assert made["refined", "cpr"][0].cpr >= made["chosen", "cpr"][0].cpr
    assert made["refined", "cpr"][0].faithfulness != made["chosen", "cpr"][0].faithfulness
    full = _values(model, graph, torch.ones(graph.n_edges), find)
    for refined, chosen in zip(made["refined", "cmd"][1], made["chosen", "cmd"][1], strict=True):
        errors = [_held_out_error(model, graph, c.weights, find, full) for c in (refined, chosen)]
        assert errors[0] <= errors[1] + 1e-6

    submit = ["circuit", "submit", "--scores", scores_file, "--task", "ioi", "--model-name",
              "gpt2", "--form", "circuits", "--circuits",
              str(tmp_path / "refined" / "circuits" / "cpr")]  # fmt: skip
    assert main([*submit, "--out", str(tmp_path / "sub")]) == 0
    nine = tmp_path / "sub" / "mi-core_patching_edge" / "ioi_gpt2"
    for pct in MIB_PERCENTAGES[:-1]:
        written = EdgeMask.from_json(graph, nine / f"{pct:g}.json")
        given = EdgeMask.load(tmp_path / "refined" / "circuits" / "cpr" / f"{pct:g}.safetensors")
        assert torch.equal(written.weights > 0.5, given.weights > 0.5)
    capsys.readouterr()
    refine = ["circuit", "evaluate", *common, "--scores", scores_file, "--circuits", "refined"]
    for argv in (
        [*submit, "--form", "importances", "--out", str(tmp_path / "x")],  # nine circuits only
        [*submit[:-1], str(tmp_path), "--out", str(tmp_path / "y")],  # no circuits in it
        [*refine, "--level", "node", "--out", str(tmp_path / "z")],
        [*refine, "--fill", "zero", "--out", str(tmp_path / "w")],
        [*refine, "--refine-rounds", "0", "--out", str(tmp_path / "v")],
        [*submit, "--ablation", "zero", "--out", str(tmp_path / "u")],  # made under patching
    ):
        assert main(argv) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not any((tmp_path / name).exists() for name in "xyzwvu")
    # a top-n run into a folder of made circuits leaves none of them beside its scores
    assert main(["circuit", "evaluate", *common, "--scores", scores_file, "--out",
                 str(tmp_path / "refined")]) == 0  # fmt: skip
    assert not any((tmp_path / "refined" / "circuits").rglob("*.safetensors"))


def test_a_round_s_flips_keep_the_budget():
    from mi_core.circuits.refine import _flips

    kept = torch.tensor([True, True, False, False, False])
    gain = torch.tensor([0.1, -1.0, 5.0, 0.3, 0.2])  # removing edge 0 gains, edge 1 loses
    assert _flips(kept, gain, budget=4, n_flips=3).tolist() == [False, True, True, True, True]
    assert _flips(kept, gain, budget=2, n_flips=3).tolist() == [False, True, True, False, False]
    assert _flips(kept, gain, budget=4, n_flips=1).tolist() == [False, True, True, False, False]


def test_a_matching_round_passes_over_an_edge_that_carries_the_answer():
    from mi_core.circuits.refine import _matching_flips

    kept = torch.tensor([True, True, False, False])
    # removing edge 0 lowers the squared difference to first order (-4) but moves the mean by
    # -3: 0.75 * 9 + 0.25 * (9 - 4) > 0 once the shift is squared; adding edge 2 helps
    squared_grad = torch.tensor([4.0, 0.0, -1.0, 0.0])
    mean_grad = torch.tensor([3.0, 0.0, 0.1, 0.0])
    new = _matching_flips(kept, squared_grad, mean_grad, bias=0.0, n=8, budget=3, n_flips=2)
    assert new.tolist() == [True, True, True, False]
