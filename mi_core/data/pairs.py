"""Sentence-pair classification data: MNLI, HANS, QQP, PAWS-QQP and local files.

Specs (see :func:`available_specs`):

* ``mnli:{train,validation_matched,validation_mismatched,heldout}`` - MNLI, 3-way labels
  (0 entailment, 1 neutral, 2 contradiction). ``heldout`` exists only in the data directory
  (1,000 MNLI train pairs disjoint from ``mnli/train.jsonl``).
* ``hans`` - all 30,000 HANS rows; ``hans:<heuristic>`` (``lexical_overlap``, ``subsequence``,
  ``constituent``); ``hans:<subcase>`` (any of the 30, e.g. ``hans:ln_subject/object_swap``); and
  the paper's short names ``hans:so_swap``, ``hans:prep``, ``hans:embed_if``, ``hans:embed_verb``
  (case-insensitive, ``-`` may stand for ``_``: ``hans:SO-Swap`` works; see
  :data:`HANS_PAPER_SUBCASES`). HANS is 2-way (0 entailment, 1 non-entailment) and is scored from a
  3-way MNLI model with ``prediction_map=[0, 1, 1]`` (neutral and contradiction collapse into
  non-entailment).
* ``qqp:{train,validation}`` - QQP, 1 = duplicate.
* ``paws_qqp`` - PAWS-QQP: train + dev_and_test (12,663 rows, the set the paper evaluates on)
  when ``paws_qqp/train.tsv`` lies beside ``dev_and_test.tsv``, else dev_and_test alone (677
  rows, with a warning); ``paws_qqp:adv`` - its label-0 (non-paraphrase) rows.
  Both 2-way (1 = paraphrase), scored by a QQP model with the identity prediction map.
* a path to a local ``.jsonl``/``.json``/``.csv``/``.tsv`` file with the columns
  ``premise, hypothesis, label`` (MNLI-like), ``question1, question2, label`` (QQP-like) or
  ``sentence1, sentence2, label`` (``gold_label`` is accepted for ``label``). Labels may be ints
  or label names (``entailment``/``neutral``/``contradiction``, ``non-entailment``,
  ``duplicate``/``not_duplicate``, ``paraphrase``/``not_paraphrase``). The model task comes from
  ``task=`` or is inferred from the columns and labels; ``sentence1/sentence2`` files with 0/1
  labels need ``task=``. An MNLI-like file whose labels are ``entailment``/``non-entailment``
  names, or 0/1 ints together with a HANS ``heuristic``/``subcase`` column, is read as 2-way
  HANS-like data. TSV files are read as the official TSVs are written: tab-separated, no quoting.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mi_core.data._sources import (
    HANS_FILE,
    PAWS_FILE,
    PAWS_TRAIN_FILE,
    hub_load,
    hub_rows,
    local_file,
    missing_error,
    read_json_rows,
    resolve_data_dir,
)
from mi_core.errors import DataError
from mi_core.tasks import TASK_LABELS, TASK_NUM_LABELS, TASK_SPLITS

logger = logging.getLogger(__name__)

#: MNLI's labels, in the order of the GLUE label ids.
MNLI_LABELS: tuple[str, ...] = TASK_LABELS["mnli"]
#: HANS's two labels (a 3-way model's neutral and contradiction count as non-entailment).
HANS_LABELS: tuple[str, ...] = ("entailment", "non-entailment")
#: QQP's labels, in the order of the GLUE label ids.
QQP_LABELS: tuple[str, ...] = TASK_LABELS["qqp"]
#: PAWS-QQP's labels, in the order of its label ids.
PAWS_LABELS: tuple[str, ...] = ("not_paraphrase", "paraphrase")

#: Number of output classes of a model fine-tuned on each task.

#: HANS's three heuristics, each with 10 subcases.
HANS_HEURISTICS: tuple[str, ...] = ("lexical_overlap", "subsequence", "constituent")

#: The 30 HANS subcases (10 per heuristic), as named in the official file.
HANS_SUBCASES: tuple[str, ...] = (
    "ln_subject/object_swap",
    "ln_preposition",
    "ln_relative_clause",
    "ln_passive",
    "ln_conjunction",
    "le_relative_clause",
    "le_around_prepositional_phrase",
    "le_around_relative_clause",
    "le_conjunction",
    "le_passive",
    "sn_NP/S",
    "sn_PP_on_subject",
    "sn_relative_clause_on_subject",
    "sn_past_participle",
    "sn_NP/Z",
    "se_conjunction",
    "se_adjective",
    "se_understood_object",
    "se_relative_clause_on_obj",
    "se_PP_on_obj",
    "cn_embedded_under_if",
    "cn_after_if_clause",
    "cn_embedded_under_verb",
    "cn_disjunction",
    "cn_adverb",
    "ce_embedded_under_since",
    "ce_after_since_clause",
    "ce_embedded_under_verb",
    "ce_conjunction",
    "ce_adverb",
)

#: The HANS subcases the paper reports, by the paper's short name. Each is also a spec:
#: ``hans:so_swap``, ``hans:prep``, ``hans:embed_if``, ``hans:embed_verb`` (case-insensitive,
#: ``-`` or ``_``, so ``hans:SO-Swap`` works too).
HANS_PAPER_SUBCASES: dict[str, str] = {
    "SO-Swap": "ln_subject/object_swap",
    "Prep": "ln_preposition",
    "Embed-If": "cn_embedded_under_if",
    "Embed-Verb": "cn_embedded_under_verb",
}

#: A HANS subcase's canonical name -> the paper's short name.
_PAPER_NAMES = {f"hans:{long}": short for short, long in HANS_PAPER_SUBCASES.items()}

_warned_paws: set[str] = set()

_GLUE_SPLITS: dict[str, tuple[str, ...]] = TASK_SPLITS
_LOCAL_ONLY = {("mnli", "heldout")}
_TEXT_COLUMNS = (("premise", "hypothesis"), ("question1", "question2"), ("sentence1", "sentence2"))
_LABEL_COLUMNS = ("label", "gold_label")
_META_COLUMNS = ("idx", "id", "pairID", "heuristic", "subcase", "template")
_FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")

# normalised label name -> (scheme, value); "nli" (entailment) fits both MNLI and HANS
_LABEL_NAMES: dict[str, tuple[str, int]] = {
    "entailment": ("nli", 0),
    "neutral": ("mnli", 1),
    "contradiction": ("mnli", 2),
    "non_entailment": ("hans", 1),
    "not_entailment": ("hans", 1),
    "not_duplicate": ("qqp", 0),
    "duplicate": ("qqp", 1),
    "not_paraphrase": ("paws", 0),
    "paraphrase": ("paws", 1),
}
_SCHEMES: dict[str, tuple[str, tuple[str, ...], list[int]]] = {
    # scheme -> (model task, label names, prediction map)
    "mnli": ("mnli", MNLI_LABELS, [0, 1, 2]),
    "hans": ("mnli", HANS_LABELS, [0, 1, 1]),
    "qqp": ("qqp", QQP_LABELS, [0, 1]),
    "paws": ("qqp", PAWS_LABELS, [0, 1]),
}


def same_data_set(spec: str, train: str) -> bool:
    """Whether the data spec ``spec`` names a split of ``train``'s data set (``mnli:...`` for
    ``mnli:train``: in-domain for a model trained on it); never for a local file. Prompt
    tasks: an IOI split is its own data set (``ioi:baba`` is out-of-domain for ``ioi:abba``),
    an NLI prompt set is of the data set of the pairs it renders."""
    if spec.startswith("nli:") and train.startswith("nli:"):
        return same_data_set(spec.removeprefix("nli:"), train.removeprefix("nli:"))
    if spec.startswith("ioi") or train.startswith("ioi"):
        return spec == train
    family = train.split(":")[0] if ":" in train else None
    return family is not None and spec.split(":")[0] == family


def model_num_labels(task: str) -> int:
    """Output classes of a model fine-tuned on ``task`` (``mnli``: 3, ``qqp``: 2)."""
    try:
        return TASK_NUM_LABELS[task]
    except KeyError:
        raise DataError(
            f"unknown model task {task!r}; expected one of {', '.join(TASK_NUM_LABELS)}"
        ) from None


def _short(name: str) -> str:
    return name.strip().lower().replace("-", "_")


_HANS_SHORT = {_short(k): v for k, v in HANS_PAPER_SUBCASES.items()}


def _build_registry() -> dict[str, str]:
    reg: dict[str, str] = {}
    for task, splits in _GLUE_SPLITS.items():
        for split in splits:
            reg[f"{task}:{split}"] = f"{task.upper()} {split}"
    reg["hans"] = "HANS, all 30 subcases (30,000 rows)"
    for heur in HANS_HEURISTICS:
        reg[f"hans:{heur}"] = f"HANS {heur} (10 subcases)"
    for sub in HANS_SUBCASES:
        reg[f"hans:{sub}"] = f"HANS subcase {sub}"
    for short, sub in HANS_PAPER_SUBCASES.items():
        reg[f"hans:{_short(short)}"] = f"HANS {short} = {sub}"
    reg["paws_qqp"] = "PAWS-QQP train + dev_and_test (12,663 rows; dev_and_test alone if no train)"
    reg["paws_qqp:adv"] = "PAWS-QQP, label-0 (non-paraphrase) rows"
    reg["paws_qqp:dev_and_test"] = "PAWS-QQP dev_and_test.tsv alone (677 rows)"
    return reg


#: Every pair-data spec :func:`load_pairs` accepts by name, with a description.
PAIR_SPECS: dict[str, str] = _build_registry()


def available_specs(kind: str = "all") -> list[str]:
    """The specs accepted by name: ``kind`` ``"pairs"`` (:func:`load_pairs`), ``"text"``
    (:func:`mi_core.data.load_text`) or ``"all"``."""
    from mi_core.data.text import TEXT_SPECS

    if kind == "pairs":
        return list(PAIR_SPECS)
    if kind == "text":
        return list(TEXT_SPECS)
    if kind == "all":
        return list(PAIR_SPECS) + list(TEXT_SPECS)
    raise DataError(f"unknown spec kind {kind!r}; expected 'pairs', 'text' or 'all'")


# --------------------------------------------------------------------------------------------
# the data set


@dataclass
class PairDataset:
    """A labelled sentence-pair data set, ready to tokenise and score.

    ``task`` is the task of the model that scores it (``"mnli"`` or ``"qqp"``); ``num_labels`` and
    ``label_names`` are the data set's own (HANS: 2); ``prediction_map[c]`` is the data set label
    that a model's class ``c`` counts as. ``meta`` holds per-example lists (HANS: ``heuristic``,
    ``subcase``, ``template``, ``pairID``; GLUE: ``idx``; PAWS: ``id``).
    """

    name: str
    task: str
    text_a: list[str]
    text_b: list[str]
    labels: list[int]
    num_labels: int
    label_names: list[str]
    prediction_map: list[int]
    meta: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.text_a)
        if len(self.text_b) != n or len(self.labels) != n:
            raise DataError(
                f"{self.name}: text_a, text_b and labels differ in length "
                f"({n}, {len(self.text_b)}, {len(self.labels)})"
            )
        for key, values in self.meta.items():
            if len(values) != n:
                raise DataError(f"{self.name}: meta[{key!r}] has {len(values)} entries, not {n}")
        if self.task not in TASK_NUM_LABELS:
            raise DataError(f"{self.name}: unknown model task {self.task!r}")
        if len(self.label_names) != self.num_labels:
            raise DataError(
                f"{self.name}: {len(self.label_names)} label names, not {self.num_labels}"
            )
        if len(self.prediction_map) != TASK_NUM_LABELS[self.task] or any(
            not 0 <= m < self.num_labels for m in self.prediction_map
        ):
            raise DataError(f"{self.name}: bad prediction_map {self.prediction_map}")
        bad = [y for y in self.labels if not 0 <= y < self.num_labels]
        if bad:
            raise DataError(f"{self.name}: label {bad[0]} outside 0..{self.num_labels - 1}")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """One example as a dict: text_a, text_b, label and its meta fields."""
        out = {"text_a": self.text_a[i], "text_b": self.text_b[i], "label": self.labels[i]}
        out.update({k: v[i] for k, v in self.meta.items()})
        return out

    @property
    def model_num_labels(self) -> int:
        """Output classes of the model that scores this data set."""
        return len(self.prediction_map)

    @property
    def chance_accuracy(self) -> float:
        """The accuracy of a guess: one over the data set's labels."""
        return 1.0 / self.num_labels

    def label_tensor(self) -> torch.Tensor:
        """The labels as a LongTensor."""
        return torch.tensor(self.labels, dtype=torch.long)

    def subset(self, indices: Iterable[int] | torch.Tensor | np.ndarray, name: str | None = None):
        """The examples at ``indices`` (ints, in the order given; or a boolean mask)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.cpu().numpy()
        idx = np.asarray(list(indices) if not isinstance(indices, np.ndarray) else indices)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise DataError(
                    f"{self.name}: boolean mask of shape {idx.shape}, not ({len(self)},)"
                )
            idx = np.flatnonzero(idx)
        idx_list = [int(i) for i in idx.reshape(-1)]
        n = len(self)
        for i in idx_list:
            if not -n <= i < n:
                raise DataError(f"{self.name}: index {i} out of range for {n} examples")
        pick = lambda xs: [xs[i] for i in idx_list]
        return PairDataset(
            name=name or self.name,
            task=self.task,
            text_a=pick(self.text_a),
            text_b=pick(self.text_b),
            labels=pick(self.labels),
            num_labels=self.num_labels,
            label_names=list(self.label_names),
            prediction_map=list(self.prediction_map),
            meta={k: pick(v) for k, v in self.meta.items()},
        )

    def copy(self, name: str | None = None) -> PairDataset:
        """A copy with its own lists (optionally renamed)."""
        return PairDataset(
            name=name or self.name,
            task=self.task,
            text_a=list(self.text_a),
            text_b=list(self.text_b),
            labels=list(self.labels),
            num_labels=self.num_labels,
            label_names=list(self.label_names),
            prediction_map=list(self.prediction_map),
            meta={k: list(v) for k, v in self.meta.items()},
        )

    def head(self, n: int) -> PairDataset:
        """The first ``n`` examples (all of them if there are fewer)."""
        return self.subset(range(min(max(int(n), 0), len(self))))

    def selection(self) -> str:
        """``"<n>:<digest>"`` of the examples themselves (texts and labels, in order): caches of
        results on a set compare it, so another selection under the same name and size (e.g.
        the subcases a HANS ``max_examples`` takes) is measured again."""
        digest = hashlib.sha256()
        for a, b, y in zip(self.text_a, self.text_b, self.labels, strict=True):
            digest.update(f"{a}\x1f{b}\x1f{y}\x1e".encode())
        return f"{len(self)}:{digest.hexdigest()[:16]}"

    def matches(self, recorded: Any) -> bool:
        """Whether a cache's record of a set (its :meth:`selection`) names these examples."""
        return recorded == self.selection()

    def spread(self, n: int, key: str = "subcase") -> PairDataset:
        """``n`` examples taken in turn from each group of ``meta[key]`` (in file order within
        a group, groups in order of first appearance), so a set of several HANS subcases keeps
        them all in proportion; :meth:`head` when there is no such column or one group."""
        groups: dict[Any, list[int]] = {}
        for i, value in enumerate(self.meta.get(key, [])):
            groups.setdefault(value, []).append(i)
        if len(groups) < 2:
            return self.head(n)
        picked: list[int] = []
        columns = list(groups.values())
        for depth in range(max(len(c) for c in columns)):
            picked += [c[depth] for c in columns if depth < len(c)]
            if len(picked) >= n:
                break
        return self.subset(sorted(picked[: max(int(n), 0)]))

    def predictions_to_labels(self, pred_classes: Any) -> torch.Tensor:
        """Map model classes to this data set's labels through ``prediction_map``."""
        pred = (
            torch.as_tensor(
                np.asarray(pred_classes) if isinstance(pred_classes, list) else pred_classes
            )
            .long()
            .reshape(-1)
            .cpu()
        )
        k = len(self.prediction_map)
        if pred.numel() and (pred.min() < 0 or pred.max() >= k):
            raise DataError(f"{self.name}: predicted classes must lie in 0..{k - 1}")
        return torch.tensor(self.prediction_map, dtype=torch.long)[pred]

    def score(self, outputs: Any) -> float:
        """Accuracy of ``outputs``: logits ``[n, model classes]`` or predicted classes ``[n]``."""
        out = outputs if isinstance(outputs, torch.Tensor) else torch.as_tensor(np.asarray(outputs))
        out = out.detach().cpu()
        if out.ndim == 2:
            if out.shape[1] != len(self.prediction_map):
                raise DataError(
                    f"{self.name}: logits have {out.shape[1]} classes but a {self.task} model "
                    f"has {len(self.prediction_map)}"
                )
            out = out.argmax(dim=-1)
        elif out.ndim != 1:
            raise DataError(
                f"{self.name}: expected logits [n, classes] or classes [n], "
                f"got shape {tuple(out.shape)}"
            )
        if out.shape[0] != len(self):
            raise DataError(f"{self.name}: {out.shape[0]} predictions for {len(self)} examples")
        if len(self) == 0:
            raise DataError(f"{self.name}: cannot score an empty data set")
        pred = self.predictions_to_labels(out)
        return float((pred == self.label_tensor()).float().mean())


