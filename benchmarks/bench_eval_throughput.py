"""Evaluation throughput: our hooked classifier vs the Hugging Face model, same checkpoint+batches.

Prints the ratio of times (ours / Hugging Face; target at most 1.15). The two models run
interleaved, batch by batch, over several repeats, and each side's best repeat is kept, so
background load affects both alike.

    python benchmarks/bench_eval_throughput.py [--model minilm] [--examples 1000] [--repeats 3]
"""

from __future__ import annotations

import time

import torch
from bench_args import mnli_parser

from mi_core.data import load_pairs, pair_batches
from mi_core.evaluation import model_inputs
from mi_core.models import hooked_classifier_from_hf, load_hf_classifier


def main() -> None:
    parser = mnli_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    hf, tokenizer, task = load_hf_classifier(args.model, task="mnli")
    ours = hooked_classifier_from_hf(hf, tokenizer, task)
    data = load_pairs(args.data, max_examples=args.examples)
    batches = list(pair_batches(data, tokenizer, batch_size=args.batch_size, sort_by_length=True))
    times = {"ours": [], "hf": []}
    max_diff = 0.0
    with torch.inference_mode():
        for batch in batches[:2]:  # warm-up
            ours(**batch), hf(**model_inputs(hf, batch))
        for _ in range(args.repeats):
            total = {"ours": 0.0, "hf": 0.0}
            for batch in batches:
                t0 = time.perf_counter()
                a = ours(**batch)
                t1 = time.perf_counter()
                b = hf(**model_inputs(hf, batch)).logits
                t2 = time.perf_counter()
                total["ours"] += t1 - t0
                total["hf"] += t2 - t1
                max_diff = max(max_diff, (a - b).abs().max().item())
            for key in total:
                times[key].append(total[key])
    ours_t, hf_t = min(times["ours"]), min(times["hf"])
    n = len(data)
    print(
        f"model {args.model}, {n} examples of {args.data}, batch {args.batch_size}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"hooked classifier : {ours_t:7.2f} s  ({n / ours_t:7.1f} examples/s)")
    print(f"Hugging Face model: {hf_t:7.2f} s  ({n / hf_t:7.1f} examples/s)")
    print(f"ratio ours / HF   : {ours_t / hf_t:.3f}   (target <= 1.15)")
    print(f"max |logit diff|  : {max_diff:.2e}")


if __name__ == "__main__":
    main()
