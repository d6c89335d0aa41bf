"""Wall-clock of a pruning sweep: runs one after another (``local``) vs trained together
(``batched``), side by side in one process, with the masks compared.

The sweep of issue 14: MiniLM (the embedded all-MiniLM-L6-v2 with a seeded MNLI head), the
``quick`` profile (the authors' recipe, 600 steps of 16), 2 sparsities x 4 seeds = 8 runs, each
evaluated on MNLI matched at the end. ``local`` trains the 8 runs one after another, ``batched``
trains them as one group of ``--group-size`` runs (one forward / backward per micro-batch through
the shared frozen model). Both sweeps share the model, the means and the cached full-model logits;
each writes its own folder. Prints both times, the ratio local / batched (target >= 1.5 on 2 CPU
cores, >= 5 on a GPU), and how far the runs are apart: the largest |log_alpha| difference and the
number of components whose kept / removed state differs, over all runs.

Dropout is off by default, so the two executors should give the same masks (the equivalence the
issue asks for); ``--dropout`` keeps the recipe's dropout, where a group's dropout noise is drawn
for the whole batch and the runs can only come close::

    python benchmarks/bench_sweep.py                    # the full quick runs (about an hour)
    python benchmarks/bench_sweep.py --steps 60         # a 60-step slice of each run
    python benchmarks/bench_sweep.py --steps 60 --dropout --device cuda
    python benchmarks/bench_sweep.py --seeds 1              # 2 full quick runs each way
    python benchmarks/bench_sweep.py --device cuda --precision bf16   # bf16 autocast, both ways
    python benchmarks/bench_sweep.py --device cuda --executors batched --profile  # host time

Before the timed sweeps, each executor runs a 2-step sweep of 64 examples in a scratch folder
(``--no-warm-up`` skips it), so the first sweep timed does not pay alone for the device's
first launches.

On a GPU a group's wide fp32 forward / backward is compute-bound while a lone run's narrow one
is launch-bound, so autocast (``--precision bf16``) speeds the batched sweep far more than the
sequential one.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    from mi_core.data import load_pairs, pair_batches
    from mi_core.interventions import ComponentMask, compute_means
    from mi_core.io import read_safetensors
    from mi_core.models import load_model
    from mi_core.pruning.profiles import make_prune_config
    from mi_core.pruning.sweeps import run_dir_for, run_sweep

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: 600)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--sparsities", default="0.3,0.5", help="comma-separated")
    parser.add_argument("--seeds", type=int, default=4, help="seeds 1..N")
    parser.add_argument("--train-examples", type=int, default=4000)
    parser.add_argument("--eval-examples", type=int, default=300)
    parser.add_argument("--dropout", action="store_true", help="keep the recipe's dropout")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"],
        help="tf32 products or autocast of the forward passes, both executors (masks stay fp32)",
    )  # fmt: skip
    parser.add_argument(
        "--executors", default="local,batched", help="comma-separated: local, batched or both"
    )
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false")
    parser.add_argument(
        "--profile", action="store_true",
        help="cProfile each timed sweep and print where its host time goes (inflates the times)",
    )  # fmt: skip
    args = parser.parse_args()
    chosen = [x.strip() for x in args.executors.split(",") if x.strip()]
    if not chosen or set(chosen) - {"local", "batched"}:
        parser.error(f"--executors: choose from local, batched; got {args.executors!r}")
    if args.threads:
        torch.set_num_threads(args.threads)

    sparsities = [float(x) for x in args.sparsities.split(",")]
    seeds = list(range(1, args.seeds + 1))
    overrides = {"dropout": args.dropout, "checkpoint_every": 10_000, "precision": args.precision}
    if args.steps is not None:
        # a slice of the quick schedule: the same warm-ups, so the first steps are the real ones
        quick = make_prune_config("quick", 0.5, 0)
        overrides.update(
            steps=args.steps, warmup_steps=quick.warmup_steps, lr_warmup_steps=quick.lr_warmup_steps
        )
        if args.steps <= quick.warmup_steps:
            overrides["warmup_steps"] = max(1, args.steps // 2)
        if args.steps <= quick.lr_warmup_steps:
            overrides["lr_warmup_steps"] = max(1, args.steps // 4)
    model = load_model("minilm", task="mnli", seed=0, device=args.device)
    train = load_pairs("mnli:train", max_examples=args.train_examples)
    means = compute_means(model, pair_batches(train, model.tokenizer, batch_size=64))
    cfg = make_prune_config("quick", 0.5, 0, **overrides)
    print(
        f"MiniLM on {args.device} ({torch.get_num_threads()} threads), quick profile: "
        f"{cfg.steps} steps of {cfg.batch_size} x {cfg.grad_accumulation}, {cfg.precision}, "
        f"dropout {'on' if cfg.dropout else 'off'}; {len(sparsities)} sparsities x "
        f"{len(seeds)} seeds"
    )
    with tempfile.TemporaryDirectory() as tmp:
        means_path = means.save(Path(tmp) / "means.safetensors")
        common = dict(
            means=str(means_path),
            eval_sets=["mnli:validation_matched"],
            profile="quick",
            overrides=overrides,
            max_eval_examples=args.eval_examples,
            progress=False,
        )
        executors = {
            "local": {},
            "batched": {"executor": "batched", "group_size": args.group_size},
        }
        if args.warm_up:  # the device's first launches, paid by neither timed sweep
            # the profile scales its own warm-ups down to 2 steps
            short = {k: v for k, v in overrides.items() if not k.endswith("warmup_steps")}
            warm = dict(common, eval_sets=[], overrides=dict(short, steps=2))
            few = train.subset(range(min(64, len(train))))
            for name in chosen:
                run_sweep(model, few, Path(tmp) / f"warm-{name}", sparsities, seeds, **warm,
                          **executors[name])  # fmt: skip
        times = {}
        for name in chosen:
            # both sweeps compute their own reference logits and full-model accuracy once
            profiler = cProfile.Profile() if args.profile else None
            started = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            run_sweep(model, train, Path(tmp) / name, sparsities, seeds, **common,
                      **executors[name])  # fmt: skip
            if args.device == "cuda":
                torch.cuda.synchronize()
            times[name] = time.perf_counter() - started
            if profiler is not None:
                profiler.disable()
                stats = pstats.Stats(profiler)
                print(f"== {name}: host time by function (cProfile: the times above are inflated)")
                stats.sort_stats("cumulative").print_stats(40)
                stats.sort_stats("tottime").print_stats(25)
            print(f"{name:>8}: {times[name]:8.1f} s")
        if len(times) < 2:
            return
        print(f"local / batched: {times['local'] / times['batched']:.2f}x "
              f"(group of {args.group_size})")  # fmt: skip

        worst, differ, total = 0.0, 0, 0
        for s in sparsities:
            for seed in seeds:
                dirs = [run_dir_for(Path(tmp) / n, s, seed) for n in ("local", "batched")]
                a, b = (ComponentMask.load(d / "mask.safetensors") for d in dirs)
                la, lb = (read_safetensors(d / "checkpoint.safetensors")[0]["log_alpha"]
                          for d in dirs)  # fmt: skip
                worst = max(worst, float((la - lb).abs().max()))
                differ += int((a.heads != b.heads).sum() + (a.mlps != b.mlps).sum())
                total += a.n_components
        n_runs = len(sparsities) * len(seeds)
        print(f"max |log_alpha local - batched|: {worst:.2e}; components differing: {differ} "
              f"of {total} ({n_runs} runs)")  # fmt: skip


if __name__ == "__main__":
    main()
