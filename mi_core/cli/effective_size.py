"""``mi-core effective-size``: effective size over fine-tuning checkpoints (paper Figure 6)."""

from __future__ import annotations

import argparse

from mi_core.cli.prune import add_prune_config_options, config_overrides
from mi_core.pruning.profiles import PROFILES


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "effective-size",
        help="prune every fine-tuning checkpoint at many sparsities; effective size over steps",
        description="For every DIR/checkpoint-<step>: compute means on --train (unless --means), "
        "prune at every sparsity and seed (a sweep under OUT/checkpoint-<step>/sweep, resumable, "
        "local or on Ray), and report the largest sparsity whose mean accuracy over seeds stays "
        "within --margin of that checkpoint's full model on the in-domain set (the first --eval), "
        "the out-of-domain sets and their equal mix; effective size = 100 - that sparsity (in %). "
        "Writes OUT/effective_size.csv, faithfulness.csv, accuracy.csv, full_accuracy.csv and "
        "effective_size.html.",
    )
    p.add_argument("--checkpoints", required=True, metavar="DIR", help="fine-tuning output dir")
    p.add_argument("--train", required=True, help="training data spec, e.g. mnli:train")
    p.add_argument(
        "--eval", nargs="+", required=True, metavar="DATA", help="eval sets; the first is in-domain"
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--sparsities", default="0.05:0.7:0.05", help="e.g. 0.05:0.7:0.05 or 0.3,0.5")
    p.add_argument(
        "--seeds", default="3", help="a count (3: seeds 0-2) or seeds like 1,2,5 / 42-44"
    )
    p.add_argument("--margin", type=float, default=0.03, help="faithfulness margin (accuracy)")
    p.add_argument(
        "--method",
        choices=["authors", "paper"],
        default="authors",
        help="authors: their script (each seed's largest faithful sparsity, strict, then the "
        "mean); paper: the paper's text (accuracy averaged over seeds first)",
    )
    p.add_argument(
        "--means",
        default=None,
        help="means file per checkpoint, with {step} in the path (default: computed on --train)",
    )
    p.add_argument(
        "--ood",
        nargs="+",
        default=None,
        metavar="DATA",
        help="out-of-domain sets (default: all --eval sets after the first)",
    )
    p.add_argument("--task", choices=["mnli", "qqp"], default=None)
    p.add_argument("--checkpoint-steps", default=None, help="only these steps, e.g. 500,1000")
    p.add_argument("--max-checkpoints", type=int, default=None, help="evenly spaced subset")
    p.add_argument("--profile", choices=PROFILES, default="quick", help="pruning profile")
    add_prune_config_options(p)
    p.add_argument("--max-train-examples", type=int, default=None)
    p.add_argument("--max-eval-examples", type=int, default=None)
    p.add_argument("--executor", choices=["local", "ray"], default="local")
    p.add_argument("--ray-address", default=None)
    p.add_argument("--num-cpus-per-run", type=float, default=1.0)
    p.add_argument("--device", default="cpu", help="cpu or cuda (local executor)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def _steps(text: str | None) -> list[int] | None:
    from mi_core.errors import ConfigError

    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(
            f"--checkpoint-steps must be integers like 500,1000; got {text!r}"
        ) from None


def run(args: argparse.Namespace) -> None:
    from mi_core.experiment.config import parse_seed_spec
    from mi_core.experiment.effective_size_run import run_effective_size
    from mi_core.pruning.profiles import parse_sparsities

    result = run_effective_size(
        args.checkpoints,
        args.train,
        args.eval,
        args.out,
        parse_sparsities(args.sparsities),
        parse_seed_spec(args.seeds, "--seeds"),
        means=args.means,
        ood_sets=args.ood,
        margin=args.margin,
        method=args.method,
        profile=args.profile,
        overrides=config_overrides(args),
        task=args.task,
        steps=_steps(args.checkpoint_steps),
        max_checkpoints=args.max_checkpoints,
        max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples,
        executor=args.executor,
        ray_address=args.ray_address,
        num_cpus_per_run=args.num_cpus_per_run,
        device=args.device,
        progress=False if args.no_progress else None,
    )
    table = result.effective_size
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"effective sizes in {result.out}/effective_size.csv and effective_size.html")
