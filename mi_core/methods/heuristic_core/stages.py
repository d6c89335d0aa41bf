"""The stages of the heuristic-core experiment, described once, as data, and what runs each.

Each :class:`Stage` names what it reads (upstream stages), what it writes (paths under the
report directory), when it is part of an experiment, the settings its key hashes, and the
function that runs it on an :class:`~mi_core.methods.heuristic_core.context.ExperimentContext`.
:class:`~mi_core.methods.heuristic_core.pipeline.HeuristicCoreExperiment` runs them in this
order (:func:`mi_core.methods.stages.run_stages`); the CLI reads their names and descriptions
here. The run functions are glue: each picks its inputs from the context and calls the building
block that does the work, imported when the stage runs, so reading this table imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mi_core.errors import ConfigError, MiCoreError
from mi_core.methods.heuristic_core.config import ExperimentConfig
from mi_core.methods.heuristic_core.layout import STAGES
from mi_core.pruning.jobs import EXECUTION_FIELDS

if TYPE_CHECKING:
    from mi_core.data.prompt_tasks import TaskData
    from mi_core.interventions import ComponentMeans
    from mi_core.methods.heuristic_core.context import ExperimentContext
    from mi_core.pruning.sweeps import SweepResult

__all__ = ["STAGES", "STAGE_BY_NAME", "STAGE_SPECS", "Stage"]

#: Pruning settings that change where a run executes, not what it computes (not in keys).
_EXECUTION = EXECUTION_FIELDS


def _pruning(c: ExperimentConfig) -> dict[str, Any]:
    return {k: v for k, v in asdict(c.pruning).items() if k not in _EXECUTION}


def _finetune(c: ExperimentConfig) -> tuple:
    settings = None if c.finetune is None else asdict(c.finetune)
    return (c.model, c.task, c.checkpoint, asdict(c.data), settings)


@dataclass(frozen=True)
class Stage:
    """One resumable step of the experiment."""

    name: str
    description: str
    inputs: tuple[str, ...]
    """Upstream stages: their keys enter this stage's key, so a change there re-runs it."""
    outputs: tuple[str, ...]
    """What it writes, relative to the report directory."""
    settings: Callable[[ExperimentConfig], tuple]
    """The config values its key hashes (with the upstream keys)."""
    run: Callable[[ExperimentContext], None]
    """Runs the stage: reads its inputs through the context, writes its outputs."""
    enabled: Callable[[ExperimentConfig], bool] = lambda c: True
    """Whether this experiment runs it (``"off"`` otherwise)."""


# ----------------------------------------------------------------------------- run functions
def _run_finetune(ctx: ExperimentContext) -> None:
    from mi_core.training import FinetuneConfig, finetune

    c, ft = ctx.config, ctx.config.finetune
    assert ft is not None and c.model is not None
    finetune(
        FinetuneConfig(
            **asdict(ft),
            model=c.model,
            task=c.task,
            train=c.data.train,
            out=str(ctx.layout.finetune),
            eval=list(c.data.eval),
            device=ctx.device,
        ).replace(
            max_eval_examples=ft.max_eval_examples or c.data.max_eval_examples,
            max_train_examples=ft.max_train_examples or c.data.max_train_examples,
        ),
        progress=ctx.progress,
    )


def _run_means(ctx: ExperimentContext) -> None:
    from mi_core.data import pair_batches
    from mi_core.interventions import compute_means

    m = ctx.config.means
    spec = m.data or ctx.config.data.train
    cap = m.max_examples or ctx.config.data.max_train_examples
    dataset = ctx.load_data(spec, cap, train=True)
    batches = pair_batches(
        dataset, ctx.model.tokenizer, batch_size=m.batch_size, max_length=m.max_length
    )
    means = compute_means(
        ctx.model, batches, dataset=dataset.name, progress=ctx.progress,
        by_position=m.by_position,
    )  # fmt: skip
    _check_means_unchanged(ctx, means)
    means.save(ctx.means_path)
    ctx.forget_means()


def _check_means_unchanged(ctx: ExperimentContext, means: ComponentMeans) -> None:
    """Refuse new means that differ from the saved ones while pruning runs computed from
    those are in the report (finished or not): replacing them would leave the runs refusing
    the new means, or a report mixing the two. The same means (e.g. the stage re-ran after
    an evaluation setting changed) pass."""
    from mi_core.interventions import load_means
    from mi_core.models.fingerprint import tensor_fingerprint

    runs = [p for d in ("sweep", "grid") for p in (ctx.out / d).glob("s*/seed*/config.json")]
    if not runs or not ctx.means_path.is_file():
        return
    try:
        old = load_means(ctx.means_path)
    except MiCoreError:  # damaged: nothing to keep (the runs check the new ones)
        return
    mine, theirs = old.tensors(), means.tensors()
    same = (
        old.fingerprint == means.fingerprint
        and mine.keys() == theirs.keys()
        and all(tensor_fingerprint(mine[k]) == tensor_fingerprint(theirs[k]) for k in mine)
    )
    if not same:
        raise ConfigError(
            f"{ctx.out}: the means would change (their settings or the model changed) while "
            f"pruning runs computed from {ctx.means_path.name} are in the report, e.g. "
            f"{runs[0].parent}; use a new --out, or the same settings"
        )


