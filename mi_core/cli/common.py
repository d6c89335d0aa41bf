"""Arguments several subcommands share, defined once."""

from __future__ import annotations

import argparse


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``--model`` (checkpoint dir, hub name or embedded name) and ``--task`` (head to load)."""
    parser.add_argument("--model", required=True, help="checkpoint dir, hub name, or minilm")
    parser.add_argument(
        "--task",
        choices=["mnli", "qqp"],
        default=None,
        help="task head to load (default: the checkpoint's own)",
    )
