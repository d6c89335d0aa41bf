"""Pruning hyperparameters: one validated dataclass, named profiles, and CLI list parsers.

Three profiles:

* ``paper`` -- the authors' recipe (appendix B and their public code, princeton-nlp/Heuristic-Core):
  steps from :func:`paper_schedule`, batch 32 x 4 gradient accumulation (effective 128), lr 0.1
  for ``log_alpha`` and 1 for the lambdas, max length 128; the Lagrangian on the sparsity of the
  *sampled* gates; ``log_alpha ~ N(10, 0.01)``; AdamW with weight decay 0.01 on the gates and the
  lambdas, the learning rate warmed up over 200 steps then decayed linearly to 0, gradient norm
  clipped at 1; the pruned model with the checkpoint's dropout; the authors' discretisation.
* ``quick`` -- the ``paper`` recipe on a short schedule for 2 CPU cores (600 steps of 16),
  with ``log_alpha ~ N(3, 0.01)`` instead of N(10, 0.01) so that the gates move within it: a
  departure from the recipe (why, and the variants tried: experiments/README.md, "Finding the
  quick profile").
* ``cofi`` -- CoFi's mechanics on the paper's schedule: the closed-form
  expected L0 in the Lagrangian, every ``log_alpha`` at ``log 99``, AdamW without weight decay,
  a constant learning rate, no clipping, no dropout, exact top-k discretisation.

Every value can be overridden through :func:`make_prune_config` (and ``mi-core prune`` flags),
so each difference between ``paper`` and ``cofi`` can be switched on or off alone.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from mi_core.config import Config, option
from mi_core.devices import PRECISIONS
from mi_core.errors import ConfigError
from mi_core.interventions.config import UNIT_FILLS
from mi_core.pruning.constants import (
    AUTO_OBJECTIVE,
    BETA,
    DISCRETIZE_RULES,
    DROPRATE_INIT,
    LIMIT_LEFT,
    LIMIT_RIGHT,
    OBJECTIVE_NAMES,
    PAPER_INIT_MEAN,
    PAPER_INIT_STD,
    SPARSITY_ESTIMATES,
    initial_log_alpha,
)
from mi_core.pruning.schedule import LR_SCHEDULES, lr_factor, paper_schedule

PROFILES = ("paper", "quick", "cofi")
SPARSITY_WEIGHTINGS = ("components", "params")


@dataclass(frozen=True)
class PruneConfig(Config):
    """Every hyperparameter of one L0 pruning run; validated on construction.

    :func:`make_prune_config` builds one from a profile; every field but ``profile``,
    ``target_sparsity`` and ``seed`` is also an ``mi-core prune`` / ``sweep`` /
    ``effective-size`` flag that overrides the profile's value.
    """

    profile: str = option(choices=PROFILES, cli=False)
    """The profile the other values came from (paper, quick or cofi)."""
    target_sparsity: float = option(cli=False, gt=0.0, lt=1.0)
    """Fraction of the components (or parameters) to remove, in (0, 1)."""
    seed: int = option(cli=False, ge=0)
    """Seed of the gates' initialisation, noise and data order."""
    steps: int = option(gt=0)
    """Total steps (optimizer updates, not micro-batches); the warm-ups scale with it unless
    given."""
    warmup_steps: int = option(ge=0)
    """Steps over which the target sparsity ramps linearly from 0 to target_sparsity."""
    batch_size: int = option(gt=0)
    """Examples per micro-batch; the effective batch is batch_size * grad_accumulation."""
    grad_accumulation: int = option(gt=0)
    """Micro-batches per step."""
    lr_log_alpha: float = option(gt=0.0)
    """Learning rate of the gates' log_alpha."""
    lr_lambda: float = option(gt=0.0)
    """Learning rate (ascent) of the Lagrangian lambdas."""
    max_length: int = option(gt=0)
    """Token limit per example (batches pad to their longest example, not to this)."""
    eval_every: int = option(ge=0)
    """Steps between evaluations of the subnetwork as it stands (its gates discretised at the
    step's target) on the first 2,000 examples of the first eval set, logged as
    ``eval_accuracy`` / ``eval_sparsity``; 0 turns them off."""
    checkpoint_every: int = option(gt=0)
    """Steps between checkpoints."""
    eval_batch_size: int = option(gt=0)
    """Batch size of the reference logits and the evaluations."""
    sparsity_weighting: str = option("components", choices=SPARSITY_WEIGHTINGS)
    """``"components"``: heads and MLPs count once each (the paper); ``"params"``: by size."""
    fill: str = option("mean", choices=UNIT_FILLS)
    """What a removed component is replaced by: its mean activation or zero."""
    beta: float = option(BETA, gt=0.0)
    """Hard-concrete temperature."""
    sparsity_estimate: str = option("sampled", choices=SPARSITY_ESTIMATES)
    """Sparsity in the Lagrangian term: ``"sampled"`` gates of the step (the authors) or the
    closed-form ``"expected"`` L0 (CoFi)."""
    log_alpha_init: float = PAPER_INIT_MEAN
    """Mean of the initial ``log_alpha`` (the authors: 10; CoFi: ``log 99``)."""
    log_alpha_init_std: float = option(PAPER_INIT_STD, ge=0.0)
    """Std of the initial ``log_alpha``, drawn from the run's seed (the authors: 0.01)."""
    weight_decay: float = option(0.01, ge=0.0, lt=1.0)
    """AdamW's decoupled weight decay on ``log_alpha`` (the authors: 0.01, torch's default)."""
    lambda_weight_decay: float = option(0.01, ge=0.0, lt=1.0)
    """AdamW's weight decay on the Lagrangian lambdas (the authors: 0.01, the same optimizer)."""
    lr_warmup_steps: int = option(200, ge=0)
    """Steps of linear learning-rate warm-up (then linear decay to 0 with ``lr_schedule``)."""
    lr_schedule: str = option("linear", choices=LR_SCHEDULES)
    """``"linear"``: warm-up then linear decay to 0 (the authors); ``"constant"`` (CoFi)."""
    max_grad_norm: float = option(1.0, ge=0.0)
    """Clip the gradient norm of gates and lambdas together at this value; 0 turns it off."""
    dropout: bool = option(True, bool_flag="on-off")
    """Run the pruned model with the checkpoint's dropout (the authors prune in train mode); the
    cached full-model logits are always computed without dropout."""
    discretize: str = option("reference", choices=DISCRETIZE_RULES)
    """``"reference"``: the authors' per-module rounding and threshold grid; ``"exact"``: remove
    exactly ``round(target * n)`` components by ``log_alpha``."""
    objective: str = option(AUTO_OBJECTIVE, choices=OBJECTIVE_NAMES)
    """What the mask minimises besides the sparsity penalty (:mod:`mi_core.pruning.objectives`):
    ``answer_kl`` (the KL to the full model at the answer: the paper), ``every_position_kl``
    (plain text), ``logit_diff`` (the squared gap to the full model's answer-minus-distractor
    logit difference, prompt tasks); ``auto``: every_position_kl on plain text, else
    answer_kl."""
    precision: str = option("fp32", choices=PRECISIONS)
    """fp32; tf32 (float32 tensors, the steps' matrix products in TensorFloat-32 on GPUs that
    have it: the GPU default of many frameworks, not of torch); or autocast of the pruned model's
    forward pass to bf16 or fp16 (with loss scaling). Gates, lambdas and optimizer state stay
    float32 in every case."""

    def validate(self) -> None:
        super().validate()  # every field's type, bounds and choices, as declared above
        for name in ("warmup_steps", "lr_warmup_steps"):  # bounded by another field
            if getattr(self, name) > self.steps:
                raise ConfigError(
                    f"{name} must lie in [0, steps={self.steps}], got {getattr(self, name)}"
                )

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.grad_accumulation


