"""Peak memory of a batched pruning step against ``auto_group_size``'s estimate.

``--executor batched`` without ``--group-size`` trains as many runs together as half the free
memory holds, by :func:`mi_core.pruning.sweeps.training_bytes_per_example` (a per-example
activation estimate). This measures what one group step really holds: for each group size K, a
fresh process loads MiniLM (the embedded all-MiniLM-L6-v2, MNLI head), builds K runs of 16
examples each (the ``quick`` profile's micro-batch), padded to the batch's longest pair, and
takes one forward / backward pass; the peak resident memory above the same process after a
K = 1 step (model, data, allocator warm) is divided by the examples added and set against
the estimate at the same width. Prints, per K, measured and estimated bytes per example and
their ratio (estimate / measured: above 1 means the estimate is generous, as it must be)::

    python benchmarks/bench_group_memory.py                 # K = 2, 4, 8 on the CPU
    python benchmarks/bench_group_memory.py --device cuda   # peak CUDA memory instead

On CUDA the peak is ``torch.cuda.max_memory_allocated`` (reset after the K = 1 step).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def _measure(k: int, device: str) -> dict[str, float]:
    """One group step of ``k`` runs in this process; the peak memory it added."""
    import resource

    import torch

    from mi_core.data import load_pairs
    from mi_core.data.batches import tokenize_pairs
    from mi_core.interventions import ComponentMask, ablate
    from mi_core.models import load_model
    from mi_core.pruning.hard_concrete import HardConcrete
    from mi_core.pruning.lagrangian import LagrangianController
    from mi_core.pruning.step import StepMember, group_pruning_step
    from mi_core.pruning.sweeps import training_bytes_per_example

    torch.manual_seed(0)
    model = load_model("minilm", task="mnli", device=device)
    train = load_pairs("mnli:train", max_examples=16 * max(k, 1))
    tokenized = tokenize_pairs(train, model.tokenizer, 128)
    n = model.cfg.n_layers * (model.cfg.n_heads + 1)

    def step(runs: int) -> int:
        members = [
            StepMember(
                HardConcrete(n, init_mean=2.0, init_std=0.5).to(device),
                LagrangianController().to(device),
                0.5,
                torch.Generator(device=device).manual_seed(r),
            )
            for r in range(runs)
        ]
        batch = tokenized.collate(list(range(16 * runs)))
        reference = torch.zeros(len(tokenized), 3, device=device)
        mask = ComponentMask.ones(model, device=device)
        with ablate(model, mask, None, "zero", skip_unmasked=False):
            group_pruning_step(model, mask, members, [batch], [[16] * runs], reference)
        return int(batch["input_ids"].shape[1])

    for p in model.parameters():
        p.requires_grad_(False)
    step(1)  # warm: the model, the data and the allocator
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.max_memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    width = step(k)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    added = 16 * (k - 1) if device != "cuda" else 16 * k  # CPU: above a K = 1 step's peak
    return {
        "k": k,
        "width": width,
        "measured_per_example": (peak - base) / max(added, 1),
        "estimated_per_example": training_bytes_per_example(model, width),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8", help="group sizes K, comma-separated")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(_measure(args.child, args.device)))
        return
    print(f"{'K':>3} {'width':>5} {'measured MiB/ex':>16} {'estimated MiB/ex':>17} {'ratio':>6}")
    for k in (int(s) for s in args.sizes.split(",")):
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(k), "--device", args.device],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(done.stdout.strip().splitlines()[-1])
        measured = row["measured_per_example"] / 2**20
        estimated = row["estimated_per_example"] / 2**20
        ratio = estimated / measured if measured > 0 else float("inf")
        print(f"{k:>3} {row['width']:>5} {measured:>16.2f} {estimated:>17.2f} {ratio:>6.2f}")


if __name__ == "__main__":
    main()
