"""The classification tasks mi_core knows, defined once: a task's name and its number of labels.

A task names a classifier head (``mnli``: entailment / neutral / contradiction; ``qqp``:
not duplicate / duplicate); evaluation sets of other label schemes (HANS, PAWS) are mapped onto
a task's labels in :mod:`mi_core.data.pairs`.
"""

from __future__ import annotations

#: Task -> number of labels of its classifier head.
TASK_NUM_LABELS: dict[str, int] = {"mnli": 3, "qqp": 2}
#: The task names, in a fixed order (choices of every ``--task`` flag and config field).
TASKS: tuple[str, ...] = tuple(TASK_NUM_LABELS)
