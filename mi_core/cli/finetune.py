"""``mi-core finetune``: fine-tune a classifier, checkpointing and resuming."""

from __future__ import annotations

import argparse

from mi_core.training import FinetuneConfig, finetune


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "finetune",
        help="fine-tune a sequence classifier (resumes from the last checkpoint in --out)",
        description="Fine-tune MODEL on a pair task with AdamW and a linear schedule. Writes "
        "OUT/checkpoint-{step}/ (Hugging Face directories), OUT/metrics.csv and "
        "OUT/training_dynamics.html. Re-running the same command resumes.",
    )
    p.add_argument("--model", required=True, help="checkpoint dir, hub name, or minilm")
    p.add_argument("--task", required=True, choices=["mnli", "qqp"])
    p.add_argument("--train", required=True, help="data spec, e.g. mnli:train")
    p.add_argument(
        "--eval",
        nargs="+",
        default=[],
        metavar="DATA",
        help="evaluation sets; the first is in-domain",
    )
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=500)
    p.add_argument("--out", required=True)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--max-eval-examples", type=int, default=None)
    p.add_argument("--max-train-examples", type=int, default=None)
    p.add_argument(
        "--no-group-by-length",
        dest="group_by_length",
        action="store_false",
        help="draw batches uniformly at random instead of grouping examples of similar length",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    cfg = FinetuneConfig(
        model=args.model,
        task=args.task,
        train=args.train,
        out=args.out,
        eval=args.eval,
        steps=args.steps,
        save_every=args.save_every,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        max_length=args.max_length,
        warmup_steps=args.warmup_steps,
        max_eval_examples=args.max_eval_examples,
        max_train_examples=args.max_train_examples,
        group_by_length=args.group_by_length,
    )
    metrics = finetune(cfg)
    if not metrics.empty:
        last = metrics[metrics["step"] == metrics["step"].max()]
        for row in last.itertuples():
            print(f"step {row.step}  {row.dataset}: accuracy {row.accuracy:.4f}")
    print(f"checkpoints and metrics in {args.out}")
