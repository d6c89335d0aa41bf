"""MIB's circuit-localisation scores (:mod:`mi_core.circuits.mib`) against MIB's own evaluator
(hannamw/MIB-circuit-track's ``evaluate_area_under_curve`` on hannamw/EAP-IG's graph, imported
from ../shared/peers/mib) on the same model, graph, scores and pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import random_prompt_pairs, tiny_model

from mi_core.circuits import EdgeScores
from mi_core.circuits.evaluate import mib_scores
from mi_core.circuits.mib import (
    MIB_PERCENTAGES,
    MIBScore,
    _resampled_areas,
    mib_areas,
    mib_circuits,
    mib_difference,
    mib_score,
    select_mib_circuits,
)
from mi_core.circuits.nodes import NodeScores, load_scores
from mi_core.errors import ConfigError
from mi_core.interventions.edges import EdgeMask, Graph, to_mib_name
from mi_core.testing import load_mib_peer, mib_reference_score

PEERS = Path(__file__).resolve().parents[3] / "shared" / "peers" / "mib"


@pytest.fixture(scope="module")
def mib():
    """MIB's evaluator and EAP-IG's Graph, imported from the peers' folder."""
    if not PEERS.is_dir():
        pytest.skip(f"MIB's code is not at {PEERS}")
    return load_mib_peer(PEERS)


@pytest.mark.parametrize("absolute", [True, False])
def test_mib_scores_equal_mibs_evaluator(mib, absolute):
    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(12, 7, high=90)
    graph = Graph.from_model(model)
    generator = torch.Generator().manual_seed(int(absolute))
    scores = EdgeScores(graph, torch.randn(graph.n_edges, generator=generator), "eap", 12)
    ours = mib_score(model, scores, pairs, absolute=absolute, batch_size=6)
    dense = graph.to_dense(mib_scores(scores.scores, scores.method).float())
    assert torch.equal(mib.Graph.from_model(model).real_edge_mask, graph.exists)
    counts, cpr, cmd, _, faithfulness = mib_reference_score(mib, model, dense, pairs, absolute, 6)
    assert ours.faithfulness == pytest.approx(faithfulness, abs=1e-4)
    assert ours.cpr == pytest.approx(cpr, abs=1e-4) and ours.cmd == pytest.approx(cmd, abs=1e-4)
    # MIB's prune stops a pass early when its top-n marked the nodes already, so its counts can
    # hold edges out of nodes with no kept input: under patching they carry what a removed edge
    # would (the faithfulness above is equal); mi_core counts the connected edges only
    assert all(o <= int(c) for o, c in zip(ours.n_edges, counts, strict=True))
    assert ours.n_edges[-1] == int(counts[-1]) == graph.n_edges
    assert ours.faithfulness[-1] == pytest.approx(1.0, abs=1e-6)
    # the two rankings are different circuits
    other = mib_circuits(scores, absolute=not absolute)
    assert any(not torch.equal(a, b) for a, b in zip(mib_circuits(scores, absolute), other,
                                                     strict=True))  # fmt: skip


def test_mib_areas_by_hand_and_circuits_given():
    f = [0.0, 0.5, 1.5, 1.0]
    cpr, cmd = mib_areas(f, (0.1, 0.2, 0.5, 1.0))
    assert cpr == pytest.approx(0.1 * 0.25 + 0.3 * 1.0 + 0.5 * 1.25)
    assert cmd == pytest.approx(0.1 * 0.75 + 0.3 * 0.5 + 0.5 * 0.25)
    with pytest.raises(ConfigError, match="faithfulness values for"):
        mib_areas(f)
    model = tiny_model("gpt2", seed=3)
    graph = Graph.from_model(model)
    pairs = random_prompt_pairs(4, 5, high=90)
    full = [EdgeMask.full(graph)] * len(MIB_PERCENTAGES)
    score = mib_score(model, full, pairs)
    assert score.faithfulness == pytest.approx([1.0] * len(MIB_PERCENTAGES), abs=1e-6)
    assert score.cmd == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ConfigError, match="one per size"):
        mib_score(model, full[:3], pairs)
    with pytest.raises(ConfigError, match="circuits given are edge masks"):
        mib_score(model, full, pairs, level="node")
    assert to_mib_name(graph.edge_names[0]).startswith("input->")


