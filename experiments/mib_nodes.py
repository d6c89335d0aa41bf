"""Node- and neuron-level methods scored as MIB scores them, on held-out pairs.

Finds node scores on the first half of the pairs and judges them on the held-out half with
:func:`mi_core.circuits.mib_score` at MIB's node level (the top nodes kept, every other node
patched from the counterfactual prompt) and, for the attributions, at its neuron level (the
top output dimensions): CPR from MIB's signed ranking, CMD from its absolute ranking. Methods:

* ``eap``, ``eap-ig`` (EAP-IG-inputs, ``--ig-steps`` steps): node scores, the sums of the
  edge scores per node (the attribution at each node's output);
* ``heuristic-core`` (with ``--sweep``): a heuristic-core sweep's subnetworks (``mi-core
  heuristic-core``'s ``sweep/`` folder), ranked by how many of them keep each head and MLP
  (:meth:`~mi_core.circuits.nodes.NodeScores.from_subnetworks`). They were pruned with mean
  ablation on the sweep's own prompts, not on these pairs;
* ``random``: a random ranking of the nodes (seed 0), the floor;
* neuron level: ``eap`` and ``eap-ig`` per output dimension
  (:func:`~mi_core.circuits.nodes.neuron_attribution`).

Prints one row per method and level and writes every size's numbers to
``OUT/mib_nodes.json``::

    python experiments/mib_nodes.py --sweep runs/hc_ioi/sweep --out runs/mib_nodes
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from mi_core.circuits import EdgeScores, Graph, edge_attribution, logit_difference
from mi_core.circuits.job import load_circuit_pairs
from mi_core.circuits.mib import MIB_PERCENTAGES, mib_score
from mi_core.circuits.nodes import NodeScores, neuron_attribution
from mi_core.io import write_json
from mi_core.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="the model (default: smollm2)")
    parser.add_argument("--data", default="ioi", help="circuit data (ioi, mib:<task>, ...)")
    parser.add_argument("--n-examples", type=int, default=64, help="pairs: half find, half judge")
    parser.add_argument("--ig-steps", type=int, default=5, help="EAP-IG's steps")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sweep", type=Path, help="a heuristic-core sweep folder (optional)")
    parser.add_argument("--out", type=Path, required=True, help="where mib_nodes.json goes")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = load_model(args.model)
    graph = Graph.from_model(model)
    find, held = load_circuit_pairs(model, args.data, args.n_examples).split(0.5)
    methods: dict[str, tuple[NodeScores, float]] = {}
    for name, steps in (("eap", 1), ("eap-ig", args.ig_steps)):
        start = time.perf_counter()
        values = edge_attribution(model, graph, find, logit_difference, steps=steps)
        edges = EdgeScores(graph, values, name, len(find))
        methods[name] = (NodeScores.from_edges(edges), time.perf_counter() - start)
    if args.sweep is not None:
        methods["heuristic-core"] = (NodeScores.from_subnetworks(graph, args.sweep), math.nan)
    generator = torch.Generator().manual_seed(0)
    random = torch.rand(graph.n_senders, generator=generator, dtype=torch.float64)
    methods["random"] = (NodeScores(graph, random, "random", mib_sign=True), 0.0)
    for name, steps in (("eap", 1), ("eap-ig", args.ig_steps)):
        start = time.perf_counter()
        neurons = neuron_attribution(model, find, name, steps=steps,
                                     batch_size=args.batch_size, progress=False)  # fmt: skip
        methods[f"{name} (neurons)"] = (neurons, time.perf_counter() - start)
    print(f"{args.model}: {len(find)} finding / {len(held)} held-out {args.data} pairs")
    print("method | level | CPR | CMD | f at 1 / 5 / 10 % (CPR; CMD) | find s | judge s")
    at = [MIB_PERCENTAGES.index(p) for p in (0.01, 0.05, 0.1)]
    record = {}
    for name, (scores, find_s) in methods.items():
        start = time.perf_counter()
        level = scores.level
        cpr = mib_score(model, scores, held, level=level, absolute=False,
                        batch_size=args.batch_size)  # fmt: skip
        cmd = mib_score(model, scores, held, level=level, absolute=True,
                        batch_size=args.batch_size)  # fmt: skip
        judge_s = time.perf_counter() - start
        f_cpr = " / ".join(f"{cpr.faithfulness[i]:.2f}" for i in at)
        f_cmd = " / ".join(f"{cmd.faithfulness[i]:.2f}" for i in at)
        print(f"{name} | {level} | {cpr.cpr:.3f} | {cmd.cmd:.3f} | {f_cpr}; {f_cmd} | "
              f"{find_s:.0f} | {judge_s:.0f}")  # fmt: skip
        record[name] = {"level": level, "cpr": cpr.to_dict(), "cmd": cmd.to_dict(),
                        "find_s": find_s, "judge_s": judge_s}  # fmt: skip
    write_json(args.out / "mib_nodes.json", record)


if __name__ == "__main__":
    main()
