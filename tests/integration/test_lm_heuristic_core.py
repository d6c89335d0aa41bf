"""The whole heuristic-core experiment on a language model and prompt tasks (a tiny random
Llama on IOI): every stage runs, the report's tables are the LM's (decoder attention classes,
accuracies of the answer beating the subject), the config refuses what an LM cannot run, and
effective size runs over a folder of LM checkpoints."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import torch

from mi_core.errors import ConfigError
from mi_core.methods.heuristic_core.config import ExperimentConfig, load_config
from mi_core.methods.heuristic_core.pipeline import run_experiment


def _config(path, **changes) -> dict:
    config = {
        "name": "tiny-ioi",
        "checkpoint": str(path),
        "task": "next_token",
        "device": "cpu",
        "data": {
            "train": "ioi:abba",
            "eval": ["ioi:abba", "ioi:baba"],
            "max_train_examples": 48,
            "max_eval_examples": 24,
        },  # fmt: skip
        "means": {"max_examples": 48},
        "pruning": {
            "sparsities": [0.3, 0.5],
            "seeds": [1, 2],
            "profile": "cofi",
            "overrides": {
                "steps": 12,
                "batch_size": 8,
                "lr_log_alpha": 0.6,
                "eval_every": 0,
                "checkpoint_every": 12,
            },
        },  # fmt: skip
        "attention": {"max_examples": 12, "n_views": 1},
        "ablation": {"max_examples": 12},
    }
    config.update(changes)
    return config


def test_the_experiment_runs_on_a_language_model_and_ioi(tiny_checkpoints, tmp_path):
    config = ExperimentConfig.from_dict(_config(tiny_checkpoints["llama-lm"]))
    result = run_experiment(config, tmp_path / "report", progress=False)
    out = tmp_path / "report"
    assert result.ran == ["means", "sweep", "analysis", "attention", "ablation", "report"]
    assert result.report_html.is_file()
    runs = pd.read_csv(out / "analysis" / "subnetworks.csv")
    assert {"acc_ioi:abba", "acc_ioi:baba"} <= set(runs.columns)
    assert len(runs) == 4 and runs["n_removed"].tolist() == [4, 4, 8, 8]  # exact: 30 / 50 %
    metrics = json.loads((out / "sweep" / "s0.50" / "seed1" / "metrics.json").read_text())
    assert metrics["chance_accuracy"] == {"ioi:abba": 0.5, "ioi:baba": 0.5}
    classes = pd.read_csv(out / "attention" / "attention_classes.csv")
    assert {"induction_mass", "duplicate_mass", "to_answer_mass", "to_distractor_mass"} <= set(
        classes.columns
    )
    assert "overlap_mass" not in classes.columns and (classes["dataset"] == "ioi:baba").all()
    views = json.loads((out / "attention" / "views.json").read_text())
    assert views[0]["causal"] and "answer" in views[0]["title"]
    table = pd.read_csv(out / "ablation" / "ablation_table.csv")
    assert {"ioi:abba", "ioi:baba"} <= set(table.columns)
    findings = pd.read_csv(out / "findings.csv")
    shallow = findings[findings["finding"] == "Core heads compute shallow features"]
    if len(shallow):
        assert "previous-token, duplicate-token or induction" in shallow["this run"].iloc[0] or (
            "no head is kept" in shallow["this run"].iloc[0]
        )
    report = (out / "report.md").read_text()
    assert "task next_token" in report and "to_answer_mass" in report


def test_the_config_refuses_what_a_language_model_cannot_run(tiny_checkpoints):
    path = tiny_checkpoints["llama-lm"]
    with pytest.raises(ConfigError, match="reads prompt tasks .* not sentence pairs"):
        ExperimentConfig.from_dict(
            _config(path, data={"train": "mnli:train", "eval": ["hans:so_swap"]})
        )
    with pytest.raises(ConfigError, match="give it as 'checkpoint', with no 'finetune'"):
        ExperimentConfig.from_dict(
            _config(path, checkpoint=None, model=str(path), finetune={"steps": 2})
        )
    with pytest.raises(ConfigError, match="core_before read a fine-tuning run"):
        ExperimentConfig.from_dict(_config(path, core_before={"enabled": True}))
    with pytest.raises(ConfigError, match="task must be one of"):
        ExperimentConfig.from_dict(_config(path, task="lm"))
    with pytest.raises(ConfigError, match="effective_size needs checkpoints_dir"):
        ExperimentConfig.from_dict(
            _config(path, effective_size={"enabled": True, "revisions": ["step100"]})
        )
    with pytest.raises(ConfigError, match="text:python is plain text: data.train may be text"):
        ExperimentConfig.from_dict(
            _config(path, data={"train": "text:wikitext", "eval": ["ioi:abba", "text:python"]})
        )


def test_the_experiment_prunes_a_task_free_subnetwork_on_plain_text(tiny_checkpoints, tmp_path):
    """Training on WikiText windows (the KL at every position), evaluating on IOI: every stage
    runs; the means are the text's; no reference logits are cached."""
    config = _config(tiny_checkpoints["llama-lm"])
    config["data"] = {**config["data"], "train": "text:wikitext", "max_train_examples": 16}
    config["pruning"]["overrides"] |= {"max_length": 24, "steps": 6}
    result = run_experiment(ExperimentConfig.from_dict(config), tmp_path / "r", progress=False)
    assert result.ran == ["means", "sweep", "analysis", "attention", "ablation", "report"]
    runs = pd.read_csv(tmp_path / "r" / "analysis" / "subnetworks.csv")
    assert runs["n_removed"].tolist() == [4, 4, 8, 8]
    run = tmp_path / "r" / "sweep" / "s0.30" / "seed1"
    assert json.loads((run / "config.json").read_text())["train"]["name"] == "text:wikitext"
    assert not list((tmp_path / "r").rglob("reference_logits.safetensors"))
    from mi_core.interventions import load_means

    assert load_means(next((tmp_path / "r").rglob("means.safetensors"))).dataset == "text:wikitext"


