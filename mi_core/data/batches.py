"""Tokenised sentence-pair batches: tokenise once, then collate with dynamic padding.

* Tokenizers with a sep token (BERT, RoBERTa, ...) use their own sentence-pair template
  (``[CLS] a [SEP] b [SEP]``, ``<s> a </s></s> b </s>``) and, where the model has them, token type
  ids. Tokenizers without a sep token (GPT-2 and other causal LMs) get ``a + eos + b`` with zero
  token types, and their pad token is eos when they have none.
* Pairs longer than ``max_length`` are truncated ``"longest_first"`` (the longer side loses tokens
  first); how many were truncated is logged once per call as a warning and kept in
  :attr:`TokenizedPairs.n_truncated`.
* Batches pad to the longest example in the batch, on the right; ``sort_by_length=True`` groups
  examples of similar length (fast evaluation) and ``batch["index"]`` maps rows back to the
  data set. Shuffled and grouped by length, batches come from :func:`length_grouped_batches`,
  the one length-grouped batcher of fine-tuning and pruning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Float

from mi_core.data.circuit_pairs import single_token_id
from mi_core.data.pairs import PairDataset
from mi_core.data.prompt_tasks import PromptTask
from mi_core.data.text import TextTask
from mi_core.errors import DataError
from mi_core.models.text import encode_pairs, encode_prompts, pad_token_id
from mi_core.seeding import derive_seed

logger = logging.getLogger(__name__)


@dataclass
class TokenizedPairs:
    """Per-example token ids of a :class:`PairDataset` (unpadded). Not changed after it is made:
    :meth:`collate` packs the tokens once (a changed copy is made with ``dataclasses.replace``)."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: list[int]
    max_length: int
    pad_token_id: int
    n_truncated: int
    truncated: list[int]
    name: str = ""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> list[int]:
        """Number of tokens of each example."""
        return [len(ids) for ids in self.input_ids]

    def collate(self, indices: Sequence[int] | torch.Tensor) -> dict[str, torch.Tensor]:
        """One right-padded batch of the examples at ``indices``, as wide as its longest one."""
        flat_ids, flat_types, offsets, lengths, labels = self._packed_arrays()
        if isinstance(indices, torch.Tensor):
            idx = indices.detach().cpu().numpy().astype(np.int64).reshape(-1)
        else:
            idx = np.fromiter((int(i) for i in indices), dtype=np.int64)
        n = len(self.input_ids)
        if len(idx) and (idx.max() >= n or idx.min() < -n):
            bad = int(idx[(idx >= n) | (idx < -n)][0])
            raise IndexError(f"example {bad} of {self.name or 'pairs'}: it has {n} examples")
        rows = lengths[idx]
        width = int(rows.max()) if len(idx) else 0
        # one gather for the whole batch: a batched group collates 100+ rows a step, and padding
        # them row by row in Python is a visible share of a GPU step (benchmarks/README.md, GPU
        # results, ``bench_sweep.py --device cuda --executors batched --profile``)
        keep = np.arange(width)[None, :] < rows[:, None]
        at = np.where(keep, offsets[idx][:, None] + np.arange(width)[None, :], 0)
        if len(flat_ids):
            input_ids = np.where(keep, flat_ids[at], self.pad_token_id)
            token_type_ids = np.where(keep, flat_types[at], 0)
        else:  # no tokens at all
            input_ids = np.full(keep.shape, self.pad_token_id, dtype=np.int64)
            token_type_ids = np.zeros(keep.shape, dtype=np.int64)
        return {
            "input_ids": torch.from_numpy(input_ids.astype(np.int64, copy=False)),
            "attention_mask": torch.from_numpy(keep.astype(np.int64)),
            "token_type_ids": torch.from_numpy(token_type_ids.astype(np.int64, copy=False)),
            "labels": torch.from_numpy(labels[idx]),
            "index": torch.from_numpy(idx),
        }

    _packed: tuple[np.ndarray, ...] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def _packed_arrays(self) -> tuple[np.ndarray, ...]:
        """Every example's tokens end to end (built once; a TokenizedPairs is not changed after
        it is made): token ids, token types, each example's offset and length, and labels."""
        if self._packed is None or len(self._packed[3]) != len(self.input_ids):
            lengths = np.fromiter(map(len, self.input_ids), dtype=np.int64, count=len(self))
            offsets = np.zeros(len(lengths), dtype=np.int64)
            np.cumsum(lengths[:-1], out=offsets[1:])
            total = int(lengths.sum())
            flat_ids = np.fromiter(
                (t for ids in self.input_ids for t in ids), dtype=np.int64, count=total
            )
            flat_types = np.fromiter(
                (t for types in self.token_type_ids for t in types), dtype=np.int64, count=total
            )
            labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
            self._packed = (flat_ids, flat_types, offsets, lengths, labels)
        return self._packed


