"""Every ``mi-core`` command in README.md parses, as written, into a valid job config."""

from __future__ import annotations

import importlib
import re
import shlex

import pytest
from helpers import REPO

from mi_core.cli import SUBCOMMANDS, build_parser


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith("mi-core ") and "..." not in line:
                commands.append(re.sub(r"\s*\[[^\]]*\]", "", line))  # optional parts
    return commands


COMMANDS = _readme_commands()


def test_the_readme_shows_every_subcommand():
    shown = {shlex.split(c)[1] for c in COMMANDS}
    assert {name.replace("_", "-") for name in SUBCOMMANDS} <= shown | {"eval"}
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("command", COMMANDS, ids=[c.split()[1] for c in COMMANDS])
def test_a_readme_command_parses_into_its_config(command):
    argv = shlex.split(command)[1:]
    args = build_parser().parse_args(argv)
    module = importlib.import_module(f"mi_core.cli.{argv[0].replace('-', '_')}")
    if hasattr(module, "config_from_args"):
        config = module.config_from_args(args)
        assert config.to_dict()  # built and validated, every flag as written
    elif argv[0] == "cache":  # no job config: the command runs what it names
        assert args.func.__name__ == f"run_{argv[1]}"
    else:  # heuristic-core: a config file or a shipped config's name
        from mi_core.methods.heuristic_core import load_config

        assert load_config(args.config).pruning.sparsities