#: The authors' mechanics (their code) that distinguish ``paper`` and ``quick`` from ``cofi``.
PAPER_MECHANICS: dict[str, Any] = dict(
    sparsity_estimate="sampled",
    log_alpha_init=PAPER_INIT_MEAN,
    log_alpha_init_std=PAPER_INIT_STD,
    weight_decay=0.01,
    lambda_weight_decay=0.01,
    lr_warmup_steps=200,
    lr_schedule="linear",
    max_grad_norm=1.0,
    dropout=True,
    discretize="reference",
)
#: CoFi's mechanics (the ``cofi`` profile): what it sets where :data:`PAPER_MECHANICS` sets the
#: authors'.
COFI_MECHANICS: dict[str, Any] = dict(
    sparsity_estimate="expected",
    log_alpha_init=initial_log_alpha(DROPRATE_INIT),
    log_alpha_init_std=0.0,
    weight_decay=0.0,
    lambda_weight_decay=0.0,
    lr_warmup_steps=0,
    lr_schedule="constant",
    max_grad_norm=0.0,
    dropout=False,
    discretize="exact",
)
#: Steps of the quick profile (batch 16, no accumulation).
QUICK_STEPS = 600
#: Where the quick profile's log_alpha starts (the mean of N(3, 0.01)): a sampled gate is below 1
#: a fifth of the time there, so the gates get gradients within its short schedule
#: (experiments/README.md, "Finding the quick profile").
QUICK_INIT = 3.0


