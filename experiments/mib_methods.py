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
256 held-out pairs, the first 32 of them the default's.

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
                                ("--prune-steps", int, 0), ("--prune-sparsities", str, "0.95"),
                                ("--refine-rounds", int, 0),
                                ("--out", Path, None)):  # fmt: skip
        parser.add_argument(flag, type=kind, default=default, required=default is None)
    args = parser.parse_args()
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
    ensemble = sum(s.scores / s.scores.abs().max() for s in scored.values())
    scored["ensemble"] = EdgeScores(graph, ensemble, "eap-ig", len(find))
    timings["ensemble"] = timings["eap"] + timings["eap-ig"]
    for name, scores in scored.items():
        start = time.perf_counter()
        cpr = mib_score(model, scores, held, absolute=False, batch_size=args.batch_size)
        cmd = mib_score(model, scores, held, absolute=True, batch_size=args.batch_size)
        rows.append((name, cpr, cmd, timings[name], time.perf_counter() - start))
    start = time.perf_counter()
    chosen, selected = {}, {}
    for target in ("cpr", "cmd"):  # chosen on the finding pairs, judged on the held-out ones
        circuits = select_mib_circuits(model, scored["eap-ig"], find, target,
                                       batch_size=args.batch_size)  # fmt: skip
        chosen[target] = mib_score(model, circuits, held, batch_size=args.batch_size)
        selected[target] = circuits
    took = time.perf_counter() - start
    rows.append(("chosen", chosen["cpr"], chosen["cmd"], timings["eap-ig"] + took, 0.0))
    if args.refine_rounds:
        start = time.perf_counter()
        refined = {target: refine_mib_circuits(model, selected[target], find, target,
                                               rounds=args.refine_rounds,
                                               batch_size=args.batch_size, progress=True)
                   for target in ("cpr", "cmd")}  # fmt: skip
        spent = time.perf_counter() - start
        for target, circuits in refined.items():  # how far the finding pairs' numbers carry
            on_find = mib_score(model, circuits, find, batch_size=args.batch_size)
            print(
                f"refined for {target} on the finding pairs: CPR {on_find.cpr:.3f}, CMD "
                f"{on_find.cmd:.3f}, f {[round(f, 2) for f in on_find.faithfulness]}"
            )
        rows.append(("refined", mib_score(model, refined["cpr"], held, batch_size=args.batch_size),
                     mib_score(model, refined["cmd"], held, batch_size=args.batch_size),
                     timings["eap-ig"] + took + spent, 0.0))  # fmt: skip
    if args.prune_steps:
        rows.append(_warm_pruned(model, graph, find, held, scored["eap-ig"], args, selected))
        rows[-1] = (*rows[-1][:3], timings["eap-ig"] + took + rows[-1][3], 0.0)
    print(f"{args.model}: {len(find)} finding / {len(held)} held-out {args.data} pairs; full "
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
    print("method | CPR [95 %] | CMD [95 %] | CPR - EAP-IG's [95 %] | CMD - EAP-IG's [95 %]")
    reference = next((cpr, cmd) for name, cpr, cmd, *_ in rows if name == "eap-ig")
    for name, cpr, cmd, *_ in rows:
        spans = {"cpr": cpr.interval()["cpr"], "cmd": cmd.interval()["cmd"],
                 "cpr_vs_eap_ig": mib_difference(cpr, reference[0])["cpr"],
                 "cmd_vs_eap_ig": mib_difference(cmd, reference[1])["cmd"]}  # fmt: skip
        print(f"{name} | " + " | ".join(f"[{lo:.3f}, {hi:.3f}]" for lo, hi in spans.values()))
        record[name]["intervals"] = spans
    write_json(args.out / "mib_methods.json", record)


def _warm_pruned(model, graph, find, held, eap_ig, args, selected):
    """Edge pruning warm-started from EAP-IG at each of ``--prune-sparsities``; each run's
    circuit replaces the chosen circuit of the MIB size nearest its target (both metrics)."""
    start = time.perf_counter()
    path = args.out / "eap-ig.safetensors"
    eap_ig.save(path)
    circuits = {target: list(selected[target]) for target in ("cpr", "cmd")}
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
    cpr = mib_score(model, circuits["cpr"], held, batch_size=args.batch_size)
    cmd = mib_score(model, circuits["cmd"], held, batch_size=args.batch_size)
    return "warm-pruned", cpr, cmd, took


if __name__ == "__main__":
    main()
