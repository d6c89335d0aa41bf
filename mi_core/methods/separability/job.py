"""A separability run as a job: load the model and the two data sets, prune, write the files.

::

    config = SeparabilityConfig(model="smollm2", focus="text:wikitext", cripple="text:python",
                                out="runs/separability")
    result = run_separability_job(config)  # resumes when re-run

Shipped configs (``mi_core/configs/separability``) hold the report's settings
(``opt-1.3b-pile-code``) and the local ones (``smollm2-wikitext-python``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mi_core.config import read_config_json, resolve_shipped, shipped_names
from mi_core.data import token_texts, token_windows
from mi_core.data.text import load_text
from mi_core.errors import ConfigError
from mi_core.io import check_replaceable
from mi_core.methods.separability.report import OUTPUT_FILES, write_separability_outputs
from mi_core.methods.separability.run import (
    SeparabilityConfig,
    SeparabilityResult,
    TaskTokens,
    check_state,
    run_separability,
)

log = logging.getLogger(__name__)

SHIPPED = "configs/separability"
STATE_FILE = "state.safetensors"


def _windows(tokenizer, spec: str, window: int, n_tokens: int, split: str):
    windows = token_windows(tokenizer, spec, window=window, split=split)
    wanted = max(1, n_tokens // window)
    if windows.shape[0] < wanted:
        log.warning(
            "%s: %s part has %d windows of %d tokens; using all of them (%d asked for)",
            spec,
            split,
            windows.shape[0],
            window,
            wanted,
        )
    return windows[:wanted]


def _task(tokenizer, spec: str, config: SeparabilityConfig, eval_tokens: int) -> TaskTokens:
    """One data set's statistics windows and held-out part (windows or whole texts)."""
    stats = _windows(tokenizer, spec, config.window, config.tokens, "stats")
    if config.eval_protocol == "texts":
        heldout, mask = token_texts(tokenizer, spec, config.text_tokens, eval_tokens, "heldout")
        predictions = int(mask.sum()) - mask.shape[0]  # the start token predicts nothing before
        if predictions < eval_tokens:
            log.warning(
                "%s: the held-out texts hold %d predictions of up to %d tokens each; using all "
                "of them (%d asked for)",
                spec,
                predictions,
                config.text_tokens,
                eval_tokens,
            )
        return TaskTokens(name=spec, stats=stats, heldout=heldout, heldout_mask=mask)
    heldout = _windows(tokenizer, spec, config.window, eval_tokens, "heldout")
    return TaskTokens(name=spec, stats=stats, heldout=heldout)


def shipped_separability_configs() -> list[str]:
    """Names of the separability configs shipped with mi_core."""
    return shipped_names(SHIPPED)


def separability_config_values(name_or_path: str | os.PathLike[str]) -> dict:
    """The keys of a separability config file, or of a shipped config by name (unchecked: the
    command line lays its flags over them before :meth:`SeparabilityConfig.from_dict`)."""
    return read_config_json(resolve_shipped(SHIPPED, name_or_path, "separability config"))


def load_separability_config(name_or_path: str | os.PathLike[str]) -> SeparabilityConfig:
    """A separability config file, or a shipped config by name (e.g. ``smollm2-wikitext-python``),
    validated."""
    source = Path(os.fspath(name_or_path)).name
    return SeparabilityConfig.from_dict(separability_config_values(name_or_path), source=source)


def run_separability_job(
    config: SeparabilityConfig,
    out: str | os.PathLike[str] | None = None,
    *,
    progress: bool = True,
) -> SeparabilityResult:
    """Run (or resume) ``config`` with its model and data sets; write the outputs under
    ``config.out`` (``out``, when given, overrides it).

    The state after every step goes to ``out/state.safetensors``, so a re-run after a crash
    goes on from the last finished step; a state from other settings is refused before the
    model is loaded.
    """
    from mi_core.models import load_model

    if out is not None:
        config = config.replace(out=os.fspath(out))
    missing = [k for k in ("model", "focus", "cripple", "out") if not getattr(config, k)]
    if missing:
        raise ConfigError(f"a separability job needs {', '.join(missing)}")
    eval_tokens = config.eval_tokens or config.tokens
    identity = {
        "model": str(config.model),
        "focus": config.focus,
        "cripple": config.cripple,
        "tokens": config.tokens,
        "eval_tokens": eval_tokens,
        "window": config.window,
    }
    if config.eval_protocol == "texts":
        identity["text_tokens"] = config.text_tokens
    if config.prunes_attention or config.svd:  # MLP pruning reads no pre-out neuron
        # the pre-out neurons carry their value bias (the report's); runs before this differ
        identity["value_biases"] = "in pre-out"
    out = Path(config.out)
    state_path = out / STATE_FILE
    done = check_state(state_path, config, identity)  # fails fast on a mismatched state
    # before the model loads (minutes for a large one): a missing data set, a file the
    # outputs cannot replace
    check_replaceable(out, (STATE_FILE, *OUTPUT_FILES.values()))
    for spec in (config.focus, config.cripple):
        load_text(spec)
    if done >= 0:
        log.info("resuming %s after step %d of %d", out, done, config.steps)
    # value biases stay in hook_z: a pre-out neuron is the report's, bias included
    model = load_model(config.model, fold_value_biases=False, **config.load_options())
    if not hasattr(model, "unembed") or getattr(model, "tokenizer", None) is None:
        raise ConfigError(f"{config.model} is not a causal language model with a tokenizer")
    from mi_core.models.fingerprint import weights_fingerprint

    # the weights, not only the name: a checkpoint changed under the same path is another run
    identity["model_fingerprint"] = weights_fingerprint(model)
    focus, cripple = (
        _task(model.tokenizer, spec, config, eval_tokens) for spec in (config.focus, config.cripple)
    )
    result = run_separability(
        model,
        focus,
        cripple,
        config,
        state_path=state_path,
        identity=identity,
        progress=progress,
    )
    write_separability_outputs(result, out, extra_summary=identity)
    return result