def _paper_schedule_values(target_sparsity: float) -> dict[str, Any]:
    warmup, total = paper_schedule(target_sparsity)
    return dict(
        steps=total,
        warmup_steps=warmup,
        batch_size=32,
        grad_accumulation=4,
        lr_log_alpha=0.1,
        lr_lambda=1.0,
        max_length=128,
        eval_every=64,
        checkpoint_every=64,
        eval_batch_size=128,
    )


def _profile_values(profile: str, target_sparsity: float) -> dict[str, Any]:
    if profile == "paper":
        return {**_paper_schedule_values(target_sparsity), **PAPER_MECHANICS}
    if profile == "cofi":
        return {**_paper_schedule_values(target_sparsity), **COFI_MECHANICS}
    if profile == "quick":
        # The paper's recipe scaled to QUICK_STEPS (the target ramp and the lr warm-up keep their
        # share of the run), log_alpha starting at QUICK_INIT: experiments/README.md, "Finding
        # the quick profile" says what each value is and why.
        warmup, total = paper_schedule(target_sparsity)
        steps = QUICK_STEPS
        return dict(
            PAPER_MECHANICS,
            steps=steps,
            warmup_steps=round(steps * warmup / total),
            batch_size=16,
            grad_accumulation=1,
            lr_log_alpha=0.1,
            lr_lambda=1.0,
            max_length=128,
            eval_every=50,
            checkpoint_every=50,
            eval_batch_size=128,
            lr_warmup_steps=round(steps * 200 / total),
            log_alpha_init=QUICK_INIT,
        )
    raise ConfigError(f"unknown profile {profile!r}; choose one of {PROFILES}")


def make_prune_config(
    profile: str, target_sparsity: float, seed: int, **overrides: Any
) -> PruneConfig:
    """The named profile's config for ``target_sparsity`` and ``seed``, with ``overrides`` applied.

    Any field can be overridden. ``steps=N`` without ``warmup_steps`` (or ``lr_warmup_steps``)
    keeps the profile's warm-up fraction: ``warmup_steps = round(N * profile_warmup /
    profile_steps)``, and likewise for the learning-rate warm-up.
    """
    if not isinstance(target_sparsity, (int, float)) or not 0.0 < target_sparsity < 1.0:
        raise ConfigError(
            f"target_sparsity must lie strictly between 0 and 1, got {target_sparsity!r}"
        )
    values = _profile_values(profile, target_sparsity)
    fixed = {"profile", "target_sparsity", "seed"}
    names = {f.name for f in dataclasses.fields(PruneConfig)} - fixed
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"unknown pruning option(s) {unknown}; valid options: {sorted(names)}")
    steps = overrides.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
        scaled = {
            name: round(steps * values[name] / values["steps"])
            for name in ("warmup_steps", "lr_warmup_steps")
            if name not in overrides
        }
        overrides = {**overrides, **scaled}
    values.update(overrides)
    return PruneConfig(profile=profile, target_sparsity=target_sparsity, seed=seed, **values)


