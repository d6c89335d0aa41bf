"""The heuristic-core node method on a language model and a prompt task: the answer model (a
causal LM read at the answer position), the answer-position KL, masks by hooks against weight
edits, pruning to an exact target, resume after a kill, evaluation and the ablation table."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers import kill_at

from mi_core.data import load_prompt_task, pair_batches, tokenize_pairs
from mi_core.data.batches import TokenizedPrompts, task_scorer
from mi_core.errors import DataError, ModelLoadError
from mi_core.evaluation import evaluate
from mi_core.interventions import ComponentMask, ablate, compute_means
from mi_core.interventions.ablation_table import ablation_logits, naive_ablation_logits
from mi_core.interventions.components import parse_components
from mi_core.models import HookedAnswerModel, load_model
from mi_core.pruning import make_prune_config
from mi_core.pruning.objective import kl_to_reference
from mi_core.pruning.reference_logits import compute_reference_logits
from mi_core.pruning.run import prune_run
from mi_core.tasks import NEXT_TOKEN


def _last(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's logits at its last real token."""
    return logits[torch.arange(logits.shape[0]), mask.sum(1) - 1]


@pytest.mark.parametrize("kind", ["llama-lm", "gpt2-lm", "gemma2-lm", "gpt-neox-lm"])
def test_the_answer_model_is_the_lm_at_the_answer_position(tiny_checkpoints, kind):
    """Float64: the same algebra computed twice (tests/README.md). Gemma 2 carries the final
    logit soft-cap; GPT-NeoX a parallel block."""
    lm = load_model(tiny_checkpoints[kind], dtype=torch.float64)
    model = load_model(tiny_checkpoints[kind], task=NEXT_TOKEN, dtype=torch.float64)
    assert isinstance(model, HookedAnswerModel) and model.task == NEXT_TOKEN
    assert model.num_labels == lm.cfg.d_vocab_out
    task = load_prompt_task("ioi", 6, tokenizer=model.tokenizer)
    batch = tokenize_pairs(task, model.tokenizer).collate(range(6))
    assert batch["attention_mask"].sum(1).unique().numel() > 1  # right padding is exercised
    with torch.no_grad():
        got = model(batch["input_ids"], batch["attention_mask"])
        want = _last(lm(batch["input_ids"]), batch["attention_mask"])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    # the string API: a prompt's logits as the LM's on its tokens (the tiny checkpoints' BERT
    # tokenizer has no BOS; SmolLM2's case is the next test)
    with torch.no_grad():
        text = "When Mary and John went to the store, John gave a drink to"
        ids = model.to_tokens(text)["input_ids"]
        torch.testing.assert_close(model(text)[0], lm(ids)[0, -1], rtol=0, atol=1e-10)


def test_prompts_tokenise_like_transformer_lens_with_a_bos_first(smollm2):
    """SmolLM2's tokenizer has a BOS token: prompts get it first, as TL's to_tokens puts it."""
    task = load_prompt_task("ioi", 4, tokenizer=smollm2.tokenizer)
    tokens = tokenize_pairs(task, smollm2.tokenizer)
    for example, ids in zip(task.examples, tokens.input_ids, strict=True):
        assert ids == smollm2.to_tokens(example.prompt)[0].tolist()
    answers = [smollm2.to_single_token(e.answer) for e in task.examples]
    assert tokens.labels == answers
    assert tokens.distractors == [smollm2.to_single_token(e.distractor) for e in task.examples]


def test_a_long_prompt_loses_its_first_tokens_and_multi_token_answers_are_refused(answer):
    from mi_core.data import PromptExample, PromptTask

    long = PromptTask("long", (PromptExample("one two three four five six seven", " eight"),))
    tokens = tokenize_pairs(long, answer.tokenizer, max_length=4)
    # the tiny checkpoints' tokenizer has no BOS: the last four tokens are kept
    kept = answer.tokenizer.convert_ids_to_tokens(tokens.input_ids[0])
    assert kept == ["four", "five", "six", "seven"] and tokens.truncated == [0]
    bad = PromptTask("bad", (PromptExample("a b", " mary had a lamb"),))
    with pytest.raises(DataError, match="bad, prompt 0: the answer ' mary had a lamb' is 4 tokens"):
        tokenize_pairs(bad, answer.tokenizer)


