"""Hooked sequence classifiers: a TransformerLens body plus the checkpoint's own task head.

``HookedEncoderClassifier`` (BERT, RoBERTa) subclasses TL's ``HookedEncoder`` and
``HookedDecoderClassifier`` (GPT-2) subclasses ``HookedTransformer``, so every TL hook name
(``blocks.{l}.attn.hook_z``, ``hook_pattern``, ``hook_mlp_out``, ...) and every TL tool
(``run_with_cache``, ``run_with_hooks``, ``hooks()``) works unchanged. Both share one interface,
split in three steps so interventions can re-run only the layers after a change::

    logits = model.classify(model.run_blocks(model.embed_input(ids, mask, types), mask), mask)
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from jaxtyping import Float, Int
from torch import nn
from transformer_lens import (
    ActivationCache,
    HookedEncoder,
    HookedTransformer,
    HookedTransformerConfig,
)
from transformer_lens.utilities import Slice

from mi_core.errors import ConfigError, DataError, ModelInputError
from mi_core.models.dropout import DropoutRates
from mi_core.models.fast_paths import enable_fast_paths, enable_lm_fast_paths
from mi_core.models.heads import LinearClassificationHead, PooledClassificationHead
from mi_core.models.hooks import act_name
from mi_core.models.text import encode_pairs, encode_prompts, pad_token_id
from mi_core.models.value_biases import folded_value_biases, set_folded_value_biases
from mi_core.tasks import NEXT_TOKEN

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

Ids = Int[torch.Tensor, "batch pos"]
#: Keys of an mi_core batch that ``forward`` accepts and ignores (``model(**batch)``).
IGNORED_BATCH_KEYS = frozenset({"labels", "index"})
Resid = Float[torch.Tensor, "batch pos d_model"]

_AS_IDS = (
    "{what}: a classifier's to_tokens gives a dict of input_ids, attention_mask and "
    "token_type_ids, not a tensor. Where TransformerLens wants a token tensor (its patching "
    "functions, run_with_hooks), pass tokens['input_ids']: the classifier rebuilds the mask and "
    "the token types from the ids, as the tokenizer made them. For head detection on sentence "
    "pairs use mi_core.analysis.score_attention_patterns (attention mass on the previous, next, "
    "separator, first and own token, and on overlapping words, per head); TransformerLens's "
    "detect_head assumes one text of a causal language model"
)


class PairTokens(dict):
    """What a classifier's ``to_tokens`` returns: ``input_ids``, ``attention_mask`` and
    ``token_type_ids``, for ``model(**tokens)``.

    A dict (like Hugging Face's ``BatchEncoding``) with ``.to(device)``; asked for a tensor's
    attribute (``.shape``, as TransformerLens's helpers do), it says what to pass instead.
    """

    def to(self, device: torch.device | str) -> PairTokens:
        """Every tensor moved to ``device``."""
        return PairTokens({key: value.to(device) for key, value in self.items()})

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(_AS_IDS.format(what=f"PairTokens has no attribute {name!r}"))


@runtime_checkable
class StagedClassifier(Protocol):
    """A hooked classifier run in stages: embed, any span of blocks, the task head.

    Both :class:`HookedEncoderClassifier` and :class:`HookedDecoderClassifier` are; code that
    needs the stages (means, fast ablation tables) takes this type instead of ``Any`` and
    ``hasattr`` checks.
    """

    cfg: HookedTransformerConfig
    task: str | None
    is_encoder: bool

    def embed_input(self, input_ids: Ids, attention_mask=None, token_type_ids=None) -> Resid:
        """The residual stream entering block 0."""
        ...

    def run_blocks(self, resid: Resid, attention_mask=None, start: int = 0, stop=None) -> Resid:
        """Blocks ``start`` to ``stop`` (exclusive) on ``resid``."""
        ...

    def classify(self, resid: Resid, attention_mask=None) -> Float[torch.Tensor, "batch label"]:
        """The task head on the final residual stream."""
        ...


class HookedClassifier:
    """What every hooked classifier offers on top of its TL base class.

    Subclasses define ``embed_input``, ``run_blocks`` and ``classify`` for their body.
    """

    cfg: HookedTransformerConfig
    tokenizer: Any
    """The checkpoint's tokenizer (TransformerLens's base classes hold it; None: ids only)."""
    head: nn.Module
    num_labels: int
    task: str | None
    label_names: list[str]
    model_name: str
    is_encoder: bool
    head_from_checkpoint: bool = True
    """False when the task head was made at load time (random, from ``seed``): the checkpoint
    was a pretrained body, not a classifier (:func:`~mi_core.models.load_model` sets it)."""
    dropout_rates: DropoutRates
    """The checkpoint's dropout (TL models run without it; see :mod:`mi_core.models.dropout`)."""

    def _init_classifier(
        self, head: nn.Module, num_labels: int, task: str | None, label_names: list[str] | None
    ) -> None:
        """Attach the head and the task's metadata, register hooks, and enable fast paths."""
        self.head = head.to(self.cfg.dtype)  # the body's dtype (half precision included)
        self.num_labels = num_labels
        self.task = task
        self.label_names = list(label_names or [f"LABEL_{i}" for i in range(num_labels)])
        self.model_name = self.cfg.model_name
        self.dropout_rates = DropoutRates()
        self.to(self.cfg.device, print_details=False)  # nothing on stdout
        self.setup()
        enable_fast_paths(self)

    # ------------------------------------------------------------ strings, the TL way
    def to_tokens(
        self,
        premise: str | list[str],
        hypothesis: str | list[str] | None = None,
        max_length: int = 128,
        **tl_keywords: object,
    ) -> PairTokens:
        """Token ids, attention mask and token type ids of sentence pairs (or single texts),
        right-padded, exactly as mi_core's data pipeline makes them: ``model(**tokens)``.
        ``tokens["input_ids"]`` alone is enough too: :meth:`forward` rebuilds the rest from it.

        Called with TransformerLens's own keywords (``prepend_bos``, ``padding_side``,
        ``move_to_device``, ``truncate``), as TL's helpers call it, it is TL's ``to_tokens``.
        """
        if tl_keywords:
            if self.is_encoder:
                _refuse_decoder_keywords("to_tokens", tl_keywords, ("move_to_device", "truncate"))
            return super().to_tokens(premise, **tl_keywords)  # type: ignore[misc]
        if self.tokenizer is None:
            raise ConfigError("this classifier has no tokenizer; pass token ids instead")
        premises = [premise] if isinstance(premise, str) else list(premise)
        if hypothesis is None:
            enc = self.tokenizer(premises, truncation=True, max_length=max_length)
            ids = [list(x) for x in enc["input_ids"]]
            types = [list(x) for x in enc.get("token_type_ids", [[0] * len(i) for i in ids])]
        else:
            hypotheses = [hypothesis] if isinstance(hypothesis, str) else list(hypothesis)
            if len(hypotheses) != len(premises):
                raise DataError(
                    f"{len(premises)} premises but {len(hypotheses)} hypotheses; give one each"
                )
            ids, types, _ = encode_pairs(self.tokenizer, premises, hypotheses, max_length)
        return _right_padded(ids, types, pad_token_id(self.tokenizer), self.cfg.device)

    def to_str_tokens(
        self,
        premise: str | list[str] | Ids | Mapping[str, torch.Tensor] | list[int],
        hypothesis: str | list[str] | None = None,
        *tl_args: object,
        **tl_keywords: object,
    ) -> list[str] | list[list[str]]:
        """The tokens of a pair (a list of strings), or of each pair of lists, pads left out.

        Token ids are turned into tokens as TransformerLens does, pads included: a 1-D tensor,
        array or list of ints (or a ``[1, pos]`` tensor) gives one list, a ``[batch, pos]``
        tensor one list per row, a list of id tensors one list each (TL's ``prepend_bos`` and
        ``padding_side`` do not apply to ids and are ignored). ``to_tokens``'s output (ids with
        their attention mask) gives each row's tokens without its pads (one list for one pair).
        """
        if isinstance(premise, str) or (
            isinstance(premise, list) and premise and isinstance(premise[0], str)
        ):
            if tl_args or tl_keywords:  # TL's keywords (prepend_bos, padding_side): TL's way
                if self.is_encoder:  # TL's HookedEncoder has no to_str_tokens
                    extra = {"positional arguments after the hypothesis": 1} if tl_args else {}
                    _refuse_decoder_keywords("to_str_tokens", {**tl_keywords, **extra}, ())
                return super().to_str_tokens(premise, *tl_args, **tl_keywords)  # type: ignore[misc]
            tokens = self.to_tokens(premise, hypothesis)
            rows = self._str_rows(tokens["input_ids"], tokens["attention_mask"])
            return rows[0] if isinstance(premise, str) else rows
        if isinstance(premise, Mapping):
            rows = self._str_rows(premise["input_ids"], premise.get("attention_mask"))
            return rows[0] if len(rows) == 1 else rows
        if isinstance(premise, list) and premise and not isinstance(premise[0], int):
            return [self.to_str_tokens(item) for item in premise]  # TL: a list of inputs
        ids = torch.as_tensor(premise)
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() == 0:
            ids = ids[None]
        if ids.dim() == 2:
            return self._str_rows(ids, None)
        if ids.dim() != 1:
            raise DataError(f"token ids of shape {tuple(ids.shape)}: give [pos] or [batch, pos]")
        return self._str_rows(ids[None], None)[0]

    def _str_rows(
        self, ids: Int[torch.Tensor, "batch pos"], mask: Int[torch.Tensor, "batch pos"] | None
    ) -> list[list[str]]:
        if self.tokenizer is None:
            raise ConfigError("this classifier has no tokenizer to turn token ids into tokens")
        ids = torch.as_tensor(ids).cpu()
        if mask is not None:
            keep = torch.as_tensor(mask).cpu().bool()
            return [
                self.tokenizer.convert_ids_to_tokens(r[k].tolist())
                for r, k in zip(ids, keep, strict=True)
            ]
        return [self.tokenizer.convert_ids_to_tokens(r.tolist()) for r in ids]

    def to_string(self, tokens: Ids | list[int] | list[Ids]) -> str | list[str]:
        """Token ids decoded to text, as TransformerLens's ``to_string``: one string for 1-D
        ids, one per row for ``[batch, pos]`` or a list of id tensors."""
        if self.tokenizer is None:
            raise ConfigError("this classifier has no tokenizer to decode token ids")
        if isinstance(tokens, list) and tokens and not isinstance(tokens[0], int):
            return [self.to_string(t) for t in tokens]
        ids = torch.as_tensor(tokens).cpu()
        if ids.dim() == 2:
            return [self.to_string(row) for row in ids]
        return self.tokenizer.decode(ids.reshape(-1).tolist(), clean_up_tokenization_spaces=False)

    def to_single_token(self, string: str) -> int:
        """The id of ``string`` when the tokenizer makes it one token (no special tokens)."""
        if self.tokenizer is None:
            raise ConfigError("this classifier has no tokenizer")
        ids = self.tokenizer(string, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise DataError(f"{string!r} is {len(ids)} tokens, not a single token")
        return int(ids[0])

    def get_caching_hooks(
        self,
        names_filter=None,
        incl_bwd: bool = False,
        device=None,
        remove_batch_dim: bool = False,
        cache: dict | None = None,
        pos_slice=None,
    ) -> tuple[dict, list, list]:
        """TransformerLens's caching hooks, except that the task head's activations (``head.*``:
        ``[batch, d_model]``, no position axis) are kept whole: TL would cut ``pos_slice`` from
        their batch axis, and with ``remove_batch_dim`` fail on them."""
        cache, fwd, bwd = super().get_caching_hooks(  # type: ignore[misc]
            names_filter, incl_bwd, device, remove_batch_dim, cache, pos_slice
        )

        def save(tensor: torch.Tensor, hook: Any, suffix: str = "") -> None:
            value = tensor.detach().to(device)
            cache[hook.name + suffix] = value[0] if remove_batch_dim else value

        fwd = [(n, save if n.startswith("head.") else h) for n, h in fwd]
        bwd = [(n, partial(save, suffix="_grad") if n.startswith("head.") else h) for n, h in bwd]
        return cache, fwd, bwd

    def forward(
        self,
        input_ids: Ids | str | list[str],
        attention_mask: Int[torch.Tensor, "batch pos"] | str | list[str] | None = None,
        token_type_ids: Ids | None = None,
        return_type: str | None = "logits",
        **batch_keys: object,
    ) -> (
        Float[torch.Tensor, "batch label"] | torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None
    ):
        """Class logits for a batch of token ids (right-padded), or for sentence pairs given as
        strings: ``model(premise, hypothesis)`` (lists of strings for a batch) tokenises them
        with :meth:`to_tokens`, so ``run_with_cache(premise, hypothesis)`` works too.

        Token ids given alone (as TransformerLens's helpers give them: ``run_with_hooks(ids)``)
        get the attention mask and token type ids the tokenizer made with them: see
        :meth:`infer_inputs`.

        ``return_type``: ``"logits"`` (the default), ``"loss"`` (the mean cross-entropy of the
        logits against ``labels``, class indices of this model's head: what
        ``run_with_cache(..., incl_bwd=True)`` runs backward from), ``"both"`` (logits, loss)
        or None (run the model for its hooks and return nothing). The other keys of an mi_core
        batch (``labels``, ``index``) may be passed along (``model(**batch)``) and are ignored
        otherwise; any other keyword is refused, so a misspelt ``attention_mask`` cannot
        silently drop the mask.
        """
        if isinstance(input_ids, Mapping):  # model(tokens) with a to_tokens dict
            given = {"attention_mask": attention_mask, "token_type_ids": token_type_ids}
            if any(v is not None for v in given.values()) or "input_ids" not in input_ids:
                raise TypeError(_AS_IDS.format(what="a dict of tokens goes in as model(**tokens)"))
            tokens = input_ids
            input_ids = tokens["input_ids"]
            attention_mask = tokens.get("attention_mask")
            token_type_ids = tokens.get("token_type_ids")
        if isinstance(input_ids, str) or (
            isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], str)
        ):
            hypothesis = attention_mask
            if hypothesis is not None and not isinstance(hypothesis, (str, list)):
                raise TypeError("with a premise string, the second argument is the hypothesis")
            tokens = self.to_tokens(input_ids, hypothesis)  # type: ignore[arg-type]
            input_ids = tokens["input_ids"]
            attention_mask, token_type_ids = tokens["attention_mask"], tokens["token_type_ids"]
        unknown = sorted(set(batch_keys) - IGNORED_BATCH_KEYS)
        if unknown:
            known = ["attention_mask", "token_type_ids", "return_type", *IGNORED_BATCH_KEYS]
            hints = [difflib.get_close_matches(k, known, n=1) for k in unknown]
            said = ", ".join(
                f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "")
                for k, h in zip(unknown, hints, strict=True)
            )
            hint = (
                "; for the residual stream entering block L (TransformerLens's "
                "stop_at_layer=L) run model.run_blocks(model.embed_input(ids, mask, types), "
                "mask, stop=L), or run_with_cache and read blocks.L.hook_resid_pre"
                if "stop_at_layer" in unknown
                else ""
            )
            raise TypeError(
                f"{type(self).__name__}.forward() got unexpected keywords: {said}{hint}"
            )
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(
                "return_type must be 'logits', 'loss', 'both' or None for a classifier, not "
                f"{return_type!r}"
            )
        labels = batch_keys.get("labels")
        if return_type in ("loss", "both") and labels is None:
            raise ValueError(f"return_type={return_type!r} needs the batch's labels (labels=...)")
        input_ids, attention_mask, token_type_ids = self._checked_inputs(
            input_ids, attention_mask, token_type_ids
        )
        attention_mask, token_type_ids = self.infer_inputs(
            input_ids, attention_mask, token_type_ids
        )
        resid = self.embed_input(input_ids, attention_mask, token_type_ids)
        resid = self.run_blocks(resid, attention_mask)
        logits = self.classify(resid, attention_mask)
        if return_type in ("loss", "both"):
            target = torch.as_tensor(labels, device=logits.device).long().reshape(-1)
            n_labels = logits.shape[-1]
            if target.shape[0] != logits.shape[0]:
                raise ModelInputError(
                    f"labels hold {target.shape[0]} values for a batch of {logits.shape[0]}"
                )
            if bool(((target < 0) | (target >= n_labels)).any()):
                raise ModelInputError(
                    f"labels must be class indices 0-{n_labels - 1} of this model's head, got "
                    f"{sorted(set(target.tolist()))}"
                )
            loss = nn.functional.cross_entropy(logits.float(), target)
            return loss if return_type == "loss" else (logits, loss)
        return logits if return_type == "logits" else None

    def _checked_inputs(
        self, input_ids: Any, attention_mask: Any, token_type_ids: Any
    ) -> tuple[Ids, Any, Any]:
        """Ids as a ``[batch, pos]`` tensor (one text's ids, 1-D or a list of ints, get a batch
        dimension, as TransformerLens gives them), with a mask and token types of its shape and
        no more tokens than the model's context."""
        if not isinstance(input_ids, torch.Tensor):
            try:
                input_ids = torch.as_tensor(input_ids, dtype=torch.long)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise ModelInputError(f"input_ids must be token ids, not {exc}") from None
        attention_mask, token_type_ids = (
            None if v is None else torch.as_tensor(v, device=input_ids.device)
            for v in (attention_mask, token_type_ids)
        )
        if input_ids.ndim == 1:  # one text, as TransformerLens's tokens[None]
            input_ids = input_ids[None]
            attention_mask, token_type_ids = (
                v[None] if v is not None and v.ndim == 1 else v
                for v in (attention_mask, token_type_ids)
            )
        if input_ids.ndim != 2:
            raise ModelInputError(
                "input_ids must be [batch, pos] (or one text's [pos]), got "
                f"{tuple(input_ids.shape)}"
            )
        for name, value in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if value is not None and tuple(value.shape) != tuple(input_ids.shape):
                raise ModelInputError(
                    f"{name} has shape {tuple(value.shape)} but input_ids "
                    f"{tuple(input_ids.shape)}; they must match"
                )
        check_context(self, input_ids.shape[1])
        return input_ids, attention_mask, token_type_ids

    def infer_inputs(
        self,
        input_ids: Ids,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
        token_type_ids: Ids | None = None,
    ) -> tuple[Int[torch.Tensor, "batch pos"] | None, Ids | None]:
        """The attention mask and token type ids that go with ``input_ids``, where not given.

        Right-padded ids from this model's tokenizer determine both: an encoder's mask is 0 at
        its pad token (which no text produces), a decoder's at the trailing run of pad tokens
        (GPT-2 pads with eos; a text that itself ends in eos loses that token); a BERT pair's
        token types are 0 up to the first [SEP] and 1 after it. Without a tokenizer nothing is
        inferred (no mask, token types 0).
        """
        if self.tokenizer is None or (attention_mask is not None and token_type_ids is not None):
            return attention_mask, token_type_ids
        pad = pad_token_id(self.tokenizer)
        if attention_mask is None:
            real = input_ids != pad
            if not self.is_encoder:  # only the trailing pads: eos may sit inside a text
                seen = real.flip(-1).long().cummax(dim=-1).values.flip(-1)
                real = seen.bool()
            attention_mask = real.long()
        sep = getattr(self.tokenizer, "sep_token_id", None)
        typed = getattr(self, "uses_token_types", False) and "token_type_ids" in getattr(
            self.tokenizer, "model_input_names", ()
        )
        if token_type_ids is None and typed and sep is not None:
            after_sep = (input_ids == sep).long().cumsum(dim=-1) - (input_ids == sep).long()
            token_type_ids = ((after_sep > 0) & attention_mask.bool()).long()
        return attention_mask, token_type_ids


