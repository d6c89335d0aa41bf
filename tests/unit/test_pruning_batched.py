"""Many pruning runs per forward pass: per-example masks, the batched pruning step, runs trained
together (``prune_group``) against the same runs alone, per-run resume, the ``batched`` sweep
executor and the memory-based group size."""

from __future__ import annotations

import inspect

import pandas as pd
import pytest
import torch
from helpers import FLOAT32_EPS, assert_float32_close

from mi_core.data import pair_batches
from mi_core.data.batches import tokenize_pairs
from mi_core.errors import ConfigError, InterventionError
from mi_core.interventions import ComponentMask, ablate
from mi_core.io import read_json
from mi_core.models import load_model
from mi_core.pruning import make_prune_config
from mi_core.pruning.discretize import discretize
from mi_core.pruning.hard_concrete import HardConcrete
from mi_core.pruning.lagrangian import LagrangianController
from mi_core.pruning.run import prune_group, prune_run
from mi_core.pruning.step import StepMember, group_pruning_step, length_chunks
from mi_core.pruning.sweeps import (
    auto_group_size,
    run_dir_for,
    run_sweep,
    training_bytes_per_example,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=["bert-cls", "gpt2-cls"])
def classifier(request, tiny_checkpoints):
    return load_model(tiny_checkpoints[request.param], task="mnli")


def recipe(sparsity=0.5, seed=1, **overrides):
    """The paper's recipe (sampled sparsity, AdamW with weight decay, clipping, warm-up), short,
    with dropout off unless asked for."""
    values = dict(
        steps=20,
        batch_size=8,
        grad_accumulation=2,
        checkpoint_every=5,
        eval_batch_size=16,
        dropout=False,
        log_alpha_init=3.0,
        warmup_steps=10,
        lr_warmup_steps=4,
    )
    values.update(overrides)
    return make_prune_config("paper", sparsity, seed, **values)


# ----------------------------------------------------------------------- per-example masks
def test_a_stacked_mask_gives_each_example_its_own_masks_output(classifier, train):
    model = classifier
    batch = next(iter(pair_batches(train, model.tokenizer, batch_size=6)))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    a = ComponentMask.from_removed(model, "L0.H1,L1.MLP")
    b = ComponentMask.from_removed(model, "L1.H0,L0.MLP")
    with ablate(model, a, None, "zero"):
        want_a = model(**inputs)
    with ablate(model, b, None, "zero"):
        want_b = model(**inputs)
    both = {k: torch.cat([v, v]) for k, v in inputs.items()}
    stacked = ComponentMask.stack([a, b], sizes=[6, 6])
    assert stacked.batch_size == 12 and stacked.n_layers == a.n_layers
    with ablate(model, stacked, None, "zero"):
        got = model(**both)
    assert torch.allclose(got[:6], want_a, atol=1e-5)
    assert torch.allclose(got[6:], want_b, atol=1e-5)
    assert not torch.allclose(want_a, want_b, atol=1e-3)  # the two masks do differ
    assert stacked.unstack()[0] == a and stacked.unstack()[11] == b
    with pytest.raises(InterventionError, match="12 masks but the batch has 6"):
        with ablate(model, stacked, None, "zero"):
            model(**inputs)
    with pytest.raises(InterventionError, match="per-example mask of 12"):
        stacked.removed()
    with pytest.raises(InterventionError, match="one non-negative size per mask"):
        ComponentMask.stack([a, b], sizes=[1])


# ------------------------------------------------------------------------- batched step
def test_length_chunks_cut_longest_first():
    chunks = length_chunks([5, 9, 7, 9, 2], 2)
    assert [c.tolist() for c in chunks] == [[1, 3], [2, 0], [4]]
    assert [c.tolist() for c in length_chunks([5, 9, 7], None)] == [[1, 2, 0]]