def _run_sweep(ctx: ExperimentContext) -> None:
    p = ctx.config.pruning
    ctx.prune_grid(ctx.layout.sweep, p.sparsities, p.seeds)


def _run_analysis(ctx: ExperimentContext) -> None:
    from mi_core.methods.heuristic_core.comparison import compare_subnetworks, write_comparison

    results = ctx.load_sweep()
    write_comparison(results, compare_subnetworks(results), ctx.layout.analysis)


def _attention_data(ctx: ExperimentContext) -> TaskData:
    """The attention stage's data: its own, else the first out-of-domain set, else the first
    evaluation set."""
    a, c = ctx.config.attention, ctx.config
    ood = c.data.out_of_domain_sets
    spec = a.data or (ood[0] if ood else c.data.eval[0])
    return ctx.load_data(spec, a.max_examples)


def _run_attention(ctx: ExperimentContext) -> None:
    from mi_core.io import write_csv
    from mi_core.methods.heuristic_core.attention import (
        attention_classes,
        attention_views,
        write_views,
    )

    a = ctx.config.attention
    heads, reason = ctx.chosen_heads()
    dataset = _attention_data(ctx)
    table = attention_classes(
        ctx.model,
        dataset,
        heads,
        batch_size=a.batch_size,
        threshold=a.threshold,
        min_excess=a.min_excess,
    )
    table.insert(1, "chosen_as", reason)
    write_csv(ctx.layout.attention_classes, table)
    views = attention_views(ctx.model, dataset, heads, a.n_views)
    write_views(views, ctx.layout.attention)


def _run_ablation(ctx: ExperimentContext) -> None:
    from mi_core.methods.heuristic_core.ablation import run_core_ablation

    heads, reason = ctx.chosen_heads()
    b = ctx.config.ablation
    cap = b.max_examples or ctx.config.data.max_eval_examples
    if cap != ctx.eval_cap:
        datasets = [ctx.load_data(spec, cap) for spec in ctx.config.data.eval]
    else:
        datasets = ctx.eval_sets
    run_core_ablation(
        ctx.model,
        datasets,
        heads,
        b.joint_sets,
        means=ctx.means if b.fill == "mean" else None,
        fill=b.fill,
        others=b.others,
        batch_size=b.batch_size,
        out=ctx.layout.ablation,
        heads_chosen_as=reason,
        progress=ctx.progress,
    )


def _run_effective_size(ctx: ExperimentContext) -> None:
    from mi_core.methods.heuristic_core.effective_size import run_effective_size

    c, es = ctx.config, ctx.config.effective_size
    run_effective_size(
        es.checkpoints_dir or ctx.layout.finetune,
        c.data.train,
        list(c.data.eval),
        ctx.layout.effective_size,
        es.sparsities,
        es.seeds,
        ood_sets=c.ood_sets,
        margin=es.margin,
        method=es.method,
        profile=es.profile or c.pruning.profile,
        overrides=c.pruning.overrides if es.overrides is None else es.overrides,
        task=c.task,
        steps=es.steps,
        max_checkpoints=es.max_checkpoints,
        revisions=es.revisions,
        max_train_examples=ctx.train_cap,
        max_eval_examples=ctx.eval_cap,
        device=c.device,  # resolved where each run executes (a Ray task: on its machine)
        **c.pruning.execution(),
        progress=ctx.progress,
        groups=es.groups,
    )


def _run_grid(ctx: ExperimentContext) -> None:
    """Figure 4: the fine-tuned model pruned at every sparsity x seed of the grid."""
    g = ctx.config.grid
    ctx.prune_grid(ctx.layout.grid, g.sparsities, g.seeds)


def _prune_checkpoint(ctx: ExperimentContext, checkpoint: Path, folder: Path) -> SweepResult:
    """A fine-tuning checkpoint pruned as the sweep is, in ``folder``: its means (computed
    once, on the training set) and its sweep; the sweep's finished runs."""
    from mi_core.methods.heuristic_core.effective_size import compute_checkpoint_means
    from mi_core.models import load_model
    from mi_core.pruning.sweeps import load_sweep

    c, p = ctx.config, ctx.config.pruning
    model = load_model(checkpoint, task=c.task, device=ctx.device)
    means = folder / "means.safetensors"
    if not means.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        compute_checkpoint_means(model, c.data.train, means, ctx.train_cap)
    ray = p.executor == "ray"
    ctx.prune_grid(
        folder / "sweep", p.sparsities, p.seeds, str(checkpoint) if ray else model, means
    )
    return load_sweep(folder / "sweep", sparsities=p.sparsities, seeds=p.seeds)


