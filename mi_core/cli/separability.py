"""``mi-core separability``: prune what the cripple data set uses more than the focus data set.

Writes ``trajectory.csv``, ``summary.json``, ``figures.html``, ``masks.safetensors`` and
``pruned.json`` (and ``random_masks.safetensors`` with ``--random``) into ``--out``; the state
after every step goes to ``--out/state.safetensors``, so the same command re-run after a crash
goes on from the last finished step.
"""

from __future__ import annotations

import argparse

from mi_core.cli import command_help
from mi_core.errors import ConfigError


def add_parser(subparsers) -> None:
    """Register ``separability``: one flag per field of :class:`SeparabilityConfig`."""
    from mi_core.cli.flags import add_config_flags
    from mi_core.methods.separability.config import SeparabilityConfig

    p = subparsers.add_parser(
        "separability",
        help=command_help("separability"),
        description="Iterative separability pruning: remove the neurons the cripple data set "
        "uses more than the focus data set, step by step, and measure both.",
    )
    p.add_argument(
        "--config",
        default=None,
        help="a JSON file, or a shipped config name (mi_core/configs/separability: "
        "opt-1.3b-pile-code carries the report's settings, smollm2-wikitext-python the local "
        "ones), whose keys (the fields of SeparabilityConfig) set the defaults; flags given on "
        "the command line override it",
    )
    add_config_flags(p, SeparabilityConfig)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run, out_kind="folder", resumes=True)


#: Shorthand fields and the fields each sets.
SHORTHANDS = {"scoring": ("ff_scoring", "attn_scoring"), "fill": ("ff_fill", "attn_fill")}


def _expand_shorthands(values: dict) -> dict:
    """``scoring`` / ``fill`` turned into the per-site fields they stand for, within one
    source (a per-site value given beside the shorthand wins), so that a flag overrides a
    config file's shorthand (expanded after merging, the file's ``scoring`` beat
    ``--ff-scoring``)."""
    values = dict(values)
    for short, fields in SHORTHANDS.items():
        if values.get(short) is not None:
            for field in fields:
                values.setdefault(field, values[short])
        values.pop(short, None)
    return values


def config_from_args(args: argparse.Namespace):
    """The run's :class:`SeparabilityConfig`: ``--config`` file, then the flags given."""
    from mi_core.cli.flags import given_values, require
    from mi_core.methods.separability.job import SeparabilityConfig, separability_config_values

    values = _expand_shorthands(separability_config_values(args.config) if args.config else {})
    values.update(_expand_shorthands(given_values(args, SeparabilityConfig)))
    config = SeparabilityConfig.from_dict(values, source=args.config or "command line")
    require(values, SeparabilityConfig, ("model", "focus", "cripple"))
    return config


def run(args: argparse.Namespace) -> None:
    """Build the config, run (or resume) the pruning, write the outputs, print the areas."""
    from mi_core.methods.separability.job import run_separability_job

    config = config_from_args(args)
    if not config.out:
        raise ConfigError("missing --out (the output directory, also the resume state)")
    result = run_separability_job(config, progress=not args.no_progress)
    summary = result.summary()
    for metric in ("top1", "skip50_top1", "loss"):
        area = summary["areas"].get(metric)
        if area is None:
            continue
        line = f"{metric}: area {area['area']:.3f}, separability {area['separability_pct']:.1f}%"
        for other in ("learned", "random"):
            if metric in summary.get(f"{other}_areas", {}):
                line += f" ({other}: area {summary[f'{other}_areas'][metric]['area']:.3f})"
        print(line)
    for finding in summary["findings"]:
        print(
            f"{finding['finding']}: {finding['verdict']} ({finding['this run']}; the report: "
            f"{finding['paper']})"
        )
    print(f"wrote the trajectory, summary, figures and masks to {config.out}")
