"""The circuit jobs (``mi-core circuit attribute`` and ``mi-core circuit prune``): a model and a
circuit data set in, edge scores, a circuit, its faithfulness on held-out pairs and figures out.

Both split the pairs into a part that finds the circuit and a held-out part that judges it.
Files written to ``out`` (atomically):

- ``scores.safetensors``: one score per edge (attribution: the estimated metric change;
  pruning: the gates' log_alpha), with the edge names in ``edges.json``;
- ``circuit.safetensors``: the circuit as an :class:`~mi_core.interventions.edges.EdgeMask`;
- ``mib.json``: the circuit in the MIB circuit-localisation format;
- ``faithfulness.csv`` (attribution: the top-k curve) and ``summary.json``;
- ``circuit.html``: the circuit as an interactive graph (offline).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from mi_core.circuits.attribution import ATTRIBUTION_METHODS, SELECTIONS, EdgeScores, attribute
from mi_core.circuits.evaluate import (
    CURVE_FRACTIONS,
    curve_area,
    evaluate_circuit,
    faithfulness_curve,
    write_mib,
)
from mi_core.circuits.metrics import METRICS, get_metric
from mi_core.circuits.prune import EdgePruneSettings, prune_edges
from mi_core.config import option
from mi_core.data.circuit_pairs import PromptPairs, hans_pairs, ioi_pairs
from mi_core.data.pairs import MNLI_LABELS
from mi_core.devices import DeviceOption
from mi_core.errors import ConfigError, DataError, TrainingError
from mi_core.interventions.edges import FILLS, EdgeMask, Graph, sender_means
from mi_core.io import read_json, write_csv, write_json, write_safetensors, write_text
from mi_core.pruning.jobs import EXECUTION_FIELDS, SweepExecution
from mi_core.pruning.profiles import parse_seed_spec, parse_sparsity_spec
from mi_core.pruning.sweep import check_ray_gpus, run_dir_for, run_ray_tasks
from mi_core.tasks import TASKS
from mi_core.viz.circuits import circuit_graph_html

__all__ = [
    "AttributeConfig",
    "CircuitData",
    "CircuitPruneConfig",
    "CircuitSweepConfig",
    "load_circuit_pairs",
    "run_attribute_job",
    "run_circuit_prune_job",
    "run_circuit_sweep_job",
]


def _parse_fractions(value: Any, where: str) -> tuple[float, ...]:
    if isinstance(value, str):
        try:
            value = [float(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"{where}: fractions are numbers separated by commas") from None
    return tuple(float(v) for v in value)


@dataclass(kw_only=True)
class CircuitData(DeviceOption):
    """Which model and which clean / corrupted pairs a circuit job works on."""

    model: str
    """Checkpoint dir, hub name, minilm or smollm2."""
    task: str | None = option(None, choices=TASKS)
    """Task head to load for a classifier (default: the checkpoint's own)."""
    data: str = "ioi"
    """Circuit data: ioi (language models) or hans-pairs:<subcase> (NLI classifiers)."""
    n_examples: int = 128
    """Pairs in all (found on the first part, judged on the held-out rest)."""
    held_out: float = 0.5
    """Fraction of the pairs held out to judge the circuit."""
    data_seed: int = 0
    """Seed of the generated prompts (ioi)."""
    metric: str = option("logit-diff", choices=tuple(METRICS))
    """What the circuit must preserve: the answer's logit minus the distractor's."""
    fill: str = option("corrupted", choices=FILLS)
    """What a removed edge carries: the corrupted run's activation, the mean, or zero."""
    batch_size: int = 16
    """Examples per forward pass."""
    out: str
    """Output folder."""

    def validate(self) -> None:
        super().validate()
        if self.n_examples < 2:
            raise ConfigError(f"n_examples must be at least 2, not {self.n_examples}")
        if not 0.0 < self.held_out < 1.0:
            raise ConfigError(f"held_out must lie strictly between 0 and 1, not {self.held_out}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, not {self.batch_size}")
        if self.data != "ioi" and not self.data.startswith("hans-pairs:"):
            raise ConfigError(
                f"unknown circuit data {self.data!r}; expected ioi or hans-pairs:<subcase>"
            )


@dataclass(kw_only=True)
class AttributeConfig(CircuitData):
    """``mi-core circuit attribute``: score every edge, judge the top-k circuits."""

    method: str = option("eap-ig", choices=ATTRIBUTION_METHODS)
    """eap (1 backward pass), eap-ig (integrated gradients) or exact (one forward per edge)."""
    steps: int = 5
    """EAP-IG interpolation steps."""
    fractions: tuple[float, ...] = option(CURVE_FRACTIONS, parse=_parse_fractions)
    """Fractions of edges kept along the faithfulness curve (comma separated)."""
    circuit_fraction: float = 0.05
    """Fraction of edges in the circuit written to circuit.safetensors and mib.json."""
    selection: str = option("greedy", choices=SELECTIONS)
    """How circuits are chosen from the scores: greedy (connected to the output) or top-k."""

    def validate(self) -> None:
        super().validate()
        if self.steps < 1:
            raise ConfigError(f"steps must be at least 1, not {self.steps}")
        if not 0.0 < self.circuit_fraction <= 1.0:
            raise ConfigError(f"circuit_fraction must lie in (0, 1], not {self.circuit_fraction}")
        if not self.fractions or any(not 0.0 <= f <= 1.0 for f in self.fractions):
            raise ConfigError(f"fractions must lie in [0, 1], got {list(self.fractions)}")


@dataclass(kw_only=True)
class CircuitPruneConfig(EdgePruneSettings, CircuitData):
    """``mi-core circuit prune``: learn an edge circuit by edge pruning (resumable)."""


@dataclass(kw_only=True)
class CircuitSweepConfig(EdgePruneSettings, CircuitData, SweepExecution):
    """``mi-core circuit sweep``: one edge-pruning run per (sparsity, seed), in
    ``out/s{sparsity}/seed{seed}`` (the layout of ``mi-core sweep``); finished runs are skipped,
    an interrupted one resumes. ``sparsity`` and ``seed`` are taken from the lists. Runs execute
    here one after another (``executor`` local) or each as a Ray task (ray)."""

    sparsity: float = option(0.95, cli=False)
    """Set per run from ``sparsities``."""
    seed: int = option(0, cli=False)
    """Set per run from ``seeds``."""
    sparsities: list[float] = option(parse=parse_sparsity_spec, metavar="SPEC")
    """Target edge sparsities, e.g. 0.9,0.95 or 0.9:0.98:0.02."""
    seeds: list[int] = option(parse=parse_seed_spec, metavar="SPEC")
    """Seeds: 1-3 or 1,2,5 name them; a bare count N means seeds 0 to N-1."""

    def validate(self) -> None:
        super().validate()
        if not self.sparsities or not self.seeds:
            raise ConfigError("a circuit sweep needs at least one sparsity and one seed")
        if self.executor == "batched" or self.group_size not in (None, 1):
            raise ConfigError(
                "a circuit sweep runs one run per task (executor local or ray); edge pruning has "
                "no batched groups"
            )
        check_ray_gpus(self.executor, self.device, self.num_gpus_per_run)
        for sparsity in self.sparsities:  # every run's recipe is valid before any runs
            _edge_prune_settings(self, sparsity=sparsity)

    def run_config(self, sparsity: float, seed: int) -> CircuitPruneConfig:
        """The config of one run of the sweep."""
        sweep_only = ("sparsities", "seeds", *EXECUTION_FIELDS)
        values = {k: v for k, v in self.to_dict().items() if k not in sweep_only}
        out = run_dir_for(self.out, sparsity, seed)
        return CircuitPruneConfig.from_dict({**values, "sparsity": sparsity, "seed": seed,
                                             "out": str(out)})  # fmt: skip


def _edge_prune_settings(config: EdgePruneSettings, **changes: Any) -> EdgePruneSettings:
    """The edge-pruning recipe of a job config, as a plain :class:`EdgePruneSettings`."""
    values = {f.name: getattr(config, f.name) for f in fields(EdgePruneSettings)}
    return EdgePruneSettings(**{**values, **changes})


def load_circuit_pairs(model: Any, config: CircuitData) -> PromptPairs:
    """The pairs of ``config.data`` for ``model``."""
    if config.data == "ioi":
        if getattr(model, "task", None) is not None or getattr(model, "is_encoder", False):
            raise DataError("ioi is a language-model task; classifiers take hans-pairs:<subcase>")
        return ioi_pairs(model.tokenizer, n=config.n_examples, seed=config.data_seed)
    subcase = config.data.removeprefix("hans-pairs:")
    if getattr(model, "task", None) is None:
        raise DataError(f"{config.data} needs an NLI classifier (load the model with a task)")
    names = list(model.label_names)
    if "entailment" not in [n.lower() for n in names] and model.task == "mnli":
        names = list(MNLI_LABELS)  # generic LABEL_i names: the task's own order
    return hans_pairs(model.tokenizer, subcase, names, n=config.n_examples)


def _prepare(config: CircuitData) -> tuple[Any, PromptPairs, PromptPairs, torch.Tensor | None]:
    from mi_core.models import load_model

    model = load_model(config.model, task=config.task, device=str(config.torch_device()))
    pairs = load_circuit_pairs(model, config).to(next(model.parameters()).device)
    if len(pairs) < 2:
        raise DataError(f"{config.data} gave {len(pairs)} pair(s); a circuit job needs at least 2")
    find, judge = pairs.split(1.0 - config.held_out)
    means = None
    if config.fill == "mean":  # the mean over the finding part's clean inputs, pads left out
        graph = Graph.from_model(model)
        batches = list(find.batches(config.batch_size))
        means = sender_means(
            model, graph, [b.clean for b in batches], masks=[b.attention_mask for b in batches]
        )
    return model, find, judge, means


def _write_common(out: Path, graph: Graph, scores: torch.Tensor, circuit: EdgeMask,
                  summary: dict[str, Any], title: str) -> None:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "scores.safetensors", {"scores": scores}, {"graph": str(graph)})
    write_json(out / "edges.json", graph.edge_names)
    circuit.save(out / "circuit.safetensors")
    write_mib(out / "mib.json", graph, scores, circuit, **summary.get("info", {}))
    write_json(out / "summary.json", summary)
    write_text(out / "circuit.html", circuit_graph_html(graph, scores, circuit, title=title))


