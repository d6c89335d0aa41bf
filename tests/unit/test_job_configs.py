"""One config per job: the CLI's defaults are the dataclass's, and configs round-trip JSON."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math

import pytest

from mi_core.circuits.job import AttributeConfig, CircuitPruneConfig, CircuitSweepConfig
from mi_core.cli import build_parser
from mi_core.cli.flags import flag_name
from mi_core.config import field_docs
from mi_core.data.fetch import FetchConfig
from mi_core.errors import ConfigError
from mi_core.evaluation import EvalConfig
from mi_core.interventions.ablation_table import AblationTableConfig
from mi_core.interventions.means import MeansConfig
from mi_core.methods.heuristic_core.effective_size import EffectiveSizeConfig
from mi_core.methods.separability import SeparabilityConfig
from mi_core.pruning.jobs import PruneRunConfig, SweepConfig
from mi_core.pruning.profiles import PruneConfig, make_prune_config
from mi_core.training import FinetuneConfig

#: (subcommand, CLI module, config class, the required values)
JOBS = [
    (
        "finetune",
        "finetune",
        FinetuneConfig,
        {"model": "minilm", "task": "mnli", "train": "mnli:train", "out": "o", "steps": 5},
    ),
    ("means", "means", MeansConfig, {"model": "minilm", "out": "m.safetensors"}),
    (
        "ablate",
        "ablate",
        AblationTableConfig,
        {"model": "minilm", "heads": "all", "data": ["hans:so_swap"], "out": "t.csv", "means": "m"},
    ),
    ("eval", "eval", EvalConfig, {"model": "minilm", "data": ["hans:so_swap"], "out": "r.csv"}),
    (
        "prune",
        "prune",
        PruneRunConfig,
        {"model": "minilm", "train": "mnli:train", "out": "o", "sparsity": 0.5},
    ),
    (
        "sweep",
        "sweep",
        SweepConfig,
        {"model": "m", "train": "mnli:train", "out": "o", "sparsities": [0.5], "seeds": [1, 2]},
    ),
    (
        "effective-size",
        "effective_size",
        EffectiveSizeConfig,
        {"checkpoints": "ft", "train": "mnli:train", "eval": ["a", "b"], "out": "o"},
    ),
    (
        "separability",
        "separability",
        SeparabilityConfig,
        {"model": "smollm2", "focus": "text:wikitext", "cripple": "text:python"},
    ),
    ("circuit attribute", "circuit", AttributeConfig, {"model": "smollm2", "out": "c"}),
    ("circuit prune", "circuit", CircuitPruneConfig, {"model": "smollm2", "out": "c"}),
    (
        "circuit sweep",
        "circuit",
        CircuitSweepConfig,
        {"model": "smollm2", "out": "c", "sparsities": [0.9, 0.95], "seeds": [1, 2]},
    ),
    ("data fetch", "data", FetchConfig, {}),
]
IDS = [job[0] for job in JOBS]


def _argv(command: str, cls: type, values: dict) -> list[str]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    argv = command.split()
    for name, value in values.items():
        flag = flag_name(fields[name])
        if isinstance(value, list):
            spec = ",".join(map(str, value)) if fields[name].metadata.get("parse") else None
            argv += [flag, spec] if spec else [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


@pytest.mark.parametrize(("command", "module", "cls", "required"), JOBS, ids=IDS)
def test_cli_defaults_are_the_dataclass_defaults(command, module, cls, required):
    args = build_parser().parse_args(_argv(command, cls, required))
    if command == "separability":
        args.config = None
    parsed = importlib.import_module(f"mi_core.cli.{module}").config_from_args(args)
    assert parsed == cls(**required)


@pytest.mark.parametrize(("command", "module", "cls", "required"), JOBS, ids=IDS)
def test_every_field_has_a_documented_flag_and_round_trips(command, module, cls, required):
    config = cls(**required)
    assert cls.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    parser = build_parser()
    sub = parser
    for word in command.split():  # nested commands: mi-core circuit attribute
        sub = sub._subparsers._group_actions[0].choices[word]  # noqa: SLF001
    flags = {s for action in sub._actions for s in action.option_strings}  # noqa: SLF001
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        name = flag_name(f)
        assert name in flags or f"--no-{name[2:]}" in flags, name
        assert docs.get(f.name), f"{cls.__name__}.{f.name} has no field docstring (its --help)"


def test_a_recipe_flag_overrides_the_profile_and_only_it():
    args = build_parser().parse_args(
        _argv("prune", PruneRunConfig, JOBS[4][3]) + ["--steps", "30", "--dropout", "off"]
    )
    config = importlib.import_module("mi_core.cli.prune").config_from_args(args)
    assert config.overrides == {"steps": 30, "dropout": False}
    assert config.prune_config() == make_prune_config("paper", 0.5, 42, steps=30, dropout=False)
    assert config.prune_config() != PruneRunConfig(**JOBS[4][3]).prune_config()


def test_a_config_file_round_trips(tmp_path):
    config = SweepConfig.from_dict({**JOBS[5][3], "overrides": {"steps": 30}})
    assert SweepConfig.from_json(config.to_json(tmp_path / "sweep.json")) == config
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="bad.json is not valid JSON"):
        SweepConfig.from_json(tmp_path / "bad.json")


def test_seed_specs_mean_the_same_everywhere():
    """A bare count means seeds 0..N-1 in every job (sweep, effective size, the experiment)."""
    sweep = SweepConfig.from_dict({**JOBS[5][3], "seeds": "3"})
    effective = EffectiveSizeConfig.from_dict({**JOBS[6][3], "seeds": "3"})
    assert sweep.seeds == effective.seeds == [0, 1, 2]
    assert SweepConfig.from_dict({**JOBS[5][3], "seeds": "42-44"}).seeds == [42, 43, 44]


def test_every_pruning_entry_point_defaults_to_the_authors_profile():
    """``--profile`` means the same everywhere: ``paper`` for prune, sweep, effective size and
    the experiment (the embedded demo's config asks for ``quick`` itself)."""
    from mi_core.methods.heuristic_core.config import PruningSettings, load_config

    assert PruneRunConfig.from_dict(JOBS[4][3]).profile == "paper"
    assert SweepConfig.from_dict(JOBS[5][3]).profile == "paper"
    assert EffectiveSizeConfig.from_dict(JOBS[6][3]).profile == "paper"
    assert PruningSettings(sparsities=[0.5], seeds=[1]).profile == "paper"
    assert load_config("minilm-mnli-quick").pruning.profile == "cofi"  # faithful on a CPU


def test_the_experiment_flags_are_its_fields_over_the_config_file(tmp_path):
    """``mi-core heuristic-core``: with no flags, the config is the file's; each top-level
    field has a generated flag; ``--set section.key=value`` reaches nested sections."""
    from mi_core.cli.heuristic_core import config_from_args
    from mi_core.methods.heuristic_core.config import ExperimentConfig, load_config

    parser = build_parser()
    base = ["heuristic-core", "--config", "minilm-mnli-quick", "--out", str(tmp_path)]
    assert config_from_args(parser.parse_args(base)) == load_config("minilm-mnli-quick")
    flags = {flag_name(f) for f in dataclasses.fields(ExperimentConfig)}
    help_text = parser._subparsers._group_actions[0].choices["heuristic-core"].format_help()
    for flag in ("--model", "--task", "--checkpoint", "--device", "--name"):
        assert flag in flags and flag in help_text
    args = parser.parse_args(
        [*base, "--task", "qqp", "--set", "pruning.profile=cofi",
         "--set", "pruning.sparsities=[0.2, 0.4]", "--set", "attention.max_examples=7"]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.task == "qqp" and config.pruning.profile == "cofi"
    assert config.pruning.sparsities == [0.2, 0.4] and config.attention.max_examples == 7
    assert config.pruning.seeds == load_config("minilm-mnli-quick").pruning.seeds
    for bad, words in [
        ("pruning.profil=cofi", "profil"),
        ("pruning", "SECTION.KEY=VALUE"),
        ("pruning.profile=fast", "profile"),
        ("name.x=1", "not a section"),
    ]:
        with pytest.raises(ConfigError, match=words):
            config_from_args(parser.parse_args([*base, "--set", bad]))


def test_validation_is_one_place_and_one_line():
    with pytest.raises(ConfigError, match="sparsity_estimate must be one of"):
        make_prune_config("paper", 0.5, 1, sparsity_estimate="median")
    with pytest.raises(ConfigError, match="unknown key"):
        SweepConfig.from_dict({**JOBS[5][3], "sparsity": 0.5})
    with pytest.raises(ConfigError, match="missing required key"):
        FinetuneConfig.from_dict({"model": "m"})
    job = {"model": "m", "task": "mnli", "train": "mnli:train", "out": "o", "steps": 10}
    with pytest.raises(ConfigError, match=r"^save_every must be at least 1, got 0$"):
        FinetuneConfig.from_dict({**job, "save_every": 0})  # it had named steps, which was fine
    with pytest.raises(ConfigError, match="must be an integer"):
        PruneConfig.from_dict({**make_prune_config("quick", 0.5, 1).to_dict(), "steps": "5"})


def test_a_no_flag_says_it_switches_its_option_off():
    """``--no-connected`` reused the field's docstring, which describes the option switched on:
    its help read as if the flag turned it on."""
    parser = build_parser()
    circuit = parser._subparsers._group_actions[0].choices["circuit"]
    attribute = circuit._subparsers._group_actions[0].choices["attribute"]
    (action,) = [a for a in attribute._actions if "--no-connected" in a.option_strings]
    assert action.help.startswith("Switch off (on by default): ")
    assert parser.parse_args(["circuit", "attribute", "--model", "m", "--out", "o",
                              "--no-connected"]).connected is False  # fmt: skip


def test_flags_override_a_config_files_shorthand_and_switch_its_booleans_off(tmp_path):
    """A file's "scoring" beat --ff-scoring (the shorthand was expanded after merging), and a
    file's "random_baseline": true could not be switched off (no --no-random)."""
    import json

    from mi_core.cli.heuristic_core import config_from_args as experiment_from_args
    from mi_core.cli.separability import config_from_args

    path = tmp_path / "sep.json"
    path.write_text(json.dumps({"scoring": "abs", "fill": "mean", "random_baseline": True,
                                "model": "m", "focus": "f", "cripple": "c"}))  # fmt: skip
    parser = build_parser()
    base = ["separability", "--config", str(path), "--out", "o"]
    config = config_from_args(parser.parse_args([*base, "--ff-scoring", "freq", "--no-random",
                                                 "--attn-fill", "zero"]))  # fmt: skip
    assert (config.ff_scoring, config.attn_scoring, config.random_baseline) == (
        "freq", "abs", False,
    )  # fmt: skip
    assert (config.ff_fill, config.attn_fill) == ("mean", "zero")  # the file's fill, overridden
    assert config_from_args(parser.parse_args(base)).random_baseline is True
    # heuristic-core --checkpoint with a shipped config (which fine-tunes): start from it
    args = ["heuristic-core", "--config", "minilm-mnli-quick", "--out", "o", "--checkpoint", "c"]
    experiment = experiment_from_args(parser.parse_args(args))
    assert experiment.finetune is None and experiment.checkpoint == "c"


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: FinetuneConfig(model="m", task="mnli", train="t", out="o", steps=2,
                                warmup_steps=-5), "warmup_steps must be at least 0"),
        (lambda: FinetuneConfig(model="m", task="mnli", train="t", out="o", steps=2,
                                weight_decay=-1.0), "weight_decay must be at least 0"),
    ],
)  # fmt: skip
def test_out_of_range_fine_tuning_values_are_refused(build, says):
    with pytest.raises(ConfigError, match=says):
        build().validate()


