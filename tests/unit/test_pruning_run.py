"""The pruning run on a tiny BERT: objective, cached reference logits, training, discretisation,
exact resumption, NaN handling and the ``mi-core prune`` command."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from mi_core.cli import main
from mi_core.data import length_grouped_batches, load_pairs, pair_batches
from mi_core.data.batches import tokenize_pairs
from mi_core.errors import ConfigError, TrainingError
from mi_core.evaluation import evaluate
from mi_core.interventions import ComponentMask, ablate, compute_means
from mi_core.io import read_json, read_safetensors
from mi_core.models import load_model
from mi_core.pruning import loop as loop_module
from mi_core.pruning import make_prune_config, reference_logits, unflatten_components
from mi_core.pruning import step as step_module
from mi_core.pruning.discretize import THRESHOLD_GRID, binary_mask_from_log_alpha, discretize
from mi_core.pruning.objective import kl_to_reference
from mi_core.pruning.reference_logits import compute_reference_logits, load_reference_logits
from mi_core.pruning.run import prune_run
from mi_core.testing import make_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def means_file(means, tmp_path_factory):
    return means.save(tmp_path_factory.mktemp("means") / "means.safetensors")


def quick(sparsity=0.5, seed=1, **overrides):
    """CoFi's mechanics (the ``cofi`` profile) on the short schedule these tests were written for:
    lr 0.2, no accumulation, the target ramped over 65 % of the steps."""
    values = dict(
        steps=12,
        batch_size=8,
        grad_accumulation=1,
        lr_log_alpha=0.2,
        checkpoint_every=4,
        eval_batch_size=16,
    )
    values.update(overrides)
    values.setdefault("warmup_steps", round(values["steps"] * 78 / 120))
    return make_prune_config("cofi", sparsity, seed, **values)


# ------------------------------------------------------------------------------- objective
def test_kl_matches_the_definition_and_vanishes_on_equal_logits():
    torch.manual_seed(0)
    full, masked = torch.randn(5, 3), torch.randn(5, 3)
    p, q = full.softmax(-1), masked.softmax(-1)
    expected = (p * (p.log() - q.log())).sum(-1).mean()
    assert torch.allclose(kl_to_reference(full, masked), expected, atol=1e-6)
    assert float(kl_to_reference(full, full)) == pytest.approx(0.0, abs=1e-7)
    # the direction matters: KL(full || masked) differs from KL(masked || full)
    assert not torch.allclose(kl_to_reference(full, masked), kl_to_reference(masked, full))


def test_reference_logits_are_the_full_models_and_cached(tiny, train, tmp_path, tiny_checkpoints):
    tokenized = tokenize_pairs(train, tiny.tokenizer, 128)
    logits = compute_reference_logits(tiny, tokenized, batch_size=7)
    with torch.no_grad():
        direct = tiny(**tokenized.collate([0, 5, 9]))
    assert logits.shape == (len(train), 3)
    assert torch.allclose(logits[[0, 5, 9]], direct, atol=1e-5)
    path = tmp_path / "ref.safetensors"
    first = reference_logits(tiny, tokenized, path)
    assert path.is_file() and torch.equal(first, load_reference_logits(path, tiny, tokenized))
    other = load_model(make_tiny_checkpoint("bert-cls", tmp_path / "other", seed=3), task="mnli")
    with pytest.raises(ConfigError, match="other model weights"):
        load_reference_logits(path, other, tokenized)
    with pytest.raises(ConfigError, match="training data"):
        load_reference_logits(path, tiny, tokenize_pairs(train.head(40), tiny.tokenizer, 128))


# -------------------------------------------------------------------------------- training
def test_training_batches_are_random_length_grouped_and_repeatable():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(10, 120, (1000,), generator=gen).tolist()
    epochs = [length_grouped_batches(lengths, 32, seed=5, epoch=e) for e in range(2)]
    for batches in epochs:
        flat = [i for b in batches for i in b]
        assert len(batches) == 1000 // 32 and all(len(b) == 32 for b in batches)
        assert len(set(flat)) == len(flat)
    assert epochs[0] != epochs[1]
    assert epochs[0] == length_grouped_batches(lengths, 32, seed=5, epoch=0)
    assert epochs[0] != length_grouped_batches(lengths, 32, seed=6, epoch=0)

    def padded_tokens(batches):
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    shuffled = torch.randperm(1000, generator=gen).tolist()
    plain = [shuffled[i : i + 32] for i in range(0, 992, 32)]
    assert padded_tokens(epochs[0]) < 0.7 * padded_tokens(plain)
    assert length_grouped_batches(lengths[:10], 32, seed=0, epoch=0)[0] != []  # one short batch


def test_pruning_meets_the_target_and_beats_random_masks(tiny, train, means, tmp_path):
    cfg = quick(0.4, seed=3, steps=120, warmup_steps=80, lr_log_alpha=0.2, checkpoint_every=120)
    result = prune_run(tiny, train, tmp_path / "run", cfg, means=means, progress=False)
    log = result.log
    assert list(log["step"]) == list(range(120))
    # the target ramps linearly and the expected sparsity follows it
    assert log["target_sparsity"].iloc[20] == pytest.approx(0.4 * 20 / 80)
    assert log["expected_sparsity"].iloc[0] < 0.01
    assert abs(log["expected_sparsity"].iloc[-20:].mean() - 0.4) < 0.08
    assert float(log["lambda_2"].iloc[-1]) > 0  # ascent on lambda2 (its gradient is a square)
    # the model's weights stay frozen and untouched
    assert all(p.requires_grad for p in tiny.parameters())
    # exactly round(0.4 * 15) = 6 components removed, lowest log_alpha first
    n = 3 * 4 + 3
    assert result.metrics["n_removed"] == round(0.4 * n) == len(result.mask.removed())
    assert result.achieved_sparsity == pytest.approx(6 / 15)
    lowest = set(torch.argsort(result.log_alpha)[:6].tolist())
    flat_removed = {
        c.layer * 4 + c.head if c.head is not None else 12 + c.layer for c in result.mask.removed()
    }
    assert flat_removed == lowest
    assert read_json(tmp_path / "run" / "mask.json")["n_removed"] == 6
    # the learnt subnetwork stays closer to the full model than random ones of the same size
    tokenized = tokenize_pairs(train, tiny.tokenizer, 128)
    batch = tokenized.collate(range(len(train)))
    with torch.no_grad():
        full = tiny(**batch)

        def kl_of(mask):
            with ablate(tiny, mask, means):
                return float(kl_to_reference(full, tiny(**batch)))

        learnt = kl_of(result.mask)
        gen = torch.Generator().manual_seed(0)
        random_kls = []
        for _ in range(10):
            scores = torch.rand(n, generator=gen)
            keep, _ = binary_mask_from_log_alpha(scores, 0.4)
            random_kls.append(kl_of(ComponentMask(*unflatten_components(keep.float(), 3, 4))))
    assert learnt < sum(random_kls) / len(random_kls)


def _kill_at(kill_step: int):
    """A step callback that stops the run like Ctrl-C after step ``kill_step``."""

    def callback(step, row):
        if step == kill_step:
            raise KeyboardInterrupt

    return callback


def test_interrupted_run_resumes_to_the_same_mask(tiny, train, means, tmp_path):
    cfg = quick(0.5, seed=7, steps=12, lr_log_alpha=0.5, checkpoint_every=4)
    whole = prune_run(tiny, train, tmp_path / "whole", cfg, means=means, progress=False)

    with pytest.raises(KeyboardInterrupt):
        prune_run(
            tiny, train, tmp_path / "cut", cfg, means=means, progress=False, callback=_kill_at(9)
        )
    cut = tmp_path / "cut"
    assert not (cut / "metrics.json").exists()
    assert len(pd.read_csv(cut / "log.csv")) == 8  # the last checkpoint was after step 8
    # a kill between the checkpoint and log.csv left the log behind it: its rows were lost
    # for good; the checkpoint holds them
    pd.read_csv(cut / "log.csv").head(5).to_csv(cut / "log.csv", index=False)
    # resumed checkpointing more often (what changes nothing learnt may change on resume)
    often = cfg.replace(checkpoint_every=2)
    resumed = prune_run(tiny, train, cut, often, means=means, progress=False)
    assert read_json(cut / "config.json")["prune"]["checkpoint_every"] == 2
    assert resumed.resumed_from == 8
    assert torch.equal(resumed.log_alpha, whole.log_alpha)
    assert resumed.mask == whole.mask
    pd.testing.assert_frame_equal(
        pd.read_csv(cut / "log.csv"), pd.read_csv(tmp_path / "whole" / "log.csv")
    )
    assert (whole.log_alpha < 4.5).any()  # it did learn something

    # killed after its last checkpoint, before log.csv and metrics.json: the rows come back
    (cut / "metrics.json").unlink()
    pd.read_csv(cut / "log.csv").head(3).to_csv(cut / "log.csv", index=False)
    prune_run(tiny, train, cut, cfg, means=means, progress=False)
    pd.testing.assert_frame_equal(
        pd.read_csv(cut / "log.csv"), pd.read_csv(tmp_path / "whole" / "log.csv")
    )
    # a finished run is a no-op that reports the same result
    before = (cut / "metrics.json").stat().st_mtime_ns
    again = prune_run(tiny, train, cut, cfg, means=means, progress=False)
    assert again.already_complete and again.mask == whole.mask
    assert torch.equal(again.log_alpha, whole.log_alpha)
    assert (cut / "metrics.json").stat().st_mtime_ns == before
    # ...but not with other settings
    with pytest.raises(ConfigError, match="other settings"):
        prune_run(tiny, train, cut, quick(0.5, seed=8), means=means, progress=False)


def test_a_checkpoint_of_an_older_mi_core_is_refused(tiny, train, means, tmp_path):
    """A checkpoint without its log rows (written before they were kept) is refused with one
    line, not resumed from log.csv."""
    import json

    from mi_core.errors import TrainingError
    from mi_core.io import write_safetensors

    cfg = quick(0.5, seed=7, steps=8, checkpoint_every=4)

    with pytest.raises(KeyboardInterrupt):
        prune_run(tiny, train, tmp_path, cfg, means=means, progress=False, callback=_kill_at(5))
    checkpoint = tmp_path / "checkpoint.safetensors"
    tensors, metadata = read_safetensors(checkpoint)
    state = json.loads(metadata["state"])
    assert len(state.pop("log")) == 4  # today's checkpoint holds the rows of its steps
    write_safetensors(checkpoint, tensors, {**metadata, "state": json.dumps(state)})
    with pytest.raises(TrainingError, match=r"older mi_core \(it records no log rows\): delete"):
        prune_run(tiny, train, tmp_path, cfg, means=means, progress=False)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(
    tiny, train, means, tmp_path, monkeypatch
):
    calls = {"n": 0}
    real = step_module.with_penalty

    def turns_nan(*args):
        calls["n"] += 1
        loss = real(*args)
        if calls["n"] > 6:
            return type(loss)(loss.total * math.nan, loss.kl, loss.penalty)
        return loss

    monkeypatch.setattr(step_module, "with_penalty", turns_nan)
    with pytest.raises(TrainingError, match=r"step 6.*last good checkpoint \(step 4\)"):
        prune_run(tiny, train, tmp_path / "nan", quick(), means=means, progress=False)
    tensors = read_safetensors(tmp_path / "nan" / "checkpoint.safetensors")[0]
    assert torch.isfinite(tensors["log_alpha"]).all()
    assert len(pd.read_csv(tmp_path / "nan" / "log.csv")) == 4


def test_zero_ablation_needs_no_means_and_params_weighting(tiny, train, tmp_path):
    cfg = quick(0.3, steps=4, fill="zero", sparsity_weighting="params")
    result = prune_run(tiny, train, tmp_path / "z", cfg, eval_sets=[train.head(16)], progress=False)
    assert result.metrics["achieved_sparsity_by_weight"] is not None
    assert 0 <= result.accuracy[train.name] <= 1
    with pytest.raises(ConfigError, match="needs --means"):
        prune_run(tiny, train, tmp_path / "m", quick(), progress=False)


def test_a_run_folder_that_records_the_fill_as_ablation_is_refused(tiny, train, tmp_path):
    """The fill was recorded as ``ablation`` before it was named ``fill``: such a run folder
    lacks a field of today's PruneConfig and is refused in one line, not resumed."""
    from mi_core.io import write_json

    cfg = quick(0.3, steps=2, checkpoint_every=2, fill="zero")
    prune_run(tiny, train, tmp_path, cfg, progress=False)
    saved = read_json(tmp_path / "config.json")
    saved["prune"]["ablation"] = saved["prune"].pop("fill")  # as an older mi_core wrote it
    write_json(tmp_path / "config.json", saved)
    older = r"older mi_core \(it records no fill\): delete .* and run it again"
    with pytest.raises(ConfigError, match=older):
        prune_run(tiny, train, tmp_path, cfg, progress=False)


