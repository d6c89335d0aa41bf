"""``mi-core eval``: accuracy of a classifier on data sets, optionally with components ablated."""

from __future__ import annotations

import argparse
import contextlib
import json

from mi_core.cli.common import add_model_args
from mi_core.errors import ConfigError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a classifier on one or more data sets",
        description="Write OUT (columns dataset, n, accuracy) and optionally per-example "
        "predictions; --mask / --ablate evaluate a subnetwork (mean ablation needs --means).",
    )
    add_model_args(p)
    p.add_argument(
        "--data",
        action="append",
        required=True,
        metavar="DATA",
        help="data spec (repeatable), e.g. mnli:validation_matched, hans:so_swap",
    )
    p.add_argument("--out", required=True, help="results CSV")
    p.add_argument("--predictions", default=None, help="per-example predictions (JSONL)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--means", default=None, help="means file from mi-core means")
    p.add_argument("--mask", default=None, help="mask file (.safetensors or .json)")
    p.add_argument("--ablate", default=None, help="components to remove, e.g. L2.H5,L4.MLP")
    p.add_argument("--ablation", choices=["mean", "zero"], default="mean")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from mi_core.data import load_pairs
    from mi_core.evaluation import evaluate, results_frame
    from mi_core.interventions import ComponentMask, ablate, load_means
    from mi_core.io import atomic_path, write_csv
    from mi_core.models import load_model

    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, not {args.batch_size}")
    datasets = [load_pairs(spec, max_examples=args.max_examples) for spec in args.data]
    model = load_model(args.model, task=args.task or datasets[0].task)
    for ds in datasets:
        if ds.task != model.task:
            raise ConfigError(f"{ds.name} is {ds.task} data but the model is a {model.task} model")
    mask = None
    if args.mask and args.ablate:
        raise ConfigError("give either --mask or --ablate, not both")
    if args.mask:
        mask = ComponentMask.load(args.mask)
    elif args.ablate:
        mask = ComponentMask.from_removed(model, args.ablate)
    means = load_means(args.means, model) if args.means else None
    if mask is not None and args.ablation == "mean" and means is None:
        raise ConfigError(
            "mean ablation needs --means FILE (from mi-core means), or --ablation zero"
        )
    context = ablate(model, mask, means, args.ablation) if mask else contextlib.nullcontext()
    with context:
        results = [
            evaluate(
                model, ds, batch_size=args.batch_size, max_length=args.max_length, progress=True
            )
            for ds in datasets
        ]
    table = results_frame(results)
    write_csv(args.out, table)
    if args.predictions:
        with atomic_path(args.predictions) as tmp, open(tmp, "w", encoding="utf-8") as handle:
            for result in results:
                for row in result.prediction_rows():
                    handle.write(json.dumps(row) + "\n")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
