"""The heuristic-core experiment's configuration: one JSON file, validated into dataclasses.

A config names the model and task, the data (training set, evaluation sets with the in-domain
set first), how to get the fine-tuned model (``finetune`` settings or an existing
``checkpoint``), the pruning sweep (sparsities, seeds, profile and overrides), the attention-pattern
data set, the joint head sets of the ablation table and whether to measure effective size over
training. ``--config`` takes a file path or the name of a config shipped in ``mi_core/configs``
(:func:`shipped_configs` lists them)::

    {
      "name": "minilm-mnli-quick",
      "model": "minilm",
      "task": "mnli",
      "data": {"train": "mnli:train",
               "eval": ["mnli:validation_matched", "hans:so_swap", "hans:prep"],
               "max_train_examples": 2000, "max_eval_examples": 500},
      "finetune": {"steps": 280, "save_every": 140},
      "pruning": {"sparsities": [0.3, 0.5], "seeds": "1-4", "profile": "quick",
                  "overrides": {"steps": 200}},
      "attention": {"data": "hans:so_swap", "max_examples": 256, "n_views": 2},
      "ablation": {"joint_sets": ["core", "top3"]},
      "effective_size": {"enabled": false}
    }

Every section is optional except ``data`` and ``pruning``; unknown keys, missing fields and
values of the wrong type raise :class:`~mi_core.errors.ConfigError` with one line that names the
key. Relative paths (checkpoints, local data files) are relative to the working directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mi_core.config import Config, option, read_config_json, resolve_shipped, shipped_names
from mi_core.devices import DeviceOption
from mi_core.errors import ConfigError
from mi_core.interventions.config import FILLS, UNIT_FILLS, MeansSettings
from mi_core.pruning.jobs import SweepExecution
from mi_core.pruning.profiles import (
    PROFILES,
    make_prune_config,
    parse_seed_spec,
    parse_sparsities,
    parse_sparsity_spec,
)
from mi_core.tasks import NEXT_TOKEN, TASKS
from mi_core.training.config import FinetuneSettings

__all__ = [
    "AblationSettings",
    "AttentionSettings",
    "CoreBeforeSettings",
    "GridSettings",
    "DataSettings",
    "EffectiveSizeSettings",
    "ExperimentConfig",
    "FinetuneSettings",
    "ExperimentMeansSettings",
    "PruningSettings",
    "load_config",
    "parse_seed_spec",
    "resolve_config_path",
    "shipped_configs",
]


def parse_checkpoint_steps(value: Any, where: str = "steps") -> list[int]:
    """Checkpoint steps as a list of ints, or a string like ``"500,1000"``."""
    if isinstance(value, str):
        try:
            steps = [int(s) for s in value.split(",") if s.strip()]
        except ValueError:
            raise ConfigError(f"{where} must be integers like 500,1000; got {value!r}") from None
        if not steps:
            raise ConfigError(f"{where}: no checkpoint step given (e.g. 500,1000)")
        return steps
    if isinstance(value, list) and all(
        isinstance(s, int) and not isinstance(s, bool) for s in value
    ):
        return list(value)
    raise ConfigError(f"{where} must be a list of checkpoint steps or a string like '500,1000'")


def parse_groups(value: Any, where: str = "groups") -> dict[str, list[str]]:
    """Named groups of data sets: a dict, or ``"name=spec,spec"`` strings (one per group)."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        groups: dict[str, list[str]] = {}
        for item in value:
            name, sep, specs = str(item).partition("=")
            sets = [s.strip() for s in specs.split(",") if s.strip()]
            if not sep or not name.strip() or not sets:
                raise ConfigError(
                    f"{where}: expected NAME=DATA,DATA (e.g. ood_e=hans:x), not {item!r}"
                )
            groups[name.strip()] = sets
        return groups
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, list) and v and all(isinstance(s, str) for s in v)
        for k, v in value.items()
    ):
        return {k: list(v) for k, v in value.items()}
    raise ConfigError(f"{where} must map group names to lists of data sets, got {value!r}")