@pytest.mark.parametrize(("max_chunk", "weighted"), [(None, False), (3, False), (None, True)])
def test_one_batched_step_gives_each_run_the_gradient_it_gets_alone(
    tiny, train, means, max_chunk, weighted
):
    """The group's per-run arithmetic (gates, sparsities, penalties: one stacked pass for all
    runs) gives each run the loss, log row and gradients of its step alone, with and without
    per-component sparsity weights."""
    tokenized = tokenize_pairs(train, tiny.tokenizer, 128)
    with torch.no_grad():
        reference = torch.randn(len(train), 3, generator=torch.Generator().manual_seed(0))
    n = tiny.cfg.n_layers * (tiny.cfg.n_heads + 1)
    weights = torch.arange(1.0, n + 1) if weighted else None

    def member(seed, target):
        gates = HardConcrete(n, init_mean=2.0, init_std=0.5,
                             generator=torch.Generator().manual_seed(seed))  # fmt: skip
        return StepMember(gates, LagrangianController(), target,
                          torch.Generator().manual_seed(100 + seed))  # fmt: skip

    # two micro-batches per step; the runs' parts differ in length and size
    parts = [[[0, 1, 2, 3, 4], [20, 21, 22]], [[10, 11, 12, 13, 14, 15, 16], [30, 31, 32, 33]]]
    alone = []
    for seed, target, micro in ((1, 0.3, parts[0]), (2, 0.6, parts[1])):
        m = member(seed, target)
        mask = ComponentMask.ones(tiny)
        with ablate(tiny, mask, means, skip_unmasked=False):
            batches = [tokenized.collate(idx) for idx in micro]
            row = group_pruning_step(
                tiny, mask, [m], batches, [[len(idx)] for idx in micro], reference, weights
            )[0]
        alone.append((m, row))
    together = [member(1, 0.3), member(2, 0.6)]
    mask = ComponentMask.ones(tiny)
    with ablate(tiny, mask, means, skip_unmasked=False):
        batches = [tokenized.collate(parts[0][m] + parts[1][m]) for m in range(2)]
        rows = group_pruning_step(
            tiny, mask, together, batches, [[5, 7], [3, 4]], reference, weights, max_chunk
        )
    for (m, row), t, row_t in zip(alone, together, rows, strict=True):
        # one batch of both runs' rows against each run's own: float32 rounding apart
        for key in ("loss", "objective", "penalty", "sampled_sparsity", "expected_sparsity"):
            bound = 64 * FLOAT32_EPS * max(1.0, abs(row[key]))
            assert row_t[key] == pytest.approx(row[key], abs=bound), key
        assert_float32_close(t.gates.log_alpha.grad, m.gates.log_alpha.grad)
        assert_float32_close(t.controller.lambda_1.grad, m.controller.lambda_1.grad)
        assert_float32_close(t.controller.lambda_2.grad, m.controller.lambda_2.grad)
    assert not torch.allclose(
        rows[0]["objective"] * torch.ones(1), rows[1]["objective"] * torch.ones(1)
    )


def test_each_run_of_a_group_scales_its_own_loss(tiny, train, means):
    """fp16 loss scaling per run: two runs with different scales share one backward pass, and
    each run's unscaled gradient is the one it gets without scaling."""
    tokenized = tokenize_pairs(train, tiny.tokenizer, 128)
    reference = torch.randn(len(train), 3, generator=torch.Generator().manual_seed(0))
    n = tiny.cfg.n_layers * (tiny.cfg.n_heads + 1)

    def members():
        out = []
        for seed, target in ((1, 0.3), (2, 0.6)):
            gates = HardConcrete(n, init_mean=2.0, init_std=0.5,
                                 generator=torch.Generator().manual_seed(seed))  # fmt: skip
            out.append(StepMember(gates, LagrangianController(), target,
                                  torch.Generator().manual_seed(100 + seed)))  # fmt: skip
        return out

    batches = [tokenized.collate([0, 1, 2, 3, 20, 21, 22])]
    grads = []
    for scalers in (None, [torch.amp.GradScaler("cpu", init_scale=2.0**4),
                           torch.amp.GradScaler("cpu", init_scale=2.0**10)]):  # fmt: skip
        runs, mask = members(), ComponentMask.ones(tiny)
        optimizers = [torch.optim.SGD(m.gates.parameters(), lr=0.0) for m in runs]
        with ablate(tiny, mask, means, skip_unmasked=False):
            group_pruning_step(tiny, mask, runs, batches, [[4, 3]], reference, scalers=scalers)
        if scalers is not None:
            for m, plain, scale in zip(runs, grads[0], (2.0**4, 2.0**10), strict=True):
                assert torch.allclose(m.gates.log_alpha.grad, plain * scale, rtol=1e-4, atol=1e-6)
            for scaler, opt in zip(scalers, optimizers, strict=True):
                scaler.unscale_(opt)
        grads.append([m.gates.log_alpha.grad for m in runs])
    for plain, unscaled in zip(*grads, strict=True):
        assert torch.allclose(plain, unscaled, atol=1e-7)
    with pytest.raises(ConfigError, match="its own loss scaler"):
        group_pruning_step(tiny, mask, members(), batches, [[4, 3]], reference,
                           scalers=torch.amp.GradScaler("cpu"))  # fmt: skip
    with pytest.raises(ConfigError, match="1 loss scalers for 2 runs"):
        group_pruning_step(tiny, mask, members(), batches, [[4, 3]], reference, scalers=[None])
    # the group's stacked arithmetic has one beta and one sparsity estimate for all its runs
    mixed = members()
    mixed[1].sparsity_estimate = "expected"
    with pytest.raises(ConfigError, match="one sparsity estimate; got expected, sampled"):
        group_pruning_step(tiny, mask, mixed, batches, [[4, 3]], reference)
    mixed = members()
    mixed[1].gates.beta = 0.5
    with pytest.raises(ConfigError, match="one hard-concrete beta"):
        group_pruning_step(tiny, mask, mixed, batches, [[4, 3]], reference)


