"""Data: sentence-pair tasks (MNLI, HANS, QQP, PAWS-QQP, local files) and text corpora.

Everything loads offline from a data directory (``data_dir=`` or ``$MI_CORE_DATA_DIR``) laid out as
the project's shared data; MNLI, QQP, HANS and WikiText fall back to the Hugging Face hub for users
online. Missing data fails at once with a :class:`~mi_core.errors.DataError` naming the file.
See :mod:`mi_core.data.pairs`, :mod:`mi_core.data.batches` and :mod:`mi_core.data.text`.
"""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
    from mi_core.data._sources import DATA_DIR_ENV, resolve_data_dir
    from mi_core.data.batches import (
        GROUP_BATCHES,
        PairBatches,
        TokenizedPairs,
        TokenizedPrompts,
        length_grouped_batches,
        pad_token_id,
        pair_batches,
        tokenize_pairs,
        tokenize_prompts,
    )
    from mi_core.data.circuit_pairs import PromptPairs, hans_pairs, ioi_pairs
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
    from mi_core.data.prompt_tasks import (
        NLI_TEMPLATE,
        NLI_VERBALISER,
        PROMPT_TASKS,
        PromptExample,
        PromptTask,
        is_prompt_spec,
        load_prompt_task,
        parse_nli_prompt,
        render_nli_prompt,
    )
    from mi_core.data.text import (
        TEXT_SPECS,
        iter_batches,
        load_text,
        token_stream,
        token_texts,
        token_windows,
    )

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "DATA_DIR_ENV": "mi_core.data._sources",
    "resolve_data_dir": "mi_core.data._sources",
    "PromptPairs": "mi_core.data.circuit_pairs",
    "hans_pairs": "mi_core.data.circuit_pairs",
    "ioi_pairs": "mi_core.data.circuit_pairs",
    "NLI_TEMPLATE": "mi_core.data.prompt_tasks",
    "NLI_VERBALISER": "mi_core.data.prompt_tasks",
    "PROMPT_TASKS": "mi_core.data.prompt_tasks",
    "PromptExample": "mi_core.data.prompt_tasks",
    "PromptTask": "mi_core.data.prompt_tasks",
    "load_prompt_task": "mi_core.data.prompt_tasks",
    "is_prompt_spec": "mi_core.data.prompt_tasks",
    "parse_nli_prompt": "mi_core.data.prompt_tasks",
    "render_nli_prompt": "mi_core.data.prompt_tasks",
    "GROUP_BATCHES": "mi_core.data.batches",
    "PairBatches": "mi_core.data.batches",
    "TokenizedPairs": "mi_core.data.batches",
    "TokenizedPrompts": "mi_core.data.batches",
    "tokenize_prompts": "mi_core.data.batches",
    "length_grouped_batches": "mi_core.data.batches",
    "pad_token_id": "mi_core.data.batches",
    "pair_batches": "mi_core.data.batches",
    "tokenize_pairs": "mi_core.data.batches",
    "HANS_HEURISTICS": "mi_core.data.pairs",
    "HANS_LABELS": "mi_core.data.pairs",
    "HANS_PAPER_SUBCASES": "mi_core.data.pairs",
    "HANS_SUBCASES": "mi_core.data.pairs",
    "MNLI_LABELS": "mi_core.data.pairs",
    "PAIR_SPECS": "mi_core.data.pairs",
    "PAWS_LABELS": "mi_core.data.pairs",
    "QQP_LABELS": "mi_core.data.pairs",
    "PairDataset": "mi_core.data.pairs",
    "available_specs": "mi_core.data.pairs",
    "load_pairs": "mi_core.data.pairs",
    "model_num_labels": "mi_core.data.pairs",
    "TEXT_SPECS": "mi_core.data.text",
    "iter_batches": "mi_core.data.text",
    "load_text": "mi_core.data.text",
    "token_stream": "mi_core.data.text",
    "token_texts": "mi_core.data.text",
    "token_windows": "mi_core.data.text",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


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
    "PromptPairs",
    "TokenizedPairs",
    "TokenizedPrompts",
    "available_specs",
    "is_prompt_spec",
    "tokenize_prompts",
    "hans_pairs",
    "ioi_pairs",
    "NLI_TEMPLATE",
    "NLI_VERBALISER",
    "PROMPT_TASKS",
    "PromptExample",
    "PromptTask",
    "load_prompt_task",
    "parse_nli_prompt",
    "render_nli_prompt",
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