@dataclass
class EffectiveSizeOptions(Config):
    """How effective size is measured (paper Figure 6); shared by the job and the experiment."""

    sparsities: list[float] = option(
        default_factory=lambda: parse_sparsities("0.05:0.7:0.05"),
        parse=parse_sparsity_spec,
        metavar="SPEC",
    )
    """Target sparsities, e.g. 0.05:0.7:0.05 or 0.3,0.5."""
    seeds: list[int] = option(
        default_factory=lambda: [0, 1, 2], parse=parse_seed_spec, metavar="SPEC"
    )
    """Seeds: a count (3: seeds 0-2) or seeds like 1,2,5 / 42-44."""
    margin: float = 0.03
    """Faithfulness margin (accuracy): within this of the full model is faithful."""
    method: str = option("authors", choices=("authors", "paper"))
    """authors: their script (each seed's largest faithful sparsity, strict, then the mean);
    paper: the paper's text (accuracy averaged over seeds first)."""
    steps: list[int] | None = option(
        None, flag="--checkpoint-steps", parse=parse_checkpoint_steps, metavar="STEPS"
    )
    """Only these checkpoint steps, e.g. 500,1000 (default: every checkpoint, thinned by
    max_checkpoints)."""
    max_checkpoints: int | None = None
    """At most this many checkpoints, evenly spaced, always with the last one."""
    ood: list[str] | None = option(None, metavar="DATA")
    """The out-of-domain sets (default: every evaluation set after the first that is not of the
    training data's data set, e.g. not mnli:validation_mismatched for mnli:train, and not in
    groups)."""
    groups: dict[str, list[str]] | None = option(
        None, flag="--group", parse=parse_groups, repeat=True, metavar="NAME=DATA,DATA"
    )
    """Further named groups of evaluation sets, each an effective-size target of its own and
    part of neither in-domain nor out-of-domain, e.g. {"ood_e": [...]}: GPT-2's entailment
    subcases (OOD-E, the paper's Figure 16)."""
    revisions: list[str] | None = option(None, metavar="REV")
    """Hub revisions of the model the checkpoints name (a hub id, not a folder), each a
    checkpoint whose step is the revision's number: Pythia's step1000 step143000 (offline, the
    revisions must be in the Hugging Face cache)."""

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.margin < 1:
            raise ConfigError(f"margin must lie in [0, 1) (accuracy fractions), got {self.margin}")
        if self.max_checkpoints is not None and self.max_checkpoints < 1:
            raise ConfigError(f"max_checkpoints must be at least 1, got {self.max_checkpoints}")


@dataclass(kw_only=True)
class EffectiveSizeConfig(EffectiveSizeOptions, SweepExecution, DeviceOption):
    """The effective-size job (``mi-core effective-size``): every checkpoint of a fine-tuning
    run pruned at every sparsity and seed."""

    checkpoints: str = option(metavar="DIR")
    """Fine-tuning output directory (its checkpoint-<step> folders), or with --revisions a
    hub model id."""
    train: str
    """Training data spec, e.g. mnli:train."""
    eval: list[str] = option(metavar="DATA")
    """Eval sets; the first is in-domain."""
    out: str
    """Output directory."""
    means: str | None = None
    """Means file per checkpoint, with {step} in the path (default: computed on train)."""
    task: str | None = option(None, choices=TASKS)
    """Model task if ambiguous."""
    profile: str = option("paper", choices=PROFILES)
    """Pruning profile (the authors' recipe by default, as ``mi-core prune`` and ``sweep``)."""
    overrides: dict[str, Any] = option(default_factory=dict, cli=False)
    """PruneConfig fields that differ from the profile (the recipe flags set them)."""
    max_train_examples: int | None = None
    """Use only the first training examples."""
    max_eval_examples: int | None = None
    """Use only the first examples of every eval set."""

    def validate(self) -> None:
        super().validate()
        make_prune_config(self.profile, 0.5, 0, **self.overrides)


#: Named joint sets of the ablation table: all core heads at once, or the three heads whose
#: single ablation changes the out-of-domain accuracy most.
JOINT_SET_NAMES = ("core", "top3")


