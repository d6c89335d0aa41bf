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

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from mi_core.errors import ConfigError
from mi_core.pruning.profiles import PROFILES, make_prune_config, parse_seeds, parse_sparsities

__all__ = [
    "AblationSettings",
    "AttentionSettings",
    "CoreBeforeSettings",
    "GridSettings",
    "DataSettings",
    "EffectiveSizeSettings",
    "ExperimentConfig",
    "FinetuneSettings",
    "MeansSettings",
    "PruningSettings",
    "load_config",
    "parse_seed_spec",
    "resolve_config_path",
    "shipped_configs",
]

TASKS = ("mnli", "qqp")
DEVICES = ("cpu", "cuda", "auto")
#: Named joint sets of the ablation table: all core heads at once, or the three heads whose
#: single ablation changes the out-of-domain accuracy most.
JOINT_SET_NAMES = ("core", "top3")


@dataclass
class DataSettings:
    """Training data and evaluation sets (the first evaluation set is the in-domain one)."""

    train: str
    eval: list[str]
    max_train_examples: int | None = None
    """Cap on the training examples used for means, pruning and (unless set there) fine-tuning."""
    max_eval_examples: int | None = None
    """Cap on every evaluation set (the first rows are kept)."""

    def check(self) -> None:
        if len(self.eval) < 1:
            raise ConfigError("data.eval needs at least one evaluation set (in-domain first)")
        if len(set(self.eval)) != len(self.eval):
            raise ConfigError(f"data.eval lists a set twice: {self.eval}")
        _positive_or_none("data.max_train_examples", self.max_train_examples)
        _positive_or_none("data.max_eval_examples", self.max_eval_examples)


@dataclass
class FinetuneSettings:
    """Fine-tuning (``mi_core.training.FinetuneConfig``); the paper's: lr 2e-5, batch 32."""

    steps: int
    save_every: int = 500
    lr: float = 2e-5
    batch_size: int = 32
    seed: int = 0
    max_length: int = 128
    warmup_steps: int = 0
    max_train_examples: int | None = None
    """Defaults to ``data.max_train_examples``."""
    max_eval_examples: int | None = None
    """Cap on the evaluation sets during fine-tuning; defaults to ``data.max_eval_examples``."""

    def check(self) -> None:
        if self.steps < 1 or self.save_every < 1 or self.batch_size < 1:
            raise ConfigError("finetune.steps, save_every and batch_size must be at least 1")
        if not 0 < self.lr < 1:
            raise ConfigError(f"finetune.lr must lie in (0, 1), got {self.lr}")
        _positive_or_none("finetune.max_train_examples", self.max_train_examples)
        _positive_or_none("finetune.max_eval_examples", self.max_eval_examples)


@dataclass
class MeansSettings:
    """Mean activations for mean ablation, computed on ``data`` (default: the training set)."""

    data: str | None = None
    max_examples: int | None = None
    """Defaults to ``data.max_train_examples``."""
    batch_size: int = 64
    path: str | None = None
    """An existing means file for the model (then nothing is computed)."""

    def check(self) -> None:
        _positive_or_none("means.max_examples", self.max_examples)
        if self.batch_size < 1:
            raise ConfigError("means.batch_size must be at least 1")


@dataclass
class PruningSettings:
    """The pruning sweep: one run per (sparsity, seed)."""

    sparsities: list[float]
    seeds: list[int]
    profile: str = "quick"
    overrides: dict[str, Any] = field(default_factory=dict)
    """PruneConfig fields to override, e.g. ``{"steps": 200}``."""
    max_train_examples: int | None = None
    """Defaults to ``data.max_train_examples``."""
    max_eval_examples: int | None = None
    """Defaults to ``data.max_eval_examples``."""
    executor: str = "local"
    ray_address: str | None = None
    num_cpus_per_run: float = 1.0

    def check(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"pruning.profile must be one of {PROFILES}, got {self.profile!r}")
        if self.executor not in ("local", "ray"):
            raise ConfigError(f"pruning.executor must be local or ray, got {self.executor!r}")
        _positive_or_none("pruning.max_train_examples", self.max_train_examples)
        _positive_or_none("pruning.max_eval_examples", self.max_eval_examples)
        for s in self.sparsities:  # builds and validates every run's PruneConfig
            make_prune_config(self.profile, s, self.seeds[0], **self.overrides)


@dataclass
class AttentionSettings:
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

    def check(self) -> None:
        if self.max_examples < 1 or self.batch_size < 1 or self.max_heads < 1:
            raise ConfigError("attention.max_examples, batch_size and max_heads must be >= 1")
        if self.n_views < 0:
            raise ConfigError("attention.n_views must be >= 0")


