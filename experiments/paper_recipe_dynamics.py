"""The authors' pruning dynamics on a toy problem with the paper's full schedule (seconds on CPU).

156 gates (BERT-base's 144 heads + 12 MLPs), half nearly useless (removal cost 0.02-0.08), half
important (1-2), optimised exactly as the ``paper`` profile optimises a model's gates: sampled-gate
sparsity in the Lagrangian, ``log_alpha ~ N(10, 0.01)``, AdamW with weight decay 0.01, lr 0.1 / 1
with a 200-step warm-up and linear decay, clipping at 1, 9,300 steps with the target ramped over
9,000. Prints the sampled sparsity (mean of 50 steps) against the target every 1,000 steps and
the first step at which it passes 0.05 -- the paper observes that sparsity "stays near zero until
the target reaches ~0.15", because weight decay must first pull ``log_alpha`` down from 10 --
and whether the discretised mask removes the useless half.

    python experiments/paper_recipe_dynamics.py [--target 0.5] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch

from mi_core.pruning import (
    HardConcrete,
    LagrangianController,
    pruning_optimizer,
    target_sparsity_at,
)
from mi_core.pruning.discretize import reference_binary_mask
from mi_core.pruning.lagrangian import sampled_sparsity
from mi_core.pruning.schedule import lr_factor, paper_schedule


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n_layers, n_heads = 12, 12
    n = n_layers * n_heads + n_layers
    warmup, total = paper_schedule(args.target)
    gen = torch.Generator().manual_seed(args.seed)
    k = round(args.target * n)
    cost = torch.cat(
        [0.02 + 0.06 * torch.rand(k, generator=gen), 1 + torch.rand(n - k, generator=gen)]
    )
    cost = cost[torch.randperm(n, generator=gen)]
    gates = HardConcrete(n, init_mean=10.0, init_std=0.01, generator=gen)
    controller = LagrangianController()
    optimizer = pruning_optimizer(gates.parameters(), controller, 0.1, 1.0, 0.01, 0.01)
    bases = [group["lr"] for group in optimizer.param_groups]
    trained = [gates.log_alpha, *controller.parameters()]
    noise = torch.Generator().manual_seed(args.seed + 1)
    history: list[float] = []
    first = None
    print(f"{'step':>6} {'target':>7} {'sampled':>8} {'mean log_alpha':>15}")
    for step in range(total):
        for group, base in zip(optimizer.param_groups, bases, strict=True):
            group["lr"] = base * lr_factor(step, 200, total)
        z = gates.sample(noise)
        t = sampled_sparsity(z)
        target = target_sparsity_at(step, args.target, warmup)
        loss = (cost * (1 - z)).sum() + controller.penalty(t, target)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        history.append(t.item())
        recent = sum(history[-50:]) / len(history[-50:])
        if first is None and step >= 50 and recent > 0.05:
            first = (step, target)
        if step % 1000 == 0 or step == total - 1:
            print(f"{step:>6} {target:>7.3f} {recent:>8.3f} {gates.log_alpha.mean().item():>15.2f}")
    keep, achieved = reference_binary_mask(gates.log_alpha, n_layers, n_heads, args.target)
    useless = set(torch.argsort(cost)[:k].tolist())
    removed = set(torch.nonzero(~keep).flatten().tolist())
    print(f"sampled sparsity first above 0.05 at step {first[0]} (target {first[1]:.3f})")
    print(
        f"discretised: {achieved.by_count:.3f} sparsity (threshold {achieved.threshold}); "
        f"{len(removed & useless)} of {len(removed)} removed gates are from the useless half"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