# ------------------------------------------------------------------------------------- CLI
def _cli(args, capsys):
    capsys.readouterr()  # drop output from set-up
    code = main(args)
    return code, capsys.readouterr()


#: The short CoFi run the CLI tests train.
SHORT_COFI = "--profile cofi --steps 6 --batch-size 8".split()


def test_cli_prune_writes_every_file_and_reports(
    tiny_checkpoints, means_file, tmp_path, capsys, data_dir
):
    out = tmp_path / "run"
    args = [
        "prune", "--model", str(tiny_checkpoints["bert-cls"]), "--means", str(means_file),
        *"--train mnli:train --max-train-examples 32 --sparsity 0.5 --seed 3".split(),
        *SHORT_COFI,
        *"--eval mnli:validation_matched hans:ln_preposition --max-eval-examples 24".split(),
        "--out", str(out), "--no-progress",
    ]  # fmt: skip
    code, captured = _cli(args, capsys)
    assert code == 0, captured.err
    files = ("config.json", "mask.safetensors", "mask.json", "subnetwork.safetensors", "log.csv")
    for name in (*files, "metrics.json"):
        assert (out / name).is_file(), name
    metrics = read_json(out / "metrics.json")
    assert set(metrics["accuracy"]) == {"mnli:validation_matched", "hans:ln_preposition"}
    assert set(metrics["full_accuracy"]) == set(metrics["accuracy"])
    assert metrics["n_removed"] == round(0.5 * 15)
    log = pd.read_csv(out / "log.csv")
    first = ["step", "loss", "kl", "penalty", "expected_sparsity", "target_sparsity"]
    assert list(log.columns[:6]) == first
    assert {"lambda_1", "lambda_2"} <= set(log.columns) and len(log) == 6
    config = read_json(out / "config.json")
    assert config["prune"]["steps"] == 6 and config["prune"]["warmup_steps"] == round(6 * 90 / 93)
    assert metrics["reached_target"] is False  # 6 steps: the run itself warned, by its logger
    assert "warning: the sparsity ended" not in captured.err  # not a second time
    # the run's subnetwork from disk, applied, is the subnetwork its metrics measured
    from mi_core import apply, evaluate, load_intervention
    from mi_core.naming import Component

    model = load_model(tiny_checkpoints["bert-cls"], task="mnli")
    data = load_pairs("mnli:validation_matched", max_examples=24)
    with apply(model, load_intervention(out / "subnetwork.safetensors")):
        accuracy = evaluate(model, data, batch_size=8).accuracy
    assert accuracy == pytest.approx(metrics["accuracy"]["mnli:validation_matched"])
    assert accuracy != pytest.approx(evaluate(model, data, batch_size=8).accuracy)
    (out / "subnetwork.safetensors").unlink()  # a run finished before the file existed
    code, captured = _cli(args, capsys)
    assert code == 0 and "already complete" in captured.out
    assert captured.err.count("warning: the sparsity ended at") == 1  # the finished run's report
    assert load_intervention(out / "subnetwork.safetensors").mask.removed() == [
        Component.parse(name) for name in metrics["removed"]
    ]


