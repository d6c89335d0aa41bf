"""Means: a float64 per-token average over non-padding tokens, tied to the model's weights."""

from __future__ import annotations

import pytest
import torch
from test_interventions_ablation import N_HEADS, N_LAYERS, VOCAB, _tiny

from mi_core.errors import DataError, InterventionError
from mi_core.interventions import AVERAGING, compute_means, load_means
from mi_core.models import weights_fingerprint


def _batches(seed: int = 3) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for width, lengths in ((10, [10, 4, 7]), (6, [6, 6, 1, 3])):
        ids = torch.randint(1, VOCAB, (len(lengths), width), generator=gen)
        mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
        out.append({"input_ids": ids * mask, "attention_mask": mask})
    return out


def _direct_means(kind, model, batches):
    """Mean over the non-padding tokens of a plain run_with_cache, in float64."""
    z_sum = torch.zeros(N_LAYERS, N_HEADS, 8, dtype=torch.float64)
    mlp_sum = torch.zeros(N_LAYERS, model.cfg.d_model, dtype=torch.float64)
    count = 0
    for b in batches:
        if kind == "encoder":
            _, cache = model.run_with_cache(
                b["input_ids"], one_zero_attention_mask=b["attention_mask"]
            )
        else:
            _, cache = model.run_with_cache(b["input_ids"], attention_mask=b["attention_mask"])
        keep = b["attention_mask"].bool()
        for l in range(N_LAYERS):
            z_sum[l] += cache[f"blocks.{l}.attn.hook_z"][keep].double().sum(0)
            mlp_sum[l] += cache[f"blocks.{l}.hook_mlp_out"][keep].double().sum(0)
        count += int(keep.sum())
    return z_sum / count, mlp_sum / count, count


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_means_equal_direct_float64_computation(kind):
    model = _tiny(kind)
    batches = _batches()
    means = compute_means(model, batches, dataset="toy")
    z, mlp, count = _direct_means(kind, model, batches)
    assert means.z.dtype == torch.float64 and means.mlp_out.dtype == torch.float64
    assert means.n_tokens == count == 10 + 4 + 7 + 6 + 6 + 1 + 3
    assert means.n_examples == 7
    torch.testing.assert_close(means.z, z, rtol=0, atol=1e-12)
    torch.testing.assert_close(means.mlp_out, mlp, rtol=0, atol=1e-12)
    # padding tokens must not count
    unmasked = [{"input_ids": b["input_ids"]} for b in batches]
    assert not torch.allclose(compute_means(model, unmasked).z, means.z)


def test_save_load_round_trip_and_metadata(tmp_path):
    model = _tiny("encoder")
    means = compute_means(model, _batches(), dataset="mnli:train")
    path = means.save(tmp_path / "means.safetensors")
    loaded = load_means(path, model)
    assert torch.equal(loaded.z, means.z) and torch.equal(loaded.mlp_out, means.mlp_out)
    assert loaded.fingerprint == weights_fingerprint(model)
    assert (loaded.dataset, loaded.n_tokens, loaded.n_examples) == ("mnli:train", 37, 7)
    assert loaded.metadata()["averaging"] == AVERAGING
    assert "37 tokens from 7 examples of mnli:train" in str(loaded)


def test_means_from_another_model_are_refused(tmp_path):
    model = _tiny("encoder")
    path = compute_means(model, _batches()).save(tmp_path / "means.safetensors")
    other = _tiny("encoder")
    with torch.no_grad():
        other.blocks[0].attn.W_Q.add_(0.01)
    with pytest.raises(InterventionError, match="means were computed for model .* not for this"):
        load_means(path, other)
    decoder = _tiny("decoder")  # same shapes, other weights
    with pytest.raises(InterventionError, match="not for this model"):
        load_means(path, decoder)


def test_empty_data_and_bad_files(tmp_path):
    model = _tiny("encoder")
    with pytest.raises(DataError, match="no tokens"):
        compute_means(model, [])
    with pytest.raises(InterventionError, match="does not exist"):
        load_means(tmp_path / "nope.safetensors")
    (tmp_path / "x.safetensors").write_bytes(b"garbage")
    with pytest.raises(InterventionError, match="not a safetensors file"):
        load_means(tmp_path / "x.safetensors")
    means = compute_means(model, _batches())
    with pytest.raises(InterventionError, match="use a .safetensors name"):
        means.save(tmp_path / "means.json")
    assert not (tmp_path / "means.json").exists()


def test_means_of_a_checkpoint_rewritten_since_say_so(tmp_path, tiny_checkpoints):
    """The same path with other weights (a checkpoint rewritten, or its head reordered on
    loading): the message had named the same model twice as two models."""
    import shutil

    import transformers

    from mi_core.models import load_model

    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints["bert-cls"], path)
    model = load_model(path, task="mnli")
    means = compute_means(model, _batches()).save(tmp_path / "means.safetensors")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(path)
    with torch.no_grad():
        hf.classifier.bias.add_(1.0)
    hf.save_pretrained(path)
    with pytest.raises(InterventionError, match="when its weights were .*; they are .* now"):
        load_means(means, load_model(path, task="mnli"))
    # a hub model's name is no path: the message still says it is the same model
    hub = compute_means(model, _batches())
    hub.model_name = "org/model"
    changed = load_model(path, task="mnli")
    changed.model_name = "org/model"
    with pytest.raises(InterventionError, match="'org/model' when its weights were .* head seed"):
        hub.check_model(changed)
