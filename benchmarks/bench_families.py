"""The fused forward of each family that takes it, against TransformerLens's, at a real size.

For each family given (default: the ones a user is likeliest to load at this size on a CPU), a
randomly initialised Hugging Face model of a released model's shape is written to a temporary
folder and loaded twice, with the fused forwards (``load_model``'s default) and without
(``fast_paths=False``); a no-grad forward of each is timed, interleaved (A, B, B, A, ...), and
the ratio (fused / TransformerLens: below 1 is faster) and the largest logit difference are
printed. No step's cost depends on the weights' values.

    python benchmarks/bench_families.py [--families qwen2,gpt-neox,qwen3] [--shape 4x128]
        [--repeats 4] [--device cpu]
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
import time
from pathlib import Path

import torch
import transformers

from mi_core.models import load_model
from mi_core.models.embedded import minilm_path

#: Released models' shapes (config fields as Hugging Face names them).
SHAPES = {
    "qwen2": ("Qwen2.5-0.5B", transformers.Qwen2Config, dict(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)),
    "gpt-neox": ("Pythia-160M", transformers.GPTNeoXConfig, dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        vocab_size=50304)),
    "qwen3": ("Qwen3-0.6B", transformers.Qwen3Config, dict(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True)),
    "gemma": ("Gemma-2B (6 of its 18 layers)", transformers.GemmaConfig, dict(
        hidden_size=2048, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=1,
        head_dim=256, intermediate_size=16384, vocab_size=256000)),
    "phi": ("Phi-1.5 (8 of its 24 layers)", transformers.PhiConfig, dict(
        hidden_size=2048, num_hidden_layers=8, num_attention_heads=32, intermediate_size=8192,
        vocab_size=51200)),
}  # fmt: skip


def _checkpoint(family: str) -> Path:
    _, config_class, fields = SHAPES[family]
    config = config_class(max_position_embeddings=2048, **fields)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    out = Path(tempfile.mkdtemp(prefix=f"bench-{family}-"))
    atexit.register(shutil.rmtree, out, True)
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="qwen2,gpt-neox,qwen3")
    parser.add_argument("--shape", default="4x128", help="batch x tokens")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    batch, tokens = (int(x) for x in args.shape.split("x"))
    cuda = args.device.startswith("cuda")
    for family in args.families.split(","):
        folder = _checkpoint(family)
        models = {
            fused: load_model(folder, device=args.device, fast_paths=fused)
            for fused in (True, False)
        }
        vocab = models[True].cfg.d_vocab
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(100, min(vocab, 30000), (batch, tokens), generator=gen)
        ids = ids.to(args.device)
        times = {True: 0.0, False: 0.0}
        logits = {}
        with torch.no_grad():
            for fused in (True, False):  # warm-up
                logits[fused] = models[fused](ids)
            for i in range(args.repeats):
                for fused in (True, False) if i % 2 == 0 else (False, True):
                    if cuda:
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    models[fused](ids)
                    if cuda:
                        torch.cuda.synchronize()
                    times[fused] += time.perf_counter() - start
        diff = float((logits[True] - logits[False]).abs().max())
        ours, theirs = times[True] / args.repeats, times[False] / args.repeats
        print(
            f"{family:9s} {SHAPES[family][0]:32s} {args.shape}: mi_core {ours:.3f} s, "
            f"TransformerLens {theirs:.3f} s, ratio {ours / theirs:.2f}, "
            f"max |logit diff| {diff:.1e}",
            flush=True,
        )
        del models


if __name__ == "__main__":
    main()
