"""The command-line options the MiniLM / MNLI benchmarks share."""

from __future__ import annotations

import argparse


def mnli_parser(
    doc: str | None, examples: int = 1000, batch_size: int = 64
) -> argparse.ArgumentParser:
    """A parser with ``--model``, ``--data``, ``--examples`` and ``--batch-size`` (the script's
    first docstring line as its description); the script adds its own options."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", default="mnli:validation_matched")
    parser.add_argument("--examples", type=int, default=examples)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    return parser
