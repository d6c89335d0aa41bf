"""Pruning a language model on plain text: the KL between the full and the pruned model's
next-token distributions at every position (a task-free subnetwork), the full model's
distributions computed each step without dropout; windows of a corpus as training data;
exact target, resume, groups and the CLI on it; plain text refused where a set is scored."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers import kill_at

from mi_core.data import TokenizedText, load_text_task, pair_batches, tokenize_pairs
from mi_core.data.text import token_windows
from mi_core.errors import ConfigError, DataError
from mi_core.evaluation import evaluate
from mi_core.interventions import ComponentMask, ablate, compute_means
from mi_core.interventions.components import parse_components
from mi_core.models import load_model
from mi_core.models.dropout import DropoutRates, dropout_suspended, train_dropout
from mi_core.pruning import make_prune_config
from mi_core.pruning.objectives import full_and_masked_kl
from mi_core.pruning.reference_logits import compute_reference_logits
from mi_core.pruning.run import prune, prune_run
from mi_core.tasks import NEXT_TOKEN


@pytest.fixture(scope="module")
def text(answer):
    return load_text_task("text:wikitext", 24, tokenizer=answer.tokenizer)


@pytest.fixture(scope="module")
def text_means(answer, text):
    return compute_means(answer, pair_batches(text, answer.tokenizer, batch_size=8))


def test_text_windows_spread_over_the_corpus_with_a_start_token(answer):
    every = load_text_task("text:wikitext", tokenizer=answer.tokenizer)
    windows = token_windows(answer.tokenizer, "text:wikitext", 64, prepend_bos=True)
    assert len(every) == windows.shape[0] and every.windows[5] == tuple(windows[5].tolist())
    picked = load_text_task("text:wikitext", 24, tokenizer=answer.tokenizer)
    n = len(every)
    assert picked.windows == tuple(every.windows[i * n // 24] for i in range(24))
    assert picked.task == NEXT_TOKEN and picked.name == "text:wikitext"
    start = answer.tokenizer.sep_token_id  # the tiny checkpoints' tokenizer has no BOS
    assert all(w[0] == start and len(w) == 64 for w in picked.windows)
    assert (
        picked.selection()
        == load_text_task("text:wikitext", 24, tokenizer=answer.tokenizer).selection()
        != picked.head(23).selection()
    )
    tokens = tokenize_pairs(picked, answer.tokenizer, max_length=32)
    assert isinstance(tokens, TokenizedText) and tokens.lengths == [32] * 24
    assert tokens.n_truncated == 24
    with pytest.raises(DataError, match="unknown text spec 'text:nope.txt'"):
        load_text_task("text:nope.txt", tokenizer=answer.tokenizer)


def test_a_local_text_file_is_a_text_task(answer, tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_text("\n".join(json.dumps({"text": "the cat sat on the mat " * 20})
                              for _ in range(3)))  # fmt: skip
    task = load_text_task(f"text:{path}", tokenizer=answer.tokenizer, window=16)
    assert len(task) > 3 and all(len(w) == 16 for w in task.windows)


def _by_hand(full: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean over positions of sum_v p_full (log p_full - log p_masked), per row (float64)."""
    p = F.softmax(full.double(), -1)
    return (p * (p.log() - F.log_softmax(masked.double(), -1))).sum(-1).mean(-1)


def test_the_text_objective_is_the_kl_at_every_position(answer, text, text_means):
    """The step's KL against KL(p_full || p_masked) written out from TransformerLens's LM
    logits at every position; the answer-position KL of the same tokens differs from it (the
    option changes the method); with every component kept it is zero."""
    batch = tokenize_pairs(text, answer.tokenizer).collate(range(8))
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    removed = ComponentMask.from_removed(answer, parse_components("L0.H1,L1.MLP", answer))
    mask = ComponentMask.ones(answer)
    with torch.no_grad(), ablate(answer, mask, text_means, skip_unmasked=False):
        mask.heads, mask.mlps = removed.heads.clone(), removed.mlps.clone()
        got = full_and_masked_kl(answer, mask, inputs)
        assert torch.equal(mask.heads, removed.heads)  # the step's mask is put back
        mask.heads, mask.mlps = torch.ones_like(mask.heads), torch.ones_like(mask.mlps)
        assert float(full_and_masked_kl(answer, mask, inputs).abs().max()) == 0.0
    lm = load_model(answer.model_name)
    with torch.no_grad():
        full = lm(batch["input_ids"])
        with ablate(lm, removed, text_means):
            masked = lm(batch["input_ids"])
    want = _by_hand(full, masked)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-7)
    last_only = _by_hand(full[:, -1:], masked[:, -1:])
    assert float((want - last_only).abs().max()) > 1e-3


