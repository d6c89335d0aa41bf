"""File-system faults through the command line: one stderr line, a non-zero exit, before any work,
and earlier outputs untouched."""

from __future__ import annotations

import os

import pytest

from mi_core.cli import main


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("mi-core: error: cannot write results to ")
    return err[0]


def test_a_file_in_the_way_of_an_output_folder(tmp_path, capsys, tiny_checkpoints):
    blocker = tmp_path / "runs"
    blocker.write_text("not a folder")
    argv = ["finetune", "--model", str(tiny_checkpoints["bert-cls"]), "--task", "mnli"]
    argv += ["--train", "mnli:train", "--steps", "1", "--out", str(blocker / "ft")]
    assert main(argv) == 2
    assert "runs/ft: Not a directory" in _one_line(capsys)
    assert blocker.read_text() == "not a folder"


def test_a_folder_in_the_way_of_an_output_file(tmp_path, capsys, tiny_checkpoints):
    (tmp_path / "means.safetensors").mkdir()
    argv = ["means", "--model", str(tiny_checkpoints["bert-cls"]), "--data", "mnli:train"]
    assert main([*argv, "--out", str(tmp_path / "means.safetensors")]) == 2
    assert "a folder is in the way of the output file" in _one_line(capsys)


def test_a_bad_second_output_is_found_before_the_first_is_touched(tmp_path, capsys):
    results = tmp_path / "results.csv"
    results.write_text("dataset,n,accuracy\nearlier,1,1.0\n")
    before = results.stat().st_mtime_ns
    (tmp_path / "preds.jsonl").mkdir()
    argv = ["eval", "--model", "no-such-model", "--data", "hans:so_swap", "--out", str(results)]
    assert main([*argv, "--predictions", str(tmp_path / "preds.jsonl")]) == 2
    _one_line(capsys)  # the output check ran before the (missing) model was even looked up
    assert results.stat().st_mtime_ns == before


def test_a_command_writing_one_file_knows_it_whatever_the_suffix(tmp_path, capsys):
    """eval's --out is one file: a folder there is refused before any work (it was refused
    after the evaluation, naming a hidden temporary file), and a .tsv written once is
    not taken for a folder the second time."""
    argv = ["eval", "--model", "no-such-model", "--data", "hans:so_swap", "--out"]
    (tmp_path / "results").mkdir()
    assert main([*argv, str(tmp_path / "results")]) == 2
    assert "results: a folder is in the way of the output file" in _one_line(capsys)
    earlier = tmp_path / "results.tsv"
    earlier.write_text("dataset,n,accuracy\n")
    assert main([*argv, str(earlier)]) == 2  # past the output check, to the missing model
    err = capsys.readouterr().err
    assert "cannot write results" not in err and "no-such-model" in err


def test_a_file_where_a_command_writes_a_folder_is_refused_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "r.csv"  # a file suffix, yet prune's --out is a folder
    blocker.write_text("mine")
    argv = ["prune", "--model", "no-such-model", "--train", "mnli:train", "--sparsity", "0.5"]
    argv += ["--out", str(blocker)]
    assert main(argv) == 2
    assert "r.csv: a file is in the way of the output folder" in _one_line(capsys)
    assert blocker.read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    argv = ["sweep", "--model", "m", "--train", "mnli:train", "--sparsities", "0.5"]
    assert main([*argv, "--seeds", "1-1", "--out", str(locked / "sweep")]) == 2
    assert "Permission denied" in _one_line(capsys)


