"""``mi-core heuristic-core``: the whole experiment from one config, resumable, with a report."""

from __future__ import annotations

import argparse
import sys

from mi_core.cli import command_help


def add_parser(subparsers) -> None:
    from mi_core.methods.heuristic_core.config import shipped_configs
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
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from mi_core.methods.heuristic_core.config import load_config
    from mi_core.methods.heuristic_core.pipeline import run_experiment
    from mi_core.methods.heuristic_core.stages import STAGES

    config = load_config(args.config)
    position = {name: i + 1 for i, name in enumerate(STAGES)}

    def on_stage(name: str, status: str) -> None:
        words = {
            "start": "running ...",
            "ran": "done",
            "skipped": "finished before, skipped",
            "off": "not requested",
        }
        print(f"[{position[name]}/{len(STAGES)}] {name}: {words[status]}", file=sys.stderr)

    result = run_experiment(
        config, args.out, progress=False if args.no_progress else None, on_stage=on_stage
    )
    print(f"report: {result.report_html}")
    print(f"markdown: {result.report_md}")