@pytest.mark.parametrize("log_scale", [False, True])
def test_intervals_resample_the_judged_pairs(log_scale):
    """A resample's areas are mib_score's on those pairs (a forward on them); the interval of a
    set of one pair repeated has no width; a paired difference needs the same pairs."""
    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(12, 7, high=90)
    graph = Graph.from_model(model)
    generator = torch.Generator().manual_seed(5)
    scores = EdgeScores(graph, torch.randn(graph.n_edges, generator=generator), "eap", 12)
    score = mib_score(model, scores, pairs, batch_size=6, log_scale=log_scale)
    assert len(score.pair_values) == len(MIB_PERCENTAGES) and len(score.full_values) == 12
    everyone = torch.arange(12)[None]
    cpr, cmd = _resampled_areas(score, everyone)
    assert (float(cpr), float(cmd)) == pytest.approx((score.cpr, score.cmd), abs=1e-9)
    drawn = torch.tensor([3, 3, 0, 7, 11, 11, 11, 5, 2, 9, 9, 1])
    cpr, cmd = _resampled_areas(score, drawn[None])
    again = mib_score(model, scores, pairs.select(drawn), batch_size=4, log_scale=log_scale)
    assert (float(cpr), float(cmd)) == pytest.approx((again.cpr, again.cmd), abs=1e-5)
    wide, narrow = score.interval(0.95, resamples=400), score.interval(0.5, resamples=400)
    for name, point in (("cpr", score.cpr), ("cmd", score.cmd)):
        assert wide[name][0] < narrow[name][0] <= point <= narrow[name][1] < wide[name][1]
    one = mib_score(model, scores, pairs.select(torch.ones(6, dtype=torch.long)), batch_size=6,
                    log_scale=log_scale)  # fmt: skip
    assert one.interval()["cmd"] == pytest.approx((one.cmd, one.cmd), abs=1e-9)
    signed = mib_score(model, scores, pairs, absolute=False, batch_size=6, log_scale=log_scale)
    assert mib_difference(score, score)["cpr"] == (0.0, 0.0)
    lo, hi = mib_difference(signed, score)["cpr"]
    assert lo <= signed.cpr - score.cpr <= hi and lo < hi
    with pytest.raises(ConfigError, match="judged on different pairs"):
        mib_difference(score, one)
    with pytest.raises(ConfigError, match="over different axes"):
        mib_difference(score, MIBScore(**{**score.to_dict(), "log_scale": not log_scale}))
    bare = MIBScore(**{**score.to_dict(), "pair_values": [], "full_values": []})
    with pytest.raises(ConfigError, match="no per-pair values"):
        bare.interval()
    with pytest.raises(ConfigError, match="confidence must be between 0 and 1"):
        score.interval(1.0)


