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
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mi_core.errors import MiCoreError
from mi_core.io import ensure_writable, output_lock

#: Every subcommand: its module under ``mi_core.cli`` and its one-line help, in the order
#: ``mi-core --help`` lists them. The table lets the top-level help (and a command's own
#: parsing) import no subcommand module but the one named: their configs pull in torch.
COMMANDS: dict[str, tuple[str, str]] = {
    "finetune": (
        "finetune",
        "fine-tune a sequence classifier (resumes from the last checkpoint in --out)",
    ),
    "eval": ("eval", "evaluate a classifier on one or more data sets"),
    "means": ("means", "compute mean activations for mean ablation"),
    "ablate": ("ablate", "accuracy with single heads and head sets ablated (Tables 3, 4, 8)"),
    "prune": (
        "prune",
        "find a subnetwork by L0 pruning (hard-concrete masks, Lagrangian sparsity)",
    ),
    "sweep": ("sweep", "one pruning run per (sparsity, seed); skips finished runs"),
    "effective-size": (
        "effective_size",
        "prune every fine-tuning checkpoint at many sparsities; effective size over steps",
    ),
    "heuristic-core": (
        "heuristic_core",
        "fine-tune, prune with many seeds, find the shared core, report (resumable)",
    ),
    "separability": ("separability", "iterative separability pruning (focus vs cripple data set)"),
    "circuit": (
        "circuit",
        "find edge-level circuits (EAP, EAP-IG, exact patching, edge pruning)",
    ),
    "data": ("data", "fetch the data sets into the layout MI_CORE_DATA_DIR expects"),
    "cache": ("cache", "list or clear the processed weights kept of causal LMs"),
}
#: The subcommand modules, in order.
SUBCOMMANDS: tuple[str, ...] = tuple(module for module, _ in COMMANDS.values())


def command_help(command: str) -> str:
    """The one-line help of ``command`` (what ``mi-core --help`` lists)."""
    return COMMANDS[command][1]


#: Arguments that name where results go; each is checked to be writable before a command runs.
OUTPUTS = ("out", "predictions")
#: Arguments that name files a command reads (their ``~`` is expanded as the shell would).
PATHS = ("means", "mask", "checkpoints", "model", "checkpoint", "train")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other mi-core error, and that
    takes no abbreviated flags (with them, ``sweep --seed 3`` would be read as ``--seeds 3``:
    three seeds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("mi-core").strip()
        raise MiCoreError(f"{command}: {message}" if command else message)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every subcommand; with ``only`` (a command name), that one is
    built in full and the others are names with their help, so nothing else is imported."""
    from mi_core import __version__

    parser = _Parser(prog="mi-core", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"mi-core {__version__}")
    subparsers = parser.add_subparsers(dest="command", parser_class=_Parser)
    for command, (name, summary) in COMMANDS.items():
        if only is not None and command != only:
            subparsers.add_parser(command, help=summary, add_help=False)
            continue
        try:
            module = importlib.import_module(f"mi_core.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"mi_core.cli.{name}":
                continue
            raise
        module.add_parser(subparsers)
    return parser


def _command(argv: Sequence[str]) -> str:
    """The subcommand ``argv`` names (its first word that is not an option), or ``""``."""
    return next((a for a in argv if not a.startswith("-")), "")


#: The files of a Hugging Face checkpoint folder (weights, config, tokenizer, GGUF).
_CHECKPOINT_FILE = re.compile(
    r"(config|generation_config|tokenizer|tokenizer_config|special_tokens_map|added_tokens"
    r"|trainer_state)\.json|vocab\.(txt|json)|merges\.txt|tokenizer\.model"
    r"|(model|pytorch_model)([-.][^/]*)?\.(safetensors|bin|json)|[^/]*\.gguf"
)


def _check_outputs_are_not_inputs(args: argparse.Namespace) -> None:
    """Refuse an output that is one of the command's inputs, before any work: ``eval --out``
    naming its ``--data`` file replaced the data, and ``means --out`` inside a model folder could
    replace its ``model.safetensors``. An input is any argument naming an existing file or
    folder; an output may not be that file, that folder, or a checkpoint's own file (weights,
    config, tokenizer) inside an input folder."""
    inputs: set[Path] = set()
    for key, value in vars(args).items():
        if key in OUTPUTS or key == "argv":
            continue
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, str) and item and os.path.exists(item):
                inputs.add(Path(item).resolve())
    for name in OUTPUTS:
        value = getattr(args, name, None)
        if not value:
            continue
        try:
            out = Path(value).expanduser().resolve()
        except (OSError, RuntimeError):  # a link loop: the output check names it
            continue
        clash = next(
            (
                p
                for p in inputs
                if out == p or (out.parent == p and _CHECKPOINT_FILE.fullmatch(out.name))
            ),
            None,
        )
        if clash is not None:
            what = "is" if out == clash else f"is {out.name} inside"
            raise MiCoreError(
                f"--{name} {value} {what} the input {clash}; writing there would replace what "
                "the command reads: give another output path"
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mi-core``: run one subcommand, report bad input as one line."""
    resumes = False
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser(only=_command(argv))
        args = parser.parse_args(argv)
        args.argv = argv
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(levelname)s %(name)s: %(message)s",
        )
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        for name in (*OUTPUTS, *PATHS):  # "~/x" from a config file or --out=~/x: the home
            value = getattr(args, name, None)
            if isinstance(value, str) and value.startswith("~"):
                setattr(args, name, os.path.expanduser(value))
        for name in OUTPUTS:  # an unset $OUT wrote results into the current folder
            if getattr(args, name, None) == "":
                raise MiCoreError(f"--{name} is empty; name the output")
        _check_outputs_are_not_inputs(args)
        for name in OUTPUTS:  # before any work: nothing computed is lost to a bad path
            if getattr(args, name, None):
                # a command writing one file says so (``out_kind``); --predictions is a file
                kind = "file" if name == "predictions" else getattr(args, "out_kind", "auto")
                ensure_writable(getattr(args, name), kind)
        resumes = getattr(args, "resumes", False)
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
        if resumes:
            print("mi-core: interrupted; finished work is kept and a re-run resumes",
                  file=sys.stderr)  # fmt: skip
        else:
            print("mi-core: interrupted; this command keeps no partial results: a re-run "
                  "starts over", file=sys.stderr)  # fmt: skip
        return 130
    return 0


def entry() -> None:
    """The ``mi-core`` program: :func:`main`, then exit with its code. Once the command is
    done, Ctrl-C is ignored: pressed while the interpreter shuts down (torch's exit handlers
    take a moment), it printed a traceback after a finished run."""
    import signal

    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    entry()
