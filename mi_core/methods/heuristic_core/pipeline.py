"""The heuristic-core experiment as resumable stages under one report directory.

The stages, their inputs, their outputs and the function that runs each are listed once, in
:mod:`~mi_core.methods.heuristic_core.stages`; what they share (the config, the loaded model and
means) is an :class:`~mi_core.methods.heuristic_core.context.ExperimentContext`, and
:func:`mi_core.methods.stages.run_stages` runs them in order.

A stage that finishes writes ``REPORT/stages/<stage>.json`` last (atomically) with a key: a hash
of the settings it depends on and of its upstream stages' keys. A re-run skips every stage whose
done-file holds the same key, so a crash loses at most the stage in flight (and the long stages,
fine-tuning and pruning, resume inside themselves too); changing a setting re-runs the stages
it affects and those after them. Resumable runs (fine-tuning, pruning) refuse other settings
themselves, and new means that differ from the ones pruning runs in the report were computed
from are refused before they replace them (use a new report directory).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mi_core.errors import ConfigError
from mi_core.io import read_json, write_json
from mi_core.methods.heuristic_core.comparison import SubnetworkComparison
from mi_core.methods.heuristic_core.config import ExperimentConfig
from mi_core.methods.heuristic_core.context import ExperimentContext
from mi_core.methods.heuristic_core.layout import STAGES, ExperimentLayout
from mi_core.methods.heuristic_core.results import ExperimentTables
from mi_core.methods.heuristic_core.stages import STAGE_BY_NAME, STAGE_SPECS
from mi_core.methods.stages import StageOutcome, run_stages
from mi_core.pruning.sweeps import SweepResult, load_sweep

__all__ = [
    "STAGES",
    "ExperimentResult",
    "HeuristicCoreExperiment",
    "HeuristicCoreResult",
    "run_heuristic_core",
    "StageOutcome",
    "run_experiment",
]


@dataclass
class ExperimentResult:
    """Where the experiment's outputs are, and what this run did."""

    out: Path
    report_html: Path
    report_md: Path
    stages: list[StageOutcome] = field(default_factory=list)

    @property
    def ran(self) -> list[str]:
        return [s.name for s in self.stages if s.status == "ran"]

    @property
    def skipped(self) -> list[str]:
        return [s.name for s in self.stages if s.status == "skipped"]


def _key(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class HeuristicCoreExperiment(ExperimentContext):
    """Run the stages of one config under ``out`` (see the module docstring): the context the
    stages share, with their keys and done-files.

    ``on_stage(name, status)`` is called when a stage starts (``"start"``) and when it ends
    (``"ran"``, ``"skipped"`` or ``"off"``), e.g. to print progress.
    """

    def __init__(
        self,
        config: ExperimentConfig,
        out: str | os.PathLike[str],
        *,
        progress: bool = True,
        on_stage: Callable[[str, str], None] | None = None,
    ) -> None:
        super().__init__(config, out, progress=progress)
        self.on_stage = on_stage or (lambda name, status: None)
        self._keys: dict[str, str] = {}

    # ------------------------------------------------------------------------- paths / keys
    def done_file(self, stage: str) -> Path:
        """The file ``stage`` writes last when it finishes (its key, seconds, time)."""
        return self.layout.stage_marker(stage)

    def stage_key(self, stage: str) -> str:
        """The key of ``stage``: a hash of its settings and of its upstream stages' keys."""
        if stage in self._keys:
            return self._keys[stage]
        spec = STAGE_BY_NAME.get(stage)
        if spec is None:
            raise ConfigError(f"unknown stage {stage!r}; the stages are {list(STAGES)}")
        parts = (*(self.stage_key(s) for s in spec.inputs), *spec.settings(self.config))
        self._keys[stage] = _key(stage, *parts)
        return self._keys[stage]

    def is_done(self, stage: str) -> bool:
        """True when ``stage`` finished before with the same key."""
        path = self.done_file(stage)
        if not path.is_file():
            return False
        try:
            return read_json(path).get("key") == self.stage_key(stage)
        except (ValueError, OSError):  # a damaged done-file: the stage is not done
            return False

    def _mark_done(self, stage: str, seconds: float) -> None:
        write_json(
            self.done_file(stage),
            {
                "stage": stage,
                "key": self.stage_key(stage),
                "seconds": round(seconds, 2),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            },
        )

    # ------------------------------------------------------------------------------ run
    def run(self) -> ExperimentResult:
        """Run every stage that is not finished yet; return where the report is."""
        self.check_data()
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.layout.config, self.config.to_dict())
        outcomes = run_stages(
            STAGE_SPECS,
            self,
            is_done=self.is_done,
            mark_done=self._mark_done,
            on_stage=self.on_stage,
            enabled=lambda stage: STAGE_BY_NAME[stage].enabled(self.config),
        )
        return ExperimentResult(self.out, self.layout.report_html, self.layout.report_md, outcomes)

    def check_data(self) -> None:
        """Open every data set the config names (one example each), so a typo in a spec fails
        at once instead of after fine-tuning."""
        from mi_core.data import load_pairs
        from mi_core.data.prompt_tasks import check_prompt_spec, is_prompt_spec

        c = self.config
        specs = [c.data.train, *c.data.eval, c.means.data, c.attention.data]
        for spec in dict.fromkeys(s for s in specs if s):
            if is_prompt_spec(spec):  # prompts are drawn with the model's tokenizer
                check_prompt_spec(spec)
            else:
                load_pairs(spec, max_examples=1, task=c.task)


