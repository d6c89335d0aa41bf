"""mi_core's circuit methods scored as MIB scores them, on held-out pairs.

Finds circuits on the first half of the pairs (``--data``: IOI, an MIB task ``mib:...``) and
judges them on the held-out half with :func:`mi_core.circuits.mib_score` (MIB's evaluator's
numbers, equal to it within 1e-4): CPR from MIB's signed ranking, CMD from its absolute
ranking, as MIB reports a method. Methods:

* ``eap``, ``eap-ig`` (EAP-IG-inputs, ``--ig-steps`` steps, the left rule MIB runs): scores,
  the circuits read off them by MIB's top-n then prune;
* ``ensemble``: EAP's and EAP-IG's scores, each divided by its largest ``|score|``, summed;
* ``chosen``: one circuit per size chosen on the *finding* pairs among readings of EAP-IG's
  scores (:func:`mi_core.circuits.mib.select_mib_circuits`: the absolute and the signed top-n,
  and unions of the top ``a`` share by ``|score|`` with the top ``1 - a`` share by signed
  score); for CPR the candidate of highest finding faithfulness, for CMD the one closest to 1.
  The held-out pairs never choose anything;
* ``warm-pruned`` (with ``--prune-steps N``): edge pruning on the finding pairs warm-started
  from EAP-IG's scores (``warm_start``, the MIB shared task's winning idea) at each sparsity of
  ``--prune-sparsities`` (no sparsity warm-up: the gates start at the target); each run's gates
  give the circuit of the MIB size nearest its target, EAP-IG's chosen circuits the others;
* ``refined`` (with ``--refine-rounds N``): the chosen circuits refined on the finding pairs by
  gradient-guided edge swaps at each circuit (:func:`mi_core.circuits.refine.refine_mib_circuits`,
  ``N`` rounds at each size), towards the highest logit difference for CPR and towards the full
  model's for CMD.

``--find N`` takes the first ``N`` pairs to find the circuits (default half of
``--n-examples``) and judges on the rest: the generated tasks' pairs do not depend on how many
are asked for, so ``--n-examples 288 --find 32`` judges the same circuits as the default on
256 held-out pairs, the first 32 of them the default's. ``--scored`` names the score methods
judged (EAP-IG's always is: the others' difference is from it) and ``--targets`` the metrics
(``cmd`` alone skips the CPR circuits' choosing and refining).

Prints one row per method (CPR, CMD, the faithfulness at 1 / 5 / 10 %, the KL at 5 %, wall
time), then each method's 95 % bootstrap intervals over the held-out pairs
(:meth:`~mi_core.circuits.MIBScore.interval`) and of its difference from EAP-IG's on the same
resamples (:func:`~mi_core.circuits.mib_difference`), and writes them with every size's numbers
to ``OUT/mib_methods.json``::

    python experiments/mib_methods.py --model smollm2 --n-examples 64 --out runs/mib_methods
    python experiments/mib_methods.py --data mib:arithmetic_addition:generated --out runs/add
    python experiments/mib_methods.py --n-examples 288 --find 32 --refine-rounds 8 --out runs/256
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mi_core.circuits import EdgeScores, Graph, edge_attribution, logit_difference
from mi_core.circuits.job import load_circuit_pairs
from mi_core.circuits.mib import MIB_PERCENTAGES, mib_difference, mib_score, select_mib_circuits
from mi_core.circuits.prune import EdgePruneSettings, prune_edges
from mi_core.circuits.refine import refine_mib_circuits
from mi_core.interventions.edges import EdgeMask
from mi_core.io import write_json
from mi_core.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default in (("--model", str, "smollm2"), ("--data", str, "ioi"),
                                ("--n-examples", int, 64), ("--find", int, 0),
                                ("--ig-steps", int, 5), ("--batch-size", int, 16),
                                ("--scored", str, "eap,eap-ig,ensemble"),
                                ("--targets", str, "cpr,cmd"),
                                ("--prune-steps", int, 0), ("--prune-sparsities", str, "0.95"),
                                ("--refine-rounds", int, 0),
                                ("--out", Path, None)):  # fmt: skip
        parser.add_argument(flag, type=kind, default=default, required=default is None)
    args = parser.parse_args()
    targets = [t for t in ("cpr", "cmd") if t in args.targets.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = load_model(args.model)
    pairs = load_circuit_pairs(model, args.data, args.n_examples)
    cut = args.find or len(pairs) // 2
    find, held = pairs.select(slice(0, cut)), pairs.select(slice(cut, None))
    graph = Graph.from_model(model)
    rows, timings, scored = [], {}, {}
    for name, steps in (("eap", 1), ("eap-ig", args.ig_steps)):
        start = time.perf_counter()
        values = edge_attribution(model, graph, find, logit_difference, steps=steps)
        timings[name] = time.perf_counter() - start
        scored[name] = EdgeScores(graph, values, name, len(find))
    ensemble = torch.stack([s.scores / s.scores.abs().max() for s in scored.values()]).sum(0)
    scored["ensemble"] = EdgeScores(graph, ensemble, "eap-ig", len(find))
    timings["ensemble"] = timings["eap"] + timings["eap-ig"]
    judged = ["eap-ig", *(n for n in scored if n != "eap-ig" and n in args.scored.split(","))]
    for name in judged:
        start = time.perf_counter()
        row = {t: mib_score(model, scored[name], held, absolute=t == "cmd",
                            batch_size=args.batch_size) for t in targets}  # fmt: skip
        rows.append((name, row, timings[name], time.perf_counter() - start))
    start = time.perf_counter()
    selected = {
        target: select_mib_circuits(
            model, scored["eap-ig"], find, target, batch_size=args.batch_size
        )
        for target in targets
    }  # chosen on the finding pairs, judged on the held-out
    took = time.perf_counter() - start
    rows.append(("chosen", _judge(model, selected, held, args), timings["eap-ig"] + took, 0.0))
    if args.refine_rounds:
        start = time.perf_counter()
        refined = {target: refine_mib_circuits(model, selected[target], find, target,
                                               rounds=args.refine_rounds,
                                               batch_size=args.batch_size, progress=True)
                   for target in targets}  # fmt: skip
        spent = time.perf_counter() - start
        for target, circuits in refined.items():  # how far the finding pairs' numbers carry
            on_find = mib_score(model, circuits, find, batch_size=args.batch_size)
            print(
                f"refined for {target} on the finding pairs: CPR {on_find.cpr:.3f}, CMD "
                f"{on_find.cmd:.3f}, f {[round(f, 2) for f in on_find.faithfulness]}"
            )
        rows.append(("refined", _judge(model, refined, held, args),
                     timings["eap-ig"] + took + spent, 0.0))  # fmt: skip
    if args.prune_steps:
        rows.append(_warm_pruned(model, graph, find, held, scored["eap-ig"], args, selected))
        rows[-1] = (*rows[-1][:2], timings["eap-ig"] + took + rows[-1][2], 0.0)
    _report(rows, targets, args, len(find), len(held))


def _judge(model, circuits, held, args):
    """Each target's circuits scored on the held-out pairs."""
    return {t: mib_score(model, c, held, batch_size=args.batch_size) for t, c in circuits.items()}


