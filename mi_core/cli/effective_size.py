"""``mi-core effective-size``: effective size over fine-tuning checkpoints (paper Figure 6)."""

from __future__ import annotations

import argparse

from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags
from mi_core.cli.prune import add_recipe_flags, job_values
from mi_core.methods.heuristic_core.config import EffectiveSizeConfig


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "effective-size",
        help=command_help("effective-size"),
        description="For every DIR/checkpoint-<step> (or, with --revisions step1000 step2000 "
        "and --checkpoints a hub model id, every such revision of it: Pythia's training "
        "checkpoints): compute means on --train (unless --means), "
        "prune at every sparsity and seed (a sweep under OUT/checkpoint-<step>/sweep, resumable, "
        "local or on Ray), and report the effective size = 100 - the largest sparsity that stays "
        "within --margin of that checkpoint's full model (in %), in-domain (the sets of --train's "
        "data set, e.g. MNLI matched and mismatched), out-of-domain (the other --eval sets) and "
        "mixed. --method authors (the default, their mnli-effective-size.py): each seed's largest "
        "strictly faithful sparsity, averaged over seeds, mixed = the mean of every set; --method "
        "paper (the paper's text): the mean accuracy over seeds judged, mixed = (in + out) / 2. "
        "Writes OUT/effective_size.csv, faithfulness.csv, accuracy.csv, full_accuracy.csv and "
        "effective_size.html.",
    )
    add_config_flags(p, EffectiveSizeConfig)
    add_recipe_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run, out_kind="folder", resumes=True)


def config_from_args(args: argparse.Namespace) -> EffectiveSizeConfig:
    """The job's config: the dataclass defaults, then the flags given."""
    values = job_values(args, EffectiveSizeConfig)
    return EffectiveSizeConfig.from_dict(values, source="command line")


def run(args: argparse.Namespace) -> None:
    from mi_core.methods.heuristic_core.effective_size import run_effective_size_job

    config = config_from_args(args)
    result = run_effective_size_job(config, progress=not args.no_progress)
    table = result.effective_size
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"effective sizes in {result.out}/effective_size.csv and effective_size.html")
