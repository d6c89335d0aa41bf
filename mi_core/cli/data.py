"""``mi-core data fetch``: write the data directory ``MI_CORE_DATA_DIR`` expects."""

from __future__ import annotations

import argparse

from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags, given_values
from mi_core.data.fetch import NOT_FETCHED, FetchConfig, fetch_data
from mi_core.errors import MiCoreError
from mi_core.io import ensure_writable, output_lock


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "data",
        help=command_help("data"),
        description="Data directories in the layout MI_CORE_DATA_DIR expects.",
    )
    p.set_defaults(func=_choose)
    commands = p.add_subparsers(dest="data_command", parser_class=type(p))
    fetch = commands.add_parser(
        "fetch",
        help="download MNLI, QQP, HANS and WikiText-2 from the Hugging Face hub once",
        description="Write mnli/, qqp/, hans/ and text/ files under DIR (default: "
        "MI_CORE_DATA_DIR, else ./data) from the Hugging Face hub, and text/"
        "python_stdlib_sample.jsonl from this Python's standard library; files already there "
        "are kept. Without a network it fails at once saying which file to place where.",
    )
    add_config_flags(fetch, FetchConfig)
    fetch.set_defaults(func=run_fetch, resumes=True)  # written sets are skipped


def _choose(args: argparse.Namespace) -> None:
    raise MiCoreError("data: choose what to do: mi-core data fetch")


def config_from_args(args: argparse.Namespace) -> FetchConfig:
    """The job's config: the dataclass defaults, then the flags given."""
    return FetchConfig.from_dict(given_values(args, FetchConfig), source="command line")


def run_fetch(args: argparse.Namespace) -> None:
    config = config_from_args(args)
    root = ensure_writable(config.directory(), "folder")  # before any download
    with output_lock(root):
        written = fetch_data(config)
    print(f"{len(written)} file(s) written under {root}" + (":" if written else ""))
    for path in written:
        print(f"  {path}")
    for rel, how in NOT_FETCHED.items():
        if not (root / rel).is_file():
            print(f"  not fetched: {rel} ({how})")
    print(f"use it with: export MI_CORE_DATA_DIR={root.resolve()}")
