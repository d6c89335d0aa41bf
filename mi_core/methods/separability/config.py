"""The separability job's config (``mi-core separability``): light, so the command's ``--help``
imports no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mi_core.analysis.constants import MODES
from mi_core.config import option
from mi_core.devices import ModelPlacement
from mi_core.errors import ConfigError
from mi_core.interventions.config import UNIT_FILLS
from mi_core.pruning.constants import CRIPPLE_TERMS
from mi_core.statistics.constants import HEAD_AGGREGATIONS, SCHEDULES, SCORINGS

__all__ = ["EVAL_PROTOCOLS", "JOB_FIELDS", "LEARNED", "SELECTIONS", "SeparabilityConfig"]


EVAL_PROTOCOLS = ("windows", "texts")
#: How the units a step removes are chosen: by activation statistics (the report), by neuron
#: masks learned to keep the focus text and lose the cripple text, or both side by side.
SELECTIONS = ("statistics", "learned", "both")
#: The learned run's name in the trajectory.
LEARNED = "learned"


#: Fields of :class:`SeparabilityConfig` that say what to run on (model, data, amounts, device)
#: rather than how to prune; the resume state checks them through ``identity``.
JOB_FIELDS = (
    "description",
    "out",
    "model",
    "focus",
    "cripple",
    "tokens",
    "eval_tokens",
    "window",
    "text_tokens",
    "device",
)


@dataclass
class SeparabilityConfig(ModelPlacement):
    """A separability run: what to prune, on which data, and how; defaults are the report's.

    :func:`run_separability` reads the pruning options; :func:`run_separability_job` also loads
    ``model`` and the ``focus`` / ``cripple`` data sets.
    """

    steps: int = 20
    """Pruning steps."""
    ff_frac: float = 0.05
    """Fraction of the MLP neurons removed per step (see ``schedule``)."""
    attn_frac: float = 0.0
    """Fraction of the attention units removed per step (see ``schedule``)."""
    ff_scoring: str = option("freq", choices=SCORINGS)
    """How MLP neurons are scored (the report: positive-activation frequency)."""
    attn_scoring: str = option("abs", choices=SCORINGS)
    """How attention pre-out neurons (or heads) are scored (the report: mean ``|x|``)."""
    scoring: str | None = option(None, choices=SCORINGS)
    """Shorthand: sets both ff_scoring and attn_scoring."""
    schedule: str = option("total", choices=SCHEDULES)
    """total: each step removes the fraction of all units, so 1/frac steps prune everything (the
    report); remaining: the fraction of the units left."""
    attn_unit: str = option("neuron", choices=("neuron", "head"))
    """Prune attention pre-out neurons or whole heads."""
    attn_heads_per_step: int = 0
    """With attn_unit head: remove this many heads per step instead of attn_frac (the report's
    OPT-1.3b runs remove 7 heads a step); 0 uses attn_frac."""
    head_aggregation: str = option("mean", choices=HEAD_AGGREGATIONS)
    """How neuron scores make a head score with attn_unit head."""
    ff_fill: str = option("zero", choices=UNIT_FILLS)
    """What replaces a removed MLP neuron: zero, or its focus-data mean."""
    attn_fill: str = option("zero", choices=UNIT_FILLS)
    """What replaces a removed attention pre-out neuron: zero (the report's choice: its mean
    offset was a "large bad effect"; the authors' runs: no mean offset), or its focus-data
    mean."""
    fill: str | None = option(None, choices=UNIT_FILLS)
    """Shorthand: sets both ff_fill and attn_fill."""
    svd: bool = False
    """Rewrite attention W_V / W_O in the OV-SVD basis first."""
    svd_combine_biases: bool = False
    """With svd: fold the value biases into the output bias first."""
    mode: str = option("cripple", choices=MODES)
    """Trajectory orientation: cripple (x = the cripple data set) or focus (x = focus)."""
    eval_protocol: str = option("windows", choices=EVAL_PROTOCOLS)
    """windows: metrics on fixed held-out windows of window tokens, the loss averaged per token;
    texts: the report's protocol, each held-out text up to text_tokens tokens after a start
    token, texts taken whole until they hold eval_tokens predictions (the last may add a few
    more; fewer, with a warning, when the held-out texts run out), the loss averaged per text
    first."""
    stats_correct_top_k: int = option(0, flag="--correct-top-k")
    """Collect statistics only where the next token is in the model's top k (0: every token;
    the reference code's check_accuracy option, off in the report's runs, used k = 10)."""
    random_baseline: bool = option(False, flag="--random")
    """Also run the random baseline."""
    selection: str = option("statistics", choices=SELECTIONS, flag="--method")
    """statistics: each step removes the units the activation statistics score highest (the
    report); learned: neuron masks learned to keep the focus text and lose the cripple text
    (:mod:`~mi_core.methods.separability.learned`), removing as many units a step as the
    statistics would; both: the two side by side."""
    learn_steps: int = 30
    """With --method learned / both: optimizer steps per trajectory step (the masks are
    trained on, step after step, toward each step's number of units removed)."""
    learn_lr: float = 0.3
    """Learning rate of the learned masks' log_alpha."""
    cripple_term: str = option("uniform", choices=CRIPPLE_TERMS)
    """What the learned masks minimise on the cripple text: uniform, the cross-entropy to the
    uniform distribution (bounded, nothing to tune); capped, minus the rise of the next-token
    loss, capped at cripple_cap nats a token."""
    cripple_cap: float = 2.0
    """With cripple_term capped: the most loss rise a token is rewarded for, in nats."""
    cripple_weight: float = 1.0
    """The cripple term's weight against the focus text's KL."""
    seed: int = 0
    """Seed of the random baseline."""
    eps: float | None = None
    """Epsilon of the score ratio cripple / (focus + eps) for both sites; default: the
    reference's runs' own, 1e-3 for MLP neurons and 1e-4 for attention pre-out neurons."""
    batch_size: int = 8
    """Windows per forward pass."""
    skip_top: int = option(50, cli=False)
    """The skip50 metrics leave out the focus / cripple data's most frequent tokens."""
    description: str = option("", cli=False)
    """What this config is for (free text, in shipped config files)."""
    model: str | None = None
    """Model name (e.g. smollm2) or checkpoint path."""
    focus: str | None = None
    """Data set to keep, e.g. text:wikitext."""
    cripple: str | None = None
    """Data set to remove, e.g. text:python."""
    out: str | None = None
    """Output directory (also the resume state); the job needs it, run_separability does not."""
    tokens: int = 100_000
    """Statistics tokens per data set."""
    eval_tokens: int | None = None
    """Held-out tokens per data set for the metrics (default: tokens)."""
    window: int = 128
    """Tokens per window."""
    text_tokens: int = 1000
    """Tokens per text with eval_protocol texts."""

    def __post_init__(self) -> None:
        if self.scoring is not None:
            self.ff_scoring = self.attn_scoring = self.scoring
        if self.fill is not None:
            self.ff_fill = self.attn_fill = self.fill
        super().__post_init__()

    @property
    def prunes_attention(self) -> bool:
        """Whether attention units are pruned at all."""
        return self.attn_frac > 0 or self.attn_heads_per_step > 0

    @property
    def method(self) -> str:
        """The selective run's name in the trajectory: the scoring(s) it uses, or ``learned``
        when the units are only learned."""
        if self.selection == "learned":
            return LEARNED
        return self.statistics_method

    @property
    def statistics_method(self) -> str:
        """The statistics run's name in the trajectory: the scoring(s) it uses."""
        used = [self.ff_scoring] if self.ff_frac > 0 or not self.prunes_attention else []
        if self.prunes_attention and self.attn_scoring not in used:
            used.append(self.attn_scoring)
        return "+".join(used)

    def validate(self) -> None:
        """Raise :class:`ConfigError` on a value out of range or not among the choices."""
        super().validate()
        if self.steps < 1:
            raise ConfigError(f"steps must be at least 1, got {self.steps}")
        for name in ("ff_frac", "attn_frac"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {value}")
        if self.attn_heads_per_step < 0:
            raise ConfigError(f"attn_heads_per_step must be >= 0, got {self.attn_heads_per_step}")
        if self.attn_heads_per_step and self.attn_unit != "head":
            raise ConfigError("attn_heads_per_step needs attn_unit='head' (--attn-unit head)")
        if self.ff_frac == 0 and not self.prunes_attention:
            raise ConfigError("nothing to prune: ff_frac and attn_frac are both 0")
        if self.schedule == "total" and not self.attn_heads_per_step:
            # every unit is gone after 1/frac steps: later steps would repeat the last one
            fracs = [f for f in (self.ff_frac, self.attn_frac) if f > 0]
            needed = max(math.ceil(1.0 / f - 1e-9) for f in fracs)
            if self.steps > needed:
                raise ConfigError(
                    f"with schedule total, {needed} steps prune every unit (ff_frac "
                    f"{self.ff_frac:g}, attn_frac {self.attn_frac:g}); steps {self.steps} would "
                    f"repeat step {needed}: use --steps {needed} or fewer"
                )
        if self.selection != "statistics":
            if self.learn_steps < 1 or self.learn_lr <= 0:
                raise ConfigError("learn_steps must be >= 1 and learn_lr > 0")
            if self.cripple_cap <= 0 or self.cripple_weight <= 0:
                raise ConfigError("cripple_cap and cripple_weight must be positive")
            if self.attn_unit != "neuron" or not (self.ff_frac > 0 and self.attn_frac > 0):
                raise ConfigError(
                    "learned separability gates MLP neurons and attention pre-out neurons "
                    "together: give ff_frac and attn_frac > 0 with attn_unit neuron"
                )
        if self.svd_combine_biases and not self.svd:
            raise ConfigError("svd_combine_biases needs svd (--svd)")
        if self.stats_correct_top_k < 0:
            raise ConfigError(f"stats_correct_top_k must be >= 0, got {self.stats_correct_top_k}")
        if self.batch_size < 1 or self.skip_top < 0 or (self.eps is not None and self.eps < 0):
            raise ConfigError("batch_size must be >= 1, skip_top >= 0 and eps >= 0")
        if self.tokens < self.window or (
            self.eval_tokens is not None and self.eval_tokens < self.window
        ):
            raise ConfigError(f"tokens and eval_tokens must be at least window ({self.window})")

    def mean_fills(self, stats: Any) -> dict:
        """The fills of removed units a step's focus statistics (an
        :class:`~mi_core.statistics.activations.ActivationStats`, or None) give: each site's
        mean where that site fills by the mean (``ff_fill`` / ``attn_fill`` keys), else
        nothing (zero)."""
        if stats is None:
            return {}
        out = {}
        if self.ff_fill == "mean" and stats.mlp is not None:
            out["ff_fill"] = stats.mlp.mean.float()
        if self.attn_fill == "mean" and stats.attn is not None:
            out["attn_fill"] = stats.attn.mean.float()
        return out

    def pruning_options(self) -> dict:
        """The options that say how to prune (the resume state's check); without JOB_FIELDS."""
        return {k: v for k, v in self.to_dict().items() if k not in JOB_FIELDS}