def _refuse_decoder_keywords(method: str, given: Mapping[str, object], takes: tuple) -> None:
    """TransformerLens's decoder keywords on an encoder: one clear error (TL's HookedEncoder
    takes none of ``prepend_bos`` / ``padding_side``: [CLS] always opens a BERT input and pads
    go on the right)."""
    other = sorted(k for k in given if k not in takes)
    if other:
        raise TypeError(
            f"an encoder classifier's {method} does not take {', '.join(other)} (decoder "
            "keywords of TransformerLens: a BERT-family input always starts with its [CLS] / <s> "
            "token and is padded on the right); call it with the texts alone"
            + (f", or with {' / '.join(takes)}" if takes else "")
        )


def check_context(model: HookedTransformer | HookedEncoderClassifier, n_tokens: int) -> None:
    """Refuse ``n_tokens`` positions beyond ``model``'s context (:class:`ModelInputError`): its
    positional embedding has no row for them."""
    n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", None)
    if n_ctx is not None and n_tokens > n_ctx:
        raise ModelInputError(
            f"{n_tokens} tokens, more than the model's context of {n_ctx} (n_ctx); truncate them: "
            f"a max_length (--max-length) of at most {n_ctx}"
        )


def batch_inputs(
    model: HookedTransformer | HookedEncoderClassifier,
    batch: Mapping[str, Any],
    device: torch.device | str | None = None,
) -> tuple[Ids, Int[torch.Tensor, "batch pos"], Ids | None]:
    """A batch's ``input_ids``, attention mask and token types on ``device``, with what the
    batch lacks filled in as ``model(input_ids)`` fills it (:meth:`HookedClassifier.infer_inputs`:
    pads masked, a BERT pair's second segment typed 1); a model that infers nothing gets an
    all-ones mask. Code that runs a model's stages itself (means, ablation tables, attention
    scores) reads its batches through this, so ids alone give the numbers ``model(ids)`` does."""
    ids = torch.as_tensor(batch["input_ids"])
    check_context(model, ids.shape[-1])  # stages run by hand skip forward's own check
    mask, types = batch.get("attention_mask"), batch.get("token_type_ids")
    infer = getattr(model, "infer_inputs", None)
    if infer is not None and (mask is None or types is None):
        mask, types = infer(ids, None if mask is None else torch.as_tensor(mask), types)
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
        types = None if types is None else torch.as_tensor(types).to(device)
    return ids, mask, types


