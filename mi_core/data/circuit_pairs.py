"""Clean and corrupted inputs for circuit discovery: indirect-object identification (IOI).

A circuit is found by comparing a clean run with a corrupted one that differs only in what the
task needs. :class:`PromptPairs` holds both, token-aligned (same length per example, padded on
the right), with what the metric reads: the answer token and the distractor at the position
whose logits count (language models), or the label (classifiers).

``ioi`` (Wang et al. 2022): prompts from templates such as "Then, Mary and John went to the
store. John gave a drink to", whose answer is the indirect object (" Mary") and distractor the
subject (" John"). The corrupted prompt keeps the template, place and object and puts three
other names in the name slots (the "ABC" distribution of Wang et al.), so it says nothing about
who the indirect object is. Names come from a fixed list, filtered to those the tokenizer keeps
as one token (with a leading space), so clean and corrupted prompts align token by token.

``hans-pairs:<subcase>`` (NLI classifiers): HANS pairs of one subcase, each with a minimal
counterpart in which the hypothesis is the premise itself (same words in the premise's roles:
for ``ln_subject/object_swap``, "The lawyer saw the doctor ." becomes "The doctor saw the
lawyer ."), kept where both tokenise to the same length. The metric reads the entailment
label's logit against the others: the lexical-overlap heuristic is the model calling both
entailment.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from jaxtyping import Int

from mi_core.errors import DataError
from mi_core.models.text import encode_pairs, pad_token_id

__all__ = [
    "CIRCUIT_DATA",
    "IOI_NAMES",
    "IOI_TEMPLATES",
    "PromptPairs",
    "hans_pairs",
    "ioi_pairs",
    "ioi_prompts",
]

#: Circuit data specs: ``ioi`` (language models), ``hans-pairs:<subcase>`` (NLI classifiers).
CIRCUIT_DATA = ("ioi", "hans-pairs:<subcase>")

IOI_NAMES = (
    "Mary", "John", "Tom", "James", "Dan", "Sid", "Martin", "Amy", "Anna", "Kate", "Alice",
    "Bob", "Paul", "Sarah", "Laura", "Mike", "Emma", "Jack", "Lisa", "Rose", "David", "Peter",
    "Steve", "Jane", "Lucy", "Ben", "Sam", "Tim", "Max", "Joe",
)  # fmt: skip
_PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "station", "park")
_OBJECTS = ("drink", "ring", "kiss", "bone", "basketball", "computer", "necklace", "snack")
#: ``{A}`` is the indirect object (the answer), ``{B}`` the subject, named twice.
IOI_TEMPLATES = (
    "Then, {B} and {A} went to the {PLACE}. {B} gave a {OBJECT} to",
    "Then, {A} and {B} went to the {PLACE}. {B} gave a {OBJECT} to",
    "When {B} and {A} got a {OBJECT} at the {PLACE}, {B} decided to give it to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {B} decided to give it to",
    "After {B} and {A} went to the {PLACE}, {B} gave a {OBJECT} to",
    "After {A} and {B} went to the {PLACE}, {B} gave a {OBJECT} to",
    "While {B} and {A} were working at the {PLACE}, {B} gave a {OBJECT} to",
    "While {A} and {B} were working at the {PLACE}, {B} gave a {OBJECT} to",
    "Friends {B} and {A} found a {OBJECT} at the {PLACE}. {B} gave it to",
    "Friends {A} and {B} found a {OBJECT} at the {PLACE}. {B} gave it to",
)


@dataclass(frozen=True)
class IOIPrompt:
    """One IOI example: the clean and corrupted text, the answer and the distractor name."""

    clean: str
    corrupted: str
    answer: str
    distractor: str


def _single_token_names(tokenizer: Any) -> list[str]:
    if tokenizer is None:
        return list(IOI_NAMES)
    return [
        n for n in IOI_NAMES if len(tokenizer(" " + n, add_special_tokens=False).input_ids) == 1
    ]


def ioi_prompts(
    n: int, seed: int = 0, tokenizer: Any = None, templates: Sequence[str] = IOI_TEMPLATES
) -> list[IOIPrompt]:
    """``n`` IOI prompts (seeded), names restricted to one-token names of ``tokenizer``,
    templates drawn from ``templates`` (all of :data:`IOI_TEMPLATES` by default)."""
    if not templates:
        raise DataError("no IOI templates to draw prompts from")
    if n <= 0:
        raise DataError(f"need a positive number of IOI prompts, not {n}")
    names = _single_token_names(tokenizer)
    if len(names) < 5:
        raise DataError(
            f"the tokenizer keeps only {len(names)} of the IOI names as one token; need 5"
        )
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        template = rng.choice(list(templates))
        place, obj = rng.choice(_PLACES), rng.choice(_OBJECTS)
        a, b, c, d, e = rng.sample(names, 5)
        clean = template.format(A=a, B=b, PLACE=place, OBJECT=obj)
        # ABC: three fresh names; the subject's second mention becomes a third person
        corrupted = template.replace("{B}", "{E}").replace("{E}", "{B}", 1)
        corrupted = corrupted.format(A=c, B=d, E=e, PLACE=place, OBJECT=obj)
        prompts.append(IOIPrompt(clean, corrupted, " " + a, " " + b))
    return prompts


@dataclass(frozen=True)
class PromptPairs:
    """Token-aligned clean and corrupted inputs and what a circuit metric reads.

    ``kind``: ``"lm"`` (a language model: the metric reads ``position``'s logits of ``answer``
    and ``distractor``) or ``"classifier"`` (``answer`` is the label; ``position`` unused).
    """

    clean_ids: Int[torch.Tensor, "batch pos"]
    corrupted_ids: Int[torch.Tensor, "batch pos"]
    attention_mask: Int[torch.Tensor, "batch pos"]
    answer: Int[torch.Tensor, " batch"]
    distractor: Int[torch.Tensor, " batch"]
    position: Int[torch.Tensor, " batch"]
    kind: str = "lm"
    token_type_ids: Int[torch.Tensor, "batch pos"] | None = None
    corrupted_token_type_ids: Int[torch.Tensor, "batch pos"] | None = None

    def __post_init__(self) -> None:
        if self.clean_ids.shape != self.corrupted_ids.shape:
            raise DataError(
                f"clean inputs are {tuple(self.clean_ids.shape)} but corrupted ones "
                f"{tuple(self.corrupted_ids.shape)}; a corrupted set needs the same examples "
                "and lengths"
            )

    def __len__(self) -> int:
        return int(self.clean_ids.shape[0])

    def _inputs(self, ids: torch.Tensor, types: torch.Tensor | None) -> dict[str, torch.Tensor]:
        if self.kind == "lm":  # right padding: a causal model's real tokens never see the pads
            return {"input": ids}
        inputs = {"input_ids": ids, "attention_mask": self.attention_mask}
        if types is not None:
            inputs["token_type_ids"] = types
        return inputs

    @property
    def clean(self) -> dict[str, torch.Tensor]:
        """Keyword arguments of the clean forward."""
        return self._inputs(self.clean_ids, self.token_type_ids)

    @property
    def corrupted(self) -> dict[str, torch.Tensor]:
        """Keyword arguments of the corrupted forward."""
        return self._inputs(self.corrupted_ids, self.corrupted_token_type_ids)

    def _map(self, fn: Any) -> PromptPairs:
        """The same pairs with ``fn`` applied to every tensor."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return PromptPairs(
            **{k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
        )

    def select(self, index: slice | torch.Tensor) -> PromptPairs:
        """The examples at ``index``."""
        return self._map(lambda t: t[index])

    def batches(self, batch_size: int) -> Iterator[PromptPairs]:
        """Consecutive batches of ``batch_size`` examples."""
        for start in range(0, len(self), batch_size):
            yield self.select(slice(start, start + batch_size))

    def split(self, fraction: float = 0.5) -> tuple[PromptPairs, PromptPairs]:
        """The first ``fraction`` of the examples, and the rest (held out)."""
        cut = max(1, min(len(self) - 1, round(len(self) * fraction)))
        return self.select(slice(0, cut)), self.select(slice(cut, None))

    def to(self, device: str | torch.device) -> PromptPairs:
        """The pairs on ``device``."""
        return self._map(lambda t: t.to(device))

    @classmethod
    def from_strings(
        cls,
        tokenizer: Any,
        prompts: Sequence[str],
        answers: Sequence[str],
        corrupted: Sequence[str],
        distractors: Sequence[str] | None = None,
        *,
        prepend_bos: bool = True,
    ) -> PromptPairs:
        """Language-model pairs from text: each clean prompt, the token that should follow it
        (``answers``, one token each, e.g. ``" Mary"``), its corrupted prompt (the same number
        of tokens) and optionally a distractor token (without one, the metric compares the
        answer with the mean of the other logits). ``prepend_bos``: a BOS token first, as
        TransformerLens's ``to_tokens`` puts one. Raises :class:`DataError` naming the first
        example whose lengths or answer do not fit, or the first value that is not a string."""
        if tokenizer is None or not callable(tokenizer):
            raise DataError(
                f"from_strings needs the model's tokenizer (model.tokenizer), not {tokenizer!r}"
            )
        texts = {
            name: _strings(values, name)
            for name, values in (
                ("prompts", prompts),
                ("answers", answers),
                ("corrupted", corrupted),
                ("distractors", distractors),
            )
            if values is not None or name != "distractors"
        }
        prompts, answers, corrupted = texts["prompts"], texts["answers"], texts["corrupted"]
        distractors = texts.get("distractors")
        n = len(prompts)
        for name, values in texts.items():
            if len(values) != n:
                raise DataError(f"{n} prompts but {len(values)} {name}; give one per prompt")
        if n == 0:
            raise DataError("no prompts given")

        def single(text: str, i: int, role: str) -> int:
            return single_token_id(tokenizer, text, f"prompt {i}", role)

        return cls.from_token_ids(
            tokenizer,
            prompts,
            corrupted,
            [single(a, i, "answer") for i, a in enumerate(answers)],
            None if distractors is None else [single(d, i, "distractor")
                                              for i, d in enumerate(distractors)],
            prepend_bos=prepend_bos,
        )  # fmt: skip

    @classmethod
    def from_token_ids(
        cls, tokenizer: Any, prompts: Sequence[str], corrupted: Sequence[str],
        answers: Sequence[int], distractors: Sequence[int] | None = None, *,
        prepend_bos: bool = True,
    ) -> PromptPairs:  # fmt: skip
        """Language-model pairs from prompts and their answer (and distractor) token ids, as a
        benchmark that picks the ids itself gives them (MIB: the first token of the label);
        otherwise as :meth:`from_strings`."""
        n = len(prompts)
        if n == 0:
            raise DataError("no prompts given")
        bos = tokenizer.bos_token_id if prepend_bos else None
        clean_ids = _encode(tokenizer, list(prompts), bos)
        corrupted_ids = _encode(tokenizer, list(corrupted), bos)
        for i, ids in enumerate(clean_ids):
            if len(ids) == (bos is not None):
                raise DataError(
                    f"prompt {i} ({prompts[i]!r}) has no tokens: there is no prompt to read the "
                    "answer after"
                )
        for i, (a, b) in enumerate(zip(clean_ids, corrupted_ids, strict=True)):
            if len(a) != len(b):
                raise DataError(
                    f"prompt {i}: the corrupted prompt has {len(b)} tokens, the clean {len(a)}; "
                    f"a corrupted prompt must align token by token ({prompts[i]!r})"
                )
        width = max(len(ids) for ids in clean_ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

        def padded(rows: list[list[int]]) -> torch.Tensor:
            return torch.tensor([row + [pad] * (width - len(row)) for row in rows])

        lengths = torch.tensor([len(ids) for ids in clean_ids])
        return cls(
            clean_ids=padded(clean_ids),
            corrupted_ids=padded(corrupted_ids),
            attention_mask=(torch.arange(width)[None, :] < lengths[:, None]).long(),
            answer=torch.tensor(list(answers)),
            distractor=torch.tensor(list(distractors) if distractors is not None else [-1] * n),
            position=lengths - 1,
        )


def _strings(values: Any, name: str) -> list[str]:
    """``values`` as a list of strings, or a :class:`DataError` naming the first that is not
    one (a single string is refused: it would be read as one prompt per character)."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise DataError(
            f"{name} must be a list of strings, one per prompt, not {type(values).__name__} "
            f"{values!r:.60}"
        )
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise DataError(f"{name}[{i}] is {type(value).__name__} {value!r:.60}, not a string")
    return list(values)


def single_token_id(tokenizer: Any, text: str, where: str, role: str) -> int:
    """The id of ``text`` (an answer or distractor) when the tokenizer makes it one token;
    otherwise a :class:`DataError` naming ``where`` (``"prompt 3"``) and ``role``."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) != 1:
        raise DataError(
            f"{where}: the {role} {text!r} is {len(ids)} tokens; an answer is read as one token "
            "(a leading space is often part of the token: ' Mary')"
        )
    return int(ids[0])


def _encode(tokenizer: Any, texts: list[str], bos: int | None) -> list[list[int]]:
    encoded = tokenizer(texts, add_special_tokens=False).input_ids
    return [([bos] if bos is not None else []) + ids for ids in encoded]


def ioi_pairs(tokenizer: Any, n: int = 64, seed: int = 0, prepend_bos: bool = True) -> PromptPairs:
    """``n`` tokenised IOI prompts and their corruptions (see the module docstring)."""
    prompts = ioi_prompts(n, seed, tokenizer)
    return PromptPairs.from_strings(
        tokenizer,
        [p.clean for p in prompts],
        [p.answer for p in prompts],
        [p.corrupted for p in prompts],
        [p.distractor for p in prompts],
        prepend_bos=prepend_bos,
    )


def hans_pairs(
    tokenizer: Any,
    subcase: str,
    label_names: list[str],
    n: int = 64,
    data_dir: str | None = None,
    max_length: int = 128,
) -> PromptPairs:
    """HANS pairs of ``subcase`` and their identity counterparts (see the module docstring)."""
    from mi_core.data.pairs import PAIR_SPECS, load_pairs

    subcases = [spec.split(":", 1)[1] for spec in PAIR_SPECS if spec.startswith("hans:")]
    if subcase not in subcases:
        raise DataError(
            f"unknown HANS subcase in hans-pairs:{subcase}; choose hans-pairs:<subcase> with "
            f"one of {', '.join(subcases)}"
        )
    names = [name.lower() for name in label_names]
    if "entailment" not in names:
        raise DataError(
            f"hans-pairs needs an NLI classifier with an entailment label, not {names}; for a "
            "checkpoint with generic names pass mi_core.data.MNLI_LABELS (the order mi_core "
            "fine-tunes MNLI in)"
        )
    dataset = load_pairs(f"hans:{subcase}", data_dir=data_dir)
    # the pairs as the classifier was trained on them (mi_core's one pair encoding)
    clean_ids, clean_types, _ = encode_pairs(tokenizer, dataset.text_a, dataset.text_b, max_length)
    corrupt_ids, corrupt_types, _ = encode_pairs(
        tokenizer, dataset.text_a, dataset.text_a, max_length
    )
    keep = [i for i in range(len(dataset)) if len(clean_ids[i]) == len(corrupt_ids[i])][:n]
    if not keep:
        raise DataError(
            f"hans-pairs:{subcase}: no pair whose identity counterpart has its length; use a "
            "subcase whose hypothesis reorders the premise (ln_subject/object_swap)"
        )
    width = max(len(clean_ids[i]) for i in keep)
    pad = pad_token_id(tokenizer)

    def padded(rows: list[list[int]], value: int) -> torch.Tensor:
        return torch.tensor([row + [value] * (width - len(row)) for row in rows])

    lengths = torch.tensor([len(clean_ids[i]) for i in keep])
    return PromptPairs(
        clean_ids=padded([clean_ids[i] for i in keep], pad),
        corrupted_ids=padded([corrupt_ids[i] for i in keep], pad),
        attention_mask=(torch.arange(width)[None, :] < lengths[:, None]).long(),
        answer=torch.full((len(keep),), names.index("entailment")),
        distractor=torch.full((len(keep),), -1),
        position=torch.zeros(len(keep), dtype=torch.long),
        kind="classifier",
        token_type_ids=padded([clean_types[i] for i in keep], 0),
        corrupted_token_type_ids=padded([corrupt_types[i] for i in keep], 0),
    )
