"""mi-core finetune and mi-core eval, end to end on a tiny checkpoint and real data."""

from __future__ import annotations

import json
import os
import shutil

import pandas as pd
import pytest
import torch
import transformers
from safetensors.torch import load_file

from mi_core.cli import main
from mi_core.models import load_model


def _finetune(tiny, out, steps=4, extra=()):
    return main(
        [
            "finetune",
            "--model",
            str(tiny),
            "--task",
            "mnli",
            "--train",
            "mnli:train",
            "--eval",
            "mnli:validation_matched",
            "hans:so_swap",
            "--max-eval-examples",
            "24",
            "--max-train-examples",
            "64",
            "--batch-size",
            "8",
            "--steps",
            str(steps),
            "--save-every",
            "2",
            "--lr",
            "1e-3",
            "--out",
            str(out),
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def finetuned(tiny_checkpoints, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "run"
    assert _finetune(tiny_checkpoints["bert-cls"], out) == 0
    return out


def test_finetune_writes_hf_checkpoints_metrics_and_figure(finetuned):
    for step in (2, 4):
        ckpt = finetuned / f"checkpoint-{step}"
        hf = transformers.AutoModelForSequenceClassification.from_pretrained(ckpt)
        assert hf.config.num_labels == 3 and (ckpt / "tokenizer.json").is_file()
        # the weights honour the umask like every other file (safetensors writes 0600)
        umask = os.umask(0o022)
        os.umask(umask)
        for name in ("model.safetensors", "config.json"):
            assert (ckpt / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
    metrics = pd.read_csv(finetuned / "metrics.csv")
    assert list(metrics.columns) == ["step", "dataset", "accuracy", "n"]
    assert sorted(metrics["step"].unique()) == [0, 2, 4]
    assert set(metrics["dataset"]) == {"mnli:validation_matched", "hans:ln_subject/object_swap"}
    assert metrics["accuracy"].between(0, 1).all()
    html = (finetuned / "training_dynamics.html").read_text()
    assert "(OOD)" in html and "(ID)" in html
    html = html.replace("\\u002f", "/")  # plotly's JSON escapes slashes
    assert "chance 1/3" in html and "chance 1/2" in html and "(n=" in html
    # Training changed the weights.
    first = load_file(str(finetuned / "checkpoint-2" / "model.safetensors"))
    last = load_file(str(finetuned / "checkpoint-4" / "model.safetensors"))
    assert any(not torch.equal(first[k], last[k]) for k in first)


def test_finetune_logs_every_steps_training_loss_and_rate(finetuned):
    losses = pd.read_csv(finetuned / "train_loss.csv")
    assert list(losses.columns) == ["step", "loss", "lr"]
    assert losses["step"].tolist() == [1, 2, 3, 4]
    # No warm-up: the linear schedule's rate at step s (1-based) is lr * (1 - (s - 1) / steps).
    assert losses["lr"].tolist() == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    # The last step's loss is the one the checkpoint's training state holds.
    state = json.loads((finetuned / "checkpoint-4" / "trainer_state.json").read_text())
    assert losses["loss"].iloc[-1] == pytest.approx(state["loss"], abs=1e-6)
    assert (losses["loss"] > 0).all() and losses["loss"].nunique() == 4


def test_finetune_resume_equals_uninterrupted(finetuned, tiny_checkpoints, tmp_path):
    # A run that crashed after checkpoint-2 resumes there and ends where the full run ended.
    out = tmp_path / "resumed"
    shutil.copytree(finetuned, out)
    shutil.rmtree(out / "checkpoint-4")
    assert _finetune(tiny_checkpoints["bert-cls"], out) == 0
    a = load_file(str(finetuned / "checkpoint-4" / "model.safetensors"))
    b = load_file(str(out / "checkpoint-4" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert len(pd.read_csv(out / "metrics.csv")) == 6
    # The losses of steps 1-2 are kept from the first run, 3-4 are the resumed run's.
    resumed, full = pd.read_csv(out / "train_loss.csv"), pd.read_csv(finetuned / "train_loss.csv")
    assert resumed["step"].tolist() == [1, 2, 3, 4]
    assert resumed["loss"].tolist() == pytest.approx(full["loss"].tolist(), abs=1e-5)


def test_a_kill_while_checkpointing_loses_no_record(finetuned, tiny_checkpoints, tmp_path,
                                                   monkeypatch):  # fmt: skip
    """The records of a checkpoint's step are written before it: a kill while the checkpoint
    is written leaves rows past the last checkpoint, which the resume makes again (written
    after it, a kill in between lost that step's evaluation for good)."""
    import importlib

    finetune_module = importlib.import_module("mi_core.training.finetune")  # not the function

    out = tmp_path / "killed"
    shutil.copytree(finetuned, out)
    shutil.rmtree(out / "checkpoint-4")
    real = finetune_module.save_checkpoint

    def killed_at_4(out_dir, step, *args, **kwargs):
        if step == 4:
            raise KeyboardInterrupt
        return real(out_dir, step, *args, **kwargs)

    monkeypatch.setattr(finetune_module, "save_checkpoint", killed_at_4)
    assert _finetune(tiny_checkpoints["bert-cls"], out) == 130
    assert 4 in set(pd.read_csv(out / "metrics.csv")["step"])  # the records came first
    monkeypatch.setattr(finetune_module, "save_checkpoint", real)
    assert _finetune(tiny_checkpoints["bert-cls"], out) == 0
    records = pd.read_csv(out / "metrics.csv")
    assert records["step"].tolist() == pd.read_csv(finetuned / "metrics.csv")["step"].tolist()
    assert pd.read_csv(out / "train_loss.csv")["step"].tolist() == [1, 2, 3, 4]


def test_damaged_newest_weights_resume_from_the_checkpoint_before(
    finetuned, tiny_checkpoints, tmp_path, caplog
):
    """A truncated model.safetensors in the newest checkpoint stopped the run; the training
    state of a damaged checkpoint already fell back to the one before it."""
    out = tmp_path / "damaged"
    shutil.copytree(finetuned, out)
    weights = out / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert _finetune(tiny_checkpoints["bert-cls"], out) == 0
    assert "resuming from the checkpoint before it" in caplog.text
    a = load_file(str(finetuned / "checkpoint-4" / "model.safetensors"))
    b = load_file(str(out / "checkpoint-4" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_finetune_refuses_other_settings_in_same_dir(
    finetuned, tiny_checkpoints, capsys, caplog, tmp_path
):
    assert _finetune(tiny_checkpoints["bert-cls"], finetuned, extra=("--seed", "7")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mi-core: error:") and "seed" in err and "\n" not in err
    # what it trains on, how it optimises (the schedule depends on --steps) and what it
    # measures are the run's; resuming with them changed mixed two runs into one record
    for flags, field in [
        (("--max-train-examples", "32"), "max_train_examples"),
        (("--weight-decay", "0.5"), "weight_decay"),
        (("--warmup-steps", "2"), "warmup_steps"),
    ]:
        args = list(flags)
        assert _finetune(tiny_checkpoints["bert-cls"], finetuned, extra=args) == 2
        assert field in capsys.readouterr().err
    # the evaluation may change once the run is finished (it evaluates no more), not before;
    # it says that the new evaluation is not done and what to run instead
    with caplog.at_level("WARNING", logger="mi_core.training.finetune"):
        assert (
            _finetune(tiny_checkpoints["bert-cls"], finetuned, extra=("--max-eval-examples", "16"))
            == 0
        )
    said = caplog.text
    assert "is finished: its metrics keep the evaluation it trained with" in said
    assert "mi-core eval --model" in said and "max_eval_examples" in said
    unfinished = tmp_path / "unfinished"
    shutil.copytree(finetuned, unfinished)
    shutil.rmtree(unfinished / "checkpoint-4")
    assert (
        _finetune(tiny_checkpoints["bert-cls"], unfinished, extra=("--max-eval-examples", "16"))
        == 2
    )
    assert "max_eval_examples" in capsys.readouterr().err
    assert _finetune(tiny_checkpoints["bert-cls"], finetuned, steps=6) == 2
    assert "steps" in capsys.readouterr().err
    # where and how often it saves is not: a finished run re-run so does no step again
    state = (finetuned / "checkpoint-4" / "trainer_state.json").read_text()
    assert _finetune(tiny_checkpoints["bert-cls"], finetuned, extra=("--save-every", "4")) == 0
    assert (finetuned / "checkpoint-4" / "trainer_state.json").read_text() == state


def test_eval_writes_results_and_predictions(finetuned, tmp_path):
    ckpt = finetuned / "checkpoint-4"
    out, preds = tmp_path / "results.csv", tmp_path / "preds.jsonl"
    code = main(
        [
            "eval",
            "--model",
            str(ckpt),
            "--data",
            "mnli:validation_matched",
            "--data",
            "hans:so_swap",
            "--max-examples",
            "30",
            "--out",
            str(out),
            "--predictions",
            str(preds),
            "--batch-size",
            "7",
        ]
    )
    assert code == 0
    table = pd.read_csv(out)
    assert list(table.columns) == ["dataset", "n", "accuracy"] and list(table["n"]) == [30, 30]
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(rows) == 60
    assert set(rows[0]) == {"dataset", "index", "idx", "label", "prediction", "logits"}
    # each row names its source row: HANS by pairID and subcase (a selection of several
    # subcases is taken subcase by subcase, so the index alone does not find it)
    assert rows[30]["pairID"] == "ex0" and rows[30]["subcase"] == "ln_subject/object_swap"
    # The reported accuracy is the mean of the per-example predictions; HANS is scored 2-way.
    hans = [r for r in rows if r["dataset"].startswith("hans")]
    assert {r["prediction"] for r in hans} <= {0, 1} and len(hans[0]["logits"]) == 3
    acc = sum(r["label"] == r["prediction"] for r in hans) / 30
    assert abs(table.loc[1, "accuracy"] - acc) < 1e-6
    # Predictions equal the model's own argmax, mapped to HANS labels.
    model = load_model(ckpt)
    assert model.task == "mnli"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "nope:split"], "unknown data spec"),
        (["--data", "qqp:validation", "--task", "mnli"], "qqp data"),
        (["--data", "mnli:validation_matched", "--ablate", "L9.H0", "--fill", "zero"], "L9"),
        (["--data", "mnli:validation_matched", "--ablate", "L0.H0"], "needs --means"),
    ],
)
def test_eval_bad_input_is_one_line(finetuned, tmp_path, capsys, args, message):
    out = tmp_path / "r.csv"
    code = main(
        [
            "eval",
            "--model",
            str(finetuned / "checkpoint-4"),
            "--out",
            str(out),
            "--max-examples",
            "4",
            *args,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_optimizer_state_in_the_newest_two_checkpoints_and_a_damaged_one_is_skipped(
    tiny_checkpoints, tmp_path, caplog
):
    bert = tiny_checkpoints["bert-cls"]
    whole = tmp_path / "whole"
    assert _finetune(bert, whole, steps=6) == 0
    has_state = {
        s: (whole / f"checkpoint-{s}" / "optimizer.safetensors").is_file() for s in (2, 4, 6)
    }
    assert has_state == {2: False, 4: True, 6: True}  # 2 x model size saved per old checkpoint
    assert (whole / "checkpoint-2" / "model.safetensors").is_file()  # still a full HF checkpoint

    damaged = tmp_path / "damaged"
    shutil.copytree(whole, damaged)
    state = damaged / "checkpoint-6" / "optimizer.safetensors"
    state.write_bytes(state.read_bytes()[:64])
    (damaged / "checkpoint-6" / "trainer_state.json").write_text("{")  # and its JSON
    with caplog.at_level("WARNING", logger="mi_core.training.finetune"):
        assert _finetune(bert, damaged, steps=6) == 0
    assert "training state is damaged" in caplog.text and "checkpoint-4" in caplog.text
    a = load_file(str(whole / "checkpoint-6" / "model.safetensors"))
    b = load_file(str(damaged / "checkpoint-6" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)  # redone from step 4

    limited = tmp_path / "limited"
    assert _finetune(bert, limited, steps=6, extra=("--save-total-limit", "2")) == 0
    assert sorted(p.name for p in limited.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]


def test_eval_says_when_the_head_was_made_at_random(tmp_path, caplog, tiny_checkpoints):
    """minilm is a pretrained body: its MNLI head is made at load time, so its accuracy is
    chance, and eval says so; a classifier checkpoint keeps its own head and gets no warning."""
    from mi_core.evaluation import EvalConfig, run_eval

    def warned(model: str) -> bool:
        caplog.clear()
        config = EvalConfig(model=model, task="mnli", data=["mnli:validation_matched"],
                            max_examples=4, out=str(tmp_path / "r.csv"))  # fmt: skip
        with caplog.at_level("WARNING"):
            run_eval(config, progress=False)
        return any("made at random" in r.getMessage() for r in caplog.records)

    assert load_model("minilm", task="mnli").head_from_checkpoint is False
    assert warned("minilm")
    assert load_model(tiny_checkpoints["bert-cls"], task="mnli").head_from_checkpoint is True
    assert not warned(str(tiny_checkpoints["bert-cls"]))
    # an ablation table of a random head is chance too, and says so (it had said nothing)
    from mi_core.interventions import AblationTableConfig, run_ablation_table

    caplog.clear()
    table = AblationTableConfig(model="minilm", task="mnli", heads="L0.H0", fill="zero",
                                data=["hans:so_swap"], max_examples=4,
                                out=str(tmp_path / "t.csv"))  # fmt: skip
    with caplog.at_level("WARNING"):
        run_ablation_table(table, progress=False)
    assert any("made at random" in r.getMessage() for r in caplog.records)