_POST_LN = (
    "the residual stream of a post-LayerNorm encoder (BERT, RoBERTa, MiniLM) is not a sum of "
    "component outputs: LayerNorm rescales it after every attention and MLP sublayer, so "
    "{name} would attribute to components what the LayerNorms did. Read hook_resid_pre / "
    "hook_resid_mid / hook_resid_post directly; for direct logit attribution use "
    "mi_core.circuits.direct_logit_attribution, which carries each component's output through "
    "the LayerNorms with their scales frozen (as mi_core.circuits.Graph does) and says how far "
    "the approximation is off"
)


class PostLNActivationCache(ActivationCache):
    """A TransformerLens cache of a post-LayerNorm encoder.

    Everything works as in TL, except the methods that treat the residual stream as a sum of
    component outputs (``decompose_resid``, ``apply_ln_to_stack``,
    ``get_full_resid_decomposition``, ``logit_attrs``, ``accumulated_resid(apply_ln=True)``):
    they raise one clear error instead of returning numbers that do not mean what they mean for
    a pre-LN model. ``accumulated_resid()`` stacks the residual streams the model reads, with
    TL's labels: each block's ``resid_pre``; for ``{l}_mid`` the stream the MLP reads
    (``ln1.hook_normalized``), and for ``final_post`` the one the head reads
    (``hook_normalized_resid_post``). TL's ``hook_resid_mid`` / ``hook_resid_post`` of a BERT
    block are the sums *before* its LayerNorm, which no later component sees.
    """

    def _refuse(self, name: str):
        raise ConfigError(_POST_LN.format(name=name))

    def decompose_resid(self, *args, **kwargs):  # noqa: D102
        self._refuse("decompose_resid")

    def accumulated_resid(  # noqa: D102
        self, layer=None, incl_mid: bool = False, apply_ln: bool = False, *args, **kwargs
    ):
        if apply_ln:  # the streams are already normalised; "applying LN" to them is not
            self._refuse("accumulated_resid(apply_ln=True)")
        names = ("pos_slice", "mlp_input", "return_labels")  # TL's order after apply_ln
        if len(args) > len(names):
            raise TypeError(f"accumulated_resid() takes at most {3 + len(names)} arguments")
        given = dict(zip(names, args, strict=False))
        for name in given:
            if name in kwargs:
                raise TypeError(f"accumulated_resid() got {name} twice")
        kwargs = {**kwargs, **given}
        pos_slice = kwargs.pop("pos_slice", None)
        mlp_input = bool(kwargs.pop("mlp_input", False))
        return_labels = bool(kwargs.pop("return_labels", False))
        if kwargs:
            raise TypeError(f"accumulated_resid() got unexpected keywords {sorted(kwargs)}")
        n_layers = self.model.cfg.n_layers
        layer = n_layers if layer is None or layer == -1 else layer
        pos_slice = pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)
        labels, parts = [], []
        for l in range(layer + 1):
            if l == n_layers:  # what the classification head reads
                parts.append(self[act_name("normalized_resid_post", n_layers - 1)])
                labels.append("final_post")
                continue
            parts.append(self[act_name("resid_pre", l)])
            labels.append(f"{l}_pre")
            if (incl_mid and l < layer) or (mlp_input and l == layer):
                parts.append(self[act_name("normalized", l, "ln1")])  # what the MLP reads
                labels.append(f"{l}_mid")
        stack = torch.stack([pos_slice.apply(p, dim=-2) for p in parts], dim=0)
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(self, *args, **kwargs):  # noqa: D102
        self._refuse("apply_ln_to_stack")

    def get_full_resid_decomposition(self, *args, **kwargs):  # noqa: D102
        self._refuse("get_full_resid_decomposition")

    def logit_attrs(self, *args, **kwargs):  # noqa: D102
        self._refuse("logit_attrs")


