"""The circuit jobs' configs (``mi-core circuit attribute | prune | sweep``) and the names they
choose from: light, so the command's ``--help`` imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from mi_core.config import Config, option
from mi_core.data.mib_tasks import MIB_TASKS, check_mib_spec, is_mib_spec
from mi_core.devices import ModelPlacement
from mi_core.errors import ConfigError, DataError
from mi_core.interventions.config import FILLS
from mi_core.pruning.constants import AUTO_OBJECTIVE, OBJECTIVE_NAMES
from mi_core.pruning.jobs import EXECUTION_FIELDS, SweepExecution
from mi_core.pruning.profiles import parse_seed_spec, parse_sparsity_spec
from mi_core.tasks import TASKS

__all__ = [
    "ATTRIBUTION_METHODS",
    "CURVE_FRACTIONS",
    "IG_RULES",
    "METRIC_NAMES",
    "SELECTIONS",
    "AttributeConfig",
    "CircuitData",
    "CircuitEvaluateConfig",
    "CircuitPruneConfig",
    "CircuitSubmitConfig",
    "CircuitSweepConfig",
    "EdgePruneSettings",
]

#: EAP-IG's Riemann sums: ``left`` (hannamw/EAP-IG's code, which the MIB benchmark runs:
#: ``alpha = k / steps`` for ``k = 0..steps-1``, from the corrupted input) and ``right`` (the
#: paper's formula: ``k = 1..steps``, ending at the clean input).
IG_RULES = ("left", "right")

#: The metrics a circuit is judged by (:data:`mi_core.circuits.metrics.METRICS` implements them).
METRIC_NAMES = ("logit-diff",)


#: Edge-attribution methods: EAP, EAP-IG and exact activation patching of every edge.
ATTRIBUTION_METHODS = ("eap", "eap-ig", "exact")


#: How a circuit of k edges is chosen from scores.
SELECTIONS = ("greedy", "top-k")


#: Fractions of edges kept along a faithfulness curve (the MIB benchmark's levels).
CURVE_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


#: The Edge Pruning authors' warm-ups as shares of their 3,000-step IOI runs.
AUTHORS_SPARSITY_WARMUP = 2500 / 3000
AUTHORS_LR_WARMUP = 200 / 3000


@dataclass(kw_only=True)
class EdgePruneSettings(Config):
    """The edge-pruning recipe (defaults: the Edge Pruning authors' IOI runs)."""

    sparsity: float = 0.95
    """Target fraction of edges removed."""
    steps: int = 3000
    """Optimisation steps."""
    sparsity_warmup_steps: int | None = None
    """Steps over which the target rises linearly from 0 to ``sparsity``; default: the
    authors' share of the run (2,500 of 3,000 steps), so ``steps`` alone scales it."""
    lr_warmup_steps: int | None = None
    """Steps over which the learning rates rise linearly from 0 (then decay linearly to 0);
    default: the authors' share of the run (200 of 3,000 steps)."""
    node_sparsity: float | None = None
    """Target fraction of nodes (input, heads, MLPs) removed by node masks with their own
    Lagrangian term; None: edge masks only."""
    batch_size: int = 32
    """Examples per step."""
    lr: float = 0.8
    """Learning rate of the gates' log_alpha (decays linearly to 0)."""
    lr_lambda: float = 0.8
    """Learning rate of the Lagrangian lambdas (ascent)."""
    weight_decay: float = 0.01
    """AdamW weight decay on log_alpha and the lambdas (torch's AdamW default, as the authors)."""
    max_grad_norm: float = 1.0
    """Clip the gradient norm of the gates and lambdas together at this value (the authors'
    Hugging Face Trainer's default, max_grad_norm 1.0); 0 turns it off."""
    init_mean: float = 10.0
    """Mean of the initial log_alpha."""
    init_std: float = 0.01
    """Standard deviation of the initial log_alpha."""
    warm_start: str | None = None
    """An edge-scores file (circuit attribute's scores.safetensors) the gates start from, as
    the MIB shared task's winning entry starts edge pruning from EAP-IG: ranked by ``|score|``, the
    top (1 - sparsity) share opens (log_alpha from +init_mean down to 0 in rank order) and the
    rest closes (0 down to -init_mean); None: every gate from N(init_mean, init_std)."""
    fill: str = option("corrupted", choices=FILLS)
    """What a removed edge carries: the corrupted run's activation, the mean, or zero."""
    objective: str = option(AUTO_OBJECTIVE, choices=OBJECTIVE_NAMES)
    """What the gates minimise besides the sparsity penalty (:mod:`mi_core.pruning.objectives`):
    ``answer_kl`` (the authors' KL to the full model at the answer; ``auto``), or
    ``logit_diff`` (the squared gap to the full model's answer-minus-distractor logit
    difference, as circuit benchmarks score circuits)."""
    seed: int = 0
    """Seed of the gates' initialisation, their samples and the data order."""
    checkpoint_every: int = 100
    """Save the run's state every this many steps (with a checkpoint folder)."""

    # What the one pruning loop (mi_core.pruning.loop) reads a run's recipe by, where the edge
    # recipe is fixed or names a setting otherwise: one run of one micro-batch a step, no
    # dropout or probe, float32, the sampled sparsity, a linear learning-rate decay.
    grad_accumulation = 1
    dropout = False
    eval_every = 0
    precision = "fp32"
    sparsity_estimate = "sampled"
    sparsity_weighting = "components"
    lr_schedule = "linear"

    @property
    def target_sparsity(self) -> float:
        return self.sparsity

    @property
    def warmup_steps(self) -> int:
        assert self.sparsity_warmup_steps is not None  # set in __post_init__
        return self.sparsity_warmup_steps

    @property
    def lr_log_alpha(self) -> float:
        return self.lr

    @property
    def lambda_weight_decay(self) -> float:
        return self.weight_decay

    def __post_init__(self) -> None:
        # the warm-ups left unset keep the authors' share of the run (2,500 and 200 of 3,000)
        if self.sparsity_warmup_steps is None:
            self.sparsity_warmup_steps = round(self.steps * AUTHORS_SPARSITY_WARMUP)
        if self.lr_warmup_steps is None:
            self.lr_warmup_steps = round(self.steps * AUTHORS_LR_WARMUP)
        super().__post_init__()

    def validate(self) -> None:
        super().validate()
        if not 0.0 < self.sparsity < 1.0:
            raise ConfigError(f"sparsity must lie strictly between 0 and 1, not {self.sparsity}")
        if self.steps < 1 or self.batch_size < 1 or self.checkpoint_every < 1:
            raise ConfigError("steps, batch_size and checkpoint_every must be at least 1")
        if not 0 <= self.sparsity_warmup_steps <= self.steps:
            raise ConfigError(
                f"sparsity_warmup_steps (--sparsity-warmup-steps) must lie in [0, steps="
                f"{self.steps}], not {self.sparsity_warmup_steps}"
            )
        if self.max_grad_norm < 0:
            raise ConfigError(
                f"max_grad_norm must be at least 0 (0: off), not {self.max_grad_norm}"
            )
        if self.lr_warmup_steps < 0:
            raise ConfigError(f"lr_warmup_steps must be at least 0, not {self.lr_warmup_steps}")
        if self.node_sparsity is not None and not 0.0 < self.node_sparsity < 1.0:
            raise ConfigError(
                f"node_sparsity must lie strictly between 0 and 1, not {self.node_sparsity}"
            )


def _parse_fractions(value: Any, where: str) -> tuple[float, ...]:
    if isinstance(value, str):
        try:
            value = [float(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"{where}: fractions are numbers separated by commas") from None
    return tuple(float(v) for v in value)


@dataclass(kw_only=True)
class CircuitData(ModelPlacement):
    """Which model and which clean / corrupted pairs a circuit job works on."""

    model: str
    """Checkpoint dir, hub name, minilm or smollm2."""
    task: str | None = option(None, choices=TASKS)
    """Task head to load for a classifier (default: the checkpoint's own)."""
    data: str = "ioi"
    """Circuit data: for language models ioi, ioi:abba, ioi:baba, an MIB task
    (mib:<task>[:<split>]: ioi, mcqa, arithmetic_addition, arithmetic_subtraction, arc_easy,
    arc_challenge; split train, validation (default), test or generated; local copies in
    $MI_CORE_MIB_DIR) or a prompt file (.jsonl with prompt, answer, corrupted and optionally
    distractor); for NLI classifiers hans-pairs:<subcase>."""
    n_examples: int = 128
    """Pairs in all (found on the first part, judged on the held-out rest)."""
    held_out: float = 0.5
    """Fraction of the pairs held out to judge the circuit."""
    data_seed: int = 0
    """Seed of the generated prompts (ioi)."""
    metric: str = option("logit-diff", choices=METRIC_NAMES)
    """What the circuit must preserve: the answer's logit minus the distractor's."""
    fill: str = option("corrupted", choices=FILLS)
    """What a removed edge carries: the corrupted run's activation, the mean, or zero."""
    means_data: str | None = None
    """Pair data the mean fill averages over for a classifier, e.g. mnli:train (the paper's
    mean ablation); default: the finding pairs' clean inputs."""
    mean_examples: int = 256
    """Pairs of means_data the means are taken over."""
    batch_size: int = 16
    """Examples per forward pass."""
    out: str
    """Output folder."""

    def validate(self) -> None:
        super().validate()
        if self.n_examples < 2:
            raise ConfigError(f"n_examples must be at least 2, not {self.n_examples}")
        if not 0.0 < self.held_out < 1.0:
            raise ConfigError(f"held_out must lie strictly between 0 and 1, not {self.held_out}")
        if self.batch_size < 1 or self.mean_examples < 1:
            raise ConfigError("batch_size and mean_examples must be at least 1")
        if self.means_data is not None and self.fill != "mean":
            raise ConfigError(f"means_data is read with fill mean only, not {self.fill}")
        if not (lm_circuit_data(self.data) or self.data.startswith("hans-pairs:")):
            raise ConfigError(
                f"unknown circuit data {self.data!r}; expected ioi, ioi:abba, ioi:baba, "
                "mib:<task>[:<split>], a .jsonl prompt file or hans-pairs:<subcase>"
            )
        if is_mib_spec(self.data):
            try:
                check_mib_spec(self.data)
            except DataError as exc:
                raise ConfigError(str(exc)) from None


def lm_circuit_data(data: str) -> bool:
    """Whether ``data`` is a language model's circuit data: an IOI split, an MIB task or a
    prompt file."""
    return data == "ioi" or data.startswith(("ioi:", "mib:")) or data.endswith(".jsonl")


@dataclass(kw_only=True)
class Bootstrap(Config):
    """A circuit job's resampling of its finding pairs (:mod:`mi_core.circuits.stability`)."""

    bootstrap: int = 0
    """Resample the finding pairs this many times (with replacement), find the circuits again
    on each resample (attribution: score it; prune: one more run each) and report how far the
    circuits at MIB's sizes agree (mean pairwise Jaccard, the edges in every resample;
    bootstrap.json, bootstrap.html); 0: off."""

    def validate(self) -> None:
        super().validate()
        if self.bootstrap == 1 or self.bootstrap < 0:
            raise ConfigError(
                f"bootstrap compares at least 2 resamples (0: off), not {self.bootstrap}"
            )


@dataclass(kw_only=True)
class AttributeConfig(Bootstrap, CircuitData):
    """``mi-core circuit attribute``: score every edge, judge the top-k circuits."""

    method: str = option("eap-ig", choices=ATTRIBUTION_METHODS)
    """eap (1 backward pass), eap-ig (integrated gradients) or exact (one forward per edge)."""
    steps: int = 5
    """EAP-IG interpolation steps."""
    ig_rule: str = option("left", choices=IG_RULES)
    """EAP-IG's sum: left (the authors' code and MIB: k / steps for k = 0..steps-1, from the
    corrupted input) or right (the paper's formula: k = 1..steps, ending at the clean one)."""
    fractions: tuple[float, ...] = option(CURVE_FRACTIONS, parse=_parse_fractions)
    """Fractions of edges kept along the faithfulness curve (comma separated)."""
    circuit_fraction: float = 0.05
    """Fraction of edges in the circuit written to circuit.safetensors and mib.json."""
    selection: str = option("greedy", choices=SELECTIONS)
    """How circuits are chosen from the scores: greedy (connected to the output) or top-k."""
    signed: bool = False
    """Rank edges by how much removing them lowers the metric (-score) instead of |score|:
    edges that work against the metric are never chosen first."""
    connected: bool = True
    """Count only edges on an input-to-output path of kept edges against the budget (in a
    decoder with the corrupted fill the others change nothing); a circuit may hold fewer
    edges than asked (its n_edges says how many); off: exactly the first k of the ranking."""
    neurons: bool = False
    """Also score every dimension of every node's output with the same method (MIB's neuron
    level: neuron_scores.safetensors, which circuit evaluate and submit read with --level
    neuron); eap and eap-ig."""

    def validate(self) -> None:
        super().validate()
        if self.steps < 1:
            raise ConfigError(f"steps must be at least 1, not {self.steps}")
        if self.neurons and self.method not in ("eap", "eap-ig"):
            raise ConfigError(f"--neurons scores with eap or eap-ig, not {self.method}")
        if not 0.0 < self.circuit_fraction <= 1.0:
            raise ConfigError(f"circuit_fraction must lie in (0, 1], not {self.circuit_fraction}")
        if not self.fractions or any(not 0.0 <= f <= 1.0 for f in self.fractions):
            raise ConfigError(f"fractions must lie in [0, 1], got {list(self.fractions)}")


#: How ``mi-core circuit evaluate`` ranks edges into MIB's circuits: ``mib`` as MIB's
#: benchmark reports a method (CPR from the signed ranking, CMD from ``|score|``), or one
#: ranking for both.
MIB_RANKINGS = ("mib", "absolute", "signed")

#: What MIB's circuits rank: edges, nodes (the input, heads and MLPs), or neurons (each node's
#: output dimensions).
MIB_LEVELS = ("edge", "node", "neuron")

#: How ``mi-core circuit evaluate`` turns edge scores into MIB's circuits: MIB's own top-n of
#: the ranking, one reading per size and metric chosen on the finding pairs
#: (:func:`~mi_core.circuits.mib.select_mib_circuits`), or those refined on the finding pairs
#: by gradient-guided edge swaps (:func:`~mi_core.circuits.refine.refine_mib_circuits`).
MIB_CIRCUITS = ("top-n", "chosen", "refined")


@dataclass(kw_only=True)
class CircuitEvaluateConfig(CircuitData):
    """``mi-core circuit evaluate``: MIB's CPR and CMD of a method's edge or node scores,
    judged on the held-out pairs (:func:`~mi_core.circuits.mib.mib_score`)."""

    scores: str
    """An edge-scores file (``mi-core circuit attribute``'s ``scores.safetensors``), a
    node-scores file, or a pruning sweep's folder (the heuristic core's subnetworks, scored
    per node: level node)."""
    ranking: str = option("mib", choices=MIB_RANKINGS)
    """mib: CPR from the signed ranking and CMD from |score|, as MIB reports a method;
    absolute or signed: that ranking for both."""
    level: str = option("edge", choices=MIB_LEVELS)
    """edge: MIB's circuits rank edges; node: they rank nodes (edge scores summed per node)."""
    circuits: str = option("top-n", choices=MIB_CIRCUITS)
    """top-n: MIB's circuits of the ranking; chosen: per size and metric, the reading of the
    scores best on the finding pairs; refined: those refined on the finding pairs by
    gradient-guided edge swaps (edge level, ranking mib; writes OUT/circuits/cpr and cmd)."""
    refine_rounds: int = 8
    """Refinement proposals per size and metric (circuits refined), a forward and backward
    pass each."""

    def validate(self) -> None:
        super().validate()
        if self.circuits != "top-n" and (self.level != "edge" or self.ranking != "mib"):
            raise ConfigError(
                f"--circuits {self.circuits} chooses edge circuits for CPR and CMD each "
                f"(level edge, ranking mib), not level {self.level}, ranking {self.ranking}"
            )
        if self.circuits == "refined" and self.fill != "corrupted":
            raise ConfigError(
                "--circuits refined refines under MIB's patching (--fill corrupted), "
                f"not --fill {self.fill}"
            )
        if self.refine_rounds < 1:
            raise ConfigError(f"--refine-rounds must be at least 1, not {self.refine_rounds}")


#: What ``mi-core circuit submit`` writes per task and model: one importance file, or one
#: binary circuit per MIB size below 100 %.
SUBMISSION_FORMS = ("importances", "circuits")


@dataclass(kw_only=True)
class CircuitSubmitConfig(Config):
    """``mi-core circuit submit``: MIB's submission files of a method's edge scores
    (:mod:`mi_core.circuits.submit`)."""

    scores: str
    """An edge-scores file (``scores.safetensors`` of circuit attribute), a node-scores file,
    or a pruning sweep's folder (level node)."""
    task: str = option(choices=tuple(MIB_TASKS))
    """The MIB task the scores were found on."""
    model_name: str
    """The model's folder name: MIB's ids are gpt2, qwen2.5, gemma2 and llama3."""
    method: str = "mi-core"
    """The method's name in the folder (``<method>_<ablation>_<level>``)."""
    ablation: str = option("patching", choices=("patching", "mean", "zero"))
    """The ablation the circuits were found for, as MIB names it."""
    level: str = option("edge", choices=MIB_LEVELS)
    """The circuit level: edge, or node (node scores; edge scores summed per node)."""
    form: str = option("importances", choices=SUBMISSION_FORMS)
    """importances: one file MIB re-ranks at every size; circuits: nine binary circuits."""
    ranking: str = option("absolute", choices=("absolute", "signed"))
    """How the nine circuits are chosen from the scores (form circuits)."""
    circuits: str | None = None
    """A folder of nine circuits to write instead of the scores' top-n (form circuits, level
    edge): circuit evaluate --circuits chosen|refined's OUT/circuits/cpr or cmd."""
    file_format: str = option("json", choices=("json", "pt"))
    """json (Graph.to_json) or pt (Graph.to_pt; the only one at the neuron level)."""
    out: str
    """The submission's root folder."""

    def validate(self) -> None:
        super().validate()
        if self.circuits is not None and (self.form != "circuits" or self.level != "edge"):
            raise ConfigError(
                "--circuits writes nine edge circuits (--form circuits, --level edge), "
                f"not --form {self.form} at level {self.level}"
            )
        if self.level == "neuron" and self.file_format == "json":
            raise ConfigError(
                "neuron-level submissions are .pt files (--file-format pt): MIB's "
                "Graph.from_json writes each head's neurons into every head of its layer"
            )


@dataclass(kw_only=True)
class CircuitPruneConfig(Bootstrap, EdgePruneSettings, CircuitData):
    """``mi-core circuit prune``: learn an edge circuit by edge pruning (resumable; with
    ``bootstrap``, one more run per resample, each resumable too)."""


@dataclass(kw_only=True)
class CircuitSweepConfig(EdgePruneSettings, CircuitData, SweepExecution):
    """``mi-core circuit sweep``: one edge-pruning run per (sparsity, seed), in
    ``out/s{sparsity}/seed{seed}`` (the layout of ``mi-core sweep``); finished runs are skipped,
    an interrupted one resumes. ``sparsity`` and ``seed`` are taken from the lists. Runs execute
    here one after another (``executor`` local) or each as a Ray task (ray)."""

    executor: str = option("local", choices=("local", "ray"))
    """local: one run after another here; ray: each run a Ray task (edge pruning has no batched
    groups)."""
    group_size: int | None = option(None, cli=False)
    """Edge pruning has no batched groups: one run per task."""
    sparsity: float = option(0.95, cli=False)
    """Set per run from ``sparsities``."""
    seed: int = option(0, cli=False)
    """Set per run from ``seeds``."""
    sparsities: list[float] = option(parse=parse_sparsity_spec, metavar="SPEC")
    """Target edge sparsities, e.g. 0.9,0.95 or 0.9:0.98:0.02."""
    seeds: list[int] = option(parse=parse_seed_spec, metavar="SPEC")
    """Seeds: 1-3 or 1,2,5 name them; a bare count N means seeds 0 to N-1."""

    def validate(self) -> None:
        super().validate()
        if not self.sparsities or not self.seeds:
            raise ConfigError("a circuit sweep needs at least one sparsity and one seed")
        if self.executor == "batched" or self.group_size not in (None, 1):
            raise ConfigError(
                "a circuit sweep runs one run per task (executor local or ray); edge pruning has "
                "no batched groups"
            )
        from mi_core.pruning.constants import check_ray_gpus

        check_ray_gpus(self.executor, self.device, self.num_gpus_per_run)
        for sparsity in self.sparsities:  # every run's recipe is valid before any runs
            _edge_prune_settings(self, sparsity=sparsity)

    def run_config(self, sparsity: float, seed: int) -> CircuitPruneConfig:
        """The config of one run of the sweep."""
        from mi_core.pruning.sweeps import run_dir_for

        sweep_only = ("sparsities", "seeds", *EXECUTION_FIELDS)
        values = {k: v for k, v in self.to_dict().items() if k not in sweep_only}
        out = run_dir_for(self.out, sparsity, seed)
        return CircuitPruneConfig.from_dict({**values, "sparsity": sparsity, "seed": seed,
                                             "out": str(out)})  # fmt: skip


def _edge_prune_settings(config: EdgePruneSettings, **changes: Any) -> EdgePruneSettings:
    """The edge-pruning recipe of a job config, as a plain :class:`EdgePruneSettings`."""
    values = {f.name: getattr(config, f.name) for f in fields(EdgePruneSettings)}
    return EdgePruneSettings(**{**values, **changes})
