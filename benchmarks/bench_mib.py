"""MIB's circuit scores: mi_core's ``mib_score`` vs MIB's own evaluator (hannamw/MIB-circuit-track
``evaluate_area_under_curve`` on hannamw/EAP-IG, from ../shared/peers/mib) on the same model,
scores and pairs: wall time of all ten circuit sizes each, their ratio (target: MIB / ours
>= 5), and how far apart the CPR, CMD and faithfulnesses are (target 1e-4).

The scores are EAP's on the pairs (one backward pass); both sides rank them by ``|score|``.

    python benchmarks/bench_mib.py [--model smollm2] [--pairs 32] [--batch 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mi_core.circuits import attribute, mib_score
from mi_core.circuits.evaluate import mib_scores
from mi_core.circuits.job import load_circuit_pairs
from mi_core.models import load_model
from mi_core.testing import load_mib_peer, mib_reference_score

PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers" / "mib"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--model", "smollm2"), ("--pairs", 32), ("--batch", 16),
                          ("--threads", 2)):  # fmt: skip
        parser.add_argument(flag, type=type(default), default=default)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peer = load_mib_peer(PEERS)
    model = load_model(args.model)
    pairs = load_circuit_pairs(model, "ioi", args.pairs)
    scores = attribute(model, pairs, "eap", batch_size=args.batch, progress=False)
    dense = scores.graph.to_dense(mib_scores(scores.scores, scores.method).float())

    start = time.perf_counter()
    ours = mib_score(model, scores, pairs, absolute=True, batch_size=args.batch)
    t_ours = time.perf_counter() - start
    start = time.perf_counter()
    _, cpr, cmd, _, faithfulness = mib_reference_score(peer, model, dense, pairs, True,
                                                       args.batch)  # fmt: skip
    t_theirs = time.perf_counter() - start
    gap = max(abs(a - b) for a, b in zip(ours.faithfulness, faithfulness, strict=True))
    print(f"{args.model}, {len(pairs)} IOI pairs, {scores.graph.n_edges} edges, ten circuit "
          f"sizes, {args.threads} threads:")  # fmt: skip
    print(f"  mi_core mib_score   {t_ours:8.1f} s   CPR {ours.cpr:.4f}  CMD {ours.cmd:.4f}")
    print(f"  MIB's evaluator     {t_theirs:8.1f} s   CPR {cpr:.4f}  CMD {cmd:.4f}")
    print(f"MIB / ours = {t_theirs / t_ours:.1f}x  (target >= 5)")
    print(f"largest faithfulness difference {gap:.2e}, CPR {abs(ours.cpr - cpr):.2e}, "
          f"CMD {abs(ours.cmd - cmd):.2e}  (target 1e-4)")  # fmt: skip


if __name__ == "__main__":
    main()
