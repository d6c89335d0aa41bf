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
from safetensors.torch import load_file, save_file

from mi_core.models import load_model
from mi_core.models.loading import load_hf_causal_lm


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("mi-core: error: "), err
    return err[0]


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