@dataclass
class DataSettings(Config):
    """Training data and evaluation sets (in-domain first)."""

    train: str
    eval: list[str]
    in_domain: list[str] | None = None
    """The in-domain evaluation sets, the first ones of ``eval`` (default: the first alone).
    The authors average MNLI ``validation_matched`` and ``validation_mismatched``; every other
    evaluation set is out-of-domain."""
    max_train_examples: int | None = None
    """Cap on the training examples used for means, pruning and (unless set there) fine-tuning."""
    max_eval_examples: int | None = None
    """Cap on every evaluation set (the first rows are kept)."""

    @property
    def in_domain_sets(self) -> list[str]:
        """The in-domain evaluation sets."""
        return list(self.in_domain) if self.in_domain else self.eval[:1]

    @property
    def out_of_domain_sets(self) -> list[str]:
        """Every evaluation set that is not in-domain."""
        return [d for d in self.eval if d not in self.in_domain_sets]

    def validate(self) -> None:
        if len(self.eval) < 1:
            raise ConfigError("data.eval needs at least one evaluation set (in-domain first)")
        if len(set(self.eval)) != len(self.eval):
            raise ConfigError(f"data.eval lists a set twice: {self.eval}")
        if self.in_domain is not None and self.in_domain != self.eval[: len(self.in_domain)]:
            raise ConfigError(
                f"data.in_domain {self.in_domain} must be the first sets of data.eval {self.eval}"
            )
        _positive_or_none("data.max_train_examples", self.max_train_examples)
        _positive_or_none("data.max_eval_examples", self.max_eval_examples)
        super().validate()  # the choices, types and bounds of every field


@dataclass
class ExperimentMeansSettings(MeansSettings):
    """Mean activations for mean ablation, computed on ``data`` (default: the training set,
    at most ``data.max_train_examples`` examples), or an existing file."""

    path: str | None = None
    """An existing means file for the model (then nothing is computed)."""

    def validate(self) -> None:
        super().validate()
        _positive_or_none("means.max_examples", self.max_examples)


@dataclass
class PruningSettings(SweepExecution):
    """The pruning sweep: one run per (sparsity, seed); where it runs (``executor``,
    ``group_size``, ...) as in :class:`~mi_core.pruning.jobs.SweepExecution`."""

    sparsities: list[float] = option(parse=parse_sparsity_spec)
    """Target sparsities: a list, or a range like "0.05:0.7:0.05"."""
    seeds: list[int] = option(parse=parse_seed_spec)
    """Seeds: a list, a count (3: seeds 0-2) or a spec like "1-12"."""
    profile: str = "paper"
    overrides: dict[str, Any] = field(default_factory=dict)
    """PruneConfig fields to override, e.g. ``{"steps": 200}``."""
    max_train_examples: int | None = None
    """Defaults to ``data.max_train_examples``."""
    max_eval_examples: int | None = None
    """Defaults to ``data.max_eval_examples``."""

    def validate(self) -> None:
        super().validate()
        if self.profile not in PROFILES:
            raise ConfigError(f"pruning.profile must be one of {PROFILES}, got {self.profile!r}")
        _positive_or_none("pruning.max_train_examples", self.max_train_examples)
        _positive_or_none("pruning.max_eval_examples", self.max_eval_examples)
        for s in self.sparsities:  # builds and validates every run's PruneConfig
            make_prune_config(self.profile, s, self.seeds[0], **self.overrides)


@dataclass
class AttentionSettings(Config):
    """Attention-pattern classes of the chosen heads (Figure 9) and example views (Figs. 7/8)."""

    data: str | None = None
    """Sentence pairs to score; default: the first out-of-domain set (else the in-domain one)."""
    max_examples: int = 256
    batch_size: int = 32
    n_views: int = 2
    """Example pairs shown as circuitsvis attention views of the chosen heads."""
    heads: list[str] | None = None
    """Heads to classify and show (``L2.H5``); default: the core (every subnetwork keeps them)."""
    max_heads: int = 12
    """Without a core (an empty intersection), the most frequently kept heads, at most this many."""
    threshold: float = 0.3
    min_excess: float = 0.1

    def validate(self) -> None:
        if self.max_examples < 1 or self.batch_size < 1 or self.max_heads < 1:
            raise ConfigError("attention.max_examples, batch_size and max_heads must be >= 1")
        if self.n_views < 0:
            raise ConfigError("attention.n_views must be >= 0")
        super().validate()  # the choices, types and bounds of every field


