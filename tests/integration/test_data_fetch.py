"""``mi-core data fetch``: the hub's data sets written in the layout every loader reads offline,
files already there kept, and without a network one line that says what to place where."""

from __future__ import annotations

import json

import pytest

from mi_core.cli import main
from mi_core.data import fetch as fetch_module
from mi_core.data import load_pairs
from mi_core.data.text import load_text


class _Rows:
    """What ``datasets.load_dataset`` returns, as far as fetch reads it."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def to_dict(self) -> dict[str, list]:
        return {k: [r[k] for r in self.rows] for k in self.rows[0]}


def _fake_hub(calls: list):
    def hub_load(spec, rel, root, args, kwargs, how, *, fetch=False):
        calls.append((args, kwargs["split"]))
        if args == ("nyu-mll/glue", "mnli"):
            n = 1200 if kwargs["split"] == "train" else 5
            return _Rows([{"premise": f"p{i}", "hypothesis": f"h{i}", "label": i % 3, "idx": i}
                          for i in range(n)])  # fmt: skip
        if args == ("jhu-cogsci/hans",):
            rows = [
                {"premise": f"The judge saw the actor {i} .", "hypothesis": "The actor saw .",
                 "label": 1 if i < 4 else 0, "parse_premise": "(ROOT)",
                 "parse_hypothesis": "(ROOT)", "binary_parse_premise": "( a )",
                 "binary_parse_hypothesis": "( b )", "heuristic": "lexical_overlap",
                 "subcase": "ln_subject/object_swap" if i < 4 else "le_relative_clause",
                 "template": "temp1"}
                for i in range(6)
            ]  # fmt: skip
            return _Rows(rows)
        if args[0] == "Salesforce/wikitext":
            return _Rows([{"text": " = Valkyria = \n"}, {"text": " The game began .\n"},
                          {"text": " = Tower = \n"}, {"text": " It stands .\n"}])  # fmt: skip
        raise AssertionError(f"unexpected hub call {args}")

    return hub_load


def test_fetch_writes_what_every_loader_reads_offline(tmp_path, monkeypatch, capsys):
    calls: list = []
    monkeypatch.setattr(fetch_module, "hub_load", _fake_hub(calls))
    root = tmp_path / "data"
    args = ["data", "fetch", "--to", str(root), "--sets", "mnli", "hans", "wikitext", "python"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "7 file(s) written" in out and "paws_qqp/dev_and_test.tsv" in out
    monkeypatch.setenv("MI_CORE_DATA_DIR", str(root))
    train, heldout = load_pairs("mnli:train"), load_pairs("mnli:heldout")
    assert (len(train), len(heldout)) == (200, 1000)
    assert not {r["idx"] for r in map(json.loads, (root / "mnli/train.jsonl").open())} & {
        r["idx"] for r in map(json.loads, (root / "mnli/heldout.jsonl").open())
    }  # disjoint
    assert len(load_pairs("mnli:validation_matched")) == 5
    swap = load_pairs("hans:ln_subject/object_swap")
    assert len(swap) == 4 and swap.num_labels == 2 and set(swap.labels) == {1}
    assert len(load_text("text:wikitext")) == 2
    python = load_text("text:python")
    assert len(python) > 50 and any("def " in doc for doc in python)
    # a second fetch keeps the files and calls the hub for nothing
    calls.clear()
    assert main(args) == 0
    assert calls == [] and "0 file(s) written" in capsys.readouterr().out


def test_without_a_network_fetch_says_what_to_place_where(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / "data"
    assert main(["data", "fetch", "--to", str(root), "--sets", "mnli"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "mnli/validation_matched.jsonl" in err[0] and str(root) in err[0]
    # one place to put it: the fetch's folder (not also MI_CORE_DATA_DIR), said plainly
    assert "to get it: run with the hub reachable (HF_HUB_OFFLINE unset), or place mnli/" in err[0]
    assert "MI_CORE_DATA_DIR" not in err[0]


@pytest.mark.parametrize("bad", [["--sets", "pile"], ["--to"]])
def test_bad_fetch_arguments_are_one_line(tmp_path, capsys, bad):
    assert main(["data", "fetch", *bad]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