@dataclass
class AblationSettings:
    """The ablation table of the core heads (Tables 3/4): single and joint ablations."""

    joint_sets: list[Any] = field(default_factory=lambda: ["core", "top3"])
    """Each entry ``"core"``, ``"top3"`` or a list of head labels, e.g. ``["L2.H5", "L4.H0"]``."""
    ablation: str = "mean"
    others: bool = True
    """Also ablate every other head, for the ``Avg. (others)`` row (one ablation per head)."""
    max_examples: int | None = None
    """Cap on every evaluation set; defaults to ``data.max_eval_examples``."""
    batch_size: int = 64

    def check(self) -> None:
        if self.ablation not in ("mean", "zero"):
            raise ConfigError(f"ablation.ablation must be mean or zero, got {self.ablation!r}")
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


@dataclass
class EffectiveSizeSettings:
    """Effective size over training (Figure 6): prune every checkpoint at every sparsity."""

    enabled: bool = False
    sparsities: list[float] = field(default_factory=lambda: parse_sparsities("0.05:0.7:0.05"))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    margin: float = 0.03
    method: str = "authors"
    """``"authors"``: their script (per seed, strict, then mean); ``"paper"``: the paper's text."""
    profile: str | None = None
    """Defaults to ``pruning.profile``."""
    overrides: dict[str, Any] | None = None
    """Defaults to ``pruning.overrides``."""
    checkpoints_dir: str | None = None
    """Directory of ``checkpoint-*``; default: the experiment's own fine-tuning run."""
    steps: list[int] | None = None
    """Only these checkpoint steps (default: every checkpoint, thinned by max_checkpoints)."""
    max_checkpoints: int | None = None
    """At most this many checkpoints, evenly spaced, always with the last one."""
    ood: list[str] | None = None
    """The out-of-domain sets; default: every evaluation set after the first."""

    def check(self) -> None:
        if not 0 <= self.margin < 1:
            raise ConfigError(f"effective_size.margin must lie in [0, 1), got {self.margin}")
        if self.method not in ("authors", "paper"):
            raise ConfigError(
                f"effective_size.method must be authors or paper, got {self.method!r}"
            )
        if self.profile is not None and self.profile not in PROFILES:
            raise ConfigError(f"effective_size.profile must be one of {PROFILES}")
        _positive_or_none("effective_size.max_checkpoints", self.max_checkpoints)


@dataclass
class GridSettings:
    """Figure 4: prune the fine-tuned model over a grid of sparsities x seeds (beyond the
    sweep's few sparsities), with the sweep's profile and overrides."""

    enabled: bool = False
    sparsities: list[float] = field(default_factory=lambda: parse_sparsities("0.1:0.7:0.1"))
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])

    def check(self) -> None:
        if not self.sparsities or not self.seeds:
            raise ConfigError("grid needs at least one sparsity and one seed")


@dataclass
class CoreBeforeSettings:
    """The core before generalisation (section 4): prune the checkpoint just before the
    out-of-domain accuracy starts to rise, with the sweep's sparsities, seeds and profile."""

    enabled: bool = False
    margin: float = 0.03
    """The rise: out-of-domain accuracy above its first evaluation by more than this."""

    def check(self) -> None:
        if not 0 <= self.margin < 1:
            raise ConfigError(f"core_before.margin must lie in [0, 1), got {self.margin}")


@dataclass
class ExperimentConfig:
    """The whole heuristic-core experiment (see the module docstring)."""

    data: DataSettings
    pruning: PruningSettings
    name: str = "experiment"
    description: str = ""
    model: str | None = None
    """The model to fine-tune (checkpoint dir, hub name or ``minilm``)."""
    task: str = "mnli"
    checkpoint: str | None = None
    """An already fine-tuned checkpoint: no fine-tuning stage."""
    device: str = "cpu"
    """Where means, pruning, attention and ablations run (``auto``: cuda when available).
    Fine-tuning runs where :func:`mi_core.training.finetune` puts the model."""
    finetune: FinetuneSettings | None = None
    means: MeansSettings = field(default_factory=MeansSettings)
    attention: AttentionSettings = field(default_factory=AttentionSettings)
    ablation: AblationSettings = field(default_factory=AblationSettings)
    effective_size: EffectiveSizeSettings = field(default_factory=EffectiveSizeSettings)
    core_before: CoreBeforeSettings = field(default_factory=CoreBeforeSettings)
    grid: GridSettings = field(default_factory=GridSettings)

    def check(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {DEVICES}, got {self.device!r}")
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
                    "effective_size needs checkpoints_dir (a directory of checkpoint-*) when the "
                    "experiment starts from a checkpoint"
                )
            ood = self.ood_sets
            if not ood:
                raise ConfigError(
                    "effective_size needs out-of-domain sets: list at least two data.eval sets"
                )
            unknown = [d for d in ood if d not in self.data.eval]
            if unknown or self.data.eval[0] in ood:
                raise ConfigError(
                    f"effective_size.ood must list data.eval sets after the first; got {ood}"
                )
        for section in (self.data, self.pruning, self.finetune, self.means, self.attention):
            if section is not None:
                section.check()
        self.ablation.check()
        self.effective_size.check()
        self.core_before.check()
        self.grid.check()
        if self.core_before.enabled and self.finetune is None:
            raise ConfigError(
                "core_before needs the fine-tuning stage (its metrics and checkpoints)"
            )

    @property
    def ood_sets(self) -> list[str]:
        """The out-of-domain evaluation sets (for effective size)."""
        if self.effective_size.ood is not None:
            return list(self.effective_size.ood)
        return list(self.data.eval[1:])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that :meth:`from_dict` reads back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, source: str = "config") -> ExperimentConfig:
        """Validate ``data`` (the parsed JSON) into a config; ConfigError names any bad key."""
        config = _build(cls, data, "", source)
        config.check()
        return config


