"""Edge pruning (Bhaskar, Wettig, Friedman and Chen 2024): hard-concrete masks over every edge.

Each edge gets a hard-concrete gate (:mod:`mi_core.pruning.hard_concrete`); a step samples
the gates, runs the model with those edge weights (removed edges fed the corrupted run's
activation, the mean or zero; :class:`~mi_core.interventions.edges.EdgeMask`), and descends on

    KL(full model || masked model) + lambda1 (t - s) + lambda2 (t - s)^2

(or another objective of :mod:`mi_core.pruning.objectives` that compares answer logits,
``EdgePruneSettings.objective``: ``logit_diff``) with ``t`` the sampled edge sparsity
(``1 - sum(z) / n_edges``, as the authors' code measures it), ``s`` the target ramped linearly
over ``sparsity_warmup_steps``, and the lambdas ascended (the Lagrangian controller of
:mod:`mi_core.pruning.lagrangian`). The defaults are the authors' IOI recipe
(``princeton-nlp/Edge-Pruning``, ``run_scripts/ioi_sweep.sh``): log_alpha from N(10, 0.01),
AdamW (weight decay 0.01) with learning rate 0.8 for the gates and the lambdas, warmed up over
200 steps and decayed linearly to 0, 3,000 steps of 32 with the target reached at step 2,500.
The circuit is then discretised *exactly*: the ``round((1 - s) * n_edges)`` edges of highest
log_alpha are kept.

**Node masks** (``node_sparsity``, the authors' node loss): every sender (the input
embedding, each head, each MLP) gets a gate of its own too; an edge carries its sender's
output with weight ``z_edge * z_node`` (the corrupted / mean / zero value otherwise), and a
second Lagrangian term with its own lambdas pulls the sampled node sparsity to its target
(ramped over the same steps). At discretisation the ``round((1 - node_sparsity) * n_senders)``
nodes of highest log_alpha are kept first, then the edges of highest log_alpha among those
leaving a kept node (all of them, if fewer than the edge target leaves). The authors' IOI runs
keep the node masks but switch their loss off; without ``node_sparsity`` there are none.

With ``out`` the run saves its state (gates, lambdas, optimizer moments, step)
every ``checkpoint_every`` steps and resumes from there; random draws and the data order are
functions of (seed, step), so a resumed run takes the same steps as one never stopped. A state
of an older mi_core (one that records fewer settings or inputs) is refused, not resumed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from mi_core.buffers import reusing_buffers
from mi_core.circuits.config import EdgePruneSettings
from mi_core.circuits.metrics import answer_logits, metric_logits
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError, InterventionError, TrainingError
from mi_core.interventions.edges import EdgeMask, Graph, graph_switches
from mi_core.interventions.edges._engine import masked_hooks, record_corrupted
from mi_core.io import write_json
from mi_core.models.fingerprint import tensor_fingerprint, weights_fingerprint
from mi_core.models.frozen import frozen
from mi_core.models.hook_context import hooked
from mi_core.pruning.checkpoint import checkpoint_info, load_checkpoint, save_checkpoint
from mi_core.pruning.hard_concrete import sample_hard_concrete
from mi_core.pruning.lagrangian import LagrangianController, pruning_optimizer, sampled_sparsity
from mi_core.pruning.objectives import answer_objective
from mi_core.pruning.schedule import lr_factor, target_sparsity_at
from mi_core.seeding import derive_seed

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["EdgePruneResult", "EdgePruneSettings", "discretize_circuit", "prune_edges"]

STATE_FILE = "edge_prune_state.safetensors"
PROGRESS_FILE = "edge_prune_state.json"


@dataclass
class EdgePruneResult:
    """The pruned circuit, its gates and the run's trace."""

    circuit: EdgeMask
    log_alpha: Float[torch.Tensor, " edge"]
    history: list[dict[str, float]]
    node_log_alpha: Float[torch.Tensor, " sender"] | None = None
    """The node gates' log_alpha (with node masks)."""
    nodes: list[str] | None = None
    """The nodes kept (with node masks): sender names, ``input``, ``L0.H3``, ``L1.MLP``."""

    @property
    def sparsity(self) -> float:
        return self.circuit.sparsity