def _one_line_error(capsys, args, match):
    code, captured = _cli(args, capsys)
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert match in lines[0], lines[0]


def test_cli_prune_bad_input_is_one_line(
    tiny_checkpoints, means_file, tmp_path, capsys, data_dir, monkeypatch
):
    model = str(tiny_checkpoints["bert-cls"])
    base = ["prune", "--model", model, *"--train mnli:train --max-train-examples 16".split(),
            *SHORT_COFI, "--no-progress"]  # fmt: skip
    ok = [*base, "--means", str(means_file), "--sparsity", "0.5"]
    _one_line_error(
        capsys,
        [*base, "--means", str(means_file), "--sparsity", "1.5", "--out", str(tmp_path / "a")],
        "between 0 and 1",
    )
    _one_line_error(capsys, [*ok, "--seed", "x", "--out", str(tmp_path / "b")], "--seed")
    other = make_tiny_checkpoint("bert-cls", tmp_path / "other", seed=5)
    other_means = compute_means(
        load_model(other, task="mnli"),
        pair_batches(load_pairs("mnli:train", max_examples=8), load_model(other).tokenizer),
    ).save(tmp_path / "other.safetensors")
    _one_line_error(
        capsys,
        [*base, "--means", str(other_means), "--sparsity", "0.5", "--out", str(tmp_path / "c")],
        "means were computed for model",
    )
    qqp = [
        "prune",
        "--model",
        model,
        "--means",
        str(means_file),
        "--train",
        "qqp:train",
        "--max-train-examples",
        "16",
        "--sparsity",
        "0.5",
        "--out",
        str(tmp_path / "d"),
    ]
    _one_line_error(capsys, qqp, "qqp")
    _one_line_error(
        capsys, [*base, "--sparsity", "0.5", "--out", str(tmp_path / "e")], "needs --means"
    )

    real = step_module.with_penalty

    def nan_loss(*args):
        loss = real(*args)
        return type(loss)(loss.total * math.nan, loss.kl, loss.penalty)

    monkeypatch.setattr(step_module, "with_penalty", nan_loss)
    _one_line_error(capsys, [*ok, "--out", str(tmp_path / "f")], "NaN")