# ------------------------------------------------------------------------------ validation
_SECTION_TYPES = {
    "data": DataSettings,
    "pruning": PruningSettings,
    "finetune": FinetuneSettings,
    "means": MeansSettings,
    "attention": AttentionSettings,
    "ablation": AblationSettings,
    "effective_size": EffectiveSizeSettings,
    "core_before": CoreBeforeSettings,
    "grid": GridSettings,
}


def _positive_or_none(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{name} must be at least 1 (or null), got {value}")


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
        return parse_seeds(text)
    if isinstance(value, list) and value:
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value):
            raise ConfigError(f"{where} must list non-negative integers, got {value}")
        if len(set(value)) != len(value):
            raise ConfigError(f"{where} repeats a seed: {value}")
        return list(value)
    raise ConfigError(f"{where} must be a count, a list of ints or a string like '1-12'")


def _parse_sparsity_spec(value: Any, where: str) -> list[float]:
    if isinstance(value, str):
        return parse_sparsities(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, list) and value:
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in value):
            raise ConfigError(f"{where} must be numbers in (0, 1), got {value}")
        return parse_sparsities(",".join(repr(float(s)) for s in value))
    raise ConfigError(f"{where} must be a list like [0.3, 0.5] or a range like '0.05:0.7:0.05'")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _check_value(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (str, int, float, bool, list, dict, Any,
    or an Optional of one)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_value(value, inner[0], where)
    if tp is Any:
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {json.dumps(value)}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_check_value(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be an object, got {json.dumps(value)}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {json.dumps(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {json.dumps(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {json.dumps(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {json.dumps(value)}")
        return value
    raise ConfigError(f"{where}: cannot check a value of type {_type_name(tp)}")  # pragma: no cover


def _build(cls: type, data: Any, prefix: str, source: str) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {where} must be a JSON object, got {json.dumps(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {unknown} in {where}; valid keys: {sorted(fields)}"
        )
    required = [
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in data]
    if missing:
        raise ConfigError(f"{source}: missing required key(s) {missing} in {where}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name in _SECTION_TYPES and prefix == "":
            if value is None and name == "finetune":
                values[name] = None  # no fine-tuning (a checkpoint is given)
            else:  # null for another section means its defaults
                section = {} if value is None else value
                values[name] = _build(_SECTION_TYPES[name], section, f"{key}.", source)
        elif name == "seeds":
            values[name] = parse_seed_spec(value, f"{source}: {key}")
        elif name == "sparsities":
            values[name] = _parse_sparsity_spec(value, f"{source}: {key}")
        elif name == "overrides" and value is not None and not isinstance(value, dict):
            raise ConfigError(f'{source}: {key} must be an object like {{"steps": 200}}')
        else:
            values[name] = _check_value(value, hints[name], f"{source}: {key}")
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # pragma: no cover - guarded by the checks above
        raise ConfigError(f"{source}: bad {where}: {exc}") from None


# -------------------------------------------------------------------------------- loading
def shipped_configs() -> list[str]:
    """Names of the configs shipped with mi_core (``mi_core/configs/*.json``)."""
    root = resources.files("mi_core") / "configs"
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(p.name[: -len(".json")] for p in entries if p.name.endswith(".json"))


def resolve_config_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A config file: ``name_or_path`` if it is a file, else the shipped config of that name."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    name = os.fspath(name_or_path)
    if name.endswith(".json"):
        name = name[: -len(".json")]
    if name in shipped_configs():
        return Path(str(resources.files("mi_core") / "configs" / f"{name}.json"))
    raise ConfigError(
        f"no config file or shipped config named {os.fspath(name_or_path)!r}; shipped configs: "
        f"{', '.join(shipped_configs()) or '(none)'}"
    )


def load_config(name_or_path: str | os.PathLike[str]) -> ExperimentConfig:
    """Read and validate a config file, or a shipped config by name (e.g. ``minilm-mnli-quick``)."""
    path = resolve_config_path(name_or_path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    return ExperimentConfig.from_dict(data, source=path.name)
