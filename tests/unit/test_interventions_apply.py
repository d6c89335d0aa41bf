"""One intervention abstraction: Subnetwork and PruneMasks save, load, combine, apply together."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from helpers import random_tokens, tiny_model

from mi_core.errors import InterventionError
from mi_core.interventions import (
    Component,
    ComponentMask,
    PruneMasks,
    Subnetwork,
    ablate,
    apply,
    compute_means,
    load_intervention,
    register_kind,
)
from mi_core.interventions import kinds as intervention_kinds
from mi_core.interventions.neurons import FORMAT
from mi_core.io import read_safetensors, write_safetensors


@pytest.fixture(scope="module")
def setup():
    """A tiny GPT-2-like decoder, tokens, and its means."""
    model = tiny_model("gpt2", seed=3)
    tokens = random_tokens(4, 10, seed=5)
    means = compute_means(model, [{"input_ids": tokens}], dataset="toy")
    return model, tokens, means


def _neurons(model) -> PruneMasks:
    masks = PruneMasks.empty(model)
    ff = torch.zeros_like(masks.ff_step, dtype=torch.bool)
    ff[0, :5] = True
    attn = torch.zeros_like(masks.attn_step, dtype=torch.bool)
    attn[1, 2, :3] = True
    masks.prune(1, ff=ff, attn=attn, ff_fill=torch.full(ff.shape, 0.25))
    return masks


def test_subnetwork_file_reapplies_bit_identically_to_a_fresh_model(setup, tmp_path):
    model, tokens, means = setup
    sub = Subnetwork(ComponentMask.from_removed(model, "L0.H1,L1.MLP"), "mean", means)
    with ablate(model, sub.mask, means):
        expected = model(tokens)
    with apply(model, sub):
        assert torch.equal(model(tokens), expected)
    sub.save(tmp_path / "sub.safetensors")
    fresh = tiny_model("gpt2", seed=3)  # the same weights, built anew
    loaded = load_intervention(tmp_path / "sub.safetensors")
    assert isinstance(loaded, Subnetwork) and loaded == sub
    assert loaded.means.fingerprint == means.fingerprint and loaded.means.dataset == "toy"
    with apply(fresh, loaded):
        assert torch.equal(fresh(tokens), expected)
    assert not fresh.hook_dict["blocks.0.attn.hook_z"].fwd_hooks  # leaving removes the hooks
    other = tiny_model("gpt2", seed=4)
    with pytest.raises(InterventionError, match="means were computed for model"):
        with apply(other, loaded):
            other(tokens)  # never reached: applying checks the means against the model


def test_component_and_neuron_interventions_compose(setup, tmp_path):
    model, tokens, means = setup
    sub = Subnetwork(ComponentMask.from_removed(model, "L1.H0"), "zero")
    neurons = _neurons(model)
    with model.hooks(fwd_hooks=sub.hooks(model) + neurons.hooks(model)):
        expected = model(tokens)
    with apply(model, sub, neurons):
        both = model(tokens)
    with apply(model, sub):
        only_sub = model(tokens)
    assert torch.equal(both, expected) and not torch.equal(both, only_sub)
    neurons.save(tmp_path / "neurons.safetensors")
    assert load_intervention(tmp_path / "neurons.safetensors") == neurons
    with apply(model, sub, load_intervention(tmp_path / "neurons.safetensors")):
        assert torch.equal(model(tokens), expected)


def test_mask_algebra_on_kept_components(setup):
    model, _, _ = setup  # 2 layers x 4 heads
    a = ComponentMask.from_kept(model, "L0.H0,L0.H1,L1.MLP")
    b = ComponentMask.from_kept(model, "L0.H1,L1.H3")
    assert [str(c) for c in a.removed()][:3] == ["L0.H2", "L0.H3", "L0.MLP"]
    kept = lambda m: sorted(set(map(str, m.complement().removed())))  # noqa: E731
    assert kept(a | b) == ["L0.H0", "L0.H1", "L1.H3", "L1.MLP"]
    assert kept(a & b) == ["L0.H1"]
    assert kept(a - b) == ["L0.H0", "L1.MLP"]
    assert ~~a == a and (a | ~a) == ComponentMask.ones(model)
    with pytest.raises(InterventionError, match="binary"):
        a | ComponentMask(torch.full((2, 4), 0.5), torch.ones(2))
    mean = Subnetwork(a, "mean", setup[2])
    with pytest.raises(InterventionError, match="different fills"):
        mean | Subnetwork(b, "zero")
    assert (Subnetwork(a, "zero") & Subnetwork(b, "zero")).mask == a & b


def test_neuron_mask_algebra_keeps_the_earlier_removal(setup):
    model, _, _ = setup
    a, b = PruneMasks.empty(model), PruneMasks.empty(model)
    a.prune(1, ff=_row(a, [0, 1]), ff_fill=torch.full(a.ff_fill.shape, 1.0))
    b.prune(2, ff=_row(b, [1, 2]), ff_fill=torch.full(b.ff_fill.shape, 2.0))
    union, both = a | b, a & b
    assert (union.ff_step[0, :3].tolist(), union.ff_fill[0, :3].tolist()) == (
        [0, 1, 0],
        [0.0, 1.0, 0.0],
    )  # kept by either: removed only where both remove it, at the earlier step
    assert (both.ff_step[0, :3].tolist(), both.ff_fill[0, :3].tolist()) == (
        [1, 1, 2],
        [1.0, 1.0, 2.0],
    )


def test_neuron_mask_difference_keeps_what_only_the_first_keeps(setup):
    """``a - b`` keeps the neurons ``a`` keeps and ``b`` removes; ``a``'s removals keep their step
    and fill, a neuron both keep is removed one step after ``a``'s last, with a zero fill."""
    model, _, _ = setup
    a, b = PruneMasks.empty(model), PruneMasks.empty(model)
    a.prune(1, ff=_row(a, [0, 1]), ff_fill=torch.full(a.ff_fill.shape, 1.0))
    b.prune(2, ff=_row(b, [1, 2]), ff_fill=torch.full(b.ff_fill.shape, 2.0))
    only_a = a - b  # a keeps 2, 3, ...; b removes 1, 2: only neuron 2 is kept
    assert (only_a.ff_step[0, :4].tolist(), only_a.ff_fill[0, :4].tolist()) == (
        [1, 1, 0, 2],
        [1.0, 1.0, 0.0, 0.0],
    )
    assert only_a.n_ff_pruned == only_a.ff_step.numel() - 1
    assert (only_a.attn_step == 2).all() and (only_a.attn_fill == 0).all()  # both keep them all
    only_b = b - a  # b keeps 0, 3, ...; a removes 0, 1: only neuron 0 is kept
    assert (only_b.ff_step[0, :4].tolist(), only_b.ff_fill[0, :4].tolist()) == (
        [0, 2, 2, 3],
        [0.0, 2.0, 2.0, 0.0],
    )
    other = PruneMasks(a.ff_step[:, :-1], a.attn_step, a.ff_fill[:, :-1], a.attn_fill)
    with pytest.raises(InterventionError, match="different models"):
        a - other  # noqa: B018


