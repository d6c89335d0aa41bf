"""Hooked models equal Hugging Face's own models on the same checkpoint (fp32, 1e-4)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from helpers import SAME_ALGEBRA_FLOAT64, assert_float32_close

from mi_core.errors import ConfigError, ModelLoadError
from mi_core.models import (
    HookedDecoderClassifier,
    HookedEncoderClassifier,
    load_hf_causal_lm,
    load_hf_classifier,
    load_model,
    weights_fingerprint,
)

PREMISES = [
    "The doctor near the actor danced.",
    "A man is playing a guitar on the stage while people watch.",
    "Cats sleep.",
]
HYPOTHESES = ["The actor danced.", "Someone plays music.", "Dogs are awake at night, barking."]


def _pair_batch(tokenizer):
    return tokenizer(PREMISES, HYPOTHESES, padding=True, return_tensors="pt")


@pytest.mark.parametrize("kind", ["bert-cls", "roberta-cls", "gpt2-cls"])
def test_classifier_logits_equal_hugging_face(tiny_checkpoints, kind):
    path = tiny_checkpoints[kind]
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    model = load_model(path, task="mnli")
    expected_cls = HookedDecoderClassifier if kind == "gpt2-cls" else HookedEncoderClassifier
    assert isinstance(model, expected_cls)
    batch = _pair_batch(model.tokenizer)
    assert (batch["attention_mask"] == 0).any(), "the batch must contain padding"
    with torch.no_grad():
        ours = model(**batch)
        # RoBERTa has one token type (HF rejects type id 1) and GPT-2 tokenizers make none (HF
        # GPT-2 would add word embeddings for them): the hooked models ignore them for both.
        if kind != "bert-cls":
            del batch["token_type_ids"]
        theirs = hf(**batch).logits
    assert ours.shape == (3, 3)
    assert theirs.abs().max() > 0.1, "reference logits too small to show a difference"
    assert (ours - theirs).abs().max().item() < 1e-4


def test_roberta_positions_are_offset(tiny_checkpoints):
    # Shifting the position table by one would change the logits: the offset is exercised.
    model = load_model(tiny_checkpoints["roberta-cls"], task="mnli")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        tiny_checkpoints["roberta-cls"]
    )
    pad = hf.config.pad_token_id
    assert torch.equal(
        model.embed.pos_embed.W_pos[0], hf.roberta.embeddings.position_embeddings.weight[pad + 1]
    )


def test_minilm_equals_hugging_face(minilm):
    hf, tokenizer, task = load_hf_classifier("minilm", task="mnli", seed=0)
    assert task == "mnli" and minilm.num_labels == 3 and minilm.cfg.n_layers == 6
    assert minilm.cfg.n_heads == 12 and minilm.cfg.d_model == 384
    batch = _pair_batch(tokenizer)
    with torch.no_grad():
        out = hf(**batch, output_hidden_states=True)
        logits, cache = minilm.run_with_cache(**batch)
    assert (logits - out.logits).abs().max().item() < 1e-4
    final = cache["blocks.5.hook_normalized_resid_post"]
    mask = batch["attention_mask"].bool()
    assert (final[mask] - out.hidden_states[-1][mask]).abs().max().item() < 1e-4
    assert cache["blocks.3.attn.hook_z"].shape == (3, batch["input_ids"].shape[1], 12, 32)


def test_minilm_head_is_seeded():
    a = load_model("minilm", task="qqp", seed=1)
    b = load_model("minilm", task="qqp", seed=1)
    c = load_model("minilm", task="qqp", seed=2)
    assert a.num_labels == 2
    assert torch.equal(a.head.out.weight, b.head.out.weight)
    assert not torch.equal(a.head.out.weight, c.head.out.weight)
    assert weights_fingerprint(a) == weights_fingerprint(b) != weights_fingerprint(c)


def test_split_forward_equals_forward(tiny_checkpoints):
    for kind in ("bert-cls", "gpt2-cls"):
        model = load_model(tiny_checkpoints[kind], task="mnli")
        batch = _pair_batch(model.tokenizer)
        with torch.no_grad():
            resid = model.embed_input(**batch)
            mask = batch["attention_mask"]
            resid = model.run_blocks(model.run_blocks(resid, mask, 0, 1), mask, start=1)
            assert torch.allclose(model.classify(resid, mask), model(**batch), atol=1e-6)


def _hf_logprobs(hf, ids):
    with torch.no_grad():
        return hf(ids).logits.log_softmax(-1)


@pytest.mark.parametrize("kind", ["gpt2-lm", "llama-lm", "opt-lm"])
def test_causal_lm_logprobs_equal_hugging_face(tiny_checkpoints, kind):
    path = tiny_checkpoints[kind]
    model = load_model(path)
    hf, _ = load_hf_causal_lm(path)
    ids = torch.randint(5, 1000, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids).log_softmax(-1)
    assert (ours - _hf_logprobs(hf, ids)).abs().max().item() < 1e-4
    assert "blocks.0.attn.hook_z" in model.hook_dict and "blocks.2.mlp.hook_post" in model.hook_dict


@pytest.mark.slow
def test_smollm2_logprobs_equal_hugging_face(smollm2):
    model = smollm2
    hf, tokenizer = load_hf_causal_lm("smollm2")
    assert model.cfg.n_layers == 30 and model.cfg.n_key_value_heads == 3
    ids = tokenizer("def fibonacci(n):\n    return n if n < 2 else", return_tensors="pt").input_ids
    with torch.no_grad():
        ours = model(ids).log_softmax(-1)
    assert (ours - _hf_logprobs(hf, ids)).abs().max().item() < 1e-4


@pytest.mark.slow
def test_a_gguf_file_loads_as_its_folder_and_name_do(smollm2):
    """A path to a .gguf file: config, tokenizer and weights come from the file (here the
    embedded SmolLM2's), and the model is the one the embedded name loads."""
    from mi_core.models.embedded import smollm2_gguf

    folder, name = smollm2_gguf()
    model = load_model(folder / name)
    ids = torch.tensor([[1, 504, 3458, 314, 253, 10]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), smollm2(ids), atol=1e-5, rtol=1e-5)
    assert model.cfg.n_layers == 30 and model.to_str_tokens("def")[-1] == "def"


@pytest.mark.slow
def test_a_classifier_made_from_a_gguf_file_saves_as_a_checkpoint(tmp_path):
    """SmolLM2 (a GGUF file) + a task: a Llama sequence classifier with a seeded head, equal
    to Hugging Face's, which saves as an ordinary checkpoint (what mi-core finetune writes) and
    loads back as the same hooked classifier."""
    hf, tokenizer, task = load_hf_classifier("smollm2", task="mnli", seed=0)
    model = load_model("smollm2", task="mnli", seed=0)
    batch = tokenizer(["A man plays a guitar."], ["Nobody plays."], return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask), expected,
                                   atol=1e-4, rtol=0)  # fmt: skip
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    again = load_model(tmp_path)
    assert again.task == "mnli" and type(again).__name__ == "HookedDecoderClassifier"
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids, attention_mask=mask), expected,
                                   atol=1e-4, rtol=0)  # fmt: skip