# --------------------------------------------------------------------------------------------
# reading files


def _read_delimited(path: Path) -> list[dict[str, Any]]:
    tsv = path.suffix.lower() in (".tsv", ".txt")
    with open(path, newline="", encoding="utf-8-sig") as handle:  # Excel's "CSV UTF-8" mark
        if tsv:
            reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        else:
            reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(f"{path}: empty file, expected a header row") from None
        except csv.Error as exc:
            raise DataError(f"{path}: cannot parse ({exc})") from None
        width = len(header)
        rows = []
        try:
            for fields in reader:
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue
                if len(fields) != width:
                    raise DataError(
                        f"{path}:{reader.line_num}: {len(fields)} fields where the header has "
                        f"{width} ({'tab' if tsv else 'comma'}-separated"
                        f"{', no quoting' if tsv else ''})"
                    )
                rows.append(dict(zip(header, fields, strict=True)))
        except csv.Error as exc:
            raise DataError(f"{path}:{reader.line_num}: cannot parse ({exc})") from None
    return rows


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl/.json/.csv/.tsv/.txt`` file as dicts (TSV/TXT: tabs, no quoting)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file {p} not found")
    if p.suffix.lower() not in _FILE_SUFFIXES + (".txt",):
        raise DataError(f"{p}: unsupported file type {p.suffix!r}; use .jsonl, .json, .csv or .tsv")
    try:
        if p.suffix.lower() in (".jsonl", ".json"):
            return read_json_rows(p)
        return _read_delimited(p)
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text ({exc.reason})") from None


