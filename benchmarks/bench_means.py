"""Means over a data set vs a plain forward pass over the same examples.

Prints the ratio means time / forward time (target at most 1.1). Both run over the same
length-sorted batches, interleaved chunk by chunk (means of a chunk of batches, then a plain
forward over the same chunk), so background load affects both alike. Each chunk's means call
also hashes the model's weights for the file's fingerprint, which counts against the means.

    python benchmarks/bench_means.py [--model minilm] [--examples 10000]
"""

from __future__ import annotations

import time

import torch
from bench_args import mnli_parser

from mi_core.data import load_pairs, pair_batches
from mi_core.interventions import compute_means
from mi_core.models import load_model


def main() -> None:
    parser = mnli_parser(__doc__, examples=10000)
    parser.set_defaults(data="mnli:train")
    parser.add_argument("--chunk", type=int, default=20, help="batches per interleaved chunk")
    args = parser.parse_args()

    model = load_model(args.model, task="mnli")
    data = load_pairs(args.data, max_examples=args.examples)
    batches = list(
        pair_batches(data, model.tokenizer, batch_size=args.batch_size, sort_by_length=True)
    )
    compute_means(model, batches[-1:])  # warm-up
    with torch.inference_mode():
        model(**batches[-1])
    means_t = forward_t = 0.0
    n_tokens = 0
    for start in range(0, len(batches), args.chunk):
        chunk = batches[start : start + args.chunk]
        t0 = time.perf_counter()
        n_tokens += compute_means(model, chunk, dataset=data.name).n_tokens
        t1 = time.perf_counter()
        with torch.inference_mode():
            for batch in chunk:
                model(**batch)
        t2 = time.perf_counter()
        means_t += t1 - t0
        forward_t += t2 - t1
    print(
        f"model {args.model}, {len(data)} examples ({n_tokens} tokens) of {args.data}, "
        f"batch {args.batch_size}, torch threads {torch.get_num_threads()}"
    )
    print(f"means (float64 sums, hooks): {means_t:8.2f} s")
    print(f"plain forward              : {forward_t:8.2f} s")
    print(f"ratio means / forward      : {means_t / forward_t:.3f}   (target <= 1.1)")


if __name__ == "__main__":
    main()
