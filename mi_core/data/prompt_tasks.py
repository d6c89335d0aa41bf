"""Prompt tasks: what a language model is asked, as data (the heuristic-core method on LMs).

A prompt task is a named split of examples, each a prompt, the answer token that should follow
it, optionally a distractor token (the answer's rival: IOI's subject, NLI's other verdict) and
optionally a corrupted counterpart of the prompt (token-aligned, for circuits). A split name
lets a run compare in-domain with out-of-domain, as the paper compares MNLI with HANS.

Specs (:func:`load_prompt_task`):

* ``ioi``, ``ioi:abba``, ``ioi:baba``: indirect-object identification
  (:mod:`mi_core.data.circuit_pairs`), all templates or those whose names come in the order
  A B B (the indirect object named first) or B A B (the subject first): two families of
  templates for an in-domain / out-of-domain split.
* ``nli:<pair spec>``: a sentence-pair data set (``nli:mnli``, ``nli:hans:lexical_overlap``,
  any spec of :func:`~mi_core.data.load_pairs`) rendered with :data:`NLI_TEMPLATE` and the
  verbaliser :data:`NLI_VERBALISER` (``" yes"`` for entailment, ``" no"`` for any other label,
  as HANS is scored two-way), so the paper's own MNLI / HANS split reaches an LM without
  fine-tuning.
* a ``.jsonl`` file: one ``{"prompt", "answer", "distractor"?, "corrupted"?}`` object a line,
  checked line by line with one-line errors.

A language model's training data may also be plain text (``text:wikitext``, ``text:python``,
``text:<path>``: :class:`~mi_core.data.text.TextTask`), pruned against the full model at every
position; :func:`is_prompt_spec` counts it as a language model's data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mi_core.data.circuit_pairs import IOI_TEMPLATES, PromptPairs, ioi_prompts
from mi_core.data.pairs import PairDataset, check_pair_spec, load_pairs
from mi_core.data.text import TextTask, check_text_spec, is_text_spec, load_text_task
from mi_core.errors import DataError
from mi_core.tasks import NEXT_TOKEN

__all__ = [
    "NLI_TEMPLATE",
    "NLI_VERBALISER",
    "PROMPT_TASKS",
    "PromptExample",
    "PromptTask",
    "EVAL_SEED",
    "TRAIN_SEED",
    "TaskData",
    "check_prompt_spec",
    "check_task_specs",
    "load_task_data",
    "is_prompt_spec",
    "load_prompt_task",
    "parse_nli_prompt",
    "render_nli_prompt",
]

#: The seed IOI prompts of a job's training set are drawn from, and that of its eval sets (so
#: an eval set of the training templates holds other prompts than the training set).
TRAIN_SEED, EVAL_SEED = 0, 1

#: The built-in prompt-task specs (besides a ``.jsonl`` file).
PROMPT_TASKS = ("ioi", "ioi:abba", "ioi:baba", "nli:<pair spec>")

#: How a premise / hypothesis pair is put to a language model; the answer follows ``Answer:``.
NLI_TEMPLATE = (
    "Premise: {premise}\nHypothesis: {hypothesis}\nDoes the premise entail the hypothesis? Answer:"
)
#: The answer token of each verdict: entailment, and every other label (neutral, contradiction,
#: HANS's non-entailment).
NLI_VERBALISER = {"entailment": " yes", "other": " no"}

_NLI_PATTERN = re.compile(
    "^" + re.escape(NLI_TEMPLATE).replace(r"\{premise\}", "(?P<premise>.*)")
    .replace(r"\{hypothesis\}", "(?P<hypothesis>.*)") + "$",
    re.DOTALL,
)  # fmt: skip
#: IOI's two template families, by the order the names take (A the indirect object).
_IOI_ORDERS = {"abba": "{A} and {B}", "baba": "{B} and {A}"}


@dataclass(frozen=True)
class PromptExample:
    """One prompt, the answer token that should follow it, and optionally its rival
    (``distractor``) and a token-aligned ``corrupted`` prompt."""

    prompt: str
    answer: str
    distractor: str | None = None
    corrupted: str | None = None


@dataclass(frozen=True)
class PromptTask:
    """A named split of prompt examples (``ioi:abba``, ``nli:hans:lexical_overlap``, a file)."""

    name: str
    examples: tuple[PromptExample, ...]

    def __post_init__(self) -> None:
        if not self.examples:
            raise DataError(f"prompt task {self.name} has no examples")
        kinds = {e.distractor is None for e in self.examples}
        if len(kinds) > 1:
            raise DataError(
                f"prompt task {self.name}: some examples have a distractor and some do not; "
                "give every example one, or none (accuracy is then top-1)"
            )

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def task(self) -> str:
        """The task of the model that scores it: next-token prediction
        (:data:`~mi_core.tasks.NEXT_TOKEN`, a language model whose classes are its vocabulary)."""
        return NEXT_TOKEN

    @property
    def chance_accuracy(self) -> float:
        """The accuracy of a guess: 1/2 with a distractor (the answer's logit above its
        rival's), 0 without (top-1 over a vocabulary)."""
        return 0.5 if self.examples[0].distractor is not None else 0.0

    @property
    def meta(self) -> dict[str, list[Any]]:
        """Per-example identifiers (none: a prompt is its own identifier)."""
        return {}

    def subset(self, indices: Any, name: str | None = None) -> PromptTask:
        """The examples at ``indices`` (ints, in the order given)."""
        picked = [self.examples[int(i)] for i in indices]
        return PromptTask(name or self.name, tuple(picked))

    def head(self, n: int) -> PromptTask:
        """The first ``n`` examples (all of them if there are fewer)."""
        return self.subset(range(min(max(int(n), 0), len(self))))

    def spread(self, n: int, key: str = "subcase") -> PromptTask:
        """The first ``n`` examples (the pair sets' spread over subcases has no counterpart:
        IOI prompts are drawn at random, NLI prompts keep their set's own order)."""
        return self.head(n)

    def selection(self) -> str:
        """``"<n>:<digest>"`` of the examples themselves, as
        :meth:`~mi_core.data.PairDataset.selection`."""
        digest = hashlib.sha256()
        for e in self.examples:
            digest.update(f"{e.prompt}\x1f{e.answer}\x1f{e.distractor}\x1e".encode())
        return f"{len(self)}:{digest.hexdigest()[:16]}"

    def matches(self, recorded: Any) -> bool:
        """Whether a cache's record of a set (its :meth:`selection`) names these examples."""
        return recorded == self.selection()

    @property
    def has_corrupted(self) -> bool:
        """Whether every example has a corrupted prompt (what a circuit needs)."""
        return all(e.corrupted is not None for e in self.examples)

    def to_pairs(self, tokenizer: Any, *, prepend_bos: bool = True) -> PromptPairs:
        """The examples tokenised as :class:`~mi_core.data.PromptPairs` (answer and distractor
        one token each; an example without a corrupted prompt gets its own prompt there, so a
        run that needs no corruption, pruning against the full model, reads it as is)."""
        examples = self.examples
        distractors = None if examples[0].distractor is None else [e.distractor for e in examples]
        return PromptPairs.from_strings(
            tokenizer,
            [e.prompt for e in examples],
            [e.answer for e in examples],
            [e.corrupted if e.corrupted is not None else e.prompt for e in examples],
            distractors,  # type: ignore[arg-type]
            prepend_bos=prepend_bos,
        )


#: A data set of a node-level job: sentence pairs (a classifier's), or a prompt task or plain
#: text (a language model's, :data:`~mi_core.tasks.NEXT_TOKEN`).
TaskData = PairDataset | PromptTask | TextTask


def load_task_data(
    spec: str | os.PathLike[str],
    max_examples: int | None = None,
    *,
    tokenizer: Any = None,
    seed: int = EVAL_SEED,
) -> TaskData:
    """A sentence-pair set, a prompt task or plain text by its spec (:func:`is_prompt_spec`);
    IOI prompts are drawn from ``seed`` (default: an eval set's, :data:`EVAL_SEED`)."""
    if is_text_spec(spec):
        return load_text_task(spec, max_examples, tokenizer=tokenizer)
    if is_prompt_spec(spec):
        return load_prompt_task(spec, max_examples, seed=seed, tokenizer=tokenizer)
    return load_pairs(os.fspath(spec), max_examples=max_examples)


def check_task_specs(specs: Any) -> bool:
    """Check every spec of ``specs`` names data (before a model loads) and that they are all
    sentence pairs or all prompt tasks; return whether they are prompt tasks."""
    specs = [specs] if isinstance(specs, (str, os.PathLike)) else list(specs)
    kinds = {is_prompt_spec(s) for s in specs}
    if len(kinds) > 1:
        raise DataError(
            "data sets must all be sentence pairs (a classifier's) or all prompt tasks (a "
            "language model's: ioi, ioi:abba, nli:<pair spec>, a .jsonl file of prompts)"
        )
    for spec in specs:
        if is_prompt_spec(spec):
            check_prompt_spec(spec)
        else:
            check_pair_spec(spec)
    return kinds == {True}


def render_nli_prompt(premise: str, hypothesis: str) -> str:
    """A premise / hypothesis pair as a prompt (:data:`NLI_TEMPLATE`)."""
    return NLI_TEMPLATE.format(premise=premise, hypothesis=hypothesis)


def parse_nli_prompt(prompt: str) -> tuple[str, str]:
    """The premise and hypothesis a prompt of :func:`render_nli_prompt` was made from."""
    match = _NLI_PATTERN.match(prompt)
    if match is None:
        raise DataError(f"not a prompt of the NLI template: {prompt[:80]!r}")
    return match["premise"], match["hypothesis"]


def _ioi_task(spec: str, n: int, seed: int, tokenizer: Any) -> PromptTask:
    order = spec.partition(":")[2]
    if order and order not in _IOI_ORDERS:
        raise DataError(f"unknown IOI split {spec!r}; expected ioi, ioi:abba or ioi:baba")
    templates = [t for t in IOI_TEMPLATES if not order or _IOI_ORDERS[order] in t]
    prompts = ioi_prompts(n, seed, tokenizer, templates=templates)
    return PromptTask(
        spec,
        tuple(PromptExample(p.clean, p.answer, p.distractor, p.corrupted) for p in prompts),
    )


def _nli_task(spec: str, n: int | None) -> PromptTask:
    pairs = load_pairs(spec.removeprefix("nli:"), max_examples=n)
    yes, no = NLI_VERBALISER["entailment"], NLI_VERBALISER["other"]
    examples = []
    for premise, hypothesis, label in zip(pairs.text_a, pairs.text_b, pairs.labels, strict=True):
        entailed = pairs.label_names[label].lower() == "entailment"
        examples.append(
            PromptExample(
                render_nli_prompt(premise, hypothesis),
                yes if entailed else no,
                no if entailed else yes,
            )  # fmt: skip
        )
    return PromptTask(spec, tuple(examples))


def _jsonl_task(path: Path, n: int | None) -> PromptTask:
    if not path.is_file():
        raise DataError(f"prompt file {path} does not exist")
    examples = []
    allowed = _PROMPT_KEYS
    with path.open(encoding="utf-8-sig") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected an object with prompt and answer")
            missing = [k for k in ("prompt", "answer") if k not in row]
            extra = sorted(set(row) - allowed)
            if missing or extra:
                what = f"lacks {', '.join(missing)}" if missing else f"has unknown {extra}"
                raise DataError(f"{where} {what}; keys are prompt, answer, distractor, corrupted")
            bad = [k for k, v in row.items() if not isinstance(v, str) or not v]
            if bad:
                raise DataError(f"{where}: {bad[0]} must be a non-empty string")
            examples.append(PromptExample(**row))
            if n is not None and len(examples) == n:
                break
    if not examples:
        raise DataError(f"prompt file {path} has no examples")
    return PromptTask(path.stem, tuple(examples))


def is_prompt_spec(spec: str | os.PathLike[str]) -> bool:
    """Whether ``spec`` names a language model's data (a prompt task: ``ioi``, ``ioi:*``,
    ``nli:*``, a ``.jsonl`` file of prompts; or plain text: ``text:*``) rather than a
    sentence-pair set. A ``.jsonl`` file holds either: it is a prompt file when its first
    record has a key of one (``prompt``, ``answer``, ``distractor``, ``corrupted``; a record
    lacking ``prompt`` is then refused as a prompt file's, naming what it lacks)."""
    text = os.fspath(spec)
    if text == "ioi" or text.startswith(("ioi:", "nli:")) or is_text_spec(text):
        return True
    return text.endswith(".jsonl") and _first_record_has_prompt(Path(text).expanduser())


#: The keys of a prompt file's records (a pair file's are premise / hypothesis / label, ...).
_PROMPT_KEYS = {"prompt", "answer", "distractor", "corrupted"}


def _first_record_has_prompt(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8-sig") as lines:
            for line in lines:
                if line.strip():
                    row = json.loads(line)
                    return isinstance(row, dict) and bool(_PROMPT_KEYS & set(row))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False  # the pair loader reports what is wrong with the file
    return False


def check_prompt_spec(spec: str | os.PathLike[str]) -> None:
    """Refuse a prompt-task spec that names nothing (an unknown IOI split, a missing file)
    before any model loads; :func:`load_prompt_task` checks the rest."""
    text = os.fspath(spec)
    if is_text_spec(text):
        check_text_spec(text)
        return
    if text.startswith("ioi:") and text.partition(":")[2] not in _IOI_ORDERS:
        raise DataError(f"unknown IOI split {text!r}; expected ioi, ioi:abba or ioi:baba")
    if text.startswith("nli:"):
        check_pair_spec(text.removeprefix("nli:"))
    elif text.endswith(".jsonl") and not Path(text).expanduser().is_file():
        raise DataError(f"prompt file {text} does not exist")


def load_prompt_task(
    spec: str | os.PathLike[str],
    n: int | None = None,
    *,
    seed: int = 0,
    tokenizer: Any = None,
) -> PromptTask:
    """The prompt task of ``spec`` (see the module docstring): ``n`` examples (IOI: generated
    with ``seed``, names restricted to one-token names of ``tokenizer``; NLI and files: the
    first ``n``, all when None)."""
    if n is not None and n <= 0:
        raise DataError(f"need a positive number of examples, not {n}")
    text = os.fspath(spec)
    if text == "ioi" or text.startswith("ioi:"):
        return _ioi_task(text, 64 if n is None else n, seed, tokenizer)
    if text.startswith("nli:"):
        return _nli_task(text, n)
    if text.endswith(".jsonl"):
        return _jsonl_task(Path(text).expanduser(), n)
    raise DataError(
        f"unknown prompt task {text!r}; expected one of {list(PROMPT_TASKS)} or a .jsonl file"
    )