@dataclass
class AblationSettings(Config):
    """The ablation table of the core heads (Tables 3/4): single and joint ablations."""

    joint_sets: list[Any] = field(default_factory=lambda: ["core", "top3"])
    """Each entry ``"core"``, ``"top3"`` or a list of head labels, e.g. ``["L2.H5", "L4.H0"]``."""
    fill: str = "mean"
    """What replaces an ablated head: its mean activation (``means``) or zero."""
    others: bool = True
    """Also ablate every other head, for the ``Avg. (others)`` row (one ablation per head)."""
    max_examples: int | None = None
    """Cap on every evaluation set; defaults to ``data.max_eval_examples``."""
    batch_size: int = 64

    def validate(self) -> None:
        if self.fill not in UNIT_FILLS:
            raise ConfigError(f"ablation.fill must be mean or zero, got {self.fill!r}")
        for entry in self.joint_sets:
            if isinstance(entry, str):
                if entry not in JOINT_SET_NAMES:
                    raise ConfigError(
                        f"ablation.joint_sets entry {entry!r} must be one of {JOINT_SET_NAMES} "
                        "or a list of head labels like ['L2.H5', 'L4.H0']"
                    )
            elif not (isinstance(entry, list) and entry and all(isinstance(h, str) for h in entry)):
                raise ConfigError(
                    f"ablation.joint_sets entry {entry!r} must be 'core', 'top3' or a non-empty "
                    "list of head labels"
                )
        _positive_or_none("ablation.max_examples", self.max_examples)
        if self.batch_size < 1:
            raise ConfigError("ablation.batch_size must be at least 1")
        super().validate()  # the choices, types and bounds of every field


@dataclass
class EffectiveSizeSettings(EffectiveSizeOptions):
    """Effective size over training (Figure 6): prune every checkpoint at every sparsity."""

    enabled: bool = False
    """Run the effective_size stage."""
    profile: str | None = option(None, choices=PROFILES)
    """Defaults to pruning.profile."""
    overrides: dict[str, Any] | None = None
    """Defaults to pruning.overrides."""
    checkpoints_dir: str | None = None
    """Directory of checkpoint-*, or with ``revisions`` a hub model id; default: the
    experiment's own fine-tuning run."""


@dataclass
class GridSettings(Config):
    """Figure 4: prune the fine-tuned model over a grid of sparsities x seeds (beyond the
    sweep's few sparsities), with the sweep's profile and overrides."""

    enabled: bool = False
    sparsities: list[float] = option(
        default_factory=lambda: parse_sparsities("0.1:0.7:0.1"), parse=parse_sparsity_spec
    )
    seeds: list[int] = option(default_factory=lambda: [1, 2, 3], parse=parse_seed_spec)

    def validate(self) -> None:
        if not self.sparsities or not self.seeds:
            raise ConfigError("grid needs at least one sparsity and one seed")
        super().validate()  # the choices, types and bounds of every field


@dataclass
class CoreBeforeSettings(Config):
    """The core before generalisation (section 4): prune the checkpoint just before the
    out-of-domain accuracy starts to rise, with the sweep's sparsities, seeds and profile."""

    enabled: bool = False
    margin: float = 0.03
    """The rise: out-of-domain accuracy above its floor (the lowest value of the trained model
    at the evaluations before it; step 0 is left out) by more than this."""

    def validate(self) -> None:
        if not 0 <= self.margin < 1:
            raise ConfigError(f"core_before.margin must lie in [0, 1), got {self.margin}")
        super().validate()  # the choices, types and bounds of every field


