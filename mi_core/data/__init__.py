"""Data: sentence-pair tasks (MNLI, HANS, QQP, PAWS-QQP, local files) and text corpora.

Everything loads offline from a data directory (``data_dir=`` or ``$MI_CORE_DATA_DIR``) laid out as
the project's shared data; MNLI, QQP, HANS and WikiText fall back to the Hugging Face hub for users
online. Missing data fails at once with a :class:`~mi_core.errors.DataError` naming the file.
See :mod:`mi_core.data.pairs`, :mod:`mi_core.data.batches` and :mod:`mi_core.data.text`.
"""

from mi_core.data._sources import DATA_DIR_ENV, resolve_data_dir
from mi_core.data.batches import (
    GROUP_BATCHES,
    PairBatches,
    TokenizedPairs,
    length_grouped_batches,
    pad_token_id,
    pair_batches,
    tokenize_pairs,
)
from mi_core.data.pairs import (
    HANS_HEURISTICS,
    HANS_LABELS,
    HANS_PAPER_SUBCASES,
    HANS_SUBCASES,
    MNLI_LABELS,
    PAIR_SPECS,
    PAWS_LABELS,
    QQP_LABELS,
    PairDataset,
    available_specs,
    load_pairs,
    model_num_labels,
)
from mi_core.data.text import (
    TEXT_SPECS,
    iter_batches,
    load_text,
    token_stream,
    token_texts,
    token_windows,
)

__all__ = [
    "DATA_DIR_ENV",
    "HANS_HEURISTICS",
    "HANS_LABELS",
    "HANS_PAPER_SUBCASES",
    "HANS_SUBCASES",
    "MNLI_LABELS",
    "PAIR_SPECS",
    "PAWS_LABELS",
    "QQP_LABELS",
    "TEXT_SPECS",
    "PairBatches",
    "PairDataset",
    "TokenizedPairs",
    "available_specs",
    "load_pairs",
    "load_text",
    "model_num_labels",
    "pad_token_id",
    "pair_batches",
    "GROUP_BATCHES",
    "length_grouped_batches",
    "resolve_data_dir",
    "token_stream",
    "iter_batches",
    "token_texts",
    "token_windows",
    "tokenize_pairs",
]
