"""The model families ``mi_core`` loads: one module per family, one table (:data:`FAMILIES`).

Adding a family means one new module here (its architectures, config mapping, weight
conversion, fast-path and graph flags, tiny test config: :class:`Family`) and one row in
the table. Loading (:mod:`mi_core.models.loading`), the fast paths, the circuit graph and the
tiny test checkpoints (:mod:`mi_core.testing`) all read the table.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from transformer_lens import HookedTransformerConfig
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from mi_core.errors import ModelLoadError
from mi_core.models.families import (
    bert,
    bloom,
    gemma,
    gpt2,
    gptj,
    llama,
    mistral,
    mixtral,
    neo,
    neox,
    olmo,
    opt,
    phi,
    phi3,
    qwen2,
    qwen3,
    recent,
    roberta,
)
from mi_core.models.families._base import Family, GraphKind

__all__ = [
    "FAMILIES",
    "Family",
    "GraphKind",
    "causal_lm_architectures",
    "classifier_architectures",
    "family",
    "family_for_architecture",
    "family_for_config",
    "family_of_model",
    "families_table",
    "foldable",
    "supported_architectures",
]

#: Every family mi_core loads, in the order the docs list them.
FAMILIES: tuple[Family, ...] = (
    gpt2.FAMILY,
    opt.FAMILY,
    llama.FAMILY,
    bert.FAMILY,
    roberta.FAMILY,
    neox.FAMILY,
    gptj.FAMILY,
    neo.FAMILY,
    mistral.FAMILY,
    mixtral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    phi.FAMILY,
    phi3.FAMILY,
    gemma.FAMILY,
    gemma.FAMILY2,
    gemma.FAMILY3,
    olmo.FAMILY,
    olmo.FAMILY2,
    olmo.FAMILY_MOE,
    recent.OLMO3,
    recent.APERTUS,
    recent.GPT_OSS,
    bloom.FAMILY,
)
_BY_NAME = {f.name: f for f in FAMILIES}
_BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}
_BY_ARCHITECTURE = {a: f for f in FAMILIES for a in f.architectures}
_BY_TL_ARCHITECTURE = {f.tl_architecture: f for f in FAMILIES if not f.encoder}


def supported_architectures() -> tuple[str, ...]:
    """Every Hugging Face architecture :func:`~mi_core.load_model` reads."""
    return tuple(_BY_ARCHITECTURE)


def causal_lm_architectures() -> tuple[str, ...]:
    """The causal-LM architectures (loaded as ``HookedTransformer`` without a task)."""
    return tuple(f.causal_lm for f in FAMILIES if f.causal_lm)


def classifier_architectures() -> tuple[str, ...]:
    """The sequence-classifier architectures (loaded with their own head)."""
    return tuple(f.classifier for f in FAMILIES if f.classifier)


def _unsupported(what: str) -> ModelLoadError:
    return ModelLoadError(f"{what} is not supported; supported: " + ", ".join(_BY_ARCHITECTURE))


def family(name: str) -> Family:
    """The family called ``name`` (``"llama"``, ``"gpt-neox"``, ...)."""
    if name not in _BY_NAME:
        raise ModelLoadError(f"unknown model family {name!r}; expected one of {list(_BY_NAME)}")
    return _BY_NAME[name]


def family_for_architecture(architecture: str, source: str = "this checkpoint") -> Family:
    """The family of a Hugging Face architecture name, or one line listing the supported."""
    if architecture not in _BY_ARCHITECTURE:
        raise _unsupported(f"architecture {architecture} of {source}")
    return _BY_ARCHITECTURE[architecture]


def family_for_config(hf_config: Any) -> Family:
    """The family of a Hugging Face config (by its ``model_type``)."""
    kind = getattr(hf_config, "model_type", None)
    if kind not in _BY_MODEL_TYPE:
        raise _unsupported(f"model type {kind!r}")
    return _BY_MODEL_TYPE[kind]


def family_of_model(model: torch.nn.Module | HookedTransformerConfig) -> Family | None:
    """The family a hooked model (or its ``cfg``) was loaded from, by the architecture its
    config carries (None for a model of no family mi_core knows)."""
    cfg = model if hasattr(model, "original_architecture") else getattr(model, "cfg", None)
    arch = getattr(cfg, "original_architecture", None)
    if arch == "BertForMaskedLM":
        return bert.FAMILY
    return _BY_TL_ARCHITECTURE.get(arch or "")


def default_architecture(hf_config: Any) -> str:
    """The architecture of a config that names none: its family's causal LM, else its first."""
    fam = _BY_MODEL_TYPE.get(str(getattr(hf_config, "model_type", "")))
    if fam is None:
        return str(getattr(hf_config, "model_type", "unknown"))
    return fam.causal_lm or fam.architectures[-1]


