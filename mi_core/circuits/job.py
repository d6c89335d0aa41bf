"""The circuit jobs (``mi-core circuit attribute`` and ``mi-core circuit prune``): a model and a
circuit data set in, edge scores, a circuit, its faithfulness on held-out pairs and figures out.

Both split the pairs into a part that finds the circuit and a held-out part that judges it.
Files written to ``out`` (atomically):

- ``scores.safetensors``: one score per edge (attribution: the estimated metric change,
  read back with :meth:`EdgeScores.load`; pruning: the gates' log_alpha), with the edge names
  in ``edges.json``;
- ``circuit.safetensors``: the circuit as an :class:`~mi_core.interventions.edges.EdgeMask`;
- ``mib.json``: the circuit in the MIB circuit-localisation format, scores in MIB's convention
  (attribution against the loss: negated; edge-pruning gates shifted to be positive);
- ``faithfulness.csv`` (attribution: the curve of the chosen selection, greedy by default)
  and ``summary.json``;
- ``circuit.html``: the circuit as an interactive graph (offline).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from jaxtyping import Float

from mi_core.circuits.attribution import EdgeScores, attribute
from mi_core.circuits.config import (  # noqa: F401 (re-exported)
    AttributeConfig,
    CircuitData,
    CircuitEvaluateConfig,
    CircuitPruneConfig,
    CircuitSweepConfig,
    _edge_prune_settings,
    lm_circuit_data,
)
from mi_core.circuits.evaluate import (
    CircuitScore,
    curve_area,
    curve_difference,
    evaluate_circuit,
    faithfulness_curve,
    mib_scores,
    write_mib,
)
from mi_core.circuits.metrics import get_metric
from mi_core.circuits.prune import STATE_FILE, prune_edges
from mi_core.data.circuit_pairs import PromptPairs, hans_pairs, ioi_pairs
from mi_core.data.mib_tasks import is_mib_spec, mib_pairs
from mi_core.data.pairs import MNLI_LABELS
from mi_core.data.prompt_tasks import load_prompt_task
from mi_core.errors import ConfigError, DataError, TrainingError
from mi_core.interventions.edges import EdgeMask, Graph, sender_means
from mi_core.io import (
    check_replaceable,
    ensure_writable,
    read_json,
    write_csv,
    write_json,
    write_text,
)
from mi_core.pruning.sweeps import run_ray_tasks
from mi_core.viz.circuits import circuit_graph_html

if TYPE_CHECKING:
    from mi_core.circuits.stability import CircuitStability
    from mi_core.models.types import HookedModel

__all__ = [
    "AttributeConfig",
    "CircuitData",
    "CircuitPruneConfig",
    "CircuitSweepConfig",
    "load_circuit_pairs",
    "pair_forward_batches",
    "pair_sender_means",
    "run_attribute_job",
    "run_circuit_prune_job",
    "run_circuit_sweep_job",
]


def load_circuit_pairs(
    model: HookedModel, data: str, n_examples: int, *, data_seed: int = 0
) -> PromptPairs:
    """``n_examples`` pairs of the circuit data ``data`` for ``model``: ``ioi``, an IOI split,
    an MIB task or a prompt file (a language model; prompts generated with ``data_seed``) or
    ``hans-pairs:<subcase>`` (an NLI classifier)."""
    classifier = getattr(model, "task", None) is not None or getattr(model, "is_encoder", False)
    _check_fits(data, getattr(model, "model_name", None) or "the model", classifier)
    if data == "ioi":
        return ioi_pairs(model.tokenizer, n=n_examples, seed=data_seed)
    if is_mib_spec(data):  # MIB's rows and filter (mi_core.data.mib_tasks)
        return mib_pairs(data, model.tokenizer, n_examples, seed=data_seed)
    if lm_circuit_data(data):  # an IOI split or a prompt file (mi_core.data.prompt_tasks)
        task = load_prompt_task(data, n_examples, seed=data_seed, tokenizer=model.tokenizer)
        if not task.has_corrupted:
            raise DataError(
                f"{data}: a circuit needs a corrupted prompt for every example (the "
                "'corrupted' key, token-aligned with the prompt)"
            )
        return task.to_pairs(model.tokenizer)
    subcase = data.removeprefix("hans-pairs:")
    names = list(model.label_names)
    if "entailment" not in [n.lower() for n in names] and model.task == "mnli":
        names = list(MNLI_LABELS)  # generic LABEL_i names: the task's own order
    return hans_pairs(model.tokenizer, subcase, names, n=n_examples)


def _check_fits(data: str, model: str, classifier: bool) -> None:
    """ioi needs a language model and hans-pairs an NLI classifier. Checked from the
    checkpoint's config before the model loads (a minute for a large one), and on the model."""
    if lm_circuit_data(data) and classifier:
        raise DataError(f"{data} is a language-model task; classifiers take hans-pairs:<subcase>")
    if not lm_circuit_data(data) and not classifier:
        raise DataError(
            f"{data} needs an NLI classifier; {model} loads as a language model "
            "(give --task mnli for a classifier checkpoint or a pretrained body)"
        )