# ----------------------------------------------------- the authors' recipe in a pruning run
def _run(tiny, train, means, tmp_path, name, **overrides):
    values = dict(steps=16, batch_size=8, checkpoint_every=8, eval_batch_size=16)
    cfg = make_prune_config("paper", 0.5, 3, **{**values, **overrides})
    return prune_run(tiny, train, tmp_path / name, cfg, means=means, progress=False)


def test_paper_recipe_run_logs_every_mechanism_and_differs_from_cofi(tiny, train, means, tmp_path):
    paper = _run(tiny, train, means, tmp_path, "paper", lr_warmup_steps=4)
    log = paper.log
    # learning rate: warm-up from 0 over 4 steps, then linear decay towards 0
    assert log["lr_factor"].tolist()[:6] == [0.0, 0.25, 0.5, 0.75, 1.0, 11 / 12]
    # log_alpha starts around 10: samples are all 1 and nothing is pruned in so few steps
    assert (log["sampled_sparsity"] == 0).all()
    assert paper.metrics["reached_target"] is False
    assert paper.metrics["discretize"] == "reference"
    assert paper.metrics["threshold"] in THRESHOLD_GRID
    # with no gradient through clamped samples, only weight decay moved log_alpha
    assert (paper.log_alpha < 10.1).all() and (paper.log_alpha > 9.8).all()
    # dropout changes the KL of the very same gates; switching it off removes the noise
    no_dropout = _run(tiny, train, means, tmp_path, "nodrop", lr_warmup_steps=4, dropout=False)
    assert (log["kl"] > 0).all()
    assert (no_dropout.log["kl"] < 1e-6).all()  # gates at 1 and no dropout: the full model


