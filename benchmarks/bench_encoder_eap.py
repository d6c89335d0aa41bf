"""EAP on a post-LN encoder: gradients kept at the heads' projections vs at split inputs.

The encoder EAP keeps every receiver's gradient until the sweep over the senders. At the
query / key / value projections (``hook_q`` ...; the model runs unsplit) a head's gradient is
``d_head`` wide; at TransformerLens's split inputs it is ``d_model`` wide, one copy of the
stream per head. Both give the same scores (tested). This prints the time and the peak memory
(RSS above the loaded model, each in a fresh process; CPU memory only) of one EAP-IG call
both ways, and the largest score difference.

    python benchmarks/bench_encoder_eap.py [--model minilm] [--batch 16] [--tokens 64] [--steps 5]
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from peak_memory import peak_growth

from mi_core.circuits import Graph, logit_difference
from mi_core.circuits.attribution import _sweep_attribution, fill_outputs, ig_alphas
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.models import load_model
from mi_core.models.frozen import frozen


def _pairs(model, batch: int, tokens: int) -> PromptPairs:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (2, batch, tokens), generator=gen)
    return PromptPairs(
        clean_ids=ids[0],
        corrupted_ids=ids[1],
        attention_mask=torch.ones(batch, tokens, dtype=torch.long),
        answer=torch.randint(0, 3, (batch,), generator=gen),
        distractor=torch.full((batch,), -1),
        position=torch.zeros(batch, dtype=torch.long),
        kind="classifier",
    )


def _run(model, graph, pairs, steps: int, projected: bool) -> torch.Tensor:
    with frozen(model, eval_mode=False):
        reference = fill_outputs(model, graph, pairs, "corrupted", None)
        return _sweep_attribution(
            model, graph, pairs, logit_difference, ig_alphas(steps), reference, projected=projected
        )


def _measure(args) -> None:
    model = load_model(args.model, task="mnli", seed=0)
    graph = Graph.from_model(model)
    pairs = _pairs(model, args.batch, args.tokens)
    _run(model, graph, _pairs(model, 2, 8), 1, args.measure == "projected")  # warm up
    with peak_growth() as peak:
        start = time.perf_counter()
        scores = _run(model, graph, pairs, args.steps, args.measure == "projected")
        seconds = time.perf_counter() - start
    torch.save(scores, f"{args.scores_dir}/{args.measure}.pt")
    print(json.dumps({"mib": peak["mib"], "seconds": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--measure", choices=["projected", "split"], help=argparse.SUPPRESS)
    parser.add_argument("--scores-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure(args)
        return
    scores_dir = tempfile.mkdtemp(prefix="bench-encoder-eap-")
    atexit.register(shutil.rmtree, scores_dir, True)
    base = [sys.executable, __file__, "--model", args.model, "--batch", str(args.batch),
            "--tokens", str(args.tokens), "--steps", str(args.steps),
            "--scores-dir", scores_dir]  # fmt: skip
    result = {}
    for what in ("split", "projected"):
        out = subprocess.run([*base, "--measure", what], capture_output=True, text=True, check=True)
        result[what] = json.loads(out.stdout.strip().splitlines()[-1])
    diff = (
        (
            torch.load(f"{scores_dir}/split.pt", weights_only=True)
            - torch.load(f"{scores_dir}/projected.pt", weights_only=True)
        )
        .abs()
        .max()
    )
    split, projected = result["split"], result["projected"]
    print(f"{args.model}, {args.batch} x {args.tokens} tokens, EAP-IG with {args.steps} steps")
    print(f"time: split inputs {split['seconds']:.2f} s, projections {projected['seconds']:.2f} s: "
          f"ratio {split['seconds'] / projected['seconds']:.2f}")  # fmt: skip
    ratio = split["mib"] / max(projected["mib"], 1)
    print(f"peak memory above the model: split inputs {split['mib']:.0f} MiB, projections "
          f"{projected['mib']:.0f} MiB: ratio {ratio:.2f}")  # fmt: skip
    print(f"largest score difference: {float(diff):.2e}")


if __name__ == "__main__":
    main()