def _run_core_before(ctx: ExperimentContext) -> None:
    """Prune the last checkpoint before the out-of-domain accuracy rises; compare cores."""
    import pandas as pd

    from mi_core.io import write_json
    from mi_core.methods.heuristic_core.comparison import SubnetworkComparison
    from mi_core.methods.heuristic_core.core_before import run_core_before
    from mi_core.methods.heuristic_core.effective_size import dataset_name
    from mi_core.training.checkpoints import list_checkpoints

    c = ctx.config
    metrics = pd.read_csv(ctx.layout.finetune_metrics)
    names = {spec: dataset_name(spec, task=c.task) for spec in c.ood_sets}
    summary = run_core_before(
        metrics,
        dict(list_checkpoints(ctx.layout.finetune)),
        list(names.values()),
        SubnetworkComparison.load(ctx.layout.analysis).core,
        ctx.layout.core_before,
        margin=c.core_before.margin,
        prune=lambda checkpoint, folder: _prune_checkpoint(ctx, checkpoint, folder),
        root=ctx.out,
    )
    write_json(ctx.layout.core_before_summary, summary)


def _run_core_edges(ctx: ExperimentContext) -> None:
    """Edge scores touching the chosen heads in the best and worst generalising subnetworks."""
    from mi_core.io import write_csv
    from mi_core.methods.heuristic_core.core_edges import run_core_edges
    from mi_core.methods.heuristic_core.effective_size import dataset_name

    c = ctx.config
    heads, reason = ctx.chosen_heads()
    sweep = ctx.load_sweep()
    # the config's out-of-domain sets (not MNLI mismatched, which is in-domain)
    named = {dataset_name(spec, task=c.task) for spec in c.data.out_of_domain_sets}
    edges, summary = run_core_edges(
        ctx.model,
        sweep,
        ctx.means,
        heads,
        c.core_edges,
        ood_names=named,
        heads_chosen_as=reason,
        mean_data=c.means.data or c.data.train,
        max_length=c.means.max_length,
    )
    ctx.layout.core_edges.mkdir(parents=True, exist_ok=True)
    write_csv(ctx.layout.core_edges_table, edges)
    write_csv(ctx.layout.core_edges_summary, summary)


def _run_report(ctx: ExperimentContext) -> None:
    from mi_core.methods.heuristic_core.report import write_report

    write_report(ctx.out)


# ------------------------------------------------------------------------------ the stages
#: The stages, in the order they run (their names: :data:`~.layout.STAGES`).
STAGE_SPECS: tuple[Stage, ...] = (
    Stage(
        "finetune",
        "fine-tune the pretrained model, saving checkpoints (unless a checkpoint is given)",
        (),
        ("finetune/",),
        _finetune,
        run=_run_finetune,
        enabled=lambda c: c.finetune is not None,
    ),
    Stage(
        "means",
        "mean activations of every head and MLP on the training set",
        ("finetune",),
        ("means.safetensors",),
        lambda c: (asdict(c.means),),
        run=_run_means,
        enabled=lambda c: c.means.path is None,
    ),
    Stage(
        "sweep",
        "one pruning run per (sparsity, seed)",
        ("means",),
        ("sweep/",),
        lambda c: (_pruning(c),),
        run=_run_sweep,
    ),
    Stage(
        "analysis",
        "head frequencies, cores, Spearman agreement, chance intersections, heatmaps",
        ("sweep",),
        ("analysis/",),
        lambda c: (),
        run=_run_analysis,
    ),
    Stage(
        "attention",
        "attention classes of the core heads and example views",
        ("analysis",),
        ("attention/",),
        lambda c: (asdict(c.attention),),
        run=_run_attention,
    ),
    Stage(
        "ablation",
        "single and joint ablations of the core heads",
        ("analysis", "means"),
        ("ablation/",),
        lambda c: (asdict(c.ablation),),
        run=_run_ablation,
    ),
    Stage(
        "effective_size",
        "effective size over fine-tuning checkpoints",
        ("finetune",),
        ("effective_size/",),
        lambda c: (_pruning(c), asdict(c.effective_size)),
        run=_run_effective_size,
        enabled=lambda c: c.effective_size.enabled,
    ),
    Stage(
        "grid",
        "Figure 4: the fine-tuned model pruned on a sparsity x seed grid",
        ("means",),
        ("grid/",),
        lambda c: (_pruning(c), asdict(c.grid)),
        run=_run_grid,
        enabled=lambda c: c.grid.enabled,
    ),
    Stage(
        "core_before",
        "the core of the last checkpoint before the model generalises",
        ("analysis",),
        ("core_before/",),
        # the rule's version: summaries measured from the step-0 evaluation are re-made
        lambda c: (_pruning(c), asdict(c.core_before), "rise from the trained floor"),
        run=_run_core_before,
        enabled=lambda c: c.core_before.enabled,
    ),
    Stage(
        "core_edges",
        "edges into and out of the core heads, in subnetworks that generalise and that do not",
        ("analysis", "means"),
        ("core_edges/",),
        lambda c: (asdict(c.core_edges),),
        run=_run_core_edges,
        enabled=lambda c: c.core_edges.enabled,
    ),
    Stage(
        "report",
        "the self-contained HTML report, its Markdown twin and the findings table",
        STAGES[:-1],  # every stage before it
        ("report.html", "report.md", "findings.csv"),
        lambda c: (),
        run=_run_report,
    ),
)

STAGE_BY_NAME: dict[str, Stage] = {stage.name: stage for stage in STAGE_SPECS}