def test_subnetwork_algebra_on_kept_components(setup):
    model, _, means = setup  # 2 layers x 4 heads
    a = ComponentMask.from_kept(model, "L0.H0,L0.H1,L1.MLP")
    b = ComponentMask.from_kept(model, "L0.H1,L1.H3")
    kept = lambda sub: sorted(map(str, sub.mask.complement().removed()))  # noqa: E731
    for fill, fill_means in (("zero", None), ("mean", means)):
        sub_a, sub_b = Subnetwork(a, fill, fill_means), Subnetwork(b, fill, fill_means)
        assert kept(sub_a | sub_b) == ["L0.H0", "L0.H1", "L1.H3", "L1.MLP"]
        assert kept(sub_a & sub_b) == ["L0.H1"]
        assert kept(sub_a - sub_b) == ["L0.H0", "L1.MLP"]
        assert kept(sub_b - sub_a) == ["L1.H3"]
        assert all(c.same_fill(sub_a) for c in (sub_a | sub_b, sub_a & sub_b, sub_a - sub_b))
    with pytest.raises(InterventionError, match="different fills"):
        Subnetwork(a, "mean", means) - Subnetwork(b, "zero")  # noqa: B018


def _row(masks: PruneMasks, neurons: list[int]) -> torch.Tensor:
    selected = torch.zeros_like(masks.ff_step, dtype=torch.bool)
    selected[0, neurons] = True
    return selected