@dataclass
class TokenizedPrompts(TokenizedPairs):
    """Per-example token ids of a :class:`~mi_core.data.prompt_tasks.PromptTask`: ``labels``
    are the answer tokens' ids (the classes of a language model are its vocabulary) and
    ``distractors`` the rival tokens' ids (None when the task has none)."""

    distractors: list[int] | None = None

    def accuracy(self, logits: Float[torch.Tensor, "n vocab"]) -> Float[torch.Tensor, " n"]:
        """1 where the answer wins, per example: its logit above the distractor's, or (no
        distractor) the highest of all (as :func:`~mi_core.circuits.answer_accuracy`)."""
        logits = logits.detach().float().cpu()
        if logits.shape[0] != len(self):
            raise DataError(
                f"{self.name}: {logits.shape[0]} rows of logits for {len(self)} prompts"
            )
        rows = torch.arange(len(self))
        answer = torch.tensor(self.labels)
        if self.distractors is None:
            return (logits.argmax(-1) == answer).float()
        return (logits[rows, answer] > logits[rows, torch.tensor(self.distractors)]).float()

    def answer_vs_rival(
        self, logits: Float[torch.Tensor, "batch vocab"], index: torch.Tensor
    ) -> Float[torch.Tensor, "batch 2"]:
        """Each row's answer logit and its rival's: the distractor's, or (none) the highest
        other token's. The answer wins (:meth:`accuracy`) exactly when the first is larger, so
        a table of many ablations keeps these two columns instead of the vocabulary."""
        rows = torch.arange(logits.shape[0], device=logits.device)
        index = index.to(logits.device)
        answer_ids = torch.tensor(self.labels, device=logits.device)[index]
        answer = logits[rows, answer_ids]
        if self.distractors is None:
            rival = logits.scatter(1, answer_ids[:, None], float("-inf")).amax(-1)
        else:
            rival = logits[rows, torch.tensor(self.distractors, device=logits.device)[index]]
        return torch.stack([answer, rival], dim=-1)

    def logit_difference(self, logits: Float[torch.Tensor, "n vocab"]) -> Float[torch.Tensor, " n"]:
        """The answer's logit minus the distractor's (no distractor: minus the mean logit)."""
        logits = logits.detach().float().cpu()
        rows = torch.arange(len(self))
        answer = logits[rows, torch.tensor(self.labels)]
        if self.distractors is None:
            return answer - logits.mean(-1)
        return answer - logits[rows, torch.tensor(self.distractors)]


@dataclass
class TokenizedText(TokenizedPairs):
    """The token windows of a :class:`~mi_core.data.text.TextTask`: no labels (zeros stand in
    for them), and a model pruned on them is compared with the full model at every position
    (:func:`~mi_core.pruning.objective.every_position_kl`)."""


@dataclass
class TokenizedFocusCripple(TokenizedText):
    """Token windows of two texts trained on together, as learned separability trains: a
    window's label is its role, :data:`FOCUS` (the text to keep) or :data:`CRIPPLE` (the text
    to lose)."""

    @classmethod
    def join(
        cls,
        focus: Sequence[Sequence[int]],
        cripple: Sequence[Sequence[int]],
        pad_token_id: int,
        name: str = "",
    ) -> TokenizedFocusCripple:
        """The windows of both texts, focus first, each labelled with its role."""
        ids = [list(map(int, w)) for w in (*focus, *cripple)]
        return cls(
            input_ids=ids,
            token_type_ids=[[0] * len(row) for row in ids],
            labels=[FOCUS] * len(focus) + [CRIPPLE] * len(cripple),
            max_length=max(len(row) for row in ids),
            pad_token_id=int(pad_token_id),
            n_truncated=0,
            truncated=[],
            name=name,
        )


#: The roles of :class:`TokenizedFocusCripple`'s windows (their labels).
FOCUS, CRIPPLE = 0, 1


