"""On a CUDA GPU (skipped with the reason otherwise): hooked models equal Hugging Face's, a short
pruning run and a batched group match the CPU's, mixed precision runs, and a short separability
run gives the CPU's trajectory. Run them on a GPU machine with ``pytest -m gpu``."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import tasks, tiny_model

from mi_core.data import load_pairs, pair_batches
from mi_core.interventions import compute_means
from mi_core.models import load_model
from mi_core.pruning import make_prune_config, prune_group
from mi_core.pruning.run import prune_run

pytestmark = pytest.mark.gpu

PREMISES = ["A man is playing a guitar on stage.", "The cat sat.", "Two dogs run in a field."]
HYPOTHESES = ["The actor danced.", "Someone plays music.", "Dogs are awake at night, barking."]


@pytest.mark.parametrize("kind", ["bert-cls", "roberta-cls", "gpt2-cls"])
def test_classifier_logits_equal_hugging_face_on_the_gpu(tiny_checkpoints, kind):
    path = tiny_checkpoints[kind]
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval().cuda()
    model = load_model(path, task="mnli", device="cuda")
    batch = model.tokenizer(PREMISES, HYPOTHESES, padding=True, return_tensors="pt").to("cuda")
    with torch.no_grad():
        ours = model(**batch)
        from_cpu = model(**{k: v.cpu() for k, v in batch.items()})  # a batch left on the CPU
        if kind != "bert-cls":
            del batch["token_type_ids"]
        theirs = hf(**batch).logits
    assert ours.device.type == "cuda" and torch.equal(from_cpu, ours)
    assert (ours - theirs).abs().max().item() < 1e-4


def test_minilm_equals_hugging_face_on_the_gpu():
    from mi_core.models import load_hf_classifier

    model = load_model("minilm", task="mnli", seed=0, device="cuda")
    hf, tokenizer, _ = load_hf_classifier("minilm", task="mnli", seed=0)
    hf = hf.eval().cuda()
    batch = tokenizer(PREMISES, HYPOTHESES, padding=True, return_tensors="pt").to("cuda")
    with torch.no_grad():
        assert (model(**batch) - hf(**batch).logits).abs().max().item() < 1e-4


def _recipe(**overrides):
    values = dict(steps=10, batch_size=8, grad_accumulation=2, checkpoint_every=5,
                  eval_batch_size=16, dropout=False, log_alpha_init=3.0, warmup_steps=5,
                  lr_warmup_steps=2)  # fmt: skip
    values.update(overrides)
    return make_prune_config("paper", overrides.pop("sparsity", 0.4), overrides.pop("seed", 1),
                             **values)  # fmt: skip


def test_a_short_prune_on_the_gpu_matches_the_cpu(tiny_checkpoints, data_dir, tmp_path):
    train = load_pairs("mnli:train", max_examples=48)
    results = {}
    for device in ("cpu", "cuda"):
        model = load_model(tiny_checkpoints["bert-cls"], task="mnli", device=device)
        means = compute_means(model, pair_batches(train, model.tokenizer, batch_size=16))
        results[device] = prune_run(model, train, tmp_path / device, _recipe(), means=means)
    cpu, gpu = results["cpu"], results["cuda"]
    assert (cpu.log_alpha - gpu.log_alpha).abs().max() < 1e-3
    assert cpu.mask == gpu.mask


def test_a_batched_group_on_the_gpu_equals_its_runs_alone(tiny_checkpoints, data_dir, tmp_path):
    train = load_pairs("mnli:train", max_examples=48)
    model = load_model(tiny_checkpoints["bert-cls"], task="mnli", device="cuda")
    means = compute_means(model, pair_batches(train, model.tokenizer, batch_size=16))
    configs = [_recipe(), _recipe().replace(seed=2), _recipe().replace(target_sparsity=0.6)]
    alone = [prune_run(model, train, tmp_path / f"a{k}", c, means=means)
             for k, c in enumerate(configs)]  # fmt: skip
    together = prune_group(model, train, means, configs, [tmp_path / f"t{k}" for k in range(3)])
    for a, t in zip(alone, together, strict=True):
        assert (a.log_alpha - t.log_alpha).abs().max() < 1e-4
        assert a.mask == t.mask


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_pruning_on_the_gpu(tiny_checkpoints, data_dir, tmp_path, precision):
    train = load_pairs("mnli:train", max_examples=48)
    model = load_model(tiny_checkpoints["bert-cls"], task="mnli", device="cuda")
    means = compute_means(model, pair_batches(train, model.tokenizer, batch_size=16))
    result = prune_run(model, train, tmp_path, _recipe(precision=precision), means=means)
    assert result.log_alpha.dtype == torch.float32
    assert result.log.kl.notna().all() and (result.log.kl >= -1e-4).all()


def test_a_short_separability_run_on_the_gpu_matches_the_cpu():
    from mi_core.methods.separability.run import SeparabilityConfig, run_separability

    focus, cripple = tasks()
    config = SeparabilityConfig(steps=2, ff_frac=0.1, attn_frac=0.05, scoring="freq",
                                batch_size=4, device="cuda")  # fmt: skip
    cpu = run_separability(tiny_model("llama"), focus, cripple, config)
    gpu = run_separability(tiny_model("llama").to("cuda"), focus, cripple, config)
    a, b = cpu.run_frame(), gpu.run_frame()
    assert a["ff_pruned"].tolist() == b["ff_pruned"].tolist()
    for column in ("focus_loss", "cripple_loss"):
        if column in a:
            assert a[column].to_numpy() == pytest.approx(b[column].to_numpy(), rel=1e-3)


@pytest.mark.parametrize("kind", ["llama-lm", "bert-cls"])
def test_eap_and_an_edge_pruning_step_on_the_gpu_match_the_cpu(tiny_checkpoints, kind):
    """EAP-IG scores (the decoder's by-hand per-head gradients, the encoder's projection
    gradients) and the gradient of one hard-concrete edge-pruning step as ``prune_edges`` takes
    it (weights frozen, the corrupted run bound by ``z``: a decoder writes its heads' differences
    straight into the side-by-side buffer) equal the CPU's; ``logit_difference`` takes pairs
    left on the CPU with the GPU's logits."""
    from helpers import random_prompt_pairs

    from mi_core.circuits import Graph, edge_attribution, logit_difference
    from mi_core.data.circuit_pairs import PromptPairs
    from mi_core.interventions import EdgeMask, graph_switches
    from mi_core.interventions.edges._engine import masked_hooks, record_corrupted
    from mi_core.models.frozen import frozen
    from mi_core.models.hook_context import hooked
    from mi_core.pruning.hard_concrete import sample_hard_concrete

    task = {"task": "mnli"} if kind.endswith("-cls") else {}
    pairs = random_prompt_pairs(6, 7, high=2000)
    if kind.endswith("-cls"):
        pairs = PromptPairs(
            clean_ids=pairs.clean_ids, corrupted_ids=pairs.corrupted_ids,
            attention_mask=pairs.attention_mask, answer=torch.arange(6) % 3,
            distractor=torch.full((6,), -1), position=torch.zeros(6, dtype=torch.long),
            kind="classifier",
        )  # fmt: skip
    results = {}
    for device in ("cpu", "cuda"):
        model = load_model(tiny_checkpoints[kind], device=device, **task)
        graph = Graph.from_model(model)
        batch = pairs.to(device)
        scores = edge_attribution(model, graph, batch, steps=3).cpu()
        # the gates drawn on the CPU (one random stream for both devices), used on ``device``
        log_alpha = torch.full((graph.n_edges,), 3.0, requires_grad=True)
        z = sample_hard_concrete(log_alpha, generator=torch.Generator().manual_seed(0))
        mask = EdgeMask(graph, z.to(device))
        with frozen(model, eval_mode=False), graph_switches(model):
            run = record_corrupted(model, graph, **batch.corrupted)
            with hooked(model, masked_hooks(model, mask, hard_concrete=True, corrupted=run)):
                model(**batch.clean).float().pow(2).mean().backward()
        with torch.no_grad():
            difference = logit_difference(model(**batch.clean), pairs).cpu()  # CPU pairs
        results[device] = (scores, log_alpha.grad, difference)
    for cpu, gpu in zip(results["cpu"], results["cuda"], strict=True):
        torch.testing.assert_close(gpu, cpu, rtol=1e-3, atol=1e-5)