def test_the_subnetwork_is_evaluated_every_eval_every_steps_without_dropout(
    tiny, train, means, tmp_path, monkeypatch
):
    from mi_core.models.dropout import DropoutRates

    # dropout this strong changes the subnetwork's predictions: a probe inside the training
    # step's dropout would not match the dropout-free evaluations below
    monkeypatch.setattr(tiny, "dropout_rates", DropoutRates(attention=0.6, hidden=0.6), False)
    seen = []  # each discretisation: the probes' (gates after the step, target), then the end's

    def recording(log_alpha, n_layers, n_heads, target, *args, **kwargs):
        seen.append((log_alpha.detach().clone(), target))
        return discretize(log_alpha, n_layers, n_heads, target, *args, **kwargs)

    monkeypatch.setattr(loop_module, "discretize", recording)
    monkeypatch.setattr(loop_module, "PROBE_EXAMPLES", 20)  # the probe reads the first 20
    held = train.head(24)
    other = load_pairs("mnli:validation_matched", max_examples=8)
    cfg = make_prune_config(
        "paper", 0.5, 3, steps=12, warmup_steps=6, batch_size=8, checkpoint_every=4,
        eval_batch_size=16, eval_every=4, lr_warmup_steps=2, lr_log_alpha=0.3,
        log_alpha_init=1.0, log_alpha_init_std=0.0, weight_decay=0.0,
    )  # fmt: skip
    assert cfg.dropout
    result = prune_run(
        tiny, train, tmp_path / "run", cfg, means=means, eval_sets=[held, other], progress=False
    )
    log = pd.read_csv(tmp_path / "run" / "log.csv")
    probed = log.dropna(subset=["eval_accuracy"])
    assert probed.step.tolist() == [3, 7, 11]  # after steps 4, 8 and 12
    assert log.eval_sparsity.notna().tolist() == log.eval_accuracy.notna().tolist()
    assert len(seen) == 4  # three probes (the first eval set only), then the final mask
    assert [t for _, t in seen[:3]] == probed.target_sparsity.tolist() == [3 / 6 * 0.5, 0.5, 0.5]
    assert torch.equal(seen[3][0], result.log_alpha)  # the last probe saw the final gates
    assert torch.equal(seen[2][0], result.log_alpha)
    assert len({tuple(la.tolist()) for la, _ in seen[:3]}) == 3  # the gates moved in between
    for (log_alpha, target), (_, row) in zip(seen[:3], probed.iterrows(), strict=True):
        keep, achieved = discretize(log_alpha, 3, 4, target, "reference", beta=cfg.beta)
        heads, mlps = unflatten_components(keep.float(), 3, 4)
        alone = evaluate(tiny, held.head(20), mask=ComponentMask(heads, mlps), means=means)
        assert row.eval_accuracy == alone.accuracy
        assert row.eval_sparsity == achieved.by_count
    # the last probe is the run's result on the first 20 examples of its first eval set
    final = evaluate(tiny, held.head(20), mask=result.mask, means=means)
    assert probed.eval_accuracy.iloc[-1] == final.accuracy
    assert probed.eval_sparsity.iloc[-1] == result.metrics["achieved_sparsity"]
    assert final.accuracy != evaluate(tiny, held, mask=result.mask, means=means).accuracy
    # and off: no evaluations
    seen.clear()
    off = prune_run(tiny, train, tmp_path / "off", cfg.replace(eval_every=0), means=means,
                    eval_sets=[held], progress=False)  # fmt: skip
    assert off.log.eval_accuracy.isna().all() and len(seen) == 1
    assert torch.equal(off.log_alpha, result.log_alpha)  # evaluating changes nothing learnt
    with pytest.raises(ConfigError, match="eval_every must be non-negative"):
        cfg.replace(eval_every=-1)