def run_attribute_job(config: AttributeConfig, *, progress: bool = True) -> dict[str, Any]:
    """Score the edges, judge top-k circuits on held-out pairs, write everything to ``out``."""
    out = Path(config.out)
    model, find, judge, means = _prepare(config)
    metric = get_metric(config.metric)
    scores: EdgeScores = attribute(
        model, find, config.method, metric, config.steps, config.batch_size, config.fill, means,
        progress=progress,
    )  # fmt: skip
    rows = faithfulness_curve(
        model, scores, judge, config.fractions, metric, config.fill, means, config.batch_size,
        progress=progress, selection=config.selection,
    )  # fmt: skip
    k = round(config.circuit_fraction * scores.graph.n_edges)
    circuit = scores.circuit(k, config.fill, config.selection, means=means)
    judged = evaluate_circuit(model, circuit, judge, metric, config.batch_size,
                              (rows[0].full, rows[0].empty))  # fmt: skip
    summary = {
        "info": {"model": config.model, "data": config.data, "method": config.method},
        "config": config.to_dict(),
        "graph": str(scores.graph),
        "n_find": len(find),
        "n_held_out": len(judge),
        "curve_area": curve_area(rows),
        "circuit": judged.as_dict(),
    }
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "faithfulness.csv", pd.DataFrame([r.as_dict() for r in rows]))
    title = f"{config.method} circuit of {config.model} on {config.data}"
    _write_common(out, scores.graph, scores.scores, circuit, summary, title)
    return summary