def test_edge_pruning_resumes_on_the_gpu(tmp_path):
    """A GPU edge-pruning run (fused AdamW, whose step count lives on the device) killed after a
    checkpoint resumes from it and ends where an uninterrupted GPU run ends."""
    from helpers import random_prompt_pairs

    from mi_core.circuits.prune import EdgePruneSettings, load_edge_prune_history, prune_edges

    model = tiny_model("gpt2").to("cuda")
    config = EdgePruneSettings(
        sparsity=0.7, steps=12, sparsity_warmup_steps=8, batch_size=8, checkpoint_every=5
    )
    pairs = random_prompt_pairs(16, 6, high=90).to("cuda")
    whole = prune_edges(model, pairs, config, tmp_path / "whole", progress=False)
    calls = {"n": 0}

    def crash(module, args, output):
        calls["n"] += 1
        if calls["n"] == 2 * 8:  # two forwards per step: killed during step 8
            raise KeyboardInterrupt

    handle = model.blocks[0].register_forward_hook(crash)  # the corrupted and masked forwards
    try:
        with pytest.raises(KeyboardInterrupt):
            prune_edges(model, pairs, config, tmp_path / "killed", progress=False)
    finally:
        handle.remove()
    assert len(load_edge_prune_history(tmp_path / "killed")) == 5  # the last checkpoint
    resumed = prune_edges(model, pairs, config, tmp_path / "killed", progress=False)
    torch.testing.assert_close(resumed.log_alpha, whole.log_alpha, atol=1e-5, rtol=0)
    assert resumed.circuit.kept == whole.circuit.kept