def test_cli_circuit_evaluate_scores_as_mib(tmp_path, capsys, tiny_checkpoints):
    from mi_core.circuits.job import load_circuit_pairs
    from mi_core.cli import main
    from mi_core.models import load_model

    model_path = str(tiny_checkpoints["gpt2-lm"])
    common = ["--model", model_path, "--n-examples", "16", "--no-progress"]
    assert main(["circuit", "attribute", *common, "--method", "eap", "--out",
                 str(tmp_path / "eap")]) == 0  # fmt: skip
    out = tmp_path / "mib"
    scores_file = str(tmp_path / "eap" / "scores.safetensors")
    argv = ["circuit", "evaluate", *common, "--scores", scores_file, "--out", str(out)]
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "mib_score.json").read_text())
    assert f"MIB CPR {summary['cpr']:.3f} (signed ranking" in printed
    assert f"CMD {summary['cmd']:.3f} (|score| ranking" in printed
    # the same numbers in process, on the held-out half of the same pairs
    model = load_model(model_path)
    judge = load_circuit_pairs(model, "ioi", 16).split(0.5)[1]
    scores = EdgeScores.load(tmp_path / "eap" / "scores.safetensors")
    signed = mib_score(model, scores, judge, absolute=False)
    assert summary["cpr"] == pytest.approx(signed.cpr, abs=1e-9)
    assert summary["rankings"]["signed"]["faithfulness"] == pytest.approx(signed.faithfulness)
    assert summary["cmd"] == summary["rankings"]["absolute"]["cmd"]
    low, high = summary["interval"]["cpr"]  # the signed ranking's pairs resampled
    assert (low, high) == pytest.approx(signed.interval()["cpr"], abs=1e-9) and low < high
    assert f"intervals over the pairs CPR {low:.3f}-{high:.3f}" in printed
    # scores of another graph (two layers, not three): one line, exit 2
    other = Graph(2, scores.graph.n_heads, scores.graph.d_model)
    EdgeScores(other, torch.zeros(other.n_edges), "eap", 8).save(tmp_path / "other.safetensors")
    argv[argv.index("--scores") + 1] = str(tmp_path / "other.safetensors")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scores the edges of" in err[0]


@pytest.mark.parametrize("file_format", ["json", "pt"])
def test_a_submission_loads_in_mibs_graph_and_scores_as_ours(mib, tmp_path, capsys, file_format):
    """``mi-core circuit submit``: MIB's own ``Graph.from_json`` / ``from_pt`` read the files;
    the importances are mi_core's scores in MIB's sign, and MIB's evaluator on the graph it
    loaded gives mi_core's CPR; the nine circuits are mi_core's MIB circuits."""
    from mi_core.cli import main

    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(8, 7, high=90)
    graph = Graph.from_model(model)
    generator = torch.Generator().manual_seed(7)
    scores = EdgeScores(graph, torch.randn(graph.n_edges, generator=generator), "eap-ig", 8)
    scores.save(tmp_path / "scores.safetensors")
    common = ["circuit", "submit", "--scores", str(tmp_path / "scores.safetensors"),
              "--task", "arithmetic_addition", "--model-name", "gpt2",
              "--file-format", file_format]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "sub")]) == 0
    folder = tmp_path / "sub" / "mi-core_patching_edge" / "arithmetic-addition_gpt2"
    assert str(folder) in capsys.readouterr().out
    load = mib.Graph.from_json if file_format == "json" else mib.Graph.from_pt
    theirs = load(str(folder / f"importances.{file_format}"))
    expected = graph.to_dense(mib_scores(scores.scores, scores.method).float())
    torch.testing.assert_close(theirs.scores.float() * graph.exists, expected, atol=1e-6, rtol=0)
    assert bool(theirs.in_graph[graph.exists].all())
    _, cpr, cmd, _, _ = mib_reference_score(mib, model, theirs.scores.float(), pairs, False, 4)
    ours = mib_score(model, scores, pairs, absolute=False, batch_size=4)
    assert ours.cpr == pytest.approx(cpr, abs=1e-4) and ours.cmd == pytest.approx(cmd, abs=1e-4)

    assert main([*common, "--form", "circuits", "--out", str(tmp_path / "nine")]) == 0
    nine = tmp_path / "nine" / "mi-core_patching_edge" / "arithmetic-addition_gpt2"
    sizes = [p for p in MIB_PERCENTAGES if p < 1]
    assert sorted(p.name for p in nine.iterdir()) == sorted(f"{p:g}.{file_format}" for p in sizes)
    for pct, kept in zip(sizes, mib_circuits(scores, True, sizes), strict=True):
        circuit = load(str(nine / f"{pct:g}.{file_format}"))
        assert torch.equal(circuit.in_graph.bool()[graph.exists], kept)
    # a scores file that is not one: one line, exit 2, nothing written
    (tmp_path / "bad.safetensors").write_text("no")
    common[common.index("--scores") + 1] = str(tmp_path / "bad.safetensors")
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "bad")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("target", ["cpr", "cmd"])
def test_selected_circuits_beat_plain_top_n_on_the_pairs_they_are_chosen_on(target):
    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(8, 7, high=90)
    graph = Graph.from_model(model)
    generator = torch.Generator().manual_seed(11)
    scores = EdgeScores(graph, torch.randn(graph.n_edges, generator=generator), "eap-ig", 8)
    chosen = select_mib_circuits(model, scores, pairs, target, batch_size=4)
    assert len(chosen) == len(MIB_PERCENTAGES) and chosen[-1].n_kept == graph.n_edges
    for circuit, pct in zip(chosen, MIB_PERCENTAGES, strict=True):
        assert circuit.n_kept <= int(pct * graph.n_edges)
    picked = mib_score(model, chosen, pairs, batch_size=4).faithfulness
    plain = [mib_score(model, scores, pairs, absolute=a, batch_size=4).faithfulness
             for a in (True, False)]  # fmt: skip
    for k in range(len(MIB_PERCENTAGES) - 1):  # each size: at least as good as either top-n
        if target == "cmd":
            assert abs(1 - picked[k]) <= min(abs(1 - p[k]) for p in plain) + 1e-6
        else:
            assert picked[k] >= max(p[k] for p in plain) - 1e-6
    with pytest.raises(ConfigError, match="for_metric must be cpr or cmd"):
        select_mib_circuits(model, scores, pairs, "kl")