def foldable(hf_config: Any) -> bool:
    """Whether TransformerLens folds this family's norms into the next weights: decoders
    whose norms sit on a sublayer's input (not OLMo-2's, which normalise its output)."""
    fam = family_for_config(hf_config)
    return not fam.encoder and fam.tl_architecture not in POST_NORM_ARCHITECTURES


def _check_experts(fields: dict[str, Any], family_name: str) -> None:
    """Refuse a mixture of experts that routes each token to more experts than it has (or to
    none), in one line (TransformerLens's config asserts it)."""
    experts, per_token = fields.get("num_experts"), fields.get("experts_per_token")
    if experts and per_token is not None and not 1 <= int(per_token) <= int(experts):
        raise ModelLoadError(
            f"{family_name} checkpoint routes each token to {per_token} experts "
            f"(num_experts_per_tok) but has {experts}; it must be between 1 and {experts}"
        )


def tl_config(
    hf_config: Any,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    fold_ln: bool = False,
    n_devices: int = 1,
) -> HookedTransformerConfig:
    """The TransformerLens config of a Hugging Face config; ``fold_ln`` selects TL's
    pre-folded norms where :func:`foldable`; ``n_devices`` splits the layers over that many
    CUDA devices (TransformerLens's own placement)."""
    fam = family_for_config(hf_config)
    fields = fam.config(hf_config)
    _check_experts(fields, fam.name)
    if fold_ln and foldable(hf_config):
        if fields["normalization_type"] in ("LN", "RMS"):
            fields["normalization_type"] += "Pre"
    name = getattr(hf_config, "_name_or_path", "") or hf_config.model_type
    return HookedTransformerConfig(
        **fields,
        original_architecture=fam.tl_architecture,
        model_name=str(name),
        device=device,
        n_devices=n_devices,
        dtype=dtype,
        init_weights=False,
    )


def causal_lm_state_dict(hf_model: Any, cfg: HookedTransformerConfig) -> dict[str, torch.Tensor]:
    """A Hugging Face causal LM's weights in TransformerLens's names (its family's converter)."""
    fam = family_for_config(hf_model.config)
    if fam.convert is None:
        raise _unsupported(f"{type(hf_model).__name__} as a causal LM")
    return fam.convert(hf_model, cfg)


def classifier_state_dict(hf_model: Any, cfg: HookedTransformerConfig) -> dict[str, torch.Tensor]:
    """A Hugging Face sequence classifier's weights in mi_core's names: an encoder's body and
    ``head.dense`` / ``head.out``; a decoder's body (its family's converter, given the body
    and a stand-in LM head) and ``head.score``."""
    fam = family_for_config(hf_model.config)
    if fam.encoder:
        body = getattr(hf_model, fam.body)
        return bert.body_state_dict(body, cfg.n_heads, cfg.n_ctx) | bert.head_state_dict(hf_model)
    assert fam.convert is not None
    body = getattr(hf_model, fam.body)
    embed = body.get_input_embeddings().weight
    stand_in = SimpleNamespace(
        **{fam.body: body, fam.lm_head: SimpleNamespace(weight=embed, bias=None)},
        config=hf_model.config,
    )
    state = {k: v for k, v in fam.convert(stand_in, cfg).items() if not k.startswith("unembed")}
    score = hf_model.score
    state["head.score.weight"] = score.weight
    if getattr(score, "bias", None) is not None:
        state["head.score.bias"] = score.bias
    return state


_GRAPH_WORDS = {
    "sequential": "sequential",
    "parallel": "parallel (no head -> own MLP)",
    "encoder": "post-LN encoder",
    "post_norm_out": "sequential, output norm at a frozen scale",
}


def families_table() -> str:
    """The families as a Markdown table (docs/models.md carries it; a test keeps it current)."""
    rows = [
        "| Family | Architectures | Fused forward | Edge graph | Exact / approximated |",
        "| --- | --- | --- | --- | --- |",
    ]
    for fam in FAMILIES:
        graph = _GRAPH_WORDS.get(fam.graph or "", "none")
        fused = "yes" if fam.fast_paths else "TransformerLens's forward"
        rows.append(
            f"| {fam.name} | {', '.join(f'`{a}`' for a in fam.architectures)} | {fused} "
            f"| {graph} | {fam.exact} |"
        )
    return "\n".join(rows)
