"""A causal LM's attention: the fused path (``scaled_dot_product_attention``) vs TransformerLens's.

A loaded LM's attention takes the fused path whenever no hook reads its scores or pattern
(``mi_core.models.fast_paths``). This times a no-grad forward of the same loaded model with the
attention modules on each path, interleaved (A, B, B, A, ...), at a short and a long context,
and prints the ratio and the largest logit difference.

    python benchmarks/bench_lm_attention.py [--model smollm2] [--shapes 8x64,4x512] [--repeats 4]
"""

from __future__ import annotations

import argparse
import time

import torch
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
    args = parser.parse_args()
    model = load_model(args.model)
    gen = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        batch, tokens = (int(x) for x in shape.split("x"))
        ids = torch.randint(100, model.cfg.d_vocab - 1, (batch, tokens), generator=gen)
        times: dict[bool, float] = {True: 0.0, False: 0.0}
        logits: dict[bool, torch.Tensor] = {}
        with torch.no_grad():
            for fused in (True, False):  # warm both
                _use(fused)
                logits[fused] = model(ids)
            for i in range(args.repeats):
                for fused in (True, False) if i % 2 else (False, True):
                    _use(fused)
                    start = time.perf_counter()
                    model(ids)
                    times[fused] += time.perf_counter() - start
        _use(True)
        n = args.repeats
        diff = float((logits[True] - logits[False]).abs().max())
        print(f"{batch} x {tokens} tokens: fused {times[True] / n:.3f} s, TransformerLens "
              f"{times[False] / n:.3f} s a forward: {times[False] / times[True]:.2f} x; largest "
              f"logit difference {diff:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