class HookedEncoderClassifier(HookedClassifier, HookedEncoder):
    """A BERT/RoBERTa sequence classifier: hooked encoder + dense-tanh-out head on token 0."""

    is_encoder = True

    def __init__(
        self,
        cfg: HookedTransformerConfig,
        num_labels: int,
        tokenizer=None,
        task: str | None = None,
        label_names: list[str] | None = None,
        uses_token_types: bool = True,
    ):
        HookedEncoder.__init__(self, cfg, tokenizer=tokenizer, move_to_device=False)
        #: RoBERTa has one token type: its token type ids are ignored (taken as 0).
        self.uses_token_types = uses_token_types
        # The masked-LM, NSP and pooler modules are not part of a sequence classifier.
        del self.mlm_head, self.unembed, self.nsp_head, self.pooler
        head = PooledClassificationHead(cfg.d_model, num_labels)
        self._init_classifier(head, num_labels, task, label_names)

    # TransformerLens's switches, as HookedTransformer has them (HookedEncoder lacks them; its
    # BertBlock honours the flags).
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Compute ``attn.hook_result``: each head's output in the residual stream."""
        self.cfg.use_attn_result = use_attn_result

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Give each head its own query / key / value input (``hook_q_input`` and the like)."""
        self.cfg.use_split_qkv_input = use_split_qkv_input

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Hook the MLP's input (``hook_mlp_in``)."""
        self.cfg.use_hook_mlp_in = use_hook_mlp_in

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Refused: TransformerLens's BERT blocks have no ``hook_attn_in``."""
        if use_attn_in:
            raise ConfigError(
                "encoder blocks (TransformerLens's BertBlock) have no hook_attn_in; use "
                "set_use_split_qkv_input(True) for per-head query / key / value inputs"
            )

    def run_with_cache(self, *args, return_cache_object: bool = True, **kwargs):
        """TL's ``run_with_cache``; the cache object is a :class:`PostLNActivationCache`."""
        out, cache = super().run_with_cache(
            *args, return_cache_object=return_cache_object, **kwargs
        )
        if return_cache_object:
            cache.__class__ = PostLNActivationCache
        return out, cache

    def embed_input(self, input_ids: Ids, attention_mask=None, token_type_ids=None) -> Resid:
        """Token + position + token-type embeddings after the embedding LayerNorm."""
        if not self.uses_token_types:
            _warn_ignored_token_types(self, token_type_ids)
            token_type_ids = None
        return self.hook_full_embed(self.embed(input_ids, token_type_ids))

    def run_blocks(self, resid: Resid, attention_mask=None, start: int = 0, stop=None) -> Resid:
        """Run blocks ``[start:stop]``; padding keys are masked out."""
        additive = None
        if attention_mask is not None:
            # the mask may stay on the host (a notebook's batch): ids index the weights from
            # there, and checks of the mask read it there without waiting for a GPU
            attention_mask = attention_mask.to(resid.device)
            additive = torch.zeros(attention_mask.shape, dtype=resid.dtype, device=resid.device)
            additive = additive.masked_fill(attention_mask == 0, float("-inf"))[:, None, None, :]
        for block in self.blocks[start:stop]:
            resid = block(resid, additive)
        return resid

    def classify(self, resid: Resid, attention_mask=None) -> Float[torch.Tensor, "batch label"]:
        """The head on the first ([CLS] / <s>) token."""
        return self.head(resid[:, 0])