def _prepare(config: CircuitData) -> tuple[Any, PromptPairs, PromptPairs, torch.Tensor | None]:
    from mi_core.models import load_model
    from mi_core.models.loading import loads_as_classifier

    _check_fits(config.data, config.model, loads_as_classifier(config.model, config.task))
    model = load_model(config.model, task=config.task, **config.load_options())
    pairs = load_circuit_pairs(model, config.data, config.n_examples, data_seed=config.data_seed)
    pairs = pairs.to(next(model.parameters()).device)
    if len(pairs) < 2:
        raise DataError(f"{config.data} gave {len(pairs)} pair(s); a circuit job needs at least 2")
    find, judge = pairs.split(1.0 - config.held_out)
    means = None
    if config.fill == "mean" and config.means_data is not None:
        means = pair_sender_means(model, Graph.from_model(model), config.means_data,
                                  config.mean_examples, config.batch_size)  # fmt: skip
    elif config.fill == "mean":  # the mean over the finding part's clean inputs, pads left out
        graph = Graph.from_model(model)
        batches = list(find.batches(config.batch_size))
        means = sender_means(
            model, graph, [b.clean for b in batches], masks=[b.attention_mask for b in batches]
        )
    return model, find, judge, means


def pair_sender_means(
    model: HookedModel, graph: Graph, data: str, n_examples: int, batch_size: int = 32,
    max_length: int = 128,
) -> Float[torch.Tensor, "sender d_model"]:  # fmt: skip
    """Each sender's mean output over the first ``n_examples`` pairs of the pair data ``data``
    (e.g. ``mnli:train``: the paper's mean ablation) for the classifier ``model``, with
    whatever intervention is applied to it now."""
    batches = pair_forward_batches(model, data, n_examples, batch_size, max_length)
    return sender_means(model, graph, batches)


def pair_forward_batches(
    model: HookedModel, data: str, n_examples: int, batch_size: int = 32, max_length: int = 128
) -> list[dict[str, torch.Tensor]]:
    """The first ``n_examples`` pairs of ``data`` tokenised for the classifier ``model``, as
    forward keyword arguments on its device (to average over them: :func:`sender_means`)."""
    from mi_core.data import load_pairs, pair_batches
    from mi_core.devices import to_device

    if getattr(model, "task", None) is None:
        raise DataError(
            f"means over {data} need a pair classifier; a language model's mean fill averages "
            "over the finding prompts (leave means_data unset)"
        )
    dataset = load_pairs(data, max_examples=n_examples, task=model.task)
    device = next(model.parameters()).device
    return [
        to_device({k: v for k, v in b.items() if k != "labels"}, device)
        for b in pair_batches(
            dataset, model.tokenizer, batch_size=batch_size, max_length=max_length
        )  # fmt: skip
    ]


#: The files every circuit job writes into its folder; ``summary.json`` marks it finished.
_COMMON_FILES = ("scores.safetensors", "edges.json", "circuit.safetensors", "mib.json",
                 "summary.json", "circuit.html")  # fmt: skip
#: What ``--bootstrap`` adds (a run without it removes an earlier run's, which are not its own).
_BOOTSTRAP_FILES = ("bootstrap.json", "bootstrap.html")
#: What ``--neurons`` adds (removed by a run without it, as the bootstrap's files are).
NEURON_SCORES_FILE = "neuron_scores.safetensors"
_ATTRIBUTE_FILES = (*_COMMON_FILES, "faithfulness.csv", *_BOOTSTRAP_FILES, NEURON_SCORES_FILE)
_PRUNE_FILES = (*_COMMON_FILES, "history.csv", f"state/{STATE_FILE}", "state/log.csv",
                *_BOOTSTRAP_FILES)  # fmt: skip


