"""What a model family is: the one record ``mi_core`` keeps per Hugging Face architecture.

A :class:`Family` says which Hugging Face architectures it covers, how their config maps onto a
TransformerLens ``HookedTransformerConfig``, how their weights convert, whether the fused fast
paths are exact for it, what its circuit graph looks like, where a sequence classifier keeps
its body and head, and how to make the tiny random checkpoint that tests it. The table of
families is :data:`mi_core.models.families.FAMILIES`; every other module asks it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from mi_core.errors import ModelLoadError

#: How a family's blocks wire their sublayers, which decides its circuit graph:
#: ``sequential`` pre-norm blocks (attention, then the MLP reads its output), ``parallel``
#: blocks (attention and MLP both read the block's input), ``post_norm_out`` pre-norm blocks
#: whose sublayer outputs also pass a norm before the residual add (Gemma 2 / 3: edges through
#: that norm at a frozen scale, :func:`~mi_core.interventions.edges.frozen_output_norms`),
#: and ``encoder`` post-LayerNorm encoders (BERT, RoBERTa). ``None``: no graph.
GraphKind = Literal["sequential", "parallel", "post_norm_out", "encoder"]

#: Hugging Face config -> the fields of a ``HookedTransformerConfig`` (without device, dtype
#: and name).
ConfigMapping = Callable[[Any], dict[str, Any]]
#: (Hugging Face causal LM or a stand-in with its body and LM head, TL config) -> TL state dict.
Converter = Callable[[Any, Any], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class Family:
    """One model family: its architectures, conversion, fast paths, graph and test checkpoint.

    ``body`` / ``lm_head``: the attribute names under which the Hugging Face causal LM keeps
    its transformer and its unembedding (a sequence classifier of the family keeps the same
    body under the same name and its head as ``score``). ``exact`` says, in words, what is
    exact and what is approximated on this family (the README and docs table read it).
    """

    name: str
    model_types: tuple[str, ...]
    causal_lm: str | None
    config: ConfigMapping
    convert: Converter | None
    tiny: Callable[[dict[str, Any]], Any]
    classifier: str | None = None
    bodies: tuple[str, ...] = ()
    body: str = "model"
    lm_head: str = "lm_head"
    graph: GraphKind | None = "sequential"
    fast_paths: bool = True
    encoder: bool = False
    moe: bool = False
    exact: str = "logits, node and edge interventions exact"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def architectures(self) -> tuple[str, ...]:
        """Every Hugging Face architecture this family loads."""
        names = (self.causal_lm, self.classifier, *self.bodies)
        return tuple(dict.fromkeys(n for n in names if n))

    @property
    def tl_architecture(self) -> str:
        """The ``original_architecture`` its hooked models carry (TransformerLens branches on
        it, and so does the registry when it finds a loaded model's family)."""
        return self.extra.get("tl_architecture", self.causal_lm or "")


# ----------------------------------------------------------------- helpers for the mappings
def rope_parameters(hf: Any) -> dict[str, Any]:
    """The config's rotary settings (``rope_parameters`` in transformers 5, else the older
    flat fields)."""
    params = getattr(hf, "rope_parameters", None) or {}
    if "full_attention" in params:  # per-layer-type parameters (Gemma 3)
        return dict(params["full_attention"] or {})
    out = dict(params)
    out.setdefault("rope_theta", getattr(hf, "rope_theta", 10000.0))
    return out


def rope_theta(hf: Any) -> float:
    """The rotary base."""
    return float(rope_parameters(hf).get("rope_theta", 10000.0))


def refuse_rope_scaling(hf: Any, family: str) -> None:
    """Refuse a rotary scaling TransformerLens would not reproduce (the logits would differ)."""
    params = getattr(hf, "rope_parameters", None) or {}
    kinds = (
        [v.get("rope_type", "default") for v in params.values() if isinstance(v, dict)]
        if "full_attention" in params
        else [params.get("rope_type", "default")]
    )
    bad = [k for k in kinds if k not in ("default", None)]
    if bad:
        raise ModelLoadError(
            f"{family} rope scaling {bad[0]!r} is not supported; expected the default rotary "
            "embedding"
        )


def head_dim(hf: Any) -> int:
    """Width of one attention head (``head_dim`` where the config sets it)."""
    d = getattr(hf, "head_dim", None)
    return int(d) if d else hf.hidden_size // hf.num_attention_heads


def kv_heads(hf: Any) -> int | None:
    """Key / value heads for grouped-query attention, or None when every head has its own."""
    n = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    return None if n == hf.num_attention_heads else int(n)


def act_fn(name: str) -> str:
    """A Hugging Face activation name as TransformerLens spells it."""
    from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

    names = {"gelu_pytorch_tanh": "gelu_pytorch_tanh", "swish": "silu"}
    out = names.get(name, name)
    if out not in SUPPORTED_ACTIVATIONS:
        raise ModelLoadError(
            f"activation {name!r} is not supported; expected one of {sorted(SUPPORTED_ACTIVATIONS)}"
        )
    return out


def refuse(hf: Any, family: str, **unsupported: bool) -> None:
    """Refuse the config's variants the conversion would get wrong, one line per variant."""
    for what, present in unsupported.items():
        if present:
            raise ModelLoadError(
                f"{family} checkpoints with {what} are not supported (the "
                "conversion to TransformerLens would change the logits)"
            )


def sliding_layers(hf: Any) -> dict[str, Any]:
    """TransformerLens's local-attention fields from ``layer_types`` / ``sliding_window``."""
    window = getattr(hf, "sliding_window", None)
    types = getattr(hf, "layer_types", None)
    if types and window:
        kinds = ["local" if t == "sliding_attention" else "global" for t in types]
        if "local" in kinds:
            return {"use_local_attn": True, "window_size": int(window), "attn_types": kinds}
    return {}


#: What TransformerLens's config mapping adds that mi_core sets itself (or that would load the
#: weights in another dtype than asked for).
_TL_OWN_FIELDS = ("original_architecture", "tokenizer_name", "quantization_method",
                  "trust_remote_code", "dtype")  # fmt: skip


def tl_mapping(hf: Any, architecture: str) -> dict[str, Any]:
    """TransformerLens's own mapping of this Hugging Face config (the branch of its loader
    keyed by the architecture), for families whose branch reads every field from the config.

    The config is written to a fresh temporary folder under the family's causal-LM
    ``architecture`` (the branch a sequence classifier of the family needs too) and read from
    there, as TransformerLens reads a local folder. A folder whose path named a model family
    (``llama``, ``gemma``) would send TransformerLens down a branch keyed by that name, so
    such a path is refused."""
    from transformer_lens.loading_from_pretrained import convert_hf_model_config

    with tempfile.TemporaryDirectory(prefix="mi_core_config_") as folder:
        if any(word in folder.lower() for word in ("llama", "gemma")):
            raise ModelLoadError(
                f"the temporary folder {folder} names a model family, which TransformerLens's "
                "config reader takes for the model's name; set TMPDIR to another folder"
            )
        saved = hf.architectures
        hf.architectures = [architecture]
        try:
            hf.to_json_file(str(Path(folder) / "config.json"))
        finally:
            hf.architectures = saved
        fields = convert_hf_model_config(folder)
    for name in _TL_OWN_FIELDS:
        fields.pop(name, None)
    fields["n_ctx"] = min(int(fields["n_ctx"]), 8192)  # rotary tables for 8k positions
    return fields


#: A tiny config's shared fields: small enough for a test, big enough to have GQA (4 query
#: heads, 2 key / value heads) and three layers.
TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64)
