"""The heuristic-core experiment as resumable stages under one report directory.

The stages, their inputs and outputs are listed once, in
:mod:`~mi_core.methods.heuristic_core.stages`.

A stage that finishes writes ``REPORT/stages/<stage>.json`` last (atomically) with a key: a hash
of the settings it depends on and of its upstream stages' keys. A re-run skips every stage whose
done-file holds the same key, so a crash loses at most the stage in flight (and the long stages,
fine-tuning and pruning, resume inside themselves too); changing a setting re-runs the stages
it affects and those after them. Resumable runs (fine-tuning, pruning) refuse other settings
themselves, and new means that differ from the ones pruning runs in the report were computed
from are refused before they replace them (use a new report directory).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from mi_core.errors import ConfigError, MiCoreError
from mi_core.io import read_json, write_json
from mi_core.methods.heuristic_core.comparison import SubnetworkComparison
from mi_core.methods.heuristic_core.config import ExperimentConfig
from mi_core.methods.heuristic_core.layout import ExperimentLayout
from mi_core.methods.heuristic_core.results import ExperimentTables
from mi_core.methods.heuristic_core.stages import STAGE_BY_NAME, STAGE_SPECS, STAGES
from mi_core.pruning.sweeps import SweepResult, load_sweep

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

logger = logging.getLogger(__name__)

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
class StageOutcome:
    """What happened to one stage in this run."""

    name: str
    status: str
    """``"ran"``, ``"skipped"`` (finished before, same key) or ``"off"`` (not part of this
    experiment)."""
    seconds: float = 0.0


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


class HeuristicCoreExperiment:
    """Run the stages of one config under ``out`` (see the module docstring).

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
        self.config = config
        self.out = Path(out)
        self.layout = ExperimentLayout(self.out)
        self.progress = progress
        self.on_stage = on_stage or (lambda name, status: None)
        self.device = str(config.torch_device())
        self._model: Any = None
        self._means: Any = None
        self._eval_sets: list[Any] | None = None
        self._keys: dict[str, str] = {}

    # ------------------------------------------------------------------------- paths / keys
    def done_file(self, stage: str) -> Path:
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

    # ---------------------------------------------------------------------------- inputs
    @property
    def model_path(self) -> str:
        """The fine-tuned model: the given checkpoint or the fine-tuning run's last one."""
        if self.config.checkpoint is not None:
            return self.config.checkpoint
        from mi_core.training.checkpoints import list_checkpoints

        found = list_checkpoints(self.layout.finetune)
        if not found:
            raise ConfigError(f"no checkpoint in {self.layout.finetune}; run the finetune stage")
        return str(found[-1][1])

    @property
    def model(self) -> Any:
        if self._model is None:
            from mi_core.models import load_model

            self._model = load_model(self.model_path, task=self.config.task, device=self.device)
        return self._model

    @property
    def means_path(self) -> Path:
        if self.config.means.path is not None:
            return Path(self.config.means.path)
        return self.layout.means

    @property
    def means(self) -> Any:
        if self._means is None:
            from mi_core.interventions import load_means

            self._means = load_means(self.means_path, self.model)
        return self._means

    @property
    def train_cap(self) -> int | None:
        return self.config.pruning.max_train_examples or self.config.data.max_train_examples

    @property
    def eval_cap(self) -> int | None:
        return self.config.pruning.max_eval_examples or self.config.data.max_eval_examples

    @property
    def eval_sets(self) -> list[Any]:
        """The evaluation sets (capped as for pruning), in-domain first."""
        if self._eval_sets is None:
            from mi_core.data import load_pairs

            self._eval_sets = [
                load_pairs(spec, max_examples=self.eval_cap, task=self.config.task)
                for spec in self.config.data.eval
            ]
        return self._eval_sets

    # ------------------------------------------------------------------------------ run
    def run(self) -> ExperimentResult:
        """Run every stage that is not finished yet; return where the report is."""
        self.check_data()
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.layout.config, self.config.to_dict())
        outcomes = []
        for spec in STAGE_SPECS:
            stage = spec.name
            if not spec.enabled(self.config):
                outcomes.append(StageOutcome(stage, "off"))
                self.on_stage(stage, "off")
                continue
            if self.is_done(stage):
                logger.info("stage %s: finished before, skipped", stage)
                outcomes.append(StageOutcome(stage, "skipped"))
                self.on_stage(stage, "skipped")
                continue
            self.on_stage(stage, "start")
            logger.info("stage %s: running", stage)
            started = time.perf_counter()
            getattr(self, spec.run)()
            seconds = time.perf_counter() - started
            self._mark_done(stage, seconds)
            outcomes.append(StageOutcome(stage, "ran", seconds))
            self.on_stage(stage, "ran")
        return ExperimentResult(self.out, self.layout.report_html, self.layout.report_md, outcomes)

    def check_data(self) -> None:
        """Open every data set the config names (one example each), so a typo in a spec fails
        at once instead of after fine-tuning."""
        from mi_core.data import load_pairs

        c = self.config
        specs = [c.data.train, *c.data.eval, c.means.data, c.attention.data]
        for spec in dict.fromkeys(s for s in specs if s):
            load_pairs(spec, max_examples=1, task=c.task)

    # --------------------------------------------------------------------------- stages
    def _run_finetune(self) -> None:
        from mi_core.training import FinetuneConfig, finetune

        c, ft = self.config, self.config.finetune
        assert ft is not None and c.model is not None
        finetune(
            FinetuneConfig(
                **dataclasses.asdict(ft),
                model=c.model,
                task=c.task,
                train=c.data.train,
                out=str(self.layout.finetune),
                eval=list(c.data.eval),
                device=self.device,
            ).replace(
                max_eval_examples=ft.max_eval_examples or c.data.max_eval_examples,
                max_train_examples=ft.max_train_examples or c.data.max_train_examples,
            ),
            progress=self.progress,
        )

    def _run_means(self) -> None:
        from mi_core.data import load_pairs, pair_batches
        from mi_core.interventions import compute_means

        m = self.config.means
        spec = m.data or self.config.data.train
        dataset = load_pairs(
            spec,
            max_examples=m.max_examples or self.config.data.max_train_examples,
            task=self.config.task,
        )
        batches = pair_batches(
            dataset, self.model.tokenizer, batch_size=m.batch_size, max_length=m.max_length
        )
        means = compute_means(self.model, batches, dataset=dataset.name, progress=self.progress)
        self._check_means_unchanged(means)
        means.save(self.means_path)
        self._means = None

    def _check_means_unchanged(self, means: Any) -> None:
        """Refuse new means that differ from the saved ones while pruning runs computed from
        those are in the report (finished or not): replacing them would leave the runs refusing
        the new means, or a report mixing the two. The same means (e.g. the stage re-ran after
        an evaluation setting changed) pass."""
        from mi_core.interventions import load_means
        from mi_core.models.fingerprint import tensor_fingerprint

        runs = [p for d in ("sweep", "grid") for p in (self.out / d).glob("s*/seed*/config.json")]
        if not runs or not self.means_path.is_file():
            return
        try:
            old = load_means(self.means_path)
        except MiCoreError:  # damaged: nothing to keep (the runs check the new ones)
            return
        same = old.fingerprint == means.fingerprint and all(
            tensor_fingerprint(getattr(old, f)) == tensor_fingerprint(getattr(means, f))
            for f in ("z", "mlp_out")
        )
        if not same:
            raise ConfigError(
                f"{self.out}: the means would change (their settings or the model changed) while "
                f"pruning runs computed from {self.means_path.name} are in the report, e.g. "
                f"{runs[0].parent}; use a new --out, or the same settings"
            )

    def _run_sweep(self) -> None:
        p = self.config.pruning
        self._prune_grid(self.layout.sweep, p.sparsities, p.seeds)

    def _prune_grid(
        self,
        out: Path,
        sparsities: list[float],
        seeds: list[int],
        model: HookedModel = None,
        means: Path | None = None,
    ) -> None:
        """Prune at every sparsity x seed with the config's pruning: the fine-tuned model and
        its means, or ``model`` (a loaded model, or a checkpoint path for Ray) and ``means``."""
        from mi_core.pruning.sweeps import run_sweep

        p, ray = self.config.pruning, self.config.pruning.executor == "ray"
        if model is None:
            model = self.model_path if ray else self.model
        run_sweep(
            model,
            self.config.data.train,
            out,
            sparsities,
            seeds,
            means=str(means or self.means_path),
            eval_sets=list(self.config.data.eval),
            profile=p.profile,
            overrides=p.overrides,
            task=self.config.task,
            max_train_examples=self.train_cap,
            max_eval_examples=self.eval_cap,
            progress=self.progress,
            device=self.config.device,
            **p.execution(),
        )

    def load_sweep(self):
        """The sweep's finished runs of this config's sparsities and seeds."""

        p = self.config.pruning
        return load_sweep(self.layout.sweep, sparsities=p.sparsities, seeds=p.seeds)

    def _run_analysis(self) -> None:
        from mi_core.methods.heuristic_core.comparison import compare_subnetworks, write_comparison

        results = self.load_sweep()
        write_comparison(results, compare_subnetworks(results), self.layout.analysis)

    def chosen_heads(self) -> tuple[list[str], str]:
        """The heads to inspect and why: ``(heads, "config" | "core" | "most frequent")``."""

        from mi_core.methods.heuristic_core.attention import choose_heads

        comparison = SubnetworkComparison.load(self.layout.analysis)
        core = comparison.core
        a = self.config.attention
        heads = choose_heads(core, comparison.frequency, a.heads, a.max_heads)
        reason = "config" if a.heads else ("core" if core else "most frequent")
        return heads, reason

    def _attention_data(self):
        from mi_core.data import load_pairs

        a, c = self.config.attention, self.config
        ood = c.data.out_of_domain_sets
        spec = a.data or (ood[0] if ood else c.data.eval[0])
        return load_pairs(spec, max_examples=a.max_examples, task=c.task)

    def _run_attention(self) -> None:
        from mi_core.io import write_csv
        from mi_core.methods.heuristic_core.attention import (
            attention_classes,
            attention_views,
            write_views,
        )

        a = self.config.attention
        heads, reason = self.chosen_heads()
        dataset = self._attention_data()
        table = attention_classes(
            self.model,
            dataset,
            heads,
            batch_size=a.batch_size,
            threshold=a.threshold,
            min_excess=a.min_excess,
        )
        table.insert(1, "chosen_as", reason)
        write_csv(self.layout.attention_classes, table)
        views = attention_views(self.model, dataset, heads, a.n_views)
        write_views(views, self.layout.attention)

    def _run_ablation(self) -> None:
        from mi_core.methods.heuristic_core.ablation import run_core_ablation

        heads, reason = self.chosen_heads()
        b = self.config.ablation
        cap = b.max_examples or self.config.data.max_eval_examples
        if cap != self.eval_cap:
            from mi_core.data import load_pairs

            datasets = [
                load_pairs(spec, max_examples=cap, task=self.config.task)
                for spec in self.config.data.eval
            ]
        else:
            datasets = self.eval_sets
        run_core_ablation(
            self.model,
            datasets,
            heads,
            b.joint_sets,
            means=self.means if b.ablation == "mean" else None,
            ablation=b.ablation,
            others=b.others,
            batch_size=b.batch_size,
            out=self.layout.ablation,
            heads_chosen_as=reason,
            progress=self.progress,
        )

    def _run_effective_size(self) -> None:
        from mi_core.methods.heuristic_core.effective_size import run_effective_size

        c, es = self.config, self.config.effective_size
        run_effective_size(
            es.checkpoints_dir or self.layout.finetune,
            c.data.train,
            list(c.data.eval),
            self.layout.effective_size,
            es.sparsities,
            es.seeds,
            ood_sets=c.ood_sets,
            margin=es.margin,
            method=es.method,
            profile=es.profile or c.pruning.profile,
            overrides=c.pruning.overrides if es.overrides is None else es.overrides,
            task=c.task,
            steps=es.steps,
            max_checkpoints=es.max_checkpoints,
            max_train_examples=self.train_cap,
            max_eval_examples=self.eval_cap,
            device=c.device,  # resolved where each run executes (a Ray task: on its machine)
            **c.pruning.execution(),
            progress=self.progress,
            groups=es.groups,
        )

    def _run_grid(self) -> None:
        """Figure 4: the fine-tuned model pruned at every sparsity x seed of the grid."""
        g = self.config.grid
        self._prune_grid(self.layout.grid, g.sparsities, g.seeds)

    def _run_core_before(self) -> None:
        """Prune the last checkpoint before the out-of-domain accuracy rises; compare cores."""
        import pandas as pd
        import torch

        from mi_core.analysis.generalisation import pre_generalisation_checkpoint
        from mi_core.analysis.subnetworks import core_heads
        from mi_core.methods.heuristic_core.effective_size import (
            compute_checkpoint_means,
            dataset_name,
        )
        from mi_core.models import load_model
        from mi_core.training.checkpoints import list_checkpoints

        c, p = self.config, self.config.pruning
        out = self.layout.core_before
        metrics = pd.read_csv(self.layout.finetune_metrics)
        names = {spec: dataset_name(spec, task=c.task) for spec in c.ood_sets}
        saved = dict(list_checkpoints(self.layout.finetune))
        found = pre_generalisation_checkpoint(
            metrics, list(names.values()), sorted(saved), c.core_before.margin
        )
        summary: dict[str, Any] = {**found, "ood_sets": list(names.values())}
        summary["final_core"] = SubnetworkComparison.load(self.layout.analysis).core
        step = found["checkpoint_step"]
        if step is not None:
            # one folder per checkpoint: a rule or margin that picks another checkpoint starts
            # afresh there, and finished runs of the same checkpoint are kept
            where = out / f"checkpoint-{step}"
            model = load_model(saved[step], task=c.task, device=self.device)
            means = where / "means.safetensors"
            if not means.is_file():
                where.mkdir(parents=True, exist_ok=True)
                compute_checkpoint_means(model, c.data.train, means, self.train_cap)
            ray = p.executor == "ray"
            self._prune_grid(
                where / "sweep", p.sparsities, p.seeds, str(saved[step]) if ray else model, means
            )
            results = load_sweep(where / "sweep", sparsities=p.sparsities, seeds=p.seeds)
            # a subnetwork that removed nothing (gates that never moved) holds every head
            # trivially: left out of the core, as the findings leave it out of agreement
            pruned = (results.runs["n_removed"].astype(int) > 0).tolist()
            masks = results.head_masks()  # in the order of results.runs
            kept = masks[torch.tensor(pruned, dtype=torch.bool)]
            core = core_heads(kept) if len(kept) else []
            summary.update(
                core=core,
                n_subnetworks=int(kept.shape[0]),
                n_left_out=int(masks.shape[0] - kept.shape[0]),
                run_folder=str(where.relative_to(self.out)),
                final_core_present=[h for h in summary["final_core"] if h in core],
            )
        write_json(self.layout.core_before_summary, summary)

    def _run_core_edges(self) -> None:
        """Edge scores touching the core heads, with the best and worst generalising
        subnetworks applied (mean-ablated), on HANS minimal pairs; per subnetwork, its metric
        and its empty circuit's, so the report can say when the fill does not move it."""
        import pandas as pd

        from mi_core.circuits import (
            Graph,
            attribute,
            circuit_baselines,
            edges_touching,
            gap_is_small,
            sender_means,
        )
        from mi_core.circuits.job import CircuitData, load_circuit_pairs, pair_forward_batches
        from mi_core.interventions import Subnetwork, apply
        from mi_core.io import write_csv
        from mi_core.methods.heuristic_core.effective_size import dataset_name

        e = self.config.core_edges
        heads, reason = self.chosen_heads()
        results = self.load_sweep()
        # the config's out-of-domain sets (not MNLI mismatched, which is in-domain)
        c = self.config
        named = {dataset_name(spec, task=c.task) for spec in c.data.out_of_domain_sets}
        ood = [n for n in results.eval_names if n in named] or results.eval_names
        runs = results.runs.assign(
            ood_accuracy=results.runs[[f"acc_{n}" for n in ood]].mean(axis=1)
        ).reset_index(drop=True)
        order = runs.sort_values("ood_accuracy", ascending=False, kind="stable").index.tolist()
        chosen = [(i, "generalising") for i in order[: e.per_group]]
        chosen += [(i, "not generalising") for i in order[::-1][: e.per_group] if i not in
                   order[: e.per_group]]  # fmt: skip
        spec = CircuitData(model="-", data=e.data, n_examples=max(2, e.n_examples), out="-")
        pairs = load_circuit_pairs(self.model, spec).to(next(self.model.parameters()).device)
        graph = Graph.from_model(self.model)
        mean_batches = []  # the training pairs the means are taken over, tokenised once
        if e.fill == "mean":
            m = self.config.means
            data = m.data or self.config.data.train
            mean_batches = pair_forward_batches(self.model, data, e.mean_examples,
                                                e.batch_size, m.max_length)  # fmt: skip
        tables, gaps = [], []
        for index, group in chosen:
            row = runs.iloc[index]
            subnetwork = Subnetwork(results.masks[index], "mean", self.means)
            with apply(self.model, subnetwork):
                # each subnetwork's own means: the masked model's senders
                means = sender_means(self.model, graph, mean_batches) if mean_batches else None
                scores = attribute(self.model, pairs, e.method, steps=e.steps,
                                   batch_size=e.batch_size, fill=e.fill, means=means,
                                   progress=False, ig_rule=e.ig_rule)  # fmt: skip
                full, empty, se = circuit_baselines(self.model, graph, e.fill, means, pairs,
                                                    batch_size=e.batch_size)  # fmt: skip
            gaps.append({"subnetwork": row["subnetwork"], "fill": e.fill, "full": full,
                         "empty": empty, "gap_se": se,
                         "small_gap": gap_is_small(full, empty, se)})  # fmt: skip
            table = edges_touching(scores, heads)
            table.insert(0, "ood_accuracy", float(row["ood_accuracy"]))
            table.insert(0, "group", group)
            table.insert(0, "subnetwork", row["subnetwork"])
            tables.append(table)
        edges = pd.concat(tables, ignore_index=True)
        edges.insert(3, "heads_chosen_as", reason)
        summary = (
            edges.assign(abs_score=edges["score"].abs())
            .groupby(["subnetwork", "group", "ood_accuracy", "direction"], sort=False)["abs_score"]
            .sum()
            .reset_index()
            .merge(pd.DataFrame(gaps), on="subnetwork", how="left")
        )
        self.layout.core_edges.mkdir(parents=True, exist_ok=True)
        write_csv(self.layout.core_edges_table, edges)
        write_csv(self.layout.core_edges_summary, summary)

    def _run_report(self) -> None:
        from mi_core.methods.heuristic_core.report import write_report

        write_report(self.out)


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
