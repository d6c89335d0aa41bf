"""Text corpora for causal language models, and fixed-length token windows from them.

Specs: ``text:wikitext`` (``text/wikitext2_test.raw``, the raw WikiText-2 test set, split into
articles at its top-level `` = Title = `` headings; online, the hub's ``Salesforce/wikitext``
``wikitext-2-raw-v1`` test split) and ``text:python`` (the ``text`` fields of
``text/python_stdlib_sample.jsonl``, one document per module; no hub copy). A local path works
too: ``.jsonl``/``.json`` (a ``text`` column, one document per row) or any other text file (split
into articles at WikiText-style top-level headings, else one document).

:func:`token_windows` tokenises the documents (no special tokens), joins them into one stream with
a separator token *before* each document (eos, else bos, else sep: for GPT-2 ``<|endoftext|>``),
and splits the stream once: the first ``1 - heldout_fraction`` of its tokens is the ``"stats"``
part and the rest the ``"heldout"`` part. Windows are consecutive, non-overlapping slices of one
part, so no heldout window shares a token position with any stats window.

:class:`TextTask` is plain text as a pruning job's training data (:func:`load_text_task`):
token windows of a corpus's ``"stats"`` part, on which the pruning objective is the KL between
the full and the pruned model's next-token distributions at *every* position (a task-free
subnetwork), where a prompt task's is the KL at its answer position only.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Int

from mi_core.data._sources import (
    hub_load,
    local_file,
    located_json_rows,
    missing_error,
    resolve_data_dir,
)
from mi_core.errors import ConfigError, DataError
from mi_core.tasks import NEXT_TOKEN

#: The built-in text data specs (separability's data sets) and what each reads.
TEXT_SPECS: dict[str, str] = {
    "text:wikitext": "WikiText-2 raw test set, one document per article",
    "text:python": "CPython standard library modules, one document per file",
}
_FILES = {
    "text:wikitext": "text/wikitext2_test.raw",
    "text:python": "text/python_stdlib_sample.jsonl",
}
_TOP_HEADING = re.compile(r"^ ?= [^=].* = ?$")


def _is_title(lines: list[str], i: int) -> bool:
    """Whether line ``i`` is an article's `` = Title = `` heading. A wrapped formula can look
    like one (WikiText-2 test: `` = 1 rad / s and a nominal impedance k = ``): it continues a
    line that stops mid-sentence and is continued by a line starting with a number, where an
    article starts with a word or a quote."""
    if not _TOP_HEADING.match(lines[i]):
        return False
    before = lines[i - 1].rstrip() if i > 0 else ""
    after = lines[i + 1].lstrip() if i + 1 < len(lines) else ""
    mid_sentence = bool(before) and not before.endswith((".", "!", "?", '"', "”", ")", "="))
    return not (mid_sentence and after[:1].isdigit())


def split_wikitext(raw: str) -> list[str]:
    """Split raw WikiText into articles at its top-level headings (`` = Title = ``)."""
    docs: list[list[str]] = [[]]
    lines = raw.splitlines()
    for i, line in enumerate(lines):
        if _is_title(lines, i) and any(x.strip() for x in docs[-1]):
            docs.append([])
        docs[-1].append(line)
    out = []
    for lines in docs:
        while lines and not lines[0].strip():
            lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
        if lines:
            out.append("\n".join(lines))
    return out


def _jsonl_texts(path: Path) -> list[str]:
    """The ``text`` of every line of a JSON-lines file, or of every object of a ``.json``
    array (read as pair files are read)."""
    texts = []
    for where, row in located_json_rows(path):
        if not isinstance(row.get("text"), str):
            raise DataError(f"{where}: expected an object with a string 'text' field")
        texts.append(row["text"])
    return texts


def _read_path(path: Path) -> list[str]:
    try:
        if path.suffix.lower() in (".jsonl", ".json"):
            return _jsonl_texts(path)
        return split_wikitext(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from None


def load_text(spec: str, data_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The documents of a text corpus: ``text:wikitext``, ``text:python`` or a local file."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    key = spec.strip().lower() if isinstance(spec, str) else spec
    if key not in TEXT_SPECS:
        path = Path(str(spec).removeprefix("text:")).expanduser()
        if path.is_file():
            docs = _read_path(path)
        elif path.suffix.lower() in (".jsonl", ".json", ".txt", ".raw"):
            raise DataError(f"text file {path} not found")
        else:
            raise DataError(
                f"unknown text spec {spec!r}; valid specs: {', '.join(TEXT_SPECS)}, or a path to "
                f"a .jsonl (text column) or plain text file (text:<path> as a pruning job's data)"
            )
    else:
        rel = _FILES[key]
        root = resolve_data_dir(data_dir)
        path = local_file(key, rel, root)
        if path is not None:
            docs = _read_path(path)
        elif key == "text:wikitext":
            hub = hub_load(
                key,
                rel,
                root,
                ("Salesforce/wikitext", "wikitext-2-raw-v1"),
                {"split": "test"},
                "save ''.join(datasets.load_dataset('Salesforce/wikitext', 'wikitext-2-raw-v1', "
                "split='test')['text']) as that file",
            )
            docs = split_wikitext("".join(hub["text"]))
        else:
            raise missing_error(
                key,
                rel,
                root,
                "write JSON lines {path, text} of Python source files (e.g. CPython's Lib/*.py)",
                "it has no hub copy",
            )
    if not docs:
        raise DataError(f"{spec}: no documents")
    return docs


def _separator_id(tokenizer) -> int | None:
    for attr in ("eos_token_id", "bos_token_id", "sep_token_id"):
        tok = getattr(tokenizer, attr, None)
        if tok is not None:
            return int(tok)
    return None


def _encode_docs(tokenizer, docs: list[str]) -> list[list[int]]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # the Rust tokenizer directly: no special tokens, no "sequence too long" warnings, and
        # neither the truncation nor the padding that an earlier padded call (TransformerLens's
        # to_tokens, a batch with padding=True) left switched on in the backend
        truncation, padding = backend.truncation, backend.padding
        backend.no_truncation()
        backend.no_padding()
        try:
            return [e.ids for e in backend.encode_batch(docs, add_special_tokens=False)]
        finally:
            if truncation is not None:
                keep = ("max_length", "stride", "strategy", "direction")
                backend.enable_truncation(**{k: v for k, v in truncation.items() if k in keep})
            if padding is not None:
                backend.enable_padding(**padding)
    return [tokenizer.encode(d, add_special_tokens=False) for d in docs]


def token_stream(
    tokenizer, spec: str, data_dir: str | os.PathLike[str] | None = None
) -> torch.Tensor:
    """All documents of ``spec`` as one token stream, a separator token before each document."""
    docs = load_text(spec, data_dir=data_dir)
    sep = _separator_id(tokenizer)
    stream: list[int] = []
    for ids in _encode_docs(tokenizer, docs):
        if sep is not None:
            stream.append(sep)
        stream.extend(ids)
    return torch.tensor(stream, dtype=torch.long)


def split_stream(
    stream: torch.Tensor, split: str = "stats", heldout_fraction: float = 0.1
) -> torch.Tensor:
    """The ``"stats"`` part (first ``1 - heldout_fraction`` of the tokens) or the ``"heldout"``
    part (the rest) of a token stream."""
    if not 0.0 < float(heldout_fraction) < 1.0:
        raise DataError(
            f"heldout_fraction must lie strictly between 0 and 1, not {heldout_fraction}"
        )
    boundary = int(round(len(stream) * (1.0 - float(heldout_fraction))))
    if split == "stats":
        return stream[:boundary]
    if split == "heldout":
        return stream[boundary:]
    raise DataError(f"unknown split {split!r}; expected 'stats' or 'heldout'")


def token_windows(
    tokenizer,
    spec: str,
    window: int = 128,
    n_windows: int | None = None,
    split: str = "stats",
    heldout_fraction: float = 0.1,
    data_dir: str | os.PathLike[str] | None = None,
    prepend_bos: bool = False,
) -> torch.Tensor:
    """Fixed-length windows ``[n, window]`` (LongTensor) of one part of a corpus' token stream.

    ``n_windows`` keeps the first windows of the part (all if None; more than there are is a
    :class:`DataError`). ``prepend_bos`` makes each window ``[bos] + window - 1`` stream tokens.
    """
    window = int(window)
    if window < 2:
        raise DataError(f"window must be at least 2 tokens, not {window}")
    part = split_stream(token_stream(tokenizer, spec, data_dir), split, heldout_fraction)
    step = window - 1 if prepend_bos else window
    n_avail = len(part) // step
    if n_windows is not None:
        if int(n_windows) < 0:
            raise DataError(f"n_windows must be non-negative, not {n_windows}")
        if int(n_windows) > n_avail:
            raise DataError(
                f"{spec}: {n_windows} windows of {window} tokens asked for, but the {split} part "
                f"({len(part)} tokens, heldout_fraction={heldout_fraction}) holds {n_avail}"
            )
        n_avail = int(n_windows)
    windows = part[: n_avail * step].reshape(n_avail, step)
    if prepend_bos:
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is None:
            bos = _separator_id(tokenizer)
        if bos is None:
            raise DataError("prepend_bos=True but the tokenizer has no bos/eos/sep token")
        windows = torch.cat([torch.full((n_avail, 1), int(bos), dtype=torch.long), windows], 1)
    return windows.contiguous()


def token_texts(
    tokenizer,
    spec: str,
    max_text_tokens: int = 1000,
    max_tokens: int = 100_000,
    split: str = "heldout",
    heldout_fraction: float = 0.1,
    data_dir: str | os.PathLike[str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole documents, one per row, as the separability report evaluates them.

    Each row is a start token (bos, else the separator) followed by the first
    ``max_text_tokens - 1`` tokens of one document, right-padded; documents are taken in order
    until the next-token predictions they hold reach ``max_tokens``. ``split="heldout"`` takes
    only documents that start in the held-out part of the token stream (so they share no token
    with the ``"stats"`` windows of :func:`token_windows`); ``"stats"`` the documents before.
    Returns ``(tokens [n, L], mask [n, L])`` with ``mask`` True on real tokens.
    """
    if max_text_tokens < 2 or max_tokens < 1:
        raise DataError(
            f"need max_text_tokens >= 2 and max_tokens >= 1, not {max_text_tokens}, {max_tokens}"
        )
    if split not in ("stats", "heldout"):
        raise DataError(f"unknown split {split!r}; expected 'stats' or 'heldout'")
    docs = _encode_docs(tokenizer, load_text(spec, data_dir=data_dir))
    sep = _separator_id(tokenizer)
    start = getattr(tokenizer, "bos_token_id", None)
    start = sep if start is None else int(start)
    if start is None:
        raise DataError("the tokenizer has no bos/eos/sep token to start each text with")
    lengths = [len(ids) + (sep is not None) for ids in docs]
    total = sum(lengths)
    boundary = len(split_stream(torch.zeros(total), "stats", heldout_fraction))
    rows: list[list[int]] = []
    predictions = 0
    offset = 0
    for ids, length in zip(docs, lengths, strict=True):
        begins, offset = offset, offset + length
        if not ids or (split == "heldout") != (begins >= boundary):
            continue
        row = [start, *ids[: max_text_tokens - 1]]
        rows.append(row)
        predictions += len(row) - 1
        if predictions >= max_tokens:
            break
    if not rows:
        raise DataError(f"{spec}: no document starts in the {split} part of the token stream")
    width = max(len(r) for r in rows)
    pad = sep if sep is not None else start
    tokens = torch.full((len(rows), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = True
    return tokens, mask


def iter_batches(
    tokens: Int[torch.Tensor, "n pos"],
    token_mask: Bool[torch.Tensor, "n pos"] | None,
    batch_size: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """Yield ``(tokens, mask)`` batches of at most ``batch_size`` rows."""
    if tokens.ndim != 2:
        raise DataError(f"expected token windows of shape [n, pos], got {tuple(tokens.shape)}")
    if token_mask is not None and token_mask.shape != tokens.shape:
        raise DataError(
            f"token mask shape {tuple(token_mask.shape)} does not match tokens "
            f"{tuple(tokens.shape)}"
        )
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    for start in range(0, tokens.shape[0], batch_size):
        stop = start + batch_size
        yield tokens[start:stop], None if token_mask is None else token_mask[start:stop]


#: Tokens per window of a :class:`TextTask` (a BOS token and 63 tokens of the corpus).
TEXT_WINDOW = 64


def is_text_spec(spec: str | os.PathLike[str]) -> bool:
    """Whether ``spec`` names plain text as a job's data: ``text:wikitext``, ``text:python``
    or ``text:<path>``."""
    return os.fspath(spec).strip().lower().startswith("text:")


def check_text_spec(spec: str | os.PathLike[str]) -> None:
    """Refuse a text spec that names nothing, before any model loads."""
    text = os.fspath(spec).strip()
    if text.lower() in TEXT_SPECS:
        return
    path = Path(text[len("text:") :]).expanduser()
    if not path.is_file():
        raise DataError(
            f"unknown text spec {text!r}: no file {path}; valid specs: {', '.join(TEXT_SPECS)} "
            "or text:<path> (a .jsonl with a text column, or a plain text file)"
        )


@dataclass(frozen=True)
class TextTask:
    """Plain text as training data: fixed-length token windows of a corpus, each a BOS token
    (else the tokenizer's separator) then consecutive corpus tokens. Pruning on it compares the
    full and the pruned model's next-token distributions at every position (a task-free
    subnetwork); it has no answer, so it is not an eval set (evaluate a subnetwork on a prompt
    task). Made by :func:`load_text_task` with a tokenizer: the windows are token ids."""

    name: str
    windows: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.windows:
            raise DataError(f"text {self.name} has no windows")

    def __len__(self) -> int:
        return len(self.windows)

    def digest(self) -> str:
        """A short hash of every window's token ids, in order: what a run trained on this text
        records, so that a resume on an edited file is refused (prompt and pair data are caught
        by their reference logits' digest)."""
        digest = hashlib.sha256()
        for window in self.windows:
            digest.update(len(window).to_bytes(4, "little"))
            digest.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in window))
        return digest.hexdigest()[:16]

    @property
    def task(self) -> str:
        """Next-token prediction (:data:`~mi_core.tasks.NEXT_TOKEN`): a language model's data."""
        return NEXT_TOKEN

    @property
    def chance_accuracy(self) -> float:
        """No accuracy is defined on plain text (0, as a top-1 guess over a vocabulary)."""
        return 0.0

    @property
    def meta(self) -> dict[str, list[Any]]:
        """Per-example identifiers (none)."""
        return {}

    def subset(self, indices: Any, name: str | None = None) -> TextTask:
        """The windows at ``indices`` (ints, in the order given)."""
        return TextTask(name or self.name, tuple(self.windows[int(i)] for i in indices))

    def head(self, n: int) -> TextTask:
        """The first ``n`` windows (all of them if there are fewer)."""
        return self.subset(range(min(max(int(n), 0), len(self))))

    def spread(self, n: int, key: str = "subcase") -> TextTask:
        """``n`` windows evenly spaced over the corpus (all if there are fewer), so a small
        training set still covers many documents rather than the first few."""
        n = min(max(int(n), 0), len(self))
        if n == len(self):
            return self
        return self.subset([i * len(self) // n for i in range(n)])

    def selection(self) -> str:
        """``"<n>:<digest>"`` of the windows' token ids, as
        :meth:`~mi_core.data.PairDataset.selection`."""
        digest = hashlib.sha256()
        for window in self.windows:
            digest.update(len(window).to_bytes(4, "little"))
            digest.update(torch.tensor(window, dtype=torch.int64).numpy().tobytes())
        return f"{len(self)}:{digest.hexdigest()[:16]}"

    def matches(self, recorded: Any) -> bool:
        """Whether a cache's record of a set (its :meth:`selection`) names these windows."""
        return recorded == self.selection()


def load_text_task(
    spec: str | os.PathLike[str],
    n: int | None = None,
    *,
    tokenizer: Any,
    window: int = TEXT_WINDOW,
    data_dir: str | os.PathLike[str] | None = None,
) -> TextTask:
    """``n`` windows of ``window`` tokens of the text ``spec`` names (:func:`is_text_spec`),
    spread evenly over the corpus's ``"stats"`` part (all of them when ``n`` is None), each a
    BOS token first (:func:`token_windows` with ``prepend_bos``)."""
    if tokenizer is None:
        raise ConfigError("plain text is cut into token windows: give the model's tokenizer")
    if n is not None and n <= 0:
        raise DataError(f"need a positive number of windows, not {n}")
    text = os.fspath(spec).strip()
    if not is_text_spec(text):
        raise DataError(f"{text!r} is not a text spec (text:wikitext, text:python, text:<path>)")
    check_text_spec(text)
    key = text.lower() if text.lower() in TEXT_SPECS else text
    windows = token_windows(tokenizer, key, window, data_dir=data_dir, prepend_bos=True)
    task = TextTask(text, tuple(tuple(int(t) for t in row) for row in windows.tolist()))
    return task if n is None else task.spread(n)
