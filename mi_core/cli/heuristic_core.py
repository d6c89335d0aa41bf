"""``mi-core heuristic-core``: the whole experiment from one config, resumable, with a report."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags, given_values
from mi_core.errors import ConfigError


def add_parser(subparsers) -> None:
    from mi_core.methods.heuristic_core.config import ExperimentConfig, shipped_configs
    from mi_core.methods.heuristic_core.stages import STAGE_SPECS

    p = subparsers.add_parser(
        "heuristic-core",
        help=command_help("heuristic-core"),
        description="Run the heuristic-core experiment of CONFIG under REPORT, stage by stage: "
        + "; ".join(f"{s.name} ({s.description})" for s in STAGE_SPECS)
        + ". Re-running skips finished stages. Shipped configs: "
        + ", ".join(shipped_configs()),
    )
    p.add_argument("--config", required=True, help="config JSON file or shipped config name")
    p.add_argument("--out", required=True, metavar="REPORT", help="report directory")
    add_config_flags(p, ExperimentConfig, dest_prefix="experiment.", overrides="the config's")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one field of a section of the config, e.g. pruning.profile=cofi or "
        "pruning.sparsities=[0.3,0.5] (VALUE is read as JSON, else as a string; repeatable)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run, out_kind="folder", resumes=True)


def _assign(values: dict[str, Any], text: str) -> None:
    """Apply one ``--set section.key=value`` to the config's dict (``value`` as JSON if it
    parses, else as a string)."""
    key, sep, raw = text.partition("=")
    path = key.strip().split(".")
    if not sep or len(path) < 2 or not all(path):
        raise ConfigError(
            f"--set takes SECTION.KEY=VALUE (e.g. pruning.profile=cofi), not {text!r}"
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    section = values
    for part in path[:-1]:
        if section.get(part) is None:
            section[part] = {}
        section = section[part]
        if not isinstance(section, dict):
            raise ConfigError(f"--set {text}: {part} is not a section of the config")
    section[path[-1]] = value


def config_from_args(args: argparse.Namespace) -> Any:
    """The experiment's config: the file (or shipped config), then the field flags given,
    then each ``--set``; validated once, as a whole."""
    from mi_core.config import read_config_json
    from mi_core.methods.heuristic_core.config import ExperimentConfig, resolve_config_path

    path = resolve_config_path(args.config)
    values = read_config_json(path)
    given = given_values(args, ExperimentConfig, dest_prefix="experiment.")
    if given.get("checkpoint") is not None and "finetune" not in given:
        values["finetune"] = None  # --checkpoint: start from it, not the file's fine-tuning
    values.update(given)
    for text in args.set:
        _assign(values, text)
    return ExperimentConfig.from_dict(values, source=path.name)


def run(args: argparse.Namespace) -> None:
    from mi_core.methods.heuristic_core.pipeline import run_experiment
    from mi_core.methods.heuristic_core.stages import STAGES

    config = config_from_args(args)
    position = {name: i + 1 for i, name in enumerate(STAGES)}

    def on_stage(name: str, status: str) -> None:
        words = {
            "start": "running ...",
            "ran": "done",
            "skipped": "finished before, skipped",
            "off": "not requested",
        }
        print(f"[{position[name]}/{len(STAGES)}] {name}: {words[status]}", file=sys.stderr)

    result = run_experiment(config, args.out, progress=not args.no_progress, on_stage=on_stage)
    print(f"report: {result.report_html}")
    print(f"markdown: {result.report_md}")
