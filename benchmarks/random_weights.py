"""A checkpoint with a model's config and tokenizer and weights drawn at random: for timing a
model whose weights cannot reach the machine (no step's cost depends on the weights' values)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import torch

_TOKENIZER_FILES = ("special_tokens_map.json", "vocab.json", "vocab.txt", "merges.txt")


def random_checkpoint(folder: str | Path, num_labels: int | None = None) -> Path:
    """``folder``'s ``config.json`` and tokenizer, weights drawn at random (seed 0), saved to a
    temporary folder (removed when the process exits): a causal LM, or with ``num_labels`` a
    sequence classifier. Its path."""
    import transformers

    if not (Path(folder) / "config.json").is_file():
        raise SystemExit(f"--random-weights needs a folder with a config.json; got {folder}")
    config = transformers.AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    if num_labels is None:
        model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        config.num_labels = num_labels
        model = transformers.AutoModelForSequenceClassification.from_config(config)
    out = Path(tempfile.mkdtemp(prefix="random-weights-"))
    atexit.register(shutil.rmtree, out, True)  # full-size weights: not left behind
    model.save_pretrained(out)
    for f in Path(folder).iterdir():
        if f.name.startswith("tokenizer") or f.name in _TOKENIZER_FILES:
            shutil.copy(f, out / f.name)
    return out