def _warn_ignored_token_types(model, token_type_ids) -> None:
    """Warn once per model when nonzero token type ids reach a model without token-type
    embeddings (GPT-2, RoBERTa): they are ignored, as the model was trained without them."""
    if token_type_ids is None or getattr(model, "_warned_token_types", False):
        return
    ids = torch.as_tensor(token_type_ids)
    if ids.device.type != "cpu":  # reading a device tensor waits for it: once per model
        if getattr(model, "_checked_device_token_types", False):
            return
        model._checked_device_token_types = True
    if bool((ids != 0).any()):
        model._warned_token_types = True
        warnings.warn(
            f"{type(model).__name__} has no token-type embeddings: the nonzero token_type_ids "
            "given are ignored (the model was trained without them)",
            UserWarning,
            stacklevel=3,
        )


class HookedDecoderClassifier(HookedClassifier, HookedTransformer):
    """A decoder sequence classifier (GPT-2, Llama, Qwen2, Gemma, ...
    ``ForSequenceClassification``): hooked decoder + linear score of the last non-pad token,
    as Hugging Face pools."""

    is_encoder = False

    def __init__(
        self,
        cfg: HookedTransformerConfig,
        num_labels: int,
        tokenizer=None,
        task: str | None = None,
        label_names: list[str] | None = None,
    ):
        _init_decoder(self, cfg)
        # Set directly: TL's set_tokenizer would re-load it with add_bos_token=True.
        self.tokenizer = tokenizer
        if tokenizer is not None:  # what TL's own to_tokens and its helpers need to know
            cfg.tokenizer_prepends_bos = len(tokenizer.encode("")) > 0
        del self.unembed
        self._init_classifier(
            LinearClassificationHead(cfg.d_model, num_labels), num_labels, task, label_names
        )

    def embed_input(self, input_ids: Ids, attention_mask=None, token_type_ids=None) -> Resid:
        """Token embeddings, plus learnt position embeddings where the family has them
        (positions from 0; right padding; rotary and ALiBi families place positions inside
        attention); token types are ignored, with a warning when they are nonzero.

        Decoder tokenizers make no token type ids, so decoder classifiers are trained without
        them. Hugging Face's GPT-2 adds ``wte(token_type_ids)`` when it is given them (zeros
        too), so compare its logits with these by calling it without ``token_type_ids``.
        """
        if attention_mask is not None:
            _check_right_padded(attention_mask)
        _warn_ignored_token_types(self, token_type_ids)
        embed = self.hook_embed(self.embed(input_ids))
        if self.cfg.positional_embedding_type == "standard":
            return embed + self.hook_pos_embed(self.pos_embed(input_ids))
        return embed

    def run_blocks(self, resid: Resid, attention_mask=None, start: int = 0, stop=None) -> Resid:
        """Run blocks ``[start:stop]``; with right padding the causal mask hides every pad."""
        for block in self.blocks[start:stop]:
            resid = block(resid)
        return resid

    def classify(self, resid: Resid, attention_mask=None) -> Float[torch.Tensor, "batch label"]:
        """Final LayerNorm, then the score of each row's last non-pad token."""
        resid = self.ln_final(resid)
        if attention_mask is None:
            last = torch.full((resid.shape[0],), resid.shape[1] - 1, device=resid.device)
        else:
            last = attention_mask.sum(dim=1) - 1
        return self.head(resid[torch.arange(resid.shape[0], device=resid.device), last])


