"""A causal LM's attention: the fused path (``scaled_dot_product_attention``) vs TransformerLens's.

A loaded LM's attention takes the fused path whenever no hook reads its scores or pattern
(``mi_core.models.fast_paths``). This times a no-grad forward of the same loaded model with the
attention modules on each path, interleaved (A, B, B, A, ...), at a short and a long context,
and prints the ratio and the largest logit difference.

``--device cuda`` times on a GPU (after ``torch.cuda.synchronize``) and also prints the peak
``max_memory_allocated`` of each path; ``--random-weights`` draws the weights of a folder holding
only ``config.json`` and the tokenizer (as in ``bench_circuits.py``).

    python benchmarks/bench_lm_attention.py [--model smollm2] [--shapes 8x64,4x512] [--repeats 4]
        [--device cuda] [--random-weights]
"""

from __future__ import annotations

import argparse
import time

import torch
from random_weights import random_checkpoint
from transformer_lens.components.abstract_attention import AbstractAttention

from mi_core.models import load_model
from mi_core.models.fast_paths import FastGroupedQueryAttention, FastLMAttention, _fast_lm_attention


def _use(fused: bool) -> None:
    forward = _fast_lm_attention if fused else AbstractAttention.forward
    FastLMAttention.forward = forward
    FastGroupedQueryAttention.forward = forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--shapes", default="8x64,4x512", help="batch x tokens, comma-separated")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-weights", action="store_true")
    args = parser.parse_args()
    name = str(random_checkpoint(args.model)) if args.random_weights else args.model
    model = load_model(name, device=args.device)
    cuda = args.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    gen = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        batch, tokens = (int(x) for x in shape.split("x"))
        ids = torch.randint(100, model.cfg.d_vocab - 1, (batch, tokens), generator=gen)
        ids = ids.to(args.device)
        times: dict[bool, float] = {True: 0.0, False: 0.0}
        logits: dict[bool, torch.Tensor] = {}
        peak: dict[bool, float] = {}
        with torch.no_grad():
            for fused in (True, False):  # warm both; the peak memory of each
                _use(fused)
                if cuda:
                    sync()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                logits[fused] = model(ids)
                if cuda:
                    sync()
                    peak[fused] = (torch.cuda.max_memory_allocated() - base) / 2**20
            for i in range(args.repeats):
                for fused in (True, False) if i % 2 else (False, True):
                    _use(fused)
                    sync()
                    start = time.perf_counter()
                    model(ids)
                    sync()
                    times[fused] += time.perf_counter() - start
        _use(True)
        n = args.repeats
        diff = float((logits[True] - logits[False]).abs().max())
        memory = f"; peak memory {peak[True]:.0f} vs {peak[False]:.0f} MiB" if cuda else ""
        print(f"{batch} x {tokens} tokens on {args.device}: fused {times[True] / n:.3f} s, "
              f"TransformerLens {times[False] / n:.3f} s a forward: "
              f"{times[False] / times[True]:.2f} x; largest logit difference {diff:.1e}"
              f"{memory}")  # fmt: skip


if __name__ == "__main__":
    main()