def test_accuracy_and_logit_difference_by_hand():
    tokens = TokenizedPrompts([[1], [1], [1]], [[0]] * 3, [2, 0, 1], 8, 0, 0, [], "t", [0, 1, 2])
    logits = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.5, 0.0], [0.0, 1.0, 1.0]])
    # answer 2 vs distractor 0: 3 > 0; answer 0 vs 1: 2 < 2.5; answer 1 vs 2: tie is a loss
    assert tokens.accuracy(logits).tolist() == [1.0, 0.0, 0.0]
    assert tokens.logit_difference(logits).tolist() == [3.0, -0.5, 0.0]
    rival = tokens.answer_vs_rival(logits, torch.tensor([0, 1, 2]))
    assert rival.tolist() == [[3.0, 0.0], [2.0, 2.5], [1.0, 1.0]]
    top1 = TokenizedPrompts([[1], [1]], [[0]] * 2, [2, 0], 8, 0, 0, [], "t", None)
    two = logits[:2]
    assert top1.accuracy(two).tolist() == [1.0, 0.0]  # argmax 2 = answer; argmax 1 != 0
    assert top1.answer_vs_rival(two, torch.tensor([0, 1])).tolist() == [[3.0, 1.0], [2.0, 2.5]]
    assert top1.logit_difference(two).tolist() == pytest.approx([3.0 - 4 / 3, 2.0 - 4.5 / 3])


def test_the_pruning_kl_is_the_next_token_kl_at_the_answer_position(answer, ioi, lm_means):
    """The reference logits and the masked model's, through prune's own objective, against
    KL(p_full || p_masked) over the vocabulary written out from the LM's full logits."""
    tokens = tokenize_pairs(ioi, answer.tokenizer)
    batch = tokens.collate(range(len(ioi)))
    reference = compute_reference_logits(answer, tokens)
    mask = ComponentMask.from_removed(answer, parse_components("L0.H1,L2.MLP", answer))
    with torch.no_grad(), ablate(answer, mask, lm_means):
        masked = answer(batch["input_ids"], batch["attention_mask"])
    got = kl_to_reference(reference, masked)
    lm = load_model(answer.model_name)
    with torch.no_grad():
        full = _last(lm(batch["input_ids"]), batch["attention_mask"]).double()
    p = F.softmax(full, -1)
    q = F.log_softmax(masked.double(), -1)
    by_hand = (p * (p.log() - q)).sum(-1).mean()
    assert float(got) == pytest.approx(float(by_hand), rel=1e-4)
    assert float(got) > 1e-4  # the mask changed the distribution


