"""Where a job computes: one ``device`` option for every job, and optional mixed precision.

Every job config carries :class:`DeviceOption` (the ``--device`` flag): ``auto`` (the default)
is CUDA when torch sees a GPU and the CPU otherwise; ``cpu``, ``cuda``, ``cuda:N`` and ``mps``
name one. Asking for a device torch does not have is a :class:`~mi_core.errors.ConfigError`
before any work starts.

Fine-tuning and pruning take ``precision``: ``fp32`` (default), ``bf16`` or ``fp16`` autocast
of the model's forward pass. What is trained stays in float32 (fine-tuned weights, pruning
gates and lambdas, optimizer state); ``fp16`` adds dynamic loss scaling (:func:`grad_scaler`),
one scaler per pruning run (also within a batched group), saved in the checkpoints a resumed run
continues from; bf16 needs none.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mi_core.config import Config, option
from mi_core.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where a device is used: a job's config stays light
    import torch

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
#: ``fp32``: float32 throughout; ``tf32``: float32 tensors, with a job's CUDA matrix products in
#: TensorFloat-32 on GPUs that have it (Ampere and later; 10 mantissa bits in the products'
#: inputs, float32 sums; :func:`matmul_precision`); ``bf16`` / ``fp16``: autocast of the forward
#: passes (:func:`autocast`), what is trained kept in float32.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def check_device_name(name: str) -> str:
    """``name`` when it is a device mi_core takes (``auto``, ``cpu``, ``cuda``, ``cuda:N``,
    ``mps``), else :class:`ConfigError`."""
    if not isinstance(name, str) or not _DEVICE.match(name):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps, got {name!r}")
    return name


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """The torch device ``name`` means here: ``auto`` is CUDA when available, else the CPU."""
    import torch

    if isinstance(name, torch.device):
        return name
    check_device_name(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {name} asked for, but torch sees no CUDA GPU here; use --device auto "
                "or cpu"
            )
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {name} asked for, but torch sees {torch.cuda.device_count()} CUDA GPU(s)"
            )
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device mps asked for, but torch sees no Apple GPU here")
    return torch.device(name)


def check_precision(precision: str) -> str:
    """``precision`` when it is one of :data:`PRECISIONS`, else :class:`ConfigError`."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    return precision


def autocast(
    device: torch.device | str, precision: str = "fp32"
) -> contextlib.AbstractContextManager:
    """Autocast of the forward pass to ``precision`` on ``device`` (nothing for ``fp32`` and
    ``tf32``, whose tensors stay float32)."""
    import torch

    check_precision(precision)
    if precision in ("fp32", "tf32"):
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    return torch.autocast(
        device_type=device_type, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    )


def matmul_precision(precision: str) -> contextlib.AbstractContextManager:
    """For the duration of a job's steps (their forward and backward passes): with ``tf32``,
    CUDA's float32 matrix products in TensorFloat-32, restored afterwards; nothing for the other
    precisions (torch's settings stay as the user left them). Only cuBLAS's flag is touched
    (CPU products are unchanged), through the API the user's torch session already uses: the
    legacy ``allow_tf32``, or ``fp32_precision`` where the user set that one (torch refuses a
    mix of the two)."""
    check_precision(precision)
    if precision != "tf32":
        return contextlib.nullcontext()
    return _cuda_tf32()


@contextlib.contextmanager
def _cuda_tf32() -> Iterator[None]:
    import torch

    matmul = torch.backends.cuda.matmul
    try:
        name, before, value = "allow_tf32", matmul.allow_tf32, True
    except RuntimeError:  # the session set the per-backend API: keep to it
        name, before, value = "fp32_precision", matmul.fp32_precision, "tf32"
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, before)


def grad_scaler(device: torch.device | str, precision: str) -> torch.amp.GradScaler | None:
    """Dynamic loss scaling for ``fp16`` (None otherwise: bf16 and fp32 need none)."""
    import torch

    if check_precision(precision) != "fp16":
        return None
    return torch.amp.GradScaler(torch.device(device).type)


def to_device(
    batch: Mapping[str, torch.Tensor], device: torch.device | str
) -> dict[str, torch.Tensor]:
    """``batch`` on ``device``, each tensor moved by :func:`move`."""
    return {k: move(v, device) for k, v in batch.items()}


def move(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``; a CPU tensor goes to a GPU through pinned memory, without
    blocking the host (a pageable copy would wait for the GPU to finish its queued work)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


@dataclass(kw_only=True)
class DeviceOption(Config):
    """The ``device`` every job takes (see the module docstring)."""

    device: str = "auto"
    """Where to compute: auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps."""

    def validate(self) -> None:
        super().validate()
        check_device_name(self.device)

    def torch_device(self) -> torch.device:
        """The resolved device (:func:`resolve_device`)."""
        return resolve_device(self.device)


#: The dtypes a job may load a model's weights in (:class:`ModelPlacement`).
WEIGHT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(kw_only=True)
class ModelPlacement(DeviceOption):
    """``device``, and how a model too large for one GPU is held: the dtype of its weights and
    the GPUs of this machine its layers are split over. Taken by the jobs that load language
    models or large classifiers to read them (eval, means, ablation table, separability,
    circuit); what they compute from the model (masks, scores, means, statistics) stays in
    float32 or float64 whatever the weights are."""

    weights: str = option("float32", choices=WEIGHT_DTYPES)
    """The dtype the model's weights are loaded in: bfloat16 / float16 halve the memory a model
    takes (its activations and logits are then of that dtype too)."""
    n_devices: int = option(1, ge=1)
    """Split a causal LM's layers over this many GPUs of this machine (cuda:0 ... cuda:N-1,
    TransformerLens's ``n_devices``); 1 keeps it on ``device``."""

    def load_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~mi_core.models.load_model` for this placement."""
        return {
            "device": str(self.torch_device()),
            "dtype": self.weights,
            "n_devices": self.n_devices,
        }