@pytest.mark.parametrize("absolute", [True, False])
def test_node_level_scores_equal_mibs_evaluator(mib, absolute):
    """MIB's node level: the top nodes of the scored ones (an unscored, NaN, node always in),
    every node outside patched; mi_core's faithfulness, CPR and CMD equal MIB's evaluator."""
    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(12, 7, high=90)
    graph = Graph.from_model(model)
    generator = torch.Generator().manual_seed(5 + int(absolute))
    values = torch.randn(graph.n_senders, generator=generator, dtype=torch.float64)
    values[graph.mlp_sender(0)] = float("nan")  # unscored: kept at every size
    nodes = NodeScores(graph, values, "eap")
    ours = mib_score(model, nodes, pairs, level="node", absolute=absolute, batch_size=6)
    dense = torch.zeros(graph.exists.shape)
    _, cpr, cmd, _, faithfulness = mib_reference_score(
        mib, model, dense, pairs, absolute, 6, node_scores=nodes.ranked().float()
    )
    assert ours.level == "node"
    assert ours.faithfulness == pytest.approx(faithfulness, abs=1e-4)
    assert ours.cpr == pytest.approx(cpr, abs=1e-4) and ours.cmd == pytest.approx(cmd, abs=1e-4)
    # the ranking decides: the node circuits are not the edge circuits of the same sizes
    assert ours.n_edges[0] > 0  # the unscored MLP and its edge to the output, even at 0 nodes
    # edge scores at the node level are summed per node, then ranked as node scores
    edges = EdgeScores(graph, torch.randn(graph.n_edges, generator=generator), "eap", 12)
    summed = mib_score(model, edges, pairs, level="node", absolute=absolute, batch_size=6)
    direct = mib_score(model, NodeScores.from_edges(edges), pairs, level="node",
                       absolute=absolute, batch_size=6)  # fmt: skip
    assert summed.faithfulness == direct.faithfulness
    with pytest.raises(ConfigError, match="rank nodes, not edges"):
        mib_score(model, nodes, pairs)


