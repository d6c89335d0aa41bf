"""The mi-core command: subnetwork analysis and separability of capabilities on TransformerLens.

Each subcommand lives in its own module under ``mi_core.cli`` and exposes
``add_parser(subparsers)`` (which registers the subcommand and sets ``func``) and a ``run(args)``
that only composes library functions. Bad input raises :class:`mi_core.errors.MiCoreError`;
:func:`main` prints its message as one line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
from collections.abc import Sequence

from mi_core.errors import MiCoreError
from mi_core.io import ensure_writable, output_lock

#: Subcommand modules, in the order ``mi-core --help`` lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "finetune",
    "eval",
    "means",
    "ablate",
    "prune",
    "sweep",
    "effective_size",
    "heuristic_core",
    "separability",
    "circuit",
)


#: Arguments that name where results go; each is checked to be writable before a command runs.
OUTPUTS = ("out", "predictions")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other mi-core error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("mi-core").strip()
        raise MiCoreError(f"{command}: {message}" if command else message)


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every subcommand that is installed."""
    from mi_core import __version__

    parser = _Parser(prog="mi-core", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"mi-core {__version__}")
    subparsers = parser.add_subparsers(dest="command", parser_class=_Parser)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"mi_core.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"mi_core.cli.{name}":
                continue
            raise
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mi-core``: run one subcommand, report bad input as one line."""
    try:
        parser = build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(argv)
        args.argv = argv
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(levelname)s %(name)s: %(message)s",
        )
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        for name in OUTPUTS:  # before any work: nothing computed is lost to a bad path
            if getattr(args, name, None):
                ensure_writable(getattr(args, name))
        with output_lock(args.out) if getattr(args, "out", None) else contextlib.nullcontext():
            args.func(args)
    except OSError as exc:  # a file-system fault during the work: one line, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"mi-core: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except MiCoreError as exc:
        message = " ".join(str(exc).split())
        print(f"mi-core: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mi-core: interrupted; finished work is kept and a re-run resumes", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
