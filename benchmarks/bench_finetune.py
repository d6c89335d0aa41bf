"""Fine-tuning MiniLM on mnli:train for one epoch on this machine's CPU cores.

Reports examples per second of training (evaluations excluded) and the MNLI / HANS accuracies
reached, beside the untrained model's. The run's checkpoint is kept in --out for reuse.

    python benchmarks/bench_finetune.py [--epochs 1] [--out /tmp/mi_core-bench-finetune]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from mi_core.data import load_pairs
from mi_core.evaluation import evaluate
from mi_core.models import load_model
from mi_core.training import FinetuneConfig, finetune

EVAL_SETS = [
    "mnli:validation_matched",
    "hans:so_swap",
    "hans:prep",
    "hans:embed_if",
    "hans:embed_verb",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--eval-examples", type=int, default=1000)
    parser.add_argument("--out", default="/tmp/mi_core-bench-finetune")
    args = parser.parse_args()

    train = load_pairs("mnli:train")
    steps = math.ceil(args.epochs * len(train) / args.batch_size)
    cfg = FinetuneConfig(
        model=args.model,
        task="mnli",
        train="mnli:train",
        out=args.out,
        steps=steps,
        save_every=steps,
        lr=args.lr,
        batch_size=args.batch_size,
    )
    start = time.perf_counter()
    finetune(cfg)
    seconds = time.perf_counter() - start
    print(
        f"{steps} steps x {args.batch_size} = {steps * args.batch_size} examples in "
        f"{seconds:.0f} s on {torch.get_num_threads()} threads: "
        f"{steps * args.batch_size / seconds:.1f} examples/s"
    )
    before = load_model(args.model, task="mnli")
    after = load_model(f"{args.out}/checkpoint-{steps}")
    print(f"{'dataset':32s} {'before':>8s} {'after':>8s}")
    for spec in EVAL_SETS:
        ds = load_pairs(spec, max_examples=args.eval_examples)
        acc_before, acc_after = evaluate(before, ds).accuracy, evaluate(after, ds).accuracy
        print(f"{ds.name:32s} {acc_before:8.3f} {acc_after:8.3f}")


if __name__ == "__main__":
    main()