@pytest.mark.parametrize("file_format", ["json", "pt"])
def test_a_node_level_submission_scores_in_mib_as_ours(mib, tmp_path, file_format):
    from mi_core.cli import main

    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(8, 7, high=90)
    graph = Graph.from_model(model)
    values = torch.randn(graph.n_senders, generator=torch.Generator().manual_seed(2))
    values[0] = float("nan")
    NodeScores(graph, values.double(), "eap-ig", 8).save(tmp_path / "nodes.safetensors")
    common = ["circuit", "submit", "--scores", str(tmp_path / "nodes.safetensors"),
              "--task", "ioi", "--model-name", "gpt2", "--file-format", file_format]  # fmt: skip
    assert main([*common, "--level", "node", "--out", str(tmp_path / "sub")]) == 0
    folder = tmp_path / "sub" / "mi-core_patching_node" / "ioi_gpt2"
    load = mib.Graph.from_json if file_format == "json" else mib.Graph.from_pt
    theirs = load(str(folder / f"importances.{file_format}"))
    nodes = NodeScores(graph, values.double(), "eap-ig", 8)
    torch.testing.assert_close(theirs.nodes_scores.double(), nodes.ranked(), equal_nan=True)
    _, cpr, cmd, _, _ = mib_reference_score(mib, model, None, pairs, False, 4, graph=theirs)
    ours = mib_score(model, nodes, pairs, level="node", absolute=False, batch_size=4)
    assert ours.cpr == pytest.approx(cpr, abs=1e-4) and ours.cmd == pytest.approx(cmd, abs=1e-4)
    # the nine circuits: MIB's node-level circuits, as mi_core ranks them
    assert main([*common, "--level", "node", "--form", "circuits",
                 "--out", str(tmp_path / "nine")]) == 0  # fmt: skip
    nine = tmp_path / "nine" / "mi-core_patching_node" / "ioi_gpt2"
    sizes = [p for p in MIB_PERCENTAGES if p < 1]
    for pct, kept in zip(sizes, mib_circuits(nodes, True, sizes, "node"), strict=True):
        circuit = load(str(nine / f"{pct:g}.{file_format}"))
        assert torch.equal(circuit.in_graph.bool()[graph.exists], kept)
    # node scores submitted at the edge level: one line, exit 2
    assert main([*common, "--out", str(tmp_path / "edge")]) == 2


@pytest.mark.parametrize("absolute", [True, False])
def test_neuron_level_scores_equal_mibs_evaluator(mib, absolute):
    """MIB's neuron level: the top output dimensions of every node, the rest of each output
    patched wherever it goes (an OutputMask); equal to MIB's evaluator."""
    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(12, 7, high=90)
    graph = Graph.from_model(model)
    generator = torch.Generator().manual_seed(9 + int(absolute))
    values = torch.randn(graph.n_senders, graph.d_model, generator=generator, dtype=torch.float64)
    values[graph.head_sender(1, 0), :5] = float("nan")  # unscored: kept at every size
    neurons = NodeScores(graph, values, "eap")
    ours = mib_score(model, neurons, pairs, level="neuron", absolute=absolute, batch_size=6)
    dense = torch.zeros(graph.exists.shape)
    _, cpr, cmd, _, faithfulness = mib_reference_score(
        mib, model, dense, pairs, absolute, 6, node_scores=neurons.ranked().float()
    )
    assert ours.level == "neuron" and ours.n_edges[0] == 5
    assert ours.faithfulness == pytest.approx(faithfulness, abs=1e-4)
    assert ours.cpr == pytest.approx(cpr, abs=1e-4) and ours.cmd == pytest.approx(cmd, abs=1e-4)
    with pytest.raises(ConfigError, match="score per output dimension"):
        mib_score(model, NodeScores(graph, values[:, 0], "eap"), pairs, level="neuron")