class AnswerHead(nn.Module):
    """A language model's own unembedding on one token (``W_U``, ``b_U``, and the final
    logit soft-cap where the family has one, as TransformerLens's forward applies it): the
    head of a :class:`HookedAnswerModel`, whose classes are the vocabulary."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_vocab_out, dtype=cfg.dtype))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab_out, dtype=cfg.dtype))
        self.soft_cap = float(cfg.output_logits_soft_cap)

    def forward(
        self, x: Float[torch.Tensor, "batch d_model"]
    ) -> Float[torch.Tensor, "batch vocab"]:
        logits = x @ self.W_U + self.b_U
        if self.soft_cap > 0:
            logits = self.soft_cap * torch.tanh(logits / self.soft_cap)
        return logits


class HookedAnswerModel(HookedDecoderClassifier):
    """A causal language model on a prompt task, as a classifier over its vocabulary: the
    LM's next-token logits at each prompt's last token (the answer position), so every node
    method made for classifiers (pruning against the full model's distribution, means, the
    ablation table, attention classes) runs on it unchanged.

    Made from a loaded ``HookedTransformer`` by :meth:`from_lm` (sharing its weights) or by
    ``load_model(..., task="next_token")``. Its ``task`` is
    :data:`~mi_core.tasks.NEXT_TOKEN`; its ``forward`` on right-padded ids equals the LM's
    logits at each row's last real token; ``to_tokens`` on text puts a BOS token first where
    the tokenizer has one, as TransformerLens does (and as :func:`~mi_core.data.tokenize_prompts`
    tokenises prompt tasks).
    """

    def __init__(self, cfg: HookedTransformerConfig, tokenizer=None):
        _init_decoder(self, cfg)
        self.tokenizer = tokenizer
        if tokenizer is not None:
            cfg.tokenizer_prepends_bos = len(tokenizer.encode("")) > 0
        del self.unembed
        self._init_classifier(AnswerHead(cfg), cfg.d_vocab_out, NEXT_TOKEN, [])
        enable_lm_fast_paths(self)

    @classmethod
    def from_lm(cls, lm: HookedTransformer) -> HookedAnswerModel:
        """``lm`` (TransformerLens's causal LM) as an answer model sharing its parameters:
        blocks, embeddings and final norm as they are, the unembedding as the head."""
        if getattr(lm.cfg, "n_devices", 1) > 1:
            raise ConfigError(
                "a language model split over several devices cannot be a prompt-task model; "
                "load it on one device (in bfloat16 to halve its memory)"
            )
        model = cls(lm.cfg, lm.tokenizer)
        state = {k: v for k, v in lm.state_dict().items() if not k.startswith("unembed.")}
        state["head.W_U"], state["head.b_U"] = lm.unembed.W_U, lm.unembed.b_U
        model.load_state_dict(state, strict=True, assign=True)
        if lm.cfg.device is not None:
            model.to(lm.cfg.device, print_details=False)
        set_folded_value_biases(model, folded_value_biases(lm))
        if hasattr(lm, "model_name"):
            model.model_name = str(lm.model_name)
        model.head_from_checkpoint = True
        model.dropout_rates = getattr(lm, "dropout_rates", model.dropout_rates)
        return model.eval()

    def every_position_logits(
        self, input_ids: Ids, attention_mask: Int[torch.Tensor, "batch pos"] | None = None
    ) -> Float[torch.Tensor, "batch pos vocab"]:
        """The LM's next-token logits at every position (right-padded ids; what the pruning
        objective on plain text compares), through the same blocks and hooks as
        :meth:`forward`, which reads only each row's last real token."""
        resid = self.embed_input(input_ids, attention_mask)
        resid = self.run_blocks(resid, attention_mask)
        return self.head(self.ln_final(resid))

    @property
    def label_names(self) -> list[str]:
        """The vocabulary's tokens, by id (the classes of a next-token predictor)."""
        if self.tokenizer is None:
            return [f"LABEL_{i}" for i in range(self.num_labels)]
        tokens = self.tokenizer.convert_ids_to_tokens(list(range(self.num_labels)))
        return [t if t is not None else f"<{i}>" for i, t in enumerate(tokens)]

    @label_names.setter
    def label_names(self, value: list[str]) -> None:  # set (empty) by _init_classifier
        pass

    def to_tokens(
        self,
        premise: str | list[str],
        hypothesis: str | list[str] | None = None,
        max_length: int = 128,
        **tl_keywords: object,
    ) -> PairTokens:
        """Token ids and attention mask of prompts (right-padded), a BOS token first as
        :func:`~mi_core.data.tokenize_prompts` makes them; TransformerLens's keywords give TL's
        ``to_tokens``. A prompt task has no second text."""
        if tl_keywords:
            return HookedTransformer.to_tokens(self, premise, **tl_keywords)  # type: ignore[arg-type]
        if hypothesis is not None:
            raise DataError("a language model's prompt is one text; join the pair into it")
        if self.tokenizer is None:
            raise ConfigError("this model has no tokenizer; pass token ids instead")
        prompts = [premise] if isinstance(premise, str) else list(premise)
        ids, _ = encode_prompts(self.tokenizer, prompts, max_length)
        types = [[0] * len(row) for row in ids]
        return _right_padded(ids, types, pad_token_id(self.tokenizer), self.cfg.device)


