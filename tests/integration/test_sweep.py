"""Pruning sweeps: one run per (sparsity, seed), skip-complete logic, the subnetworks table and
figure, shared reference logits, the ``mi-core sweep`` command and the Ray executor."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from mi_core.cli import main
from mi_core.data import load_pairs, pair_batches
from mi_core.errors import ConfigError
from mi_core.interventions import ComponentMask, compute_means
from mi_core.io import read_json
from mi_core.models import load_model
from mi_core.pruning import sweeps as sweep_module
from mi_core.pruning.sweeps import run_dir_for, run_sweep

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {
    "steps": 4,
    "batch_size": 8,
    "checkpoint_every": 2,
    "eval_batch_size": 16,
    "discretize": "exact",
}


@pytest.fixture(scope="module")
def model_path(tiny_checkpoints) -> Path:
    return tiny_checkpoints["bert-cls"]


@pytest.fixture(scope="module")
def means_file(model_path, data_dir, tmp_path_factory) -> Path:
    model = load_model(model_path, task="mnli")
    train = load_pairs("mnli:train", max_examples=32)
    means = compute_means(model, pair_batches(train, model.tokenizer, batch_size=16))
    return means.save(tmp_path_factory.mktemp("means") / "means.safetensors")


def test_run_dirs_are_named_by_sparsity_and_seed(tmp_path):
    assert run_dir_for(tmp_path, 0.5, 42) == tmp_path / "s0.50" / "seed42"
    assert run_dir_for(tmp_path, 0.05, 1) == tmp_path / "s0.05" / "seed1"
    assert run_dir_for(tmp_path, 0.125, 1) == tmp_path / "s0.125" / "seed1"


def test_sweep_runs_every_pair_then_only_what_is_missing(
    model_path, means_file, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "sweep"
    args = [
        "sweep", "--model", str(model_path), "--means", str(means_file),
        "--train", "mnli:train", "--max-train-examples", "24",
        "--eval", "mnli:validation_matched", "hans:ln_preposition", "--max-eval-examples", "16",
        "--sparsities", "0.3,0.5", "--seeds", "1-2", "--profile", "quick",
        "--steps", "4", "--batch-size", "8", "--checkpoint-every", "2", "--out", str(out),
        "--discretize", "exact",
        "--no-progress",
    ]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    assert f"4 subnetworks in {out}/subnetworks.csv" in capsys.readouterr().out
    table = pd.read_csv(out / "subnetworks.csv")
    evals = ["mnli:validation_matched", "hans:ln_preposition"]
    assert list(table.columns) == [
        "sparsity", "seed", "achieved_sparsity", "n_removed", "final_expected_sparsity",
        "run_dir", *[f"acc_{n}" for n in evals], *[f"full_acc_{n}" for n in evals],
        *[f"n_{n}" for n in evals],
    ]  # fmt: skip
    assert sorted(zip(table.sparsity, table.seed, strict=True)) == [
        (0.3, 1), (0.3, 2), (0.5, 1), (0.5, 2),
    ]  # fmt: skip
    assert set(table.n_removed) == {round(0.3 * 15), round(0.5 * 15)}
    assert table[[f"acc_{n}" for n in evals]].notna().all().all()
    # the full model's accuracies are computed once and are the same in every row
    full = read_json(out / "full_model.json")
    for name in evals:
        assert (table[f"full_acc_{name}"] == full[name]).all()
    html = (out / "subnetworks.html").read_text()
    assert "plotly" in html and "hans:ln_preposition (n=16)" in html
    html = html.replace("\\u002f", "/")  # plotly's JSON escapes slashes
    assert "chance 1/2" in html and "chance 1/3" in html  # HANS is 2-way, MNLI 3-way
    metrics = read_json(out / "s0.30" / "seed2" / "metrics.json")
    assert metrics["chance_accuracy"] == {"mnli:validation_matched": 1 / 3,
                                          "hans:ln_preposition": 1 / 2}  # fmt: skip
    # reference logits are computed once for the whole sweep, not per run
    assert (out / "reference_logits.safetensors").is_file()
    assert not list(out.glob("s*/seed*/reference_logits.safetensors"))
    config = read_json(out / "s0.30" / "seed2" / "config.json")
    assert config["reference_logits"] == str(out / "reference_logits.safetensors")

    calls: list[Path] = []
    real = sweep_module.prune_group  # the local executor runs groups of one

    def counting(model, train, means, configs, run_dirs, **kwargs):
        calls.extend(Path(d) for d in run_dirs)
        return real(model, train, means, configs, run_dirs, **kwargs)

    monkeypatch.setattr(sweep_module, "prune_group", counting)
    assert main(args) == 0
    assert calls == []
    # the job function returns the runs in memory: the table and the masks, as sweep() does
    from mi_core.cli import build_parser
    from mi_core.cli.sweep import config_from_args
    from mi_core.pruning.jobs import run_sweep_job

    result = run_sweep_job(config_from_args(build_parser().parse_args(args)))
    assert len(result.runs) == 4 and len(result.masks) == 4
    assert sorted(result.runs.n_removed) == sorted(table.n_removed)
    (out / "s0.50" / "seed1" / "metrics.json").unlink()
    assert main(args) == 0
    assert calls == [out / "s0.50" / "seed1"]
    assert len(pd.read_csv(out / "subnetworks.csv")) == 4
    # other settings on the same folder: refused, not the finished runs reported as theirs
    capsys.readouterr()
    other = [a if a != "4" else "5" for a in args]  # --steps 5
    assert main(other) == 2 and len(calls) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a run with other settings (prune.steps" in err[0]
    assert len(pd.read_csv(out / "s0.30" / "seed1" / "log.csv")) == 4  # untouched


def test_sweep_bad_input_is_one_line(model_path, means_file, tmp_path, capsys):
    base = ["sweep", "--model", str(model_path), "--means", str(means_file), "--train",
            "mnli:train", "--out", str(tmp_path / "s")]  # fmt: skip
    for extra, match in [
        (["--sparsities", "0.5", "--seeds", "4-x"], "bad seed entry"),
        (["--sparsities", "0.5", "--seeds", "9-3"], "runs backwards"),
        (["--sparsities", "0.5,1.2", "--seeds", "1"], "strictly between 0 and 1"),
        (["--sparsities", "0.5", "--seeds", "1", "--executor", "dask"], "invalid choice"),
    ]:
        capsys.readouterr()
        assert main([*base, *extra]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and match in lines[0], lines


def test_ray_executor_without_ray_is_a_clear_error(model_path, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match="needs Ray"):
        run_sweep(str(model_path), "mnli:train", tmp_path, [0.5], [1], executor="ray")


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance with two worker CPUs for the module's Ray tests."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_executor_runs_each_pair_as_a_task(model_path, means_file, tmp_path, local_ray):
    table = run_sweep(
        str(model_path), "mnli:train", tmp_path, [0.4], [1, 2],
        means=str(means_file), eval_sets=["mnli:validation_matched"], profile="quick",
        overrides=SMALL, max_train_examples=16, max_eval_examples=16, executor="ray",
    )  # fmt: skip
    assert sorted(table.seed) == [1, 2]
    assert (table.n_removed == 6).all()
    for seed in (1, 2):
        assert (run_dir_for(tmp_path, 0.4, seed) / "mask.safetensors").is_file()
    # Ray runs and in-process runs of the same pair agree exactly
    local = run_sweep(
        str(model_path), "mnli:train", tmp_path / "local", [0.4], [1],
        means=str(means_file), eval_sets=["mnli:validation_matched"], profile="quick",
        overrides=SMALL, max_train_examples=16, max_eval_examples=16,
    )  # fmt: skip
    assert local.n_removed.iloc[0] == 6
    from mi_core.interventions import ComponentMask

    assert ComponentMask.load(run_dir_for(tmp_path, 0.4, 1) / "mask.safetensors") == (
        ComponentMask.load(run_dir_for(tmp_path / "local", 0.4, 1) / "mask.safetensors")
    )


@pytest.mark.slow
@pytest.mark.parametrize("train", ["ioi:abba", "text:wikitext"])
def test_ray_runs_a_language_models_prompt_task_as_the_local_executor_does(
    tiny_checkpoints, tmp_path, local_ray, train
):
    """Ray workers take specs: the model path, ioi:abba drawn from the training seed (or
    WikiText windows, pruned at every position), the eval prompts from the evaluation seed;
    each run's mask equals the in-process run's."""
    from mi_core.data.prompt_tasks import TRAIN_SEED, load_task_data
    from mi_core.tasks import NEXT_TOKEN

    path = tiny_checkpoints["llama-lm"]
    model = load_model(path, task=NEXT_TOKEN)
    task = load_task_data(train, 24, tokenizer=model.tokenizer, seed=TRAIN_SEED)
    means = compute_means(model, pair_batches(task, model.tokenizer, batch_size=8))
    means_path = means.save(tmp_path / "means.safetensors")
    common = dict(
        means=str(means_path), eval_sets=["ioi:abba", "ioi:baba"], profile="cofi",
        overrides={"steps": 6, "batch_size": 8, "eval_every": 0, "max_length": 24},
        max_train_examples=24, max_eval_examples=16,
    )  # fmt: skip
    ray = run_sweep(str(path), train, tmp_path / "ray", [0.4], [1, 2], executor="ray",
                    **common)  # fmt: skip
    local = run_sweep(str(path), train, tmp_path / "local", [0.4], [1, 2], **common)
    for seed in (1, 2):
        assert ComponentMask.load(
            run_dir_for(tmp_path / "ray", 0.4, seed) / "mask.safetensors"
        ) == (ComponentMask.load(run_dir_for(tmp_path / "local", 0.4, seed) / "mask.safetensors"))
    assert ray.drop(columns="run_dir").equals(local.drop(columns="run_dir"))


@pytest.mark.slow
def test_ray_tasks_train_groups_and_a_resubmitted_sweep_skips_finished_runs(
    model_path, means_file, tmp_path, local_ray, monkeypatch
):
    common = dict(
        means=str(means_file), eval_sets=["mnli:validation_matched"], profile="quick",
        overrides={**SMALL, "dropout": False}, max_train_examples=16, max_eval_examples=16,
    )  # fmt: skip
    # 4 runs as 2 Ray tasks of 2 runs trained together, on the 2 worker processes
    table = run_sweep(str(model_path), "mnli:train", tmp_path / "ray", [0.3, 0.5], [1, 2],
                      executor="ray", group_size=2, **common)  # fmt: skip
    assert len(table) == 4
    run_sweep(str(model_path), "mnli:train", tmp_path / "local", [0.3, 0.5], [1, 2],
              **common)  # fmt: skip
    from mi_core.interventions import ComponentMask

    for s in (0.3, 0.5):
        for seed in (1, 2):
            a, b = (ComponentMask.load(run_dir_for(tmp_path / n, s, seed) / "mask.safetensors")
                    for n in ("ray", "local"))  # fmt: skip
            assert a == b
    # one run lost (a machine died): re-submitting runs only that one, as a task of its own
    lost = run_dir_for(tmp_path / "ray", 0.5, 2)
    (lost / "metrics.json").unlink()
    submitted = []
    original = sweep_module._run_with_ray
    monkeypatch.setattr(
        sweep_module, "_run_with_ray",
        lambda groups, *a, **k: submitted.append([[r.run_dir for r in g] for g in groups])
        or original(groups, *a, **k),
    )  # fmt: skip
    again = run_sweep(str(model_path), "mnli:train", tmp_path / "ray", [0.3, 0.5], [1, 2],
                      executor="ray", group_size=2, **common)  # fmt: skip
    assert submitted == [[[lost]]]
    assert len(again) == 4 and (lost / "metrics.json").is_file()


def test_in_memory_sweep_equals_the_sweep_on_disk(model_path, means_file, tmp_path):
    from mi_core import SweepResult, sweep
    from mi_core.methods.heuristic_core import compare_subnetworks

    model = load_model(model_path, task="mnli")
    kwargs = dict(
        profile="quick", overrides=SMALL, eval_sets=["mnli:validation_matched"],
        max_train_examples=16, max_eval_examples=16, progress=False,
    )  # fmt: skip
    memory = sweep(model, "mnli:train", str(means_file), [0.3, 0.5], [1, 2], **kwargs)
    disk = sweep(model, "mnli:train", str(means_file), [0.3, 0.5], [1, 2], out=tmp_path, **kwargs)
    assert memory.sweep_dir is None and disk.sweep_dir == tmp_path
    assert memory.masks == disk.masks and len(memory.masks) == 4
    columns = ["sparsity", "seed", "n_removed", "acc_mnli:validation_matched"]
    pd.testing.assert_frame_equal(memory.runs[columns], disk.runs[columns])
    assert memory.full_accuracy == disk.full_accuracy
    assert SweepResult.load(tmp_path).masks == disk.masks  # the typed loader reads it back
    assert compare_subnetworks(memory).cores == compare_subnetworks(disk).cores


def _one_run_sweep(model_path, means_file, out) -> list[str]:
    """``mi-core sweep`` of one short run (sparsity 0.3, seed 0), 16 eval examples."""
    return [
        "sweep", "--model", str(model_path), "--means", str(means_file),
        "--train", "mnli:train", "--max-train-examples", "16",
        "--eval", "mnli:validation_matched", "--max-eval-examples", "16",
        "--sparsities", "0.3", "--seeds", "1", "--profile", "quick", "--steps", "2",
        "--batch-size", "8", "--out", str(out), "--discretize", "exact", "--no-progress",
    ]  # fmt: skip


def test_a_re_run_with_other_eval_examples_measures_them_again(
    model_path, means_file, tmp_path, capsys, monkeypatch
):
    """Resuming with another --max-eval-examples mixed sizes: the full model's cached accuracy
    was from 16 examples and the finished runs' from 16 while new runs used 8."""
    from mi_core.evaluation import evaluate

    out = tmp_path / "sweep"
    args = _one_run_sweep(model_path, means_file, out)
    assert main(args) == 0, capsys.readouterr().err
    calls = []
    real = sweep_module.prune_group
    monkeypatch.setattr(
        sweep_module, "prune_group", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    fewer = [a if a != "16" or i < args.index("--max-eval-examples") else "8"
             for i, a in enumerate(args)]  # fmt: skip
    assert main(fewer) == 0, capsys.readouterr().err
    assert calls == []  # the mask is the run's result: nothing is pruned again
    name = "mnli:validation_matched"
    metrics = read_json(out / "s0.30" / "seed0" / "metrics.json")  # --seeds 1: one seed, 0
    assert metrics["eval_examples"][name] == 8
    # the run's config records what the last call asked for (it kept 16)
    assert read_json(out / "s0.30" / "seed0" / "config.json")["max_eval_examples"] == 8
    eight = load_pairs(name, max_examples=8)
    full = evaluate(load_model(model_path, task="mnli"), eight, batch_size=16).accuracy
    table = pd.read_csv(out / "subnetworks.csv")
    assert table[f"full_acc_{name}"].iloc[0] == pytest.approx(full)
    assert read_json(out / "full_model.json")[name] == pytest.approx(full)


def test_an_unchanged_sweep_re_run_keeps_finished_runs_and_adds_their_subnetwork(
    model_path, means_file, tmp_path, capsys
):
    """A re-run had rewritten every finished run's config.json (means and reference logits
    recorded in another form), and failed on one kept read-only; sweeps finished before
    subnetwork.safetensors existed never gained it."""
    out = tmp_path / "sweep"
    args = _one_run_sweep(model_path, means_file, out)
    assert main(args) == 0, capsys.readouterr().err
    run = out / "s0.30" / "seed0"
    config = (run / "config.json").read_bytes()
    assert read_json(run / "config.json")["max_eval_examples"] == 16  # what it used, not null
    (run / "subnetwork.safetensors").unlink()
    (run / "config.json").chmod(0o444)
    assert main(args) == 0, capsys.readouterr().err
    assert (run / "config.json").read_bytes() == config
    from mi_core.interventions import load_intervention

    mask = ComponentMask.load(run / "mask.safetensors")
    assert load_intervention(run / "subnetwork.safetensors").mask.removed() == mask.removed()


def test_results_on_another_selection_of_the_same_size_are_measured_again(
    model_path, means_file, tmp_path, capsys
):
    """The caches of eval results compared a set's name and size only: a HANS set of several
    subcases, whose max_examples selection changed, kept numbers from the other examples."""
    from mi_core.io import write_json

    out = tmp_path / "sweep"
    args = [a if a != "mnli:validation_matched" else "hans"
            for a in _one_run_sweep(model_path, means_file, out)]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    run = out / "s0.30" / "seed0"
    metrics = read_json(run / "metrics.json")
    selection = load_pairs("hans", max_examples=16).selection()
    assert metrics["eval_selection"]["hans"] == selection and selection.startswith("16:")
    assert read_json(out / "full_model_examples.json")["hans"] == selection
    # as a sweep of before: sizes only, and numbers from other examples
    write_json(run / "metrics.json", {**metrics, "eval_selection": {},
                                      "accuracy": {"hans": 0.123}})  # fmt: skip
    write_json(out / "full_model.json", {"hans": 0.456})
    write_json(out / "full_model_examples.json", {"hans": 16})
    assert main(args) == 0, capsys.readouterr().err
    again = read_json(run / "metrics.json")
    assert again["accuracy"]["hans"] == pytest.approx(metrics["accuracy"]["hans"])
    assert again["eval_selection"]["hans"] == selection
    assert read_json(out / "full_model.json")["hans"] == pytest.approx(
        metrics["full_accuracy"]["hans"]
    )
    # a finished run kept read-only is measured again and reported, not a failed re-run
    write_json(run / "metrics.json", {**again, "eval_selection": {}})
    (run / "metrics.json").chmod(0o444)
    assert main(args) == 0, capsys.readouterr().err
    (run / "metrics.json").chmod(0o644)


def test_results_of_an_older_mi_core_without_a_selection_digest_are_refused(
    model_path, means_file, tmp_path, capsys
):
    """A finished run whose metrics.json has no eval_selection (an older mi_core recorded the
    sets' sizes only) is refused with one line saying what to re-run, not trusted by size."""
    from mi_core.io import write_json

    out = tmp_path / "sweep"
    args = _one_run_sweep(model_path, means_file, out)
    assert main(args) == 0, capsys.readouterr().err
    run = out / "s0.30" / "seed0"
    metrics = read_json(run / "metrics.json")
    name = "mnli:validation_matched"
    assert name in metrics["eval_selection"]  # today's runs record it
    old = {k: v for k, v in metrics.items() if k != "eval_selection"}
    write_json(run / "metrics.json", {**old, "accuracy": {name: 0.123}})
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "older mi_core (it records no eval_selection): delete" in err[0]


@pytest.mark.slow
def test_a_ray_task_asking_for_more_than_the_cluster_has_is_refused(local_ray):
    """--num-gpus-per-run 1 on a cluster without a GPU waited forever, silently."""
    from mi_core.pruning.sweeps import run_ray_tasks

    with pytest.raises(ConfigError, match="asks for 1 GPUs but the cluster has 0"):
        run_ray_tasks("mi_core.pruning.sweeps:_prune_task", [{}], num_gpus_per_task=1.0)
    with pytest.raises(ConfigError, match="asks for 3 CPUs but the cluster has 2"):
        run_ray_tasks("mi_core.pruning.sweeps:_prune_task", [{}], num_cpus_per_task=3.0)