def run_experiment(
    config: ExperimentConfig | str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    progress: bool = True,
    on_stage: Callable[[str, str], None] | None = None,
) -> ExperimentResult:
    """Run (or finish) the heuristic-core experiment of ``config`` (an :class:`ExperimentConfig`,
    a config file or a shipped config's name) under ``out``."""
    if not isinstance(config, ExperimentConfig):
        from mi_core.methods.heuristic_core.config import load_config

        config = load_config(config)
    return HeuristicCoreExperiment(config, out, progress=progress, on_stage=on_stage).run()


@dataclass
class HeuristicCoreResult:
    """The experiment's results, in memory: the subnetworks, their comparison (the core), the
    attention classes, the ablation table, effective size, the findings and the report."""

    sweep: SweepResult
    comparison: SubnetworkComparison
    findings: pd.DataFrame
    """One row per finding of the paper: what it says, what this run measured, the verdict."""
    report_html: str
    report_md: str
    attention_classes: pd.DataFrame | None = None
    ablation: pd.DataFrame | None = None
    effective_size: pd.DataFrame | None = None
    stages: list[StageOutcome] = field(default_factory=list)
    out: Path | None = None
    """The report directory, or None when the run kept nothing on disk."""

    @property
    def core(self) -> list[str]:
        """The heuristic core: heads every subnetwork keeps."""
        return self.comparison.core

    @classmethod
    def load(cls, out: str | os.PathLike[str]) -> HeuristicCoreResult:
        """Read a finished experiment's results from its report directory."""
        layout = ExperimentLayout(out)
        if not layout.report_html.is_file():
            raise ConfigError(f"{layout.root} holds no finished heuristic-core experiment")

        tables = ExperimentTables.load(layout.root)
        return cls(
            sweep=load_sweep(layout.sweep),
            comparison=tables.comparison or SubnetworkComparison.load(layout.analysis),
            findings=pd.DataFrame() if tables.findings is None else tables.findings,
            report_html=layout.report_html.read_text(encoding="utf-8"),
            report_md=layout.report_md.read_text(encoding="utf-8"),
            attention_classes=tables.attention_classes,
            ablation=tables.ablation,
            effective_size=tables.effective_size,
            out=layout.root,
        )


def run_heuristic_core(
    config: ExperimentConfig | str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    progress: bool = True,
    on_stage: Callable[[str, str], None] | None = None,
) -> HeuristicCoreResult:
    """Run the heuristic-core experiment of ``config``; return its results in memory.

    With ``out`` the stages keep their files there (the report directory of
    ``mi-core heuristic-core``) and a re-run skips finished stages; without it nothing is left
    on disk (the stages exchange their files in a temporary folder that is removed).
    """
    if out is not None:
        outcome = run_experiment(config, out, progress=progress, on_stage=on_stage)
        result = HeuristicCoreResult.load(out)
        result.stages = outcome.stages
        return result
    with tempfile.TemporaryDirectory(prefix="mi_core-heuristic-core-") as folder:
        outcome = run_experiment(config, folder, progress=progress, on_stage=on_stage)
        result = HeuristicCoreResult.load(folder)
    result.stages, result.out = outcome.stages, None
    return result
