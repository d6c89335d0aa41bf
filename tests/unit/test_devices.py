"""One ``device`` option on every job (``auto`` = CUDA when present), a clear error for a device
torch does not have, and mixed precision in fine-tuning and pruning with what is trained kept
in float32."""

from __future__ import annotations

import pytest
import torch

from mi_core.cli import main
from mi_core.devices import DeviceOption, autocast, grad_scaler, matmul_precision, resolve_device
from mi_core.errors import ConfigError
from mi_core.pruning import make_prune_config
from mi_core.pruning.run import prune_run

pytestmark = pytest.mark.usefixtures("one_thread")


def test_auto_is_cuda_when_present_else_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="torch sees no CUDA GPU here"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == torch.device("cuda")
    with pytest.raises(ConfigError, match="sees 1 CUDA GPU"):
        resolve_device("cuda:1")
    with pytest.raises(ConfigError, match="auto, cpu, cuda, cuda:N or mps"):
        resolve_device("gpu")


def test_every_job_takes_the_one_device_option():
    from test_job_configs import JOBS

    from mi_core.circuits.job import AttributeConfig, CircuitPruneConfig, CircuitSweepConfig
    from mi_core.data.fetch import FetchConfig
    from mi_core.methods.heuristic_core.config import ExperimentConfig

    classes = [cls for _, _, cls, _ in JOBS if cls is not FetchConfig]  # fetch computes nothing
    classes += [AttributeConfig, CircuitPruneConfig, CircuitSweepConfig, ExperimentConfig]
    for cls in classes:
        assert issubclass(cls, DeviceOption), cls.__name__
        assert cls.__dataclass_fields__["device"].default == "auto", cls.__name__


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_a_device_the_machine_lacks_is_one_line_before_any_work(tmp_path, capsys, data_dir):
    out = tmp_path / "r.csv"
    code = main(["eval", "--model", "minilm", "--data", "hans:so_swap", "--out", str(out),
                 "--device", "cuda"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "no CUDA GPU" in err[0], err
    assert not out.exists()


def test_ray_tasks_asked_for_cuda_need_a_gpu_each(tmp_path):
    from mi_core.pruning.sweeps import run_sweep

    with pytest.raises(ConfigError, match="needs --num-gpus-per-run > 0"):
        run_sweep("m", "mnli:train", tmp_path, [0.5], [1], executor="ray", device="cuda")


def test_a_fine_tuning_key_hashes_every_setting_precision_included():
    """fp32 had been left out of the key, so that experiments of an older mi_core (before the
    field) stayed finished; the key now hashes the settings as they are."""
    from mi_core.methods.heuristic_core.config import load_config
    from mi_core.methods.heuristic_core.stages import _finetune

    config = load_config("minilm-mnli-quick")
    assert _finetune(config)[-1]["precision"] == "fp32"
    bf16 = config.replace(finetune=config.finetune.replace(precision="bf16"))
    assert _finetune(bf16)[-1]["precision"] == "bf16"


def test_autocast_is_nothing_at_fp32_and_bf16_otherwise():
    x = torch.randn(4, 4)
    with autocast("cpu", "fp32"):
        assert (x @ x).dtype == torch.float32
    with autocast("cpu", "bf16"):
        assert (x @ x).dtype == torch.bfloat16
    assert grad_scaler("cpu", "bf16") is None and grad_scaler("cpu", "fp16") is not None
    with pytest.raises(ConfigError, match="precision must be one of"):
        autocast("cpu", "fp8")


def _tf32() -> str:
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def test_tf32_sets_cublas_tf32_for_its_scope_and_restores_it():
    assert not torch.backends.cuda.matmul.allow_tf32  # torch's default
    with matmul_precision("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32
        with autocast("cpu", "tf32"):  # tensors stay float32: no autocast
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert not torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(KeyError), matmul_precision("tf32"):
        raise KeyError  # restored on an exception too
    assert not torch.backends.cuda.matmul.allow_tf32
    before = torch.get_float32_matmul_precision()
    with matmul_precision("fp32"):  # the other precisions touch nothing
        assert torch.get_float32_matmul_precision() == before
    assert grad_scaler("cpu", "tf32") is None


def test_tf32_keeps_to_the_per_backend_api_where_the_session_uses_it():
    """torch refuses a mix of the legacy and the per-backend TF32 settings: a session that set
    ``fp32_precision`` gets it set and restored, and fp32 jobs read nothing (own process: the
    setting cannot be undone here)."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from mi_core.devices import matmul_precision\n"
        "m = torch.backends.cuda.matmul\n"
        "m.fp32_precision = 'ieee'\n"
        "with matmul_precision('fp32'): pass\n"
        "with matmul_precision('tf32'): inside = m.fp32_precision\n"
        "print(inside, m.fp32_precision)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["tf32", "ieee"]


def _precision_seen(module) -> tuple[list[str], object]:
    """Record cuBLAS's TF32 setting at each forward and backward pass of ``module`` (a hook
    removed by the returned handle's ``remove``)."""
    seen: list[str] = []

    def forward(module, args, output):
        seen.append("forward " + _tf32())
        if output.requires_grad:
            output.register_hook(lambda g: seen.append("backward " + _tf32()))

    return seen, module.register_forward_hook(forward)


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_tf32_pruning_runs_its_forward_and_backward_passes_in_tf32(
    tiny, train, means, tmp_path, precision
):
    config = make_prune_config("paper", 0.5, 1, steps=2, batch_size=8, grad_accumulation=1,
                               checkpoint_every=2, eval_batch_size=16, dropout=False,
                               warmup_steps=1, lr_warmup_steps=1, precision=precision)  # fmt: skip
    seen, handle = _precision_seen(tiny.blocks[0])
    try:
        prune_run(tiny, train, tmp_path, config, means=means)
    finally:
        handle.remove()
    # the steps' passes in TF32; the reference logits and the evaluation stay float32
    before, want = "ieee", "tf32" if precision == "tf32" else "ieee"
    backward = [entry.split()[1] for entry in seen if entry.startswith("backward")]
    forward = [entry.split()[1] for entry in seen if entry.startswith("forward")]
    assert len(backward) == 2 and set(backward) == {want}  # one per step
    assert forward.count(want) >= 2 and set(forward) == {want, before}
    assert _tf32() == before  # restored after the job


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_pruning_in_mixed_precision_keeps_gates_and_lambdas_in_fp32(
    tiny, train, means, tmp_path, precision
):
    def config(p):
        return make_prune_config(
            "paper", 0.5, 1, steps=6, batch_size=8, grad_accumulation=1, checkpoint_every=3,
            eval_batch_size=16, dropout=False, log_alpha_init=2.0, warmup_steps=3,
            lr_warmup_steps=1, precision=p,
        )  # fmt: skip

    full = prune_run(tiny, train, tmp_path / "fp32", config("fp32"), means=means)
    mixed = prune_run(tiny, train, tmp_path / precision, config(precision), means=means)
    assert all(torch.isfinite(torch.tensor(mixed.log.kl.tolist())))
    # the gates did learn: most steps had finite gradients and log_alpha left its start (2.0)
    assert torch.isfinite(torch.tensor(mixed.log.grad_norm.tolist())).float().mean() >= 0.5
    assert (mixed.log_alpha - 2.0).abs().max() > 0.05
    # the forward pass did run in low precision: the KL differs from fp32's, but not by much
    kl_full, kl_mixed = full.log.kl.to_numpy(), mixed.log.kl.to_numpy()
    assert abs(kl_mixed - kl_full).max() > 1e-7
    assert abs(kl_mixed - kl_full).max() < 0.05 + 0.5 * abs(kl_full).max()
    assert (mixed.log_alpha - full.log_alpha).abs().max() < 0.5


def test_the_fp16_loss_scale_is_checkpointed_and_resumed(tiny, train, means, tmp_path):
    import json

    from mi_core.io import read_safetensors
    from mi_core.pruning.checkpoint import load_checkpoint, mask_tensors
    from mi_core.pruning.hard_concrete import HardConcrete
    from mi_core.pruning.lagrangian import LagrangianController, pruning_optimizer

    config = make_prune_config(
        "paper", 0.5, 1, steps=4, batch_size=8, grad_accumulation=1, checkpoint_every=2,
        eval_batch_size=16, dropout=False, log_alpha_init=2.0, warmup_steps=2,
        lr_warmup_steps=1, precision="fp16",
    )  # fmt: skip
    prune_run(tiny, train, tmp_path / "run", config, means=means)
    _, metadata = read_safetensors(tmp_path / "run" / "checkpoint.safetensors")
    saved = json.loads(metadata["state"])["scaler"]
    assert saved["scale"] > 0 and "_growth_tracker" in saved
    n = tiny.cfg.n_layers * (tiny.cfg.n_heads + 1)
    gates, controller = HardConcrete(n), LagrangianController()
    fresh = torch.amp.GradScaler("cpu", init_scale=1.0)
    optimizer = pruning_optimizer(gates.parameters(), controller, 0.1, 1.0)
    load_checkpoint(tmp_path / "run" / "checkpoint.safetensors", mask_tensors(gates, controller),
                    optimizer, fresh)  # fmt: skip
    assert fresh.get_scale() == saved["scale"] and fresh.state_dict() == saved


def test_a_run_of_an_older_mi_core_is_refused_and_a_current_one_reads_back(
    tiny, train, means, tmp_path
):
    """A run folder's config.json without a field of today's PruneConfig (precision, before it
    existed) is refused with one line saying what to do, not read with a default."""
    from mi_core.io import read_json, write_json

    cfg = make_prune_config("cofi", 0.5, 1, steps=4, batch_size=8, checkpoint_every=2,
                            eval_batch_size=16)  # fmt: skip
    first = prune_run(tiny, train, tmp_path, cfg, means=means)
    again = prune_run(tiny, train, tmp_path, cfg, means=means)
    assert again.already_complete and again.mask == first.mask
    with pytest.raises(ConfigError, match="other settings"):
        prune_run(tiny, train, tmp_path, cfg.replace(precision="bf16"), means=means)
    saved = read_json(tmp_path / "config.json")
    del saved["prune"]["precision"]  # as an older mi_core wrote it
    write_json(tmp_path / "config.json", saved)
    with pytest.raises(ConfigError, match=r"older mi_core \(it records no precision\): delete"):
        prune_run(tiny, train, tmp_path, cfg, means=means)


def test_a_fine_tuning_folder_of_an_older_mi_core_is_refused(tmp_path):
    """A finetune_config.json without a field (precision, written before it existed) had been
    read with today's default for it, and the run resumed as if it had recorded that value."""
    from dataclasses import asdict

    from mi_core.io import write_json
    from mi_core.training import FinetuneConfig
    from mi_core.training.finetune import CONFIG, _check_resumable

    cfg = FinetuneConfig(model="m", task="mnli", train="mnli:train", steps=4, out=str(tmp_path))
    write_json(tmp_path / CONFIG, asdict(cfg))
    _check_resumable(cfg, tmp_path, finished=False)  # the current record: resumes
    with pytest.raises(ConfigError, match="other settings"):
        _check_resumable(cfg.replace(lr=cfg.lr * 2), tmp_path, finished=False)
    write_json(tmp_path / CONFIG, {k: v for k, v in asdict(cfg).items() if k != "precision"})
    with pytest.raises(ConfigError, match=r"older mi_core \(it has no precision\): run the"):
        _check_resumable(cfg, tmp_path, finished=False)


def test_finetuning_in_bf16_keeps_the_weights_in_fp32(tiny_checkpoints, tmp_path, data_dir):
    from transformers import AutoModelForSequenceClassification

    from mi_core.training import FinetuneConfig, finetune

    common = dict(model=str(tiny_checkpoints["bert-cls"]), task="mnli", train="mnli:train",
                  steps=3, save_every=3, batch_size=8, max_train_examples=32, lr=1e-3)  # fmt: skip
    finetune(FinetuneConfig(**common, out=str(tmp_path / "fp32")), progress=False)
    finetune(FinetuneConfig(**common, out=str(tmp_path / "bf16"), precision="bf16"),
             progress=False)  # fmt: skip
    a = AutoModelForSequenceClassification.from_pretrained(tmp_path / "fp32" / "checkpoint-3")
    b = AutoModelForSequenceClassification.from_pretrained(tmp_path / "bf16" / "checkpoint-3")
    wa, wb = a.classifier.weight.detach(), b.classifier.weight.detach()
    assert 0 < float((wa - wb).abs().max()) < 1e-2  # bf16 forward: close, not equal


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_tf32_fine_tuning_runs_its_steps_in_tf32(
    tiny_checkpoints, tmp_path, data_dir, monkeypatch, precision
):
    import importlib

    from mi_core.training import FinetuneConfig, finetune

    finetune_module = importlib.import_module("mi_core.training.finetune")  # not the function

    hooked: dict[str, object] = {}
    inputs = finetune_module.model_inputs

    def hook_the_model(model, batch):  # the HF model fine-tuning loads: hook it once
        if "seen" not in hooked:
            hooked["seen"], hooked["handle"] = _precision_seen(model.get_input_embeddings())
        return inputs(model, batch)

    monkeypatch.setattr(finetune_module, "model_inputs", hook_the_model)
    finetune(FinetuneConfig(model=str(tiny_checkpoints["bert-cls"]), task="mnli",
                            train="mnli:train", steps=2, save_every=2, batch_size=8,
                            max_train_examples=16, out=str(tmp_path / "ft"),
                            precision=precision), progress=False)  # fmt: skip
    hooked["handle"].remove()
    # both steps' forward and backward passes (no evaluation set: nothing else runs the model)
    want = "tf32" if precision == "tf32" else "ieee"
    assert sorted(hooked["seen"]) == sorted([f"forward {want}", f"backward {want}"] * 2)
    assert _tf32() == "ieee"


def test_fine_tuning_resumes_its_fp16_loss_scale(tiny_checkpoints, tmp_path, data_dir):
    from mi_core.io import read_json
    from mi_core.training import FinetuneConfig, finetune

    common = dict(model=str(tiny_checkpoints["bert-cls"]), task="mnli", train="mnli:train",
                  save_every=2, batch_size=8, max_train_examples=32, lr=1e-4,
                  precision="fp16", out=str(tmp_path / "ft"))  # fmt: skip
    import shutil

    finetune(FinetuneConfig(**common, steps=4), progress=False)
    first = read_json(tmp_path / "ft" / "checkpoint-2" / "trainer_state.json")["scaler"]
    shutil.rmtree(tmp_path / "ft" / "checkpoint-4")  # as if killed before it was written
    finetune(FinetuneConfig(**common, steps=4), progress=False)  # resumes at step 2
    second = read_json(tmp_path / "ft" / "checkpoint-4" / "trainer_state.json")["scaler"]
    # the growth tracker counts the finite steps since the scale last changed: it went on from
    # the saved one (a fresh scaler would count the 2 new steps only)
    assert first["_growth_tracker"] == 2 and second["_growth_tracker"] == 4
    assert second["scale"] == first["scale"]


def test_a_checkpoint_resumes_with_this_devices_adamw_implementation(tmp_path):
    """A run checkpointed on a GPU (fused AdamW) resumes on a CPU with the CPU's optimizer
    flags and the same moments; the file's flags do not carry over."""
    from mi_core.pruning.checkpoint import load_checkpoint, mask_tensors, save_checkpoint
    from mi_core.pruning.hard_concrete import HardConcrete
    from mi_core.pruning.lagrangian import LagrangianController, pruning_optimizer

    gates, controller = HardConcrete(6, init_mean=1.0), LagrangianController()
    gpu_like = torch.optim.AdamW(
        [{"params": list(gates.parameters())}, {"params": list(controller.parameters())}],
        fused=True,  # as pruning_optimizer builds it on a GPU (CPU fused kernels exist too)
    )
    gates.log_alpha.grad = torch.linspace(-1, 1, 6)
    controller.lambda_1.grad = torch.tensor(0.5)
    controller.lambda_2.grad = torch.tensor(0.25)
    gpu_like.step()
    save_checkpoint(tmp_path / "c.safetensors", 1, mask_tensors(gates, controller), gpu_like, [])

    fresh_gates, fresh_controller = HardConcrete(6), LagrangianController()
    optimizer = pruning_optimizer(fresh_gates.parameters(), fresh_controller, 0.1, 1.0)
    fresh = mask_tensors(fresh_gates, fresh_controller)
    assert load_checkpoint(tmp_path / "c.safetensors", fresh, optimizer) == 1
    assert all(not group["fused"] for group in optimizer.param_groups)
    moments = optimizer.state[fresh_gates.log_alpha]["exp_avg"]
    torch.testing.assert_close(moments, gpu_like.state[gates.log_alpha]["exp_avg"])
    assert torch.equal(fresh_gates.log_alpha, gates.log_alpha)


@pytest.mark.parametrize("kind", ["bert-cls", "roberta-cls"])
def test_a_cpu_batch_runs_on_a_classifier_on_another_device(tiny_checkpoints, kind):
    """A notebook's batch left on the CPU runs on a model on another device ("meta" stands in
    for a GPU: an encoder's padding mask met the GPU's stream in ``masked_fill`` and raised).
    The ids stay where they are (a device indexes its weights with host ids) and the checks
    of the mask read them on the host, without waiting for a GPU. A decoder classifier's
    padding check reads a value, which "meta" cannot answer; the GPU test covers it."""
    from mi_core.models import load_model

    model = load_model(tiny_checkpoints[kind], task="mnli")
    batch = dict(
        model.tokenizer(["a man is here", "the cat"], ["someone", "a cat sat"],
                        return_tensors="pt", padding=True)
    )  # fmt: skip
    if kind == "roberta-cls":
        batch.pop("token_type_ids", None)  # RoBERTa has none (a check of them reads a value)
    model.to("meta")
    logits = model(**batch)
    assert logits.device.type == "meta" and logits.shape == (2, 3)


def test_statistics_from_two_devices_merge_and_score_on_the_first():
    """Statistics collected on a GPU ("meta" stands in) merge with, and are scored against,
    statistics read back from a file on the CPU."""
    from mi_core.statistics.activations import ActivationStats, NeuronStats
    from mi_core.statistics.scoring import neuron_scores

    cpu = NeuronStats.zeros(2, (3,))
    cpu.count += 4
    cpu.positive += 2
    elsewhere = NeuronStats.zeros(2, (3,), device="meta")
    assert elsewhere.merge(cpu).positive.device.type == "meta"
    focus, cripple = ActivationStats(mlp=elsewhere, attn=None), ActivationStats(mlp=cpu, attn=None)
    assert neuron_scores(focus, cripple, "freq")["mlp"].device.type == "meta"
