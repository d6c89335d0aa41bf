"""The everyday surface: file modes, the command line's one-line errors, forward's keywords."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest
import torch

from mi_core import __version__
from mi_core.cli import main
from mi_core.io import write_json, write_text


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_results_are_written_with_the_users_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = write_json(tmp_path / "out" / "metrics.json", {"a": 1})
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
        write_text(tmp_path / "text.md", "x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE(path.stat().st_mode)
    assert mode == 0o666 & ~umask == stat.S_IMODE(plain.stat().st_mode)
    assert stat.S_IMODE((tmp_path / "text.md").stat().st_mode) == mode
    assert not list(tmp_path.glob("**/.*.tmp"))  # no temporary file left behind


def test_json_results_are_strict_json(tmp_path):
    import json

    path = write_json(tmp_path / "s.json", {"a": float("nan"), "b": [1.5, float("inf")], "c": 2})
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    assert json.loads(path.read_text()) == {"a": None, "b": [1.5, None], "c": 2}


def test_a_failed_write_names_the_file_asked_for_not_the_temporary_one(tmp_path):
    (tmp_path / "results.csv").mkdir()  # a folder where the file goes
    with pytest.raises(IsADirectoryError) as info:
        write_text(tmp_path / "results.csv", "x")
    assert info.value.filename == str(tmp_path / "results.csv")
    assert not list(tmp_path.glob(".*.tmp"))  # and no temporary file is left
    (tmp_path / "gone").mkdir()
    with pytest.raises(FileNotFoundError) as info:  # the temporary file cannot be made
        real_mkstemp = tempfile.mkstemp

        def vanishing(dir, prefix, suffix):  # noqa: A002
            (tmp_path / "gone").rmdir()
            return real_mkstemp(dir=dir, prefix=prefix, suffix=suffix)

        tempfile.mkstemp = vanishing
        try:
            write_text(tmp_path / "gone" / "out.json", "x")
        finally:
            tempfile.mkstemp = real_mkstemp
    assert info.value.filename == str(tmp_path / "gone" / "out.json")


def test_version_and_one_line_errors_with_the_prefix_once(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"mi-core {__version__}"
    assert main(["prune", "--model", "m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mi-core: error: prune: ")
    assert err[0].count("mi-core") == 1 and "Traceback" not in err[0]


def test_top_level_help_imports_no_subcommand_and_no_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from mi_core.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('mi_core.cli.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)  # fmt: skip
    assert "sweep" in done.stdout and "heuristic-core" in done.stdout  # every command listed
    assert done.stdout.strip().splitlines()[-1] == "[]"  # nothing heavy imported


def test_every_command_help_imports_no_heavy_module():
    """``mi-core <command> --help`` answers without torch, pandas, numpy or TransformerLens
    (job configs live in light modules; the packages export their names lazily)."""

    code = (
        "import contextlib, io, sys\n"
        "from mi_core.cli import COMMANDS, main\n"
        "for command in COMMANDS:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n            main([command, '--help'])\n"
        "        except SystemExit:\n            pass\n"
        "    assert '--' in out.getvalue(), command  # the help was printed, with its flags\n"
    )
    assert _heavy_modules_after(code)[-1] == "[]"


def test_a_command_builds_only_its_own_parser():
    import sys

    from mi_core.cli import COMMANDS, build_parser

    parser = build_parser(only="eval")
    assert "mi_core.cli.eval" in sys.modules
    args = parser.parse_args(["eval", "--model", "m", "--data", "hans:so_swap", "--out", "r.csv"])
    assert args.command == "eval" and args.model == "m"
    listed = parser._subparsers._group_actions[0].choices  # every command is still a choice
    assert list(listed) == list(COMMANDS)


def test_classifier_forward_refuses_unknown_keywords(tiny):
    ids = torch.tensor([[101, 2023, 2003, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    logits = tiny(ids, attention_mask=mask)
    with pytest.raises(TypeError, match="'atention_mask' \\(did you mean 'attention_mask'\\?\\)"):
        tiny(ids, atention_mask=mask)
    # the keys of an mi_core batch pass through, so model(**batch) keeps working
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0]), "index": 0}
    assert torch.equal(tiny(**batch), logits)
    ones = torch.ones_like(mask)  # the mask matters: a wrong one would show
    assert not torch.equal(tiny(ids, attention_mask=ones), logits)
    assert torch.equal(tiny(ids), logits)  # ids alone: the mask is rebuilt from the pad id
    assert tiny(ids, attention_mask=mask, return_type=None) is None
    with pytest.raises(ValueError, match="return_type"):
        tiny(ids, return_type="loss")


def test_an_exported_function_wins_over_its_module_of_the_same_name():
    """Lazy packages keep what eager imports gave: ``mi_core.pruning.reference_logits`` is the
    function even after its module (of the same name) was imported."""
    import importlib

    import mi_core.pruning
    import mi_core.training

    module = importlib.import_module("mi_core.pruning.reference_logits")
    from mi_core.pruning import reference_logits
    from mi_core.training import finetune

    assert callable(reference_logits) and reference_logits is module.reference_logits
    assert mi_core.pruning.reference_logits is reference_logits
    assert callable(finetune) and mi_core.training.finetune is finetune


def test_building_a_sweep_config_imports_no_heavy_module():
    """Validating a circuit sweep's config imported the pruning sweep (torch, TransformerLens)
    for its Ray GPU check."""

    code = (
        "import sys\n"
        "from mi_core.circuits.config import CircuitSweepConfig\n"
        "from mi_core.errors import ConfigError\n"
        "base = {'model': 'm', 'out': 'o', 'sparsities': [0.9], 'seeds': '1-2'}\n"
        "CircuitSweepConfig.from_dict(base, source='t')\n"
        "try:\n"
        "    CircuitSweepConfig.from_dict({**base, 'executor': 'ray', 'device': 'cuda'}, "
        "source='t')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    refused, imported = _heavy_modules_after(code)[-2:]
    assert "needs --num-gpus-per-run > 0" in refused
    assert imported == "[]"


def _heavy_modules_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter, then print the heavy modules it imported; the
    output's lines (the last: that list)."""
    import subprocess
    import sys

    probe = (
        "\nimport sys\n"
        "heavy = ('torch', 'pandas', 'numpy', 'transformer_lens', 'transformers', 'scipy')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code + probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()