def test_only_interventions_are_applied_and_unknown_files_are_refused(setup, tmp_path):
    model, tokens, _ = setup
    mask = ComponentMask.from_removed(model, "L0.H1")
    with pytest.raises(InterventionError, match="wrap a ComponentMask as Subnetwork"):
        with apply(model, mask):
            model(tokens)  # never reached
    mask.save(tmp_path / "mask.safetensors")
    with pytest.raises(InterventionError, match="ComponentMask.load"):
        load_intervention(tmp_path / "mask.safetensors")
    with pytest.raises(InterventionError, match="needs its means"):
        Subnetwork(mask, "mean")
    assert FORMAT.endswith("/1")


def test_nested_mean_and_zero_ablation_of_one_component_is_refused(setup):
    model, tokens, means = setup
    head = ComponentMask.from_removed(model, "L0.H1")
    other = ComponentMask.from_removed(model, "L1.H2")
    with ablate(model, head, means):
        with pytest.raises(InterventionError, match="L0.H1 already removed with the mean over"):
            with ablate(model, head, fill="zero"):
                model(tokens)  # never reached: the order of the two hooks would decide
        with ablate(model, head, means):  # the same fill nests
            same = model(tokens)
        with ablate(model, other, fill="zero"):  # another component: no conflict
            model(tokens)
    with ablate(model, head, means):
        assert torch.equal(model(tokens), same)
    with ablate(model, head, fill="zero"):  # once the mean ablation has ended
        model(tokens)
    with pytest.raises(InterventionError, match="already removed"):
        with apply(model, Subnetwork(head, "mean", means), Subnetwork(head, "zero")):
            model(tokens)
    # two means of one model over unnamed data differ in their values, not their names: the
    # result had depended on the order of the two
    other_means = compute_means(model, [{"input_ids": tokens[:2]}], dataset="toy")
    with pytest.raises(InterventionError, match="already removed"):
        with apply(model, Subnetwork(head, "mean", means), Subnetwork(head, "mean", other_means)):
            model(tokens)
    again = compute_means(model, [{"input_ids": tokens}], dataset="toy")
    with apply(model, Subnetwork(head, "mean", means), Subnetwork(head, "mean", again)):
        assert torch.equal(model(tokens), same)  # equal values nest
    assert not model.hook_dict["blocks.0.attn.hook_z"].fwd_hooks  # nothing left behind


