"""MIB's circuit-localisation tasks (Mueller et al. 2025), read and filtered as MIB reads them.

Specs ``mib:<task>[:<split>]`` (circuit data: ``mi-core circuit --data mib:ioi``), ``task`` one
of :data:`MIB_TASKS` and ``split`` one of MIB's (``train``, ``validation``, the default, or
``test``) or ``generated``. The rows come from, in turn:

1. a local copy: ``$MI_CORE_MIB_DIR/<hub name>/<split>.jsonl``, one row a line as the hub
   dataset holds it (what ``datasets.load_dataset("mib-bench/ioi", split=...).to_json(path)``
   writes);
2. the hub dataset MIB publishes (``mib-bench/<hub name>``; MCQA's ``4_answer_choices``);
3. with ``generated``, for the tasks made from templates (:data:`GENERATED_TASKS`: IOI,
   arithmetic, the MCQA colour questions): rows in the hub's schema drawn offline from
   mi_core's own templates (seeded; the prompts' wording is mi_core's, not MIB's: arithmetic
   asks ``a+b=`` after :data:`ARITHMETIC_SHOTS` solved problems, the same in both prompts).

Each row then goes through MIB's own code path, ported from its ``HFEAPDataset``
(``MIB_circuit_track/dataset.py``): its filter (IOI: the indirect object, the subject and the
third name of as many tokens; MCQA / ARC: the answer's label and the counterfactual's of as
many tokens; arithmetic: both labels one token, the operator the task's) and its example (the
clean prompt, the counterfactual prompt, the answer's and the counterfactual answer's first
token id), tested equal to MIB's on the same rows. mi_core patches token by token, so a pair
whose prompts differ in length (which MIB pads apart) is left out too, and counted.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mi_core.data._sources import read_json_rows
from mi_core.errors import DataError

if TYPE_CHECKING:
    from mi_core.data.circuit_pairs import PromptPairs

__all__ = [
    "GENERATED",
    "GENERATED_TASKS",
    "MIB_SPLITS",
    "MIB_TASKS",
    "check_mib_spec",
    "generate_mib_rows",
    "is_mib_spec",
    "mib_examples",
    "mib_pairs",
    "mib_rows",
    "parse_mib_spec",
]

logger = logging.getLogger(__name__)

#: MIB's tasks and their hub datasets' names (``mib-bench/<name>``; MIB's
#: ``TASKS_TO_HF_NAMES``).
MIB_TASKS = {
    "ioi": "ioi",
    "mcqa": "copycolors_mcqa",
    "arithmetic_addition": "arithmetic_addition",
    "arithmetic_subtraction": "arithmetic_subtraction",
    "arc_easy": "arc_easy",
    "arc_challenge": "arc_challenge",
}
MIB_HUB = "mib-bench"
MIB_SPLITS = ("train", "validation", "test")
#: The split name of rows generated offline.
GENERATED = "generated"
#: The tasks made from templates, which mi_core also generates offline.
GENERATED_TASKS = ("ioi", "mcqa", "arithmetic_addition", "arithmetic_subtraction")
#: The local copies' folder (``<folder>/<hub name>/<split>.jsonl``).
MIB_DIR_VARIABLE = "MI_CORE_MIB_DIR"

#: Each task's counterfactual column (MIB's defaults).
COUNTERFACTUALS = {
    "ioi": "s2_io_flip_counterfactual",
    "mcqa": "symbol_counterfactual",
    "arc_easy": "symbol_counterfactual",
    "arc_challenge": "symbol_counterfactual",
    "arithmetic_addition": "random_counterfactual",
    "arithmetic_subtraction": "random_counterfactual",
}


def is_mib_spec(spec: str | os.PathLike[str]) -> bool:
    """Whether ``spec`` names an MIB task (``mib:...``)."""
    return os.fspath(spec).startswith("mib:")


def parse_mib_spec(spec: str) -> tuple[str, str]:
    """``(task, split)`` of ``mib:<task>[:<split>]`` (split default ``validation``), refused in
    one line when either is not MIB's (or ``generated`` for a task with no templates)."""
    _, _, rest = spec.partition(":")
    task, _, split = rest.partition(":")
    split = split or "validation"
    if task not in MIB_TASKS:
        raise DataError(f"unknown MIB task {task!r} in {spec!r}; expected one of {list(MIB_TASKS)}")
    if split == GENERATED and task not in GENERATED_TASKS:
        raise DataError(
            f"{task} is not made from templates, so it is not generated offline (tasks that "
            f"are: {', '.join(GENERATED_TASKS)}); read it from the hub or a local copy"
        )
    if split not in (*MIB_SPLITS, GENERATED):
        raise DataError(
            f"unknown MIB split {split!r} in {spec!r}; expected one of {[*MIB_SPLITS, GENERATED]}"
        )
    return task, split


