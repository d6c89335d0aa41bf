"""``load_model``: any supported checkpoint (local directory, hub name, embedded) as a hooked model.

Local directories are read without any hub call. Classifier checkpoints keep their exact
weights (no LayerNorm folding), so activations match Hugging Face's model; causal LMs get TL's
usual processing (folded norms, centred writing weights and unembedding).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers
from transformer_lens import HookedTransformer
from transformer_lens.utilities.activation_functions import softcap_enabled

import mi_core.models.embedded as embedded
import mi_core.models.families as families
import mi_core.models.weight_cache as weight_cache
from mi_core.devices import resolve_device
from mi_core.errors import ConfigError, ModelLoadError
from mi_core.io import read_safetensors, write_safetensors, write_text
from mi_core.models.classifier import (
    HookedAnswerModel,
    HookedClassifier,
    HookedDecoderClassifier,
    HookedEncoderClassifier,
)
from mi_core.models.dropout import DropoutRates
from mi_core.models.fast_paths import disable_fast_paths, enable_lm_fast_paths
from mi_core.models.sources import (
    DAMAGED,
    ModelSource,
    hub_error,
    refuse_integer_weights,
    resolve_source,
    weights_error,
)
from mi_core.models.value_biases import fold_value_biases as fold_value_biases_of
from mi_core.models.value_biases import (
    folded_value_biases,
    set_folded_value_biases,
    value_biases_foldable,
)
from mi_core.models.vocabulary import guard_vocabulary
from mi_core.models.weight_cache import CACHED_WEIGHTS, FOLDED_TENSOR
from mi_core.tasks import NEXT_TOKEN, TASK_LABELS, TASK_NUM_LABELS

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

log = logging.getLogger(__name__)

#: Sequence classifiers loaded with their own head (one per family that has one).
CLASSIFIER_ARCHITECTURES = families.classifier_architectures()
#: Pretrained bodies (encoders, and causal LMs of families with a classifier) that become
#: classifiers with a fresh, seeded head when a task is named.
BODY_ARCHITECTURES = tuple(a for f in families.FAMILIES if f.classifier for a in f.bodies)
#: Parameter names of a sequence classifier's head, which a pretrained body lacks and gets
#: freshly made (BERT / RoBERTa ``classifier``, decoders ``score``).
_HEAD_PREFIXES = ("classifier.", "score.")
#: Causal LMs, loaded as ``HookedTransformer`` when no task is named.
CAUSAL_LM_ARCHITECTURES = families.causal_lm_architectures()
#: Every Hugging Face architecture ``load_model`` reads: classifiers, pretrained bodies
#: given a task head, and causal LMs (:data:`mi_core.models.families.FAMILIES`).
SUPPORTED_ARCHITECTURES = families.supported_architectures()
#: Task -> its label names (:data:`mi_core.tasks.TASK_LABELS`, as lists for HF configs).
TASK_LABEL_NAMES = {task: list(labels) for task, labels in TASK_LABELS.items()}


def load_hf_config(source: ModelSource) -> transformers.PretrainedConfig:
    """The checkpoint's Hugging Face config, with a clear error for unsupported architectures."""
    try:
        config = transformers.AutoConfig.from_pretrained(source.path, **source.kwargs())
    except Exception as exc:  # transformers raises its own types for a field of the wrong type
        if "trust_remote_code" in str(exc):
            raise ModelLoadError(
                f"{source.name} needs code of its own to load (auto_map in its config.json); "
                "mi_core never runs code from a checkpoint; supported architectures: "
                + ", ".join(SUPPORTED_ARCHITECTURES)
            ) from None
        if source.gguf_file:  # a GGUF file holds the config too: name the file
            raise weights_error(source, exc) from None
        if source.local:
            detail = " ".join(str(exc).split())[:300]
            raise ModelLoadError(f"cannot read the config of {source.path}: {detail}") from None
        raise hub_error(source, exc) from exc
    families.family_for_architecture(_first_architecture(config), source.name)
    return config


def _first_architecture(config: transformers.PretrainedConfig) -> str:
    """The config's architecture (its first), else its family's default one; a single name
    written as a string rather than a list is that name."""
    names = config.architectures
    if isinstance(names, str):
        return names
    return (names or [families.default_architecture(config)])[0]


