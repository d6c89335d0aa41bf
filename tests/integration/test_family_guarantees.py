"""Faults an outside check of the families found on checkpoints with every parameter random and
odd tokenizers: each through the command line (one stderr line, no traceback, a non-zero exit)
or the library call behind it."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers import one_error

from mi_core.cli import main
from mi_core.errors import ModelInputError, ModelLoadError
from mi_core.models import load_model


@pytest.fixture(scope="module")
def qwen2_without_bos(tiny_checkpoints, tmp_path_factory):
    """The tiny Qwen2 as transformers reads it: the tokenizer has no BOS token, and an EOS
    token (``<|endoftext|>``, id 30522) that the model's 30,522-row embedding has no row for;
    the separability job put it first in every window."""
    path = tiny_checkpoints["qwen2-lm"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    assert tokenizer.bos_token_id is None and tokenizer.eos_token_id == 30522
    assert json.loads((path / "config.json").read_text())["vocab_size"] == 30522
    return path


def test_no_token_id_outside_the_vocabulary_reaches_the_embedding(qwen2_without_bos, caplog):
    model = load_model(qwen2_without_bos)
    assert model.tokenizer.eos_token_id is None and model.tokenizer.bos_token_id is None
    assert "outside the model's vocabulary of 30522 tokens; it is not used" in caplog.text
    # no BOS token: the tokenizer's own [CLS] opens a text, and TransformerLens adds nothing
    assert model.cfg.tokenizer_prepends_bos or model.cfg.default_prepend_bos is False
    tokens = model.to_tokens("the cat sat")
    assert int(tokens.max()) < 30522 and model(tokens).shape[-1] == 30522
    with pytest.raises(ModelInputError, match="token id 30522 is outside the model's vocab"):
        model(torch.tensor([[5, 30522]]))
    with pytest.raises(ModelInputError, match="token id -1 is outside"):
        model(torch.tensor([[5, -1]]))
    classifier = load_model(qwen2_without_bos, task="mnli")
    with pytest.raises(ModelInputError, match="token id 30522"):
        classifier(input_ids=torch.tensor([[5, 30522]]), attention_mask=torch.ones(1, 2))


@pytest.mark.usefixtures("data_dir")
def test_separability_runs_on_a_model_without_a_bos_token(qwen2_without_bos, tmp_path):
    """``mi-core separability`` on that Qwen2 ended in ``IndexError: index 30522 is out of
    bounds``: it now starts each window with the tokenizer's separator the model can embed."""
    out = tmp_path / "sep"
    argv = ["separability", "--model", str(qwen2_without_bos), "--focus", "text:wikitext",
            "--cripple", "text:python", "--tokens", "2000", "--eval-tokens", "500",
            "--steps", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_done"] == 1 and (out / "trajectory.csv").is_file()


def test_a_json_config_with_a_byte_order_mark_loads_as_data_files_do(tmp_path):
    """Notepad and Excel save UTF-8 with a byte-order mark; data files with one loaded, a
    config with one was refused as not JSON."""
    from mi_core.config import read_config_json
    from mi_core.data.prompt_tasks import load_prompt_task

    config = tmp_path / "c.json"
    config.write_bytes(b"\xef\xbb\xbf" + json.dumps({"model": "smollm2"}).encode())
    assert read_config_json(config) == {"model": "smollm2"}
    prompts = tmp_path / "p.jsonl"
    row = {"prompt": "The capital of France is", "answer": " Paris", "distractor": " Rome"}
    prompts.write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n")
    assert load_prompt_task(str(prompts)).examples[0].prompt == row["prompt"]


@pytest.mark.usefixtures("data_dir")
def test_a_mixture_of_experts_routing_to_more_experts_than_it_has_is_one_line(
    tiny_checkpoints, tmp_path, capsys
):
    """TransformerLens's config asserted it (an ``AssertionError`` with a traceback)."""
    path = tmp_path / "mixtral"
    config = transformers.AutoConfig.from_pretrained(tiny_checkpoints["mixtral-lm"])
    config.num_experts_per_tok = config.num_local_experts + 1
    transformers.MixtralForCausalLM(config).save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(tiny_checkpoints["mixtral-lm"]).save_pretrained(path)
    with pytest.raises(ModelLoadError, match="routes each token to 5 experts .* but has 4"):
        load_model(path)
    out = str(tmp_path / "m.safetensors")
    capsys.readouterr()  # the checkpoint's writing bar
    assert main(["means", "--model", str(path), "--data", "text:wikitext", "--out", out]) == 2
    assert "routes each token to 5 experts (num_experts_per_tok) but has 4" in one_error(capsys)


@pytest.mark.usefixtures("data_dir")
def test_an_output_under_a_symbolic_link_loop_is_one_line(tiny_checkpoints, tmp_path, capsys):
    """A loop as ``--out`` itself was refused; a loop among its parents raised ``RuntimeError:
    Symlink loop`` in the output lock."""
    from mi_core.errors import OutputError
    from mi_core.io import output_lock

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    out = tmp_path / "a" / "means.safetensors"
    argv = ["means", "--model", str(tiny_checkpoints["llama-lm"]), "--data", "text:wikitext",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    assert "is a symbolic link that leads nowhere (a loop, or to nothing)" in one_error(capsys)
    with pytest.raises(OutputError, match="leads through a symbolic link loop"), output_lock(out):
        pass


def test_a_tokenizer_without_a_bos_token_runs_without_one(tiny_checkpoints):
    """A tokenizer with neither a BOS token nor a template of its own (Qwen2's kind): the
    model's TransformerLens string API then prepends nothing (it would have prepended None)."""
    from helpers import word_tokenizer

    from mi_core.models.loading import attach_tokenizer
    from mi_core.models.vocabulary import guard_vocabulary

    model = load_model(tiny_checkpoints["llama-lm"])
    tokenizer = word_tokenizer(["the", "cat", "sat"])
    tokenizer.bos_token = None
    tokenizer.pad_token = tokenizer.eos_token
    attach_tokenizer(model, tokenizer)
    assert model.cfg.default_prepend_bos and not model.cfg.tokenizer_prepends_bos
    guard_vocabulary(model)
    assert model.cfg.default_prepend_bos is False
    assert model.to_tokens("the cat sat").tolist() == [[2, 3, 4]]