def test_a_mask_by_hooks_equals_a_manual_ablation(answer, ioi, lm_means):
    """Mean-ablating a head and an MLP with hooks equals editing a copy's weights: the head's
    W_O rows zeroed with its mean output folded into b_O, the MLP's output replaced by its
    mean (W_out zeroed, b_out = the mean)."""
    batch = tokenize_pairs(ioi, answer.tokenizer).collate(range(len(ioi)))
    mask = ComponentMask.from_removed(answer, parse_components("L1.H2,L1.MLP", answer))
    with torch.no_grad(), ablate(answer, mask, lm_means):
        hooked = answer(batch["input_ids"], batch["attention_mask"])
    edited = copy.deepcopy(answer)
    with torch.no_grad():
        attn = edited.blocks[1].attn
        w_o = attn.W_O  # [head, d_head, d_model]
        attn.b_O += lm_means.z[1, 2].to(w_o) @ w_o[2]
        w_o[2] = 0
        mlp = edited.blocks[1].mlp
        mlp.W_out.zero_()
        mlp.b_out.copy_(lm_means.mlp_out[1].to(mlp.b_out))
        manual = edited(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(hooked, manual, rtol=0, atol=1e-4)
    assert (hooked - answer(batch["input_ids"], batch["attention_mask"])).abs().max() > 1e-3


def test_pruning_on_a_prompt_task_reaches_the_exact_target_and_resumes_bit_identical(
    lm_path, lm_means, tmp_path
):
    cfg = make_prune_config(
        "cofi", target_sparsity=0.4, seed=3, steps=10, batch_size=8, lr_log_alpha=0.5,
        checkpoint_every=4, eval_every=0,
    )  # fmt: skip
    kwargs = dict(means=lm_means, eval_sets=["ioi:abba", "ioi:baba"], max_train_examples=24,
                  max_eval_examples=16, progress=False)  # fmt: skip
    whole = prune_run(lm_path, "ioi:abba", tmp_path / "whole", cfg, **kwargs)
    n = 3 * 4 + 3
    assert whole.metrics["n_removed"] == round(0.4 * n) == len(whole.mask.removed())
    assert set(whole.metrics["accuracy"]) == {"ioi:abba", "ioi:baba"}
    assert whole.metrics["chance_accuracy"] == {"ioi:abba": 0.5, "ioi:baba": 0.5}

    with pytest.raises(KeyboardInterrupt):
        prune_run(lm_path, "ioi:abba", tmp_path / "cut", cfg, callback=kill_at(6), **kwargs)
    resumed = prune_run(lm_path, "ioi:abba", tmp_path / "cut", cfg, **kwargs)
    assert resumed.resumed_from == 4
    assert torch.equal(resumed.log_alpha, whole.log_alpha)
    assert resumed.mask == whole.mask and resumed.metrics["accuracy"] == whole.metrics["accuracy"]


def test_prompt_and_pair_data_are_not_mixed_and_a_classifier_cannot_take_prompts(
    lm_path, tiny_checkpoints, tmp_path
):
    cfg = make_prune_config("quick", target_sparsity=0.4, seed=1, steps=2)
    with pytest.raises(DataError, match="all be sentence pairs .* or all prompt tasks"):
        prune_run(lm_path, "ioi:abba", tmp_path / "a", cfg, eval_sets=["hans:so_swap"],
                  fill="zero", progress=False)  # fmt: skip
    with pytest.raises(DataError, match="unknown IOI split 'ioi:nope'"):
        prune_run(lm_path, "ioi:nope", tmp_path / "b", cfg, progress=False)
    with pytest.raises(ModelLoadError, match="task next_token reads a causal language model"):
        load_model(tiny_checkpoints["bert-cls"], task=NEXT_TOKEN)
    classifier = load_model(tiny_checkpoints["llama-cls"])
    task = load_prompt_task("ioi", 4, tokenizer=classifier.tokenizer)
    with pytest.raises(DataError, match="evaluate it with a language model loaded with task"):
        evaluate(classifier, task)


def test_evaluation_and_the_ablation_table_on_a_prompt_task(answer, ioi, lm_means):
    from mi_core.interventions.ablation_table import ablation_table

    tokens = tokenize_pairs(ioi, answer.tokenizer)
    batch = tokens.collate(range(len(ioi)))
    with torch.no_grad():
        logits = answer(batch["input_ids"], batch["attention_mask"])
    result = evaluate(answer, ioi)
    assert result.accuracy == pytest.approx(float(tokens.accuracy(logits).mean()))
    assert result.labels.tolist() == tokens.labels
    # the fast table (two columns kept per ablation) equals one forward pass per ablation
    heads = parse_components("L0.H0,L1.H3,L2.H1", answer)
    joints = [tuple(parse_components("L0.H0,L2.H1", answer))]
    batches = list(pair_batches(tokens, batch_size=8, sort_by_length=True))
    fast = ablation_logits(answer, batches, heads, joints, lm_means,
                           readout=tokens.answer_vs_rival)  # fmt: skip
    naive = naive_ablation_logits(answer, batches, heads, joints, lm_means)
    index = torch.arange(len(ioi))
    assert fast.full.shape == (len(ioi), 2)
    torch.testing.assert_close(fast.full, tokens.answer_vs_rival(naive.full, index), atol=1e-4,
                               rtol=0)  # fmt: skip
    for head in heads:
        want = tokens.answer_vs_rival(naive.singles[head], index)
        torch.testing.assert_close(fast.singles[head], want, atol=1e-4, rtol=0)
    torch.testing.assert_close(
        fast.joints[joints[0]], tokens.answer_vs_rival(naive.joints[joints[0]], index),
        atol=1e-4, rtol=0,
    )  # fmt: skip
    table = ablation_table(answer, [ioi], heads, joints, lm_means, batch_size=8)
    score = task_scorer(ioi, tokens)
    assert table.full["ioi:abba"] == pytest.approx(score(naive.full))
    for head in heads:
        assert table.singles[head]["ioi:abba"] == pytest.approx(score(naive.singles[head]))


def test_the_batched_executor_writes_the_local_executors_sweep_on_prompts(
    answer, lm_means, tmp_path
):
    from mi_core.pruning.sweeps import run_dir_for, run_sweep

    common = dict(
        means=lm_means, eval_sets=["ioi:abba", "ioi:baba"], profile="cofi",
        overrides={"steps": 8, "batch_size": 8, "lr_log_alpha": 0.5, "eval_every": 0},
        max_train_examples=24, max_eval_examples=16, progress=False,
    )  # fmt: skip
    local = run_sweep(answer, "ioi:abba", tmp_path / "local", [0.3, 0.6], [1], **common)
    batched = run_sweep(answer, "ioi:abba", tmp_path / "batched", [0.3, 0.6], [1],
                        executor="batched", group_size=2, **common)  # fmt: skip
    for s in (0.3, 0.6):
        a = ComponentMask.load(run_dir_for(tmp_path / "local", s, 1) / "mask.safetensors")
        b = ComponentMask.load(run_dir_for(tmp_path / "batched", s, 1) / "mask.safetensors")
        assert a == b and len(a.removed()) == round(s * 15)
    # the same table; a group's per-run sparsities are reductions over stacked rows, equal to
    # a run alone's up to float32 rounding (test_pruning_batched holds them to 1e-5 too)
    pd.testing.assert_frame_equal(batched.drop(columns="run_dir"), local.drop(columns="run_dir"),
                                  check_exact=False, rtol=0, atol=1e-6)  # fmt: skip


def test_means_by_position_are_each_positions_mean_and_fill_each_position(answer, ioi, tmp_path):
    """The option changes the fill: per-position means equal the cache averaged by hand at
    each position over the prompts that reach it, the overall means are unchanged, and a head
    removed with them carries its mean at each token's own position."""
    from mi_core.interventions import Subnetwork, load_means

    tokens = tokenize_pairs(ioi, answer.tokenizer)
    batches = list(pair_batches(tokens, batch_size=5))
    by_pos = compute_means(answer, batches, by_position=True)
    per_token_means = compute_means(answer, batches)
    assert by_pos.by_position and not per_token_means.by_position
    assert torch.equal(by_pos.z, per_token_means.z)  # the overall means are the same
    assert torch.equal(by_pos.mlp_out, per_token_means.mlp_out)
    batch = tokens.collate(range(len(ioi)))
    _, cache = answer.run_with_cache(batch["input_ids"], batch["attention_mask"])
    mask = batch["attention_mask"].double()
    longest = int(mask.sum(1).max())
    assert by_pos.z_by_position.shape == (3, longest, 4, answer.cfg.d_head)
    for layer in (0, 2):
        z = cache["z", layer].double()  # [batch, pos, head, d_head]
        want = (z * mask[:, :, None, None]).sum(0) / mask.sum(0)[:, None, None]
        # (float32 forwards of other batch compositions: rounding of that size)
        torch.testing.assert_close(by_pos.z_by_position[layer], want[:longest], rtol=1e-5,
                                   atol=1e-6)  # fmt: skip
        out = cache["mlp_out", layer].double()
        want_mlp = (out * mask[:, :, None]).sum(0) / mask.sum(0)[:, None]
        torch.testing.assert_close(by_pos.mlp_by_position[layer], want_mlp[:longest], rtol=1e-5,
                                   atol=1e-6)  # fmt: skip
    # a removed head carries its mean at each position (hook_z read after the fill)
    removed = ComponentMask.from_removed(answer, parse_components("L1.H2", answer))
    with torch.no_grad(), ablate(answer, removed, by_pos):
        _, filled = answer.run_with_cache(batch["input_ids"], batch["attention_mask"])
        per_position = answer(batch["input_ids"], batch["attention_mask"])
    width = batch["input_ids"].shape[1]
    want_z = by_pos.z_by_position[1, :width, 2].float().expand(len(ioi), -1, -1)
    torch.testing.assert_close(filled["z", 1][:, :, 2], want_z, rtol=0, atol=1e-6)
    with torch.no_grad(), ablate(answer, removed, per_token_means):
        per_token = answer(batch["input_ids"], batch["attention_mask"])
    assert (per_position - per_token).abs().max() > 1e-4  # the option changes the method
    # saved and read back, alone and inside a subnetwork
    again = load_means(by_pos.save(tmp_path / "means.safetensors"), answer)
    assert torch.equal(again.z_by_position, by_pos.z_by_position)
    subnetwork = Subnetwork(removed, "mean", by_pos)
    loaded = Subnetwork.load(subnetwork.save(tmp_path / "subnetwork.safetensors"))
    assert loaded.same_fill(subnetwork)
    assert not loaded.same_fill(Subnetwork(removed, "mean", per_token_means))


def test_the_fast_ablation_table_fills_per_position_as_one_pass_per_ablation(answer, ioi):
    tokens = tokenize_pairs(ioi, answer.tokenizer)
    batches = list(pair_batches(tokens, batch_size=8, sort_by_length=True))
    by_pos = compute_means(answer, batches, by_position=True)
    heads = parse_components("L0.H0,L1.H3,L2.H1", answer)
    fast = ablation_logits(answer, batches, heads, (), by_pos, readout=tokens.answer_vs_rival)
    naive = naive_ablation_logits(answer, batches, heads, (), by_pos)
    index = torch.arange(len(ioi))
    for head in heads:
        want = tokens.answer_vs_rival(naive.singles[head], index)
        torch.testing.assert_close(fast.singles[head], want, atol=1e-4, rtol=0)
