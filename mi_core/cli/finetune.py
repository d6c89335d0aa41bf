"""``mi-core finetune``: fine-tune a classifier, checkpointing and resuming."""

from __future__ import annotations

import argparse

from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags, given_values
from mi_core.training.config import FinetuneConfig


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "finetune",
        help=command_help("finetune"),
        description="Fine-tune MODEL on a pair task with AdamW and a linear schedule. Writes "
        "OUT/checkpoint-{step}/ (Hugging Face directories), OUT/metrics.csv, "
        "OUT/train_loss.csv (each step's loss and learning rate) and "
        "OUT/training_dynamics.html. Re-running the same command resumes.",
    )
    add_config_flags(p, FinetuneConfig)
    p.set_defaults(func=run, out_kind="folder", resumes=True)


def config_from_args(args: argparse.Namespace) -> FinetuneConfig:
    """The job's config: the dataclass defaults, then the flags given."""
    return FinetuneConfig.from_dict(given_values(args, FinetuneConfig), source="command line")


def run(args: argparse.Namespace) -> None:
    from mi_core.training.finetune import finetune

    cfg = config_from_args(args)
    metrics = finetune(cfg)
    if not metrics.empty:
        last = metrics[metrics["step"] == metrics["step"].max()]
        for row in last.itertuples():
            print(f"step {row.step}  {row.dataset}: accuracy {row.accuracy:.4f}")
    print(f"checkpoints and metrics in {args.out}")
