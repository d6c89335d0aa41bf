"""``mi-core means``: mean ``hook_z`` per head and ``hook_mlp_out`` per layer, for mean ablation."""

from __future__ import annotations

import argparse

from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags, given_values
from mi_core.interventions.config import MeansConfig


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "means",
        help=command_help("means"),
        description="Average every head's hook_z and every layer's hook_mlp_out per token over "
        "the non-padding tokens of a data set (float64, streamed) and write them, with the "
        "model's name and weight fingerprint, to a .safetensors file.",
    )
    add_config_flags(p, MeansConfig)
    p.set_defaults(func=run, out_kind="file")  # --out is one file, whatever its suffix


def config_from_args(args: argparse.Namespace) -> MeansConfig:
    """The job's config: the dataclass defaults, then the flags given."""
    return MeansConfig.from_dict(given_values(args, MeansConfig), source="command line")


def run(args: argparse.Namespace) -> None:
    from mi_core.interventions.means import run_means

    config = config_from_args(args)
    means = run_means(config)
    print(f"{means} -> {config.out}")
