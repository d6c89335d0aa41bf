"""MIB's circuit-localisation submission folder, written from any mi_core method's edge scores.

MIB's evaluator (``run_evaluation.py``, and the leaderboard's, which runs it on each task and
model folder of a submission) reads ``<method>_<ablation>_<level>/<task>_<model>/`` (the task
with dashes, ``arithmetic-addition``; the model one of MIB's ids, ``gpt2``, ``qwen2.5``,
``gemma2``, ``llama3``) holding either one importance file, ``importances.json`` (EAP-IG's
``Graph.to_json`` format: every node and edge by its MIB name with a score and ``in_graph``)
or ``importances.pt`` (``Graph.to_pt``'s: ``[sender, receiver]`` score and membership
matrices), or one binary circuit per size, MIB's percentages below 100 % (``0.001.json`` ...
``0.5.json``; MIB re-ranks an importance file itself at every size, so that is what most
methods hand in). Scores are written in MIB's sign (:func:`mib_scores`: its attribution scores
are against the loss; edge-pruning gates shifted positive), so MIB's signed and absolute
rankings rank them as mi_core's :func:`~mi_core.circuits.mib.mib_score` does. At the node level
the files also hold a score per node (JSON: each node's ``score``, none for an unscored node,
which MIB keeps in every circuit; pt: ``nodes_scores``, NaN for it), from node scores or an
attribution's edge scores summed per node (:class:`~mi_core.circuits.nodes.NodeScores`), and
the nine circuits are MIB's node-level ones: the edges among the top nodes. At the neuron level
each node also has its output dimensions' scores and which of them are in (``neurons_in_graph``
and ``neurons_scores``), from ``mi-core circuit attribute --neurons``, in a ``.pt`` file only:
MIB's ``Graph.from_json`` reads a head's neurons with ``forward_index(node)``, which is the slice
of the head's whole layer, so every head of a layer would get the last one's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from mi_core.circuits.attribution import EdgeScores
from mi_core.circuits.config import CircuitSubmitConfig
from mi_core.circuits.evaluate import mib_scores, to_mib
from mi_core.circuits.mib import MIB_PERCENTAGES, mib_circuit_files, mib_circuits
from mi_core.circuits.nodes import NodeScores, load_scores, scores_at_level
from mi_core.errors import ConfigError
from mi_core.interventions.edges import EdgeMask, Graph, to_mib_name
from mi_core.io import atomic_path, check_replaceable, write_json

__all__ = ["mib_pt", "run_circuit_submit_job", "submission_folder"]


def submission_folder(config: CircuitSubmitConfig) -> Path:
    """Where the task and model's files go: ``out/<method>_<ablation>_<level>/<task>_<model>``."""
    stub = f"{config.method}_{config.ablation}_{config.level}"
    return Path(config.out) / stub / f"{config.task.replace('_', '-')}_{config.model_name}"


def _node_names(graph: Graph) -> tuple[list[str], list[str]]:
    """The senders' and the receivers' MIB names, in the graph's (and MIB's) order."""
    senders = [to_mib_name(f"{s}->output").split("->")[0] for s in graph.senders]
    receivers = [to_mib_name(f"input->{r}").split("->")[1] for r in graph.receivers]
    return senders, receivers


