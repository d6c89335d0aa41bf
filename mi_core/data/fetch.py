"""``mi-core data fetch``: write a data directory in the layout ``MI_CORE_DATA_DIR`` expects.

For a user who cloned the repository without a data directory: with a network, the data sets
come from the Hugging Face hub once (``datasets.load_dataset``) and are written where every
loader then finds them offline::

    mnli/train.jsonl, mnli/heldout.jsonl,       premise, hypothesis, label, idx (GLUE labels)
    mnli/validation_matched.jsonl, mnli/validation_mismatched.jsonl
    qqp/train.jsonl, qqp/validation.jsonl       question1, question2, label, idx
    hans/heuristics_evaluation_set.txt          the official HANS TSV header and columns
    text/wikitext2_test.raw                     WikiText-2 raw test text
    text/python_stdlib_sample.jsonl             path, text of this Python's standard library

``mnli/heldout.jsonl`` (the in-domain held-out set pruning evaluates on) is 1,000 MNLI training
pairs drawn with a fixed seed; ``mnli/train.jsonl`` holds the other training pairs, so the two are
disjoint. PAWS-QQP has no hub copy: its file is named with how to build it. Without a network
(or with ``HF_HUB_OFFLINE`` set) the first set that needs the hub fails at once with one line
that says exactly which file to place where. Files already there are kept (``overwrite``
replaces them); every file is written atomically.
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mi_core.config import Config, option
from mi_core.data._sources import HANS_FILE, PAWS_FILE, hub_load, hub_rows
from mi_core.errors import DataError
from mi_core.io import atomic_path, write_text

#: What ``fetch`` can write, in order.
FETCH_SETS = ("mnli", "qqp", "hans", "wikitext", "python")
#: Held-out MNLI training pairs, drawn with :data:`HELDOUT_SEED`.
HELDOUT_SIZE = 1000
HELDOUT_SEED = 0
#: The official HANS columns, in order.
HANS_COLUMNS = (
    "gold_label",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
    "pairID",
    "heuristic",
    "subcase",
    "template",
)


@dataclass(kw_only=True)
class FetchConfig(Config):
    """The data-fetch job (``mi-core data fetch``)."""

    to: str | None = option(None, metavar="DIR")
    """Data directory to write (default: MI_CORE_DATA_DIR, else ./data)."""
    sets: list[str] = option(default_factory=lambda: list(FETCH_SETS), choices=FETCH_SETS,
                             metavar="SET")  # fmt: skip
    """Data sets to fetch."""
    overwrite: bool = False
    """Replace files that are already there."""

    def validate(self) -> None:
        bad = [s for s in self.sets if s not in FETCH_SETS]
        if bad or not self.sets:
            raise DataError(f"sets must be some of {list(FETCH_SETS)}, got {self.sets}")
        super().validate()  # the choices, types and bounds of every field

    def directory(self) -> Path:
        """Where the files go."""
        return Path(self.to or os.environ.get("MI_CORE_DATA_DIR") or "data").expanduser()


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def _hub(spec: str, rel: str, root: Path, args: tuple, kwargs: dict) -> list[dict[str, Any]]:
    how = f"place {rel} under {root} yourself (see the data README for its columns)"
    return hub_rows(hub_load(spec, rel, root, args, kwargs, how, fetch=True))


def _glue(family: str, root: Path, overwrite: bool) -> list[Path]:
    a, b = ("premise", "hypothesis") if family == "mnli" else ("question1", "question2")
    splits = ["validation_matched", "validation_mismatched"] if family == "mnli" else ["validation"]
    written = []
    for split in splits:
        rel = f"{family}/{split}.jsonl"
        if overwrite or not (root / rel).is_file():
            rows = _hub(f"{family}:{split}", rel, root, ("nyu-mll/glue", family), {"split": split})
            _write_jsonl(root / rel, ({a: r[a], b: r[b], "label": r["label"], "idx": r["idx"]}
                                      for r in rows))  # fmt: skip
            written.append(root / rel)
    train_rel = f"{family}/train.jsonl"
    targets = [train_rel] + ([f"{family}/heldout.jsonl"] if family == "mnli" else [])
    if overwrite or not all((root / t).is_file() for t in targets):
        rows = _hub(
            f"{family}:train", train_rel, root, ("nyu-mll/glue", family), {"split": "train"}
        )
        rows = [{a: r[a], b: r[b], "label": r["label"], "idx": r["idx"]} for r in rows]
        if family == "mnli":
            held = set(random.Random(HELDOUT_SEED).sample(range(len(rows)), HELDOUT_SIZE))
            _write_jsonl(root / targets[1], (r for i, r in enumerate(rows) if i in held))
            rows = [r for i, r in enumerate(rows) if i not in held]
            written.append(root / targets[1])
        _write_jsonl(root / train_rel, rows)
        written.append(root / train_rel)
    return written


def _hans(root: Path, overwrite: bool) -> list[Path]:
    if not overwrite and (root / HANS_FILE).is_file():
        return []
    rows = _hub("hans", HANS_FILE, root, ("jhu-cogsci/hans",), {"split": "validation"})
    names = {0: "entailment", 1: "non-entailment"}
    source = {
        "sentence1_binary_parse": "binary_parse_premise",
        "sentence2_binary_parse": "binary_parse_hypothesis",
        "sentence1_parse": "parse_premise",
        "sentence2_parse": "parse_hypothesis",
        "sentence1": "premise",
        "sentence2": "hypothesis",
    }
    lines = ["\t".join(HANS_COLUMNS)]
    for i, r in enumerate(rows):
        label = r.get("label")
        values = {
            "gold_label": names.get(label, str(label)),
            "pairID": f"ex{i}",
            **{column: r.get(key, "") for column, key in source.items()},
            **{k: r.get(k, "") for k in ("heuristic", "subcase", "template")},
        }
        lines.append("\t".join(str(values[c]).replace("\t", " ") for c in HANS_COLUMNS))
    write_text(root / HANS_FILE, "\n".join(lines) + "\n")
    return [root / HANS_FILE]


def _wikitext(root: Path, overwrite: bool) -> list[Path]:
    rel = "text/wikitext2_test.raw"
    if not overwrite and (root / rel).is_file():
        return []
    rows = _hub("text:wikitext", rel, root, ("Salesforce/wikitext", "wikitext-2-raw-v1"),
                {"split": "test"})  # fmt: skip
    write_text(root / rel, "".join(r["text"] for r in rows))
    return [root / rel]


def _python(root: Path, overwrite: bool) -> list[Path]:
    """This Python's standard library modules (top-level ``*.py``), no network needed."""
    rel = "text/python_stdlib_sample.jsonl"
    if not overwrite and (root / rel).is_file():
        return []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    rows = []
    for path in files:
        try:
            rows.append({"path": f"Lib/{path.name}", "text": path.read_text(encoding="utf-8")})
        except (OSError, UnicodeDecodeError):
            continue
    if not rows:
        raise DataError(f"no standard-library sources under {stdlib}; place {rel} yourself")
    _write_jsonl(root / rel, rows)
    return [root / rel]


_FETCHERS: dict[str, Callable[[Path, bool], list[Path]]] = {
    "mnli": lambda root, overwrite: _glue("mnli", root, overwrite),
    "qqp": lambda root, overwrite: _glue("qqp", root, overwrite),
    "hans": _hans,
    "wikitext": _wikitext,
    "python": _python,
}


def fetch_data(config: FetchConfig) -> list[Path]:
    """Write the data sets of ``config`` into its directory; return the files written (files
    already there are kept unless ``overwrite``). PAWS-QQP cannot be fetched (no hub copy)."""
    root = config.directory()
    root.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name in config.sets:
        written += _FETCHERS[name](root, config.overwrite)
    return written


#: What a data directory lacks that fetch cannot provide, and how to provide it.
NOT_FETCHED = {
    PAWS_FILE: "PAWS-QQP has no hub copy: build dev_and_test.tsv with the official scripts "
    "(https://github.com/google-research-datasets/paws)",
}
