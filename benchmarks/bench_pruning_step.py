"""Time of one L0 pruning step: ours vs plain PyTorch on Hugging Face, and vs the reference recipe.

Three ways to take the same pruning step on MiniLM with MNLI batches of 32 (same examples):

* **ours** — :func:`~mi_core.pruning.step.pruning_step` on the hooked model: hard-concrete gates
  on every head and MLP, mean ablation, KL to the *cached* full-model logits, batches drawn as a
  pruning run draws them (random, grouped by length, padded per batch), weights frozen, gradient to
  ``log_alpha`` and the lambdas only, then the AdamW step.
* **plain** — the cheapest plain-PyTorch way on the Hugging Face model, same batches: frozen
  weights, one ``[n_layers, n_heads]`` multiplier applied by a forward pre-hook on each
  ``attention.output.dense``, the same cached-KL loss, gradient to the multiplier only.
* **reference** — the public reference recipe: a second, frozen copy of the model runs every step
  for the KL target, and every example is padded to 128 tokens.

Prints the median milliseconds per step and two ratios: ours / plain (target <= 1.2) and
reference / ours (target >= 2). ``--dropout`` times the authors' recipe, which prunes in train
mode: our step runs with the checkpoint's dropout (:func:`mi_core.models.dropout.train_dropout`,
which sends attention through TransformerLens's step-by-step path), the sampled-gate sparsity and
gradient clipping, and the Hugging Face models run in train mode::

    python benchmarks/bench_pruning_step.py              # 8 distinct batches x 2 rounds
    python benchmarks/bench_pruning_step.py --threads 1 --rounds 5
    python benchmarks/bench_pruning_step.py --dropout    # the paper recipe's step
    python benchmarks/bench_pruning_step.py --dropout --bert-base --device cuda   # issue 14

``--bert-base`` swaps MiniLM for a BERT-base-sized classifier with random weights (12 layers x 12
heads, d_model 768, MiniLM's tokenizer), written to a temporary folder; ``--device cuda`` runs
all three on the GPU (synchronised before each clock reading) and also prints steps per second.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _pad_to(batch: dict[str, torch.Tensor], width: int, pad_id: int) -> dict[str, torch.Tensor]:
    """The batch right-padded to ``width`` tokens (the reference recipe's fixed padding)."""
    out = dict(batch)
    extra = width - batch["input_ids"].shape[1]
    if extra > 0:
        for key, value in (("input_ids", pad_id), ("attention_mask", 0), ("token_type_ids", 0)):
            out[key] = torch.nn.functional.pad(batch[key], (0, extra), value=value)
    return out


def main() -> None:
    from mi_core.data import load_pairs
    from mi_core.data.batches import length_grouped_batches, tokenize_pairs
    from mi_core.evaluation import model_inputs
    from mi_core.interventions import ComponentMask, ablate, compute_means
    from mi_core.models import load_hf_classifier, load_model
    from mi_core.models.dropout import train_dropout
    from mi_core.models.frozen import frozen
    from mi_core.pruning import HardConcrete, LagrangianController, pruning_optimizer
    from mi_core.pruning.objective import kl_to_reference
    from mi_core.pruning.reference_logits import compute_reference_logits
    from mi_core.pruning.step import pruning_step

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8, help="distinct batches of 32")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the batches")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--dropout", action="store_true", help="the paper recipe: train mode")
    parser.add_argument("--bert-base", action="store_true", help="a random BERT-base instead")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    name = "minilm"
    if args.bert_base:
        name = _random_bert_base()
    ours = load_model(name, task="mnli", seed=0, device=args.device)
    # the reference recipe's second model
    full_copy = load_model(name, task="mnli", seed=0, device=args.device)
    hf, _, _ = load_hf_classifier(name, task="mnli", seed=0)
    hf.to(device)
    n_layers, n_heads = ours.cfg.n_layers, ours.cfg.n_heads

    data = load_pairs("mnli:train", max_examples=32 * args.batches)
    tokenized = tokenize_pairs(data, ours.tokenizer, 128)
    # training batches as a pruning run draws them: random, grouped by length, padded per batch
    order = length_grouped_batches(tokenized.lengths, 32, seed=0, epoch=0)
    batches = [
        {k: v.to(device) for k, v in tokenized.collate(indices).items()} for indices in order
    ]
    reference = compute_reference_logits(ours, tokenized).to(device)  # once, as a run does
    means = compute_means(ours, batches[:2])
    pad_id = tokenized.pad_token_id
    widths = [b["input_ids"].shape[1] for b in batches]

    gates = HardConcrete(n_layers * n_heads + n_layers).to(device)
    controller = LagrangianController().to(device)
    optimizer = pruning_optimizer(gates.parameters(), controller, 0.1, 1.0)
    mask = ComponentMask.ones(ours, device=device)
    noise = torch.Generator(device=device).manual_seed(0)

    estimate = "sampled" if args.dropout else "expected"
    trained = [gates.log_alpha, *controller.parameters()]

    def ours_step(batch):
        optimizer.zero_grad(set_to_none=True)
        pruning_step(ours, mask, gates, controller, [batch], reference, 0.3, noise, None, estimate)
        if args.dropout:
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()

    def reference_step(batch):
        padded = _pad_to(batch, 128, pad_id)
        with torch.no_grad():
            target = full_copy(**model_inputs(full_copy, padded))
        optimizer.zero_grad(set_to_none=True)
        z = gates.sample(noise)
        mask.heads, mask.mlps = z[: n_layers * n_heads].view(n_layers, n_heads), z[-n_layers:]
        loss = kl_to_reference(target, ours(**model_inputs(ours, padded)))
        t = 1 - gates.prob_nonzero().mean()
        (loss + controller.penalty(t, 0.3)).backward()
        if args.dropout:
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()

    head_mult = torch.ones(n_layers, n_heads, requires_grad=True, device=device)

    def pre_hook(layer):
        def hook(module, inputs):
            (x,) = inputs
            b, p, _ = x.shape
            scaled = x.view(b, p, n_heads, -1) * head_mult[layer][:, None]
            return (scaled.view(b, p, -1),)

        return hook

    handles = [
        layer.attention.output.dense.register_forward_pre_hook(pre_hook(i))
        for i, layer in enumerate(hf.bert.encoder.layer)
    ]

    def plain_step(batch):
        head_mult.grad = None
        logits = hf(**model_inputs(hf, batch)).logits
        kl_to_reference(reference[batch["index"]], logits).backward()

    for p in hf.parameters():
        p.requires_grad_(False)
    hf.train(args.dropout)
    full_copy.eval()
    times: dict[str, list[float]] = {"ours": [], "plain": [], "reference": []}
    steps = {"ours": ours_step, "plain": plain_step, "reference": reference_step}
    with (
        frozen(ours),
        frozen(full_copy),
        ablate(ours, mask, means, skip_unmasked=False),
        train_dropout(ours, args.dropout),
    ):
        for step in steps.values():  # warm-up
            step(batches[0])
        for _ in range(args.rounds):
            for batch in batches:
                for label, step in steps.items():  # interleaved: load changes hit all three
                    _sync(device)
                    start = time.perf_counter()
                    step(batch)
                    _sync(device)
                    times[label].append(time.perf_counter() - start)
    for handle in handles:
        handle.remove()

    ms = {label: 1000 * statistics.median(values) for label, values in times.items()}
    recipe = "paper recipe (dropout on, train mode)" if args.dropout else "no dropout"
    model_name = "random BERT-base" if args.bert_base else "MiniLM"
    print(
        f"{model_name} on {device}, MNLI batches of 32 (widths {min(widths)}-{max(widths)} "
        f"tokens, {torch.get_num_threads()} threads, {recipe}), median of "
        f"{len(times['ours'])} steps each:"
    )
    print(f"  ours      (cached KL target, per-batch padding, heads+MLPs) {ms['ours']:8.1f} ms")
    print(f"  plain HF  (pre-hook head multiplier, cached KL target)      {ms['plain']:8.1f} ms")
    print(f"  reference (second model per step, padded to 128)           {ms['reference']:8.1f} ms")
    ratio_plain = ms["ours"] / ms["plain"]
    ratio_reference = ms["reference"] / ms["ours"]
    print(f"ours / plain HF     = {ratio_plain:.2f}  (target <= 1.2)")
    print(f"reference / ours    = {ratio_reference:.2f}  (target >= 2)")
    print(f"steps/s: ours {1000 / ms['ours']:.2f}, reference {1000 / ms['reference']:.2f}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _random_bert_base() -> str:
    """A BERT-base-sized sequence classifier with random weights and MiniLM's tokenizer, saved
    to a temporary folder (no hub): its path."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    import transformers

    from mi_core.models.embedded import minilm_path

    folder = Path(tempfile.mkdtemp(prefix="bert-base-random-"))
    atexit.register(shutil.rmtree, folder, True)  # 420 MB of weights: not left behind
    config = transformers.BertConfig(num_labels=3)  # the defaults are BERT-base's sizes
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(folder)
    return str(folder)


if __name__ == "__main__":
    main()