def test_a_second_run_on_the_same_output_is_refused(tmp_path, capsys):
    from mi_core.io import output_lock

    out = tmp_path / "sweep"
    argv = ["sweep", "--model", "m", "--train", "mnli:train", "--sparsities", "0.5"]
    with output_lock(out):
        assert main([*argv, "--seeds", "1-1", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"another mi-core run (pid {os.getpid()})" in err[0]
    assert not out.exists()  # the refused run wrote nothing


def test_damaged_weights_are_one_line_and_a_damaged_cache_is_rebuilt(
    tmp_path, capsys, caplog, monkeypatch, tiny_checkpoints
):
    import shutil

    import torch

    from mi_core.errors import ModelLoadError
    from mi_core.models import load_model

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoints["bert-cls"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # truncated
    with pytest.raises(ModelLoadError, match="truncated or damaged"):
        load_model(broken, task="mnli")
    out = tmp_path / "r.csv"
    assert main(["eval", "--model", str(broken), "--data", "hans:so_swap", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "truncated or damaged" in err[0] and not out.exists()

    monkeypatch.setenv("MI_CORE_CACHE_DIR", str(tmp_path / "cache"))
    ids = torch.tensor([[101, 2023, 2003, 102]])
    first = load_model(tiny_checkpoints["llama-lm"])(ids)
    (cached,) = (tmp_path / "cache").glob("tl_weights/*/tl_weights.safetensors")
    cached.write_bytes(cached.read_bytes()[:100])
    with caplog.at_level("WARNING", logger="mi_core.models.loading"):
        again = load_model(tiny_checkpoints["llama-lm"])(ids)
    assert "damaged" in caplog.text and "rebuilding" in caplog.text
    assert torch.equal(first, again)
    assert cached.stat().st_size > 100  # rebuilt


def test_a_read_only_result_file_is_not_replaced(tmp_path, capsys):
    """A result kept read-only on purpose (chmod 444) was silently replaced (the atomic rename
    needs only the folder's permission) and came back writable."""
    kept = tmp_path / "results.csv"
    kept.write_text("dataset,n,accuracy\nearlier,1,1.0\n")
    kept.chmod(0o444)
    argv = ["eval", "--model", "no-such-model", "--data", "hans:so_swap", "--out", str(kept)]
    assert main(argv) == 2
    assert "results.csv: the file is read-only" in _one_line(capsys)
    assert kept.read_text().endswith("earlier,1,1.0\n") and not kept.stat().st_mode & 0o222
    # the same for a file inside an output folder (a run's metrics.json kept read-only)
    from mi_core.errors import OutputError
    from mi_core.io import write_json

    inside = tmp_path / "run" / "metrics.json"
    inside.parent.mkdir()
    inside.write_text("{}")
    inside.chmod(0o444)
    with pytest.raises(OutputError, match="metrics.json: the file is read-only"):
        write_json(inside, {"a": 1})
    assert inside.read_text() == "{}"


def test_damaged_files_in_an_output_folder_are_one_line(tmp_path, capsys, tiny_checkpoints):
    """A truncated config.json or checkpoint in a run folder ended in a Python traceback."""
    from mi_core.errors import DamagedFileError
    from mi_core.io import read_json, read_safetensors

    (tmp_path / "half.json").write_text('{"prune": {"steps": 4')
    with pytest.raises(DamagedFileError, match="half.json is damaged"):
        read_json(tmp_path / "half.json")
    (tmp_path / "half.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(DamagedFileError, match="half.safetensors is damaged"):
        read_safetensors(tmp_path / "half.safetensors")
    # through the command line: a prune run folder whose config.json was cut short
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"prune": ')
    argv = ["prune", "--model", str(tiny_checkpoints["bert-cls"]), "--train", "mnli:train",
            "--max-train-examples", "8", "--sparsity", "0.5", "--steps", "1", "--out", str(out),
            "--fill", "zero",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json is damaged" in err[0], err


def test_a_full_disk_is_one_error_naming_the_file(tmp_path, monkeypatch):
    """safetensors reports a failed write as its own error type; it ended in a traceback."""
    import safetensors.torch
    import torch
    from safetensors import SafetensorError

    from mi_core.errors import OutputError
    from mi_core.io import write_safetensors

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: IoError(No space left on device)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(OutputError, match="cannot write .*x.safetensors: .*No space left"):
        write_safetensors(tmp_path / "x.safetensors", {"a": torch.zeros(2)})
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


@pytest.mark.parametrize(
    ("command", "says"),
    [("means", "keeps no partial results"), ("prune", "a re-run resumes")],
)
def test_ctrl_c_says_whether_a_re_run_resumes(command, says, tmp_path, capsys, monkeypatch):
    """means and circuit attribute keep nothing of an interrupted run; the message said they
    resume."""
    import mi_core.cli.means
    import mi_core.cli.prune

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(getattr(mi_core.cli, command), "run", interrupted)
    argv = {
        "means": ["means", "--model", "m", "--data", "mnli:train",
                  "--out", str(tmp_path / "m.safetensors")],
        "prune": ["prune", "--model", "m", "--train", "mnli:train", "--sparsity", "0.5",
                  "--out", str(tmp_path / "p")],
    }[command]  # fmt: skip
    assert main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_unreadable_weights_say_so(tmp_path, capsys, tiny_checkpoints, monkeypatch):
    """safetensors reports a file it may not open as not found; the error said the weights
    were truncated or damaged. (Simulated: the tests may run as root, who reads everything.)"""
    import shutil

    import mi_core.models.loading as loading
    from mi_core.errors import ModelLoadError
    from mi_core.models import load_model

    path = shutil.copytree(tiny_checkpoints["bert-cls"], tmp_path / "m")
    (path / "model.safetensors").write_bytes(b"")  # the load fails as it would on mode 000
    real = os.access
    monkeypatch.setattr(
        loading.os, "access",
        lambda p, mode: False if str(p).endswith("model.safetensors") else real(p, mode),
    )  # fmt: skip
    with pytest.raises(ModelLoadError, match=r"model.safetensors is not readable \(Permission"):
        load_model(path, task="mnli")


def test_abbreviated_flags_and_an_empty_out_are_refused(tmp_path, capsys):
    """``sweep --seed 3`` was read as ``--seeds 3`` (three seeds), and ``--out ""`` (an unset
    $OUT) wrote results into the current folder."""
    argv = ["sweep", "--model", "m", "--train", "mnli:train", "--sparsities", "0.5"]
    assert main([*argv, "--seed", "3", "--out", str(tmp_path / "s")]) == 2
    assert "--seeds" in capsys.readouterr().err  # the real flag is still required
    assert main([*argv, "--seeds", "1", "--out", ""]) == 2
    assert "--out is empty" in capsys.readouterr().err


def test_a_link_is_written_through_and_a_device_is_never_replaced(tmp_path, capsys):
    from mi_core.io import write_text

    target = tmp_path / "target.csv"
    target.write_text("old")
    (tmp_path / "link.csv").symlink_to(target)
    write_text(tmp_path / "link.csv", "new")
    assert (tmp_path / "link.csv").is_symlink() and target.read_text() == "new"
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    argv = ["eval", "--model", "m", "--data", "hans:so_swap", "--out", str(fifo)]
    assert main(argv) == 2
    assert "it is not a regular file" in _one_line(capsys)
    assert fifo.exists() and not fifo.is_file()


def test_a_failed_write_names_the_file_asked_for_also_on_a_relative_path(tmp_path, monkeypatch):
    """mkstemp returns the temporary file's absolute path: compared with a relative target it
    had not been recognised, and errors named the hidden temporary file."""
    from mi_core.io import write_json

    monkeypatch.chdir(tmp_path)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", src)

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError) as caught:
        write_json(os.path.join("out", "x.json"), {})
    assert caught.value.filename == os.path.join("out", "x.json")


def test_training_jobs_check_their_records_before_the_first_step(
    tmp_path, capsys, tiny_checkpoints, data_dir
):
    """finetune wrote train_loss.csv only at its first save, after training up to it, and a
    sweep met a read-only run folder after the runs before it: both lost the work each retry."""
    model = str(tiny_checkpoints["bert-cls"])
    out = tmp_path / "ft"
    out.mkdir()
    (out / "train_loss.csv").write_text("step,loss,lr\n")
    (out / "train_loss.csv").chmod(0o444)
    argv = ["finetune", "--model", model, "--task", "mnli", "--train", "mnli:train", "--steps",
            "2", "--save-every", "2", "--max-train-examples", "16", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    assert "train_loss.csv: the file is read-only" in _one_line(capsys)
    assert not list(out.glob("checkpoint-*"))  # refused before training

    sweep = tmp_path / "sweep"
    blocked = sweep / "s0.50" / "seed2"
    blocked.mkdir(parents=True)
    (blocked / "log.csv").write_text("")
    (blocked / "log.csv").chmod(0o444)
    argv = ["sweep", "--model", model, "--task", "mnli", "--train", "mnli:train", "--sparsities",
            "0.5", "--seeds", "1-2", "--max-train-examples", "16", "--steps", "2", "--fill",
            "zero", "--out",
            str(sweep), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    assert "seed2/log.csv: the file is read-only" in _one_line(capsys)
    assert not (sweep / "s0.50" / "seed1" / "metrics.json").exists()  # no run before it
    # ...but finished runs archived read-only are only read: a re-run goes through
    (blocked / "log.csv").unlink()
    assert main(argv) == 0
    for path in (sweep / "s0.50").rglob("*"):
        if path.is_file():
            path.chmod(0o444)
    assert main(argv) == 0


def test_ablate_checks_all_three_of_its_files_before_the_work(tmp_path, capsys, tiny_checkpoints):
    """The table is written as .csv, .md and .html; only the .csv was checked before the
    ablations ran, so a folder named like the .md was found after them."""
    (tmp_path / "table.md").mkdir()
    argv = ["ablate", "--model", str(tiny_checkpoints["bert-cls"]), "--heads", "L0.H0",
            "--fill", "zero", "--data", "hans:so_swap", "--max-examples", "2", "--out",
            str(tmp_path / "table.csv")]  # fmt: skip
    assert main(argv) == 2
    assert "table.md" in _one_line(capsys)
    assert not (tmp_path / "table.csv").exists()  # nothing written beside it