@dataclass
class CoreEdgesSettings(Config):
    """Edges into and out of the core heads (circuits): edge scores on HANS pairs with each
    chosen subnetwork of the sweep applied (mean-ablated), for the subnetworks that generalise
    best and worst out of domain, and whether the fill measurably moves each subnetwork at all
    (the gap between it and its empty circuit)."""

    enabled: bool = False
    data: str = "hans-pairs:ln_subject/object_swap"
    """Circuit data: hans-pairs:<subcase> (HANS pairs and their identity counterparts)."""
    fill: str = option("mean", choices=FILLS)
    """What a removed edge carries: mean (each sender's mean output over training pairs, with
    the subnetwork applied: the paper's mean ablation), corrupted (the pair's counterpart,
    whose hypothesis is the premise itself: a model that follows lexical overlap answers both
    alike, so its scores may be noise) or zero."""
    mean_examples: int = 256
    """Training pairs the senders' means are taken over (fill mean)."""
    n_examples: int = 32
    """Pairs to score on."""
    method: str = option("eap", choices=("eap", "eap-ig"))
    """Edge attribution method."""
    steps: int = 5
    """EAP-IG interpolation steps."""
    ig_rule: str = option("left", choices=("left", "right"))
    """EAP-IG's sum: left (the authors' code, MIB) or right (the paper's formula)."""
    per_group: int = 2
    """Subnetworks per group: the best and the worst out-of-domain accuracy."""
    batch_size: int = 16
    """Examples per forward pass."""

    def validate(self) -> None:
        if not self.data.startswith("hans-pairs:"):
            raise ConfigError(f"core_edges.data must be hans-pairs:<subcase>, not {self.data!r}")
        if min(self.n_examples, self.per_group, self.steps, self.batch_size,
               self.mean_examples) < 1:  # fmt: skip
            raise ConfigError(
                "core_edges: n_examples, mean_examples, per_group, steps, batch_size must be >= 1"
            )
        super().validate()  # the choices, types and bounds of every field