def check_mib_spec(spec: str) -> None:
    """Refuse a spec that names no MIB task or split, before any model loads."""
    parse_mib_spec(spec)


def mib_rows(task: str, split: str, n: int = 64, seed: int = 0) -> list[dict[str, Any]]:
    """The rows of ``task``'s ``split``: a local copy, else the hub (module docstring), or
    ``n`` generated rows with ``seed`` (``split`` ``generated``)."""
    if split == GENERATED:
        return generate_mib_rows(task, n, seed)
    name = MIB_TASKS[task]
    folder = os.environ.get(MIB_DIR_VARIABLE)
    if folder:
        path = Path(folder).expanduser() / name / f"{split}.jsonl"
        if path.is_file():
            rows = read_json_rows(path)
            if not rows:
                raise DataError(f"{path} has no rows")
            return rows
    try:
        import datasets

        config = "4_answer_choices" if task == "mcqa" else None
        rows = datasets.load_dataset(f"{MIB_HUB}/{name}", config, split=split)
    except Exception as exc:  # the hub's errors are many (offline, gated, missing split)
        where = f"${MIB_DIR_VARIABLE}/{name}/{split}.jsonl"
        generated = f"; or mib:{task}:{GENERATED} offline" if task in GENERATED_TASKS else ""
        raise DataError(
            f"MIB task {task} ({split}) could not be read from the hub {MIB_HUB}/{name} "
            f"({type(exc).__name__}) and no local copy is at {where}{generated}"
        ) from None
    return [dict(row) for row in rows]


def _n_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def _first_token(tokenizer: Any, text: str) -> int:
    return tokenizer(text, add_special_tokens=False).input_ids[0]


def _label(column: dict[str, Any]) -> str:
    """An MCQA / ARC column's answer label (MIB: ``choices.label[answerKey]``)."""
    return str(column["choices"]["label"][column["answerKey"]])


def _keeps(task: str, tokenizer: Any, counterfactual: str) -> Callable[[dict[str, Any]], bool]:
    """MIB's filter of ``task``'s rows (``HFEAPDataset.filter_dataset``)."""
    if task == "ioi":

        def ioi(x: dict[str, Any]) -> bool:
            meta = x["metadata"]
            n = _n_tokens(tokenizer, f" {meta['indirect_object']}")
            subject, third = (_n_tokens(tokenizer, f" {meta[k]}") for k in ("subject", "random_c"))
            return n == subject and n == third

        return ioi
    if task == "mcqa" or task.startswith("arc"):
        return lambda x: (
            _n_tokens(tokenizer, _label(x)) == _n_tokens(tokenizer, _label(x[counterfactual]))
        )
    operator = "-" if "subtraction" in task else "+"

    def arithmetic(x: dict[str, Any]) -> bool:
        other = x.get(counterfactual)
        return (
            _n_tokens(tokenizer, str(x["label"])) == 1
            and other is not None
            and other.get("prompt") is not None
            and x["operator"] == operator
            and _n_tokens(tokenizer, str(other["label"])) == 1
        )

    return arithmetic