def _report(rows, targets, args, n_find, n_held):
    """The table, the intervals against EAP-IG's, and ``OUT/mib_methods.json``."""
    first = rows[0][1][targets[0]]
    print(f"{args.model}: {n_find} finding / {n_held} held-out {args.data} pairs; full "
          f"{first.full:.3f}, empty {first.empty:.3f}")  # fmt: skip
    print("method | CPR | CMD | f at 1 / 5 / 10 % (CPR; CMD) | KL at 5 % (CPR; CMD) | time s")
    at = [MIB_PERCENTAGES.index(p) for p in (0.01, 0.05, 0.1)]
    record = {}
    for name, row, find_s, judge_s in rows:
        cells = [f"{row[t].cpr if t == 'cpr' else row[t].cmd:.3f}" if t in row else "-"
                 for t in ("cpr", "cmd")]  # fmt: skip
        curve = "; ".join(" / ".join(f"{row[t].faithfulness[i]:.2f}" for i in at)
                          for t in targets)  # fmt: skip
        kl = "; ".join(f"{row[t].kl[at[1]]:.2f}" for t in targets)
        print(f"{name} | {' | '.join(cells)} | {curve} | {kl} | "
              f"{find_s:.0f} (+{judge_s:.0f} judging)")  # fmt: skip
        record[name] = {**{t: row[t].to_dict() for t in targets}, "find_s": find_s}
    print("method | " + " | ".join(f"{t.upper()} [95 %] | {t.upper()} - EAP-IG's [95 %]"
                                   for t in targets))  # fmt: skip
    reference = next(row for name, row, *_ in rows if name == "eap-ig")
    for name, row, *_ in rows:
        spans = {}
        for t in targets:
            spans[t] = row[t].interval()[t]
            spans[f"{t}_vs_eap_ig"] = mib_difference(row[t], reference[t])[t]
        print(f"{name} | " + " | ".join(f"[{lo:.3f}, {hi:.3f}]" for lo, hi in spans.values()))
        record[name]["intervals"] = spans
    write_json(args.out / "mib_methods.json", record)


def _warm_pruned(model, graph, find, held, eap_ig, args, selected):
    """Edge pruning warm-started from EAP-IG at each of ``--prune-sparsities``; each run's
    circuit replaces the chosen circuit of the MIB size nearest its target (both metrics)."""
    start = time.perf_counter()
    path = args.out / "eap-ig.safetensors"
    eap_ig.save(path)
    circuits = {target: list(circuits) for target, circuits in selected.items()}
    for sparsity in (float(s) for s in args.prune_sparsities.split(",")):
        settings = EdgePruneSettings(sparsity=sparsity, steps=args.prune_steps,
                                     sparsity_warmup_steps=0, batch_size=args.batch_size,
                                     warm_start=str(path))  # fmt: skip
        result = prune_edges(model, find, settings, progress=False)
        size = min(range(len(MIB_PERCENTAGES) - 1),
                   key=lambda i: abs(MIB_PERCENTAGES[i] - (1 - sparsity)))  # fmt: skip
        kept = graph.connected(result.circuit.weights > 0.5)
        for target in circuits:
            circuits[target][size] = EdgeMask(graph, kept.float())
        print(f"warm-pruned at {1 - sparsity:g}: {int(kept.sum())} edges for MIB size "
              f"{MIB_PERCENTAGES[size]:g}")  # fmt: skip
    took = time.perf_counter() - start
    return "warm-pruned", _judge(model, circuits, held, args), took


if __name__ == "__main__":
    main()