#: Gates that start at log_alpha 1, where gradients flow at once, with no decay or dropout noise.
MOVING_GATES = dict(
    lr_log_alpha=0.3, log_alpha_init=1.0, log_alpha_init_std=0.0, weight_decay=0.0, dropout=False
)


def test_sampled_and_expected_estimates_drive_different_runs(tiny, train, means, tmp_path):
    common = dict(steps=24, warmup_steps=12, **MOVING_GATES)
    sampled = _run(tiny, train, means, tmp_path, "s", **common)
    expected = _run(tiny, train, means, tmp_path, "e", sparsity_estimate="expected", **common)
    # at log_alpha 1 the expected estimate already reads ~7 % sparse, the sampled ~30 %
    assert expected.log["expected_sparsity"].iloc[0] < 0.1
    assert sampled.log["sampled_sparsity"].iloc[0] > 0.15
    assert not torch.allclose(sampled.log_alpha, expected.log_alpha)


def test_gradient_clipping_is_applied(tiny, train, means, tmp_path):
    common = dict(steps=8, warmup_steps=4, lr_schedule="constant", **MOVING_GATES)
    free = _run(tiny, train, means, tmp_path, "free", max_grad_norm=0.0, **common)
    clipped = _run(tiny, train, means, tmp_path, "clip", max_grad_norm=1e-12, **common)
    # Adam is invariant to a constant gradient scale, so clip so hard that Adam's eps dominates
    assert (free.log["grad_norm"] > 1e-6).all()
    moved_free = (free.log_alpha - 1.0).abs().max()
    moved_clipped = (clipped.log_alpha - 1.0).abs().max()
    assert moved_clipped < 0.1 * moved_free