def _example(
    task: str, row: dict[str, Any], tokenizer: Any, counterfactual: str
) -> tuple[str, str, list[int]]:
    """MIB's example of a row (``HFEAPDataset.__getitem__``, without its control answers):
    the clean prompt, the counterfactual prompt, and the answer's and the counterfactual
    answer's first token ids."""
    if task == "ioi":
        meta = row["metadata"]
        answers = [_first_token(tokenizer, f" {meta[k]}") for k in ("indirect_object", "subject")]
        return row["prompt"], row[counterfactual]["prompt"], answers
    if task == "mcqa" or task.startswith("arc"):
        other = row[counterfactual]
        answers = [_first_token(tokenizer, _label(row)), _first_token(tokenizer, _label(other))]
        return row["prompt"], other["prompt"], answers
    other = row[counterfactual]
    answers = [
        _first_token(tokenizer, str(row["label"])),
        _first_token(tokenizer, str(other["label"])),
    ]
    return row["prompt"], other["prompt"], answers


def mib_examples(
    task: str, rows: Sequence[dict[str, Any]], tokenizer: Any, counterfactual: str | None = None
) -> list[tuple[str, str, list[int]]]:
    """The examples MIB makes of ``rows`` (its filter, then its examples, in order);
    ``counterfactual``: the column (default MIB's, :data:`COUNTERFACTUALS`)."""
    column = counterfactual or COUNTERFACTUALS[task]
    keep = _keeps(task, tokenizer, column)
    try:
        return [_example(task, row, tokenizer, column) for row in rows if keep(row)]
    except (KeyError, TypeError, IndexError) as exc:
        raise DataError(
            f"a row of MIB task {task} lacks what MIB reads ({type(exc).__name__}: {exc}); "
            "is it the hub dataset's schema?"
        ) from None


def mib_pairs(
    spec: str,
    tokenizer: Any,
    n: int | None = None,
    *,
    seed: int = 0,
    counterfactual: str | None = None,
    prepend_bos: bool = True,
) -> PromptPairs:
    """The first ``n`` pairs of the MIB task ``spec`` (all when None) that MIB keeps and that
    align token by token, as :class:`PromptPairs` (the answer and distractor ids MIB's);
    ``seed``: the generated rows' (``mib:<task>:generated``)."""
    from mi_core.data.circuit_pairs import PromptPairs  # torch: not for parsing a spec

    task, split = parse_mib_spec(spec)
    want = n if n is not None else 256
    rows = mib_rows(task, split, max(4 * want, 64) if split == GENERATED else want, seed)
    examples = mib_examples(task, rows, tokenizer, counterfactual)
    aligned = [
        e for e in examples if _n_tokens(tokenizer, e[0]) == _n_tokens(tokenizer, e[1])
    ]  # fmt: skip
    dropped = len(examples) - len(aligned)
    if dropped:
        logger.info("%s: %d of %d pairs differ in length and are left out", spec, dropped,
                    len(examples))  # fmt: skip
    if n is not None:
        aligned = aligned[:n]
    if not aligned:
        raise DataError(
            f"{spec}: none of {len(rows)} rows is kept (MIB's filter kept {len(examples)}, "
            f"{dropped} of them of unequal lengths) for this tokenizer"
        )
    return PromptPairs.from_token_ids(
        tokenizer,
        [e[0] for e in aligned],
        [e[1] for e in aligned],
        [e[2][0] for e in aligned],
        [e[2][1] for e in aligned],
        prepend_bos=prepend_bos,
    )


# ----------------------------------------------------------------------------- generators
_COLOURS = ("red", "blue", "green", "yellow", "black", "white", "brown", "purple")
_THINGS = ("apple", "car", "ball", "house", "shirt", "cup", "bird", "book", "door", "hat")
_LETTERS = ("A", "B", "C", "D")


