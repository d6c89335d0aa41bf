"""The release (#44): ``python -m build`` gives an sdist and a wheel that carry the shipped
configs, and the wheel, installed alone into a fresh virtual environment outside the repository,
runs ``mi-core --version``, ``--help`` and an evaluation on a tiny checkpoint.

The fresh environment borrows torch and the other dependencies from this interpreter's
site-packages through a ``.pth`` file of plain paths: such lines only extend ``sys.path``, so the
``.pth`` files in those folders (among them the editable install's finder, which maps
``mi_core`` to this checkout) are not run, and ``mi_core`` can only come from the wheel.
(``venv --system-site-packages`` would not do: it exposes the base interpreter's
site-packages, not this virtual environment's.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from helpers import REPO

import mi_core
from mi_core.cli import COMMANDS

VERSION = mi_core.__version__
#: What the distributions must carry besides the modules, as paths inside the package.
SHIPPED = sorted(
    [p.relative_to(REPO).as_posix() for p in (REPO / "mi_core" / "configs").rglob("*.json")]
    + ["mi_core/py.typed"]
)
#: The files the build reads besides the package (pyproject.toml, MANIFEST.in, license-files).
BUILD_INPUTS = "pyproject.toml README.md LICENSE MANIFEST.in CHANGELOG.md CITATION.cff".split()
#: A tiny MNLI validation split in the layout MI_CORE_DATA_DIR expects (label as in GLUE).
ROWS = [
    ("A man is playing a guitar on stage.", "A man is performing music.", 0),
    ("A man is playing a guitar on stage.", "The man is asleep at home.", 2),
    ("Two dogs run across a snowy field.", "The dogs are outside.", 0),
    ("Two dogs run across a snowy field.", "The dogs are chasing a ball.", 1),
    ("The committee approved the budget on Monday.", "The budget was rejected.", 2),
    ("The committee approved the budget on Monday.", "The vote was close.", 1),
    ("She bought fresh bread at the market.", "She went shopping.", 0),
    ("She bought fresh bread at the market.", "She baked the bread herself.", 2),
]


def _run(args, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist, and the wheel built from it, of a copy of the sources (the checkout gets no
    build/ or egg-info). Without isolation: the build uses this environment's setuptools
    (the dev extra's), so it needs no index."""
    root = tmp_path_factory.mktemp("build")
    src = root / "src"
    shutil.copytree(
        REPO / "mi_core", src / "mi_core", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    for name in BUILD_INPUTS:
        shutil.copy2(REPO / name, src / name)
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", root / "dist", src], root)
    (sdist,) = (root / "dist").glob("*.tar.gz")
    (wheel,) = (root / "dist").glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory) -> Path:
    """A fresh virtual environment, outside the repository, holding the wheel and nothing else
    of mi_core; its other imports come from this interpreter's site-packages."""
    root = tmp_path_factory.mktemp("venv") / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", root], root.parent)
    python = root / "bin" / "python"
    # Installed before the .pth exists, so that pip sees an empty environment (and never this
    # one's editable mi_core); --no-index: nothing is downloaded.
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps"]
    _run([*pip, "--no-index", "--no-compile", dists["wheel"]], root.parent)
    purelib = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root.parent
    ).stdout.strip()
    outer = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    outer = [p for p in outer if Path(p).is_dir()]
    Path(purelib, "_outer_site_packages.pth").write_text("\n".join(outer) + "\n")
    return root


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The environment of the installed commands: offline, a data folder made here, a cache of
    their own, nothing of this checkout on PYTHONPATH."""
    data = tmp_path_factory.mktemp("data")
    (data / "mnli").mkdir()
    lines = [
        json.dumps({"premise": p, "hypothesis": h, "label": y, "idx": i})
        for i, (p, h, y) in enumerate(ROWS)
    ]
    (data / "mnli" / "validation_matched.jsonl").write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(
        MI_CORE_DATA_DIR=str(data),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        MI_CORE_CACHE_DIR=str(tmp_path_factory.mktemp("cache")),
    )
    return env


def test_the_sdist_and_the_wheel_carry_the_shipped_configs(dists):
    assert dists["wheel"].name == f"mi_core-{VERSION}-py3-none-any.whl"
    assert dists["sdist"].name == f"mi_core-{VERSION}.tar.gz"
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"mi_core-{VERSION}.dist-info/METADATA").decode()
        entry_points = wheel.read(f"mi_core-{VERSION}.dist-info/entry_points.txt").decode()
    assert set(SHIPPED) <= names, set(SHIPPED) - names
    assert f"mi_core-{VERSION}.dist-info/licenses/LICENSE" in names
    assert not any(n.startswith(("tests/", "experiments/", "notebooks/")) for n in names)
    assert "mi-core = mi_core.cli:entry" in entry_points
    fields = re.findall(r"^([\w-]+): (.*)$", metadata.split("\n\n")[0], flags=re.M)
    assert ("Version", VERSION) in fields and ("License-Expression", "MIT") in fields
    assert any(k == "Classifier" for k, _ in fields)
    urls = dict(v.split(", ", 1) for k, v in fields if k == "Project-URL")
    assert urls == _pyproject()["project"]["urls"] and len(urls) == 3
    with tarfile.open(dists["sdist"]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert set(SHIPPED) | {"LICENSE", "CHANGELOG.md", "CITATION.cff", "pyproject.toml"} <= members


def test_the_installed_wheel_is_the_mi_core_that_runs(venv, env, tmp_path):
    """mi_core, its version and its shipped configs come from the wheel in the new
    environment, run from a folder outside the repository."""
    script = (
        "import importlib.metadata as md, json, mi_core\n"
        "from mi_core.methods.heuristic_core.config import load_config, shipped_configs\n"
        "from mi_core.methods.separability.job import load_separability_config, "
        "shipped_separability_configs\n"
        "hc, sep = shipped_configs(), shipped_separability_configs()\n"
        "print(json.dumps({'file': mi_core.__file__, 'version': mi_core.__version__,\n"
        "  'dist': md.version('mi_core'), 'hc': hc, 'sep': sep,\n"
        "  'loaded': [type(load_config(n)).__name__ for n in hc]\n"
        "    + [type(load_separability_config(n)).__name__ for n in sep]}))\n"
    )
    found = json.loads(_run([venv / "bin" / "python", "-c", script], tmp_path, env).stdout)
    assert Path(found["file"]).resolve().is_relative_to(venv.resolve()), found["file"]
    assert found["version"] == found["dist"] == VERSION
    configs = REPO / "mi_core" / "configs"
    assert found["hc"] == sorted(p.stem for p in configs.glob("*.json"))
    assert found["sep"] == sorted(p.stem for p in (configs / "separability").glob("*.json"))
    # every shipped config is read and validated from the installed package
    loaded = ["ExperimentConfig"] * len(found["hc"]) + ["SeparabilityConfig"] * len(found["sep"])
    assert found["loaded"] == loaded and len(loaded) >= 7


def test_mi_core_version_and_help(venv, env, tmp_path):
    mi_core_bin = venv / "bin" / "mi-core"
    assert _run([mi_core_bin, "--version"], tmp_path, env).stdout.strip() == f"mi-core {VERSION}"
    usage = _run([mi_core_bin, "--help"], tmp_path, {**env, "COLUMNS": "250"}).stdout
    assert usage.startswith("usage: mi-core")
    for command, (_, summary) in COMMANDS.items():  # each subcommand with its one-line help
        assert re.search(rf"^\s+{command}\s+{re.escape(summary)}$", usage, re.M), command


def test_mi_core_eval_on_a_tiny_checkpoint(venv, env, tmp_path):
    from mi_core.testing import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint("bert-cls", tmp_path / "tiny")
    out, predictions = tmp_path / "eval.csv", tmp_path / "preds.jsonl"
    argv = ["eval", "--model", checkpoint, "--out", out, "--predictions", predictions]
    argv += "--task mnli --data mnli:validation_matched --device cpu --batch-size 4".split()
    proc = _run([venv / "bin" / "mi-core", *argv], tmp_path, env)
    assert "mnli:validation_matched" in proc.stdout
    table = pd.read_csv(out)
    assert list(table.columns) == ["dataset", "n", "accuracy"]
    assert table["dataset"].tolist() == ["mnli:validation_matched"] and table["n"].tolist() == [8]
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [r["label"] for r in rows] == [y for _, _, y in ROWS]
    assert all(r["prediction"] in (0, 1, 2) and len(r["logits"]) == 3 for r in rows)
    correct = sum(r["prediction"] == r["label"] for r in rows)
    assert table["accuracy"].iloc[0] == pytest.approx(correct / 8)


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python's library from 3.11")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_version_has_one_source_that_the_release_files_repeat():
    """pyproject.toml reads the version from mi_core.__version__; CITATION.cff and the
    changelog's latest release, which cannot read it, say the same."""
    import yaml

    project = _pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "mi_core.__version__"}
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and str(citation["version"]) == VERSION
    assert citation["license"] == project["project"]["license"] == "MIT"
    cited = [ref["authors"][0]["family-names"] for ref in citation["references"]]
    assert cited == ["Bhaskar", "Pochinkov"]
    # the package's URLs are the cited works' addresses, nothing CITATION.cff does not cite
    addresses = {
        ref[k] for ref in citation["references"] for k in ("url", "repository-code") if k in ref
    }
    assert set(project["project"]["urls"].values()) == addresses
    releases = re.findall(r"^## \[(\d[^\]]*)\] - (\S+)$", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert releases[0] == (VERSION, str(citation["date-released"]))