def test_values_that_ran_and_reported_nonsense_are_refused():
    from mi_core.circuits.evaluate import CircuitScore, curve_difference
    from mi_core.evaluation.config import EvalConfig
    from mi_core.interventions.config import AblationTableConfig
    from mi_core.methods.heuristic_core.config import parse_checkpoint_steps

    # a one-point curve has no area: NaN, where 0 read as a perfect CMD
    point = CircuitScore(n_edges=1, fraction=0.5, metric=1.02, full=1.0, empty=0.0,
                         faithfulness=1.02, kl=0.0)  # fmt: skip
    assert math.isnan(curve_difference([point, point]))
    with pytest.raises(ConfigError, match="name the same file"):
        EvalConfig(model="m", data=["d"], out="p.jsonl", predictions="p.jsonl").validate()
    with pytest.raises(ConfigError, match="--heads is empty"):
        AblationTableConfig(model="m", heads=" ", data=["d"], out="t.csv").validate()
    with pytest.raises(ConfigError, match="no checkpoint step given"):
        parse_checkpoint_steps(",")


def test_bounds_declared_on_fields_are_checked_by_the_one_validator():
    """A field's bounds live on the field (option(gt=..., lt=...)) and Config.validate checks
    them, with the value's type and finiteness; PruneConfig keeps no hand-written copy."""
    import dataclasses
    import inspect

    from mi_core.config import Config, option
    from mi_core.errors import ConfigError
    from mi_core.pruning import PruneConfig, make_prune_config

    @dataclasses.dataclass(frozen=True)
    class Job(Config):
        fraction: float = option(0.5, gt=0.0, lt=1.0)
        steps: int = option(10, gt=0)
        decay: float = option(0.0, ge=0.0, lt=1.0)
        maybe: int | None = option(None, ge=1)
        scale: float = 1.0

    assert isinstance(Job(scale=2).scale, float) and Job(maybe=None).maybe is None
    for changes, says in [
        ({"fraction": 1.0}, "fraction must lie strictly between 0 and 1, got 1.0"),
        ({"fraction": 0}, "fraction must lie strictly between 0 and 1, got 0"),
        ({"steps": 0}, "steps must be positive, got 0"),
        ({"steps": 2.5}, "steps must be an integer, got 2.5"),
        ({"steps": True}, "steps must be an integer, got True"),
        ({"decay": 1.0}, r"decay must lie in \[0, 1\), got 1.0"),
        ({"maybe": 0}, "maybe must be at least 1, got 0"),
        ({"scale": float("nan")}, "scale must be finite, got nan"),
        ({"scale": "2"}, "scale must be a number, got '2'"),
    ]:
        with pytest.raises(ConfigError, match=says):
            Job(**changes)
    cfg = make_prune_config("quick", 0.5, 1)
    for changes, says in [
        ({"target_sparsity": 1.0}, "target_sparsity must lie strictly between 0 and 1"),
        ({"steps": 0}, "steps must be positive"),
        ({"seed": -1}, "seed must be non-negative"),
        ({"eval_every": -1}, "eval_every must be non-negative"),
        ({"weight_decay": 1.0}, r"weight_decay must lie in \[0, 1\)"),
        ({"warmup_steps": cfg.steps + 1}, r"warmup_steps must lie in \[0, steps="),
        ({"dropout": 1}, "dropout must be true or false"),
    ]:
        with pytest.raises(ConfigError, match=says):
            cfg.replace(**changes)
    assert "must be positive" not in inspect.getsource(PruneConfig.validate)


def test_every_config_section_runs_the_one_validator():
    """A section with checks of its own still gets its fields' choices and types checked at
    construction (core_edges.method had been checked only when its stage ran, hours later)."""
    from mi_core.data.fetch import FetchConfig
    from mi_core.errors import ConfigError, DataError
    from mi_core.methods.heuristic_core.config import CoreEdgesSettings, GridSettings

    with pytest.raises(ConfigError, match="method must be one of"):
        CoreEdgesSettings(method="eap-xl")
    with pytest.raises(ConfigError, match="ig_rule must be one of"):
        CoreEdgesSettings(ig_rule="middle")
    with pytest.raises(ConfigError, match="steps must be an integer"):
        CoreEdgesSettings(steps=2.5)
    assert GridSettings().enabled in (True, False)
    with pytest.raises(DataError, match="sets must be some of"):  # its own check speaks first
        FetchConfig(sets=["mnli", "imagenet"])
