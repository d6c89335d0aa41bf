"""Does the pruning recipe decide the answer? The authors' recipe against CoFi's, same model.

Prunes one fine-tuned classifier with the ``quick`` profile (the authors' recipe on a short
schedule) and with ``cofi`` (CoFi's mechanics) on the *same* schedule (steps, warm-up, batch),
at one target sparsity with several seeds each, and prints per recipe:

* the sparsity over steps (sampled and expected; ``sparsity_over_steps.html``);
* each subnetwork's achieved sparsity and its in-domain and out-of-domain accuracy;
* head frequencies (``head_frequency.csv``), the heads every subnetwork of a recipe keeps, and
  the Spearman correlation of the two recipes' head frequencies, plus the Jaccard overlap of
  the removed sets within and across recipes.

Every run is an ordinary sweep run (resumable; a re-run only reports)::

    python experiments/recipe_comparison.py --model runs/ft/checkpoint-200 \\
        --means means.safetensors --out runs/recipes --seeds 1-4 --sparsity 0.5

``--full`` compares ``paper`` and ``cofi`` on the paper's own schedule instead (a GPU job).
``--set FIELD=VALUE`` (repeatable) changes one field of the base recipe (a schedule field changes
CoFi's too), e.g. ``--set warmup_steps=300``; ``--base-only`` skips the CoFi runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import pandas as pd
import torch

from mi_core.analysis.subnetworks import core_heads, frequency_spearman, head_frequency
from mi_core.interventions import ComponentMask
from mi_core.io import write_csv, write_text
from mi_core.pruning import make_prune_config
from mi_core.pruning.profiles import parse_seed_spec
from mi_core.pruning.sweeps import run_dir_for, run_sweep
from mi_core.viz.figures import pruning_dynamics, write_figure_html
from mi_core.viz.page import markdown_table

#: The schedule fields the CoFi recipe borrows from the recipe it is compared with.
SCHEDULE_FIELDS = (
    "steps",
    "warmup_steps",
    "batch_size",
    "grad_accumulation",
    "eval_every",
    "checkpoint_every",
)


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(1, len(a | b))


def _mean_pairwise(sets: list[set[str]]) -> float:
    pairs = list(itertools.combinations(sets, 2))
    return sum(_jaccard(a, b) for a, b in pairs) / max(1, len(pairs))


def _parse_setting(item: str) -> tuple[str, object]:
    """``FIELD=VALUE`` with VALUE read as JSON where it can be (numbers, booleans)."""
    name, _, value = item.partition("=")
    try:
        return name.strip(), json.loads(value)
    except json.JSONDecodeError:
        return name.strip(), value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="fine-tuned classifier checkpoint")
    parser.add_argument("--means", required=True, help="means .safetensors (mi-core means)")
    parser.add_argument("--train", default="mnli:train")
    parser.add_argument("--max-train-examples", type=int, default=800)
    parser.add_argument(
        "--eval", nargs="+", default=["mnli:validation_matched", "hans:so_swap", "hans:embed_if"]
    )
    parser.add_argument("--max-eval-examples", type=int, default=300)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument(
        "--seeds", default="1-4", help="1-4 or 1,2,5 name seeds; a bare count N means 0 to N-1"
    )
    parser.add_argument("--full", action="store_true", help="paper vs cofi on the paper schedule")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override one field of the base recipe (repeatable)",
    )
    parser.add_argument("--base-only", action="store_true", help="skip the CoFi runs")
    parser.add_argument(
        "--executor",
        default="local",
        choices=["local", "batched"],
        help="batched: each recipe's seeds train together (same masks, dropout aside)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    out = Path(args.out)
    seeds = parse_seed_spec(args.seeds)
    base = "paper" if args.full else "quick"
    changes = dict(_parse_setting(item) for item in args.set)
    reference = make_prune_config(base, args.sparsity, seeds[0], **changes)
    schedule = {name: getattr(reference, name) for name in SCHEDULE_FIELDS}
    recipes = {base: changes} if args.base_only else {base: changes, "cofi": schedule}

    rows, logs, removed, freqs = [], [], {}, {}
    for name, overrides in recipes.items():
        table = run_sweep(
            args.model,
            args.train,
            out / name,
            [args.sparsity],
            seeds,
            means=args.means,
            eval_sets=args.eval,
            profile=name,
            overrides=overrides,
            max_train_examples=args.max_train_examples,
            max_eval_examples=args.max_eval_examples,
            executor=args.executor,
        )
        masks = []
        removed[name] = []
        for seed in seeds:
            run_dir = run_dir_for(out / name, args.sparsity, seed)
            mask = ComponentMask.load(run_dir / "mask.safetensors")
            masks.append(mask.heads.bool())
            removed[name].append({str(c) for c in mask.removed()})
            log = pd.read_csv(run_dir / "log.csv").assign(recipe=name, seed=seed)
            logs.append(log)
        freqs[name] = head_frequency(torch.stack(masks))
        for _, row in table.iterrows():
            rows.append(
                {
                    "recipe": name,
                    "seed": int(row["seed"]),
                    "achieved_sparsity": row["achieved_sparsity"],
                    "n_removed": int(row["n_removed"]),
                    "removed_mlps": sum(
                        c.endswith("MLP") for c in removed[name][seeds.index(row["seed"])]
                    ),
                    **{c: row[c] for c in table.columns if c.startswith(("acc_", "full_acc_"))},
                }
            )
        core = core_heads(torch.stack(masks))
        print(f"{name}: {len(core)} heads kept by all {len(seeds)} subnetworks: {', '.join(core)}")

    results = pd.DataFrame(rows)
    write_csv(out / "recipe_comparison.csv", results)
    names = list(recipes)
    frequency = pd.DataFrame({n: freqs[n].flatten().numpy() for n in names})
    n_layers, n_heads = freqs[names[0]].shape
    frequency.index = [f"L{l}.H{h}" for l in range(n_layers) for h in range(n_heads)]
    write_csv(out / "head_frequency.csv", frequency.reset_index(names="head"))

    log = pd.concat(logs)
    log["run"] = log["recipe"] + " seed " + log["seed"].astype(str)
    # the runs probe their subnetworks on the first eval set, whose column comes first (by its
    # loaded name: hans:so_swap is hans:ln_subject/object_swap)
    full_column = next(c for c in results.columns if c.startswith("full_acc_"))
    fig = pruning_dynamics(
        log,
        full_accuracy=float(results[full_column].iloc[0]),
        eval_name=full_column[len("full_acc_") :],
        title=f"Sparsity over steps: {' vs '.join(names)} (target {args.sparsity:g})",
    )
    write_figure_html(fig, out / "sparsity_over_steps.html")

    acc_cols = [c for c in results.columns if c.startswith("acc_")]
    summary = results.groupby("recipe")[["achieved_sparsity", "removed_mlps", *acc_cols]].mean()
    lines = [
        f"# Recipe comparison at {args.sparsity:.0%} sparsity, seeds {args.seeds}",
        "",
        markdown_table(results),
        "",
        "Mean per recipe:",
        "",
        markdown_table(summary.reset_index()),
        "",
        *(
            f"Jaccard of removed sets within {name}: {_mean_pairwise(removed[name]):.3f}"
            for name in names
        ),
    ]
    if len(names) == 2:
        rho, p = frequency_spearman(freqs[names[0]], freqs[names[1]])
        across = sum(_jaccard(a, b) for a in removed[names[0]] for b in removed[names[1]])
        lines += [
            f"Spearman rho of head frequencies ({names[0]} vs {names[1]}): {rho:.3f} (p = {p:.2g})",
            f"Jaccard of removed sets across: {across / len(seeds) ** 2:.3f}",
        ]
    text = "\n".join(lines) + "\n"
    write_text(out / "summary.md", text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