@dataclass
class _ZeroHead:
    """A kind of intervention mi_core does not define: one head's output set to zero."""

    layer: int
    head: int
    hook_position: ClassVar[str] = "first"

    def hooks(self, model) -> list:
        def hook(z, hook):
            z = z.clone()
            z[:, :, self.head] = 0
            return z

        return [(f"blocks.{self.layer}.attn.hook_z", hook)]

    def claims(self, model) -> dict:
        return {Component(self.layer, self.head): "zero"}

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_safetensors(
            path, {"at": torch.tensor([self.layer, self.head])}, {"kind": "tests.ZeroHead"}
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> _ZeroHead:
        layer, head = read_safetensors(path)[0]["at"].tolist()
        return cls(layer, head)


@pytest.fixture
def own_registry(monkeypatch):
    """The registry of kinds as it is, restored after the test."""
    monkeypatch.setattr(intervention_kinds, "_LOADERS", dict(intervention_kinds._LOADERS))


def test_a_registered_kind_loads_through_load_intervention(setup, tmp_path, own_registry):
    model, tokens, _ = setup
    path = _ZeroHead(0, 1).save(tmp_path / "zero_head.safetensors")
    with pytest.raises(InterventionError, match="no intervention mi_core knows .*'tests.ZeroHead'"):
        load_intervention(path)
    register_kind("tests.ZeroHead", _ZeroHead.load)
    register_kind("tests.ZeroHead", _ZeroHead.load)  # the same loader again: nothing changes
    loaded = load_intervention(path)
    assert loaded == _ZeroHead(0, 1)
    with apply(model, Subnetwork(ComponentMask.from_removed(model, "L0.H1"), "zero")):
        expected = model(tokens)
    with apply(model, loaded):
        assert torch.equal(model(tokens), expected)
    with pytest.raises(InterventionError, match="'tests.ZeroHead' is already registered"):
        register_kind("tests.ZeroHead", Subnetwork.load)
    assert isinstance(load_intervention(path), _ZeroHead)  # the first registration holds


def test_apply_checks_the_claims_every_kind_declares(setup):
    """A kind mi_core does not define claims the head it removes: one head removed with the
    mean by a subnetwork and with zero by it is refused, in one call or nested; zero with
    zero nests."""
    model, tokens, means = setup
    head = ComponentMask.from_removed(model, "L0.H1")
    with pytest.raises(InterventionError, match="L0.H1 already removed with the mean over"):
        with apply(model, Subnetwork(head, "mean", means), _ZeroHead(0, 1)):
            model(tokens)  # never reached
    with ablate(model, head, means), pytest.raises(InterventionError, match="already removed"):
        with apply(model, _ZeroHead(0, 1)):
            model(tokens)  # never reached
    with apply(model, _ZeroHead(0, 1)), pytest.raises(InterventionError, match="L0.H1 already"):
        with apply(model, Subnetwork(head, "mean", means)):
            model(tokens)  # never reached
    with apply(model, Subnetwork(head, "zero"), _ZeroHead(0, 1)):
        model(tokens)
    with apply(model, _ZeroHead(0, 2), Subnetwork(head, "mean", means)):  # another head
        model(tokens)
    assert not model.hook_dict["blocks.0.attn.hook_z"].fwd_hooks  # nothing left behind


def test_apply_places_hooks_where_each_kind_declares(setup):
    """``hook_position`` ``first`` puts a kind's hooks before a hook already on the model,
    ``last`` after it, whatever the kind."""
    model, tokens, _ = setup
    order: list[str] = []

    @dataclass
    class Noting(_ZeroHead):
        def hooks(self, model) -> list:
            return [("blocks.0.attn.hook_z", lambda z, hook: order.append("intervention"))]

    @dataclass
    class NotingLast(Noting):
        hook_position: ClassVar[str] = "last"

    @dataclass
    class Nowhere(Noting):
        hook_position: ClassVar[str] = "middle"

    user = ("blocks.0.attn.hook_z", lambda z, hook: order.append("user"))
    with model.hooks(fwd_hooks=[user]):
        for kind, expected in ((Noting, ["intervention", "user"]),
                               (NotingLast, ["user", "intervention"])):  # fmt: skip
            order.clear()
            with apply(model, kind(0, 3)):
                model(tokens)
            assert order == expected, kind.__name__
        with pytest.raises(InterventionError, match="hook_position is 'middle'"):
            with apply(model, Nowhere(0, 3)):
                model(tokens)  # never reached


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_an_edge_mask_reads_the_senders_after_a_subnetwork_in_any_order(family):
    """An edge mask recorded a head's output before a subnetwork replaced it with its mean
    (``apply(m, edges, sub)`` or the edge mask nested inside the subnetwork): its receiver then
    lost ``mean - clean`` instead of the mean (1.90 off on a tiny Llama, where the edge itself
    moves the logits by 0.38)."""
    from mi_core.interventions import EdgeMask, Graph

    model = tiny_model(family, seed=3)
    tokens = random_tokens(4, 10, seed=5)
    means = compute_means(model, [{"input_ids": tokens}], dataset="toy")
    sub = Subnetwork(ComponentMask.from_removed(model, "L0.H1"), "mean", means)
    graph = Graph.from_model(model)
    weights = torch.ones(graph.n_edges)
    weights[graph.edge_index("L0.H1->L1.H2.q")] = 0
    edges = EdgeMask(graph, weights, "zero")
    with torch.no_grad():
        with apply(model, sub, edges):  # the order that was right
            right = model(tokens)
        with apply(model, sub):
            without_edge = model(tokens)
        with apply(model, edges, sub):
            swapped = model(tokens)
        with apply(model, sub), apply(model, edges):
            nested = model(tokens)
        with apply(model, edges), apply(model, sub):
            inside = model(tokens)
    assert (right - without_edge).abs().max() > 1e-4  # the edge matters
    for other in (swapped, nested, inside):
        torch.testing.assert_close(other, right, atol=1e-5, rtol=0)


def test_an_edge_mask_keeps_a_users_hook_on_the_stream():
    """A hook on ``blocks.1.hook_resid_pre`` added before the edge mask: every head of layer 1
    but the one with a removed edge computes from the steered stream (the edge mask had rebuilt
    their inputs from the stream as it was before the user's hook)."""
    from mi_core.interventions import EdgeMask, Graph

    model = tiny_model("llama", seed=3)
    tokens = random_tokens(4, 10, seed=5)
    graph = Graph.from_model(model)
    weights = torch.ones(graph.n_edges)
    weights[graph.edge_index("L0.H1->L1.H2.q")] = 0
    edges = EdgeMask(graph, weights, "zero")
    steer = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    name = "blocks.1.attn.hook_z"
    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre",
                                                  lambda x, hook: x + steer)]):  # fmt: skip
        _, plain = model.run_with_cache(tokens, names_filter=name)
        with apply(model, edges):
            _, masked = model.run_with_cache(tokens, names_filter=name)
    torch.testing.assert_close(masked[name][:, :, 0], plain[name][:, :, 0], atol=1e-5, rtol=0)
    assert (masked[name][:, :, 2] - plain[name][:, :, 2]).abs().max() > 1e-4  # H2 lost the edge


