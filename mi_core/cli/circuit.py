"""``mi-core circuit attribute | prune | sweep``: edge-level circuits."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mi_core.circuits.config import (
    AttributeConfig,
    CircuitEvaluateConfig,
    CircuitPruneConfig,
    CircuitSubmitConfig,
    CircuitSweepConfig,
)
from mi_core.cli import command_help
from mi_core.cli.flags import add_config_flags, given_values
from mi_core.errors import MiCoreError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "circuit",
        help=command_help("circuit"),
        description="Find a circuit of edges between the input, heads, MLPs and the output, "
        "and judge it on held-out clean / corrupted pairs (ioi for language models, "
        "hans-pairs:<subcase> for NLI classifiers).",
    )
    p.set_defaults(func=_choose)
    commands = p.add_subparsers(dest="circuit_command", parser_class=type(p))
    attribute = commands.add_parser(
        "attribute",
        help="score every edge (eap, eap-ig, exact) and judge the top-k circuits",
        description="Score every edge by EAP, EAP-IG or exact patching, then evaluate the top-k "
        "circuits' faithfulness on held-out pairs; write scores, the circuit, MIB JSON, the "
        "faithfulness curve and an interactive graph.",
    )
    add_config_flags(attribute, AttributeConfig)
    attribute.add_argument("--no-progress", action="store_true", help="no progress bars")
    attribute.set_defaults(func=run_attribute, out_kind="folder")
    prune = commands.add_parser(
        "prune",
        help="learn an edge circuit by edge pruning (resumable)",
        description="Edge pruning: hard-concrete gates on every edge, KL to the full model, the "
        "Lagrangian sparsity controller; the circuit keeps exactly (1 - sparsity) of the edges. "
        "A re-run with the same --out resumes.",
    )
    add_config_flags(prune, CircuitPruneConfig)
    prune.add_argument("--no-progress", action="store_true", help="no progress bar")
    prune.set_defaults(func=run_prune, out_kind="folder", resumes=True)
    sweep = commands.add_parser(
        "sweep",
        help="one edge-pruning run per (sparsity, seed); skips finished runs",
        description="Edge pruning at every sparsity and seed, on one loaded model, into "
        "OUT/s{sparsity}/seed{seed}; a re-run skips finished runs and resumes an interrupted "
        "one. OUT/circuits.csv lists each circuit's size and held-out faithfulness.",
    )
    add_config_flags(sweep, CircuitSweepConfig)
    sweep.add_argument("--no-progress", action="store_true", help="no progress bars")
    sweep.set_defaults(func=run_sweep, out_kind="folder", resumes=True)
    evaluate = commands.add_parser(
        "evaluate",
        help="MIB's CPR and CMD of edge scores on the held-out pairs",
        description="Judge a method's edge scores as the MIB benchmark does: circuits of 0.1 "
        "to 100 % of the edges (top by signed score for CPR, by |score| for CMD, unconnected "
        "edges pruned), the others patched from the counterfactual prompt; CPR is the area "
        "under the faithfulness curve, CMD the area under |1 - faithfulness|. Writes "
        "OUT/mib_score.json.",
    )
    add_config_flags(evaluate, CircuitEvaluateConfig)
    evaluate.add_argument("--no-progress", action="store_true", help="no progress bars")
    evaluate.set_defaults(func=run_evaluate, out_kind="folder")
    submit = commands.add_parser(
        "submit",
        help="write MIB's submission files of edge scores",
        description="Write a method's edge scores as MIB's circuit-localisation submission: "
        "OUT/<method>_<ablation>_<level>/<task>_<model>/ with importances.json (or .pt), or "
        "nine binary circuits (0.001.json ... 0.5.json), in MIB's sign and node names.",
    )
    add_config_flags(submit, CircuitSubmitConfig)
    submit.set_defaults(func=run_submit, out_kind="folder")


def _choose(args: argparse.Namespace) -> None:
    raise MiCoreError(
        "circuit: choose what to do: mi-core circuit attribute, prune, sweep, evaluate or submit"
    )


#: The config of each circuit command.
CONFIGS = {
    "attribute": AttributeConfig,
    "prune": CircuitPruneConfig,
    "sweep": CircuitSweepConfig,
    "evaluate": CircuitEvaluateConfig,
    "submit": CircuitSubmitConfig,
}


def config_from_args(
    args: argparse.Namespace,
) -> (
    AttributeConfig
    | CircuitPruneConfig
    | CircuitSweepConfig
    | CircuitEvaluateConfig
    | CircuitSubmitConfig
):
    """The config of the circuit command given (attribute, prune, sweep, evaluate, submit)."""
    cls = CONFIGS[args.circuit_command]
    return cls.from_dict(given_values(args, cls), source="command line")


def _report(summary: dict, out: str) -> None:
    circuit = summary["circuit"]
    connected = circuit.get("n_connected")
    off_path = (
        f" ({circuit['n_edges'] - connected} off every input-to-output path)"
        if connected is not None and connected != circuit["n_edges"]
        else ""
    )
    print(
        f"{summary['graph']}: circuit of {circuit['n_edges']} edges{off_path} recovers "
        f"{round(circuit['faithfulness'], 3) + 0.0:.1%} of the full model's metric on "
        f"{summary['n_held_out']} "
        f"held-out pairs (full {circuit['full']:.4g}, every edge removed {circuit['empty']:.4g}; "
        f"KL {circuit['kl']:.3g}) -> {out}"
    )
    if circuit.get("small_gap"):
        _warn_small_gap(circuit)
    if "curve_area" in summary:
        print(f"area under the faithfulness curve (curve_area, MIB's CPR, higher is better): "
              f"{summary['curve_area']:.3f}")  # fmt: skip
    if "curve_difference" in summary:
        print(f"area under |1 - faithfulness| (curve_difference, MIB's CMD, lower is better): "
              f"{summary['curve_difference']:.3f}")  # fmt: skip


def _warn_small_gap(circuit: dict) -> None:
    print(
        f"warning: removing every edge moves the metric by only "
        f"{abs(circuit['full'] - circuit['empty']):.3g} (standard error "
        f"{circuit.get('gap_se', float('nan')):.2g}); faithfulness divides by that gap and is "
        "mostly noise here (is the corrupted input different enough, is the model trained for "
        "the task?)",
        file=sys.stderr,
    )


def run_attribute(args: argparse.Namespace) -> None:
    from mi_core.circuits.job import run_attribute_job

    config = config_from_args(args)
    summary = run_attribute_job(config, progress=not args.no_progress)
    if summary.pop("finished_before", False):
        print(f"{config.out}: finished before with these settings; nothing recomputed "
              "(delete its summary.json to recompute)")  # fmt: skip
    _report(summary, config.out)
    _report_bootstrap(summary, config.out)


def _report_bootstrap(summary: dict[str, Any], out: str) -> None:
    """The resamples' agreement at each size, when the job resampled its finding pairs."""
    if "bootstrap" not in summary:
        return
    boot = summary["bootstrap"]
    pairs = zip(boot["percentages"], boot["jaccard"], boot["n_shared"], strict=True)
    shown = ", ".join(f"{100 * p:g} %: {j:.2f} ({n} in all)" for p, j, n in pairs if p < 1)
    print(f"bootstrap Jaccard of the circuits (edges in every resample): {shown} -> "
          f"{out}/bootstrap.html")  # fmt: skip


