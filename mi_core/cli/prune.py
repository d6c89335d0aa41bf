"""``mi-core prune``: one L0 pruning run (resumes when re-run; a finished run only reports)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mi_core.pruning.discretize import DISCRETIZE_RULES
from mi_core.pruning.lagrangian import SPARSITY_ESTIMATES
from mi_core.pruning.profiles import ABLATIONS, PROFILES, SPARSITY_WEIGHTINGS, make_prune_config
from mi_core.pruning.schedule import LR_SCHEDULES

#: ``--flag`` -> PruneConfig field, for every hyperparameter a flag can override.
_OVERRIDES: dict[str, tuple[type, str]] = {
    "steps": (int, "total steps (the warm-up scales with it unless --warmup-steps is given)"),
    "warmup_steps": (int, "steps over which the target sparsity ramps up from 0"),
    "lr_log_alpha": (float, "learning rate of the gates' log_alpha"),
    "lr_lambda": (float, "learning rate (ascent) of the Lagrangian lambdas"),
    "batch_size": (int, "examples per micro-batch"),
    "grad_accumulation": (int, "micro-batches per step"),
    "max_length": (int, "token limit per example (batches pad to their longest example)"),
    "checkpoint_every": (int, "steps between checkpoints"),
    "eval_batch_size": (int, "batch size for reference logits and evaluation"),
    "beta": (float, "hard-concrete temperature"),
    "log_alpha_init": (float, "mean of the initial log_alpha (paper 10, cofi log 99)"),
    "log_alpha_init_std": (float, "std of the initial log_alpha (paper 0.01, cofi 0)"),
    "weight_decay": (float, "AdamW weight decay on log_alpha (paper 0.01)"),
    "lambda_weight_decay": (float, "AdamW weight decay on the lambdas (paper 0.01)"),
    "lr_warmup_steps": (int, "steps of learning-rate warm-up (paper 200)"),
    "max_grad_norm": (float, "clip the gradient norm of gates and lambdas (paper 1; 0 = off)"),
}
#: ``--flag`` -> (choices, help) for PruneConfig fields that take one of a few names.
_CHOICES: dict[str, tuple[tuple[str, ...], str]] = {
    "ablation": (ABLATIONS, "fill of removed parts"),
    "sparsity_weighting": (SPARSITY_WEIGHTINGS, "count components equally or by parameters"),
    "sparsity_estimate": (
        SPARSITY_ESTIMATES,
        "sparsity in the Lagrangian: of the sampled gates (paper) or the expected L0 (cofi)",
    ),
    "lr_schedule": (LR_SCHEDULES, "linear warm-up and decay to 0 (paper) or constant (cofi)"),
    "discretize": (
        DISCRETIZE_RULES,
        "the authors' per-module rounding and threshold grid (paper) or exact top-k (cofi)",
    ),
}


def add_model_and_data_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``prune`` and ``sweep``: model, means, data and every hyperparameter."""
    p.add_argument("--model", required=True, help="fine-tuned checkpoint dir, hub name, or minilm")
    p.add_argument("--task", choices=["mnli", "qqp"], default=None, help="model task if ambiguous")
    p.add_argument("--means", default=None, help="means .safetensors from mi-core means")
    p.add_argument("--train", required=True, help="training data spec, e.g. mnli:train")
    p.add_argument(
        "--eval", nargs="+", default=[], metavar="DATA", help="eval sets; the first is in-domain"
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default="paper",
        help="paper: the authors' recipe; quick: the same on a short schedule; cofi: CoFi's "
        "mechanics (mi_core's earlier default)",
    )
    add_prune_config_options(p)
    p.add_argument("--max-train-examples", type=int, default=None)
    p.add_argument("--max-eval-examples", type=int, default=None)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_prune_config_options(p: argparse.ArgumentParser) -> None:
    """Flags that override single PruneConfig fields (read back by :func:`config_overrides`)."""
    for name, (choices, text) in _CHOICES.items():
        p.add_argument(f"--{name.replace('_', '-')}", choices=choices, default=None, help=text)
    p.add_argument(
        "--dropout",
        choices=("on", "off"),
        default=None,
        help="prune with the checkpoint's dropout (paper: on; cofi: off)",
    )
    for name, (kind, text) in _OVERRIDES.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=text)


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The PruneConfig fields set on the command line."""
    names = [*_OVERRIDES, *_CHOICES]
    values = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    if args.dropout is not None:
        values["dropout"] = args.dropout == "on"
    return values


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "prune",
        help="find a subnetwork by L0 pruning (hard-concrete masks, Lagrangian sparsity)",
        description="Learn a mask over attention heads and MLPs that keeps the model's class "
        "distribution (KL to the full model) at a target sparsity. Writes OUT/config.json, "
        "OUT/log.csv, OUT/mask.safetensors, OUT/mask.json and OUT/metrics.json. Re-running the "
        "same command resumes from the last checkpoint; a finished run only reports.",
    )
    add_model_and_data_options(p)
    p.add_argument("--sparsity", type=float, required=True, help="target sparsity in (0, 1)")
    p.add_argument("--seed", type=int, default=42)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from mi_core.pruning.run import prune_run

    config = make_prune_config(args.profile, args.sparsity, args.seed, **config_overrides(args))
    result = prune_run(
        args.model,
        args.train,
        args.out,
        config,
        means=args.means,
        eval_sets=args.eval,
        task=args.task,
        max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples,
        progress=False if args.no_progress else None,
    )
    if result.already_complete:
        print(f"{args.out} is already complete; its result:")
    m = result.metrics
    print(f"achieved sparsity {m['achieved_sparsity']:.4f} ({m['n_removed']}/{m['n_components']})")
    if m.get("reached_target") is False:
        print(
            f"warning: the sparsity ended at {m['final_sparsity']:.3f}, not near the target "
            f"{m['target_sparsity']:g}: the gates did not converge (more --steps?)",
            file=sys.stderr,
        )
    for name, acc in m["accuracy"].items():
        print(f"{name}: subnetwork {acc:.4f}  full model {m['full_accuracy'][name]:.4f}")
    print(f"mask and metrics in {args.out}")