def test_hooked_blocks_remove_their_own_hooks_and_leave_the_rest():
    """``hooked`` is ``model.hooks(fwd_hooks=...)`` visiting only the points it hooked: on
    leaving (also by an exception) its hooks are gone, a user's hooks on the same and other
    points stay, TransformerLens blocks nest inside and around it, and filter names work."""
    from mi_core.models.hook_context import hooked, prepended_hooks

    model = tiny_model("gpt2", seed=3)
    tokens = random_tokens(2, 6, seed=5)
    seen: list[str] = []

    def note(tag):
        def hook(x, hook):
            seen.append(f"{tag}:{hook.name}")

        return hook

    def run() -> list[str]:
        seen.clear()
        with torch.no_grad():
            model(tokens)
        return list(seen)

    model.add_hook("blocks.0.hook_resid_pre", note("user"))  # lasts past every block
    try:
        with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", note("tl"))]):
            with hooked(model, [("blocks.0.hook_resid_pre", note("ours")),
                                (lambda n: n.endswith("mlp_out"), note("filter"))]):  # fmt: skip
                with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", note("inner"))]):
                    assert run() == [
                        "user:blocks.0.hook_resid_pre", "ours:blocks.0.hook_resid_pre",
                        "inner:blocks.0.hook_resid_pre", "filter:blocks.0.hook_mlp_out",
                        "tl:blocks.1.hook_resid_pre", "filter:blocks.1.hook_mlp_out",
                    ]  # fmt: skip
                assert "inner:blocks.0.hook_resid_pre" not in run()
            assert run() == ["user:blocks.0.hook_resid_pre", "tl:blocks.1.hook_resid_pre"]
            with pytest.raises(RuntimeError), hooked(model, [("blocks.1.hook_mlp_out", note("x"))]):
                raise RuntimeError("inside")
            with prepended_hooks(model, [("blocks.0.hook_resid_pre", note("first"))]):
                assert run()[:2] == [
                    "first:blocks.0.hook_resid_pre",
                    "user:blocks.0.hook_resid_pre",
                ]
            assert run() == ["user:blocks.0.hook_resid_pre", "tl:blocks.1.hook_resid_pre"]
        assert run() == ["user:blocks.0.hook_resid_pre"]
    finally:
        model.reset_hooks(including_permanent=True)


def test_hooked_falls_back_to_hooks_of_an_object_without_hook_points():
    """A duck-typed model (``hooks()`` and ``cfg`` alone, as ``score_attention_patterns``
    accepts) gets its own ``hooks()``."""
    import contextlib

    from mi_core.models.hook_context import hooked

    calls = []

    class Duck:
        @contextlib.contextmanager
        def hooks(self, fwd_hooks=()):
            calls.append(list(fwd_hooks))
            yield self

    duck, hook = Duck(), (lambda x, hook: x)
    with hooked(duck, [("blocks.0.hook_resid_pre", hook)]) as inside:
        assert inside is duck
    assert calls == [[("blocks.0.hook_resid_pre", hook)]]