def gate_travel(cfg: PruneConfig, steps: int | None = None) -> float:
    """How far a gate's ``log_alpha`` can move over the run (or over ``steps`` steps of the same
    schedule, its warm-up scaled as :func:`make_prune_config` scales it): Adam moves a
    parameter by about its learning rate a step at most, so ``lr_log_alpha`` times the sum of
    the schedule's factors."""
    n = cfg.steps if steps is None else steps
    warmup = round(n * cfg.lr_warmup_steps / cfg.steps)
    factors = (lr_factor(t, warmup, n, cfg.lr_schedule) for t in range(n))
    return cfg.lr_log_alpha * math.fsum(factors)


def unreachable_target(cfg: PruneConfig) -> str | None:
    """Why the run's gates cannot reach their target in its steps (None when they can): a gate
    starting at ``log_alpha_init`` must get down to ``beta * log(-l / r)``, where it is zero
    half the time, for any component to be removed with confidence; a run whose gates can move
    less than that removes few or none (``quick`` with 20 steps removed 0 of 78)."""
    half = cfg.beta * math.log(-LIMIT_LEFT / LIMIT_RIGHT)
    needed = cfg.log_alpha_init - half
    travel = gate_travel(cfg)
    if travel >= needed:
        return None
    if cfg.lr_log_alpha > 0:  # the fewest steps of this schedule that would do
        low, high = cfg.steps, cfg.steps
        while gate_travel(cfg, high) < needed and high < 10**7:
            low, high = high, high * 2
        while low < high:
            middle = (low + high) // 2
            low, high = (middle + 1, high) if gate_travel(cfg, middle) < needed else (low, middle)
        more = f"give about {high} steps"
    else:
        more = "give a positive lr_log_alpha"
    return (
        f"the {cfg.profile} profile cannot reach its target in {cfg.steps} steps: a gate moves "
        f"at most {travel:.2f} in log_alpha (about lr_log_alpha {cfg.lr_log_alpha:g} a step), "
        f"from {cfg.log_alpha_init:.2f} to {cfg.log_alpha_init - travel:.2f}, short of "
        f"{half:.2f}, where it is zero half the time; "
        + (
            "the exact rule will remove the target's count ranked by gates that barely moved"
            if cfg.discretize == "exact"
            else "few or no components will be removed"
        )
        + f": {more}, or a higher lr_log_alpha"
    )


#: The most seeds, or sparsities, one sweep takes: every pair of them is a pruning run.
MAX_LIST = 10_000
_INT = re.compile(r"^\d+$")
_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")


