"""Throughput of separability statistics collection vs a plain full forward pass.

Collection (:func:`mi_core.separability.collect_activation_stats`: every MLP and attention
pre-out neuron, all six statistics, stopping before the final norm and unembedding) against
``model(tokens)`` with the unembedding, over the same token windows. Prints tokens/s of both and
their ratio (collection / forward; >= 1.0 means collection is not slower).

    python benchmarks/bench_separability_stats.py                  # smollm2, 4096 tokens
    python benchmarks/bench_separability_stats.py --tiny           # a small random model
    python benchmarks/bench_separability_stats.py --model PATH --tokens 8192 --window 128
"""

from __future__ import annotations

import argparse
import time

import torch


def _tiny_model():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        d_model=256,
        d_head=32,
        n_heads=8,
        n_key_value_heads=4,
        n_layers=4,
        n_ctx=256,
        d_vocab=8192,
        d_mlp=768,
        act_fn="silu",
        normalization_type="RMS",
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=32,
        seed=0,
    )
    return HookedTransformer(cfg).eval(), None


def _windows(model, tokenizer, n_tokens: int, window: int) -> torch.Tensor:
    n = max(1, n_tokens // window)
    if tokenizer is not None:
        try:
            from mi_core.data import token_windows

            return token_windows(tokenizer, "text:wikitext", window=window, n_windows=n)
        except Exception as exc:  # noqa: BLE001 - fall back to random tokens, say so
            print(f"(no WikiText windows: {exc}; using random tokens)")
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, model.cfg.d_vocab, (n, window), generator=generator)


def _time(fn, repeats: int) -> tuple[float, float]:
    """Best wall-clock and best process CPU seconds of ``repeats`` runs."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu


def main() -> None:
    from mi_core.statistics.activations import collect_activation_stats

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="model name or checkpoint path")
    parser.add_argument("--tiny", action="store_true", help="use a small random model instead")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per measurement")
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.tiny:
        model, tokenizer = _tiny_model()
        name = "tiny random (4 layers, d_model 256, GQA)"
    else:
        from mi_core.models import load_model

        model = load_model(args.model)
        tokenizer, name = getattr(model, "tokenizer", None), args.model
    windows = _windows(model, tokenizer, args.tokens, args.window)
    n_tokens = windows.numel()

    @torch.no_grad()
    def forward():
        for start in range(0, windows.shape[0], args.batch_size):
            model(windows[start : start + args.batch_size].to(model.cfg.device))

    def collect():
        collect_activation_stats(model, windows, batch_size=args.batch_size)

    forward()  # warm up (allocator, kernels) on the whole set once
    collect()
    # interleaved, so that a slow patch of a shared machine hits both alike
    timings = {"forward": [], "collect": []}
    for _ in range(args.repeats):
        timings["forward"].append(_time(forward, 1))
        timings["collect"].append(_time(collect, 1))
    (f_wall, f_cpu), (c_wall, c_cpu) = (
        tuple(min(t[i] for t in timings[k]) for i in (0, 1)) for k in ("forward", "collect")
    )
    print(
        f"model: {name}; {n_tokens} tokens in windows of {args.window}, batch {args.batch_size}, "
        f"{torch.get_num_threads()} threads, device {model.cfg.device}"
    )
    print(f"{'':32s} {'tokens/s (wall)':>16s} {'tokens/CPU-s':>14s}")
    print(f"{'full forward (with unembed)':32s} {n_tokens / f_wall:16.1f} {n_tokens / f_cpu:14.1f}")
    print(f"{'statistics collection':32s} {n_tokens / c_wall:16.1f} {n_tokens / c_cpu:14.1f}")
    print(f"ratio (collection / forward): {f_wall / c_wall:.3f} wall, {f_cpu / c_cpu:.3f} CPU time")


if __name__ == "__main__":
    main()
