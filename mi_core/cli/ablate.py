"""``mi-core ablate``: the paper's ablation tables (single heads, their average, joint sets)."""

from __future__ import annotations

import argparse

from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags, given_values
from mi_core.interventions.config import AblationTableConfig


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "ablate",
        help=command_help("ablate"),
        description="Write OUT (CSV), and OUT with .md and .html suffixes: one row per listed "
        "head, the full model (None), with --others the average over every unlisted head, each "
        "--joint set and its superadditivity (joint drop - sum of single drops; positive: "
        "superadditive).",
    )
    add_config_flags(p, AblationTableConfig)
    p.set_defaults(func=run, out_kind="file")  # --out is one file, whatever its suffix


def config_from_args(args: argparse.Namespace) -> AblationTableConfig:
    """The job's config: the dataclass defaults, then the flags given."""
    values = given_values(args, AblationTableConfig)
    return AblationTableConfig.from_dict(values, source="command line")


def run(args: argparse.Namespace) -> None:
    from mi_core.interventions.ablation_table import run_ablation_table

    config = config_from_args(args)
    print(run_ablation_table(config).markdown())
