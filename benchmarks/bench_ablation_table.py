"""All-heads single-ablation table: cached-prefix computation vs one full forward per ablation.

Prints the ratio naive time / our time (target at least 1.8) and the largest absolute logit
difference between the two (target at most 1e-5). Both compute the full model and every head's
mean ablation on the same length-sorted batches; they run interleaved, batch by batch, so
background load affects both alike.

    python benchmarks/bench_ablation_table.py [--model minilm] [--examples 1000]
"""

from __future__ import annotations

import time

import torch
from bench_args import mnli_parser

from mi_core.data import load_pairs, pair_batches
from mi_core.interventions import all_heads, compute_means
from mi_core.interventions.ablation_table import ablation_logits, naive_ablation_logits
from mi_core.models import load_model


def main() -> None:
    parser = mnli_parser(__doc__)
    parser.add_argument("--means-examples", type=int, default=500)
    args = parser.parse_args()

    model = load_model(args.model, task="mnli")
    data = load_pairs(args.data, max_examples=args.examples)
    batches = list(
        pair_batches(data, model.tokenizer, batch_size=args.batch_size, sort_by_length=True)
    )
    train = load_pairs("mnli:train", max_examples=args.means_examples)
    means = compute_means(
        model, pair_batches(train, model.tokenizer, batch_size=64, sort_by_length=True)
    )
    heads = all_heads(model)
    warm = [batches[-1]]  # the shortest batch
    ablation_logits(model, warm, heads, means=means)
    naive_ablation_logits(model, warm, heads, means=means)

    ours_t = naive_t = max_diff = 0.0
    for batch in batches:
        t0 = time.perf_counter()
        ours = ablation_logits(model, [batch], heads, means=means)
        t1 = time.perf_counter()
        naive = naive_ablation_logits(model, [batch], heads, means=means)
        t2 = time.perf_counter()
        ours_t += t1 - t0
        naive_t += t2 - t1
        max_diff = max(max_diff, ours.max_abs_diff(naive))
    print(
        f"model {args.model}, {len(data)} examples of {args.data}, {len(heads)} heads + full "
        f"model, batch {args.batch_size}, torch threads {torch.get_num_threads()}"
    )
    print(f"naive loop (1 forward per ablation): {naive_t:8.2f} s")
    print(f"cached prefix + stacked heads      : {ours_t:8.2f} s")
    print(f"ratio naive / ours                 : {naive_t / ours_t:.2f}   (target >= 1.8)")
    print(f"max |logit diff|                   : {max_diff:.2e}   (target <= 1e-5)")


if __name__ == "__main__":
    main()