def generate_mib_rows(task: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows of ``task`` in its hub dataset's schema, drawn from mi_core's templates with
    ``seed`` (the columns MIB reads, filled as MIB's counterfactuals are meant: IOI's
    ``s2_io_flip_counterfactual`` names the indirect object where the subject was named a second
    time, so the answer flips; MCQA's ``symbol_counterfactual`` gives the choices other
    letters; arithmetic's ``random_counterfactual`` is another problem)."""
    if task not in GENERATED_TASKS:
        raise DataError(f"{task} is not generated offline; tasks that are: {GENERATED_TASKS}")
    if n <= 0:
        raise DataError(f"need a positive number of rows, not {n}")
    rng = random.Random(f"mib:{task}:{seed}")
    make = {"ioi": _ioi_row, "mcqa": _mcqa_row}.get(task)
    if make is None:
        operator = "-" if "subtraction" in task else "+"
        return [_arithmetic_row(rng, operator) for _ in range(n)]
    return [make(rng) for _ in range(n)]


def _ioi_row(rng: random.Random) -> dict[str, Any]:
    from mi_core.data.circuit_pairs import IOI_NAMES, IOI_TEMPLATES

    template = rng.choice(IOI_TEMPLATES)
    place, obj = rng.choice(("store", "park", "school", "office")), rng.choice(("drink", "ring"))
    io, subject, third = rng.sample(IOI_NAMES, 3)
    first, _, second = template.rpartition("{B}")
    flipped = first + "{A}" + second  # the subject's second mention names the indirect object
    values = {"A": io, "B": subject, "PLACE": place, "OBJECT": obj}
    return {
        "prompt": template.format(**values),
        "metadata": {"indirect_object": io, "subject": subject, "random_c": third},
        "s2_io_flip_counterfactual": {"prompt": flipped.format(**values)},
    }


def _mcqa_column(thing: str, colour: str, texts: Sequence[str], labels: Sequence[str]) -> dict:
    lines = "\n".join(f"{label}. {text}" for label, text in zip(labels, texts, strict=True))
    prompt = f"The {thing} is {colour}. What color is the {thing}?\n{lines}\nAnswer:"
    return {"prompt": prompt, "choices": {"label": list(labels), "text": list(texts)},
            "answerKey": texts.index(colour)}  # fmt: skip


def _mcqa_row(rng: random.Random) -> dict[str, Any]:
    thing = rng.choice(_THINGS)
    texts = rng.sample(_COLOURS, len(_LETTERS))
    colour = rng.choice(texts)
    shift = rng.randrange(1, len(_LETTERS))  # the same texts under other letters
    others = _LETTERS[shift:] + _LETTERS[:shift]
    row = _mcqa_column(thing, colour, texts, _LETTERS)
    row["symbol_counterfactual"] = _mcqa_column(thing, colour, texts, others)
    return row


def _arithmetic_problem(rng: random.Random, operator: str) -> tuple[str, int]:
    a, b = rng.randrange(0, 10), rng.randrange(0, 10)
    if operator == "-" and b > a:
        a, b = b, a
    return f"{a}{operator}{b}=", a + b if operator == "+" else a - b


#: Solved problems before the one asked (the same ones in the counterfactual prompt): a small
#: model answers single-digit sums far more often after a few (ARITHMETIC_SHOTS, measured in
#: docs/circuits.md).
ARITHMETIC_SHOTS = 3


def _arithmetic_row(rng: random.Random, operator: str) -> dict[str, Any]:
    shots = ""
    for _ in range(ARITHMETIC_SHOTS):
        problem, answer = _arithmetic_problem(rng, operator)
        shots += f"{problem}{answer}\n"
    prompt, label = _arithmetic_problem(rng, operator)
    other, other_label = _arithmetic_problem(rng, operator)
    return {"prompt": shots + prompt, "label": label, "operator": operator,
            "random_counterfactual": {"prompt": shots + other, "label": other_label}}  # fmt: skip