# -------------------------------------------------------------------------- whole runs
@pytest.mark.slow
def test_runs_trained_together_equal_the_runs_alone(tiny, train, means, tmp_path, monkeypatch):
    from mi_core.pruning import loop as run_module

    probed_gates = []  # the gates each probe discretised, in order

    def recording(log_alpha, *args, **kwargs):
        if any(frame.function == "probe" for frame in inspect.stack()[1:4]):
            probed_gates.append(log_alpha.clone())
        return discretize(log_alpha, *args, **kwargs)

    monkeypatch.setattr(run_module, "discretize", recording)
    # the third run has its own, shorter schedule (the paper's grows with the sparsity)
    configs = [recipe(0.3, 1), recipe(0.3, 2),
               recipe(0.6, 1, steps=16, warmup_steps=8, lr_warmup_steps=3)]  # fmt: skip
    configs = [c.replace(eval_every=4) for c in configs]
    held = [train.head(16)]  # each run's subnetwork is evaluated on it every 4 steps
    alone = [
        prune_run(tiny, train, tmp_path / "alone" / str(k), c, means=means, eval_sets=held)
        for k, c in enumerate(configs)
    ]
    probed_gates.clear()
    dirs = [tmp_path / "together" / str(k) for k in range(3)]
    together = prune_group(tiny, train, means, configs, dirs, eval_sets=held)
    # the group's last probes (its shorter run's at step 16 with the others', then the longer
    # two at step 20) saw each run's final gates: taken after the group's optimizer step
    assert len(probed_gates) == 3 * 4 + 2 * 1
    last = probed_gates[-3:]  # run 2 at step 16, then runs 0 and 1 at step 20
    order = together[2:] + together[:2]
    assert all(torch.equal(g, t.log_alpha) for g, t in zip(last, order, strict=True))
    for a, t in zip(alone, together, strict=True):
        assert (t.log_alpha - a.log_alpha).abs().max() < 1e-4
        assert t.mask == a.mask
        assert t.log.kl.tolist() == pytest.approx(a.log.kl.tolist(), abs=1e-5)
        probed = t.log.dropna(subset=["eval_accuracy"])
        assert probed.step.tolist() == [s - 1 for s in range(4, len(t.log) + 1, 4)]
        assert probed.eval_accuracy.tolist() == a.log.dropna().eval_accuracy.tolist()
        assert probed.eval_sparsity.tolist() == a.log.dropna().eval_sparsity.tolist()
        # the last probe is the run's result: same gates, target and examples
        assert probed.eval_accuracy.iloc[-1] == t.metrics["accuracy"][held[0].name]
        assert probed.eval_sparsity.iloc[-1] == t.metrics["achieved_sparsity"]
        assert len(t.log) == t.metrics["steps"]  # each run stopped at its own last step
        assert sorted(p.name for p in t.run_dir.iterdir()) == sorted(
            p.name for p in a.run_dir.iterdir()
        )
    assert together[0].log_alpha.sub(together[1].log_alpha).abs().max() > 0.01  # seeds differ
    # finished runs only report when the group is run again
    again = prune_group(tiny, train, means, configs, dirs)
    assert all(r.already_complete for r in again)


