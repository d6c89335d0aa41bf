"""Edge methods against their own lower bounds, side by side on one model and batch.

1. EAP over every edge vs the bare 2 forward + 1 backward passes of the same model on the same
   batch (the method's own lower bound): target ratio <= 1.3. EAP unembeds only the answer
   positions (``metric_logits``), so the same passes doing so are printed too: the stricter
   bound.
2. One edge-pruning step (sampled edge gates, corrupted fill, KL, backward) vs one node-pruning
   step (sampled head / MLP gates at hook_z / hook_mlp_out, KL, backward): target <= 3; at
   the start, the middle and the end of a run (the gates' states differ); both unembed the
   answer positions alone, as ``prune_edges`` does.
3. Peak memory (RSS above the loaded model, each in a fresh process) of EAP vs a plain forward
   with ``run_with_cache``: target <= 2. Measured twice: with glibc told to return every freed
   block of 64 KiB or more at once (``MALLOC_MMAP_THRESHOLD_=65536``), so RSS follows the live
   tensors, as ``torch.cuda.max_memory_allocated`` does on a GPU (the target is judged on this);
   and with the default allocator, whose peak RSS also holds freed heap it has not returned and
   varies from run to run (the same forward measured 1,317 and 1,970 MiB in two processes).

Runs interleave (A, B, A, B, ...) so background load hits both alike.

``--device cuda`` runs all three on a GPU (times after ``torch.cuda.synchronize``; memory as
``torch.cuda.max_memory_allocated`` above the loaded model, in this process). ``--random-weights``
times a model whose weights are not on the machine: ``--model`` names a folder holding only its
``config.json`` and tokenizer, and the weights are drawn at random (the timings and the memory
do not depend on the weights' values).

    python benchmarks/bench_circuits.py [--model smollm2] [--batch 8] [--tokens 64] [--repeats 3]
        [--device cuda] [--random-weights] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from peak_memory import peak_growth
from random_weights import random_checkpoint

from mi_core.buffers import reusing_buffers
from mi_core.circuits import Graph, edge_attribution, logit_difference, metric_logits
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.interventions import EdgeMask, graph_switches
from mi_core.interventions.edges._engine import masked_hooks, record_corrupted
from mi_core.models import load_model
from mi_core.models.frozen import frozen
from mi_core.models.hook_context import hooked
from mi_core.pruning.hard_concrete import sample_hard_concrete


def _pairs(model, batch: int, tokens: int) -> PromptPairs:
    gen = torch.Generator().manual_seed(0)
    vocab = model.cfg.d_vocab
    ids = torch.randint(100, vocab - 1, (2, batch, tokens), generator=gen)
    pairs = PromptPairs(
        clean_ids=ids[0],
        corrupted_ids=ids[1],
        attention_mask=torch.ones(batch, tokens, dtype=torch.long),
        answer=torch.randint(100, vocab - 1, (batch,), generator=gen),
        distractor=torch.randint(100, vocab - 1, (batch,), generator=gen),
        position=torch.full((batch,), tokens - 1),
    )
    return pairs.to(model.cfg.device)


def bare(model, pairs: PromptPairs, answer_positions: bool = False) -> None:
    """2 forwards + 1 backward, nothing else: the backward to the input embedding with the
    weights frozen (EAP needs no weight gradient, and neither does its lower bound). The one
    hook (the backward's leaf) is attached as mi_core attaches EAP's (``hooked``), so neither
    side pays TransformerLens's removal visiting every hook point.

    ``answer_positions``: the stricter bound EAP's own passes now meet, the corrupted forward
    through the blocks only and the clean one unembedding the answer positions alone
    (``metric_logits``); without it, the plain passes (the issue's bound)."""
    with torch.no_grad():
        if answer_positions:
            model(pairs.corrupted_ids, stop_at_layer=model.cfg.n_layers)
        else:
            model(pairs.corrupted_ids)
    leaf = {}

    def start(x, hook):
        leaf["x"] = x.detach().requires_grad_(True)
        return leaf["x"]

    with (
        frozen(model, eval_mode=False),
        hooked(model, [("blocks.0.hook_resid_pre", start)]),
    ):
        logits = metric_logits(model, pairs) if answer_positions else model(pairs.clean_ids)
        value = logit_difference(logits, pairs).mean()
        torch.autograd.grad(value, leaf["x"])


def node_step(model, pairs: PromptPairs, log_alpha: torch.Tensor, reference) -> None:
    cfg = model.cfg
    z = sample_hard_concrete(log_alpha)
    heads = z[: cfg.n_layers * cfg.n_heads].view(cfg.n_layers, cfg.n_heads)
    mlps = z[cfg.n_layers * cfg.n_heads :]
    hooks = []
    for layer in range(cfg.n_layers):
        hooks.append(
            (f"blocks.{layer}.attn.hook_z", lambda x, hook, i=layer: x * heads[i, :, None])
        )
        hooks.append((f"blocks.{layer}.hook_mlp_out", lambda x, hook, i=layer: x * mlps[i]))
    with hooked(model, hooks):  # the answer positions' logits, as the edge step
        logits = metric_logits(model, pairs)
    F.kl_div(logits.log_softmax(-1), reference, log_target=True, reduction="batchmean").backward()


def edge_step(
    model, graph, pairs: PromptPairs, log_alpha: torch.Tensor, reference, sparse: bool = True
) -> None:
    z = sample_hard_concrete(log_alpha, generator=torch.Generator().manual_seed(0))
    mask = EdgeMask(graph, z)
    with graph_switches(model):  # as prune_edges: the corrupted run inside the switches
        run = record_corrupted(model, graph, input=pairs.corrupted_ids)  # as prune_edges
        with hooked(model, masked_hooks(model, mask, hard_concrete=sparse, corrupted=run)):
            logits = metric_logits(model, pairs)  # as prune_edges: the answer positions alone
    F.kl_div(logits.log_softmax(-1), reference, log_target=True, reduction="batchmean").backward()


def _sync() -> None:
    if torch.cuda.is_initialized():  # only where this process used the GPU
        torch.cuda.synchronize()


def _timed(fn, *args) -> float:
    _sync()
    start = time.perf_counter()
    fn(*args)
    _sync()
    return time.perf_counter() - start


def _memory(args) -> None:
    """In a fresh process: peak RSS growth (MiB) during one EAP or one run_with_cache, sampled
    every millisecond from /proc (the process's lifetime peak is the model loading's)."""
    import gc

    model = load_model(args.model, device=args.device)
    for p in model.parameters():
        p.requires_grad_(False)
    pairs = _pairs(model, args.batch, args.tokens)
    graph = Graph.from_model(model)
    gc.collect()
    with peak_growth() as peak:
        if args.measure == "eap":
            edge_attribution(model, graph, pairs, logit_difference)
        elif args.measure == "bare":
            bare(model, pairs)
        else:
            with torch.no_grad():
                model.run_with_cache(pairs.clean_ids)
    print(json.dumps({"mib": peak["mib"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument(
        "--parts", default="eap,step,memory", help="which measurements: eap, step, memory"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timings, one EAP and its bare passes under torch.profiler: operator and "
        "kernel-launch counts, the top operators, and (on a GPU) every host sync EAP waits on",
    )
    parser.add_argument("--measure", choices=["eap", "cache", "bare"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.measure:
        _memory(args)
        return

    if args.random_weights:
        args.model = str(random_checkpoint(args.model))
    model = load_model(args.model, device=args.device)
    pairs = _pairs(model, args.batch, args.tokens)
    graph = Graph.from_model(model)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "the CPU"
    print(f"{args.model}: {graph}; batch {args.batch} x {args.tokens} tokens on {device}")

    parts = set(args.parts.split(","))
    if "eap" in parts:
        eap_vs_bare(model, graph, pairs, args.repeats)
    if "step" in parts:
        edge_vs_node_step(model, graph, pairs, args.repeats)
    if "memory" in parts:
        if args.device.startswith("cuda"):
            gpu_memory(model, graph, pairs)
        else:
            memory(args)
    if args.profile:
        profile(model, graph, pairs)


def eap_vs_bare(model, graph, pairs: PromptPairs, repeats: int) -> None:
    """1. EAP vs its lower bound (parameters keep requires_grad, as a user's model does).

    Inside one ``reusing_buffers`` block, as ``attribute`` runs EAP over a data set's batches:
    the large buffers of one batch serve the next."""
    bare(model, pairs)
    t_bare = t_strict = t_eap = 0.0
    with reusing_buffers(fixed_weights=True):
        edge_attribution(model, graph, pairs, logit_difference)
        for i in range(repeats):  # alternating which runs first (see _edge_vs_node_at)
            if i % 2:
                t_eap += _timed(edge_attribution, model, graph, pairs, logit_difference)
            t_bare += _timed(bare, model, pairs)
            t_strict += _timed(bare, model, pairs, True)
            if i % 2 == 0:
                t_eap += _timed(edge_attribution, model, graph, pairs, logit_difference)
    n = repeats
    print(f"EAP {t_eap / n:.2f} s vs 2 fwd + 1 bwd {t_bare / n:.2f} s: ratio "
          f"{t_eap / t_bare:.2f} (target <= 1.3); vs the same passes unembedding the "
          f"answer positions alone, as EAP does, {t_strict / n:.2f} s: "
          f"{t_eap / t_strict:.2f}")  # fmt: skip


def edge_vs_node_step(model, graph, pairs: PromptPairs, repeats: int) -> None:
    """2. One edge-pruning step vs one node-pruning step."""
    # at three states of a run's gates:
    # the start (log_alpha ~ 10, the authors' init: nearly every gate exactly 1), the middle
    # (log_alpha 3: a fifth of the gates undecided) and the end (95 % of the edges at -5,
    # the rest at 5: nearly every gate exactly 0 or 1). "dense" reads every sender (no use of
    # the exact 0s and 1s: a plain mask).
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        reference = metric_logits(model, pairs).log_softmax(-1)
    n_nodes = model.cfg.n_layers * (model.cfg.n_heads + 1)
    device = model.cfg.device
    node_alpha = torch.full((n_nodes,), 3.0, device=device, requires_grad=True)
    gen = torch.Generator().manual_seed(0)
    end = torch.full((graph.n_edges,), -5.0)
    end[torch.randperm(graph.n_edges, generator=gen)[: graph.n_edges // 20]] = 5.0
    states = {
        "start": torch.randn(graph.n_edges, generator=gen) * 0.01 + 10.0,
        "middle": torch.full((graph.n_edges,), 3.0),
        "end": end,
    }
    node_step(model, pairs, node_alpha, reference)
    with reusing_buffers(
        fixed_weights=True
    ):  # as in prune_edges: one step's buffers serve the next
        for state, alpha in states.items():
            _edge_vs_node_at(model, graph, pairs, state, alpha, node_alpha, reference, repeats)


def _edge_vs_node_at(model, graph, pairs, state, alpha, node_alpha, reference, repeats) -> None:
    edge_alpha = alpha.to(model.cfg.device, copy=True).requires_grad_(True)
    edge_step(model, graph, pairs, edge_alpha, reference)
    t_node = t_edge = t_dense = 0.0
    for i in range(repeats):
        # the order alternates: the step right after the node step pays for the memory the
        # node step gave back (page faults; measured in benchmarks/README.md)
        t_node += _timed(node_step, model, pairs, node_alpha, reference)
        for sparse in (True, False) if i % 2 == 0 else (False, True):
            took = _timed(edge_step, model, graph, pairs, edge_alpha, reference, sparse)
            if sparse:
                t_edge += took
            else:
                t_dense += took
    n = repeats
    print(f"edge-pruning step at the {state}: {t_edge / n:.2f} s (dense {t_dense / n:.2f} s) "
          f"vs node-pruning step {t_node / n:.2f} s: ratio {t_edge / t_node:.2f} "
          f"(dense {t_dense / t_node:.2f}; target <= 3)")  # fmt: skip


def profile(model, graph, pairs: PromptPairs) -> None:
    """Where EAP's time over its bare passes goes: one of each under ``torch.profiler`` (after
    a warm-up), the operators and kernel launches counted, the top operators by host time; on
    a GPU, each line of Python at which EAP makes the host wait for the device (a sync stalls
    the launch queue, which is what a launch-bound pass cannot afford)."""
    import warnings
    from collections import Counter

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = torch.cuda.is_initialized()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    runs = {
        "EAP": lambda: edge_attribution(model, graph, pairs, logit_difference),
        "bare": lambda: bare(model, pairs, True),
    }
    with reusing_buffers(fixed_weights=True):
        for name, run in runs.items():
            run()
            _sync()
            with torch_profile(activities=activities) as prof:
                run()
                _sync()
            events = prof.key_averages()
            ops = sum(e.count for e in events if e.key.startswith("aten::"))
            launches = sum(
                e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel")
            )
            syncs = sum(
                e.count for e in events if "Synchronize" in e.key or e.key == "cudaMemcpyAsync"
            )
            print(f"\n{name}: {ops} aten operator calls, {launches} kernel launches, "
                  f"{syncs} synchronising / memcpy calls")  # fmt: skip
            host = sum(e.self_cpu_time_total for e in events) / 1e3
            device = sum(e.self_device_time_total for e in events) / 1e3 if cuda else 0.0
            print(f"{name}: host {host:.1f} ms" + (f", device {device:.1f} ms" if cuda else ""))
            print(
                events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50)
            )
            if cuda:
                print(events.table(sort_by="self_device_time_total", row_limit=12,
                                   max_name_column_width=50))  # fmt: skip
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    runs["EAP"]()
                    _sync()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            where = Counter(f"{w.filename}:{w.lineno}" for w in caught)
            print(f"host syncs in one EAP: {sum(where.values())}")
            for line, n in where.most_common():
                print(f"  {n:4d} x {line}")


def gpu_memory(model, graph, pairs: PromptPairs) -> None:
    """3. on a GPU: peak ``max_memory_allocated`` above the loaded model of EAP, of
    ``run_with_cache`` and of the bare passes, one after another in this process."""
    for p in model.parameters():
        p.requires_grad_(False)
    runs = {
        "cache": lambda: model.run_with_cache(pairs.clean_ids),
        "eap": lambda: edge_attribution(model, graph, pairs, logit_difference),
        "bare": lambda: bare(model, pairs),
    }
    mib = {}
    for what, run in runs.items():
        _sync()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad() if what == "cache" else torch.enable_grad():
            out = run()
        _sync()
        mib[what] = (torch.cuda.max_memory_allocated() - base) / 2**20
        del out
    print(f"peak GPU memory above the model: EAP {mib['eap']:.0f} MiB vs run_with_cache "
          f"{mib['cache']:.0f} MiB: ratio {mib['eap'] / mib['cache']:.2f} (target <= 2); the "
          f"bare 2 forward + 1 backward: {mib['bare']:.0f} MiB")  # fmt: skip


def memory(args) -> None:
    """3. Peak memory of EAP vs run_with_cache, each in a fresh process, with live-tensor RSS
    (freed blocks returned at once) and with the default allocator."""
    base = [sys.executable, __file__, "--model", args.model, "--batch", str(args.batch),
            "--tokens", str(args.tokens)]  # fmt: skip
    settings = {
        "live": {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
        "default allocator": {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"},
    }
    for setting, env in settings.items():
        mib = {}
        for what in ("cache", "eap", "bare"):
            out = subprocess.run(
                [*base, "--measure", what], capture_output=True, text=True, check=True, env=env
            )
            mib[what] = json.loads(out.stdout.strip().splitlines()[-1])["mib"]
        ratio = mib["eap"] / mib["cache"]
        target = "target <= 2" if setting == "live" else "not the target's measure"
        print(f"peak memory above the model ({setting}): EAP {mib['eap']:.0f} MiB vs "
              f"run_with_cache {mib['cache']:.0f} MiB: ratio {ratio:.2f} ({target}); the bare "
              f"2 forward + 1 backward: {mib['bare']:.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