def load_tokenizer(source: ModelSource):
    """The checkpoint's tokenizer; decoders without a pad token pad with their EOS token."""
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source.path, **source.kwargs())
    except (OSError, ValueError) as exc:
        if "trust_remote_code" in str(exc):
            raise ModelLoadError(
                f"the tokenizer of {source.name} needs code of its own to load (auto_map in its "
                "tokenizer_config.json); mi_core never runs code from a checkpoint: give it a "
                "tokenizer transformers reads itself (tokenizer.json)"
            ) from None
        raise ModelLoadError(f"cannot load the tokenizer of {source.name}: {exc}") from exc
    if len(tokenizer) <= len(set(tokenizer.all_special_tokens)):
        raise ModelLoadError(
            f"{source.name} has no tokenizer files (its tokenizer knows only its "
            f"{len(tokenizer)} special tokens, so every word would be unknown); copy the "
            "tokenizer files (tokenizer.json, vocab.txt, ...) of the model it was trained from "
            "into the checkpoint folder"
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Within the block, transformers logs errors only and shows no progress bar (loading and
    saving checkpoints mi_core reports on itself)."""
    level = transformers.logging.get_verbosity()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)
        if bars:
            transformers.utils.logging.enable_progress_bar()


def _expected_num_labels(task: str | None, num_labels: int | None) -> int | None:
    if task is not None and task not in TASK_NUM_LABELS:
        raise ModelLoadError(
            f"unknown task {task!r}; expected one of {[*sorted(TASK_NUM_LABELS), NEXT_TOKEN]}"
        )
    expected = TASK_NUM_LABELS.get(task) if task else None
    if num_labels is not None and expected is not None and num_labels != expected:
        raise ModelLoadError(f"task {task} has {expected} labels, not {num_labels}")
    return num_labels or expected


def load_hf_classifier(
    name_or_path: str | os.PathLike[str],
    task: str | None = None,
    num_labels: int | None = None,
    seed: int = 0,
):
    """The Hugging Face sequence classifier for a checkpoint, and its tokenizer.

    A classifier checkpoint keeps its head (whose label count must fit the task); a pretrained
    body (BertModel, RobertaForMaskedLM, GPT2LMHeadModel, ...) gets a head initialised from
    ``seed``. Returns ``(model, tokenizer, task)``; ``model`` is in eval mode.
    """
    source = resolve_source(name_or_path)
    if source.name == embedded.MINILM and task is None and num_labels is None:
        task = embedded.DEFAULT_TASK
        log.warning(
            "minilm has no task head of its own: made a %s head (%d labels, random, seed %d); "
            "pass task='mnli' or task='qqp' to choose",
            task,
            TASK_NUM_LABELS[task],
            seed,
        )
    config = load_hf_config(source)
    arch = _first_architecture(config)
    wanted = _expected_num_labels(task, num_labels)
    if arch in CLASSIFIER_ARCHITECTURES:
        if wanted is not None and config.num_labels != wanted:
            raise ModelLoadError(
                f"{source.name} has a {config.num_labels}-label head but "
                f"{'task ' + task if task else 'the request'} needs {wanted} labels; "
                "use a checkpoint fine-tuned for this task"
            )
        wanted = config.num_labels
        if task is None:
            task = next((t for t, n in TASK_NUM_LABELS.items() if n == wanted), None)
    elif arch not in BODY_ARCHITECTURES:
        raise ModelLoadError(
            f"{source.name} ({arch}) cannot be a sequence classifier; supported: "
            + ", ".join(CLASSIFIER_ARCHITECTURES + BODY_ARCHITECTURES)
        )
    elif wanted is None:
        raise ModelLoadError(
            f"{source.name} is a pretrained {arch} without a task head; name a task "
            f"({', '.join(TASK_NUM_LABELS)}) so a head can be initialised"
        )
    tokenizer = load_tokenizer(source)
    kwargs = dict(source.kwargs(), num_labels=wanted)
    if arch not in CLASSIFIER_ARCHITECTURES and task in TASK_LABEL_NAMES:
        names = TASK_LABEL_NAMES[task]
        kwargs["id2label"] = dict(enumerate(names))
        kwargs["label2id"] = {n: i for i, n in enumerate(names)}
    heads = () if arch in CLASSIFIER_ARCHITECTURES else _HEAD_PREFIXES  # made from the seed
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = _from_pretrained(
            transformers.AutoModelForSequenceClassification, source, heads, **kwargs
        )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if arch in CLASSIFIER_ARCHITECTURES and task in TASK_LABELS:
        _in_task_order(model, task, source.name, _written_by_finetune(source.path))
    return model.eval(), tokenizer, task


def _label_key(name: str) -> str:
    return "_".join(str(name).strip().lower().replace("-", " ").split())


def _output_layer(model: HookedModel) -> torch.nn.Linear | None:
    """The last linear layer of a sequence classifier's head (one row per class)."""
    for path in ("classifier.out_proj", "classifier", "score"):
        layer = model
        for part in path.split("."):
            layer = getattr(layer, part, None)
        if isinstance(layer, torch.nn.Linear):
            return layer
    return None


def _written_by_finetune(path: Any) -> bool:
    """Whether ``path`` is a checkpoint of ``mi-core finetune`` (its ``trainer_state.json``
    holds the step and the optimizer layout; Hugging Face's Trainer writes ``global_step``)."""
    state = Path(str(path)) / "trainer_state.json"
    if not state.is_file():
        return False
    try:
        keys = json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(keys, dict) and "step" in keys and "optimizer" in keys


def _in_task_order(model: HookedModel, task: str, name: str, finetuned: bool = False) -> None:
    """A checkpoint whose ``id2label`` names the task's labels in another order (e.g.
    roberta-large-mnli: contradiction, neutral, entailment) gets its head's rows reordered to
    the task's order (:data:`~mi_core.tasks.TASK_LABELS`), with ``id2label`` to match, so its
    class ``i`` is the task's label ``i`` everywhere (evaluation, HANS's two-way mapping,
    fine-tuning, saved checkpoints). A checkpoint of ``mi-core finetune`` (``finetuned``) is
    in the task's order whatever its names say, and is only renamed. Generic names
    (``LABEL_0``) are taken to be in the task's order; other names are warned about."""
    want = list(TASK_LABELS[task])
    config = model.config
    names = [_label_key(config.id2label[i]) for i in range(config.num_labels)]
    if names == want:
        return
    if sorted(names) == sorted(want) and finetuned:
        # mi-core finetune trains on the task's labels whatever the base's names said, and
        # before its heads were reordered on loading it kept the base's names: rename only
        config.id2label = dict(enumerate(want))
        config.label2id = {label: i for i, label in enumerate(want)}
        log.info("%s: a finetune checkpoint in %s's order, named %s: renamed", name, task, names)
    elif sorted(names) == sorted(want):
        order = [names.index(label) for label in want]
        layer = _output_layer(model)
        if layer is None:
            raise ModelLoadError(f"{name}: cannot find its head's output layer to reorder")
        with torch.no_grad():
            layer.weight.copy_(layer.weight[order].clone())
            if layer.bias is not None:
                layer.bias.copy_(layer.bias[order].clone())
        config.id2label = dict(enumerate(want))
        config.label2id = {label: i for i, label in enumerate(want)}
        log.info("%s: head reordered from %s to %s's label order", name, names, task)
    elif not all(re.fullmatch(r"label_\d+", n) for n in names):
        log.warning(
            "%s: its labels %s are not %s's %s; its classes are read in %s's order",
            name, names, task, want, task,
        )  # fmt: skip


def load_hf_causal_lm(name_or_path: str | os.PathLike[str]):
    """The Hugging Face causal LM for a checkpoint (GGUF files are de-quantised), and tokenizer."""
    source = resolve_source(name_or_path)
    config = load_hf_config(source)
    arch = _first_architecture(config)
    if arch not in CAUSAL_LM_ARCHITECTURES:
        raise ModelLoadError(
            f"{source.name} ({arch}) is not a causal LM; supported: "
            + ", ".join(CAUSAL_LM_ARCHITECTURES)
        )
    families.tl_config(config)  # a variant the conversion would change: refused before
    tokenizer = load_tokenizer(source)  # the weights are read
    model = _from_pretrained(
        transformers.AutoModelForCausalLM, source, dtype=torch.float32, **source.kwargs()
    )
    return model.eval(), tokenizer


def _from_pretrained(
    auto_class: Any, source: ModelSource, new_heads: tuple[str, ...] = (), **kwargs: Any
) -> Any:
    """``auto_class.from_pretrained`` that refuses a checkpoint lacking weights: Hugging Face
    initialises missing tensors at random and only logs it, so a weight file missing some or
    all of them loaded as a partly or wholly random model. ``new_heads``: the parameter
    prefixes that may be missing (a task head made for a pretrained body)."""
    refuse_integer_weights(source)
    with quiet_transformers():
        try:
            model, info = auto_class.from_pretrained(
                source.path, output_loading_info=True, **kwargs
            )
        except DAMAGED as exc:
            raise hub_error(source, exc) from exc
    if source.gguf_file:
        _forget_gguf(model)
    missing = sorted(k for k in info.get("missing_keys") or () if not k.startswith(new_heads))
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise ModelLoadError(
            f"the weights of {source.name} lack {len(missing)} of the model's tensors ({shown}), "
            "which would be random: the weight file is incomplete or of another model; copy or "
            "save the checkpoint again"
        )
    return model


def _forget_gguf(model: transformers.PreTrainedModel) -> None:
    """A model read from a GGUF file holds de-quantised float weights, but transformers keeps
    its GGUF "quantizer" and refuses to save it (so a fine-tuned SmolLM2 could not be written);
    drop the marker: the model is then an ordinary checkpoint and saves as one."""
    setattr(model, "hf_quantizer", None)  # noqa: B010 (an attribute torch's stubs do not know)
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")


def _check_finite(model: torch.nn.Module, name: str) -> None:
    """Refuse weights holding NaN or infinite values: every logit would be NaN, and an
    accuracy computed from them meaningless."""
    bad = [k for k, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ModelLoadError(
            f"the weights of {name} hold NaN or infinite values ({shown}): a diverged training "
            "run or a damaged file; use another checkpoint"
        )


def hooked_classifier_from_hf(
    hf_model, tokenizer, task: str | None = None, device: str = "cpu", dtype=torch.float32
) -> HookedClassifier:
    """Convert a Hugging Face sequence classifier (an encoder's or a decoder's, of any
    family in :data:`~mi_core.models.families.FAMILIES`) to a hooked classifier, weights
    exact (no norm folding)."""
    config = hf_model.config
    label_names = [config.id2label[i] for i in range(config.num_labels)]
    family = families.family_for_config(config)
    cfg = families.tl_config(config, device=device, dtype=dtype)
    if family.encoder:
        model: HookedClassifier = HookedEncoderClassifier(
            cfg,
            config.num_labels,
            tokenizer,
            task,
            label_names,
            uses_token_types=config.type_vocab_size > 1,
        )
    else:
        model = HookedDecoderClassifier(cfg, config.num_labels, tokenizer, task, label_names)
    _load_exact(model, families.classifier_state_dict(hf_model, cfg))
    model.dropout_rates = DropoutRates.from_hf_config(config)
    model.model_name = str(getattr(config, "_name_or_path", "") or cfg.model_name)
    return model.eval()


def _load_exact(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a converted state dict, requiring every learnt weight to be present.

    TransformerLens's converters write zero tensors for biases a family lacks (Phi-3's norm
    biases) and leave out some it has as zeros (gated MLP biases; ALiBi models' unused position
    table): a missing bias or unused position table is zero, an unexpected tensor must be all
    zeros; anything else missing or extra is a conversion error."""
    own = model.state_dict()
    made = ("IGNORE", ".mask", ".rotary_sin", ".rotary_cos")  # buffers the model makes itself
    zero = re.compile(r"(\.b|\.b_[A-Za-z]+|pos_embed\.W_pos)$")  # TL's bias names, not ".bias"
    missing = [k for k in own if k not in state and not k.endswith(made)]
    unexpected = [k for k in state if k not in own and bool(state[k].detach().abs().max() > 0)]
    zeros = [k for k in missing if zero.search(k)]
    missing = [k for k in missing if k not in zeros]
    if missing or unexpected:
        raise ModelLoadError(
            f"weight conversion mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    loaded = {k: v.detach().clone() for k, v in state.items() if k in own}
    loaded |= {k: torch.zeros_like(own[k]) for k in zeros}
    model.load_state_dict(loaded, strict=False)


def hooked_causal_lm_from_hf(
    hf_model,
    tokenizer,
    device: str = "cpu",
    dtype=torch.float32,
    fold_ln: bool = True,
    fold_value_biases: bool | None = None,
    n_devices: int = 1,
) -> HookedTransformer:
    """Convert a Hugging Face causal LM (any family of
    :data:`~mi_core.models.families.FAMILIES`) to a ``HookedTransformer``.

    ``fold_value_biases`` (default: ``fold_ln``): fold each head's value bias into the output
    bias, as TransformerLens does, except where heads attend to sinks (the fold would change
    the outputs: :mod:`mi_core.models.value_biases`); ``model.value_biases_folded`` says
    whether that moved any nonzero bias (``hook_z`` then leaves it out, and a head's zero fill
    is ``-b_V``)."""
    fold_ln = fold_ln and families.foldable(hf_model.config)
    fold_v = _fold_values(hf_model.config, fold_ln, fold_value_biases)
    # fold and centre at float32, then cast: the same weights as processing at bfloat16 /
    # float16, without TransformerLens's warning that processing in reduced precision loses
    # accuracy
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    cfg = families.tl_config(
        hf_model.config, device=device, dtype=work, fold_ln=fold_ln, n_devices=n_devices
    )
    state = families.causal_lm_state_dict(hf_model, cfg)
    model = HookedTransformer(cfg, tokenizer=None, move_to_device=True)
    model.load_and_process_state_dict(
        state,
        fold_ln=fold_ln,
        center_writing_weights=fold_ln,
        center_unembed=fold_ln and not softcap_enabled(cfg.output_logits_soft_cap),
        fold_value_biases=False,  # folded below, where the folded biases are kept
    )
    if fold_v:
        fold_value_biases_of(model)
    else:
        set_folded_value_biases(model, None)
    if dtype != work:
        model.to(dtype, print_details=False)
    _zero_unused_positions(model)
    attach_tokenizer(model, tokenizer)
    model.model_name = str(getattr(hf_model.config, "_name_or_path", "") or cfg.model_name)
    return model.eval()


def _fold_values(hf_config: Any, fold_ln: bool, fold_value_biases: bool | None) -> bool:
    """Whether to fold the value biases: as asked (default: with the norms), and never where
    the fold would change the outputs (attention sinks: a head's row does not sum to one)."""
    fold_v = fold_ln if fold_value_biases is None else fold_value_biases
    if not fold_v:
        return False
    cfg = families.family_for_config(hf_config).config(hf_config)
    if value_biases_foldable(types.SimpleNamespace(**cfg)):
        return True
    if fold_value_biases:
        raise ConfigError(
            "this model's heads attend to learnt sinks, so an attention row does not sum to one "
            "and folding the value biases would change its outputs; load it with "
            "fold_value_biases=False (or leave the option unset)"
        )
    return False


def _zero_unused_positions(model: HookedTransformer) -> None:
    """TransformerLens makes a learnt position table for ALiBi models too, which it never
    reads and leaves uninitialised: zero it, so the weights hold no garbage (NaN)."""
    if model.cfg.positional_embedding_type == "alibi" and hasattr(model, "pos_embed"):
        with torch.no_grad():
            model.pos_embed.W_pos.zero_()


def attach_tokenizer(model: HookedTransformer, tokenizer: Any) -> None:
    """Give a causal LM its tokenizer the way TransformerLens's own models have one, so that
    ``to_tokens``, ``to_str_tokens``, ``run_with_cache("text")`` and ``generate`` take strings.

    Set directly (TL's ``set_tokenizer`` would re-load it from the hub); what TL reads from
    the tokenizer is set as ``set_tokenizer`` sets it: whether the tokenizer prepends a BOS
    token itself (TL then does not add another).
    """
    model.tokenizer = tokenizer
    model.cfg.tokenizer_prepends_bos = len(tokenizer.encode("")) > 0
    model.cfg.tokenizer_name = getattr(tokenizer, "name_or_path", None)
    if "gemma" in str(getattr(tokenizer, "name_or_path", "")):
        # TransformerLens's to_str_tokens gives a string's tokens an extra dimension when the
        # tokenizer's name says gemma, and then fails reading them; tokenise first instead
        model.to_str_tokens = types.MethodType(_to_str_tokens_via_ids, model)


def _to_str_tokens_via_ids(
    self: HookedTransformer, input: Any, prepend_bos: Any = None, padding_side: Any = None
) -> Any:
    """TransformerLens's ``to_str_tokens``, given a string's token ids rather than the string."""
    if isinstance(input, list):
        return [_to_str_tokens_via_ids(self, x, prepend_bos, padding_side) for x in input]
    if isinstance(input, str):
        kwargs = {
            k: v
            for k, v in (("prepend_bos", prepend_bos), ("padding_side", padding_side))
            if v is not None
        }
        input = self.to_tokens(input, **kwargs)[0]
    return HookedTransformer.to_str_tokens(self, input)


def _load_cached(
    cache: Path,
    source: ModelSource,
    device: str,
    dtype: torch.dtype,
    fold_ln: bool,
    n_devices: int = 1,
) -> HookedTransformer:
    cached = ModelSource(source.name, str(cache), local=True)
    hf_config = load_hf_config(cached)
    fold_ln = fold_ln and families.foldable(hf_config)
    cfg = families.tl_config(
        hf_config, device=device, dtype=dtype, fold_ln=fold_ln, n_devices=n_devices
    )
    model = HookedTransformer(cfg, tokenizer=None, move_to_device=True)
    weights, metadata = read_safetensors(cache / CACHED_WEIGHTS)
    if "value_biases_folded" not in metadata:
        raise ModelLoadError(f"{cache / CACHED_WEIGHTS} does not say how its biases were folded")
    folded = weights.pop(FOLDED_TENSOR, None)
    if (folded is not None) != (metadata["value_biases_folded"] == "true"):
        raise ModelLoadError(f"{cache / CACHED_WEIGHTS} does not hold the value biases it folded")
    try:  # strictly: a cache missing tensors would leave them as the model initialised them
        model.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{cache / CACHED_WEIGHTS} does not fit the model: {exc}") from None
    set_folded_value_biases(model, folded.to(cfg.device) if folded is not None else None)
    attach_tokenizer(model, load_tokenizer(cached))
    return model.eval()


def _load_causal_lm(
    source: ModelSource,
    device: str,
    dtype: torch.dtype,
    fold_ln: bool,
    fold_value_biases: bool | None = None,
    n_devices: int = 1,
) -> HookedTransformer:
    """A hooked causal LM; processed weights of local checkpoints are cached on first load
    (:mod:`mi_core.models.weight_cache`: one folder per model and processing option)."""
    if not source.local:  # a hub model: nothing to key a cache folder by
        hf_model, tokenizer = load_hf_causal_lm(source.name)
        return hooked_causal_lm_from_hf(
            hf_model, tokenizer, device, dtype, fold_ln, fold_value_biases, n_devices
        )
    hf_config = load_hf_config(source)
    fold_v = _fold_values(hf_config, fold_ln and families.foldable(hf_config), fold_value_biases)
    folder = Path(source.path)  # one cache folder per model and options (weight_cache)
    cache = weight_cache.cache_dir(folder, source.gguf_file, (fold_ln, fold_v), dtype)
    digest = weight_cache.source_digest(folder, source.gguf_file)
    weights = cache / CACHED_WEIGHTS
    if weights.is_file():
        try:  # the header alone says whether the folder is of the checkpoint as it is now
            if weight_cache.cached_source(weights) == digest:
                return _load_cached(cache, source, device, dtype, fold_ln, n_devices)
            log.info("%s changed on disk: its processed-weight cache is rebuilt", source.name)
        except (*DAMAGED, ModelLoadError) as exc:
            log.warning(
                "the processed-weight cache %s is damaged (%s); rebuilding it from %s",
                cache,
                type(exc).__name__,
                source.name,
            )
    hf_model, tokenizer = load_hf_causal_lm(source.name)
    model = hooked_causal_lm_from_hf(hf_model, tokenizer, device, dtype, fold_ln, fold_v, n_devices)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        hf_model.config.save_pretrained(cache)
        tokenizer.save_pretrained(cache)
        write_text(cache / "source.txt", f"{folder.resolve()} {source.gguf_file or ''}\n")
        tensors = dict(model.state_dict())
        folded = folded_value_biases(model)
        if folded is not None:  # what a head's zero is (mi_core.models.value_biases)
            tensors[FOLDED_TENSOR] = folded
        write_safetensors(  # the weights last: their digest marks the folder complete
            weights,
            tensors,
            {"value_biases_folded": str(folded is not None).lower(), "source": digest},
        )
        log.info(
            "cached %s's processed weights in %s (%s; mi-core cache clear removes them)",
            source.name, cache, weight_cache.human_size(weights.stat().st_size),
        )  # fmt: skip
    except Exception as exc:  # the cache is optional: nothing it raises may stop a load
        # (a read-only home, a full disk, a folder removed by a concurrent `mi-core cache
        # clear`; the tokenizers library raises a bare Exception for the last two)
        log.warning("could not cache processed weights in %s: %s", cache, exc)
    return model


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A floating torch dtype from itself or its name (``"float16"``, ``"torch.bfloat16"``)."""
    if isinstance(dtype, str):
        value = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(value, torch.dtype):
            dtype = value
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(
            f"dtype must be a floating torch dtype such as torch.float32, torch.bfloat16 or "
            f"'float16', not {dtype!r}"
        )
    return dtype


def loads_as_classifier(
    name_or_path: str | os.PathLike[str],
    task: str | None = None,
    num_labels: int | None = None,
) -> bool:
    """Whether :func:`load_model` loads this checkpoint as a sequence classifier (a task or a
    label count given, a classifier checkpoint, or a body that is no causal LM) rather than as
    a language model; reads its config only, so a job can check its data before the load."""
    return _classifier_arch(_architecture(resolve_source(name_or_path)), task, num_labels)


def _classifier_arch(arch: str, task: str | None, num_labels: int | None) -> bool:
    if task == NEXT_TOKEN:  # a causal LM read as a classifier over its vocabulary
        return arch in CAUSAL_LM_ARCHITECTURES
    return (
        task is not None
        or num_labels is not None
        or arch in CLASSIFIER_ARCHITECTURES
        or arch not in CAUSAL_LM_ARCHITECTURES
    )


def _architecture(source: ModelSource) -> str:
    """The checkpoint's architecture name (its config's first, else the model type's)."""
    config = load_hf_config(source)
    return _first_architecture(config)


def load_model(
    name_or_path: str | os.PathLike[str],
    task: str | None = None,
    num_labels: int | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    fold_ln: bool = True,
    fold_value_biases: bool | None = None,
    fast_paths: bool = True,
    n_devices: int = 1,
) -> HookedModel:
    """Load a checkpoint as a hooked model with the standard TransformerLens hook names.

    :param name_or_path: a local Hugging Face checkpoint directory, a local ``.gguf`` file of
        a family transformers reads GGUF for (Llama, Mistral, Qwen2, Qwen3, Phi-3, GPT-NeoX,
        BLOOM, Gemma 2 / 3, ...), a hub name, ``"minilm"``
        (all-MiniLM-L6-v2 as a BERT classifier, task ``mnli`` unless named) or ``"smollm2"``
        (SmolLM2-135M-Instruct as a causal LM).
    :param task: ``"mnli"`` or ``"qqp"``: load as a sequence classifier for that task. Classifier
        checkpoints are classifiers anyway; causal LM checkpoints without a task are LMs.
        ``"next_token"`` (:data:`~mi_core.tasks.NEXT_TOKEN`): a causal LM as a
        :class:`~mi_core.models.classifier.HookedAnswerModel`, its next-token logits at the
        prompt's last token, for the node methods on prompt tasks.
    :param num_labels: the head size, when no task is named.
    :param seed: seeds a freshly initialised classification head.
    :param fold_ln: causal LMs only: fold norms and centre weights as TL does.
    :param fold_value_biases: causal LMs only (default: ``fold_ln``): fold the value biases into
        the output bias as TL does; then ``hook_z`` leaves them out (a head's zero fill is
        still the head writing nothing: :mod:`~mi_core.models.value_biases`). Never done
        where heads attend to sinks (GPT-OSS): the fold would change the outputs there.
        Separability's attention statistics need them in (``mi-core separability`` passes
        False).
    :param fast_paths: fused forwards (attention, norms, MLPs, unembedding) with TL's values and
        hooks; False keeps TransformerLens's own code, e.g. for second-order gradients
        through attention (see :func:`~mi_core.models.fast_paths.disable_fast_paths`).
    :param device: ``cpu``, ``cuda``, ``cuda:1``, ``mps`` or ``auto`` (CUDA when torch sees one).
    :param dtype: a torch dtype or its name (``float32``, ``"bfloat16"``, ...).
    :param n_devices: causal LMs only: split the layers over this many CUDA devices of this
        machine (``cuda:0`` ... ``cuda:N-1``, TransformerLens's ``n_devices``) for a model too
        large for one.
    """
    device = str(resolve_device(str(device)))  # a device this machine lacks: one clear line
    dtype = _as_dtype(dtype)
    source = resolve_source(name_or_path)
    arch = _architecture(source)
    if task == NEXT_TOKEN:
        if arch not in CAUSAL_LM_ARCHITECTURES or num_labels is not None:
            raise ModelLoadError(
                f"task {NEXT_TOKEN} reads a causal language model's next-token logits; "
                f"{source.name} is a {arch}"
                + (" and num_labels does not apply" if num_labels is not None else "")
            )
        if n_devices > 1:
            raise ModelLoadError(
                f"task {NEXT_TOKEN} runs the model on one device; load it in bfloat16 to halve "
                "its memory"
            )
    classifier = task != NEXT_TOKEN and _classifier_arch(arch, task, num_labels)
    _check_n_devices(n_devices, device, classifier)
    if task == NEXT_TOKEN:
        lm = _load_causal_lm(source, device, dtype, fold_ln, fold_value_biases)
        model = HookedAnswerModel.from_lm(lm)
        del lm
    elif classifier:
        hf_model, tokenizer, task = load_hf_classifier(source.name, task, num_labels, seed)
        model = hooked_classifier_from_hf(hf_model, tokenizer, task, device=device, dtype=dtype)
        model.head_from_checkpoint = arch in CLASSIFIER_ARCHITECTURES
    else:
        model = _load_causal_lm(source, device, dtype, fold_ln, fold_value_biases, n_devices)
        enable_lm_fast_paths(model)  # no per-call weight copies in the MLPs and unembedding
    _check_finite(model, source.name)
    guard_vocabulary(model)
    if not fast_paths:
        disable_fast_paths(model)
    if source.local and source.name not in embedded.EMBEDDED_MODELS:
        model.model_name = str(Path(source.path).resolve())
    elif source.name in embedded.EMBEDDED_MODELS or source.revision:
        model.model_name = source.name  # a revision is part of the name: name@revision
    model.cfg.model_name = source.name  # the name the user gave, not a site-packages path
    log.info("loaded %s as %s", source.name, type(model).__name__)
    return model


def _check_n_devices(n_devices: int, device: str, classifier: bool) -> None:
    """Refuse a split mi_core cannot make, with one line each."""
    if not isinstance(n_devices, int) or isinstance(n_devices, bool) or n_devices < 1:
        raise ConfigError(f"n_devices must be a positive integer, got {n_devices!r}")
    if n_devices == 1:
        return
    if classifier:
        raise ModelLoadError(
            "n_devices > 1 splits causal language models; a sequence classifier loads on one "
            "device (load its weights in bfloat16 to halve its memory)"
        )
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not device.startswith("cuda") or have < n_devices:
        raise ModelLoadError(
            f"n_devices={n_devices} splits the model over {n_devices} CUDA devices; this "
            f"machine has {have} and the device asked for is {device}"
        )


def warn_if_random_head(model: HookedModel, source: str, what: str = "these accuracies") -> None:
    """Warn that ``model``'s classifier head was made at random when it loaded (a checkpoint
    with no head of its own, e.g. a language model): ``what`` are then chance numbers."""
    if not getattr(model, "head_from_checkpoint", True):
        log.warning(
            "%s has no %s head of its own: the head was made at random when it loaded, so %s "
            "are chance; use a fine-tuned checkpoint (mi-core finetune)",
            source, getattr(model, "task", "classifier"), what,
        )  # fmt: skip
