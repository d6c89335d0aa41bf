"""``mi-core means``: mean ``hook_z`` per head and ``hook_mlp_out`` per layer, for mean ablation."""

from __future__ import annotations

import argparse
from pathlib import Path

from mi_core.cli.common import add_model_args
from mi_core.errors import ConfigError, DataError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "means",
        help="compute mean activations for mean ablation",
        description="Average every head's hook_z and every layer's hook_mlp_out per token over "
        "the non-padding tokens of a data set (float64, streamed) and write them, with the "
        "model's name and weight fingerprint, to a .safetensors file.",
    )
    add_model_args(p)
    p.add_argument(
        "--data",
        default=None,
        help="data spec to average over (default: the training split of the model's task)",
    )
    p.add_argument("--out", required=True, help="output file (.safetensors)")
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=128)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from mi_core.data import load_pairs, pair_batches
    from mi_core.interventions import compute_means
    from mi_core.models import load_model

    if Path(args.out).suffix.lower() != ".safetensors":
        raise ConfigError(f"--out {args.out}: means are written as .safetensors")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, not {args.batch_size}")
    model = load_model(args.model, task=args.task)
    task = getattr(model, "task", None)
    if not args.data and not task:
        raise ConfigError(f"{args.model} has no task, so there is no default data set: give --data")
    spec = args.data or f"{task}:train"
    dataset = load_pairs(spec, max_examples=args.max_examples)
    if len(dataset) == 0:
        raise DataError(f"cannot compute means: the data set {dataset.name} is empty")
    batches = pair_batches(
        dataset,
        model.tokenizer,
        batch_size=args.batch_size,
        max_length=args.max_length,
        sort_by_length=True,
    )
    means = compute_means(model, batches, dataset=dataset.name, progress=True)
    means.save(args.out)
    print(f"{means} -> {args.out}")