def _batch_indices(n: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """The examples of ``step``: consecutive slices of a per-epoch permutation."""
    per_epoch = max(1, n // batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = torch.randperm(
        n, generator=torch.Generator().manual_seed(derive_seed("circuit", "order", seed, epoch))
    )
    if batch_size >= n:
        return order
    return order[offset * batch_size : (offset + 1) * batch_size]


def discretize_circuit(
    graph: Graph,
    log_alpha: Float[torch.Tensor, " edge"],
    sparsity: float,
    node_log_alpha: Float[torch.Tensor, " sender"] | None = None,
    node_sparsity: float | None = None,
) -> tuple[Float[torch.Tensor, " edge"], list[str] | None]:
    """0/1 edge weights keeping ``round((1 - sparsity) * n_edges)`` edges of highest log_alpha;
    with node gates, only among the edges leaving the ``round((1 - node_sparsity) *
    n_senders)`` nodes of highest node log_alpha (which are returned by name)."""
    keep = round((1.0 - sparsity) * graph.n_edges)
    candidates = torch.ones(graph.n_edges, dtype=torch.bool)
    nodes = None
    if node_log_alpha is not None and node_sparsity is not None:
        n_nodes = round((1.0 - node_sparsity) * graph.n_senders)
        order = torch.argsort(node_log_alpha.detach().cpu().float(), descending=True, stable=True)
        kept_nodes = torch.zeros(graph.n_senders, dtype=torch.bool)
        kept_nodes[order[:n_nodes]] = True
        candidates = kept_nodes[graph.edges[:, 0]]
        nodes = [graph.senders[i] for i in sorted(order[:n_nodes].tolist())]
    key = log_alpha.detach().cpu().float().masked_fill(~candidates, float("-inf"))
    keep = min(keep, int(candidates.sum()))
    weights = torch.zeros(graph.n_edges)
    weights[torch.argsort(key, descending=True, stable=True)[:keep]] = 1.0
    return weights, nodes


def _inputs_key(
    model: HookedModel, pairs: PromptPairs, means: torch.Tensor | None
) -> dict[str, str | None]:
    """What a run learns from besides its settings: the model's weights, the pairs and the mean
    fill's means."""
    ids = torch.stack([pairs.clean_ids, pairs.corrupted_ids])
    return {"model": weights_fingerprint(model), "pairs": tensor_fingerprint(ids),
            "means": None if means is None else tensor_fingerprint(means)}  # fmt: skip


#: Settings that change how often a run saves, not what it learns.
_NOT_LEARNT = frozenset({"checkpoint_every"})


def _save_state(folder: Path, step: int, params, optimizer, history, config, inputs) -> None:
    """The run's state as every mask-learning run's checkpoint
    (:func:`~mi_core.pruning.checkpoint.save_checkpoint`: one atomic file holding the gates,
    the optimiser, the step and the history, with the settings and inputs it must match);
    ``edge_prune_state.json`` repeats the progress for reading."""
    info = {"config": config.to_dict(), "inputs": inputs}
    save_checkpoint(folder / STATE_FILE, step, params, optimizer, history, info=info)
    write_json(folder / PROGRESS_FILE, {"step": step, **info, "history": history})


def _has_state(folder: Path) -> bool:
    """Whether ``folder`` holds a state to resume."""
    return (folder / STATE_FILE).exists()


def _older_state(folder: Path, lacks: str) -> ConfigError:
    """The one line refusing a state of an older mi_core, which recorded no ``lacks``."""
    return ConfigError(
        f"{folder / STATE_FILE} is an edge-pruning state of an older mi_core (it records no "
        f"{lacks}): delete {folder} and run the edge pruning again"
    )


def _read_progress(folder: Path) -> dict[str, Any]:
    """The state's progress: step, settings, inputs and history (never the JSON beside it)."""
    try:
        info = checkpoint_info(folder / STATE_FILE)
    except TrainingError:
        raise _older_state(folder, "progress") from None
    if "config" not in info or "inputs" not in info:
        raise _older_state(folder, "progress")
    return {"step": info["step"], "config": info["config"], "inputs": info["inputs"],
            "history": info["log"]}  # fmt: skip


def _load_state(folder: Path, params, optimizer, config, inputs) -> tuple[int, list]:
    progress = _read_progress(folder)
    saved, now = progress["config"], config.to_dict()
    saved_inputs = progress["inputs"]
    lacks = [k for k in sorted(now) if k not in _NOT_LEARNT and k not in saved]
    lacks += [f"{k} fingerprint" for k in sorted(inputs) if k not in saved_inputs]
    if lacks:
        raise _older_state(folder, ", ".join(lacks))
    differ = sorted(
        k for k in set(saved) | set(now) if k not in _NOT_LEARNT and saved.get(k) != now.get(k)
    )
    differ += [f"the {k}" for k in sorted(inputs) if saved_inputs[k] != inputs[k]]
    if differ:
        raise ConfigError(
            f"{folder} holds an edge-pruning run with other settings ({', '.join(differ)}); "
            "use another folder, the same settings, or delete it to start over"
        )
    step = load_checkpoint(folder / STATE_FILE, params, optimizer)
    return step, list(progress["history"])


def prune_edges(
    model: HookedModel,
    pairs: PromptPairs,
    config: EdgePruneSettings | None = None,
    out: str | os.PathLike[str] | None = None,
    means: torch.Tensor | None = None,
    progress: bool = True,
) -> EdgePruneResult:
    """Learn an edge circuit of ``model`` on ``pairs`` (see the module docstring)."""
    config = config or EdgePruneSettings()
    objective = answer_objective(config.objective)
    graph = Graph.from_model(model)
    if config.fill == "mean" and means is None:
        raise InterventionError("fill='mean' needs means (sender_means)")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(derive_seed("circuit", "init", config.seed))
    log_alpha = torch.nn.Parameter(
        (torch.randn(graph.n_edges, generator=generator) * config.init_std + config.init_mean).to(
            device
        )
    )
    controller = LagrangianController().to(device)
    optimizer = pruning_optimizer(
        [log_alpha], controller, config.lr, config.lr_lambda, weight_decay=config.weight_decay
    )
    params = {"log_alpha": log_alpha, "lambda_1": controller.lambda_1,
              "lambda_2": controller.lambda_2}  # fmt: skip
    node_log_alpha, node_controller = None, None
    if config.node_sparsity is not None:  # drawn after the edges': their gates stay the same
        node_log_alpha = torch.nn.Parameter(
            (torch.randn(graph.n_senders, generator=generator) * config.init_std).to(device)
            + config.init_mean
        )
        node_controller = LagrangianController().to(device)
        optimizer.add_param_group(
            {"params": [node_log_alpha], "lr": config.lr, "weight_decay": config.weight_decay}
        )
        optimizer.add_param_group(
            {"params": list(node_controller.parameters()), "lr": config.lr_lambda,
             "weight_decay": config.weight_decay, "maximize": True}
        )  # fmt: skip
        params |= {"node_log_alpha": node_log_alpha, "node_lambda_1": node_controller.lambda_1,
                   "node_lambda_2": node_controller.lambda_2}  # fmt: skip
    senders = graph.edges[:, 0].to(device)
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    folder = Path(out) if out is not None else None
    inputs = _inputs_key(model, pairs, means if config.fill == "mean" else None)
    start, history = 0, []
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        if _has_state(folder):
            start, history = _load_state(folder, params, optimizer, config, inputs)
    with torch.no_grad():  # the full model's answers, once
        reference = torch.cat(
            [answer_logits(metric_logits(model, b), b).float() for b in pairs.batches(64)]
        )
    bar = tqdm(range(start, config.steps), desc="edge pruning", disable=not progress)
    # the weights stay frozen while the gates learn; restored at the end
    # the step's large buffers (corrupted outputs, deltas, their gradients) are reused
    with graph_switches(model), frozen(model, eval_mode=False), reusing_buffers(fixed_weights=True):
        for step in bar:
            index = _batch_indices(len(pairs), config.batch_size, config.seed, step)
            batch = pairs.select(index)
            target = target_sparsity_at(step, config.sparsity, config.sparsity_warmup_steps)
            step_gen = torch.Generator().manual_seed(  # CPU: one stream on every device
                derive_seed("circuit", config.seed, step)
            )
            z = sample_hard_concrete(log_alpha, generator=step_gen)
            weights = z
            if node_log_alpha is not None:
                z_node = sample_hard_concrete(node_log_alpha, generator=step_gen)
                weights = z * z_node[senders]
            mask = EdgeMask(graph, weights, config.fill, means if config.fill == "mean" else None)
            run = None
            if config.fill == "corrupted":
                run = record_corrupted(model, graph, **batch.corrupted)
            hooks = masked_hooks(model, mask, hard_concrete=True, corrupted=run)
            with hooked(model, hooks):
                logits = answer_logits(metric_logits(model, batch), batch)
            full = reference[index.to(reference.device)]
            value = objective.compare(logits.float(), full, batch.answer, batch.distractor).mean()
            sparsity = sampled_sparsity(z)
            loss = value + controller.penalty(sparsity, target)
            record = {}
            if node_controller is not None:
                node_target = target_sparsity_at(
                    step, config.node_sparsity, config.sparsity_warmup_steps
                )
                node_sparsity = sampled_sparsity(z_node)
                loss = loss + node_controller.penalty(node_sparsity, node_target)
                record = {"node_sparsity": node_sparsity.item(), "node_target": node_target}
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.max_grad_norm > 0:  # the authors' Trainer: every trained tensor together
                torch.nn.utils.clip_grad_norm_(list(params.values()), config.max_grad_norm)
            factor = lr_factor(step, config.lr_warmup_steps, config.steps, "linear")
            for group, lr in zip(optimizer.param_groups, base_lrs, strict=True):
                group["lr"] = lr * factor
            optimizer.step()
            history.append(
                {
                    "step": step,
                    objective.column: value.item(),
                    "sparsity": sparsity.item(),
                    "target": target,
                    "lambda_1": controller.lambda_1.item(),
                    **record,
                }
            )
            bar.set_postfix(
                {objective.column: f"{value.item():.3f}", "sparsity": f"{sparsity.item():.3f}"}
            )
            done = step + 1
            if folder is not None and (done % config.checkpoint_every == 0 or done == config.steps):
                _save_state(folder, done, params, optimizer, history, config, inputs)
    weights, nodes = discretize_circuit(
        graph, log_alpha, config.sparsity, node_log_alpha, config.node_sparsity
    )
    circuit = EdgeMask(graph, weights, config.fill, means if config.fill == "mean" else None)
    return EdgePruneResult(
        circuit,
        log_alpha.detach().cpu(),
        history,
        None if node_log_alpha is None else node_log_alpha.detach().cpu(),
        nodes,
    )


def load_edge_prune_history(folder: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The trace of a checkpointed run (the objective's column, ``sparsity``, ``target``,
    ``lambda_1``)."""
    return list(_read_progress(Path(folder))["history"])