def run_circuit_prune_job(config: CircuitPruneConfig, *, progress: bool = True) -> dict[str, Any]:
    """Edge-prune on the finding pairs (resumable in ``out``), judge on the held-out ones."""
    return _prune_one(config, *_prepare(config), progress=progress)


def run_circuit_sweep_job(config: CircuitSweepConfig, *, progress: bool = True) -> pd.DataFrame:
    """Every (sparsity, seed) run of the sweep: on one loaded model here, or each run a Ray task
    (``config.executor``); finished runs (with their ``summary.json``) are read, not re-run.
    Returns and writes ``out/circuits.csv`` (the finished runs; a run that failed is named in
    the error raised after the others finished)."""
    runs = [config.run_config(s, seed) for s in config.sparsities for seed in config.seeds]
    pending = [r for r in runs if not (Path(r.out) / "summary.json").is_file()]
    failures: list[str] = []
    if pending and config.executor == "ray":
        payloads = [{"config": r.to_dict()} for r in pending]
        failures = run_ray_tasks(_circuit_prune_task, payloads, config.ray_address,
                                 config.num_cpus_per_run, config.num_gpus_per_run)  # fmt: skip
    elif pending:
        model, find, judge, means = _prepare(config)
        for run in pending:
            _prune_one(run, model, find, judge, means, progress=progress)
    rows = []
    for run in runs:
        done = Path(run.out) / "summary.json"
        if done.is_file():
            rows.append({"sparsity": run.sparsity, "seed": run.seed,
                         **read_json(done)["circuit"], "run_dir": run.out})  # fmt: skip
    table = pd.DataFrame(rows)
    write_csv(Path(config.out) / "circuits.csv", table)
    if len(rows) < len(runs):
        first = failures[0] if failures else "?"
        raise TrainingError(
            f"{len(runs) - len(rows)} of {len(runs)} circuit runs did not finish (first: "
            f"{first}); circuits.csv lists the finished ones; re-run the sweep to retry the rest"
        )
    return table


def _circuit_prune_task(config: dict[str, Any]) -> str:
    """One Ray task of a circuit sweep: the edge-pruning run of ``config`` (resumable)."""
    run = CircuitPruneConfig.from_dict(config)
    run_circuit_prune_job(run, progress=False)
    return run.out


def _prune_one(
    config: CircuitPruneConfig,
    model: Any,
    find: PromptPairs,
    judge: PromptPairs,
    means: torch.Tensor | None,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    out = Path(config.out)
    settings = _edge_prune_settings(config)
    result = prune_edges(model, find, settings, out / "state", means=means, progress=progress)
    judged = evaluate_circuit(model, result.circuit, judge, get_metric(config.metric),
                              config.batch_size)  # fmt: skip
    summary = {
        "info": {"model": config.model, "data": config.data, "method": "edge-pruning"},
        "config": config.to_dict(),
        "graph": str(result.circuit.graph),
        "n_find": len(find),
        "n_held_out": len(judge),
        "sparsity": result.sparsity,
        "circuit": judged.as_dict(),
    }
    if result.nodes is not None:  # node masks: the nodes the circuit may use
        summary["nodes"] = result.nodes
    write_csv(out / "history.csv", pd.DataFrame(result.history))
    title = f"edge-pruning circuit of {config.model} on {config.data}"
    _write_common(out, result.circuit.graph, result.log_alpha, result.circuit, summary, title)
    return summary