def test_in_memory_run_equals_the_run_with_files_and_writes_nothing(
    tiny, train, means, tmp_path, monkeypatch
):
    from mi_core.pruning import prune

    cfg = quick(0.5, seed=7, steps=12, lr_log_alpha=0.5, checkpoint_every=4)
    on_disk = prune_run(tiny, train, tmp_path / "files", cfg, means=means, progress=False)
    monkeypatch.chdir(tmp_path / "files")  # nothing may appear here or anywhere else
    before = sorted(p.name for p in tmp_path.rglob("*"))
    in_memory = prune(tiny, train, means, cfg, progress=False)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert in_memory.run_dir is None and in_memory.mask == on_disk.mask
    assert torch.equal(in_memory.log_alpha, on_disk.log_alpha)
    pd.testing.assert_frame_equal(in_memory.log, on_disk.log)
    assert in_memory.metrics["n_removed"] == on_disk.metrics["n_removed"]


def test_prune_takes_loaded_objects_and_prune_run_takes_paths(tiny, train, means, tmp_path):
    """Paths are resolved at the boundary (prune_run, the CLI, a Ray worker): prune refuses
    them with one line naming the loaders, and prune_run records where its inputs came from."""
    from mi_core.pruning import prune

    means_path = means.save(tmp_path / "means.safetensors")
    cfg = quick(0.5, seed=7, steps=2)
    with pytest.raises(ConfigError, match=r"prune takes loaded objects \(train, means given"):
        prune(tiny, "mnli:train", str(means_path), cfg, out=tmp_path / "x")
    with pytest.raises(ConfigError, match=r"\(eval_sets given"):
        prune(tiny, train, means, cfg, eval_sets=["mnli:validation_matched"])
    # loaded sets are checked as loaded files are: the model's task, not empty
    from mi_core.errors import DataError

    with pytest.raises(DataError, match="training set .* is empty"):
        prune(tiny, train.subset([]), means, cfg)
    with pytest.raises(DataError, match="is qqp data, but the model is a mnli classifier"):
        prune(tiny, load_pairs("qqp:validation", max_examples=4), means, cfg)
    with pytest.raises(ConfigError, match="reference= gives an in-memory run"):
        prune(tiny, train, means, cfg, out=tmp_path / "x", reference=torch.zeros(len(train), 3))
    assert not (tmp_path / "x").exists()
    run = prune_run(tiny, train, tmp_path / "run", cfg, means=str(means_path), progress=False)
    recorded = read_json(tmp_path / "run" / "config.json")
    assert recorded["means_path"] == str(means_path) and run.run_dir == tmp_path / "run"
    again = prune(tiny, train, means, cfg, out=tmp_path / "run", progress=False)
    assert again.already_complete and again.mask == run.mask  # loaded means: the same run
    # means loaded from a file (as the experiment's stages share them) still name the file
    from mi_core.interventions import load_means

    prune_run(tiny, train, tmp_path / "loaded", cfg, means=load_means(means_path, tiny),
              progress=False)  # fmt: skip
    assert read_json(tmp_path / "loaded" / "config.json")["means_path"] == str(means_path)


def test_a_run_shows_its_progress_where_stderr_is_no_terminal(tiny, train, means, capsys):
    """A notebook's stderr is no TTY either: with tqdm's automatic mode (the old default) the
    longest stage of a notebook's experiment, the pruning, showed no bar there. The bar shows
    unless ``progress=False``, wherever stderr goes."""
    import sys

    from mi_core.pruning import prune

    assert not sys.stderr.isatty()  # pytest's capture, as in a notebook or a redirected job
    capsys.readouterr()
    cfg = quick(0.5, seed=3, steps=2)
    prune(tiny, train, means, cfg)
    assert "prune s=0.5 seed=3" in capsys.readouterr().err
    prune(tiny, train, means, cfg, progress=False)
    assert "prune s=" not in capsys.readouterr().err