@pytest.mark.slow
def test_smollm2_takes_strings_as_transformer_lens_models_do(smollm2):
    assert smollm2.cfg.model_name == "smollm2" and smollm2.cfg.tokenizer_prepends_bos is False
    tokens = smollm2.to_tokens("def add(a, b):")
    assert tokens[0, 0].item() == smollm2.tokenizer.bos_token_id  # TL adds the BOS itself
    assert smollm2.to_str_tokens("def add(a, b):")[1:3] == ["def", " add"]
    logits, cache = smollm2.run_with_cache("def add(a, b):")
    assert logits.shape[:2] == tokens.shape and "blocks.0.attn.hook_z" in cache
    text = smollm2.generate("def add(a, b):", max_new_tokens=3, do_sample=False, verbose=False)
    assert text.startswith("def add(a, b):") and len(text) > len("def add(a, b):")


def test_minilm_without_a_task_says_which_head_it_made(caplog):
    with caplog.at_level("WARNING", logger="mi_core.models.loading"):
        model = load_model("minilm")
    assert model.task == "mnli" and model.cfg.model_name == "minilm"
    assert "made a mnli head (3 labels, random, seed 0)" in caplog.text


def test_directory_without_config_is_rejected(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)


def test_unsupported_architecture_names_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]})
    )
    with pytest.raises(ModelLoadError, match="not supported.*BertForSequenceClassification"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    "kind, change, message",
    [
        ("llama-lm", {"attention_bias": True}, "attention_bias"),
        ("llama-lm", {"mlp_bias": True}, "mlp_bias"),
        ("opt-lm", {"enable_bias": False}, "enable_bias=False"),
        ("opt-lm", {"layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine"),
    ],
)
def test_variants_whose_weights_would_not_convert_are_refused(
    tiny_checkpoints, tmp_path, kind, change, message
):
    """Llama with biases converted by TransformerLens lost them (logits 0.75 off Hugging Face's,
    silently); OPT without biases or norm weights failed deep inside the conversion."""
    path = shutil.copytree(tiny_checkpoints[kind], tmp_path / kind)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ModelLoadError, match=message):
        load_model(path)


