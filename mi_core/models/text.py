"""Sentence pairs as token ids, one way for the data pipeline and for a model's string API.

* Tokenizers with a sep token (BERT, RoBERTa, ...) use their own sentence-pair template
  (``[CLS] a [SEP] b [SEP]``, ``<s> a </s></s> b </s>``) and, where the model has them, token type
  ids. Tokenizers without a sep token (GPT-2 and other causal LMs) get ``a + eos + b`` with zero
  token types, and their pad token is eos when they have none.
* Pairs longer than ``max_length`` are truncated ``"longest_first"`` (the longer side loses tokens
  first); the indices of the truncated pairs are returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mi_core.errors import DataError

__all__ = ["encode_pairs", "pad_token_id", "uses_pair_template"]

_CHUNK = 4096  # pairs per tokenizer call


def uses_pair_template(tokenizer) -> bool:
    """True when the tokenizer has a sep token, so its own sentence-pair template applies."""
    return getattr(tokenizer, "sep_token", None) is not None


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, or its eos id when it has no pad token (GPT-2)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    if pad is None:
        raise DataError("the tokenizer has neither a pad token nor an eos token to pad with")
    return int(pad)


def _encode(tokenizer, texts: list[str], **kwargs) -> list[list[int]]:
    out: list[list[int]] = []
    for start in range(0, len(texts), _CHUNK):
        enc = tokenizer(texts[start : start + _CHUNK], return_attention_mask=False, **kwargs)
        out.extend(enc["input_ids"])
    return out


def _keep_longest_first(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Tokens kept of each side under ``longest_first`` truncation to ``budget`` tokens."""
    if la + lb <= budget:
        return la, lb
    if la > lb:
        keep_b = min(lb, budget // 2)
        return budget - keep_b, keep_b
    keep_a = min(la, budget // 2)
    return keep_a, budget - keep_a


def encode_pairs(
    tokenizer, a: Sequence[str], b: Sequence[str], max_length: int = 128
) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """Token ids and token type ids of every pair ``(a[i], b[i])``, and the truncated indices.

    Batched calls on the fast tokenizer; unpadded.
    """
    max_length = int(max_length)
    a, b = list(a), list(b)
    n = len(a)
    if uses_pair_template(tokenizer):
        n_special = tokenizer.num_special_tokens_to_add(pair=True)
        if max_length < n_special + 2:
            raise DataError(
                f"max_length {max_length} leaves no room for a pair ({n_special} special tokens)"
            )
        want_types = "token_type_ids" in getattr(tokenizer, "model_input_names", ())
        ids: list[list[int]] = []
        types: list[list[int]] = []
        # Truncating at max_length + 1 first tells which pairs exceed max_length (they come back
        # max_length + 1 long) without tokenising over-long sequences; only those are redone.
        for start in range(0, n, _CHUNK):
            enc = tokenizer(
                a[start : start + _CHUNK],
                b[start : start + _CHUNK],
                truncation="longest_first",
                max_length=max_length + 1,
                return_attention_mask=False,
                return_token_type_ids=want_types,
            )
            ids.extend(enc["input_ids"])
            if want_types:
                types.extend(enc["token_type_ids"])
        truncated = [i for i, x in enumerate(ids) if len(x) > max_length]
        if truncated:
            enc = tokenizer(
                [a[i] for i in truncated],
                [b[i] for i in truncated],
                truncation="longest_first",
                max_length=max_length,
                return_attention_mask=False,
                return_token_type_ids=want_types,
            )
            for j, i in enumerate(truncated):
                ids[i] = enc["input_ids"][j]
                if want_types:
                    types[i] = enc["token_type_ids"][j]
        if not want_types:
            types = [[0] * len(x) for x in ids]
    else:
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise DataError("a tokenizer without a sep token needs an eos token to join pairs")
        if max_length < 3:
            raise DataError(f"max_length {max_length} leaves no room for a pair")
        budget = max_length - 1
        # each side clipped at max_length: a clipped side already overflows the budget; where
        # both are clipped, which is longer (what longest_first keeps more of) needs their
        # whole lengths
        kw = {"add_special_tokens": False, "truncation": True, "max_length": max_length}
        ids_a, ids_b = _encode(tokenizer, a, **kw), _encode(tokenizer, b, **kw)
        both = [i for i, (xa, xb) in enumerate(zip(ids_a, ids_b, strict=True))
                if len(xa) == len(xb) == max_length]  # fmt: skip
        whole = {"add_special_tokens": False}
        lengths = dict(zip(both, zip(
            (len(x) for x in _encode(tokenizer, [a[i] for i in both], **whole)),
            (len(x) for x in _encode(tokenizer, [b[i] for i in both], **whole)),
            strict=True,
        ), strict=True)) if both else {}  # fmt: skip
        ids, truncated = [], []
        for i, (xa, xb) in enumerate(zip(ids_a, ids_b, strict=True)):
            if len(xa) + len(xb) > budget:
                truncated.append(i)
                la, lb = lengths.get(i, (len(xa), len(xb)))
                ka, kb = _keep_longest_first(la, lb, budget)
                xa, xb = xa[:ka], xb[:kb]
            ids.append(list(xa) + [int(eos)] + list(xb))
        types = [[0] * len(x) for x in ids]
    return [list(x) for x in ids], [list(t) for t in types], truncated


def encode_prompts(
    tokenizer: Any, prompts: Sequence[str], max_length: int = 128, prepend_bos: bool | None = None
) -> tuple[list[list[int]], list[int]]:
    """Token ids of each prompt of a language model (unpadded) and the indices of those cut:
    a BOS token first (``prepend_bos``; default: when the tokenizer has one, as
    TransformerLens's ``to_tokens`` puts it), then the prompt without special tokens. A prompt
    longer than ``max_length`` loses tokens from its start (after the BOS), so the tokens
    before the answer position are kept."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if prepend_bos is None:
        prepend_bos = bos is not None
    if prepend_bos and bos is None:
        raise DataError("prepend_bos=True, but the tokenizer has no BOS token")
    head = [bos] if prepend_bos else []
    keep = int(max_length) - len(head)
    if keep < 1:
        raise DataError(f"max_length {max_length} leaves no room for a prompt")
    ids, truncated = [], []
    for i, row in enumerate(tokenizer(list(prompts), add_special_tokens=False).input_ids):
        if len(row) > keep:
            truncated.append(i)
            row = row[len(row) - keep :]
        ids.append(head + list(row))
    return ids, truncated
