"""How far the frozen-norm-scale edge graph is from a node patch, per family.

Where a layer's attention output passes a norm before the residual add (Gemma 2 / 3's
``ln1_post``, OLMo-2 / 3's ``ln1``), a head's output is a term of a sum only with the norm's
scale held fixed (``frozen_output_norms``). Removing *every* outgoing edge of one head then
differs from patching that head's ``hook_z`` with the corrupted run's (a node patch, which
recomputes the norm): the difference is the approximation. For a pre-norm family (Llama) the
two are the same computation, so its gap is float rounding. Prints, per family and head, the
largest absolute logit gap and that gap over the largest logit change the node patch makes::

    python experiments/frozen_norm_error.py [--families gemma2,olmo2,olmo3,llama]

Runs on tiny random checkpoints (``mi_core.testing``): the numbers describe the approximation's
size on random weights, not a trained model's. Results: docs/models.md, "Normed attention
outputs".
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from mi_core.interventions.edges import EdgeMask, Graph, graph_switches, node_outputs
from mi_core.models import load_model
from mi_core.models.hook_context import hooked
from mi_core.models.hooks import act_name
from mi_core.testing import make_tiny_checkpoint


def head_gaps(
    model, clean: torch.Tensor, corrupted: torch.Tensor
) -> list[tuple[str, float, float]]:
    """``(head, max |edge removal - node patch|, max |node patch - clean|)`` for every head."""
    graph = Graph.from_model(model)
    rows = []
    with torch.no_grad():
        plain = model(clean)
        outputs = node_outputs(model, graph, input=corrupted)
        _, cache = model.run_with_cache(corrupted)
        for layer in range(model.cfg.n_layers):
            for head in range(model.cfg.n_heads):
                sender = f"L{layer}.H{head}"
                weights = torch.tensor(
                    [0.0 if e.split("->")[0] == sender else 1.0 for e in graph.edge_names]
                )
                mask = EdgeMask(graph, weights, "corrupted").with_corrupted(outputs)
                with graph_switches(model), hooked(model, mask.hooks(model)):
                    edges = model(clean)
                z_corrupt = cache[act_name("z", layer)][:, :, head]

                def patch(z, hook, h=head, value=z_corrupt):
                    z = z.clone()
                    z[:, :, h] = value
                    return z

                with hooked(model, [(act_name("z", layer), patch)]):
                    node = model(clean)
                gap = float((edges - node).abs().max())
                effect = float((node - plain).abs().max())
                rows.append((sender, gap, effect))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="gemma2,olmo2,olmo3,llama")
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(1000, 2000, (4, 10), generator=generator)
    corrupted = torch.randint(1000, 2000, (4, 10), generator=generator)
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            path = make_tiny_checkpoint(f"{family}-lm", Path(tmp) / family)
            model = load_model(path)
            rows = head_gaps(model, clean, corrupted)
            worst = max(rows, key=lambda r: r[1])
            ratio = max(gap / effect for _, gap, effect in rows if effect > 0)
            mean_gap = sum(r[1] for r in rows) / len(rows)
            print(
                f"{family}: {len(rows)} heads; edge removal vs node patch: max gap "
                f"{worst[1]:.3g} ({worst[0]}), mean {mean_gap:.3g}; largest gap / patch effect "
                f"{ratio:.3g}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