def _seed_list(spec: str) -> list[int]:
    """Parse ``"42-53"`` (inclusive), ``"1,2,5"`` or a mix like ``"42-45,50"`` into seeds; a
    lone ``"3"`` is seed 3 here. The public reader is :func:`parse_seed_spec`, where a bare
    count ``"3"`` means seeds 0-2, as on the command line."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"empty seed list {spec!r}; use e.g. '42-53', '1,2,5' or '42-45,50'")
    seeds: list[int] = []
    for item in spec.split(","):
        item = item.strip()
        if _INT.match(item):
            seeds.append(int(item))
        elif match := _RANGE.match(item):
            start, stop = int(match.group(1)), int(match.group(2))
            if start > stop:
                raise ConfigError(f"seed range {item!r} runs backwards; write {stop}-{start}")
            if stop - start >= MAX_LIST:
                raise ConfigError(
                    f"seed range {item!r} holds {stop - start + 1} seeds; a sweep takes at most "
                    f"{MAX_LIST} (each seed is a run at every sparsity)"
                )
            seeds.extend(range(start, stop + 1))
        else:
            raise ConfigError(
                f"bad seed entry {item!r} in {spec!r}; use non-negative integers and inclusive "
                "ranges, e.g. '42-53', '1,2,5' or '42-45,50'"
            )
    _check_list(seeds, spec, "seed list", "seed(s)")
    return seeds


def _check_list(values: list, spec: str, what: str, items: str) -> None:
    """At most :data:`MAX_LIST` values, none twice (counted in one pass, so a long list costs
    linear time, not a comparison of every pair)."""
    if len(values) > MAX_LIST:
        raise ConfigError(f"{what} {spec!r} holds {len(values)} values; at most {MAX_LIST}")
    duplicates = sorted(v for v, n in collections.Counter(values).items() if n > 1)
    if duplicates:
        raise ConfigError(f"{what} {spec!r} repeats {items} {duplicates[:10]}")


def _parse_fraction(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"bad sparsity {text!r} in {spec!r}; use numbers like '0.5,0.7' or a range "
            "'start:stop:step' like '0.05:0.7:0.05'"
        ) from None
    if not math.isfinite(value):
        raise ConfigError(f"sparsity {text!r} in {spec!r} is not finite")
    return value


def parse_sparsities(spec: str) -> list[float]:
    """Parse ``"0.5,0.7"``, an inclusive range ``"0.05:0.7:0.05"``, or a comma-separated mix.

    Range values are computed as ``start + i * step`` and rounded to 10 decimals, so
    ``0.05:0.7:0.05`` gives exactly ``[0.05, 0.1, ..., 0.7]`` (14 values). Every sparsity must
    lie strictly between 0 and 1.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"empty sparsity list {spec!r}; use e.g. '0.5,0.7' or '0.05:0.7:0.05'")
    values: list[float] = []
    for item in spec.split(","):
        item = item.strip()
        parts = item.split(":")
        if len(parts) == 1:
            values.append(_parse_fraction(parts[0], spec))
        elif len(parts) == 3:
            start, stop, step = (_parse_fraction(p, spec) for p in parts)
            if step <= 0:
                raise ConfigError(f"sparsity range {item!r} needs a positive step, got {step}")
            if start > stop:
                raise ConfigError(f"sparsity range {item!r} runs backwards (start > stop)")
            count = math.floor((stop - start) / step + 1e-9) + 1
            if count > MAX_LIST:
                raise ConfigError(
                    f"sparsity range {item!r} holds {count} values; a sweep takes at most "
                    f"{MAX_LIST}"
                )
            values.extend(round(start + i * step, 10) for i in range(count))
        else:
            raise ConfigError(
                f"bad sparsity entry {item!r} in {spec!r}; a range is 'start:stop:step', "
                "e.g. '0.05:0.7:0.05'"
            )
    outside = [v for v in values if not 0.0 < v < 1.0]
    if outside:
        raise ConfigError(f"sparsities must lie strictly between 0 and 1, got {outside}")
    _check_list(values, spec, "sparsity list", "value(s)")
    return values


def parse_seed_spec(value: Any, where: str = "seeds") -> list[int]:
    """Seeds as a list of ints, a string like ``"1-12"`` / ``"1,2,5"``; a bare count ``N`` (an
    int in JSON, or ``"N"`` without a range/comma on the command line) means seeds ``0..N-1``."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be a count, a list of ints or a string like '1-12'")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"{where}: a seed count must be at least 1, got {value}")
        return list(range(value))
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return parse_seed_spec(int(text), where)
        return _seed_list(text)
    if isinstance(value, list) and value:
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value):
            raise ConfigError(f"{where} must list non-negative integers, got {value}")
        if len(set(value)) != len(value):
            raise ConfigError(f"{where} repeats a seed: {value}")
        return list(value)
    raise ConfigError(f"{where} must be a count, a list of ints or a string like '1-12'")


def parse_sparsity_spec(value: Any, where: str = "sparsities") -> list[float]:
    if isinstance(value, str):
        return parse_sparsities(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, list) and value:
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in value):
            raise ConfigError(f"{where} must be numbers in (0, 1), got {value}")
        return parse_sparsities(",".join(repr(float(s)) for s in value))
    raise ConfigError(f"{where} must be a list like [0.3, 0.5] or a range like '0.05:0.7:0.05'")