def _init_decoder(model: HookedTransformer, cfg: HookedTransformerConfig) -> None:
    """TransformerLens's decoder built from ``cfg`` without its tokenizer: given none, TL loads
    ``cfg.tokenizer_name`` from the hub (the main revision, not the one the weights came from;
    offline, a name not in the cache fails); the caller sets the tokenizer it loaded."""
    name, cfg.tokenizer_name = cfg.tokenizer_name, None
    try:
        HookedTransformer.__init__(model, cfg, tokenizer=None, move_to_device=False)
    finally:
        cfg.tokenizer_name = name


def _right_padded(
    ids: list[list[int]], types: list[list[int]], pad: int, device: Any
) -> PairTokens:
    """Unpadded token ids and token types as one right-padded batch with its attention mask."""
    width = max(len(x) for x in ids)
    return PairTokens({
        "input_ids": torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=device),
        "attention_mask": torch.tensor(
            [[1] * len(x) + [0] * (width - len(x)) for x in ids], device=device
        ),
        "token_type_ids": torch.tensor(
            [t + [0] * (width - len(t)) for t in types], device=device
        ),
    })  # fmt: skip


def _check_right_padded(attention_mask: Int[torch.Tensor, "batch pos"]) -> None:
    mask = attention_mask.bool()
    if (mask[:, 1:] & ~mask[:, :-1]).any():
        raise DataError(
            "decoder classifiers expect right padding (attention_mask of 1s then 0s); "
            "tokenise with padding_side='right'"
        )