def test_the_full_models_pass_runs_without_dropout(answer, text):
    """Under the checkpoint's dropout, the reference pass drops nothing and draws no random
    numbers: the KL equals the one written out from a dropout-free full pass and a masked
    pass under the same random state."""
    batch = tokenize_pairs(text, answer.tokenizer).collate(range(4))
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    rates = DropoutRates(hidden=0.3)
    mask = ComponentMask.ones(answer)
    with torch.no_grad(), ablate(answer, mask, None, "zero", skip_unmasked=False):
        clean = answer.every_position_logits(batch["input_ids"])
        with train_dropout(answer, rates=rates):
            with dropout_suspended():
                assert torch.equal(answer.every_position_logits(batch["input_ids"]), clean)
            torch.manual_seed(7)
            got = full_and_masked_kl(answer, mask, inputs)
            torch.manual_seed(7)
            dropped = answer.every_position_logits(batch["input_ids"])
    assert float(got.min()) > 1e-4  # the masked pass did drop out
    torch.testing.assert_close(got.double(), _by_hand(clean, dropped), rtol=1e-4, atol=1e-7)


def test_pruning_on_text_reaches_the_exact_target_resumes_and_groups_as_alone(
    lm_path, answer, text, text_means, tmp_path
):
    cfg = make_prune_config(
        "cofi", target_sparsity=0.4, seed=3, steps=10, batch_size=8, lr_log_alpha=0.5,
        checkpoint_every=4, eval_every=0, grad_accumulation=1, max_length=24,
    )  # fmt: skip
    kwargs = dict(means=text_means, eval_sets=["ioi:abba"], max_train_examples=24,
                  max_eval_examples=16, progress=False)  # fmt: skip
    whole = prune_run(lm_path, "text:wikitext", tmp_path / "whole", cfg, **kwargs)
    assert whole.metrics["n_removed"] == round(0.4 * 15) == len(whole.mask.removed())
    assert set(whole.metrics["accuracy"]) == {"ioi:abba"}
    assert not (tmp_path / "whole" / "reference_logits.safetensors").exists()
    recorded = json.loads((tmp_path / "whole" / "config.json").read_text())
    assert recorded["train"]["name"] == "text:wikitext"
    assert recorded["train"]["n_examples"] == 24

    with pytest.raises(KeyboardInterrupt):
        prune_run(lm_path, "text:wikitext", tmp_path / "cut", cfg, callback=kill_at(6), **kwargs)
    resumed = prune_run(lm_path, "text:wikitext", tmp_path / "cut", cfg, **kwargs)
    assert resumed.resumed_from == 4 and torch.equal(resumed.log_alpha, whole.log_alpha)
    # in memory, from loaded objects, the same run
    alone = prune(answer, text, text_means, cfg, progress=False)
    torch.testing.assert_close(alone.log_alpha, whole.log_alpha, rtol=0, atol=1e-6)
    # two runs trained together end as each alone
    from mi_core.pruning.run import prune_group

    other = make_prune_config(
        "cofi", target_sparsity=0.6, seed=1, steps=10, batch_size=8, lr_log_alpha=0.5,
        checkpoint_every=4, eval_every=0, grad_accumulation=1, max_length=24,
    )  # fmt: skip
    group = prune_group(answer, text, text_means, [cfg, other],
                        [tmp_path / "g0", tmp_path / "g1"], progress=False)  # fmt: skip
    single = prune(answer, text, text_means, other, progress=False)
    torch.testing.assert_close(group[0].log_alpha, whole.log_alpha, rtol=0, atol=1e-5)
    torch.testing.assert_close(group[1].log_alpha, single.log_alpha, rtol=0, atol=1e-5)


def test_plain_text_is_training_data_only(lm_path, answer, text, tmp_path):
    cfg = make_prune_config("quick", target_sparsity=0.4, seed=1, steps=2, fill="zero")
    with pytest.raises(DataError, match="text:wikitext is plain text: it has no answer to score"):
        prune_run(lm_path, "ioi:abba", tmp_path / "a", cfg, eval_sets=["text:wikitext"],
                  progress=False)  # fmt: skip
    with pytest.raises(DataError, match="it has no answer to score"):
        evaluate(answer, text)
    with pytest.raises(ConfigError, match="computed each step, at every position"):
        compute_reference_logits(answer, tokenize_pairs(text, answer.tokenizer))
    with pytest.raises(DataError, match="all be sentence pairs .* or all prompt tasks"):
        prune_run(lm_path, "text:wikitext", tmp_path / "b", cfg, eval_sets=["hans:so_swap"],
                  progress=False)  # fmt: skip