def test_head_must_match_task(tiny_checkpoints):
    with pytest.raises(ModelLoadError, match="3-label head but task qqp needs 2"):
        load_model(tiny_checkpoints["bert-cls"], task="qqp")


def test_missing_hub_model_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="not a local checkpoint directory"):
        load_model("no-such-org/no-such-model-xyz", task="mnli")


def test_missing_local_path_is_clear():
    with pytest.raises(ModelLoadError, match="not a checkpoint directory"):
        load_model("./does/not/exist")


def test_fast_paths_match_tl_paths_and_keep_hooks(minilm):
    # Unhooked attention / LayerNorm use fused kernels; hooking a pattern falls back to TL's code.
    tokenizer = minilm.tokenizer
    batch = _pair_batch(tokenizer)
    seen = []
    z_hook = ("blocks.1.attn.hook_z", lambda z, hook: seen.append(z.shape) or z * 0.5)
    pattern_hook = ("blocks.0.attn.hook_pattern", lambda p, hook: p)
    scale_hook = ("blocks.0.ln1.hook_scale", lambda s, hook: s)
    with torch.no_grad():
        fast = minilm.run_with_hooks(**batch, fwd_hooks=[z_hook])
        slow = minilm.run_with_hooks(**batch, fwd_hooks=[z_hook, pattern_hook, scale_hook])
        plain = minilm(**batch)
    assert len(seen) == 2, "hook_z must fire on the fused path too"
    import pickle

    from mi_core.models.fast_paths import FastAttention, FastLayerNorm

    assert type(minilm.blocks[0].attn) is FastAttention
    assert type(minilm.blocks[0].ln1) is FastLayerNorm
    pickle.dumps(minilm)  # module-level classes: the model pickles
    assert (fast - slow).abs().max().item() < 1e-5
    assert (fast - plain).abs().max().item() > 1e-4, "the z hook changed nothing"


@pytest.mark.parametrize("kind", ["bert-cls", "gpt2-cls"])
def test_transformer_lens_switches_work_on_classifiers(tiny_checkpoints, kind):
    model = load_model(tiny_checkpoints[kind], task="mnli")
    ids = torch.tensor([[101, 2023, 2003, 1037, 102]])
    plain = model(ids)
    switches = [
        ("set_use_attn_result", "attn.hook_result"),
        ("set_use_split_qkv_input", "hook_q_input"),
        ("set_use_hook_mlp_in", "hook_mlp_in"),
    ]
    for switch, hook in switches:
        getattr(model, switch)(True)
        logits, cache = model.run_with_cache(ids)
        assert torch.allclose(logits, plain, atol=1e-5) and f"blocks.1.{hook}" in cache, switch
        getattr(model, switch)(False)
    # each head's result sums to the attention output, and a hook on it alone fires too (the
    # fused attention steps aside when the switch is on)
    model.set_use_attn_result(True)
    seen = []
    model.run_with_hooks(
        ids, fwd_hooks=[("blocks.0.attn.hook_result", lambda x, hook: seen.append(x))]
    )
    _, cache = model.run_with_cache(ids)
    total = cache["blocks.0.attn.hook_result"].sum(dim=2) + model.blocks[0].attn.b_O
    assert len(seen) == 1 and torch.allclose(total, cache["blocks.0.hook_attn_out"], atol=1e-5)
    model.set_use_attn_result(False)
    if kind == "bert-cls":
        with pytest.raises(ConfigError, match="no hook_attn_in"):
            model.set_use_attn_in(True)


