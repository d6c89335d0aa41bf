"""Mean activations for mean ablation: every head's ``hook_z`` and every layer's ``hook_mlp_out``.

A mean is taken **per token over every non-padding position** of a dataset, not per position:
premise/hypothesis pairs have different lengths, so "position 17" means different things in
different examples, and a per-position mean would be estimated from fewer and fewer examples
towards the end. Padding positions are excluded. Sums are streamed in float64 with hooks during
one forward pass per batch; no activation cache is kept.

The file records the model it was made for (name and :func:`weights_fingerprint`), the data set,
and the number of tokens and examples; applying means to another model is an error.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from safetensors import SafetensorError
from tqdm.auto import tqdm

from mi_core.errors import ConfigError, DataError, InterventionError
from mi_core.interventions.components import model_dims
from mi_core.interventions.config import MeansConfig, MeansSettings  # noqa: F401 (re-exported)
from mi_core.io import read_safetensors, write_safetensors
from mi_core.models.classifier import StagedClassifier, batch_inputs
from mi_core.models.fingerprint import weights_fingerprint
from mi_core.models.hook_context import hooked
from mi_core.models.hooks import act_name

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

MEANS_KIND = "mi_core.ComponentMeans"
_FORMAT_VERSION = "1"
#: How the means were averaged; stored in the file so a reader never has to guess.
AVERAGING = "per-token mean over all non-padding positions"
#: ... and with a mean per position as well (:attr:`ComponentMeans.z_by_position`).
AVERAGING_BY_POSITION = (
    "per-token mean over all non-padding positions, and per position over the examples that "
    "reach it"
)


@dataclass(eq=False)
class ComponentMeans:
    """Mean ``hook_z`` per head and d_head dim, and mean ``hook_mlp_out`` per layer (float64)."""

    z: Float[torch.Tensor, "n_layers n_heads d_head"]
    mlp_out: Float[torch.Tensor, "n_layers d_model"]
    model_name: str
    fingerprint: str
    dataset: str = ""
    n_tokens: int = 0
    n_examples: int = 0
    source: str | None = field(default=None, repr=False, compare=False)
    """The file these means were read from or saved to (None: computed, never on disk); what a
    pruning run records as its ``means_path``."""
    z_by_position: Float[torch.Tensor, "n_layers pos n_heads d_head"] | None = None
    """With ``compute_means(..., by_position=True)``: each head's mean at each position, over
    the examples long enough to reach it. A removed head is then filled with its mean at the
    token's own position (positions past the longest example: the overall mean). For prompts
    of one template, where a position has one role; the paper's (and the default) fill is one
    mean over every token."""
    mlp_by_position: Float[torch.Tensor, "n_layers pos d_model"] | None = None
    """Each MLP's mean output at each position (with :attr:`z_by_position`)."""
    _cast: dict[tuple, tuple[torch.Tensor, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.z.ndim != 3 or self.mlp_out.ndim != 2 or self.z.shape[0] != self.mlp_out.shape[0]:
            raise InterventionError(
                f"means shapes do not fit: z {list(self.z.shape)} and mlp_out "
                f"{list(self.mlp_out.shape)}; expected [n_layers, n_heads, d_head] and "
                "[n_layers, d_model]"
            )
        by_z, by_mlp = self.z_by_position, self.mlp_by_position
        if (by_z is None) != (by_mlp is None) or (
            by_z is not None
            and by_mlp is not None
            and (
                tuple(by_z.shape[:1] + by_z.shape[2:]) != tuple(self.z.shape)
                or tuple(by_mlp.shape[:1] + by_mlp.shape[2:]) != tuple(self.mlp_out.shape)
                or by_z.shape[1] != by_mlp.shape[1]
            )
        ):
            raise InterventionError(
                "per-position means must come as z_by_position [n_layers, pos, n_heads, d_head] "
                "and mlp_by_position [n_layers, pos, d_model], both or neither; compute them "
                "again with mi-core means --by-position"
            )
        for name, values in self.tensors().items():
            if not bool(torch.isfinite(values).all()):
                raise InterventionError(
                    f"means of {self.model_name or 'a model'} hold NaN or infinite values in "
                    f"{name}: the model's activations were not finite (check its weights); "
                    "a mean ablation with them would give NaN logits"
                )

    @property
    def n_layers(self) -> int:
        return int(self.z.shape[0])

    @property
    def by_position(self) -> bool:
        """Whether these means hold a mean per position too (:attr:`z_by_position`)."""
        return self.z_by_position is not None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor these means hold, by its name in a means file."""
        out = {"z": self.z, "mlp_out": self.mlp_out}
        if self.z_by_position is not None and self.mlp_by_position is not None:
            out |= {"z_by_position": self.z_by_position, "mlp_by_position": self.mlp_by_position}
        return out

    def fill_values(
        self, kind: str, layer: int, like: torch.Tensor
    ) -> Float[torch.Tensor, "*pos n d"] | Float[torch.Tensor, "*pos d_model"]:
        """What fills a removed component of ``layer`` (``kind`` ``"z"``: its heads'
        ``[n_heads, d_head]``; ``"mlp_out"``: ``[d_model]``) in an activation like ``like``
        (``[batch, pos, ...]``), on its device and dtype: the overall mean, or with per-position
        means one row per position of ``like`` (``[pos, ...]``, broadcast over the batch)."""
        cast = self.cast(like.device, like.dtype)
        overall = cast[0 if kind == "z" else 1][layer]
        if not self.by_position:
            return overall
        table = cast[2 if kind == "z" else 3][layer]
        pos = like.shape[1]
        if pos <= table.shape[0]:
            return table[:pos]
        return torch.cat([table, overall.expand(pos - table.shape[0], *overall.shape)])

    @functools.cached_property
    def values_digest(self) -> str:
        """A short digest of the mean values themselves (computed once): two means of one
        model over unnamed data sets differ here where their names and fingerprints agree."""
        digest = hashlib.sha256()
        for values in self.tensors().values():
            digest.update(values.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
        return digest.hexdigest()[:12]

    def cast(
        self, device: torch.device, dtype: torch.dtype
    ) -> tuple[
        Float[torch.Tensor, "n_layers n_heads d_head"], Float[torch.Tensor, "n_layers d_model"]
    ]:
        """``(z, mlp_out)`` on ``device`` in ``dtype`` (then the per-position tables, when
        there are some), converted once and remembered."""
        key = (str(device), dtype)
        if key not in self._cast:
            self._cast[key] = tuple(t.to(device, dtype) for t in self.tensors().values())
        return self._cast[key]  # type: ignore[return-value]

    def check_model(self, model: HookedModel, *, fingerprint: bool = True) -> None:
        """Raise :class:`InterventionError` unless these means were made for ``model``."""
        cfg = model_dims(model)
        want = (cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_model)
        have = (*self.z.shape, self.mlp_out.shape[1])
        if want != tuple(have):
            raise InterventionError(
                f"means for {self.model_name!r} have shape layers x heads x d_head x d_model "
                f"{'x'.join(map(str, have))}, but the model has {'x'.join(map(str, want))}; "
                "compute means for this model with mi-core means"
            )
        if fingerprint:
            theirs = weights_fingerprint(model)
            if theirs != self.fingerprint:
                name = getattr(model, "model_name", None) or getattr(cfg, "model_name", "?")
                if name == self.model_name and name not in ("custom", "?"):  # TL's unnamed
                    why = (
                        "the checkpoint was rewritten, or its head reordered on loading"
                        if os.path.isabs(name)
                        else "its head reordered on loading, another revision or head seed"
                    )
                    raise InterventionError(
                        f"means were computed for {name!r} when its weights were "
                        f"{self.fingerprint}; they are {theirs} now ({why}); compute them "
                        "again with mi-core means"
                    )
                raise InterventionError(
                    f"means were computed for model {self.model_name!r} (weights "
                    f"{self.fingerprint}), not for this model {name!r} (weights {theirs}); "
                    "compute means for this model with mi-core means"
                )

    def metadata(self) -> dict[str, str]:
        """The string metadata stored in the safetensors header."""
        return {
            "kind": MEANS_KIND,
            "format_version": _FORMAT_VERSION,
            "model_name": self.model_name,
            "fingerprint": self.fingerprint,
            "dataset": self.dataset,
            "n_tokens": str(self.n_tokens),
            "n_examples": str(self.n_examples),
            "averaging": AVERAGING_BY_POSITION if self.by_position else AVERAGING,
        }

    @classmethod
    def from_tensors(
        cls, tensors: dict[str, torch.Tensor], metadata: dict[str, str], prefix: str = ""
    ) -> ComponentMeans:
        """Means from the tensors and metadata of :meth:`save` (keys under ``prefix``); a
        format or count this version does not know raises :class:`InterventionError`."""
        version = metadata.get(f"{prefix}format_version", _FORMAT_VERSION)
        if version != _FORMAT_VERSION:
            raise InterventionError(
                f"means format {version!r} is not {_FORMAT_VERSION!r} (written by another "
                "mi_core version); compute them again with mi-core means"
            )
        counts = {}
        for key in ("n_tokens", "n_examples"):
            value = metadata.get(f"{prefix}{key}", "0")
            if not value.isdigit():
                raise InterventionError(
                    f"means metadata {key}={value!r} is not a count; the file was edited or "
                    "damaged: compute the means again with mi-core means"
                )
            counts[key] = int(value)
        return cls(
            z=tensors[f"{prefix}z"],
            mlp_out=tensors[f"{prefix}mlp_out"],
            z_by_position=tensors.get(f"{prefix}z_by_position"),
            mlp_by_position=tensors.get(f"{prefix}mlp_by_position"),
            model_name=metadata.get(f"{prefix}model_name", ""),
            fingerprint=metadata.get(f"{prefix}fingerprint", ""),
            dataset=metadata.get(f"{prefix}dataset", ""),
            **counts,
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write a ``.safetensors`` file (float64 tensors ``z``, ``mlp_out``, and the
        per-position tables when there are some, + metadata)."""
        if Path(path).suffix.lower() != ".safetensors":
            raise InterventionError(f"cannot save means as {path}: use a .safetensors name")
        written = write_safetensors(path, self.tensors(), self.metadata())
        self.source = str(written)
        return written

    def __str__(self) -> str:
        return (
            f"ComponentMeans({self.model_name!r} weights {self.fingerprint}; "
            f"{self.n_layers} layers; {self.n_tokens} tokens from {self.n_examples} examples "
            f"of {self.dataset or '?'})"
        )


def load_means(path: str | os.PathLike[str], model: HookedModel | None = None) -> ComponentMeans:
    """Read means saved by :meth:`ComponentMeans.save`; with ``model``, check they are its own."""
    path = Path(path)
    if not path.is_file():
        raise InterventionError(f"means file {path} does not exist; make one with mi-core means")
    try:
        tensors, metadata = read_safetensors(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise InterventionError(f"means file {path} is not a safetensors file ({exc})") from exc
    if metadata.get("kind") != MEANS_KIND or not {"z", "mlp_out"} <= set(tensors):
        raise InterventionError(
            f"{path} is not a means file (kind {metadata.get('kind')!r}); "
            "make one with mi-core means"
        )
    try:
        means = ComponentMeans.from_tensors(tensors, metadata)
    except InterventionError as exc:
        raise InterventionError(f"{path}: {exc}") from None
    means.source = str(path)
    if model is not None:
        means.check_model(model)
    return means


@torch.inference_mode()
def compute_means(
    model: HookedModel,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    dataset: str = "",
    progress: bool = False,
    by_position: bool = False,
) -> ComponentMeans:
    """Stream ``batches`` through ``model`` and average ``hook_z`` and ``hook_mlp_out`` per token.

    Each batch holds ``input_ids`` and ``attention_mask`` (1 = real token), and for encoders
    optionally ``token_type_ids``. Only the transformer blocks run (no task head). With
    ``by_position`` each position is also averaged on its own, over the examples whose real
    tokens reach it (:attr:`ComponentMeans.z_by_position`; right padding: position ``p`` is
    each example's ``p``-th token).
    """
    cfg = model_dims(model)
    device = next(model.parameters()).device
    n_layers, n_heads, d_head = cfg.n_layers, cfg.n_heads, cfg.d_head
    sum_z = torch.zeros(n_layers, n_heads * d_head, dtype=torch.float64, device=device)
    sum_mlp = torch.zeros(n_layers, cfg.d_model, dtype=torch.float64, device=device)
    # per position: [n_layers, pos, features], grown to the longest batch seen
    by_pos: dict[str, torch.Tensor] = {}
    keep: dict[str, torch.Tensor] = {}

    def add(total: torch.Tensor, layer: int, name: str):
        def hook(x: torch.Tensor, hook: Any) -> None:
            rows = x.reshape(x.shape[0] * x.shape[1], -1)[keep["index"]]
            total[layer] += rows.sum(dim=0, dtype=torch.float64)
            if by_position:
                real = keep["mask"][:, :, None]  # [batch, pos, 1]
                sums = (x.reshape(x.shape[0], x.shape[1], -1).double() * real).sum(0)
                table = _grown(by_pos, name, (n_layers, sums.shape[0], sums.shape[1]), device)
                table[layer, : sums.shape[0]] += sums

        return hook

    hooks = []
    for layer in range(n_layers):
        hooks.append((act_name("z", layer), add(sum_z, layer, "z")))
        hooks.append((act_name("mlp_out", layer), add(sum_mlp, layer, "mlp_out")))

    n_tokens = n_examples = 0
    with hooked(model, hooks):
        for batch in tqdm(batches, desc="means", disable=not progress, unit="batch"):
            ids, attention_mask, types = batch_inputs(model, batch, device)
            keep["index"] = attention_mask.reshape(-1).nonzero().squeeze(1)
            keep["mask"] = attention_mask.to(torch.float64)
            run_body(model, ids, attention_mask, types)
            n_tokens += int(keep["index"].numel())
            n_examples += int(ids.shape[0])
            if by_position:
                counts = keep["mask"].sum(0)
                _grown(by_pos, "count", (counts.shape[0],), device)[: counts.shape[0]] += counts
    if n_tokens == 0:
        raise DataError(
            f"cannot compute means: the data set {dataset or ''} has no tokens (it is empty)"
        )
    z_by_position = mlp_by_position = None
    if by_position:
        count = by_pos["count"]
        reached = int((count > 0).sum())  # right padding: every position below it is reached
        z_by_position = (by_pos["z"][:, :reached] / count[:reached, None]).cpu()
        z_by_position = z_by_position.reshape(n_layers, reached, n_heads, d_head)
        mlp_by_position = (by_pos["mlp_out"][:, :reached] / count[:reached, None]).cpu()
    return ComponentMeans(
        z=(sum_z / n_tokens).reshape(n_layers, n_heads, d_head).cpu(),
        mlp_out=(sum_mlp / n_tokens).cpu(),
        z_by_position=z_by_position,
        mlp_by_position=mlp_by_position,
        model_name=str(getattr(model, "model_name", None) or model.cfg.model_name),
        fingerprint=weights_fingerprint(model),
        dataset=dataset,
        n_tokens=n_tokens,
        n_examples=n_examples,
    )


def _grown(
    tables: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    """``tables[name]``, zero-padded along its position axis (the second of three, the only
    one of one) to at least ``shape``'s length there."""
    axis = 1 if len(shape) == 3 else 0
    table = tables.get(name)
    if table is None:
        table = tables[name] = torch.zeros(shape, dtype=torch.float64, device=device)
    elif table.shape[axis] < shape[axis]:
        pad = list(table.shape)
        pad[axis] = shape[axis] - table.shape[axis]
        table = tables[name] = torch.cat([table, table.new_zeros(pad)], dim=axis)
    return table


def run_means(config: MeansConfig, *, progress: bool = True) -> ComponentMeans:
    """Load the model and data of ``config``, compute the means, write them to ``config.out``."""
    from mi_core.data import load_pairs, pair_batches
    from mi_core.data.pairs import check_pair_spec
    from mi_core.data.prompt_tasks import (
        TRAIN_SEED,
        check_prompt_spec,
        is_prompt_spec,
        load_task_data,
    )
    from mi_core.models import load_model
    from mi_core.tasks import NEXT_TOKEN

    prompts = config.data is not None and is_prompt_spec(config.data)
    if config.data is not None and prompts:  # a typo'd spec is found before the model loads
        check_prompt_spec(config.data)
    elif config.data:
        check_pair_spec(config.data)
    task = NEXT_TOKEN if prompts and config.task is None else config.task
    model = load_model(config.model, task=task, **config.load_options())
    task = getattr(model, "task", None)
    if not config.data and (not task or task == NEXT_TOKEN):
        raise ConfigError(
            f"{config.model} has no task, so there is no default data set: give --data"
        )
    if config.data is not None and prompts:  # the training prompts (or text) a pruning job draws
        dataset = load_task_data(
            config.data, config.max_examples, seed=TRAIN_SEED, tokenizer=model.tokenizer
        )
    else:
        dataset = load_pairs(config.data or f"{task}:train", max_examples=config.max_examples)
    if len(dataset) == 0:
        raise DataError(f"cannot compute means: the data set {dataset.name} is empty")
    batches = pair_batches(
        dataset,
        model.tokenizer,
        batch_size=config.batch_size,
        max_length=config.max_length,
        sort_by_length=True,
    )
    means = compute_means(
        model, batches, dataset=dataset.name, progress=progress, by_position=config.by_position
    )
    means.save(config.out)
    return means


def run_body(
    model: HookedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Run every transformer block of a hooked classifier, encoder or decoder (no output head)."""
    if isinstance(model, StagedClassifier):
        resid = model.embed_input(input_ids, attention_mask, token_type_ids)
        return model.run_blocks(resid, attention_mask)
    from transformer_lens import HookedEncoder

    if isinstance(model, HookedEncoder):  # TransformerLens's own encoder: no task head
        return model.encoder_output(input_ids, token_type_ids, attention_mask)
    return model(input_ids, attention_mask=attention_mask, return_type=None)
