"""Tiny randomly initialised Hugging Face checkpoints, for tests and for trying mi_core offline.

Each is a real checkpoint directory (config.json, model.safetensors, tokenizer files) that both
``transformers`` and :func:`mi_core.load_model` open. The tokenizer is MiniLM's WordPiece
tokenizer for every family: the reference model does not care which tokenizer made its ids.
A kind is a family name (:data:`mi_core.models.families.FAMILIES`) and what to make of it:
``<family>-lm`` a causal LM, ``<family>-cls`` a sequence classifier.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers

from mi_core.models.embedded import minilm_path
from mi_core.models.families import FAMILIES, Family, family
from mi_core.models.loading import quiet_transformers

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


#: Every kind :func:`make_tiny_checkpoint` makes: ``<family>-lm`` for each family with a causal
#: LM, ``<family>-cls`` for each with a sequence classifier.
TINY_KINDS = tuple(
    [f"{f.name}-lm" for f in FAMILIES if f.causal_lm]
    + [f"{f.name}-cls" for f in FAMILIES if f.classifier]
)


def _kind(kind: str) -> tuple[Family, str]:
    if kind not in TINY_KINDS:
        raise ValueError(f"unknown tiny kind {kind!r}; expected one of {TINY_KINDS}")
    name, what = kind.rsplit("-", 1)
    fam = family(name)
    architecture = fam.causal_lm if what == "lm" else fam.classifier
    assert architecture is not None
    return fam, architecture


def randomise_parameters(model: torch.nn.Module) -> None:
    """Give every parameter of ``model`` a random value, as a trained model has them.

    Hugging Face initialises biases to zero, norm gains to one (or to zero where the norm
    multiplies by ``1 + weight``, as Gemma's) and may leave attention sinks at zero; a test on
    such a checkpoint cannot see what a method does with a bias, a gain or a sink. Matrices
    (not the embeddings) are drawn from N(0, 0.2), larger than the initialisation so that
    differences show in the logits; every vector parameter (biases, norm gains, router
    biases) moves by N(0, 0.2), so gains lie around their initial value (one, or zero for
    ``1 + weight``); attention sinks are drawn from N(0, 1), large enough to take a visible
    part of each attention row.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("sinks"):
                param.normal_(0.0, 1.0)
            elif param.dim() == 1:
                param.add_(torch.randn_like(param), alpha=0.2)
            elif "embed" not in name and "wte" not in name:
                param.normal_(0.0, 0.2)


def make_tiny_checkpoint(
    kind: str, path: str | os.PathLike[str], num_labels: int = 3, seed: int = 0
) -> Path:
    """Write a tiny random checkpoint of ``kind`` (one of ``TINY_KINDS``) to ``path``."""
    fam, architecture = _kind(kind)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
    config = fam.tiny(
        dict(vocab_size=len(tokenizer), num_labels=num_labels, pad_token_id=tokenizer.pad_token_id)
    )
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    randomise_parameters(model)
    path = Path(path)
    with quiet_transformers():  # no bar on stderr for a tiny write
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_mib_peer(root: str | os.PathLike[str]) -> Any:
    """MIB's circuit evaluator, its task datasets (``dataset``: ``HFEAPDataset``) and EAP-IG's
    ``Graph`` from their published code at ``root``
    (``../shared/peers/mib``: ``eap/`` and ``MIB_circuit_track/``), for tests and benchmarks
    to compare against on identical inputs. Matplotlib, which only EAP-IG's image export
    reads, is stubbed where it is not installed."""
    import importlib
    import importlib.util
    import sys
    import types

    root = Path(root)
    if "matplotlib" not in sys.modules and importlib.util.find_spec("matplotlib") is None:
        for name in ("matplotlib", "matplotlib.cm", "matplotlib.colors", "matplotlib.pyplot"):
            sys.modules[name] = types.ModuleType(name)
    for path in (root, root / "MIB_circuit_track"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    evaluation, metrics, dataset = (
        importlib.import_module(n) for n in ("evaluation", "metrics", "dataset")
    )
    evaluate = importlib.import_module("eap.evaluate")
    Graph = importlib.import_module("eap.graph").Graph
    return types.SimpleNamespace(evaluation=evaluation, evaluate=evaluate, Graph=Graph,
                                 metrics=metrics, dataset=dataset)  # fmt: skip


def mib_reference_score(
    peer: Any, model: HookedTransformer, dense_scores: torch.Tensor, pairs: Any,
    absolute: bool, batch_size: int = 16, node_scores: torch.Tensor | None = None,
    graph: Any = None,
) -> tuple:  # fmt: skip
    """MIB's ``evaluate_area_under_curve`` on ``pairs`` (a
    :class:`~mi_core.data.circuit_pairs.PromptPairs`) with ``dense_scores`` (``[sender,
    receiver]``, MIB's sign) on a copy of ``model`` configured as MIB's ``run_evaluation.py``
    configures it; given ``node_scores`` (``[sender]``, MIB's sign, NaN unscored), at MIB's
    node level (``[sender, d_model]``: its neuron level); given ``graph`` (one MIB loaded), on
    it, at the neuron or node level when it has such scores. MIB tokenises strings; here its
    tokeniser is replaced, for the call, by one returning the pairs' own ids, so both sides
    read identical inputs. Returns MIB's
    ``(edge counts, CPR, CMD, mean, faithfulnesses)``."""
    import copy

    theirs = copy.deepcopy(model)
    theirs.set_use_attn_result(True)
    theirs.set_use_split_qkv_input(True)
    theirs.set_use_hook_mlp_in(True)
    if getattr(theirs.cfg, "n_key_value_heads", None):
        theirs.set_ungroup_grouped_query_attention(True)
    neurons = node_scores is not None and node_scores.ndim == 2
    if graph is None:
        per_node = node_scores is not None and not neurons
        graph = peer.Graph.from_model(theirs, neuron_level=neurons, node_scores=per_node)
        graph.scores[:] = dense_scores.to(graph.scores)
        if node_scores is not None:
            target = graph.neurons_scores if neurons else graph.nodes_scores
            target[:] = node_scores.to(target)
    level = "edge"
    if getattr(graph, "neurons_scores", None) is not None:
        level = "neuron"
    elif getattr(graph, "nodes_scores", None) is not None:
        level = "node"
    ids = {"clean": pairs.clean_ids.cpu(), "corrupted": pairs.corrupted_ids.cpu()}
    attention = pairs.attention_mask.cpu()

    def tokenize_plus(
        model: HookedTransformer, inputs: list[str], max_length: int | None = None
    ) -> tuple:
        kind, rows = inputs[0].split(":")[0], [int(s.split(":")[1]) for s in inputs]
        mask = attention[rows]
        return ids[kind][rows], mask, mask.sum(1), mask.shape[1]

    n = len(pairs.answer)
    batches = [
        ([f"clean:{i}" for i in rows], [f"corrupted:{i}" for i in rows],
         torch.stack([pairs.answer[rows].cpu(), pairs.distractor[rows].cpu()], dim=1))
        for rows in (list(range(s, min(s + batch_size, n))) for s in range(0, n, batch_size))
    ]  # fmt: skip
    metric = peer.metrics.get_metric("logit_diff", "ioi", theirs.tokenizer, theirs)
    original = peer.evaluate.tokenize_plus
    peer.evaluate.tokenize_plus = tokenize_plus
    try:
        return peer.evaluation.evaluate_area_under_curve(
            theirs, graph, batches, metric, quiet=True, absolute=absolute, level=level
        )
    finally:
        peer.evaluate.tokenize_plus = original
