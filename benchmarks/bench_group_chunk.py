"""Examples per forward pass of a batched group: which ``max_chunk`` is cheapest here?

A batched group (``mi_core.pruning.prune_group``) regroups the concatenated micro-batches of
its runs by length into forward passes of at most ``max_chunk`` examples
(:func:`mi_core.pruning.step.length_chunks`); :func:`mi_core.pruning.step.default_chunk` picks
the runs' micro-batch size on a CPU and one pass on a GPU. This times the same group (MiniLM
with a seeded MNLI head, the ``quick`` profile sliced to ``--steps`` steps of 16, 2 sparsities
x 4 seeds, dropout off, no evaluation, the reference logits computed once beforehand) at
several chunk sizes, interleaved over ``--repeats`` rounds, and prints each time and its ratio
to the default's::

    python benchmarks/bench_group_chunk.py [--steps 20] [--chunks 16,32,64,128] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    from mi_core.data import load_pairs, pair_batches
    from mi_core.interventions import compute_means
    from mi_core.models import load_model
    from mi_core.pruning.profiles import make_prune_config
    from mi_core.pruning.run import prune_group
    from mi_core.pruning.step import default_chunk

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--chunks", default="16,32,64,128", help="comma-separated sizes")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--train-examples", type=int, default=4000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    model = load_model("minilm", task="mnli", seed=0, device=args.device)
    train = load_pairs("mnli:train", max_examples=args.train_examples)
    means = compute_means(model, pair_batches(train, model.tokenizer, batch_size=64))
    steps = args.steps
    configs = [
        make_prune_config(
            "quick",
            sparsity,
            seed,
            dropout=False,
            steps=steps,
            warmup_steps=max(1, steps // 2),
            lr_warmup_steps=max(1, steps // 4),
            checkpoint_every=10_000,
        )  # fmt: skip
        for sparsity in (0.3, 0.5)
        for seed in (1, 2, 3, 4)
    ]
    default = default_chunk(model, configs[0])
    chunks = [int(c) for c in args.chunks.split(",")]
    print(f"MiniLM on {args.device} ({torch.get_num_threads()} threads): a group of "
          f"{len(configs)} runs, {steps} steps of {configs[0].batch_size}; default chunk "
          f"{default}")  # fmt: skip
    times: dict[int, list[float]] = {c: [] for c in chunks}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prune_group(model, train, means, configs[:1], [root / "ref"], progress=False)
        reference = root / "ref" / "reference_logits.safetensors"
        for repeat in range(args.repeats):
            for chunk in chunks:
                dirs = [root / f"c{chunk}-{repeat}-{k}" for k in range(len(configs))]
                started = time.perf_counter()
                prune_group(
                    model, train, means, configs, dirs, reference_logits_path=reference,
                    progress=False, max_chunk=chunk,
                )  # fmt: skip
                if args.device == "cuda":
                    torch.cuda.synchronize()
                times[chunk].append(time.perf_counter() - started)
    base = statistics.median(times[default]) if default in times else None
    for chunk in chunks:
        median = statistics.median(times[chunk])
        ratio = f"  {median / base:.2f}x the default's" if base else ""
        runs = " / ".join(f"{t:.1f}" for t in times[chunk])
        print(f"chunk {chunk:>4}: {runs} s{ratio}")


if __name__ == "__main__":
    main()
