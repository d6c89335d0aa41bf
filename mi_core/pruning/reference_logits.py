"""The full model's class logits for every training example, computed once and cached on disk.

The pruning objective compares the masked model with the *unmasked* one. The public reference
code runs a second frozen copy of the model every step to get that target; but the full model
never changes, so its logits per example are fixed: compute them once (in data-set order, batches
sorted by length, padded per batch) and let the training loop look rows up by ``batch["index"]``.

The file (``.safetensors``) records what it was computed from: the model's weights fingerprint,
the data set's name and size, the tokenisation limit and a hash of every example's token ids. A
cache that does not match the model or data at hand is an error, never silently reused.

Plain text (:class:`~mi_core.data.TokenizedText`) has no cached reference: its objective
compares the distributions at every position, computed each step
(:func:`~mi_core.pruning.step.full_and_masked_kl`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from safetensors import SafetensorError

from mi_core.data.batches import PairBatches, TokenizedPairs, TokenizedText
from mi_core.errors import ConfigError
from mi_core.evaluation import predict_logits
from mi_core.io import read_safetensors, write_safetensors
from mi_core.models.fingerprint import weights_fingerprint

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

REFERENCE_KIND = "mi_core.ReferenceLogits"


def tokens_digest(tokenized: TokenizedPairs) -> str:
    """A short hash of every example's token ids and token types, in data-set order."""
    digest = hashlib.sha256()
    for ids, types in zip(tokenized.input_ids, tokenized.token_type_ids, strict=True):
        digest.update(len(ids).to_bytes(4, "little"))
        digest.update(torch.tensor(ids, dtype=torch.int64).numpy().tobytes())
        digest.update(torch.tensor(types, dtype=torch.int64).numpy().tobytes())
    return digest.hexdigest()[:16]


def reference_metadata(model: HookedModel, tokenized: TokenizedPairs) -> dict[str, str]:
    """What a reference-logits file must record to be reused for ``model`` and ``tokenized``."""
    return {
        "kind": REFERENCE_KIND,
        "model_name": str(getattr(model, "model_name", "") or ""),
        "fingerprint": weights_fingerprint(model),
        "dataset": tokenized.name,
        "n_examples": str(len(tokenized)),
        "max_length": str(tokenized.max_length),
        "tokens": tokens_digest(tokenized),
    }


@torch.no_grad()
def compute_reference_logits(
    model: HookedModel, tokenized: TokenizedPairs, batch_size: int = 128, progress: bool = False
) -> Float[torch.Tensor, "n label"]:
    """The unmasked model's class logits for every example of ``tokenized`` (float32, CPU)."""
    if isinstance(tokenized, TokenizedText):  # objectives on it compute their own targets
        raise ConfigError(
            f"{tokenized.name} is plain text: its full-model distributions are computed each "
            "step, at every position, not cached"
        )
    if len(tokenized) == 0:
        raise ConfigError(f"{tokenized.name or 'the training set'} is empty; nothing to prune on")
    was_training = model.training
    model.eval()
    batches = PairBatches(tokenized, batch_size=batch_size, sort_by_length=True)
    try:
        return predict_logits(
            model,
            batches,
            len(tokenized),
            "reference logits" if progress else None,
        )
    finally:
        model.train(was_training)


def load_reference_logits(
    path: str | os.PathLike[str],
    model: HookedModel | None = None,
    tokenized: TokenizedPairs | None = None,
) -> Float[torch.Tensor, "n label"]:
    """Read a reference-logits file; with ``model`` and ``tokenized``, check it fits them."""
    path = Path(path)
    try:
        tensors, metadata = read_safetensors(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"cannot read reference logits {path} ({exc})") from exc
    if metadata.get("kind") != REFERENCE_KIND or "logits" not in tensors:
        raise ConfigError(f"{path} is not a reference-logits file (kind {metadata.get('kind')!r})")
    if model is not None and tokenized is not None:
        want = reference_metadata(model, tokenized)
        differ = [
            k
            for k in ("fingerprint", "n_examples", "max_length", "tokens")
            if metadata.get(k) != want[k]
        ]
        if differ:
            raise ConfigError(
                f"reference logits {path} were computed for other "
                f"{'model weights' if 'fingerprint' in differ else 'training data'} "
                f"({', '.join(f'{k} {metadata.get(k)} != {want[k]}' for k in differ)}); "
                "delete the file or use another output directory"
            )
    return tensors["logits"]


def reference_logits(
    model: HookedModel,
    tokenized: TokenizedPairs,
    path: str | os.PathLike[str],
    batch_size: int = 128,
    progress: bool = False,
) -> Float[torch.Tensor, "n label"]:
    """The cached reference logits at ``path``, computing and saving them first if absent."""
    path = Path(path)
    if path.is_file():
        return load_reference_logits(path, model, tokenized)
    logits = compute_reference_logits(model, tokenized, batch_size, progress)
    write_safetensors(path, {"logits": logits}, reference_metadata(model, tokenized))
    return logits
