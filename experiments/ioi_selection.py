"""How a circuit is read off edge scores: selection, ranking and connectivity, on IOI.

Scores every edge of a language model once (EAP-IG by default, on the finding half of the IOI
prompts; cached in ``OUT/scores.safetensors``), then judges the circuits of every way of reading
them off the scores on the held-out half, at each fraction of edges:

* ``selection``: greedy (grown from the output) or top-k (the largest, wherever they are);
* ranking: ``|score|`` or signed (how much removing the edge lowers the metric);
* ``connected``: only edges on an input-to-output path of kept edges count against the budget.

Prints faithfulness and KL to the full model per fraction (the empty circuit's KL for
reference) and the areas MIB reports (CPR: under faithfulness; CMD: under
``|1 - faithfulness|``); writes every row, with the number of edges each circuit actually
keeps, to ``OUT/selection.csv``::

    python experiments/ioi_selection.py --model smollm2 --out runs/ioi_selection

Nothing here is tuned: every combination is judged at the same fractions (MIB's levels up to 10 %).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import pandas as pd

from mi_core.circuits import (
    EdgeMask,
    EdgeScores,
    Graph,
    attribute,
    curve_area,
    curve_difference,
    evaluate_circuit,
    faithfulness_curve,
)
from mi_core.data.circuit_pairs import ioi_pairs
from mi_core.io import write_csv
from mi_core.models import load_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--out", required=True)
    parser.add_argument("--method", default="eap-ig", choices=("eap", "eap-ig"))
    parser.add_argument("--n-examples", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--fractions", default="0.005,0.01,0.02,0.05,0.1")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fractions = [float(f) for f in args.fractions.split(",")]

    model = load_model(args.model)
    pairs = ioi_pairs(model.tokenizer, n=args.n_examples, seed=0)
    find, judge = pairs.split(0.5)
    graph = Graph.from_model(model)
    cached = out / f"scores_{args.method}.safetensors"
    if cached.is_file():
        scores = EdgeScores.load(cached)
    else:
        scores = attribute(model, find, args.method, batch_size=args.batch_size)
        scores.save(cached)
    print(f"{graph}: {graph.n_edges} edges; {len(find)} prompts to find, {len(judge)} held out",
          file=sys.stderr)  # fmt: skip

    empty = evaluate_circuit(model, EdgeMask.empty(graph), judge, batch_size=args.batch_size)
    rows = [{"selection": "empty circuit", "ranking": "", "connected": False, "fraction": 0.0,
             "edges": 0, "faithfulness": 0.0, "kl": empty.kl, "full": empty.full,
             "empty": empty.empty}]  # fmt: skip
    print(f"full {empty.full:.3f}, empty {empty.empty:.3f} (KL to the full model {empty.kl:.3f})",
          file=sys.stderr)  # fmt: skip
    areas = []
    for selection, signed, connected in itertools.product(
        ("greedy", "top-k"), (False, True), (False, True)
    ):
        curve = faithfulness_curve(
            model, scores, judge, fractions, batch_size=args.batch_size, selection=selection,
            signed=signed, connected=connected, progress=False,
        )  # fmt: skip
        areas.append({"selection": selection, "ranking": "signed" if signed else "|score|",
                      "connected": connected, "CPR (area)": curve_area(curve),
                      "CMD (area of |1 - f|)": curve_difference(curve)})  # fmt: skip
        for fraction, row in zip(sorted(fractions), curve, strict=True):
            rows.append({"selection": selection, "ranking": "signed" if signed else "|score|",
                         "connected": connected, "fraction": fraction, "edges": row.n_edges,
                         "faithfulness": row.faithfulness, "kl": row.kl, "full": row.full,
                         "empty": row.empty})  # fmt: skip
        print(selection, "signed" if signed else "abs", "connected" if connected else "plain",
              [f"{r.n_edges}: {r.faithfulness:.2f}" for r in curve], file=sys.stderr)  # fmt: skip
        table = pd.DataFrame(rows)
        write_csv(out / "selection.csv", table)
    curves = table[table["edges"] > 0]
    for value in ("faithfulness", "kl"):
        wide = curves.pivot_table(index=["selection", "ranking", "connected"],
                                  columns="fraction", values=value)  # fmt: skip
        print(f"{value} (empty circuit: KL {empty.kl:.3f})" if value == "kl" else value)
        print(wide.round(3).to_string())
    print(f"areas over {min(fractions)}-{max(fractions)} of the edges (MIB's CPR and CMD)")
    print(pd.DataFrame(areas).round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