@functools.lru_cache(maxsize=16)
def _file_dataset_cached(path: str, _mtime_ns: int, _size: int, task: str | None) -> PairDataset:
    return dataset_from_rows("file", read_rows(path), task=task, source=path)


def load_file(
    path: str | os.PathLike[str], task: str | None = None, name: str | None = None
) -> PairDataset:
    """A :class:`PairDataset` from a local file (parsed once per path, mtime and size; each call
    returns a fresh copy)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError:
        raise DataError(f"data file {p} not found") from None
    if not p.is_file():
        raise DataError(f"data file {p} is not a file")
    cached = _file_dataset_cached(str(p.resolve()), st.st_mtime_ns, st.st_size, task)
    return cached.copy(name=name or p.stem)


# --------------------------------------------------------------------------------------------
# rows -> PairDataset

#: An int label, also as pandas writes one once its column had a NaN ("1.0").
_INT_RE = re.compile(r"^([+-]?\d+)(\.0*)?$")


def _parse_label(raw: Any) -> int | str:
    if isinstance(raw, bool):
        return int(raw)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        s = raw.strip()
        whole = _INT_RE.match(s)
        if whole:
            return int(whole.group(1))
        return s.lower().replace("-", "_").replace(" ", "_")
    raise DataError(f"label {raw!r} is neither an int nor a label name")


def _choose_scheme(
    name: str, parsed: list[int | str], task: str | None, col_task: str | None, hans_like: bool
) -> str:
    names = {p for p in parsed if isinstance(p, str)}
    ints = {p for p in parsed if isinstance(p, int)}
    unknown = sorted(n for n in names if n not in _LABEL_NAMES)
    if unknown:
        raise DataError(
            f"{name}: unknown label name {unknown[0]!r}; labels must be ints or one of "
            f"{', '.join(sorted(_LABEL_NAMES))}"
        )
    if any(i < 0 for i in ints):
        raise DataError(
            f"{name}: label {min(ints)} found: rows without a gold label cannot be used"
        )
    name_schemes = {_LABEL_NAMES[n][0] for n in names}
    if {"mnli", "hans"} <= name_schemes:
        raise DataError(f"{name}: labels mix 3-way MNLI names with 'non-entailment'")
    nli_names = name_schemes & {"nli", "mnli", "hans"}
    pair_names = name_schemes & {"qqp", "paws"}
    if nli_names and pair_names:
        raise DataError(f"{name}: labels mix NLI names with paraphrase/duplicate names")
    if task is None:
        if nli_names:
            task = "mnli"
        elif pair_names:
            task = "qqp"
        elif col_task is not None:
            task = col_task
        elif ints and max(ints) == 2:
            task = "mnli"
        else:
            raise DataError(
                f"{name}: cannot tell the task from sentence1/sentence2 columns with labels "
                f"{sorted(ints)}; pass task='mnli' or task='qqp'"
            )
    elif task not in TASK_NUM_LABELS:
        raise DataError(f"{name}: unknown task {task!r}; expected 'mnli' or 'qqp'")
    if task == "mnli":
        if pair_names:
            raise DataError(f"{name}: task 'mnli' but the labels are paraphrase/duplicate names")
        if "hans" in name_schemes or (hans_like and not names and ints <= {0, 1}):
            scheme = "hans"
        else:
            scheme = "mnli"
    else:
        if nli_names:
            raise DataError(f"{name}: task 'qqp' but the labels are NLI names")
        scheme = "paws" if "paws" in name_schemes else "qqp"
    limit = len(_SCHEMES[scheme][1])
    if ints and max(ints) >= limit:
        raise DataError(f"{name}: label {max(ints)} outside 0..{limit - 1} for {scheme} labels")
    return scheme


def _maybe_int(values: list[Any]) -> list[Any]:
    if all(isinstance(v, str) and _INT_RE.match(v.strip()) for v in values):
        return [int(_INT_RE.match(v.strip()).group(1)) for v in values]
    return values


def dataset_from_rows(
    name: str, rows: Sequence[dict[str, Any]], task: str | None = None, source: str | None = None
) -> PairDataset:
    """Build a :class:`PairDataset` from row dicts with the columns the module doc lists."""
    source = source or name
    if not rows:
        raise DataError(f"{source}: no rows")
    columns = list(rows[0].keys())
    text_cols = next((c for c in _TEXT_COLUMNS if c[0] in columns and c[1] in columns), None)
    label_col = next((c for c in _LABEL_COLUMNS if c in columns), None)
    if text_cols is None or label_col is None:
        raise DataError(
            f"{source}: columns {columns} lack a text pair and a label; expected premise, "
            f"hypothesis, label (MNLI-like), question1, question2, label (QQP-like) or "
            f"sentence1, sentence2, label"
        )
    col_a, col_b = text_cols
    col_task = {"premise": "mnli", "question1": "qqp"}.get(col_a)
    text_a, text_b, parsed, kept = [], [], [], []
    for i, row in enumerate(rows):
        try:
            a, b, y = row[col_a], row[col_b], row[label_col]
        except KeyError as exc:
            raise DataError(f"{source}: row {i + 1} lacks column {exc.args[0]!r}") from None
        if not isinstance(a, str) or not isinstance(b, str):
            raise DataError(f"{source}: row {i + 1}: {col_a}/{col_b} must be strings")
        if isinstance(y, str) and y.strip() == "-":  # MultiNLI's pairs without a gold label
            continue
        kept.append(row)
        try:
            parsed.append(_parse_label(y))
        except DataError as exc:
            raise DataError(f"{source}: row {i + 1}: {exc}") from None
        text_a.append(a)
        text_b.append(b)
    if len(kept) < len(rows):
        logger.warning(
            "%s: %d rows without a gold label ('-') left out, as GLUE leaves them out",
            source,
            len(rows) - len(kept),
        )
    if not kept:
        raise DataError(f"{source}: no row has a gold label")
    rows = kept
    hans_like = "heuristic" in columns or "subcase" in columns
    scheme = _choose_scheme(source, parsed, task, col_task, hans_like)
    model_task, label_names, prediction_map = _SCHEMES[scheme]
    labels = [p if isinstance(p, int) else _LABEL_NAMES[p][1] for p in parsed]
    meta: dict[str, list[Any]] = {}
    for col in _META_COLUMNS:
        if col in columns:
            values = [row.get(col) for row in rows]
            meta[col] = _maybe_int(values) if col in ("idx", "id") else values
    return PairDataset(
        name=name,
        task=model_task,
        text_a=text_a,
        text_b=text_b,
        labels=labels,
        num_labels=len(label_names),
        label_names=list(label_names),
        prediction_map=list(prediction_map),
        meta=meta,
    )


# --------------------------------------------------------------------------------------------
# specs


def _canonical(spec: str) -> tuple[str, str | None]:
    """(family, selector) for a registry spec, or raise KeyError."""
    s = spec.strip()
    family, _, sel = s.partition(":")
    family = family.lower()
    if family == "paws-qqp":  # spelt as in the paper
        family = "paws_qqp"
    if family in _GLUE_SPLITS:
        split = sel.lower()
        if split in _GLUE_SPLITS[family]:
            return family, split
        raise KeyError(spec)
    if family == "hans":
        if not sel:
            return "hans", None
        if sel in HANS_SUBCASES or sel in HANS_HEURISTICS:
            return "hans", sel
        lower = {x.lower(): x for x in HANS_SUBCASES + HANS_HEURISTICS}
        if sel.lower() in lower:
            return "hans", lower[sel.lower()]
        if _short(sel) in _HANS_SHORT:
            return "hans", _HANS_SHORT[_short(sel)]
        raise KeyError(spec)
    if family == "paws_qqp":
        if not sel:
            return "paws_qqp", None
        if sel.lower() in ("adv", "dev_and_test"):
            return "paws_qqp", sel.lower()
    raise KeyError(spec)


def _unknown_spec(spec: str) -> DataError:
    return DataError(
        f"unknown data spec {spec!r}; valid specs: {', '.join(available_specs('pairs'))}, "
        f"or a path to a .jsonl/.json/.csv/.tsv file"
    )


def display_name(name: str) -> str:
    """A data set's one name in reports and figures, as the paper writes it, however it was
    spelt: ``hans:ln_subject/object_swap`` and ``hans:so_swap`` -> ``SO-Swap``."""
    canonical = canonical_spec(name)
    return _PAPER_NAMES.get(canonical, canonical)


def canonical_spec(spec: str) -> str:
    """A registry spec in its one spelling (``hans:so_swap`` and ``HANS:SO-Swap`` ->
    ``hans:ln_subject/object_swap``, the name its data set carries); anything else unchanged."""
    try:
        family, sel = _canonical(spec)
    except KeyError:
        return spec
    return family if sel is None else f"{family}:{sel}"


def check_pair_spec(spec: str | os.PathLike[str]) -> None:
    """Refuse a spec that names no sentence-pair data set, before anything loads (so that a typo
    fails before the model has loaded, not after): a registry name (its file is looked for when it
    loads), or a local file that exists. Raises :class:`DataError` as :func:`load_pairs` does."""
    text = os.fspath(spec) if isinstance(spec, os.PathLike) else spec
    if not isinstance(text, str) or not text.strip():
        raise _unknown_spec(str(spec))
    try:
        _canonical(text)
    except KeyError:
        path = Path(text).expanduser()
        if path.suffix.lower() in _FILE_SUFFIXES and not path.exists():
            raise DataError(f"data file {path} not found") from None
        if not path.exists():
            raise _unknown_spec(text) from None


def _check_max(max_examples: int | None) -> None:
    if max_examples is not None and (
        not isinstance(max_examples, int) or isinstance(max_examples, bool) or max_examples < 0
    ):
        raise DataError(f"max_examples must be a non-negative int, not {max_examples!r}")


def _check_task(name: str, got: str, task: str | None) -> None:
    if task is not None and task != got:
        raise DataError(f"{name} is {got} data, but task={task!r} was asked for")


def load_pairs(
    spec: str,
    data_dir: str | os.PathLike[str] | None = None,
    max_examples: int | None = None,
    task: str | None = None,
) -> PairDataset:
    """Load a sentence-pair data set by spec (see the module doc) as a :class:`PairDataset`.

    Files are read from ``data_dir`` (else ``$MI_CORE_DATA_DIR``); MNLI, QQP and HANS fall back to
    the hub when online. ``max_examples`` keeps the first rows (after any subcase filter; a
    HANS set of several subcases takes its rows from every subcase in turn, since HANS's rows
    come subcase by subcase: its first 1,000 are one subcase, all non-entailment);
    ``task`` forces the model task (needed only for ambiguous local files).
    """
    _check_max(max_examples)
    if task is not None and task not in TASK_NUM_LABELS:
        raise DataError(f"unknown task {task!r}; expected 'mnli' or 'qqp'")
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise _unknown_spec(str(spec))
    try:
        family, sel = _canonical(spec)
    except KeyError:
        path = Path(spec).expanduser()
        if path.suffix.lower() in _FILE_SUFFIXES or path.is_file():
            ds = load_file(path, task=task)
            return ds.spread(max_examples) if max_examples is not None else ds
        raise _unknown_spec(spec) from None

    root = resolve_data_dir(data_dir)
    if family in _GLUE_SPLITS:
        ds = _load_glue(family, sel, root, max_examples)
    elif family == "hans":
        ds = _load_hans(sel, root)
    else:
        ds = _load_paws(sel, root)
    _check_task(ds.name, ds.task, task)
    # the first rows, or of several HANS subcases each in turn (spread is head otherwise)
    return ds.spread(max_examples) if max_examples is not None else ds


def _load_glue(family: str, split: str, root: Path | None, max_examples: int | None) -> PairDataset:
    name = f"{family}:{split}"
    rel = f"{family}/{split}.jsonl"
    path = local_file(name, rel, root)
    if path is not None:
        ds = load_file(path, name=name)
    else:
        cols = "premise, hypothesis, label" if family == "mnli" else "question1, question2, label"
        if (family, split) in _LOCAL_ONLY:
            raise missing_error(
                name,
                rel,
                root,
                f"it is a local split (1,000 MNLI train pairs disjoint from {family}/train.jsonl) "
                f"with no hub copy; write such a sample as JSON lines with {cols}",
                "it has no hub copy",
            )
        hub_split = split if max_examples is None else f"{split}[:{max_examples}]"
        hub = hub_load(
            name,
            rel,
            root,
            ("nyu-mll/glue", family),
            {"split": hub_split},
            f"datasets.load_dataset('nyu-mll/glue', '{family}', split='{split}')"
            f".to_json('{rel}') (JSON lines with {cols})",
        )
        ds = dataset_from_rows(name, hub_rows(hub), task=family, source=f"nyu-mll/glue {name}")
    _check_task(name, ds.task, family)
    if family == "mnli" and ds.num_labels != 3:
        raise DataError(f"{name}: expected 3-way MNLI labels, got {ds.label_names}")
    return ds


def _load_hans(sel: str | None, root: Path | None) -> PairDataset:
    path = local_file("hans", HANS_FILE, root)
    if path is not None:
        full = load_file(path, task="mnli", name="hans")
    else:
        hub = hub_load(
            "hans",
            HANS_FILE,
            root,
            ("jhu-cogsci/hans",),
            {"split": "validation"},
            "download heuristics_evaluation_set.txt from https://github.com/tommccoy1/hans",
        )
        full = dataset_from_rows("hans", hub_rows(hub), task="mnli", source="jhu-cogsci/hans")
    if full.num_labels != 2 or "subcase" not in full.meta or "heuristic" not in full.meta:
        raise DataError(
            f"{path or 'jhu-cogsci/hans'}: not a HANS file (needs entailment/"
            f"non-entailment labels and heuristic, subcase columns)"
        )
    if sel is None:
        return full
    key = "heuristic" if sel in HANS_HEURISTICS else "subcase"
    keep = [i for i, v in enumerate(full.meta[key]) if v == sel]
    if not keep:
        raise DataError(f"hans:{sel}: no rows with {key} {sel!r} in {path or 'jhu-cogsci/hans'}")
    return full.subset(keep, name=f"hans:{sel}")


def _load_paws(sel: str | None, root: Path | None) -> PairDataset:
    name = "paws_qqp" if sel is None else f"paws_qqp:{sel}"
    path = local_file(name, PAWS_FILE, root)
    if path is None:
        raise missing_error(
            name,
            PAWS_FILE,
            root,
            "build it with the official PAWS scripts (https://github.com/google-research-datasets/"
            "paws, PAWS-QQP needs the QQP source) and place dev_and_test.tsv there",
            "PAWS-QQP has no hub copy",
        )
    full = load_file(path, task="qqp", name="paws_qqp")
    full.label_names = list(PAWS_LABELS)
    full.meta["split"] = ["dev_and_test"] * len(full)
    train_path = local_file(name, PAWS_TRAIN_FILE, root)
    if train_path is not None:
        train = load_file(train_path, task="qqp", name="paws_qqp")
        train.meta["split"] = ["train"] * len(train)
        full = PairDataset(
            name="paws_qqp",
            task=full.task,
            text_a=train.text_a + full.text_a,
            text_b=train.text_b + full.text_b,
            labels=train.labels + full.labels,
            num_labels=full.num_labels,
            label_names=list(PAWS_LABELS),
            prediction_map=list(full.prediction_map),
            meta={k: train.meta.get(k, [None] * len(train)) + v for k, v in full.meta.items()},
        )
    elif str(path) not in _warned_paws:
        _warned_paws.add(str(path))
        logger.warning(
            "PAWS-QQP: only %s found, so %d rows are used; the paper evaluates on train + "
            "dev_and_test (12,663 rows): place the official train.tsv beside it",
            path,
            len(full),
        )
    if sel is None:
        return full
    if sel == "dev_and_test":  # that file alone, with or without train.tsv beside it
        rows = [i for i, split in enumerate(full.meta["split"]) if split == "dev_and_test"]
        return full.subset(rows, name=name)
    return full.subset([i for i, y in enumerate(full.labels) if y == 0], name=name)
