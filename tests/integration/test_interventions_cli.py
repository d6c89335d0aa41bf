"""``mi-core means`` and ``mi-core ablate`` end to end on a tiny checkpoint; bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mi_core.cli import main
from mi_core.interventions import ComponentMask, load_means
from mi_core.models import load_model

ROWS = [
    {"premise": "a man is eating food", "hypothesis": "a person eats", "label": 0},
    {"premise": "the dog runs in the park", "hypothesis": "a cat sleeps at home", "label": 2},
    {"premise": "she plays the violin", "hypothesis": "she is a musician", "label": 1},
    {"premise": "two kids read a book", "hypothesis": "children are reading", "label": 0},
    {"premise": "it is raining today", "hypothesis": "the sun is out and it is dry", "label": 2},
]


@pytest.fixture(scope="module")
def setup(tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    data = root / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    data2 = root / "more.jsonl"
    data2.write_text("".join(json.dumps(r) + "\n" for r in ROWS[::-1]))
    bert = str(tiny_checkpoints["bert-cls"])
    means = root / "means.safetensors"
    assert (
        main(
            [
                "means",
                "--model",
                bert,
                "--task",
                "mnli",
                "--data",
                str(data),
                "--out",
                str(means),
                "--batch-size",
                "2",
            ]
        )
        == 0
    )
    return {
        "root": root,
        "data": str(data),
        "data2": str(data2),
        "bert": bert,
        "means": str(means),
        "roberta": str(tiny_checkpoints["roberta-cls"]),
    }


def _fails(capsys, argv, out, match):
    """The command exits non-zero with one stderr line matching ``match``; ``out`` is absent."""
    capsys.readouterr()
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("mi-core: error:") and match in err[0], err[0]
    assert not out.exists()


def test_means_cli_writes_the_models_means(setup):
    model = load_model(setup["bert"], task="mnli")
    means = load_means(setup["means"], model)
    assert means.n_examples == len(ROWS) and means.n_tokens > len(ROWS)
    assert means.dataset == "pairs" and means.model_name == model.model_name


def test_ablate_cli_writes_csv_markdown_and_html(setup):
    out = setup["root"] / "table.csv"
    argv = [
        "ablate",
        "--model",
        setup["bert"],
        "--means",
        setup["means"],
        "--heads",
        "L0.H1,L2.H3",
        "--joint",
        "L0.H1+L2.H3",
        "L1.H0+L1.H1",
        "--data",
        setup["data"],
        setup["data2"],
        "--out",
        str(out),
        "--batch-size",
        "2",
        "--others",
    ]
    assert main(argv) == 0
    frame = pd.read_csv(out)
    assert list(frame["ablated"]) == [
        "None (full model)",
        "L0.H1",
        "L2.H3",
        "Avg. (others)",
        "L0.H1+L2.H3",
        "L1.H0+L1.H1",
        "Superadditivity L0.H1+L2.H3",
        "Superadditivity L1.H0+L1.H1",
    ]
    assert {"pairs", "pairs change", "pairs std", "more"} <= set(frame.columns)
    assert "| None (full model) |" in out.with_suffix(".md").read_text()
    assert "<table" in out.with_suffix(".html").read_text()


def test_ablate_cli_all_heads_zero_ablation(setup):
    out = setup["root"] / "all.csv"
    assert (
        main(
            [
                "ablate",
                "--model",
                setup["bert"],
                "--heads",
                "all",
                "--fill",
                "zero",
                "--data",
                setup["data"],
                "--out",
                str(out),
                "--max-examples",
                "3",
            ]
        )
        == 0
    )
    frame = pd.read_csv(out)
    assert len(frame) == 1 + 3 * 4 and "Avg. (others)" not in set(frame["ablated"])


def test_bad_input_is_one_line_and_writes_nothing(setup, capsys, tmp_path):
    bert, data, means = setup["bert"], setup["data"], setup["means"]
    out = tmp_path / "table.csv"
    ablate = ["ablate", "--model", bert, "--data", data, "--out", str(out)]
    _fails(
        capsys,
        ablate + ["--means", means, "--heads", "L12.H0"],
        out,
        "L12.H0 does not exist: the model has 3 layers",
    )
    _fails(
        capsys,
        ablate + ["--means", means, "--heads", "L0.H0", "--joint", "L0.H0+L9.H1"],
        out,
        "L9.H1 does not exist",
    )
    _fails(capsys, ablate + ["--heads", "L0.H0"], out, "mean ablation needs --means")
    _fails(
        capsys, ablate + ["--means", means, "--heads", "L0.H0", "--data", data], out, "given twice"
    )
    other = ["ablate", "--model", setup["roberta"], "--task", "mnli", "--data", data, "--out",
             str(out), "--means", means, "--heads", "L0.H0"]  # fmt: skip
    _fails(capsys, other, out, "means were computed for model")
    _fails(
        capsys, ablate + ["--means", means, "--heads", "L0.H0", "--max-examples", "0"], out, "empty"
    )

    means_out = tmp_path / "means.safetensors"
    make_means = ["means", "--model", bert, "--task", "mnli", "--data", data, "--out"]
    _fails(capsys, [*make_means, str(means_out), "--max-examples", "0"], means_out, "is empty")
    json_out = tmp_path / "means.json"
    _fails(capsys, [*make_means, str(json_out)], json_out, ".safetensors")

    # mi-core eval applies masks through this library: a wrong shape or value fails cleanly
    eval_out = tmp_path / "eval.csv"
    wrong_shape = tmp_path / "wrong.json"
    ComponentMask.from_removed(_Dims(12, 12), "L2.H5").save(wrong_shape)
    evaluate = ["eval", "--model", bert, "--data", data, "--out", str(eval_out), "--means", means]
    _fails(
        capsys,
        evaluate + ["--mask", str(wrong_shape)],
        eval_out,
        "does not fit a model with 3 layers x 4 heads",
    )
    out_of_range = tmp_path / "range.json"
    out_of_range.write_text(
        json.dumps({"n_layers": 3, "n_heads": 4, "removed": [], "partial": {"L1.H1": 1.5}})
    )
    _fails(capsys, evaluate + ["--mask", str(out_of_range)], eval_out, "outside [0, 1]")
    _fails(capsys, evaluate + ["--ablate", "L12.H0"], eval_out, "L12.H0 does not exist")


class _Dims:
    def __init__(self, n_layers, n_heads):
        self.n_layers, self.n_heads, self.d_head, self.d_model = n_layers, n_heads, 8, 8


def test_ablate_cli_averages_the_other_heads_only_when_asked(setup):
    out = setup["root"] / "no-others.csv"
    argv = ["ablate", "--model", setup["bert"], "--means", setup["means"], "--heads", "L0.H1"]
    assert main([*argv, "--data", setup["data"], "--out", str(out), "--max-examples", "3"]) == 0
    assert list(pd.read_csv(out)["ablated"]) == ["None (full model)", "L0.H1"]
