"""The processed-weight cache: a causal LM's TransformerLens weights, processed once.

TransformerLens's weight processing (and de-quantising a GGUF file) takes tens of seconds for a
135M model, so :func:`~mi_core.models.load_model` keeps the processed weights of a local
checkpoint, with its config and tokenizer, as a plain folder under
``$MI_CORE_CACHE_DIR/tl_weights`` (default ``~/.cache/mi_core``). There is one folder per model
and processing option (norm folding, value-bias folding, dtype); a checkpoint that changes on
disk (a file's size, modification time, inode or status-change time: :func:`source_digest`)
replaces its folder's contents instead of adding a second copy. ``mi-core cache list`` shows
what is kept and how large it is; ``mi-core cache clear`` removes it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

#: Bumped when what a cache folder holds changes meaning; an older folder is rebuilt.
CACHE_VERSION = "4"
#: The processed weights' file in a cache folder.
CACHED_WEIGHTS = "tl_weights.safetensors"
#: The tensor of that file that holds the value biases folded out of ``hook_z``
#: (:mod:`mi_core.models.value_biases`), where any were.
FOLDED_TENSOR = "mi_core.folded_value_biases"


def cache_home() -> Path:
    """mi_core's cache folder: ``$MI_CORE_CACHE_DIR``, default ``~/.cache/mi_core``."""
    return Path(os.environ.get("MI_CORE_CACHE_DIR") or Path.home() / ".cache" / "mi_core")


def cache_root() -> Path:
    """Where the processed weights live: ``tl_weights`` in :func:`cache_home`."""
    return cache_home() / "tl_weights"


def cache_dir(
    folder: Path, gguf_file: str | None, fold: tuple[bool, bool], dtype: torch.dtype
) -> Path:
    """The one cache folder of a local checkpoint ``folder`` (its GGUF file, if any) processed
    with ``fold`` (norms, value biases) in ``dtype``."""
    key = f"{folder.resolve()}:{gguf_file}:{fold[0]}:{fold[1]}:{dtype}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
    return cache_root() / f"{folder.name}-{digest}"


def source_digest(folder: Path, gguf_file: str | None) -> str:
    """A digest of the checkpoint's files as they are now and of :data:`CACHE_VERSION`: a
    cache folder whose digest differs is out of date.

    Each file counts by its name, size, modification time, inode and status-change time. The
    last two catch a file replaced by another of the same size with its modification time set
    back (``cp -p``, ``touch -r``, an unpacked archive): no call sets the status-change time,
    and every write or replacement moves it, so the content need not be read (a 135M model's
    weights are hundreds of MB)."""
    files = [folder / gguf_file] if gguf_file else sorted(folder.iterdir())
    digest = hashlib.blake2b(digest_size=8)
    for f in files:
        if f.is_file():
            stat = f.stat()
            digest.update(
                f"{f.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}:"
                f"{stat.st_ctime_ns}".encode()
            )
    digest.update(CACHE_VERSION.encode())
    return digest.hexdigest()


def cached_source(weights: Path) -> str | None:
    """The :func:`source_digest` a cache folder's weights were made from, read from their
    file's header alone (the weights of a 135M model are 683 MB)."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as handle:
        return (handle.metadata() or {}).get("source")


@dataclass(frozen=True)
class CachedModel:
    """One cache folder: the checkpoint it was made from, and its size on disk."""

    folder: Path
    source: str
    bytes: int


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def list_cache() -> list[CachedModel]:
    """Every cache folder, with the checkpoint it holds and its size."""
    root = cache_root()
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        source = folder / "source.txt"
        name = source.read_text(encoding="utf-8").strip() if source.is_file() else "?"
        out.append(CachedModel(folder, name, _size(folder)))
    return out


def clear_cache() -> int:
    """Remove every cache folder; the bytes freed."""
    freed = sum(c.bytes for c in list_cache())
    root = cache_root()
    if root.is_dir():
        shutil.rmtree(root)
    return freed


def human_size(n: int) -> str:
    """A size in bytes as ``683.2 MB``."""
    size, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            break
        size /= 1000
    return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