def run_sweep(args: argparse.Namespace) -> None:
    import pandas as pd

    from mi_core.circuits.job import run_circuit_sweep_job

    config = config_from_args(args)
    table = run_circuit_sweep_job(config, progress=not args.no_progress)
    for row in table.itertuples():
        connected = getattr(row, "n_connected", None)
        on_path = (
            "" if connected is None or pd.isna(connected) else f" ({int(connected)} on a path)"
        )
        print(
            f"sparsity {row.sparsity:g} seed {row.seed}: {row.n_edges} edges{on_path}, "
            f"faithfulness {row.faithfulness:.1%} (KL {row.kl:.3g})"
        )
    small = table[table["small_gap"].fillna(False).astype(bool)] if "small_gap" in table else []
    if len(small):
        _warn_small_gap(small.iloc[0].to_dict())
    print(f"-> {config.out}/circuits.csv")


def run_prune(args: argparse.Namespace) -> None:
    from mi_core.circuits.job import run_circuit_prune_job

    config = config_from_args(args)
    assert isinstance(config, CircuitPruneConfig)
    summary = run_circuit_prune_job(config, progress=not args.no_progress)
    _report(summary, config.out)
    _report_bootstrap(summary, config.out)


def run_evaluate(args: argparse.Namespace) -> None:
    from mi_core.circuits.job import MIB_SCORE_FILE, run_circuit_evaluate_job

    config = config_from_args(args)
    assert isinstance(config, CircuitEvaluateConfig)
    summary = run_circuit_evaluate_job(config, progress=not args.no_progress)
    ranks = {"mib": ("signed", "|score|")}.get(config.ranking, (config.ranking,) * 2)
    if config.circuits != "top-n":  # one set of circuits per metric, made on the finding pairs
        ranks = tuple(f"{config.circuits} for {m}, circuits in {config.out}/circuits/{m}"
                      for m in ("cpr", "cmd"))  # fmt: skip
    (cpr_lo, cpr_hi), (cmd_lo, cmd_hi) = summary["interval"]["cpr"], summary["interval"]["cmd"]
    print(
        f"{summary['graph']}, {summary['method']} scores at the {summary['level']} level on "
        f"{summary['n_held_out']} held-out pairs: MIB CPR {summary['cpr']:.3f} ({ranks[0]} "
        f"ranking; higher is better), CMD {summary['cmd']:.3f} ({ranks[1]} ranking; lower is "
        f"better); 95 % bootstrap intervals over the pairs CPR {cpr_lo:.3f}-{cpr_hi:.3f}, CMD "
        f"{cmd_lo:.3f}-{cmd_hi:.3f} -> {config.out}/{MIB_SCORE_FILE}"
    )


def run_submit(args: argparse.Namespace) -> None:
    from mi_core.circuits.submit import run_circuit_submit_job

    config = config_from_args(args)
    assert isinstance(config, CircuitSubmitConfig)
    written = run_circuit_submit_job(config)
    print(f"{written['graph']}, {written['method']} scores: {len(written['files'])} MIB "
          f"{written['level']}-level submission file(s) -> {written['folder']}")  # fmt: skip
