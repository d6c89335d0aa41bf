"""mi_core's circuit methods scored as MIB scores them, on held-out IOI pairs.

Finds circuits on the first half of the IOI pairs and judges them on the held-out half with
:func:`mi_core.circuits.mib_score` (MIB's evaluator's numbers, equal to it within 1e-4): CPR
from MIB's signed ranking, CMD from its absolute ranking, as MIB reports a method. Methods:

* ``eap``, ``eap-ig`` (EAP-IG-inputs, ``--ig-steps`` steps, the left rule MIB runs): scores,
  the circuits read off them by MIB's top-n then prune;
* ``ensemble``: EAP's and EAP-IG's scores, each divided by its largest ``|score|``, summed;
* ``chosen``: nine-plus-one binary circuits chosen per size on the *finding* pairs among
  EAP-IG's readings: the absolute and the signed top-n, and unions of the top ``a`` share by
  ``|score|`` with the top ``1 - a`` share by signed score (``a`` in 0.25, 0.5, 0.75). For CPR
  the candidate of highest finding faithfulness, for CMD the one closest to 1. The held-out
  pairs never choose anything.

Prints one row per method (CPR, CMD, the faithfulness at 1 / 5 / 10 %, the KL at 5 %, wall
time) and writes them with every size's numbers to ``OUT/mib_methods.json``::

    python experiments/mib_methods.py --model smollm2 --n-examples 64 --out runs/mib_methods
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mi_core.circuits import EdgeMask, EdgeScores, Graph, edge_attribution, logit_difference
from mi_core.circuits.evaluate import masked_metrics
from mi_core.circuits.mib import MIB_PERCENTAGES, mib_circuits, mib_score
from mi_core.data.circuit_pairs import ioi_pairs
from mi_core.io import write_json
from mi_core.models import load_model

#: Shares of a chosen circuit's budget filled by ``|score|`` (the rest by signed score).
MIXES = (0.25, 0.5, 0.75)


def candidates(scores: EdgeScores) -> list[list[torch.Tensor]]:
    """Per size, the kept-edge sets ``chosen`` picks from (see the module docstring)."""
    by_abs = mib_circuits(scores, absolute=True)
    by_sign = mib_circuits(scores, absolute=False)
    graph = scores.graph
    out = [[a, s] for a, s in zip(by_abs, by_sign, strict=True)]
    for share in MIXES:
        top_abs = mib_circuits(scores, True, [p * share for p in MIB_PERCENTAGES])
        top_sign = mib_circuits(scores, False, [p * (1 - share) for p in MIB_PERCENTAGES])
        for k, (a, s) in enumerate(zip(top_abs, top_sign, strict=True)):
            out[k].append(graph.connected(a | s))
    return out


def finding_faithfulness(model, graph: Graph, kept: list[torch.Tensor], pairs, batch: int):
    """Each kept-edge set's faithfulness on ``pairs`` (the empty circuit's metric measured in
    the same pass)."""
    masks = [EdgeMask(graph, k.float()) for k in kept] + [EdgeMask.empty(graph)]
    results, full = masked_metrics(model, masks, pairs, logit_difference, batch)
    empty = float(results[-1][0].mean())
    gap = float(full.mean()) - empty
    return [(float(values.mean()) - empty) / gap for values, _ in results[:-1]]


def chosen_circuits(model, scores: EdgeScores, pairs, batch: int, for_cmd: bool):
    """One circuit per size, chosen on the finding ``pairs``."""
    graph = scores.graph
    per_size = candidates(scores)
    flat = [k for size in per_size for k in size]
    faith = finding_faithfulness(model, graph, flat, pairs, batch)
    circuits, i = [], 0
    for size in per_size:
        values = faith[i : i + len(size)]
        i += len(size)
        best = min(range(len(size)), key=lambda j: abs(1 - values[j]) if for_cmd else -values[j])
        circuits.append(EdgeMask(graph, size[best].float()))
    return circuits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default in (("--model", str, "smollm2"), ("--n-examples", int, 64),
                                ("--ig-steps", int, 5), ("--batch-size", int, 16),
                                ("--out", Path, None)):  # fmt: skip
        parser.add_argument(flag, type=kind, default=default, required=default is None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = load_model(args.model)
    find, held = ioi_pairs(model.tokenizer, n=args.n_examples, seed=0).split(0.5)
    graph = Graph.from_model(model)
    rows, timings, scored = [], {}, {}
    for name, steps in (("eap", 1), ("eap-ig", args.ig_steps)):
        start = time.perf_counter()
        values = edge_attribution(model, graph, find, logit_difference, steps=steps)
        timings[name] = time.perf_counter() - start
        scored[name] = EdgeScores(graph, values, name, len(find))
    ensemble = sum(s.scores / s.scores.abs().max() for s in scored.values())
    scored["ensemble"] = EdgeScores(graph, ensemble, "eap-ig", len(find))
    timings["ensemble"] = timings["eap"] + timings["eap-ig"]
    for name, scores in scored.items():
        start = time.perf_counter()
        cpr = mib_score(model, scores, held, absolute=False, batch_size=args.batch_size)
        cmd = mib_score(model, scores, held, absolute=True, batch_size=args.batch_size)
        rows.append((name, cpr, cmd, timings[name], time.perf_counter() - start))
    start = time.perf_counter()
    chosen = {}
    for for_cmd in (False, True):
        circuits = chosen_circuits(model, scored["eap-ig"], find, args.batch_size, for_cmd)
        chosen[for_cmd] = mib_score(model, circuits, held, batch_size=args.batch_size)
    took = time.perf_counter() - start
    rows.append(("chosen", chosen[False], chosen[True], timings["eap-ig"] + took, 0.0))
    print(f"{args.model}: {len(find)} finding / {len(held)} held-out IOI pairs; full "
          f"{rows[0][1].full:.3f}, empty {rows[0][1].empty:.3f}")  # fmt: skip
    print("method | CPR | CMD | f at 1 / 5 / 10 % (CPR; CMD) | KL at 5 % (CPR; CMD) | time s")
    at = [MIB_PERCENTAGES.index(p) for p in (0.01, 0.05, 0.1)]
    record = {}
    for name, cpr, cmd, find_s, judge_s in rows:
        f_cpr = " / ".join(f"{cpr.faithfulness[i]:.2f}" for i in at)
        f_cmd = " / ".join(f"{cmd.faithfulness[i]:.2f}" for i in at)
        kl = f"{cpr.kl[at[1]]:.2f}; {cmd.kl[at[1]]:.2f}"
        print(f"{name} | {cpr.cpr:.3f} | {cmd.cmd:.3f} | {f_cpr}; {f_cmd} | {kl} | "
              f"{find_s:.0f} (+{judge_s:.0f} judging)")  # fmt: skip
        record[name] = {"cpr": cpr.to_dict(), "cmd": cmd.to_dict(), "find_s": find_s}
    write_json(args.out / "mib_methods.json", record)


if __name__ == "__main__":
    main()
