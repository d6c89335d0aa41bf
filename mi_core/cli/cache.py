"""``mi-core cache``: list or clear the processed-weight cache (mi_core.models.weight_cache)."""

from __future__ import annotations

import argparse

from mi_core.cli import command_help
from mi_core.errors import MiCoreError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "cache",
        help=command_help("cache"),
        description="The processed weights load_model keeps of each local causal LM (one folder "
        "per model and folding option, under $MI_CORE_CACHE_DIR/tl_weights, default "
        "~/.cache/mi_core): list them with their sizes, or remove them all.",
    )
    p.set_defaults(func=_choose)
    commands = p.add_subparsers(dest="cache_command", parser_class=type(p))
    commands.add_parser("list", help="each cached model, its folder and size").set_defaults(
        func=run_list
    )
    commands.add_parser("clear", help="remove every cached model").set_defaults(func=run_clear)


def _choose(args: argparse.Namespace) -> None:
    raise MiCoreError("cache: choose what to do: mi-core cache list, or mi-core cache clear")


def run_list(args: argparse.Namespace) -> None:
    from mi_core.models.weight_cache import cache_root, human_size, list_cache

    cached = list_cache()
    for entry in cached:
        print(f"{human_size(entry.bytes):>10}  {entry.source}  ({entry.folder})")
    total = sum(entry.bytes for entry in cached)
    print(f"{len(cached)} cached model(s), {human_size(total)} in {cache_root()}")


def run_clear(args: argparse.Namespace) -> None:
    from mi_core.models.weight_cache import cache_root, clear_cache, human_size

    print(f"removed {human_size(clear_cache())} from {cache_root()}")
