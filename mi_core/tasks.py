"""The classification tasks mi_core knows, defined once: a task's name, its labels (the
classifier head's classes, in order) and the splits of its GLUE data.

A task names a classifier head (``mnli``: entailment / neutral / contradiction; ``qqp``:
not duplicate / duplicate); evaluation sets of other label schemes (HANS, PAWS) are mapped onto
a task's labels in :mod:`mi_core.data.pairs`.
"""

from __future__ import annotations

#: Task -> the names of its classifier head's classes, in the head's order.
TASK_LABELS: dict[str, tuple[str, ...]] = {
    "mnli": ("entailment", "neutral", "contradiction"),
    "qqp": ("not_duplicate", "duplicate"),
}
#: Task -> number of labels of its classifier head.
TASK_NUM_LABELS: dict[str, int] = {task: len(labels) for task, labels in TASK_LABELS.items()}
#: The task names, in a fixed order (choices of every ``--task`` flag and config field).
TASKS: tuple[str, ...] = tuple(TASK_LABELS)
#: Task -> the splits of its GLUE data (``heldout``: MNLI training pairs set aside locally).
TASK_SPLITS: dict[str, tuple[str, ...]] = {
    "mnli": ("train", "validation_matched", "validation_mismatched", "heldout"),
    "qqp": ("train", "validation"),
}

#: The task of a language model on a prompt task: predict the next token, its classes the
#: model's vocabulary, read at the prompt's last token (the answer position); see
#: :mod:`mi_core.data.prompt_tasks` and :class:`~mi_core.models.HookedAnswerModel`.
NEXT_TOKEN = "next_token"