@pytest.mark.slow
def test_a_group_resumes_each_run_from_its_own_checkpoint(tiny, train, means, tmp_path):
    configs = [recipe(0.4, 1), recipe(0.4, 2)]
    dirs = [tmp_path / "a", tmp_path / "b"]

    def stop_at(n):
        def callback(step, row):
            if step + 1 == n:
                raise KeyboardInterrupt

        return callback

    # run a is killed after 10 steps, run b was never started: the group resumes a at 10
    with pytest.raises(KeyboardInterrupt):
        prune_run(tiny, train, dirs[0], configs[0], means=means, callback=stop_at(10))
    assert read_json(dirs[0] / "config.json")["prune"]["seed"] == 1
    results = prune_group(tiny, train, means, configs, dirs)
    assert results[0].resumed_from == 10 and results[1].resumed_from is None
    straight = [prune_run(tiny, train, tmp_path / f"s{k}", c, means=means)
                for k, c in enumerate(configs)]  # fmt: skip
    for r, s in zip(results, straight, strict=True):
        assert (r.log_alpha - s.log_alpha).abs().max() < 1e-4
        assert len(r.log) == 20


def _group_steps_until(monkeypatch, n: int, change=None):
    """Make the group's step function raise KeyboardInterrupt at its ``n``-th call (a kill), or
    hand its rows to ``change(call, rows)``."""
    import mi_core.pruning.loop as run_module

    step, calls = run_module.group_pruning_step, {"n": 0}

    def counted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n and change is None:
            raise KeyboardInterrupt
        rows = step(*args, **kwargs)
        if change is not None:
            change(calls["n"], rows)
        return rows

    monkeypatch.setattr(run_module, "group_pruning_step", counted)


def test_a_killed_group_resumes_from_the_checkpoints_it_wrote(
    tiny, train, means, tmp_path, monkeypatch
):
    from mi_core.io import read_safetensors

    configs = [recipe(0.4, 1), recipe(0.6, 2)]
    dirs = [tmp_path / "a", tmp_path / "b"]
    with monkeypatch.context() as m:
        _group_steps_until(m, 13)  # killed during step 12; the last checkpoints are at 10
        with pytest.raises(KeyboardInterrupt):
            prune_group(tiny, train, means, configs, dirs)
    # the group's checkpoint holds what a run alone holds at step 10 (its AdamW moments too)
    alone = tmp_path / "alone"

    def stop(step, row):
        if step + 1 == 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prune_run(tiny, train, alone, configs[1], means=means, callback=stop)
    mine, _ = read_safetensors(dirs[1] / "checkpoint.safetensors")
    theirs, _ = read_safetensors(alone / "checkpoint.safetensors")
    assert sorted(mine) == sorted(theirs) and any(k.endswith("exp_avg_sq") for k in mine)
    for key in theirs:
        torch.testing.assert_close(mine[key], theirs[key], rtol=1e-4, atol=1e-6)
    results = prune_group(tiny, train, means, configs, dirs)
    assert [r.resumed_from for r in results] == [10, 10]
    straight = [prune_run(tiny, train, tmp_path / f"s{k}", c, means=means)
                for k, c in enumerate(configs)]  # fmt: skip
    for r, s in zip(results, straight, strict=True):
        assert (r.log_alpha - s.log_alpha).abs().max() < 1e-4
        assert r.mask == s.mask


def test_a_run_that_fails_in_a_group_takes_no_step_and_the_others_go_on(
    tiny, train, means, tmp_path, monkeypatch
):
    from mi_core.errors import TrainingError
    from mi_core.pruning.run_folder import is_complete

    configs = [recipe(0.4, 1), recipe(0.5, 2), recipe(0.6, 3)]
    dirs = [tmp_path / f"g{k}" for k in range(3)]

    def poison(call, rows):  # the middle run's loss is NaN at step 7
        if call == 8:
            rows[1]["loss"] = float("nan")

    with monkeypatch.context() as m:
        _group_steps_until(m, 0, change=poison)
        with pytest.raises(TrainingError, match="1 of 3 runs trained together failed"):
            prune_group(tiny, train, means, configs, dirs)
    # the failed run keeps its last good checkpoint (step 5) and the log up to it
    assert not is_complete(dirs[1])
    assert len(pd.read_csv(dirs[1] / "log.csv")) == 5
    for k in (0, 2):  # the others ended where they end alone
        assert is_complete(dirs[k])
        alone = prune_run(tiny, train, tmp_path / f"alone{k}", configs[k], means=means)
        again = prune_run(tiny, train, dirs[k], configs[k], means=means)  # read back
        assert (again.log_alpha - alone.log_alpha).abs().max() < 1e-4
        assert again.log.grad_norm.to_numpy() == pytest.approx(
            alone.log.grad_norm.to_numpy(), rel=1e-3
        )


