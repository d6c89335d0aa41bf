"""Reused scratch buffers: handed out again only when nothing references them, and results
computed with reuse equal those computed with fresh buffers."""

from __future__ import annotations

import gc

import pytest
import torch
from helpers import random_prompt_pairs, random_tokens, tiny_model

from mi_core.buffers import Workspace, reusing_buffers, scratch
from mi_core.circuits import edge_attribution
from mi_core.circuits.attribution import attribute
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.interventions import EdgeMask, Graph, graph_switches, node_outputs
from mi_core.interventions.edges._engine import _EdgeRun, masked_hooks
from mi_core.interventions.edges._kernels import _LayerGroup, _SideBySide
from mi_core.models import load_model
from mi_core.pruning.hard_concrete import sample_hard_concrete

pytestmark = pytest.mark.usefixtures("one_thread")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_free_buffer_is_reused_and_one_still_referenced_is_not():
    like = torch.zeros(1)
    workspace = Workspace()
    first = workspace.empty("a", (4, 5), like)
    first_storage = _storage(first)
    # ``first`` is still held: a second request gets other memory
    second = workspace.empty("a", (4, 5), like)
    assert _storage(second) != first_storage
    second_storage = _storage(second)
    del first
    # free again: reused, smaller shapes from the same memory
    third = workspace.empty("a", (2, 3), like)
    assert _storage(third) == first_storage and third.shape == (2, 3)
    # a view keeps its buffer in use, as does a tensor autograd saved for its backward
    view = third[1:]
    del third, second
    fourth = workspace.empty("a", (4, 5), like)
    assert _storage(fourth) == second_storage
    del view
    saved = workspace.empty("a", (4, 5), like)
    assert _storage(saved) == first_storage
    leaf = torch.ones(4, 5, requires_grad=True)
    product = (leaf * saved).sum()  # saves ``saved`` for the gradient of ``leaf``
    del saved, fourth
    # both buffers: one held by the graph, the other free
    fifth = workspace.empty("a", (4, 5), like)
    assert _storage(fifth) == second_storage
    sixth = workspace.empty("a", (4, 5), like)
    assert _storage(sixth) not in (first_storage, second_storage)
    product.backward()
    # other dtypes and roles never share
    assert workspace.empty("a", (4, 5), like.double()).dtype == torch.float64
    assert workspace.empty("b", (4, 5), like).shape == (4, 5)


def test_scratch_reuses_only_inside_a_reusing_block_and_lets_go_at_its_end():
    like = torch.zeros(1)
    a = scratch("x", (3,), like)
    pointer = _storage(a)
    del a
    b = scratch("x", (3,), like)  # outside a block: new memory each time
    assert b.shape == (3,)
    with reusing_buffers() as outer:
        c = scratch("x", (3,), like)
        pointer = _storage(c)
        del c
        with reusing_buffers() as inner:  # nested blocks share the outer workspace
            assert inner is outer
            d = scratch("x", (3,), like)
            assert _storage(d) == pointer
            del d
        assert outer._roles
    assert not outer._roles  # let go at the end


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_edge_pruning_steps_with_reused_buffers_have_the_gradients_of_fresh_ones(family):
    model = tiny_model(family)
    for p in model.parameters():
        p.requires_grad_(False)
    graph = Graph.from_model(model)
    pairs = random_prompt_pairs(6, 5, high=90)
    gen = torch.Generator().manual_seed(0)
    log_alpha = (torch.randn(graph.n_edges, generator=gen) * 2).requires_grad_(True)

    def last_logits(seed: int, hard_concrete: bool = True) -> torch.Tensor:
        """A masked forward's last-position logits, the gates drawn from ``seed``."""
        z = sample_hard_concrete(log_alpha, generator=torch.Generator().manual_seed(seed))
        mask = EdgeMask(graph, z)
        mask = mask.with_corrupted(node_outputs(model, graph, **pairs.corrupted))
        with (
            graph_switches(model),
            model.hooks(fwd_hooks=masked_hooks(model, mask, hard_concrete=hard_concrete)),
        ):
            return model(pairs.clean_ids)[:, -1]

    def step(seed: int, hard_concrete: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        logits = last_logits(seed, hard_concrete)
        (grad,) = torch.autograd.grad(logits.logsumexp(-1).sum(), log_alpha)
        return logits.detach(), grad

    # a step's buffers are free when it returns: no reference cycle keeps them until the next
    # garbage collection (the layer groups, which every point of a dense mask uses, included)
    gc.collect()
    gc.disable()
    try:
        for hard_concrete in (True, False):
            step(0, hard_concrete)
            kinds = (_EdgeRun, _LayerGroup, _SideBySide)  # type(): isinstance would warn
            alive = [o for o in gc.get_objects() if type(o) in kinds]
            assert not alive
    finally:
        gc.enable()

    fresh = [step(seed) for seed in range(3)]
    with reusing_buffers() as workspace:
        reused = [step(seed) for seed in range(3)]
        assert workspace._roles["side values"]  # the buffers did go through the workspace
    for (a, ga), (b, gb) in zip(fresh, reused, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(ga, gb, rtol=0, atol=0)

    # two masked forwards before one backward: the first's buffers are still in use
    def forward(seed: int) -> torch.Tensor:
        return last_logits(seed).logsumexp(-1).sum()

    expected = torch.autograd.grad(forward(0) + forward(1), log_alpha)[0]
    with reusing_buffers():
        both = forward(0) + forward(1)
        got = torch.autograd.grad(both, log_alpha)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["llama", "bert-cls"])
def test_eap_over_batches_with_reused_buffers_equals_each_batch_alone(kind, tiny_checkpoints):
    """A decoder (scored inside the backward pass) and a post-LN encoder (the sweep)."""
    if kind == "llama":
        model = tiny_model("llama")
        pairs = random_prompt_pairs(8, 5, high=90)
    else:
        model = load_model(tiny_checkpoints[kind], task="mnli")
        pairs = PromptPairs(
            clean_ids=random_tokens(8, 7, seed=1, low=1000, high=2000),
            corrupted_ids=random_tokens(8, 7, seed=2, low=1000, high=2000),
            attention_mask=torch.ones(8, 7, dtype=torch.long),
            answer=torch.arange(8) % 3,
            distractor=torch.full((8,), -1),
            position=torch.zeros(8, dtype=torch.long),
            kind="classifier",
        )
    graph = Graph.from_model(model)
    alone = [edge_attribution(model, graph, b, steps=2) for b in pairs.batches(4)]
    expected = (alone[0] * 4 + alone[1] * 4) / 8
    assert expected.abs().max() > 1e-5
    with reusing_buffers() as workspace:
        scores = attribute(model, pairs, method="eap-ig", steps=2, batch_size=4, progress=False)
        assert workspace._roles  # the batches' buffers went through the one workspace
    torch.testing.assert_close(scores.scores, expected, rtol=1e-6, atol=1e-7)