def test_the_shipped_smollm2_ioi_config_fits_the_demo_budget():
    config = load_config("smollm2-ioi-quick")
    assert config.checkpoint == "smollm2" and config.task == "next_token"
    assert config.data.eval == ["ioi:abba", "ioi:baba"] and config.data.train == "ioi:abba"
    assert config.finetune is None and config.pruning.profile == "cofi"
    assert len(config.pruning.seeds) * len(config.pruning.sparsities) == 4


def test_the_shipped_smollm2_mnli_config_fine_tunes_a_decoder_classifier():
    """smollm2-mnli-quick (#41): SmolLM2 fine-tuned as an MNLI classifier, then the paper's
    experiment on it, MNLI in-domain and HANS out-of-domain."""
    config = load_config("smollm2-mnli-quick")
    assert config.model == "smollm2" and config.task == "mnli" and config.checkpoint is None
    assert config.finetune is not None and config.finetune.steps == 250
    assert config.data.eval[0] == "mnli:validation_matched"
    assert all(d.startswith("hans:") for d in config.data.eval[1:])
    assert config.pruning.profile == "cofi" and config.pruning.overrides["steps"] == 150


def test_effective_size_over_a_folder_of_language_model_checkpoints(tiny_checkpoints, tmp_path):
    """Checkpoints saved with save_pretrained as checkpoint-<step> (no trainer state): each is
    loaded as an answer model, its means computed on the training prompts, pruned."""
    from mi_core.methods.heuristic_core.effective_size import run_effective_size
    from mi_core.testing import make_tiny_checkpoint

    folder = tmp_path / "ckpts"
    shutil.copytree(tiny_checkpoints["llama-lm"], folder / "checkpoint-100")
    make_tiny_checkpoint("llama-lm", folder / "checkpoint-200", seed=1)
    result = run_effective_size(
        folder, "ioi:abba", ["ioi:abba", "ioi:baba"], tmp_path / "es", [0.4], [1],
        profile="cofi", overrides={"steps": 4, "batch_size": 8, "eval_every": 0},
        task="next_token", max_train_examples=16, max_eval_examples=16, progress=False,
    )  # fmt: skip
    assert sorted(result.full_accuracy["step"].unique()) == [100, 200]
    assert set(result.accuracy["dataset"]) == {"ioi:abba", "ioi:baba"}
    from mi_core.interventions import load_means

    for step in (100, 200):  # each checkpoint's own means, over its training prompts
        means = load_means(tmp_path / "es" / f"checkpoint-{step}" / "means.safetensors")
        assert means.dataset == "ioi:abba"
    first = load_means(tmp_path / "es" / "checkpoint-100" / "means.safetensors")
    assert means.fingerprint != first.fingerprint  # two models, two means