def test_a_device_or_dtype_the_machine_cannot_give_is_one_clear_error(tiny_checkpoints):
    """They had failed deep in torch / TransformerLens (an AssertionError for cuda, a TypeError
    for a dtype name)."""
    path = tiny_checkpoints["bert-cls"]
    with pytest.raises(ConfigError, match="device must be auto, cpu, cuda"):
        load_model(path, task="mnli", device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="torch sees no CUDA GPU"):
            load_model(path, task="mnli", device="cuda")
    with pytest.raises(ConfigError, match="floating torch dtype"):
        load_model(path, task="mnli", dtype="int8")
    model = load_model(path, task="mnli", dtype="bfloat16", device="auto")  # names work
    assert model.cfg.dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.bfloat16
    # a classifier runs in half precision (its head had stayed float32: a dtype error)
    for kind in ("bert-cls", "gpt2-cls"):
        full = load_model(tiny_checkpoints[kind], task="mnli")
        half = load_model(tiny_checkpoints[kind], task="mnli", dtype=torch.float16)
        tokens = full.to_tokens(["The cat sat ."], ["A cat sits ."])
        logits = half(**tokens)
        assert logits.dtype == torch.float16
        torch.testing.assert_close(logits.float(), full(**tokens), atol=1e-2, rtol=0)


def test_loading_prints_nothing_on_stdout(tiny_checkpoints, capsys):
    load_model(tiny_checkpoints["bert-cls"], task="mnli")
    load_model(tiny_checkpoints["gpt2-lm"])
    assert capsys.readouterr().out == ""  # a pipe gets only what a command means to say


@pytest.mark.parametrize("kind", ["llama-lm", "gpt2-lm"])
def test_lm_fast_paths_give_transformer_lens_values_and_hooks(tiny_checkpoints, kind, monkeypatch):
    """A loaded causal LM's gated MLPs and unembedding skip TransformerLens's per-call weight
    copies: the same logits and cached activations (every MLP and unembedding hook fires) as
    TransformerLens's own forwards; bfloat16 keeps TransformerLens's code."""
    import pickle

    from transformer_lens.components import Unembed

    from mi_core.models.fast_paths import FastGatedMLP, FastUnembed

    model = load_model(tiny_checkpoints[kind])
    assert type(model.unembed) is FastUnembed  # the fast paths are installed
    if kind == "llama-lm":
        assert all(type(block.mlp) is FastGatedMLP for block in model.blocks)
    pickle.dumps(model)  # module-level classes: the model still pickles
    ids = torch.tensor([[1, 5, 9, 14, 3, 7], [2, 8, 4, 6, 11, 12]])
    with torch.no_grad():
        fast_logits, fast = model.run_with_cache(ids)
        for module in model.modules():
            if type(module) in (FastGatedMLP, FastUnembed):
                module.__class__ = type(module).__mro__[1]  # back to TransformerLens's class
        assert type(model.unembed) is Unembed
        slow_logits, slow = model.run_with_cache(ids)
    assert set(fast.keys()) == set(slow.keys())
    names = [k for k in fast.keys() if ".mlp." in k or k.startswith("unembed")]
    assert len(names) >= (3 if kind == "llama-lm" else 2) * model.cfg.n_layers
    for name in names:
        assert_float32_close(fast[name], slow[name])
    assert_float32_close(fast_logits, slow_logits)

    calls = []
    tl_forward = Unembed.forward
    monkeypatch.setattr(Unembed, "forward", lambda self, x: calls.append(1) or tl_forward(self, x))
    fp32 = load_model(tiny_checkpoints[kind])
    bf16 = load_model(tiny_checkpoints[kind], dtype=torch.bfloat16)
    with torch.no_grad():
        fp32(ids)
        assert calls == []  # float32: the fast path
        bf16(ids)
        assert calls == [1]  # bfloat16: TransformerLens's own code, Hugging Face's sum order