def mib_pt(
    graph: Graph, scores: torch.Tensor, kept: torch.Tensor | None = None,
    node_scores: torch.Tensor | None = None, neurons: torch.Tensor | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``Graph.to_pt``'s dictionary: ``scores`` (MIB's sign) and the kept edges (all: an
    importance file) as ``[sender, receiver]`` matrices, the nodes some kept edge leaves, and
    ``node_scores`` (MIB's sign, NaN unscored) when given: per node, or per output dimension
    with the ``neurons`` kept (all unless given)."""
    kept = torch.ones(graph.n_edges, dtype=torch.bool) if kept is None else kept.bool()
    senders, receivers = _node_names(graph)
    in_graph = graph.to_dense(kept)
    d = {
        "cfg": {"n_layers": graph.n_layers, "n_heads": graph.n_heads,
                "parallel_attn_mlp": graph.parallel, "d_model": graph.d_model},
        "src_nodes": senders,
        "dst_nodes": receivers,
        "edges_scores": graph.to_dense(scores.float()),
        "edges_in_graph": in_graph,
        "nodes_in_graph": in_graph.any(dim=1),
    }  # fmt: skip
    if node_scores is not None and node_scores.ndim == 2:
        d["neurons_scores"] = node_scores.float()
        d["neurons_in_graph"] = (
            torch.ones(node_scores.shape, dtype=torch.bool) if neurons is None else neurons.bool()
        )
    elif node_scores is not None:
        d["nodes_scores"] = node_scores.float()
    return d


def _write(
    path: Path, graph: Graph, scores: torch.Tensor, kept: torch.Tensor | None,
    node_scores: torch.Tensor | None, neurons: torch.Tensor | None = None,
) -> None:  # fmt: skip
    if path.suffix == ".json":
        circuit = None if kept is None else EdgeMask(graph, kept.float())
        write_json(path, to_mib(graph, scores, circuit, node_scores))
        return
    with atomic_path(path) as temporary:
        torch.save(mib_pt(graph, scores, kept, node_scores, neurons), temporary)


#: The fill of a circuit under each of MIB's ablation names.
_FILL_OF_ABLATION = {"patching": "corrupted", "mean": "mean", "zero": "zero"}


def _given_circuits(folder: str, graph: Graph, ablation: str) -> list[torch.Tensor]:
    """The kept edges of the nine circuits in ``folder`` (``<pct>.safetensors`` edge masks,
    what ``circuit evaluate --circuits chosen|refined`` writes), checked against the sizes, the
    graph and the submission's ablation."""
    kept = []
    sizes = [p for p in MIB_PERCENTAGES if p < 1]
    for pct, name in zip(sizes, mib_circuit_files(".safetensors"), strict=True):
        path = Path(folder) / name
        if not path.is_file():
            raise ConfigError(
                f"{folder} has no circuit {path.name}: --circuits takes the folder "
                "circuit evaluate --circuits chosen|refined wrote (OUT/circuits/cpr)"
            )
        mask = EdgeMask.load(path)
        if mask.graph != graph:
            raise ConfigError(f"{path} is a circuit of {mask.graph}; the scores are of {graph}")
        if mask.fill != _FILL_OF_ABLATION[ablation]:
            raise ConfigError(
                f"{path} is a circuit made under the {mask.fill} fill; the "
                f"submission's ablation {ablation} needs {_FILL_OF_ABLATION[ablation]}"
            )
        circuit = mask.weights > 0.5
        if int(circuit.sum()) > int(pct * graph.n_edges):
            raise ConfigError(f"{path} keeps {int(circuit.sum())} edges, over MIB's "
                              f"{int(pct * graph.n_edges)} at {pct:g}")  # fmt: skip
        kept.append(circuit)
    return kept


def run_circuit_submit_job(config: CircuitSubmitConfig) -> dict[str, Any]:
    """Write the submission files of ``config.scores`` (see the module docstring); returns
    what was written."""
    loaded = load_scores(config.scores)  # a missing or foreign file: one line, first
    scores = scores_at_level(loaded, config.level, config.scores)
    folder = submission_folder(config)
    suffix = f".{config.file_format}"
    if config.form == "importances":
        names = [f"importances{suffix}"]
    else:
        names = mib_circuit_files(suffix)
    check_replaceable(folder, names)
    graph = scores.graph
    given = None
    if config.circuits is not None:
        given = _given_circuits(config.circuits, graph, config.ablation)
    if isinstance(loaded, EdgeScores):
        ranked = mib_scores(loaded.scores, loaded.method)
    else:  # node scores alone: MIB's file needs edge scores, and reads none at these levels
        ranked = torch.zeros(graph.n_edges, dtype=torch.float64)
    nodes = scores.ranked() if isinstance(scores, NodeScores) else None
    folder.mkdir(parents=True, exist_ok=True)
    if config.form == "importances":
        _write(folder / names[0], graph, ranked, None, nodes)
    else:
        sizes = [p for p in MIB_PERCENTAGES if p < 1]
        circuits = given or mib_circuits(scores, config.ranking == "absolute", sizes, config.level)
        for name, kept in zip(names, circuits, strict=True):
            if config.level == "neuron":  # the edges of the nodes with a dimension kept
                _write(folder / name, graph, ranked, graph.node_edges(kept.any(1)), nodes, kept)
            else:
                _write(folder / name, graph, ranked, kept, nodes)
    return {"folder": os.fspath(folder), "files": names, "method": scores.method,
            "graph": str(graph), "level": config.level}  # fmt: skip
