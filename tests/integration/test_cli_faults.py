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


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    argv = ["sweep", "--model", "m", "--train", "mnli:train", "--sparsities", "0.5"]
    assert main([*argv, "--seeds", "1-1", "--out", str(locked / "sweep")]) == 2
    assert "Permission denied" in _one_line(capsys)