def test_cli_prune_and_means_on_prompt_tasks(tiny_checkpoints, tmp_path, capsys):
    from mi_core.cli import main

    path = str(tiny_checkpoints["llama-lm"])
    means = tmp_path / "means.safetensors"
    assert main(["means", "--model", path, "--data", "ioi:abba", "--max-examples", "24",
                 "--out", str(means)]) == 0  # fmt: skip
    positions = tmp_path / "by-position.safetensors"
    assert main(["means", "--model", path, "--data", "ioi:abba", "--max-examples", "24",
                 "--by-position", "--out", str(positions)]) == 0  # fmt: skip
    from mi_core.interventions import load_means

    assert load_means(positions).by_position and not load_means(means).by_position
    assert torch.equal(load_means(positions).z, load_means(means).z)
    run = tmp_path / "run"
    code = main(["prune", "--model", path, "--train", "ioi:abba", "--eval", "ioi:abba",
                 "ioi:baba", "--means", str(means), "--profile", "cofi", "--sparsity", "0.4",
                 "--steps", "4", "--batch-size", "8", "--max-train-examples", "24",
                 "--max-eval-examples", "16", "--out", str(run), "--no-progress"])  # fmt: skip
    assert code == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["n_removed"] == 6 and set(metrics["accuracy"]) == {"ioi:abba", "ioi:baba"}
    table, preds = tmp_path / "eval.csv", tmp_path / "preds.jsonl"
    assert main(["eval", "--model", path, "--data", "ioi:abba", "--data", "ioi:baba",
                 "--max-examples", "16", "--out", str(table), "--predictions", str(preds),
                 "--means", str(means), "--ablate", "L0.H1"]) == 0  # fmt: skip
    results = pd.read_csv(table).set_index("dataset")
    assert list(results.index) == ["ioi:abba", "ioi:baba"]
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(rows) == 32 and all(len(r["logits"]) == 2 for r in rows)  # answer vs rival
    for name in results.index:  # accuracy: the answer's logit above the subject's
        wins = [r["logits"][0] > r["logits"][1] for r in rows if r["dataset"] == name]
        assert results.loc[name, "accuracy"] == pytest.approx(sum(wins) / len(wins))
    capsys.readouterr()
    code = main(["prune", "--model", path, "--train", "ioi:abba", "--eval", "hans:so_swap",
                 "--fill", "zero", "--sparsity", "0.4", "--out", str(tmp_path / "x")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "all prompt tasks" in err


def _hub_cache(root, repo: str, revisions: dict) -> None:
    """A Hugging Face hub cache holding ``repo`` at each revision (a branch name -> a folder),
    laid out as huggingface_hub keeps downloads: ``refs/<branch>`` names a snapshot."""
    import hashlib

    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    for revision, folder in revisions.items():
        commit = hashlib.sha1(revision.encode()).hexdigest()
        shutil.copytree(folder, base / "snapshots" / commit)
        (base / "refs" / revision).write_text(commit)


def test_hub_revisions_load_and_are_the_checkpoints_of_effective_size(
    tiny_checkpoints, tmp_path, monkeypatch
):
    """Pythia's step* branches as a hub cache holds them (offline): name@revision loads that
    revision's weights, and effective size takes the revisions as its checkpoints."""
    import huggingface_hub.constants

    from mi_core.errors import ModelLoadError
    from mi_core.methods.heuristic_core.effective_size import find_checkpoints
    from mi_core.models import load_model
    from mi_core.testing import make_tiny_checkpoint

    later = make_tiny_checkpoint("llama-lm", tmp_path / "later", seed=1)
    _hub_cache(tmp_path / "hub", "tiny-org/tiny-llama",
               {"step100": tiny_checkpoints["llama-lm"], "step200": later})  # fmt: skip
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    first = load_model("tiny-org/tiny-llama@step100", task="next_token")
    assert first.model_name == "tiny-org/tiny-llama@step100"
    assert torch.equal(first.W_E, load_model(tiny_checkpoints["llama-lm"]).W_E)
    assert torch.equal(load_model("tiny-org/tiny-llama@step200").W_E, load_model(later).W_E)
    with pytest.raises(ModelLoadError, match="not available from the Hugging Face hub or its"):
        load_model("tiny-org/tiny-llama@step300")
    assert find_checkpoints("tiny-org/tiny-llama", ["step200", "step100"]) == [
        (100, "tiny-org/tiny-llama@step100"), (200, "tiny-org/tiny-llama@step200")
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="revision 'main' names no training step"):
        find_checkpoints("tiny-org/tiny-llama", ["main"])
    from mi_core.cli import main

    code = main(["effective-size", "--checkpoints", "tiny-org/tiny-llama", "--revisions",
                 "step100", "step200", "--train", "ioi:abba", "--eval", "ioi:abba", "ioi:baba",
                 "--out", str(tmp_path / "es"), "--sparsities", "0.4", "--seeds", "1",
                 "--profile", "cofi", "--steps", "4", "--batch-size", "8",
                 "--max-train-examples", "16", "--max-eval-examples", "16",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    full = pd.read_csv(tmp_path / "es" / "full_accuracy.csv")
    assert sorted(full["step"].unique()) == [100, 200]
    recorded = json.loads(
        (tmp_path / "es" / "checkpoint-200" / "sweep" / "s0.40" / "seed0" / "config.json")
        .read_text()
    )  # fmt: skip
    assert "tiny-org/tiny-llama@step200" in json.dumps(recorded)
