"""Where a checkpoint's files are (:class:`ModelSource`) and the one-line errors for files
that cannot be read: a hub name offline, damaged or unreadable weights, integer weights."""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError

import mi_core.models.embedded as embedded
from mi_core.errors import ModelLoadError


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are: a local folder or a hub id, and a GGUF file if any."""

    name: str
    path: str
    local: bool
    gguf_file: str | None = None
    revision: str | None = None
    """A hub model's revision (a branch, tag or commit: Pythia's ``step1000``)."""

    def kwargs(self) -> dict:
        """Keyword arguments for ``from_pretrained``: never code from the checkpoint (unset,
        transformers asks at the terminal whether to run a tokenizer's own code)."""
        out: dict = {"trust_remote_code": False}
        if self.gguf_file:
            out["gguf_file"] = self.gguf_file
        if self.revision:
            out["revision"] = self.revision
        if self.local or os.environ.get("HF_HUB_OFFLINE") == "1":
            out["local_files_only"] = True
        return out


def resolve_source(name_or_path: str | os.PathLike[str]) -> ModelSource:
    """Find a model's files: an embedded name, a local directory, a local ``.gguf`` file (its
    config, tokenizer and de-quantised weights read from it by transformers), or a hub id,
    optionally at a revision: ``EleutherAI/pythia-160m@step1000`` (a branch, tag or commit;
    offline, the revision must be in the Hugging Face cache)."""
    name = str(name_or_path)
    if name == embedded.MINILM:
        return ModelSource(name, str(embedded.minilm_path()), local=True)
    if name == embedded.SMOLLM2:
        folder, gguf = embedded.smollm2_gguf()
        return ModelSource(name, str(folder), local=True, gguf_file=gguf)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":  # config, tokenizer and weights in one
        return ModelSource(name, str(path.parent), local=True, gguf_file=path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} has no config.json; expected a Hugging Face checkpoint directory "
                "(config.json + model.safetensors + tokenizer files)"
            )
        return ModelSource(name, str(path), local=True)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelLoadError(
            f"{name} is not a checkpoint directory; give a folder with config.json, a hub name "
            f"such as bert-base-cased, or one of {list(embedded.EMBEDDED_MODELS)}"
        )
    repo, at, revision = name.partition("@")
    if at:
        if not repo or not revision:
            raise ModelLoadError(
                f"{name!r}: a hub revision is written name@revision, e.g. "
                "EleutherAI/pythia-160m@step1000"
            )
        return ModelSource(name, repo, local=False, revision=revision)
    return ModelSource(name, name, local=False)


def hub_error(source: ModelSource, exc: Exception) -> ModelLoadError:
    """A hub load that failed: offline and not cached, or the local files unreadable."""
    if source.local:
        return weights_error(source, exc)
    return ModelLoadError(
        f"cannot load {source.name!r}: not a local checkpoint directory and not available from the "
        f"Hugging Face hub or its cache ({type(exc).__name__}); pass a local directory or go online"
    )


def weights_error(source: ModelSource, exc: Exception) -> ModelLoadError:
    """Why a checkpoint's weights could not be read, as one line naming the file."""
    detail = " ".join(str(exc).split())[:200]
    if source.gguf_file:  # the file, not its folder
        where = Path(source.path) / source.gguf_file
        return ModelLoadError(
            f"cannot read the GGUF file {where} ({type(exc).__name__}: {detail}); the file is "
            "truncated or damaged (an interrupted download or copy): fetch or copy it again"
        )
    folder = Path(source.path)
    if (
        source.local
        and folder.is_dir()
        and not any(f.suffix in (".safetensors", ".bin") for f in folder.iterdir() if f.is_file())
    ):
        return ModelLoadError(
            f"{folder} holds no weight file (model.safetensors, or pytorch_model.bin): copy the "
            "checkpoint's weights into the folder, or save the model there again"
        )
    if source.local and Path(source.path).is_dir():  # safetensors calls "cannot open" not found
        blocked = [
            f.name
            for f in Path(source.path).iterdir()
            if f.is_file() and f.suffix in (".safetensors", ".bin") and not os.access(f, os.R_OK)
        ]
        if blocked:
            return ModelLoadError(
                f"cannot read the weights of {source.path}: {', '.join(blocked)} is not readable "
                "(Permission denied)"
            )
    if "mismatched_sizes" in detail or "size mismatch" in detail:
        return ModelLoadError(
            f"the weights of {source.path} do not have the shapes its config.json gives (e.g. a "
            "head of another label count, or the config of another model): fix config.json or "
            "the weights"
        )
    if isinstance(exc, pickle.UnpicklingError):
        return ModelLoadError(
            f"the weights of {source.path} are a pickle holding more than tensors, which mi_core "
            "never loads (it could run code); use a model.safetensors checkpoint"
        )
    return ModelLoadError(
        f"cannot read the weights of {source.path} ({type(exc).__name__}: {detail}); the "
        "weight file is truncated or damaged: copy or save the checkpoint again"
    )


#: What reading a damaged weight file raises (safetensors, torch, transformers; a pickled
#: ``.bin`` holding more than tensors is refused by ``weights_only`` as an unpickling error).
DAMAGED = (OSError, ValueError, RuntimeError, SafetensorError, pickle.UnpicklingError)


#: Integer tensors a float checkpoint may hold: index buffers, not weights.
_INTEGER_BUFFERS = ("position_ids", "token_type_ids", "num_batches_tracked")
_INTEGER_DTYPES = {"BOOL", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"}


def refuse_integer_weights(source: ModelSource) -> None:
    """Refuse a local checkpoint whose safetensors weights are integers: transformers casts
    them into the float parameters, and the model gives nonsense (a quantised checkpoint's
    packed integers, or weights saved in the wrong dtype). Only the files' headers are read."""
    from safetensors import safe_open

    if not source.local or source.gguf_file or not Path(source.path).is_dir():
        return
    for file in sorted(Path(source.path).glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    dtype = handle.get_slice(key).get_dtype()
                    if dtype in _INTEGER_DTYPES and not key.endswith(_INTEGER_BUFFERS):
                        raise ModelLoadError(
                            f"{file} holds integer weights ({key}: {dtype}); a checkpoint's "
                            "weights are floating point (a quantised checkpoint, GPTQ or AWQ, "
                            "is not read: de-quantise it first)"
                        )
        except (SafetensorError, OSError):
            return  # the load itself reports a damaged file