def test_ungrouped_key_value_heads_are_projected_once_and_repeated(tiny_checkpoints, monkeypatch):
    """With ``ungroup_grouped_query_attention`` on (edge methods switch it on), a loaded
    grouped-query LM projects each shared key / value head once and repeats it: ``hook_k`` /
    ``hook_v`` hold TransformerLens's per-query-head values, their gradients are each query
    head's own, and the logits and input gradient equal TransformerLens's; split per-head
    inputs keep TransformerLens's code."""
    from transformer_lens.components import GroupedQueryAttention

    from mi_core.interventions.edges import graph_switches
    from mi_core.models.fast_paths import FastGroupedQueryAttention

    model = load_model(tiny_checkpoints["llama-lm"])
    assert model.cfg.n_key_value_heads < model.cfg.n_heads  # the tiny Llama groups its heads
    assert all(type(block.attn) is FastGroupedQueryAttention for block in model.blocks)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7], [2, 8, 4, 6, 11, 12]])
    names = [f"blocks.{i}.attn.hook_{kind}" for i in range(model.cfg.n_layers) for kind in "kv"]

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        kept: dict[str, torch.Tensor] = {}

        def keep(x: torch.Tensor, hook) -> None:
            x.retain_grad()
            kept[hook.name] = x

        with graph_switches(model, split_inputs=False):
            model.reset_hooks()
            logits = model.run_with_hooks(ids, fwd_hooks=[(n, keep) for n in names])
        (logits[:, -1, 7] - logits[:, -1, 3]).sum().backward()
        return (
            logits.detach(),
            {n: kept[n].detach() for n in names},
            {n: kept[n].grad for n in names},
        )

    calls = []
    tl_qkv = GroupedQueryAttention.calculate_qkv_matrices
    monkeypatch.setattr(
        GroupedQueryAttention,
        "calculate_qkv_matrices",
        lambda self, *args: calls.append(1) or tl_qkv(self, *args),
    )
    fast_logits, fast_values, fast_grads = run()
    assert calls == []  # ungrouped, one shared input: the fast path's own projections
    with graph_switches(model), torch.no_grad():  # split per-head inputs: TransformerLens's
        model(ids)
    assert len(calls) == model.cfg.n_layers
    calls.clear()
    for block in model.blocks:
        block.attn.__class__ = GroupedQueryAttention  # TransformerLens's repeated weights
    slow_logits, slow_values, slow_grads = run()
    assert_float32_close(fast_logits, slow_logits)
    for name in names:
        assert fast_values[name].shape[2] == model.cfg.n_heads  # one per query head
        assert_float32_close(fast_values[name], slow_values[name])
        assert_float32_close(fast_grads[name], slow_grads[name])
        # the query heads sharing a key / value head see different gradients
        assert not torch.allclose(fast_grads[name][:, :, 0], fast_grads[name][:, :, 1])


@pytest.fixture
def tl_attention_calls(monkeypatch) -> list[int]:
    """A list that grows by one at each call of TransformerLens's own attention forward."""
    from transformer_lens.components.abstract_attention import AbstractAttention

    calls: list[int] = []
    tl_forward = AbstractAttention.forward
    monkeypatch.setattr(
        AbstractAttention,
        "forward",
        lambda self, *a, **k: calls.append(1) or tl_forward(self, *a, **k),
    )
    return calls