def tokenize_text(task: TextTask, tokenizer: Any, max_length: int = 128) -> TokenizedText:
    """A text task's windows as tokenised examples, each cut to its first ``max_length``
    tokens (the count of cut windows logged once)."""
    ids = [list(w[:max_length]) for w in task.windows]
    truncated = [i for i, w in enumerate(task.windows) if len(w) > max_length]
    if truncated:
        logger.warning(
            "%s: %d-token windows cut to max_length=%d tokens",
            task.name, len(task.windows[0]), max_length,
        )  # fmt: skip
    return TokenizedText(
        input_ids=ids,
        token_type_ids=[[0] * len(row) for row in ids],
        labels=[0] * len(ids),
        max_length=int(max_length),
        pad_token_id=pad_token_id(tokenizer),
        n_truncated=len(truncated),
        truncated=truncated,
        name=task.name,
    )


def tokenize_prompts(
    task: PromptTask,
    tokenizer: Any,
    max_length: int = 128,
    prepend_bos: bool | None = None,
) -> TokenizedPrompts:
    """Tokenise every prompt of ``task`` once: a BOS token first (``prepend_bos``; default:
    when the tokenizer has one, as TransformerLens's ``to_tokens`` puts it), then the prompt
    without special tokens. A prompt longer than ``max_length`` loses tokens from its start
    (after the BOS), so the tokens before the answer position are kept; how many were cut is
    logged once. Answers and distractors must be one token each."""
    ids, truncated = encode_prompts(
        tokenizer, [e.prompt for e in task.examples], max_length, prepend_bos
    )
    if truncated:
        logger.warning(
            "%s: %d of %d prompts are longer than max_length=%d tokens and lost their first "
            "tokens",
            task.name, len(truncated), len(task), max_length,
        )  # fmt: skip

    def single(text: str, i: int, role: str) -> int:
        return single_token_id(tokenizer, text, f"{task.name}, prompt {i}", role)

    examples = task.examples
    distractors = None
    labels = [single(e.answer, i, "answer") for i, e in enumerate(examples)]
    if examples[0].distractor is not None:
        distractors = [single(e.distractor or "", i, "distractor") for i, e in enumerate(examples)]
    return TokenizedPrompts(
        input_ids=ids,
        token_type_ids=[[0] * len(row) for row in ids],
        labels=labels,
        max_length=int(max_length),
        pad_token_id=pad_token_id(tokenizer),
        n_truncated=len(truncated),
        truncated=truncated,
        name=task.name,
        distractors=distractors,
    )


def task_scorer(
    dataset: PairDataset | PromptTask | TextTask, tokenized: TokenizedPairs
) -> Callable[[Float[torch.Tensor, "n label"]], float]:
    """``score(logits)``: the accuracy of a model's logits on ``dataset`` (in data-set
    order; ``tokenized`` is its :func:`tokenize_pairs`): :meth:`PairDataset.score`, or a
    prompt task's answer beating its distractor (:meth:`TokenizedPrompts.accuracy`; two
    columns are :meth:`TokenizedPrompts.answer_vs_rival`'s). Plain text has no accuracy."""
    if isinstance(dataset, TextTask):
        raise DataError(NO_TEXT_SCORE.format(name=dataset.name))
    if isinstance(dataset, PromptTask):
        if not isinstance(tokenized, TokenizedPrompts):
            raise DataError(f"{dataset.name} is a prompt task: give its tokenize_pairs output")

        def score(logits: torch.Tensor) -> float:
            if logits.shape[-1] == 2:  # answer_vs_rival's columns
                return float((logits[:, 0] > logits[:, 1]).float().mean())
            return float(tokenized.accuracy(logits).mean())

        return score
    return dataset.score


#: Why plain text is refused where a set is scored (an eval set, the ablation table).
NO_TEXT_SCORE = (
    "{name} is plain text: it has no answer to score; prune on it (a task-free subnetwork) "
    "and evaluate on a prompt task (ioi, ioi:abba, nli:<pair spec>, a .jsonl file of prompts)"
)


def tokenize_pairs(
    dataset: PairDataset | PromptTask | TextTask, tokenizer, max_length: int = 128
) -> TokenizedPairs:
    """Tokenise every pair of ``dataset`` once (batched calls on the fast tokenizer); a prompt
    task's prompts with :func:`tokenize_prompts`, a text task's windows with
    :func:`tokenize_text`."""
    if isinstance(dataset, TextTask):
        return tokenize_text(dataset, tokenizer, max_length)
    if isinstance(dataset, PromptTask):
        return tokenize_prompts(dataset, tokenizer, max_length)
    n = len(dataset)
    pad = pad_token_id(tokenizer)
    ids, types, truncated = encode_pairs(tokenizer, dataset.text_a, dataset.text_b, max_length)
    if truncated:
        logger.warning(
            "%s: %d of %d pairs are longer than max_length=%d tokens and were truncated "
            "(longest_first)",
            dataset.name or "pairs",
            len(truncated),
            n,
            max_length,
        )
    return TokenizedPairs(
        input_ids=[list(x) for x in ids],
        token_type_ids=[list(t) for t in types],
        labels=list(dataset.labels),
        max_length=int(max_length),
        pad_token_id=pad,
        n_truncated=len(truncated),
        truncated=truncated,
        name=dataset.name,
    )


