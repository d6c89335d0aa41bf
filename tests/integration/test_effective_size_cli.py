"""``mi-core effective-size`` and its glue: checkpoints -> sweeps -> effective size per step."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from mi_core.analysis import effective_size
from mi_core.cli import main
from mi_core.errors import ConfigError
from mi_core.io import write_json
from mi_core.methods.heuristic_core.effective_size import (
    select_checkpoints,
    summarize_effective_size,
)
from mi_core.pruning.profiles import parse_seed_spec

pytestmark = pytest.mark.usefixtures("one_thread")

ID, OOD = "mnli:validation_matched", "hans:ln_subject/object_swap"


def test_summary_on_a_synthetic_grid_has_the_known_answer(tmp_path):
    """Step 100: ID stays faithful up to 0.5, OOD only up to 0.2; step 200: nothing faithful
    on OOD, and a non-monotone ID curve whose largest faithful sparsity is 0.4."""
    rows = []
    grid = {
        100: {ID: [0.80, 0.79, 0.78, 0.78, 0.77, 0.70], OOD: [0.60, 0.59, 0.40, 0.30, 0.2, 0.1]},
        200: {ID: [0.85, 0.80, 0.84, 0.83, 0.70, 0.60], OOD: [0.30, 0.20, 0.10, 0.1, 0.1, 0.1]},
    }
    sparsities = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    for step, per_set in grid.items():
        for dataset, accs in per_set.items():
            for sparsity, acc in zip(sparsities, accs, strict=True):
                for seed, jitter in ((0, -0.005), (1, 0.005)):  # mean over seeds = acc
                    rows.append((step, sparsity, seed, dataset, acc + jitter))
    accuracy = pd.DataFrame(rows, columns=["step", "sparsity", "seed", "dataset", "accuracy"])
    full = pd.DataFrame(
        [(100, ID, 0.80), (100, OOD, 0.60), (200, ID, 0.85), (200, OOD, 0.65)],
        columns=["step", "dataset", "accuracy"],
    )
    result = summarize_effective_size(
        tmp_path, accuracy, full, id_sets=[ID], ood_sets=[OOD], method="paper"
    )
    sizes = result.effective_size.set_index(["step", "target"])["effective_size"]
    assert sizes[(100, "id")] == pytest.approx(50.0)  # 0.77 >= 0.80 - 0.03 at 0.5
    assert sizes[(100, "ood")] == pytest.approx(80.0)  # 0.59 >= 0.57 at 0.2, 0.40 not at 0.3
    assert sizes[(200, "id")] == pytest.approx(60.0)  # 0.83 at 0.4; 0.80 at 0.2 is not
    assert sizes[(200, "ood")] == pytest.approx(100.0)  # nothing faithful
    assert sizes[(100, "mixed")] == pytest.approx(80.0)  # (0.79+0.59)/2 >= 0.67 at 0.2
    for name in ("accuracy", "full_accuracy", "faithfulness", "effective_size"):
        assert (tmp_path / f"{name}.csv").is_file()
    assert "plotly" in (tmp_path / "effective_size.html").read_text()[:100000].lower()


def test_seed_specs_and_checkpoint_selection(tmp_path):
    assert parse_seed_spec("3") == [0, 1, 2] and parse_seed_spec(3) == [0, 1, 2]
    assert parse_seed_spec("1,5") == [1, 5] and parse_seed_spec("42-44") == [42, 43, 44]
    with pytest.raises(ConfigError):
        parse_seed_spec("0")
    with pytest.raises(ConfigError):
        parse_seed_spec("1-x")
    found = [(s, tmp_path / f"checkpoint-{s}") for s in (100, 200, 300, 400, 500)]
    assert [s for s, _ in select_checkpoints(found, max_checkpoints=3)] == [100, 300, 500]
    assert [s for s, _ in select_checkpoints(found, steps=[200, 500])] == [200, 500]
    assert [s for s, _ in select_checkpoints(found, max_checkpoints=1)] == [500]
    with pytest.raises(ConfigError, match="no checkpoint for step"):
        select_checkpoints(found, steps=[250])


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoints, tmp_path_factory):
    """A fine-tuning-style directory with two checkpoints (the tiny BERT, twice)."""
    root = tmp_path_factory.mktemp("finetune")
    for step in (1, 2):
        shutil.copytree(tiny_checkpoints["bert-cls"], root / f"checkpoint-{step}")
        write_json(root / f"checkpoint-{step}" / "trainer_state.json", {"step": step})
    return root


def _args(checkpoints, out, *extra):
    return [
        "effective-size",
        "--checkpoints",
        str(checkpoints),
        "--train",
        "mnli:train",
        "--eval",
        "mnli:validation_matched",
        "hans:so_swap",
        "--out",
        str(out),
        "--max-train-examples",
        "24",
        "--max-eval-examples",
        "16",
        "--steps",
        "4",
        "--batch-size",
        "8",
        "--checkpoint-every",
        "2",
        "--eval-batch-size",
        "16",
        "--no-progress",
        "--profile",
        "quick",
        *extra,
    ]


@pytest.mark.slow
def test_cli_prunes_every_checkpoint_and_resumes(checkpoints, data_dir, tmp_path, capsys):
    out = tmp_path / "es"
    args = _args(
        checkpoints,
        out,
        *("--sparsities", "0.2,0.4", "--seeds", "2", "--margin", "0.05", "--method", "paper"),
    )
    assert main(args) == 0
    assert "effective_size.csv" in capsys.readouterr().out
    sizes = pd.read_csv(out / "effective_size.csv")
    assert sizes.columns.tolist() == [
        "step",
        "target",
        "full_accuracy",
        "faithful_sparsity",
        "accuracy",
        "effective_size",
    ]
    assert sizes[["step", "target"]].values.tolist() == [
        [s, t] for s in (1, 2) for t in ("id", "ood", "mixed")
    ]
    accuracy = pd.read_csv(out / "accuracy.csv")
    assert len(accuracy) == 2 * 2 * 2 * 2  # checkpoints x sparsities x seeds x data sets
    assert set(accuracy.seed) == {0, 1} and set(accuracy.dataset) == {ID, OOD}
    full = pd.read_csv(out / "full_accuracy.csv")
    again = effective_size(
        accuracy, full, id_datasets=[ID], ood_datasets=[OOD], margin=0.05, method="paper"
    )
    pd.testing.assert_frame_equal(again, sizes, check_dtype=False)
    assert (out / "checkpoint-2" / "means.safetensors").is_file()
    assert (out / "effective_size.html").is_file()

    runs = sorted(out.glob("checkpoint-*/sweep/s*/seed*/metrics.json"))
    assert len(runs) == 8
    stamps = [p.stat().st_mtime_ns for p in runs]
    assert main(args) == 0  # everything finished: nothing is pruned again
    assert [p.stat().st_mtime_ns for p in runs] == stamps
    pd.testing.assert_frame_equal(pd.read_csv(out / "effective_size.csv"), sizes)


def test_cli_bad_input_is_one_line(checkpoints, data_dir, tmp_path, capsys):
    cases = [
        (_args(tmp_path / "nope", tmp_path / "o"), "does not exist"),
        (
            _args(checkpoints, tmp_path / "o", "--means", str(tmp_path / "m.safetensors")),
            "{step}",
        ),
        (_args(checkpoints, tmp_path / "o", "--seeds", "1-x"), "seed"),
        (_args(checkpoints, tmp_path / "o", "--sparsities", "0.5:0.1:0.1"), "backwards"),
        (_args(checkpoints, tmp_path / "o", "--margin", "3"), "margin"),
        (_args(checkpoints, tmp_path / "o", "--checkpoint-steps", "7"), "no checkpoint for step"),
    ]
    for args, needle in cases:
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("mi-core: error:") and len(err.splitlines()) == 1, err
        assert needle in err, err
    one_set = _args(checkpoints, tmp_path / "o")
    one_set.remove("hans:so_swap")
    assert main(one_set) == 2
    assert "out-of-domain" in capsys.readouterr().err
    # MNLI mismatched is in-domain for mnli:train (the authors average it with matched): with
    # no other set there is no out-of-domain target, where it used to be taken for one
    mismatched = [
        "mnli:validation_mismatched" if a == "hans:so_swap" else a
        for a in _args(checkpoints, tmp_path / "o")
    ]
    assert main(mismatched) == 2
    assert "out-of-domain" in capsys.readouterr().err


@pytest.mark.slow
def test_the_batched_executor_gives_the_local_executors_effective_sizes(
    checkpoints, data_dir, tmp_path
):
    grid = ("--sparsities", "0.2,0.4", "--seeds", "2", "--dropout", "off")
    assert main(_args(checkpoints, tmp_path / "local", *grid)) == 0
    # each checkpoint's whole 2 x 2 grid as one group, its size chosen from memory
    assert main(_args(checkpoints, tmp_path / "batched", *grid, "--executor", "batched")) == 0
    for name in ("accuracy.csv", "effective_size.csv"):
        pd.testing.assert_frame_equal(
            pd.read_csv(tmp_path / "batched" / name), pd.read_csv(tmp_path / "local" / name)
        )
    assert len(list((tmp_path / "batched").glob("checkpoint-*/sweep/s*/seed*/mask.json"))) == 8