@pytest.mark.parametrize("kind", ["gpt2-lm", "opt-lm", "llama-lm"])
def test_lm_attention_fast_path_gives_transformer_lens_values_hooks_and_gradients(
    tiny_checkpoints, kind, tl_attention_calls
):
    """A loaded causal LM's attention runs ``scaled_dot_product_attention`` when nobody hooks
    its scores or pattern: every other hook (q, k, v, the rotary ones, z) sees TransformerLens's
    values, and the logits and the weights' gradients are TransformerLens's; a hook on the
    pattern, a padding mask or a key / value cache sends it down TransformerLens's own path."""
    from transformer_lens.components import Attention, GroupedQueryAttention

    from mi_core.models.fast_paths import FastGroupedQueryAttention, FastLMAttention

    model = load_model(tiny_checkpoints[kind])
    fast_class = FastGroupedQueryAttention if kind == "llama-lm" else FastLMAttention
    assert all(type(block.attn) is fast_class for block in model.blocks)
    calls = tl_attention_calls
    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 2], [2, 8, 4, 6, 11, 12, 13]])

    def not_pattern(name: str) -> bool:
        return "hook_pattern" not in name and "hook_attn_scores" not in name

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logits, cache = model.run_with_cache(ids, names_filter=not_pattern)
        logits.log_softmax(-1)[:, -1, 3].sum().backward()
        return logits.detach(), dict(cache.items()), model.blocks[0].attn.W_Q.grad.clone()

    fast_logits, fast_cache, fast_grad = run()
    assert calls == []  # the fused path, at every layer
    assert any("hook_z" in name for name in fast_cache)
    if kind == "llama-lm":
        assert any("hook_rot_q" in name for name in fast_cache)
    with torch.no_grad():  # a hook on the pattern: TransformerLens's path, the same logits
        hooked = model.run_with_hooks(
            ids, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: None)]
        )
    assert len(calls) == 1  # that layer alone
    assert_float32_close(hooked, fast_logits)
    calls.clear()
    with torch.no_grad():  # a key / value cache: TransformerLens's path
        model.generate(
            ids[:1], max_new_tokens=2, use_past_kv_cache=True, stop_at_eos=False, verbose=False
        )
    assert calls

    calls.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # low-precision q / k / v
        model(ids)
    assert len(calls) == model.cfg.n_layers
    calls.clear()
    from mi_core.interventions import compute_means

    # mean activations of an LM's batches take the fused path, the mask compute_means makes
    # for a batch without one and a mask given alike
    batches = [{"input_ids": ids}]
    fused_means = compute_means(model, batches)
    masked_means = compute_means(
        model, [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}]
    )
    assert calls == []
    torch.testing.assert_close(fused_means.z, masked_means.z, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused_means.mlp_out, masked_means.mlp_out, rtol=1e-5, atol=1e-6)

    for block in model.blocks:
        block.attn.__class__ = GroupedQueryAttention if kind == "llama-lm" else Attention
    slow_logits, slow_cache, slow_grad = run()
    assert_float32_close(fast_logits, slow_logits)
    assert set(fast_cache) == set(slow_cache)
    for name, value in fast_cache.items():
        assert_float32_close(value, slow_cache[name])
    assert_float32_close(fast_grad, slow_grad)


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"use_attn_scale": False},
        {"scale_attn_by_inverse_layer_idx": True},
        {"rotary_adjacent_pairs": True},
        {"rotary_dim": 8},
    ],
    ids=["plain", "no-scale", "layer-scaled", "adjacent-pairs", "partial-rotary"],
)
def test_fused_attention_of_a_rotary_model_without_grouped_heads(variant, tl_attention_calls):
    """``FastLMAttention`` on a rotary model whose key / value heads are not grouped, under the
    attention-scale and rotary variants TransformerLens supports: the fused path runs and
    gives TransformerLens's logits and ``hook_rot_k`` values."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.components import Attention

    from mi_core.models.fast_paths import FastLMAttention, enable_lm_fast_paths

    cfg = HookedTransformerConfig(
        d_model=32, d_head=16, n_heads=2, n_layers=2, n_ctx=32, d_vocab=50, d_mlp=64,
        act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
        gated_mlp=True, seed=0, **{"rotary_dim": 16, **variant},
    )  # fmt: skip
    model = HookedTransformer(cfg).eval()
    enable_lm_fast_paths(model)
    assert all(type(block.attn) is FastLMAttention for block in model.blocks)
    calls = tl_attention_calls
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    name = "blocks.1.attn.hook_rot_k"
    with torch.no_grad():
        fused, fused_cache = model.run_with_cache(ids, names_filter=name)
        assert calls == []
        for block in model.blocks:
            block.attn.__class__ = Attention
        plain, plain_cache = model.run_with_cache(ids, names_filter=name)
    assert len(calls) == cfg.n_layers
    assert_float32_close(fused, plain)
    assert_float32_close(fused_cache[name], plain_cache[name])


@pytest.mark.parametrize("kind", ["gpt2-lm", "llama-lm"])
def test_fused_attention_with_a_padding_mask_gives_transformer_lens_values_and_gradients(
    tiny_checkpoints, kind, tl_attention_calls
):
    """A padded batch on the fused path: right padding, left padding and a row with a single
    real token; the logits at every position (pads included), ``hook_z`` (zero where a query
    sees no key, as TransformerLens's zeroed NaN pattern gives), and the weights' gradients
    (finite) are TransformerLens's.

    The same algebra in two kernels, compared in float64 (the fused path's own dtype too) so
    that the tolerances stay tight: in float32 the gradients round differently by up to
    ~1.5e-6 of their largest magnitude on some CPUs (tests/README.md)."""
    from transformer_lens.components import Attention, GroupedQueryAttention

    model = load_model(tiny_checkpoints[kind], dtype=torch.float64)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7], [2, 8, 4, 6, 11, 12], [3, 4, 5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]])
    names = [f"blocks.{i}.attn.hook_z" for i in range(model.cfg.n_layers)]

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logits, cache = model.run_with_cache(
            ids, attention_mask=mask, names_filter=lambda n: n in names
        )
        (logits.log_softmax(-1)[:, :, 3] * mask).sum().backward()
        return logits.detach(), dict(cache.items()), model.blocks[0].attn.W_Q.grad.clone()

    fast_logits, fast_z, fast_grad = run()
    assert tl_attention_calls == []  # the fused path, at every layer
    assert torch.isfinite(fast_grad).all()
    assert (fast_z[names[0]][1, :2] == 0).all()  # left padding: those queries see no key
    for block in model.blocks:
        block.attn.__class__ = GroupedQueryAttention if kind == "llama-lm" else Attention
    slow_logits, slow_z, slow_grad = run()
    assert len(tl_attention_calls) == model.cfg.n_layers
    assert fast_logits.dtype == torch.float64
    torch.testing.assert_close(fast_logits, slow_logits, **SAME_ALGEBRA_FLOAT64)
    for name in names:
        torch.testing.assert_close(fast_z[name], slow_z[name], **SAME_ALGEBRA_FLOAT64)
    torch.testing.assert_close(fast_grad, slow_grad, **SAME_ALGEBRA_FLOAT64)


@pytest.mark.parametrize("kind", ["gpt2-lm", "llama-lm", "bert-cls"])
def test_fast_paths_can_be_switched_off_for_second_order_gradients(tiny_checkpoints, kind):
    """PyTorch's fused attention has no double backward; ``fast_paths=False`` keeps
    TransformerLens's code, same values, and a Hessian-vector product goes through."""
    from mi_core.models.fast_paths import FAST_CLASSES

    fast = load_model(tiny_checkpoints[kind])
    plain = load_model(tiny_checkpoints[kind], fast_paths=False)
    assert any(isinstance(m, FAST_CLASSES) for m in fast.modules())
    assert not any(isinstance(m, FAST_CLASSES) for m in plain.modules())
    ids = torch.randint(1000, 2000, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(plain(ids), fast(ids), atol=1e-5, rtol=0)

    def hvp(model, fwd_hooks=()):
        store = {}

        def keep(x, hook):
            store["x"] = x
            return x

        hooks = [("blocks.0.hook_resid_post", keep), *fwd_hooks]
        out = model.run_with_hooks(ids, fwd_hooks=hooks)
        value = out.float().log_softmax(-1)[..., 0].sum()
        (grad,) = torch.autograd.grad(value, store["x"], create_graph=True)
        (second,) = torch.autograd.grad((grad * grad).sum(), store["x"])
        return second

    # the reference: the fast model made to take TL's path by a hook on every pattern
    layers = range(fast.cfg.n_layers)
    pattern = [(f"blocks.{i}.attn.hook_pattern", lambda x, hook: x) for i in layers]
    assert_float32_close(hvp(plain), hvp(fast, pattern))


@pytest.mark.parametrize("kind", ["gpt2-lm", "llama-lm", "bert-cls"])
def test_forward_mode_derivatives_work_on_the_fast_paths(kind, tiny_checkpoints):
    """jvp / jacfwd: the fused attention kernels have no forward-mode derivative, so the fast
    path writes its attention out for them, with and without a padding mask."""
    from torch.func import jvp

    task = "mnli" if kind.endswith("cls") else None
    results = []
    for fast_paths in (True, False):
        model = load_model(tiny_checkpoints[kind], task=task, fast_paths=fast_paths)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(1000, 2000, (2, 6), generator=gen)
        mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
        cache = model.run_with_cache(ids, names_filter="blocks.0.hook_resid_pre")[1]
        start = cache["blocks.0.hook_resid_pre"]
        tangent = torch.randn(start.shape, generator=gen)
        kwargs = {"attention_mask": mask}

        def from_stream(x, model=model, ids=ids, kwargs=kwargs):
            hooks = [("blocks.0.hook_resid_pre", lambda _, hook: x)]
            out = model.run_with_hooks(ids, fwd_hooks=hooks, **kwargs)
            return out.float().logsumexp(-1)

        results.append(jvp(from_stream, (start,), (tangent,)))
    (value, derivative), (plain_value, plain_derivative) = results
    torch.testing.assert_close(value, plain_value, atol=1e-5, rtol=1e-5)
    scale = float(plain_derivative.detach().abs().max())
    torch.testing.assert_close(derivative, plain_derivative, atol=1e-5 * scale, rtol=1e-4)


def test_a_checkpoint_with_its_labels_in_another_order_is_read_in_the_tasks_order(
    tiny_checkpoints, tmp_path, caplog
):
    """roberta-large-mnli's head is contradiction / neutral / entailment: its classes had been
    read as mi_core's entailment / neutral / contradiction, so HANS counted contradictions as
    entailments. The head is reordered on loading, and a fine-tune saves the task's order."""
    from mi_core.models.loading import load_hf_classifier

    original = load_model(tiny_checkpoints["bert-cls"], task="mnli")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        tiny_checkpoints["bert-cls"]
    )
    with torch.no_grad():  # the same model with its classes stored the other way round
        hf.classifier.weight.copy_(hf.classifier.weight.flip(0))
        hf.classifier.bias.copy_(hf.classifier.bias.flip(0))
    hf.config.id2label = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}
    hf.config.label2id = {v: k for k, v in hf.config.id2label.items()}
    hf.save_pretrained(tmp_path / "reversed")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_checkpoints["bert-cls"] / name, tmp_path / "reversed")
    model = load_model(tmp_path / "reversed", task="mnli")
    tokens = original.to_tokens(["The cat sat .", "A dog ran ."], ["A cat sits .", "Nobody ran ."])
    torch.testing.assert_close(model(**tokens), original(**tokens), atol=1e-5, rtol=0)
    assert model.label_names == ["entailment", "neutral", "contradiction"]
    hf_again, _, _ = load_hf_classifier(tmp_path / "reversed", task="mnli")
    assert hf_again.config.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}
    # a checkpoint of mi-core finetune trained its head in the task's order whatever the
    # base's names (and before this change kept those names): renamed, not reordered
    finetuned = transformers.AutoModelForSequenceClassification.from_pretrained(
        tiny_checkpoints["bert-cls"]
    )
    finetuned.config.id2label = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}
    finetuned.config.label2id = {v: k for k, v in finetuned.config.id2label.items()}
    finetuned.save_pretrained(tmp_path / "finetuned")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_checkpoints["bert-cls"] / name, tmp_path / "finetuned")
    (tmp_path / "finetuned" / "trainer_state.json").write_text('{"step": 5, "optimizer": {}}')
    renamed = load_model(tmp_path / "finetuned", task="mnli")
    torch.testing.assert_close(renamed(**tokens), original(**tokens), atol=1e-5, rtol=0)
    assert renamed.label_names == ["entailment", "neutral", "contradiction"]
    # names that are not the task's: read in the task's order, with a warning
    hf.config.id2label = {0: "yes", 1: "maybe", 2: "no"}
    hf.config.label2id = {v: k for k, v in hf.config.id2label.items()}
    hf.save_pretrained(tmp_path / "reversed")
    with caplog.at_level("WARNING", logger="mi_core.models.loading"):
        load_model(tmp_path / "reversed", task="mnli")
    assert "are not mnli's" in caplog.text