@dataclass
class ExperimentConfig(DeviceOption):
    """The whole heuristic-core experiment (see the module docstring)."""

    data: DataSettings
    pruning: PruningSettings
    name: str = "experiment"
    """The experiment's name (the report's title)."""
    description: str = ""
    """One line on what the experiment is, shown under the report's title."""
    model: str | None = None
    """The model to fine-tune (checkpoint dir, hub name or ``minilm``)."""
    task: str = "mnli"
    """The task (``mnli`` or ``qqp``): the classifier's head and the labels; or
    ``next_token``: a language model (``checkpoint``) on prompt tasks (``data``: ``ioi:abba``,
    ``nli:hans:so_swap``, a ``.jsonl`` file), read at the answer position."""
    checkpoint: str | None = None
    """An already fine-tuned checkpoint (or, for ``next_token``, the language model): no
    fine-tuning stage."""
    finetune: FinetuneSettings | None = None
    means: ExperimentMeansSettings = field(default_factory=ExperimentMeansSettings)
    attention: AttentionSettings = field(default_factory=AttentionSettings)
    ablation: AblationSettings = field(default_factory=AblationSettings)
    effective_size: EffectiveSizeSettings = field(default_factory=EffectiveSizeSettings)
    core_before: CoreBeforeSettings = field(default_factory=CoreBeforeSettings)
    grid: GridSettings = field(default_factory=GridSettings)
    core_edges: CoreEdgesSettings = field(default_factory=CoreEdgesSettings)

    def validate(self) -> None:
        super().validate()
        if self.task not in (*TASKS, NEXT_TOKEN):
            raise ConfigError(f"task must be one of {[*TASKS, NEXT_TOKEN]}, got {self.task!r}")
        if self.task == NEXT_TOKEN:
            self._validate_language_model()
        if (self.checkpoint is None) == (self.finetune is None):
            raise ConfigError(
                "give either 'finetune' (to fine-tune 'model') or 'checkpoint' (an already "
                "fine-tuned model), not both and not neither"
            )
        if self.finetune is not None and not self.model:
            raise ConfigError("'model' is required to fine-tune (e.g. 'minilm', 'bert-base-cased')")
        es = self.effective_size
        if es.enabled:
            if self.finetune is None and es.checkpoints_dir is None:
                raise ConfigError(
                    "effective_size needs checkpoints_dir (a directory of checkpoint-*, or a hub "
                    "model id with revisions) when the experiment starts from a checkpoint"
                )
            if es.revisions and es.checkpoints_dir is None:
                raise ConfigError(
                    "effective_size.revisions needs checkpoints_dir: the hub model id"
                )
            ood = self.ood_sets
            if not ood:
                raise ConfigError(
                    "effective_size needs out-of-domain sets: list at least two data.eval sets"
                )
            grouped = [d for sets in (es.groups or {}).values() for d in sets]
            unknown = [d for d in ood + grouped if d not in self.data.out_of_domain_sets]
            if unknown or set(ood) & set(grouped):
                raise ConfigError(
                    "effective_size.ood and effective_size.groups must list out-of-domain "
                    f"data.eval sets (not in data.in_domain), each once; got {ood} and "
                    f"{es.groups}"
                )
        if self.core_before.enabled and self.finetune is None:
            raise ConfigError(
                "core_before needs the fine-tuning stage (its metrics and checkpoints)"
            )

    def _validate_language_model(self) -> None:
        """A language model on prompt tasks: its data are prompt tasks, the model is given as
        ``checkpoint`` (nothing to fine-tune), and the stages that need a fine-tuning run or
        sentence pairs are off."""
        from mi_core.data.prompt_tasks import is_prompt_spec
        from mi_core.data.text import is_text_spec

        specs = [self.data.train, *self.data.eval]
        if self.attention.data is not None:
            specs.append(self.attention.data)
        pairs = [s for s in specs if not is_prompt_spec(s)]
        if pairs:
            raise ConfigError(
                f"task {NEXT_TOKEN} reads prompt tasks (ioi, ioi:abba, nli:<pair spec>, a .jsonl "
                f"file), not sentence pairs such as {pairs[0]!r}"
            )
        scored = [s for s in specs[1:] if is_text_spec(s)]
        if scored:
            raise ConfigError(
                f"{scored[0]} is plain text: data.train may be text (a task-free subnetwork), "
                "but data.eval and attention.data are scored, so they are prompt tasks"
            )
        if self.finetune is not None:
            raise ConfigError(
                f"task {NEXT_TOKEN} prunes a language model as it is: give it as 'checkpoint', "
                "with no 'finetune'"
            )
        off = [
            name
            for name, enabled in (
                ("core_before", self.core_before.enabled),
                ("core_edges", self.core_edges.enabled),
            )  # fmt: skip
            if enabled
        ]
        if off:
            raise ConfigError(
                f"{', '.join(off)} read a fine-tuning run's evaluations and HANS pairs; turn "
                f"them off for task {NEXT_TOKEN} (a language model's circuits: mi-core circuit)"
            )

    @property
    def ood_sets(self) -> list[str]:
        """The out-of-domain evaluation sets (for effective size)."""
        if self.effective_size.ood is not None:
            return list(self.effective_size.ood)
        grouped = {d for sets in (self.effective_size.groups or {}).values() for d in sets}
        return [d for d in self.data.out_of_domain_sets if d not in grouped]


# ------------------------------------------------------------------------------ validation
def _positive_or_none(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{name} must be at least 1 (or null), got {value}")


# -------------------------------------------------------------------------------- loading
def shipped_configs() -> list[str]:
    """Names of the configs shipped with mi_core (``mi_core/configs/*.json``)."""
    return shipped_names("configs")


def resolve_config_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A config file: ``name_or_path`` if it is a file, else the shipped config of that name."""
    return resolve_shipped("configs", name_or_path)


def load_config(name_or_path: str | os.PathLike[str]) -> ExperimentConfig:
    """Read and validate a config file, or a shipped config by name (e.g. ``minilm-mnli-quick``)."""
    path = resolve_config_path(name_or_path)
    return ExperimentConfig.from_dict(read_config_json(path), source=path.name)
