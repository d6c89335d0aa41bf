"""A fine-tuned MiniLM for walkthroughs: notebooks show a trained model's numbers, not chance.

A task head made at random scores at chance, so every accuracy, ablation and pruning result a
notebook shows on it is noise. :func:`walkthrough_classifier` gives the checkpoint of a
short, real fine-tune instead: ``make demo``'s own when it has run, else one fine-tuned once
and kept in the cache folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from mi_core.models.weight_cache import cache_home
from mi_core.training.checkpoints import list_checkpoints
from mi_core.training.config import FinetuneConfig
from mi_core.training.finetune import finetune

#: Where ``make demo`` writes its fine-tuning checkpoints, under the repository.
DEMO_FINETUNE = Path("demo-output") / "report" / "finetune"
#: The short fine-tune: steps of 16 MNLI pairs at learning rate 1e-4 (notebook 06's recipe,
#: enough for the lexical-overlap heuristic the paper studies).
WALKTHROUGH_STEPS = 200


def _demo_checkpoint(task: str) -> Path | None:
    """``make demo``'s last fine-tuning checkpoint, seen from a notebook's folder or the
    repository's (None when the demo has not run, or fine-tuned another task)."""
    if task != "mnli":
        return None
    for base in (Path.cwd(), Path.cwd().parent):
        done = list_checkpoints(base / DEMO_FINETUNE)
        if done:
            return done[-1][1]
    return None


def walkthrough_classifier(
    task: str = "mnli", steps: int = WALKTHROUGH_STEPS, *, progress: bool = False
) -> Path:
    """The checkpoint folder of a MiniLM fine-tuned on ``task``: ``make demo``'s when it has
    run, else ``steps`` steps of 16 on the task's training pairs, fine-tuned on first use into
    ``$MI_CORE_CACHE_DIR/walkthrough`` and reused after (how long that takes: benchmarks/README.md,
    Results, "walkthrough_classifier"). It prints which, so a notebook says what model its
    numbers come from."""
    demo = _demo_checkpoint(task)
    if demo is not None:
        print(f"the demo's fine-tuned MiniLM: {demo}")
        return demo
    out = cache_home() / "walkthrough" / f"minilm-{task}-{steps}"
    checkpoint = out / f"checkpoint-{steps}"
    if not any(step == steps for step, _ in list_checkpoints(out)):  # the last one: finished
        print(f"fine-tuning MiniLM on {task} for {steps} steps of 16 (once; kept in {out}) ...")
        finetune(
            FinetuneConfig(
                model="minilm", task=task, train=f"{task}:train", out=os.fspath(out),
                steps=steps, save_every=steps, lr=1e-4, batch_size=16, warmup_steps=10,
            ),
            progress=progress,
        )  # fmt: skip
    print(f"a MiniLM fine-tuned on {task} for {steps} steps: {checkpoint}")
    return checkpoint
