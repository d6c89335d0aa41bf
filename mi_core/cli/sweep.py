"""``mi-core sweep``: prune at several sparsities x seeds, here or on a Ray cluster."""

from __future__ import annotations

import argparse

from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags
from mi_core.cli.prune import add_recipe_flags, job_values
from mi_core.pruning.jobs import SweepConfig


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep",
        help=command_help("sweep"),
        description="Run mi-core prune for every sparsity and seed under OUT/s{sparsity}/"
        "seed{seed}/, sharing the full model's logits and accuracies, then write "
        "OUT/subnetworks.csv and OUT/subnetworks.html (in-domain vs out-of-domain accuracy per "
        "subnetwork). Re-running finishes only the missing runs.",
    )
    add_config_flags(p, SweepConfig)
    add_recipe_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run, out_kind="folder", resumes=True)


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    """The job's config: the dataclass defaults, then the flags given."""
    return SweepConfig.from_dict(job_values(args, SweepConfig), source="command line")


def run(args: argparse.Namespace) -> None:
    from mi_core.pruning.jobs import run_sweep_job

    config = config_from_args(args)
    result = run_sweep_job(config, progress=not args.no_progress)
    print(f"{len(result.runs)} subnetworks in {config.out}/subnetworks.csv and subnetworks.html")