@pytest.mark.slow
def test_with_dropout_a_group_is_reproducible_but_not_the_runs_alone(tiny, train, means, tmp_path):
    configs = [recipe(0.5, 1, dropout=True), recipe(0.5, 2, dropout=True)]
    alone = prune_run(tiny, train, tmp_path / "a", configs[1], means=means)
    first = prune_group(tiny, train, means, configs, [tmp_path / "t0", tmp_path / "t1"])
    second = prune_group(tiny, train, means, configs, [tmp_path / "u0", tmp_path / "u1"])
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.log_alpha, b.log_alpha)  # the group's dropout noise is seeded
    # the whole batch's dropout is drawn from the first run's seed, so run 2 differs from alone
    assert (first[1].log_alpha - alone.log_alpha).abs().max() > 1e-3


def test_a_group_refuses_runs_that_differ_in_more_than_sparsity_and_seed(
    tiny, train, means, tmp_path
):
    with pytest.raises(ConfigError, match="schedules derived from them .*; batch_size differ"):
        prune_group(tiny, train, means, [recipe(0.3), recipe(0.5, batch_size=4)],
                    [tmp_path / "a", tmp_path / "b"])  # fmt: skip


# -------------------------------------------------------------------------------- sweep
@pytest.mark.slow
def test_the_batched_executor_writes_the_local_executors_sweep(
    tiny_checkpoints, means, tmp_path, data_dir, monkeypatch
):
    import mi_core.models.fingerprint as fingerprint

    digests = []
    digest = fingerprint._weights_digest
    monkeypatch.setattr(fingerprint, "_weights_digest", lambda m: digests.append(1) or digest(m))
    model = load_model(tiny_checkpoints["bert-cls"], task="mnli")
    means_path = means.save(tmp_path / "means.safetensors")
    # the quick profile as a user runs it: its warm-ups follow the target sparsity
    overrides = {"steps": 40, "batch_size": 8, "checkpoint_every": 20, "eval_batch_size": 16,
                 "dropout": False}  # fmt: skip
    assert (make_prune_config("quick", 0.3, 1, **overrides).warmup_steps
            != make_prune_config("quick", 0.7, 1, **overrides).warmup_steps)  # fmt: skip
    common = dict(
        means=str(means_path), eval_sets=["mnli:validation_matched"], profile="quick",
        overrides=overrides, max_train_examples=32, max_eval_examples=16, progress=False,
    )  # fmt: skip
    local = run_sweep(model, "mnli:train", tmp_path / "local", [0.3, 0.7], [1, 2], **common)
    batched = run_sweep(
        model, "mnli:train", tmp_path / "batched", [0.3, 0.7], [1, 2],
        executor="batched", group_size=3, **common,
    )  # fmt: skip
    assert len(batched) == 4
    for s in (0.3, 0.7):
        for seed in (1, 2):
            a = ComponentMask.load(run_dir_for(tmp_path / "local", s, seed) / "mask.safetensors")
            b = ComponentMask.load(run_dir_for(tmp_path / "batched", s, seed) / "mask.safetensors")
            assert a == b
    assert batched.drop(columns="run_dir").equals(local.drop(columns="run_dir"))
    assert (tmp_path / "batched" / "subnetworks.csv").is_file()
    # each sweep hashed the weights once, not once per run, its means and its reference logits
    assert len(digests) == 2


def test_group_size_is_chosen_from_memory(tiny, monkeypatch):
    from mi_core.pruning import sweeps as sweep_module

    cfg = recipe()
    per_run = training_bytes_per_example(tiny, cfg.max_length) * cfg.batch_size
    # hand count for the tiny BERT: 4 * n_layers * L * (16 d + 3 d_mlp + 4 heads L)
    c = tiny.cfg
    expected = 4 * c.n_layers * 128 * (16 * c.d_model + 3 * c.d_mlp + 4 * c.n_heads * 128)
    assert training_bytes_per_example(tiny, 128) == expected
    monkeypatch.setattr(sweep_module, "available_memory", lambda device: 10 * per_run)
    assert auto_group_size(tiny, cfg, 8) == 5  # half the memory
    assert auto_group_size(tiny, cfg, 3) == 3
    monkeypatch.setattr(sweep_module, "available_memory", lambda device: per_run)
    assert auto_group_size(tiny, cfg, 8) == 1


def test_group_size_needs_a_grouping_executor(tmp_path):
    with pytest.raises(ConfigError, match="needs --executor batched or ray"):
        run_sweep("x", "mnli:train", tmp_path, [0.5], [1], executor="local", group_size=4)
