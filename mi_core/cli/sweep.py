"""``mi-core sweep``: prune at several sparsities x seeds, here or on a Ray cluster."""

from __future__ import annotations

import argparse

from mi_core.cli.prune import add_model_and_data_options, config_overrides
from mi_core.pruning.profiles import parse_seeds, parse_sparsities


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="one pruning run per (sparsity, seed); skips finished runs",
        description="Run mi-core prune for every sparsity and seed under OUT/s{sparsity}/"
        "seed{seed}/, sharing the full model's logits and accuracies, then write "
        "OUT/subnetworks.csv and OUT/subnetworks.html (in-domain vs out-of-domain accuracy per "
        "subnetwork). Re-running finishes only the missing runs.",
    )
    add_model_and_data_options(p)
    p.add_argument("--sparsities", required=True, help="e.g. 0.5,0.7 or 0.05:0.7:0.05")
    p.add_argument("--seeds", required=True, help="e.g. 42-53 or 1,2,5")
    p.add_argument("--executor", choices=["local", "ray"], default="local")
    p.add_argument("--ray-address", default=None, help="Ray cluster address (default: local)")
    p.add_argument("--num-cpus-per-run", type=float, default=1.0, help="Ray CPUs per run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from mi_core.pruning.sweep import run_sweep

    table = run_sweep(
        args.model,
        args.train,
        args.out,
        parse_sparsities(args.sparsities),
        parse_seeds(args.seeds),
        means=args.means,
        eval_sets=args.eval,
        profile=args.profile,
        overrides=config_overrides(args),
        task=args.task,
        max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples,
        executor=args.executor,
        ray_address=args.ray_address,
        num_cpus_per_run=args.num_cpus_per_run,
        progress=False if args.no_progress else None,
    )
    print(f"{len(table)} subnetworks in {args.out}/subnetworks.csv and subnetworks.html")
