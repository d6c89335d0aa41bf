"""``mi-core prune``: one L0 pruning run (resumes when re-run; a finished run only reports)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags, given_values
from mi_core.pruning.jobs import PruneRunConfig
from mi_core.pruning.profiles import PruneConfig

#: Where the recipe flags (PruneConfig fields) land in the parsed arguments.
RECIPE = "recipe."


def add_recipe_flags(p: argparse.ArgumentParser) -> None:
    """One flag per PruneConfig field that overrides the profile (``--steps``, ``--dropout``)."""
    add_config_flags(p, PruneConfig, dest_prefix=RECIPE, overrides="the --profile's value")


def job_values(args: argparse.Namespace, job: type) -> dict[str, Any]:
    """A pruning job's fields from the flags given, with the recipe flags as ``overrides``."""
    values = given_values(args, job)
    values["overrides"] = given_values(args, PruneConfig, dest_prefix=RECIPE)
    return values


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "prune",
        help=command_help("prune"),
        description="Learn a mask over attention heads and MLPs that keeps the model's class "
        "distribution (KL to the full model) at a target sparsity. Writes OUT/config.json, "
        "OUT/log.csv, OUT/mask.safetensors, OUT/mask.json, OUT/subnetwork.safetensors (the mask "
        "with its means, for apply / load_intervention) and OUT/metrics.json. Re-running the "
        "same command resumes from the last checkpoint; a finished run only reports.",
    )
    add_config_flags(p, PruneRunConfig)
    add_recipe_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run, out_kind="folder", resumes=True)


def config_from_args(args: argparse.Namespace) -> PruneRunConfig:
    """The job's config: the dataclass defaults, then the flags given."""
    return PruneRunConfig.from_dict(job_values(args, PruneRunConfig), source="command line")


def run(args: argparse.Namespace) -> None:
    from mi_core.pruning.jobs import run_prune_job

    config = config_from_args(args)
    result = run_prune_job(config, progress=not args.no_progress)
    if result.already_complete:
        print(f"{config.out} is already complete; its result:")
    m = result.metrics
    print(f"achieved sparsity {m['achieved_sparsity']:.4f} ({m['n_removed']}/{m['n_components']})")
    if m.get("reached_target") is False and result.already_complete:  # else the run warned
        print(
            f"warning: the sparsity ended at {m['final_sparsity']:.3f}, not near the target "
            f"{m['target_sparsity']:g}: the gates did not converge (more --steps?)",
            file=sys.stderr,
        )
    for name, acc in m["accuracy"].items():
        print(f"{name}: subnetwork {acc:.4f}  full model {m['full_accuracy'][name]:.4f}")
    print(f"mask and metrics in {config.out}")
