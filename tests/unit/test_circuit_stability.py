"""Circuit stability under bootstrap resampling (:mod:`mi_core.circuits.stability`): the
Jaccard index by hand, the resamples' circuits against the ones scored one by one, and
``mi-core circuit attribute --bootstrap`` writing it (and writing nothing of it when off)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from helpers import random_prompt_pairs, tiny_model

from mi_core.circuits import attribute
from mi_core.circuits.mib import mib_circuits
from mi_core.circuits.stability import circuit_stability, jaccard, resample_pairs
from mi_core.errors import ConfigError


def test_jaccard_by_hand():
    a = torch.tensor([True, True, False, False])
    b = torch.tensor([True, False, True, False])
    assert jaccard(a, b) == pytest.approx(1 / 3)
    assert jaccard(a, a) == 1.0 and jaccard(torch.zeros(4, dtype=torch.bool), a) == 0.0
    assert math.isnan(jaccard(torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool)))


def test_stability_compares_the_resamples_circuits():
    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(8, 6, high=90)
    sizes = (0.05, 0.2, 0.5)
    got = circuit_stability(model, pairs, 3, "eap", seed=4, percentages=sizes, batch_size=4)
    # the same resamples scored one by one
    circuits = []
    for k in range(3):
        resample = resample_pairs(pairs, 4, k)
        assert len(resample) == len(pairs)
        scores = attribute(model, resample, "eap", batch_size=4)
        circuits.append(mib_circuits(scores, True, sizes))
    for s in range(len(sizes)):
        pairwise = [jaccard(circuits[i][s], circuits[j][s])
                    for i, j in itertools.combinations(range(3), 2)]  # fmt: skip
        defined = [v for v in pairwise if not math.isnan(v)]  # two empty circuits: left out
        expected = sum(defined) / len(defined) if defined else math.nan
        assert got.jaccard[s] == pytest.approx(expected, nan_ok=True)
        common = circuits[0][s] & circuits[1][s] & circuits[2][s]
        names = scores.graph.edge_names
        assert got.shared[s] == [names[i] for i in torch.nonzero(common).flatten().tolist()]
    assert 0 < got.jaccard[0] < 1  # resamples of 8 random pairs disagree, but not wholly
    assert circuit_stability(model, pairs, 3, "eap", seed=4, percentages=sizes,
                             batch_size=4) == got  # fmt: skip
    with pytest.raises(ConfigError, match="at least 2 resamples"):
        circuit_stability(model, pairs, 1, "eap")


def test_attribute_bootstrap_writes_the_stability_and_off_writes_none(
    tmp_path, capsys, tiny_checkpoints
):
    from mi_core.cli import main

    common = ["circuit", "attribute", "--model", str(tiny_checkpoints["gpt2-lm"]),
              "--n-examples", "12", "--method", "eap", "--no-progress"]  # fmt: skip
    assert main([*common, "--bootstrap", "3", "--out", str(tmp_path / "boot")]) == 0
    printed = capsys.readouterr().out
    stability = json.loads((tmp_path / "boot" / "bootstrap.json").read_text())
    summary = json.loads((tmp_path / "boot" / "summary.json").read_text())
    assert stability["n_resamples"] == 3 and len(stability["jaccard"]) == 10
    assert summary["bootstrap"]["jaccard"] == stability["jaccard"]
    assert stability["jaccard"][-1] == 1.0  # every resample's 100 % circuit is every edge
    assert "bootstrap Jaccard of the circuits" in printed
    html = (tmp_path / "boot" / "bootstrap.html").read_text()
    assert "Circuit stability over 3 bootstrap resamples" in html
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "bootstrap.json").exists()
    # the same folder without --bootstrap: the earlier resamples' files go with the rest
    assert main([*common, "--out", str(tmp_path / "boot")]) == 0
    assert not (tmp_path / "boot" / "bootstrap.html").exists()
    assert "bootstrap" not in json.loads((tmp_path / "plain" / "summary.json").read_text())
    assert main([*common, "--bootstrap", "1", "--out", str(tmp_path / "one")]) == 2
    assert "bootstrap compares at least 2 resamples" in capsys.readouterr().err


def test_pruning_stability_compares_one_run_per_resample(tmp_path, capsys, tiny_checkpoints):
    from mi_core.circuits import EdgeScores
    from mi_core.circuits.prune import EdgePruneSettings, prune_edges
    from mi_core.circuits.stability import pruning_stability
    from mi_core.cli import main

    model = tiny_model("gpt2", seed=3)
    pairs = random_prompt_pairs(8, 6, high=90)
    settings = EdgePruneSettings(sparsity=0.8, steps=4, sparsity_warmup_steps=2, batch_size=4,
                                 lr_warmup_steps=0)  # fmt: skip
    sizes = (0.05, 0.2, 0.5)
    got = pruning_stability(model, pairs, 2, settings, seed=1, percentages=sizes,
                            out=tmp_path / "runs")  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["resample0", "resample1"]
    circuits = []
    for k in range(2):  # the same runs one by one: each resample's gates, MIB's ranking
        result = prune_edges(model, resample_pairs(pairs, 1, k), settings, progress=False)
        gates = EdgeScores(result.circuit.graph, result.log_alpha, "edge-pruning", 8)
        circuits.append(mib_circuits(gates, True, sizes))
    for s in range(len(sizes)):
        expected = jaccard(circuits[0][s], circuits[1][s])
        assert got.jaccard[s] == pytest.approx(expected, nan_ok=True)
    assert got.method == "edge-pruning" and got.n_resamples == 2
    # through the CLI: bootstrap.json beside the run, the resamples' runs in its state folder
    out = tmp_path / "cli"
    argv = ["circuit", "prune", "--model", str(tiny_checkpoints["gpt2-lm"]), "--n-examples",
            "12", "--steps", "3", "--sparsity-warmup-steps", "1", "--batch-size", "4",
            "--no-progress", "--bootstrap", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "bootstrap Jaccard of the circuits" in capsys.readouterr().out
    stability = json.loads((out / "bootstrap.json").read_text())
    assert stability["method"] == "edge-pruning" and stability["n_resamples"] == 2
    assert (out / "bootstrap.html").is_file() and (
        out / "state" / "bootstrap" / "resample1"
    ).is_dir()
