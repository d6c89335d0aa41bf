"""``mi-core eval``: accuracy of a classifier on data sets, optionally with components ablated."""

from __future__ import annotations

import argparse

from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags, given_values
from mi_core.evaluation.config import EvalConfig


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help=command_help("eval"),
        description="Write OUT (columns dataset, n, accuracy) and optionally per-example "
        "predictions; --mask / --ablate evaluate a subnetwork (mean ablation needs --means).",
    )
    add_config_flags(p, EvalConfig)
    p.set_defaults(func=run, out_kind="file")  # --out is one file, whatever its suffix


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The job's config: the dataclass defaults, then the flags given."""
    return EvalConfig.from_dict(given_values(args, EvalConfig), source="command line")


def run(args: argparse.Namespace) -> None:
    from mi_core.evaluation.classification import results_frame, run_eval

    config = config_from_args(args)
    table = results_frame(run_eval(config))
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