def test_the_cli_prunes_on_text_and_evaluates_on_prompts(lm_path, tmp_path, capsys):
    from mi_core.cli import main

    means = tmp_path / "means.safetensors"
    assert main(["means", "--model", str(lm_path), "--data", "text:wikitext",
                 "--max-examples", "16", "--out", str(means)]) == 0  # fmt: skip
    out = tmp_path / "run"
    argv = ["prune", "--model", str(lm_path), "--train", "text:wikitext", "--eval", "ioi:baba",
            "--means", str(means), "--out", str(out), "--sparsity", "0.4", "--no-progress",
            "--steps", "4", "--batch-size", "8", "--max-train-examples", "16",
            "--max-eval-examples", "8", "--profile", "cofi", "--max-length", "24"]  # fmt: skip
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["accuracy"]) == {"ioi:baba"} and metrics["steps"] == 4
    capsys.readouterr()
    bad = [*argv[:-2], "--eval", "text:python"]
    bad[bad.index("--out") + 1] = str(tmp_path / "bad")
    assert main(bad) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "text:python is plain text" in err[0]


def test_sweeps_on_text_in_memory_local_and_batched_agree(answer, text_means, tmp_path):
    from mi_core.pruning.sweeps import (
        run_dir_for,
        run_sweep,
        sweep,
        training_bytes_per_example,
    )

    common = dict(
        eval_sets=["ioi:abba"], profile="cofi",
        overrides={"steps": 6, "batch_size": 8, "lr_log_alpha": 0.5, "eval_every": 0,
                   "grad_accumulation": 1, "max_length": 24},
        max_train_examples=16, max_eval_examples=8, progress=False,
    )  # fmt: skip
    local = run_sweep(answer, "text:wikitext", tmp_path / "local", [0.3, 0.6], [1],
                      means=text_means, **common)  # fmt: skip
    batched = run_sweep(answer, "text:wikitext", tmp_path / "batched", [0.3, 0.6], [1],
                        means=text_means, executor="batched", group_size=2, **common)  # fmt: skip
    memory = sweep(answer, "text:wikitext", text_means, [0.3, 0.6], [1], **common)
    for k, s in enumerate((0.3, 0.6)):
        a = ComponentMask.load(run_dir_for(tmp_path / "local", s, 1) / "mask.safetensors")
        b = ComponentMask.load(run_dir_for(tmp_path / "batched", s, 1) / "mask.safetensors")
        assert a == b == memory.masks[k] and len(a.removed()) == round(s * 15)
    assert batched.drop(columns="run_dir").equals(local.drop(columns="run_dir"))
    assert not (tmp_path / "local" / "reference_logits.safetensors").exists()
    # a batched group's memory estimate counts the vocabulary rows of every position
    extra = training_bytes_per_example(answer, 24, every_position=True)
    assert extra - training_bytes_per_example(answer, 24) == 4 * 6 * answer.cfg.d_vocab_out * 24


def test_a_text_file_edited_between_a_kill_and_the_resume_is_refused(
    lm_path, text_means, data_dir, tmp_path
):
    """The resume ran on, on the edited text, to a mask neither run would give; a run on text
    now records a digest of its windows (prompt and pair files are caught by their reference
    logits' digest)."""
    corpus = tmp_path / "corpus.txt"
    words = (data_dir / "text" / "wikitext2_test.raw").read_text(encoding="utf-8")[:20000]
    corpus.write_text(words, encoding="utf-8")
    cfg = make_prune_config(
        "cofi", target_sparsity=0.4, seed=3, steps=6, batch_size=8, checkpoint_every=2,
        eval_every=0, grad_accumulation=1, max_length=24,
    )  # fmt: skip
    kwargs = dict(means=text_means, max_train_examples=8, progress=False)

    def kill(step, row):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prune_run(lm_path, f"text:{corpus}", tmp_path / "run", cfg, callback=kill, **kwargs)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["train"]
    assert len(recorded["tokens"]) == 16
    corpus.write_text(words.replace("the", "a"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"other settings \(train differ\)"):
        prune_run(lm_path, f"text:{corpus}", tmp_path / "run", cfg, **kwargs)
    corpus.write_text(words, encoding="utf-8")  # the text as it was: the run resumes
    resumed = prune_run(lm_path, f"text:{corpus}", tmp_path / "run", cfg, **kwargs)
    assert 0 < resumed.resumed_from < 6
