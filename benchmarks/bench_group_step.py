"""Per-step cost of a batched group against a run alone, and where a group's time goes.

K = 8 runs of the quick profile (2 sparsities x 4 seeds, dropout off) trained together vs one
run alone, on MiniLM's MNLI pairs. Each is timed at two run lengths and the difference taken, so
what a run does once (reference logits, folders, evaluation, the final mask) drops out of the
per-step figure and is printed apart as the fixed cost. ``--profile`` adds torch.profiler tables
(device and host time by operator) of a short group and a short lone run.

``--random-weights FOLDER`` builds a BERT classifier from FOLDER's ``config.json`` and tokenizer
with random weights (for a machine MiniLM's weights cannot reach; a step's cost does not depend
on the weights' values).

    python benchmarks/bench_group_step.py [--device cuda] [--steps 20,60] [--profile]
        [--precision fp32|tf32] [--random-weights FOLDER]
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
import time
from pathlib import Path

import torch
from random_weights import random_checkpoint


def main() -> None:
    from mi_core.data import load_pairs, pair_batches
    from mi_core.interventions import compute_means
    from mi_core.models import load_model
    from mi_core.pruning import make_prune_config, prune_group
    from mi_core.pruning.run import prune_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", default="20,60", help="the two run lengths, comma-separated")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32"])
    parser.add_argument("--train-examples", type=int, default=300)
    parser.add_argument("--random-weights", metavar="FOLDER")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    short, long = (int(x) for x in args.steps.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="bench-group-step-"))
    atexit.register(shutil.rmtree, tmp, True)
    name = random_checkpoint(args.random_weights, num_labels=3) if args.random_weights else "minilm"
    model = load_model(name, task="mnli", seed=0, device=args.device)
    train = load_pairs("mnli:train", max_examples=args.train_examples)
    means = compute_means(model, pair_batches(train, model.tokenizer, batch_size=64))

    def config(seed: int, sparsity: float, steps: int):
        return make_prune_config("quick", sparsity, seed).replace(
            steps=steps, checkpoint_every=10_000, dropout=False, warmup_steps=steps // 2,
            lr_warmup_steps=steps // 4, precision=args.precision,
        )  # fmt: skip

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def alone(steps: int, tag: str) -> float:
        sync()
        started = time.perf_counter()
        prune_run(model, train, tmp / f"alone-{tag}", config(1, 0.5, steps), means=means)
        sync()
        return time.perf_counter() - started

    def group(steps: int, tag: str) -> float:
        configs = [config(s, sp, steps) for sp in (0.3, 0.5) for s in (1, 2, 3, 4)]
        sync()
        started = time.perf_counter()
        prune_group(model, train, means, configs, [tmp / f"group-{tag}-{k}" for k in range(8)])
        sync()
        return time.perf_counter() - started

    group(5, "warm")  # the allocator's blocks and the kernels' first launches
    alone(5, "warm")
    a1, a2 = alone(short, "a"), alone(long, "b")
    g1, g2 = group(short, "a"), group(long, "b")
    a_step, g_step = (a2 - a1) / (long - short), (g2 - g1) / (long - short)
    print(f"{args.device}, {args.precision}: a run alone {a_step * 1e3:.1f} ms a step, a group "
          f"of 8 {g_step * 1e3:.1f} ms a step: 8 alone / group {8 * a_step / g_step:.2f}; fixed "
          f"cost alone {a1 - short * a_step:.2f} s, group {g1 - short * g_step:.2f} s")  # fmt: skip
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if args.device.startswith("cuda"):
            activities.append(ProfilerActivity.CUDA)
        key = "self_device_time_total" if len(activities) > 1 else "self_cpu_time_total"
        for label, fn in (("group", group), ("alone", alone)):
            with profile(activities=activities) as prof:
                fn(short, "profile")
            table = prof.key_averages()
            print(f"== {label}, {short} steps, by {key}")
            print(table.table(sort_by=key, row_limit=20, max_name_column_width=60))
            print(table.table(sort_by="self_cpu_time_total", row_limit=15,
                              max_name_column_width=60))  # fmt: skip


if __name__ == "__main__":
    main()
