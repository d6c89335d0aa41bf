"""``mi-core ablate``: the paper's ablation tables (single heads, their average, joint sets)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mi_core.cli.common import add_model_args
from mi_core.errors import ConfigError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "ablate",
        help="accuracy with single heads and head sets ablated (Tables 3, 4, 8)",
        description="Write OUT (CSV), and OUT with .md and .html suffixes: one row per listed "
        "head, the full model (None), Avg. (others) over every unlisted head, each --joint set "
        "and its superadditivity (joint drop - sum of single drops; positive: superadditive).",
    )
    add_model_args(p)
    p.add_argument("--means", default=None, help="means file from mi-core means")
    p.add_argument("--heads", required=True, help="heads to list, e.g. L2.H3,L2.H5, or 'all'")
    p.add_argument(
        "--joint",
        action="extend",
        nargs="+",
        default=[],
        metavar="SET",
        help="a set of heads ablated together, e.g. L2.H5+L3.H7+L4.H0 (repeatable)",
    )
    p.add_argument(
        "--data",
        action="extend",
        nargs="+",
        required=True,
        metavar="DATA",
        help="data specs, e.g. mnli:validation_matched hans:so_swap",
    )
    p.add_argument("--out", required=True, help="table CSV (.md and .html are written beside it)")
    p.add_argument("--ablation", choices=["mean", "zero"], default="mean")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--max-examples", type=int, default=None)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from mi_core.data import load_pairs
    from mi_core.interventions import load_means, parse_components
    from mi_core.interventions.ablation_table import ablation_table, parse_head_set
    from mi_core.io import write_csv, write_text
    from mi_core.models import load_model

    out = Path(args.out)
    if out.suffix.lower() != ".csv":
        raise ConfigError(f"--out {args.out}: the table is written as .csv (with .md, .html)")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, not {args.batch_size}")
    if args.ablation == "mean" and not args.means:
        raise ConfigError(
            "mean ablation needs --means FILE (from mi-core means), or --ablation zero"
        )
    datasets = [load_pairs(spec, max_examples=args.max_examples) for spec in args.data]
    model = load_model(args.model, task=args.task or datasets[0].task)
    for ds in datasets:
        if ds.task != model.task:
            raise ConfigError(f"{ds.name} is {ds.task} data but the model is a {model.task} model")
    heads = None if args.heads.strip().lower() == "all" else parse_components(args.heads, model)
    joints = [parse_head_set(text, model) for text in args.joint]
    means = load_means(args.means, model) if args.means else None
    table = ablation_table(
        model,
        datasets,
        heads,
        joints,
        means,
        args.ablation,
        batch_size=args.batch_size,
        max_length=args.max_length,
        progress=True,
    )
    write_csv(out, table.frame())
    write_text(out.with_suffix(".md"), table.markdown())
    write_text(out.with_suffix(".html"), table.html())
    print(table.markdown())