#: Examples sorted by length together: a random pool this many batches large.
GROUP_BATCHES = 16


def length_grouped_batches(
    lengths: Sequence[int], batch_size: int, seed: int, epoch: int, drop_last: bool = True
) -> list[list[int]]:
    """One epoch of training batches: random, but each of examples of similar length.

    The examples are shuffled (from ``derive_seed("batches", seed, epoch)``), cut into pools of
    ``GROUP_BATCHES * batch_size``, each pool is sorted by length and cut into batches, and the
    batch order is shuffled again. Padding per batch then costs little (as with Hugging Face's
    ``group_by_length``) while batch composition still changes every epoch. With ``drop_last``
    an incomplete last batch is dropped unless it is the only one.
    """
    n = len(lengths)
    gen = torch.Generator().manual_seed(derive_seed("batches", seed, epoch))
    order = torch.randperm(n, generator=gen).tolist()
    pool = GROUP_BATCHES * batch_size
    batches: list[list[int]] = []
    for start in range(0, n, pool):
        chunk = sorted(order[start : start + pool], key=lambda i: -lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    if drop_last and len(batches) > 1:
        batches = [b for b in batches if len(b) == batch_size]
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


class PairBatches:
    """Re-iterable batches of a :class:`TokenizedPairs`.

    Each pass yields dicts with ``input_ids``, ``attention_mask``, ``token_type_ids``, ``labels``
    and ``index`` (LongTensors). With ``shuffle`` the order is drawn from ``seed`` and the pass
    number, so passes differ but runs repeat. With ``sort_by_length`` examples are sorted by
    length (batches of similar widths); with both, :func:`length_grouped_batches` groups them.
    """

    def __init__(
        self,
        tokenized: TokenizedPairs,
        batch_size: int = 32,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        sort_by_length: bool = False,
    ) -> None:
        if int(batch_size) < 1:
            raise DataError(f"batch_size must be at least 1, not {batch_size}")
        self.tokenized = tokenized
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.sort_by_length = sort_by_length
        self._epoch = 0

    @property
    def n_truncated(self) -> int:
        return self.tokenized.n_truncated

    def __len__(self) -> int:
        n = len(self.tokenized)
        if self.drop_last and self.shuffle and self.sort_by_length:
            return max(n // self.batch_size, 1 if n else 0)  # a lone short batch is kept
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def batch_indices(self, epoch: int | None = None) -> list[list[int]]:
        """The example indices of each batch of pass ``epoch`` (default: the next pass)."""
        n = len(self.tokenized)
        epoch = self._epoch if epoch is None else epoch
        if self.shuffle and self.sort_by_length:
            return length_grouped_batches(
                self.tokenized.lengths, self.batch_size, self.seed, epoch, self.drop_last
            )
        if self.sort_by_length:
            lengths = self.tokenized.lengths
            order = sorted(range(n), key=lambda i: (-lengths[i], i))
        elif self.shuffle:
            gen = torch.Generator().manual_seed(derive_seed("batches", self.seed, epoch))
            order = torch.randperm(n, generator=gen).tolist()
        else:
            order = list(range(n))
        batches = [order[s : s + self.batch_size] for s in range(0, n, self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        batches = self.batch_indices(self._epoch)
        self._epoch += 1
        for idx in batches:
            yield self.tokenized.collate(idx)


def pair_batches(
    dataset: PairDataset | PromptTask | TextTask | TokenizedPairs,
    tokenizer=None,
    batch_size: int = 32,
    max_length: int = 128,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    sort_by_length: bool = False,
) -> PairBatches:
    """Batches of ``dataset`` (tokenised once with ``tokenizer``, or already a
    :class:`TokenizedPairs`), padded per batch to the longest example."""
    if isinstance(dataset, TokenizedPairs):
        tokenized = dataset
    else:
        if tokenizer is None:
            raise DataError("pair_batches needs a tokenizer to tokenise a PairDataset")
        tokenized = tokenize_pairs(dataset, tokenizer, max_length=max_length)
    return PairBatches(
        tokenized,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        sort_by_length=sort_by_length,
    )
