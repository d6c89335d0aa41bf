"""The mask-learning objectives (:mod:`mi_core.pruning.objectives`): each by hand, each zero at
the full model with a gradient through the mask, wrong pairings refused in one line, and the
option changing what node and edge pruning learn."""

from __future__ import annotations

import pytest
import torch
from helpers import random_prompt_pairs, tiny_model

from mi_core.circuits.prune import EdgePruneSettings, prune_edges
from mi_core.data import tokenize_pairs
from mi_core.errors import ConfigError
from mi_core.interventions import ComponentMask, ablate
from mi_core.pruning import make_prune_config
from mi_core.pruning.objectives import (
    OBJECTIVES,
    answer_objective,
    logit_difference,
    resolve_objective,
)
from mi_core.pruning.reference_logits import compute_reference_logits
from mi_core.pruning.run import prune_run


def test_the_configs_choices_are_the_registry():
    """PruneConfig and EdgePruneSettings take their choices from a torch-free constant."""
    from mi_core.pruning.constants import OBJECTIVE_NAMES
    from mi_core.pruning.objectives import objective_names

    assert OBJECTIVE_NAMES == objective_names()


def test_the_logit_difference_gap_by_hand():
    masked = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.5, 0.5]])
    full = torch.tensor([[1.0, 0.0, 2.0], [1.0, 1.0, 1.0]])
    answers, distractors = torch.tensor([2, 0]), torch.tensor([0, -1])
    # row 0: LD = 3 - 0 masked, 2 - 1 full; row 1 (no distractor): 2 - 1.5 masked, 1 - 1 full
    assert logit_difference(masked, answers, distractors).tolist() == [3.0, 0.5]
    gap = OBJECTIVES["logit_diff"].compare(masked, full, answers, distractors)
    assert gap.tolist() == pytest.approx([(3.0 - 1.0) ** 2, (0.5 - 0.0) ** 2])
    kl = OBJECTIVES["answer_kl"].compare(masked, full, answers, distractors)
    p, log_q = full.softmax(-1), masked.log_softmax(-1)
    assert kl.tolist() == pytest.approx((p * (p.log() - log_q)).sum(-1).tolist(), rel=1e-6)


@pytest.mark.parametrize("name", ["answer_kl", "logit_diff"])
def test_each_objective_is_zero_at_the_full_model_and_has_a_gradient(answer, ioi, lm_means, name):
    """Every gate at 1 is the full model: the objective is 0 there; with some gates below 1
    it is positive and its gradient reaches the mask."""
    tokens = tokenize_pairs(ioi, answer.tokenizer)
    objective = resolve_objective(name, tokens)
    targets = objective.targets(tokens, compute_reference_logits(answer, tokens))
    batch = tokens.collate(range(len(ioi)))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    index = torch.as_tensor(batch["index"])
    mask = ComponentMask.ones(answer)
    with ablate(answer, mask, lm_means, skip_unmasked=False):
        full = objective.per_example(answer, mask, inputs, targets, index)
        # zero up to the float noise of the reference's other batch composition
        assert full.abs().max() < 1e-6
        heads = torch.full_like(mask.heads, 0.6, requires_grad=True)
        mask.heads = heads
        value = objective.per_example(answer, mask, inputs, targets, index).mean()
        value.backward()
    assert value > 1e-4 and heads.grad is not None and heads.grad.abs().max() > 0


def test_an_objective_on_data_it_is_not_defined_on_is_one_line(answer):
    from mi_core.data.batches import TokenizedText

    text = TokenizedText([[1, 2, 3]], [[0, 0, 0]], [0], 8, 0, 0, [], "text:x")
    with pytest.raises(ConfigError, match="objective logit_diff takes a prompt task .* plain text"):
        resolve_objective("logit_diff", text)
    with pytest.raises(ConfigError, match="objective answer_kl takes sentence pairs"):
        resolve_objective("answer_kl", text)
    assert resolve_objective("auto", text).name == "every_position_kl"
    with pytest.raises(ConfigError, match="edge pruning learns on prompt pairs"):
        answer_objective("every_position_kl")
    with pytest.raises(ConfigError, match="unknown objective 'nope'"):
        answer_objective("nope")


def test_node_pruning_under_logit_diff_logs_it_and_learns_another_mask(lm_path, lm_means, tmp_path):
    runs = {}
    for name in ("answer_kl", "logit_diff"):
        cfg = make_prune_config(
            "cofi", target_sparsity=0.4, seed=3, steps=8, batch_size=8, lr_log_alpha=0.5,
            checkpoint_every=4, eval_every=0, objective=name,
        )  # fmt: skip
        runs[name] = prune_run(lm_path, "ioi:abba", tmp_path / name, cfg, means=lm_means,
                               max_train_examples=16, progress=False)  # fmt: skip
    import pandas as pd

    log = pd.read_csv(tmp_path / "logit_diff" / "log.csv")
    assert "logit_diff_gap" in log.columns and "kl" not in log.columns
    assert (log.logit_diff_gap >= 0).all() and log.logit_diff_gap.max() > 0
    assert "final_logit_diff_gap" in runs["logit_diff"].metrics
    assert not torch.equal(runs["logit_diff"].log_alpha, runs["answer_kl"].log_alpha)
    # a run folder of one objective does not resume under another
    other = make_prune_config(
        "cofi", target_sparsity=0.4, seed=3, steps=8, batch_size=8, lr_log_alpha=0.5,
        checkpoint_every=4, eval_every=0, objective="answer_kl",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="objective"):
        prune_run(lm_path, "ioi:abba", tmp_path / "logit_diff", other, means=lm_means,
                  max_train_examples=16, progress=False)  # fmt: skip


def test_edge_pruning_under_logit_diff_learns_another_circuit_and_resumes(tmp_path):
    model = tiny_model("gpt2")
    pairs = random_prompt_pairs(16, 6, high=90)
    # gates starting undecided (log_alpha 0), so that the samples remove edges from step 0
    settings = dict(sparsity=0.7, steps=12, sparsity_warmup_steps=8, batch_size=8,
                    checkpoint_every=6, init_mean=0.0)  # fmt: skip
    kl = prune_edges(model, pairs, EdgePruneSettings(**settings), progress=False)
    ld_config = EdgePruneSettings(**settings, objective="logit_diff")
    ld = prune_edges(model, pairs, ld_config, tmp_path / "ld", progress=False)
    assert "logit_diff_gap" in ld.history[-1] and "kl" not in ld.history[-1]
    assert ld.history[-1]["logit_diff_gap"] > 0
    assert not torch.equal(ld.log_alpha, kl.log_alpha)
    again = prune_edges(model, pairs, ld_config, tmp_path / "ld", progress=False)
    assert torch.equal(again.log_alpha, ld.log_alpha) and len(again.history) == 12
    with pytest.raises(ConfigError, match=r"other settings \(objective\)"):
        prune_edges(model, pairs, EdgePruneSettings(**settings), tmp_path / "ld", progress=False)