def _start_writing(out: Path) -> None:
    """Before a job replaces its files: the folder exists and the old ``summary.json`` is gone,
    so a write that fails part-way leaves a folder marked unfinished, not new files beside a
    summary that contradicts them."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)


def short_model_name(spec: str) -> str:
    """A model as a figure's title names it: a hub name or an embedded name as given, a local
    folder by its last part (and its parent's, for a ``checkpoint-N`` folder), never an
    absolute path."""
    path = Path(spec)
    if not (path.is_absolute() or len(path.parts) > 2 or path.exists()):
        return spec
    parts = path.parts[-2:] if path.name.startswith("checkpoint-") else path.parts[-1:]
    return "/".join(parts)


def _write_common(out: Path, scores: EdgeScores, circuit: EdgeMask, summary: dict[str, Any],
                  title: str, curve: list[CircuitScore] | None = None) -> None:  # fmt: skip
    """Scores (attribution scores, or an edge-pruning run's log_alpha with method
    ``edge-pruning``), edge names, the circuit, MIB JSON, the summary and the graph page
    (after :func:`_start_writing`)."""
    graph = scores.graph
    scores.save(out / "scores.safetensors")
    write_json(out / "edges.json", graph.edge_names)
    circuit.save(out / "circuit.safetensors")
    mib = mib_scores(scores.scores, scores.method)  # MIB's sign convention (see mib_scores)
    write_mib(out / "mib.json", graph, mib, circuit, **summary.get("info", {}))
    write_json(out / "summary.json", summary)
    gates = scores.method == "edge-pruning"  # log_alpha: kept or not, no direction
    write_text(out / "circuit.html",
               circuit_graph_html(graph, scores.scores, circuit, title=title,
                                  gates=gates, curve=curve))  # fmt: skip


def _bootstrap_summary(stability: CircuitStability) -> dict[str, Any]:
    return {"percentages": list(stability.percentages), "jaccard": stability.jaccard,
            "n_shared": [len(s) for s in stability.shared]}  # fmt: skip


def _write_bootstrap(out: Path, stability: CircuitStability | None, title: str) -> None:
    """``bootstrap.json`` and ``bootstrap.html`` (after :func:`_start_writing`); without a
    bootstrap, an earlier run's removed (they are not this run's)."""
    if stability is None:
        for name in _BOOTSTRAP_FILES:
            (out / name).unlink(missing_ok=True)
        return
    from mi_core.viz.figures import circuit_stability_figure, write_figure_html

    write_json(out / "bootstrap.json", stability.to_dict())
    figure = circuit_stability_figure(stability.to_dict(), title=title)
    write_figure_html(figure, out / "bootstrap.html")


def _finished_attribution(out: Path, config: AttributeConfig) -> dict[str, Any] | None:
    """The summary of a finished attribution in ``out`` with these settings and every file in
    place (a re-run of it is a no-op, as a finished pruning run's is: an exact-patching run is
    one forward per edge); None when there is something to compute."""
    done = out / "summary.json"
    optional = {**dict.fromkeys(_BOOTSTRAP_FILES, config.bootstrap > 0),
                NEURON_SCORES_FILE: config.neurons}  # fmt: skip
    wanted = [n for n in _ATTRIBUTE_FILES if optional.get(n, True)]
    if not done.is_file() or not all((out / name).is_file() for name in wanted):
        return None
    summary = read_json(done)
    saved = summary.get("config", {})
    now = json.loads(json.dumps(config.to_dict()))  # as summary.json holds it
    if any(saved.get(k) != v for k, v in now.items() if k not in _WHERE_NOT_WHAT):
        return None
    return {**summary, "finished_before": True}  # the flag is the caller's, not the file's


def run_attribute_job(config: AttributeConfig, *, progress: bool = True) -> dict[str, Any]:
    """Score the edges, judge top-k circuits on held-out pairs, write everything to ``out``."""
    out = Path(config.out)
    _check_out(out, config.method, config.to_dict())
    finished = _finished_attribution(out, config)
    if finished is not None:
        return finished
    check_replaceable(out, _ATTRIBUTE_FILES)
    model, find, judge, means = _prepare(config)
    metric = get_metric(config.metric)
    scores: EdgeScores = attribute(
        model, find, config.method, metric, config.steps, config.batch_size, config.fill, means,
        progress=progress, ig_rule=config.ig_rule,
    )  # fmt: skip
    rows = faithfulness_curve(
        model, scores, judge, config.fractions, metric, config.fill, means, config.batch_size,
        progress=progress, selection=config.selection, signed=config.signed,
        connected=config.connected,
    )  # fmt: skip
    k = round(config.circuit_fraction * scores.graph.n_edges)
    circuit = scores.circuit(k, config.fill, config.selection, signed=config.signed,
                             connected=config.connected, means=means)  # fmt: skip
    judged = evaluate_circuit(model, circuit, judge, metric, config.batch_size,
                              (rows[0].full, rows[0].empty, rows[0].gap_se))  # fmt: skip
    summary = {
        "info": {"model": config.model, "data": config.data, "method": config.method},
        "config": config.to_dict(),
        "graph": str(scores.graph),
        "n_find": len(find),
        "n_held_out": len(judge),
        "curve_area": curve_area(rows),
        "curve_difference": curve_difference(rows),
        "circuit": judged.as_dict(),
    }
    stability = None
    if config.bootstrap:
        from mi_core.circuits.stability import circuit_stability

        stability = circuit_stability(
            model, find, config.bootstrap, config.method, seed=config.data_seed,
            absolute=not config.signed, metric=metric, steps=config.steps,
            batch_size=config.batch_size, fill=config.fill, means=means,
            ig_rule=config.ig_rule, progress=progress,
        )  # fmt: skip
        summary["bootstrap"] = _bootstrap_summary(stability)
    neurons = None
    if config.neurons:
        from mi_core.circuits.nodes import neuron_attribution

        neurons = neuron_attribution(
            model, find, config.method, steps=config.steps, ig_rule=config.ig_rule,
            metric=metric, fill=config.fill, means=means, batch_size=config.batch_size,
            progress=progress,
        )  # fmt: skip
    _start_writing(out)
    if neurons is None:
        (out / NEURON_SCORES_FILE).unlink(missing_ok=True)
    else:
        neurons.save(out / NEURON_SCORES_FILE)
    write_csv(out / "faithfulness.csv", pd.DataFrame([r.as_dict() for r in rows]))
    title = f"{config.method} circuit of {short_model_name(config.model)} on {config.data}"
    _write_bootstrap(out, stability, title)
    _write_common(out, scores, circuit, summary, title, curve=rows)
    return summary


#: What ``mi-core circuit evaluate`` writes into its folder (and, at the node level, the
#: node scores it ranked: :data:`NODE_SCORES_FILE`).
MIB_SCORE_FILE = "mib_score.json"
NODE_SCORES_FILE = "node_scores.safetensors"
#: Where ``circuit evaluate --circuits chosen|refined`` writes each metric's circuits (one
#: edge mask per MIB size below 100 %, ``<pct>.safetensors``; ``circuit submit --circuits``).
CIRCUITS_DIR = "circuits"


def run_circuit_evaluate_job(
    config: CircuitEvaluateConfig, *, progress: bool = True
) -> dict[str, Any]:
    """MIB's CPR and CMD of the scores ``config.scores`` at ``config.level`` on the held-out
    pairs (the finding part left out, as the job that scored them held it out), written to
    ``out/mib_score.json``: each ranking's ten faithfulnesses, kept edges, KLs and per-pair
    metrics, and 95 % bootstrap intervals of CPR and CMD over the held-out pairs
    (:meth:`~mi_core.circuits.mib.MIBScore.interval`). At the node
    level the node scores ranked are written too (``node_scores.safetensors``, what ``mi-core
    circuit submit --level node`` reads): an attribution's edge scores summed per node, or a
    pruning sweep's subnetworks (:meth:`~mi_core.circuits.nodes.NodeScores.from_subnetworks`).
    With ``circuits`` chosen or refined, each metric's nine circuits are made on the finding
    pairs (:func:`_mib_circuits_of`) and written to ``out/circuits/<metric>/``."""
    from mi_core.circuits.mib import mib_circuit_files, mib_score
    from mi_core.circuits.nodes import NodeScores, load_scores, scores_at_level

    out = Path(config.out)
    from_sweep = Path(config.scores).is_dir()
    if from_sweep and config.level != "node":
        raise ConfigError(
            f"{config.scores} is a folder: a pruning sweep's subnetworks are scored per node "
            "(--level node)"
        )
    scores = None  # a sweep's subnetworks are read once the model's graph is known
    if not from_sweep:  # a bad file or one of another level: one line, first
        scores = scores_at_level(load_scores(config.scores), config.level, config.scores)
    written = (MIB_SCORE_FILE, NODE_SCORES_FILE) if config.level == "node" else (MIB_SCORE_FILE,)
    check_replaceable(out, written)
    for target in ("cpr", "cmd"):  # a top-n run removes an earlier run's circuits
        ensure_writable(out / CIRCUITS_DIR / target, "folder")
        check_replaceable(out / CIRCUITS_DIR / target, mib_circuit_files(".safetensors"))
    model, find, judge, means = _prepare(config)
    graph = Graph.from_model(model)
    if scores is None:
        scores = NodeScores.from_subnetworks(graph, config.scores)
    if graph != scores.graph:
        raise ConfigError(
            f"{config.scores} scores the edges of {scores.graph}; {config.model} has {graph}"
        )
    rankings = ("signed", "absolute") if config.ranking == "mib" else (config.ranking,)
    made: dict[str, list[EdgeMask]] = {}
    if config.circuits != "top-n":  # for CPR and for CMD, made on the finding pairs
        assert isinstance(scores, EdgeScores)  # validate: level edge
        made = {ranking: _mib_circuits_of(model, scores, find, config, target, means, progress)
                for ranking, target in (("signed", "cpr"), ("absolute", "cmd"))}  # fmt: skip
    judged = {
        ranking: mib_score(model, made.get(ranking, scores), judge, level=config.level,
                           absolute=ranking == "absolute", fill=config.fill, means=means,
                           metric=get_metric(config.metric), batch_size=config.batch_size,
                           progress=progress)
        for ranking in rankings
    }  # fmt: skip
    results = {ranking: score.to_dict() for ranking, score in judged.items()}
    cpr_from, cmd_from = ("signed", "absolute") if config.ranking == "mib" else rankings * 2
    summary = {
        "config": config.to_dict(),
        "graph": str(graph),
        "method": scores.method,
        "level": config.level,
        "circuits": config.circuits,
        "n_held_out": len(judge),
        "cpr": results[cpr_from]["cpr"],
        "cmd": results[cmd_from]["cmd"],
        "interval": {  # how far another draw of as many held-out pairs could move them
            "confidence": 0.95,
            "cpr": judged[cpr_from].interval(0.95)["cpr"],
            "cmd": judged[cmd_from].interval(0.95)["cmd"],
        },
        "rankings": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    if config.level == "node":
        assert isinstance(scores, NodeScores)
        scores.save(out / NODE_SCORES_FILE)
    for ranking, target in (("signed", "cpr"), ("absolute", "cmd")):
        folder = out / CIRCUITS_DIR / target
        if ranking not in made:  # no earlier run's circuits beside these scores
            for name in mib_circuit_files(".safetensors"):
                (folder / name).unlink(missing_ok=True)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for name, circuit in zip(mib_circuit_files(".safetensors"), made[ranking], strict=False):
            circuit.save(folder / name)
    write_json(out / MIB_SCORE_FILE, summary)
    return summary


def _mib_circuits_of(
    model: HookedModel, scores: EdgeScores, find: PromptPairs, config: CircuitEvaluateConfig,
    target: str, means: torch.Tensor | None, progress: bool,
) -> list[EdgeMask]:  # fmt: skip
    """MIB's ten circuits for ``target`` (cpr or cmd) made on the finding pairs: the readings
    of ``scores`` chosen there, refined there with ``circuits`` refined."""
    from mi_core.circuits.mib import select_mib_circuits
    from mi_core.circuits.refine import refine_mib_circuits

    metric = get_metric(config.metric)
    chosen = select_mib_circuits(model, scores, find, target, fill=config.fill, means=means,
                                 metric=metric, batch_size=config.batch_size,
                                 progress=progress)  # fmt: skip
    if config.circuits == "chosen":
        return chosen
    return refine_mib_circuits(model, chosen, find, target, rounds=config.refine_rounds,
                               metric=metric, batch_size=config.batch_size,
                               progress=progress)  # fmt: skip


def run_circuit_prune_job(config: CircuitPruneConfig, *, progress: bool = True) -> dict[str, Any]:
    """Edge-prune on the finding pairs (resumable in ``out``), judge on the held-out ones."""
    _check_finished(config)  # before any work: another job's folder, or other settings
    check_replaceable(config.out, _PRUNE_FILES)
    return _prune_one(config, *_prepare(config), progress=progress)


def run_circuit_sweep_job(config: CircuitSweepConfig, *, progress: bool = True) -> pd.DataFrame:
    """Every (sparsity, seed) run of the sweep: on one loaded model here, or each run a Ray task
    (``config.executor``); finished runs (with their ``summary.json``) are read, not re-run.
    Returns and writes ``out/circuits.csv`` (the finished runs; a run that failed is named in
    the error raised after the others finished)."""
    runs = [config.run_config(s, seed) for s in config.sparsities for seed in config.seeds]
    for run in runs:  # a finished run of other settings is refused, not reported as this one
        _check_finished(run)
    pending = [r for r in runs if not (Path(r.out) / "summary.json").is_file()]
    check_replaceable(config.out, ("circuits.csv",))
    for run in pending:
        check_replaceable(run.out, _PRUNE_FILES)
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


#: Settings that change where or how often a run computes, not what it finds.
_WHERE_NOT_WHAT = frozenset({"device", "out", "checkpoint_every"})


def _check_out(out: str | os.PathLike[str], method: str, now: dict[str, Any]) -> None:
    """Refuse, before any work, an output folder holding another circuit job's results: another
    method's (an attribution over an edge-pruning run mixed the two in one folder), or a finished
    edge-pruning run with other settings (an unfinished one is checked by :func:`prune_edges`
    when it resumes; an attribution of the same method is replaced, as it keeps nothing to
    resume)."""
    folder = Path(out)
    done = folder / "summary.json"
    if not done.is_file():
        if method != "edge-pruning" and (folder / "state").is_dir():
            raise ConfigError(
                f"{folder} holds an unfinished edge-pruning run; use another --out for {method}"
            )
        return
    summary = read_json(done)
    had = summary.get("info", {}).get("method")
    if had is not None and had != method:
        raise ConfigError(
            f"{folder} holds the results of {had}, not {method}; use another --out or delete it"
        )
    if method != "edge-pruning":  # an attribution with other settings replaces it (the same: a
        # no-op, see _finished_attribution)
        return
    saved = summary.get("config")
    if not isinstance(saved, dict):
        raise ConfigError(
            f"{done} records no edge-pruning config; it was not written by mi-core circuit prune: "
            f"use another --out or delete {folder}"
        )
    now = json.loads(json.dumps(now))  # as summary.json holds it (tuples become lists)
    lacks = sorted(k for k in now if k not in _WHERE_NOT_WHAT and k not in saved)
    if lacks:
        raise ConfigError(
            f"{done} is a finished {method} run of an older mi_core (its config has no "
            f"{', '.join(lacks)}): delete {folder} and run it again"
        )
    differ = sorted(k for k in now if k not in _WHERE_NOT_WHAT and saved[k] != now[k])
    if differ:
        raise ConfigError(
            f"{folder} holds a finished {method} run with other settings "
            f"({', '.join(differ)} differ); use another --out or delete it"
        )


def _check_finished(run: CircuitPruneConfig) -> None:
    """:func:`_check_out` for an edge-pruning run."""
    _check_out(run.out, "edge-pruning", run.to_dict())


def _circuit_prune_task(config: dict[str, Any]) -> str:
    """One Ray task of a circuit sweep: the edge-pruning run of ``config`` (resumable)."""
    run = CircuitPruneConfig.from_dict(config)
    run_circuit_prune_job(run, progress=False)
    return run.out


def _prune_one(
    config: CircuitPruneConfig,
    model: HookedModel,
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
    stability = None
    if config.bootstrap:  # one more run per resample, each resumable beside the main one's
        from mi_core.circuits.stability import pruning_stability

        stability = pruning_stability(model, find, config.bootstrap, settings,
                                      seed=config.data_seed, out=out / "state" / "bootstrap",
                                      means=means, progress=progress)  # fmt: skip
    _start_writing(out)
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
    if stability is not None:
        summary["bootstrap"] = _bootstrap_summary(stability)
    write_csv(out / "history.csv", pd.DataFrame(result.history))
    title = f"edge-pruning circuit of {short_model_name(config.model)} on {config.data}"
    _write_bootstrap(out, stability, title)
    gates = EdgeScores(result.circuit.graph, result.log_alpha.detach().float().cpu(),
                       "edge-pruning", len(find))  # fmt: skip
    _write_common(out, gates, result.circuit, summary, title)
    return summary