def test_a_neuron_level_submission_scores_in_mib_as_ours(mib, tmp_path, capsys,
                                                         tiny_checkpoints):  # fmt: skip
    """``circuit attribute --neurons`` writes the output dimensions' scores; ``circuit submit
    --level neuron`` writes them as MIB reads them; MIB's evaluator on what it loaded gives
    mi_core's CPR and CMD; ``circuit evaluate --level neuron`` scores them."""
    from mi_core.circuits.job import load_circuit_pairs
    from mi_core.cli import main
    from mi_core.models import load_model

    model_path = str(tiny_checkpoints["gpt2-lm"])
    common = ["--model", model_path, "--n-examples", "12", "--no-progress"]
    assert main(["circuit", "attribute", *common, "--method", "eap", "--neurons",
                 "--out", str(tmp_path / "eap")]) == 0  # fmt: skip
    neurons_file = tmp_path / "eap" / "neuron_scores.safetensors"
    neurons = load_scores(neurons_file)
    assert isinstance(neurons, NodeScores) and neurons.level == "neuron"
    submit = ["circuit", "submit", "--scores", str(neurons_file), "--task", "ioi",
              "--model-name", "gpt2", "--level", "neuron"]  # fmt: skip
    # JSON: refused (MIB's from_json gives every head of a layer the last head's neurons)
    capsys.readouterr()
    assert main([*submit, "--out", str(tmp_path / "json")]) == 2
    assert "--file-format pt" in capsys.readouterr().err and not (tmp_path / "json").exists()
    submit += ["--file-format", "pt"]
    assert main([*submit, "--out", str(tmp_path / "sub")]) == 0
    folder = tmp_path / "sub" / "mi-core_patching_neuron" / "ioi_gpt2"
    load = mib.Graph.from_pt
    theirs = load(str(folder / "importances.pt"))
    torch.testing.assert_close(theirs.neurons_scores.double(), neurons.ranked(), atol=1e-6,
                               rtol=1e-6)  # fmt: skip
    model = load_model(model_path)
    judge = load_circuit_pairs(model, "ioi", 12).split(0.5)[1]
    # batches of equal size: MIB averages its batches' means, mi_core the examples
    _, cpr, cmd, _, _ = mib_reference_score(mib, model, None, judge, True, 3, graph=theirs)
    ours = mib_score(model, neurons, judge, level="neuron", absolute=True, batch_size=3)
    assert ours.cpr == pytest.approx(cpr, abs=1e-4) and ours.cmd == pytest.approx(cmd, abs=1e-4)
    # the nine circuits: each size's kept dimensions, and the edges of their nodes
    assert main([*submit, "--form", "circuits", "--out", str(tmp_path / "nine")]) == 0
    nine = tmp_path / "nine" / "mi-core_patching_neuron" / "ioi_gpt2"
    sizes = [p for p in MIB_PERCENTAGES if p < 1]
    for pct, kept in zip(sizes, mib_circuits(neurons, True, sizes, "neuron"), strict=True):
        circuit = load(str(nine / f"{pct:g}.pt"))
        assert torch.equal(circuit.neurons_in_graph.bool(), kept)
    # circuit evaluate at the neuron level: the held-out pairs, as in process
    capsys.readouterr()
    assert main(["circuit", "evaluate", *common, "--scores", str(neurons_file),
                 "--level", "neuron", "--ranking", "absolute",
                 "--out", str(tmp_path / "ev")]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "ev" / "mib_score.json").read_text())
    assert summary["cmd"] == pytest.approx(ours.cmd, abs=1e-9)
    # edge scores at the neuron level: one line, exit 2
    edges = str(tmp_path / "eap" / "scores.safetensors")
    assert main(["circuit", "evaluate", *common, "--scores", edges, "--level", "neuron",
                 "--out", str(tmp_path / "bad")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--neurons writes" in err[0]
    # a re-run without --neurons removes the file: it is not that run's
    assert main(["circuit", "attribute", *common, "--method", "eap",
                 "--out", str(tmp_path / "eap")]) == 0  # fmt: skip
    assert not neurons_file.exists()
