"""``mi-core circuit``: attribution and edge pruning end to end on tiny checkpoints."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from safetensors.torch import load_file

from mi_core.circuits import EdgeScores
from mi_core.cli import main
from mi_core.errors import InterventionError
from mi_core.interventions import EdgeMask, load_intervention
from mi_core.interventions.edges import to_mib_name

pytestmark = pytest.mark.usefixtures("one_thread")


def test_attribute_writes_scores_circuit_curve_and_mib(tmp_path, capsys, tiny_checkpoints):
    out = tmp_path / "eap"
    model = str(tiny_checkpoints["gpt2-lm"])
    argv = ["circuit", "attribute", "--model", model, "--method", "eap", "--n-examples", "16",
            "--fractions", "0,0.05,0.2,1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr()
    assert "recovers" in first.out and "faithfulness: 100%" in first.err  # progress bars
    # the same command again: finished, nothing recomputed (summary.json holds lists where the
    # config holds tuples: a re-run was refused as "other settings"); --no-progress silences
    # the bars
    stamp = (out / "scores.safetensors").stat().st_mtime_ns
    assert main([*argv, "--no-progress"]) == 0
    again = capsys.readouterr()
    assert "%|" not in again.err and "finished before with these settings" in again.out
    assert "recovers" in again.out and (out / "scores.safetensors").stat().st_mtime_ns == stamp
    # other settings replace it
    assert main([*argv, "--no-progress", "--circuit-fraction", "0.04"]) == 0
    assert "finished before" not in capsys.readouterr().out
    assert main([*argv, "--no-progress"]) == 0  # back to the first settings: recomputed
    capsys.readouterr()
    # a read-only output is refused before any work (it was found after the job, with the
    # other files replaced beside a summary that contradicted them)
    (out / "summary.json").chmod(0o444)
    stamp = (out / "scores.safetensors").stat().st_mtime_ns
    assert main([*argv, "--circuit-fraction", "0.1"]) == 2
    assert "summary.json: the file is read-only" in capsys.readouterr().err
    assert (out / "scores.safetensors").stat().st_mtime_ns == stamp
    (out / "summary.json").chmod(0o644)
    rows = list(csv.DictReader((out / "faithfulness.csv").open()))
    assert [float(r["fraction"]) for r in rows] == [0.0, pytest.approx(0.05, abs=0.01),
                                                    pytest.approx(0.2, abs=0.01), 1.0]  # fmt: skip
    # no edge: the corrupted model (0); every edge: the full model (1)
    assert float(rows[0]["faithfulness"]) == pytest.approx(0.0, abs=1e-4)
    assert float(rows[-1]["faithfulness"]) == pytest.approx(1.0, abs=1e-4)
    assert float(rows[-1]["kl"]) == pytest.approx(0.0, abs=1e-5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_find"] == summary["n_held_out"] == 8
    points = [(float(r["fraction"]), abs(1 - float(r["faithfulness"]))) for r in rows]
    cmd = sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(points, points[1:], strict=False))
    assert summary["curve_difference"] == pytest.approx(cmd, abs=1e-9)
    circuit = load_intervention(out / "circuit.safetensors")
    # connected by default: at most 5 % of the edges, each on an input-to-output path
    assert isinstance(circuit, EdgeMask) and 0 < circuit.n_kept <= round(0.05 * 262) == 13
    kept = circuit.weights > 0.5
    assert torch.equal(circuit.graph.connected(kept), kept)
    assert summary["config"]["connected"] is True and summary["config"]["signed"] is False
    mib = json.loads((out / "mib.json").read_text())
    assert len(mib["edges"]) == 262 and "a0.h1->a2.h3<q>" in mib["edges"]
    assert sum(e["in_graph"] for e in mib["edges"].values()) == circuit.n_kept
    # what EAP-IG's Graph.from_json (MIB's loader) rebuilds the graph from
    cfg = mib["cfg"]
    assert (cfg["n_layers"], cfg["n_heads"], cfg["parallel_attn_mlp"]) == (3, 4, False)
    assert cfg["d_model"] == 32
    # the scores read back as EdgeScores: the same graph, method and circuit
    scores = EdgeScores.load(out / "scores.safetensors")
    assert (scores.graph, scores.method, scores.n_examples) == (circuit.graph, "eap", 8)
    # MIB's convention: attribution against the loss (-metric), so MIB's default ranking by
    # signed score puts first the edges whose corruption lowers the metric most
    assert [mib["edges"][to_mib_name(n)]["score"] for n in scores.graph.edge_names[:5]] == (
        pytest.approx((-scores.scores[:5]).tolist())
    )
    assert scores.circuit(13).kept == circuit.kept
    head = (out / "circuit.html").read_text().split("</head>")[0]
    assert "<title>eap circuit of" in head


def test_prune_a_classifier_on_hans_pairs_and_resume(tmp_path, capsys, tiny_checkpoints, data_dir):
    out = tmp_path / "pruned"
    argv = ["circuit", "prune", "--model", str(tiny_checkpoints["bert-cls"]), "--task", "mnli",
            "--data", "hans-pairs:ln_subject/object_swap", "--n-examples", "16", "--steps", "12",
            "--sparsity-warmup-steps", "6", "--batch-size", "8", "--checkpoint-every", "5",
            "--sparsity", "0.9", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    first = load_intervention(out / "circuit.safetensors")
    assert first.n_kept == round(0.1 * 262)
    # the summary and the printed line say how many kept edges lie off every path
    on_path = int(first.graph.connected(first.weights > 0.5).sum())
    assert json.loads((out / "summary.json").read_text())["circuit"]["n_connected"] == on_path
    printed = capsys.readouterr().out
    assert (f"({first.n_kept - on_path} off every input-to-output path)" in printed) == (
        on_path < first.n_kept
    )
    with pytest.raises(InterventionError, match="edge-pruning gates"):
        EdgeScores.load(out / "scores.safetensors")  # log_alpha, not attribution scores
    with pytest.raises(InterventionError, match="not an edge-scores file"):
        EdgeScores.load(out / "circuit.safetensors")
    # a write cut short leaves the folder without its summary, so no reader takes new files
    # beside an old summary for a finished run
    from mi_core.circuits import job as job_module
    from mi_core.errors import OutputError

    def full_disk(*args, **kwargs):
        raise OutputError("cannot write results: No space left on device")

    real = job_module.write_mib
    job_module.write_mib = full_disk
    try:
        assert main(argv) == 2
    finally:
        job_module.write_mib = real
    assert not (out / "summary.json").exists()
    assert main(argv) == 0  # the state is finished: the outputs are written again
    history = (out / "history.csv").read_text()
    assert main(argv) == 0  # a re-run finds the finished state and does no step again
    assert (out / "history.csv").read_text() == history
    assert load_intervention(out / "circuit.safetensors").kept == first.kept
    scores = load_intervention(out / "circuit.safetensors")
    assert torch.equal(scores.weights, first.weights)
    # mib.json ranks by the gates with or without MIB's --absolute: shifted log_alpha, all > 0
    from safetensors.torch import load_file

    log_alpha = load_file(out / "scores.safetensors")["scores"].double()
    mib = json.loads((out / "mib.json").read_text())["edges"]
    values = torch.tensor([mib[to_mib_name(n)]["score"] for n in first.graph.edge_names]).double()
    assert (values > 0).all()
    torch.testing.assert_close(values, log_alpha - log_alpha.min() + 1e-3)
    # the graph page draws gates as kept edges, not as edges that work against the task
    page = (out / "circuit.html").read_text()
    assert "kept by edge pruning" in page and "gate log_alpha" in page
    assert "rgba(214,39,40" not in page  # no red edge
    # an attribution into the edge-pruning run's folder: refused before any work (it replaced
    # the run's circuit, scores and summary and left its state and history beside them)
    summary = (out / "summary.json").read_text()
    capsys.readouterr()
    attribute = ["circuit", "attribute", "--model", str(tiny_checkpoints["bert-cls"]), "--task",
                 "mnli", "--data", "hans-pairs:ln_subject/object_swap", "--n-examples", "16",
                 "--out", str(out)]  # fmt: skip
    assert main(attribute) == 2
    err = capsys.readouterr().err.strip()
    assert "holds the results of edge-pruning, not eap" in err and len(err.splitlines()) == 1
    assert (out / "summary.json").read_text() == summary


def test_a_circuit_sweep_runs_each_sparsity_and_seed_once(tmp_path, capsys, tiny_checkpoints):
    out = tmp_path / "sweep"
    argv = ["circuit", "sweep", "--model", str(tiny_checkpoints["gpt2-lm"]), "--n-examples",
            "16", "--steps", "6", "--sparsity-warmup-steps", "3", "--batch-size", "8",
            "--sparsities", "0.8,0.9", "--seeds", "1-2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    table = list(csv.DictReader((out / "circuits.csv").open()))
    assert [(float(r["sparsity"]), int(r["seed"])) for r in table] == [
        (0.8, 1), (0.8, 2), (0.9, 1), (0.9, 2)
    ]  # fmt: skip
    assert [int(r["n_edges"]) for r in table] == [round(0.2 * 262)] * 2 + [round(0.1 * 262)] * 2
    assert all(0 <= int(r["n_connected"]) <= int(r["n_edges"]) for r in table)  # integers
    assert f"({table[0]['n_connected']} on a path)" in capsys.readouterr().out
    one = load_intervention(out / "s0.80" / "seed2" / "circuit.safetensors")
    stamp = (out / "s0.80" / "seed2" / "summary.json").stat().st_mtime_ns
    assert main(argv) == 0  # finished runs are read back, not run again
    assert (out / "s0.80" / "seed2" / "summary.json").stat().st_mtime_ns == stamp
    assert load_intervention(out / "s0.80" / "seed2" / "circuit.safetensors").kept == one.kept
    capsys.readouterr()  # other settings: refused, not the finished runs reported as theirs
    assert main([a if a != "6" else "7" for a in argv]) == 2  # --steps 7
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "finished edge-pruning run with other settings (steps differ)" in err[0]
    )
    assert (out / "s0.80" / "seed2" / "summary.json").stat().st_mtime_ns == stamp
    # a summary of an older mi_core (its config without max_grad_norm) is refused in one line
    # that says to run it again, not read as a run of today's recipe
    path = out / "s0.80" / "seed2" / "summary.json"
    old = json.loads(path.read_text())
    old["config"].pop("max_grad_norm")
    path.write_text(json.dumps(old))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "older mi_core (its config has no max_grad_norm)" in err[0]
    assert f"delete {out / 's0.80' / 'seed2'} and run it again" in err[0]
    # each seed draws its own gates: the runs' log_alpha differ
    first, second = (load_file(out / "s0.90" / f"seed{s}" / "scores.safetensors")["scores"]
                     for s in (1, 2))  # fmt: skip
    assert not torch.equal(first, second)


@pytest.mark.slow
def test_a_circuit_sweep_on_ray_gives_the_local_circuits(tmp_path, tiny_checkpoints):
    ray = pytest.importorskip("ray")
    common = ["circuit", "sweep", "--model", str(tiny_checkpoints["gpt2-lm"]), "--n-examples",
              "16", "--steps", "4", "--sparsity-warmup-steps", "2", "--batch-size", "8",
              "--sparsities", "0.9", "--seeds", "1-2"]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # two worker processes
    try:
        assert main([*common, "--out", str(tmp_path / "ray"), "--executor", "ray"]) == 0
    finally:
        ray.shutdown()
    for seed in (1, 2):
        a, b = (load_file(tmp_path / where / "s0.90" / f"seed{seed}" / "scores.safetensors")
                for where in ("local", "ray"))  # fmt: skip
        assert torch.equal(a["scores"], b["scores"])
    assert len(list(csv.DictReader((tmp_path / "ray" / "circuits.csv").open()))) == 2


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--data", "ioi"], "ioi is a language-model task"),
        (["--data", "squad"], "unknown circuit data"),
        (["--held-out", "1.5"], "held_out must lie strictly between 0 and 1"),
        (["--data", "hans-pairs:foo"], "unknown HANS subcase in hans-pairs:foo; choose"),
    ],
)
def test_bad_circuit_input_is_one_line(tmp_path, capsys, tiny_checkpoints, extra, says):
    argv = ["circuit", "attribute", "--model", str(tiny_checkpoints["bert-cls"]), "--task",
            "mnli", "--out", str(tmp_path / "o"), *extra]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_data_of_the_other_kind_of_model_is_refused_before_it_loads(
    tmp_path, capsys, tiny_checkpoints, monkeypatch
):
    """hans-pairs on a language model was refused only after the load (26 s for SmolLM2)."""
    import mi_core.models

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(mi_core.models, "load_model", no_load)
    cases = [(tiny_checkpoints["gpt2-lm"], [], "hans-pairs:ln_subject/object_swap",
              "needs an NLI classifier; "),
             (tiny_checkpoints["bert-cls"], ["--task", "mnli"], "ioi",
              "ioi is a language-model task")]  # fmt: skip
    for model, task, data, says in cases:
        argv = ["circuit", "attribute", "--model", str(model), *task, "--data", data,
                "--out", str(tmp_path / "o")]  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("kind", ["bert-cls", "gpt2-cls"])
def test_hans_pairs_are_encoded_as_the_classifier_was_trained(kind, tiny_checkpoints, data_dir):
    from mi_core.data.circuit_pairs import hans_pairs
    from mi_core.data.pairs import MNLI_LABELS
    from mi_core.models import load_model

    model = load_model(tiny_checkpoints[kind], task="mnli")
    pairs = hans_pairs(model.tokenizer, "ln_subject/object_swap", list(MNLI_LABELS), n=3)
    premise, hypothesis = "The doctor saw the lawyer .", "The lawyer saw the doctor ."
    from mi_core.data import load_pairs

    data = load_pairs("hans:ln_subject/object_swap", max_examples=1)
    premise, hypothesis = data.text_a[0], data.text_b[0]
    tokens = model.to_tokens(premise, hypothesis)
    width = int(tokens["attention_mask"].sum())
    assert pairs.clean_ids[0, :width].tolist() == tokens["input_ids"][0, :width].tolist()
    same = model.to_tokens(premise, premise)
    assert pairs.corrupted_ids[0, :width].tolist() == same["input_ids"][0, :width].tolist()


def test_the_report_states_the_gap_and_warns_when_it_is_small(capsys):
    """Faithfulness divides by full - empty: the report prints both, and warns on stderr when
    removing every edge barely moves the metric (a fine-tuned MiniLM on HANS measured full
    0.725, empty 0.727: 'recovers 158.8 %' there is noise)."""
    from mi_core.circuits.evaluate import CircuitScore
    from mi_core.cli.circuit import _report

    cases = [
        (0.7247, 0.7273, float("nan"), True),  # under a tenth of the magnitude
        (3.57, 0.31, 0.2, False),  # IOI on SmolLM2: a clear gap
        (0.05, -0.05, 0.01, False),  # opposite signs, measurably apart
        (0.003, -0.002, 0.004, True),  # opposite signs, within two standard errors
        (0.0, 0.0, float("nan"), True),  # no gap at all
    ]
    for full, empty, se, small in cases:
        score = CircuitScore(n_edges=5, fraction=0.05, metric=0.1, full=full, empty=empty,
                             faithfulness=0.5, kl=0.01, gap_se=se)  # fmt: skip
        assert score.gap_is_small is small, (full, empty, se)
        assert score.as_dict()["small_gap"] is small
        _report({"graph": "G", "n_held_out": 8, "circuit": score.as_dict()}, "out")
        captured = capsys.readouterr()
        assert f"full {full:.4g}, every edge removed {empty:.4g}" in captured.out
        assert ("warning: removing every edge moves the metric by only" in captured.err) is small


def test_faithfulness_records_the_standard_error_of_the_gap(tiny_checkpoints):
    """gap_se is the standard error of the per-example full - empty differences."""
    from helpers import random_prompt_pairs

    from mi_core.circuits import Graph, evaluate_circuit, logit_difference
    from mi_core.models import load_model

    model = load_model(tiny_checkpoints["gpt2-lm"])
    graph = Graph.from_model(model)
    pairs = random_prompt_pairs(12, 6, high=2000)
    score = evaluate_circuit(model, EdgeMask.full(graph), pairs, batch_size=5)
    with torch.no_grad():
        full = logit_difference(model(pairs.clean_ids), pairs).double()
        # every edge removed with the corrupted fill is the corrupted run (decoders)
        empty = logit_difference(model(pairs.corrupted_ids), pairs).double()
    assert score.full == pytest.approx(float(full.mean()), abs=1e-5)
    assert score.empty == pytest.approx(float(empty.mean()), abs=1e-5)
    expected = float((full - empty).std() / 12**0.5)
    assert score.gap_se == pytest.approx(expected, rel=1e-4)
    assert score.faithfulness == pytest.approx(1.0, abs=1e-4)
    # the full circuit's metric is the full model's: its standard error over the gap
    spread = float(full.std() / 12**0.5) / abs(float(full.mean() - empty.mean()))
    assert score.faithfulness_se == pytest.approx(spread, rel=1e-4)


def test_the_mean_fill_can_average_over_training_pairs(tmp_path, capsys, tiny_checkpoints,
                                                      data_dir):  # fmt: skip
    """--means-data mnli:train: the empty circuit is every edge mean-ablated with the senders'
    means over those pairs (computed here independently), not over the finding pairs."""
    from mi_core.circuits import Graph, circuit_baselines, sender_means
    from mi_core.circuits.job import AttributeConfig, _prepare
    from mi_core.data import load_pairs
    from mi_core.models import load_model

    model_dir = str(tiny_checkpoints["bert-cls"])
    common = ["circuit", "attribute", "--model", model_dir, "--task", "mnli", "--data",
              "hans-pairs:ln_subject/object_swap", "--n-examples", "12", "--method", "eap",
              "--fractions", "0.1", "--fill", "mean"]  # fmt: skip
    assert main([*common, "--means-data", "mnli:train", "--mean-examples", "10",
                 "--out", str(tmp_path / "train")]) == 0  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "find")]) == 0
    trained = json.loads((tmp_path / "train" / "summary.json").read_text())["circuit"]
    found = json.loads((tmp_path / "find" / "summary.json").read_text())["circuit"]
    assert trained["empty"] != pytest.approx(found["empty"], abs=1e-4)

    model = load_model(model_dir, task="mnli")
    graph = Graph.from_model(model)
    train = load_pairs("mnli:train", max_examples=10, task="mnli")
    tokens = model.to_tokens(train.text_a, train.text_b)
    means = sender_means(model, graph, [dict(tokens)])
    config = AttributeConfig(model=model_dir, task="mnli", out="-", n_examples=12,
                             data="hans-pairs:ln_subject/object_swap")  # fmt: skip
    _, _, judge, _ = _prepare(config)
    _, empty, _ = circuit_baselines(model, graph, "mean", means, judge)
    assert trained["empty"] == pytest.approx(empty, abs=1e-4)

    # bad input: one line, no traceback
    capsys.readouterr()
    assert main([*common[:-2], "--means-data", "mnli:train", "--out", str(tmp_path / "x")]) != 0
    err = capsys.readouterr().err
    assert "means_data is read with fill mean only" in err and "Traceback" not in err
    lm = ["circuit", "attribute", "--model", str(tiny_checkpoints["gpt2-lm"]), "--n-examples",
          "8", "--fill", "mean", "--means-data", "mnli:train",
          "--out", str(tmp_path / "lm")]  # fmt: skip
    assert main(lm) != 0
    err = capsys.readouterr().err
    assert "need a pair classifier" in err and "Traceback" not in err


def test_a_circuit_sweep_offers_only_the_executors_it_runs(tmp_path, capsys):
    """Edge pruning has no batched groups: --help must not offer what the command refuses."""
    from mi_core.circuits.config import CircuitSweepConfig
    from mi_core.errors import ConfigError

    with pytest.raises(SystemExit):
        main(["circuit", "sweep", "--help"])
    text = capsys.readouterr().out
    assert "{local,ray}" in text and "--group-size" not in text
    argv = ["circuit", "sweep", "--model", "smollm2", "--data", "ioi", "--sparsities", "0.9",
            "--seeds", "1", "--out", str(tmp_path / "o"), "--executor", "batched"]  # fmt: skip
    assert main(argv) == 2
    assert "invalid choice: 'batched'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="executor"):  # a config file is checked the same way
        CircuitSweepConfig(
            model="m", out="o", sparsities=[0.9], seeds=[1], executor="batched"
        ).validate()


def test_a_circuit_of_a_prompt_file_or_an_ioi_split(tmp_path, capsys, tiny_checkpoints):
    """Language-model circuit data beyond ioi: its template families (ioi:abba / ioi:baba)
    and a .jsonl prompt file with corrupted prompts; a file without them is one line."""
    model = str(tiny_checkpoints["llama-lm"])
    common = ["circuit", "attribute", "--model", model, "--method", "eap", "--n-examples", "8",
              "--fractions", "0,1", "--no-progress"]  # fmt: skip
    assert main([*common, "--data", "ioi:baba", "--out", str(tmp_path / "baba")]) == 0
    summary = json.loads((tmp_path / "baba" / "summary.json").read_text())
    assert summary["config"]["data"] == "ioi:baba" and summary["n_find"] == 4
    rows = [
        {"prompt": f"the {a} saw the {b} and the", "answer": f" {a}", "distractor": f" {b}",
         "corrupted": f"the {c} saw the {d} and the"}
        for a, b, c, d in [("cat", "dog", "man", "car"), ("sun", "sky", "sea", "day")] * 4
    ]  # fmt: skip
    prompts = tmp_path / "animals.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in rows))
    assert main([*common, "--data", str(prompts), "--out", str(tmp_path / "file")]) == 0
    scores = EdgeScores.load(tmp_path / "file" / "scores.safetensors")
    assert scores.n_examples == 4 and bool(scores.scores.abs().max() > 0)
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "the cat saw the", "answer": " dog"}))
    capsys.readouterr()
    assert main([*common, "--data", str(plain), "--out", str(tmp_path / "plain")]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs a corrupted prompt for every example" in err and len(err.splitlines()) == 1
