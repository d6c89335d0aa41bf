"""Time of one L0 pruning step of a language model on a prompt task: ours vs plain PyTorch,
and a batched group of 4 runs vs the 4 runs one after another.

SmolLM2-135M (the embedded GGUF checkpoint, Llama family, 30 layers x 9 heads) on IOI prompts
(``ioi:abba``), batches of 16, the answer-position KL to the cached full-model distribution:

* **ours** — :func:`~mi_core.pruning.step.group_pruning_step` with one run on the answer model
  (:class:`~mi_core.models.HookedAnswerModel`): hard-concrete gates on every head and MLP, mean
  ablation, the LM's next-token logits at each prompt's last token, weights frozen, gradient to
  ``log_alpha`` and the lambdas only.
* **plain** — the cheapest plain-PyTorch way on the Hugging Face model, same batches: frozen
  weights, a ``[n_layers, n_heads]`` multiplier applied by a forward pre-hook on each
  ``o_proj`` and a ``[n_layers]`` one by a forward hook on each MLP, the final hidden state
  of each prompt's last token through ``lm_head``, the same cached-KL loss.
* **group of 4** — four runs (seeds) trained together (:func:`group_pruning_step`, one
  forward / backward pass for all, ``max_chunk`` as the batched executor sets it on this
  device), against the same four runs' steps taken one after another.

Prints the median milliseconds per step and the ratios ours / plain (target <= 1.15) and
group / sequential (target <= 1.0)::

    python benchmarks/bench_lm_pruning.py
    python benchmarks/bench_lm_pruning.py --batches 4 --rounds 1 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    from mi_core.data import load_prompt_task
    from mi_core.data.batches import length_grouped_batches, tokenize_pairs
    from mi_core.interventions import ComponentMask, ablate, compute_means
    from mi_core.models import load_model
    from mi_core.models.frozen import frozen
    from mi_core.models.loading import load_hf_causal_lm
    from mi_core.pruning import HardConcrete, LagrangianController
    from mi_core.pruning.objective import kl_to_reference
    from mi_core.pruning.reference_logits import compute_reference_logits
    from mi_core.pruning.step import StepMember, default_chunk, group_pruning_step
    from mi_core.tasks import NEXT_TOKEN

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=6, help="distinct batches of 16")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the batches")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = load_model("smollm2", task=NEXT_TOKEN)
    hf, _ = load_hf_causal_lm("smollm2")
    hf.eval()
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    batch_size, n_runs = 16, 4
    task = load_prompt_task(
        "ioi:abba", batch_size * n_runs * args.batches, tokenizer=model.tokenizer
    )
    tokenized = tokenize_pairs(task, model.tokenizer)
    order = length_grouped_batches(tokenized.lengths, batch_size, seed=0, epoch=0)
    batches = [tokenized.collate(idx) for idx in order]
    reference = compute_reference_logits(model, tokenized)
    means = compute_means(model, batches[:2])
    widths = [b["input_ids"].shape[1] for b in batches]

    def member(seed: int) -> StepMember:
        gates = HardConcrete(n_layers * n_heads + n_layers)
        return StepMember(gates, LagrangianController(), 0.3,
                          torch.Generator().manual_seed(seed), "expected")  # fmt: skip

    members = [member(seed) for seed in range(n_runs)]
    mask = ComponentMask.ones(model)
    chunk = default_chunk(model, type("Cfg", (), {"batch_size": batch_size})())

    def zero(ms):
        for m in ms:
            m.gates.log_alpha.grad = None
            for p in m.controller.parameters():
                p.grad = None

    def ours_step(batch):
        zero(members[:1])
        group_pruning_step(model, mask, members[:1], [batch], [[len(batch["index"])]], reference)

    def sequential_step(group):
        for m, batch in zip(members, group, strict=True):
            zero([m])
            group_pruning_step(model, mask, [m], [batch], [[len(batch["index"])]], reference)

    def group_step(group):
        zero(members)
        joined = tokenized.collate([int(i) for b in group for i in b["index"]])
        sizes = [[len(b["index"]) for b in group]]
        group_pruning_step(model, mask, members, [joined], sizes, reference, None, chunk)

    head_mult = torch.ones(n_layers, n_heads, requires_grad=True)
    mlp_mult = torch.ones(n_layers, requires_grad=True)

    def o_proj_hook(layer):
        def hook(module, inputs):
            (x,) = inputs
            b, p, _ = x.shape
            return ((x.view(b, p, n_heads, -1) * head_mult[layer][:, None]).view(b, p, -1),)

        return hook

    def mlp_hook(layer):
        def hook(module, inputs, output):
            return output * mlp_mult[layer]

        return hook

    handles = []
    for i, layer in enumerate(hf.model.layers):
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(o_proj_hook(i)))
        handles.append(layer.mlp.register_forward_hook(mlp_hook(i)))
    for p in hf.parameters():
        p.requires_grad_(False)

    def plain_step(batch):
        head_mult.grad = mlp_mult.grad = None
        hidden = hf.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        last = batch["attention_mask"].sum(1) - 1
        logits = hf.lm_head(hidden[torch.arange(hidden.shape[0]), last])
        kl_to_reference(reference[batch["index"]], logits).backward()

    times: dict[str, list[float]] = {"ours": [], "plain": [], "sequential": [], "group": []}
    groups = [batches[k : k + n_runs] for k in range(0, len(batches) - n_runs + 1, n_runs)]
    with frozen(model), ablate(model, mask, means, skip_unmasked=False):
        ours_step(batches[0]), plain_step(batches[0])  # warm-up
        group_step(groups[0])
        for _ in range(args.rounds):
            for batch in batches:
                for label, step in (("ours", ours_step), ("plain", plain_step)):
                    start = time.perf_counter()
                    step(batch)
                    times[label].append(time.perf_counter() - start)
            for group in groups:
                for label, step in (("sequential", sequential_step), ("group", group_step)):
                    start = time.perf_counter()
                    step(group)
                    times[label].append(time.perf_counter() - start)
    for handle in handles:
        handle.remove()

    ms = {label: 1000 * statistics.median(values) for label, values in times.items()}
    print(
        f"SmolLM2-135M on cpu, IOI batches of {batch_size} (widths {min(widths)}-{max(widths)} "
        f"tokens, {torch.get_num_threads()} threads), median of {len(times['ours'])} steps "
        f"({len(times['group'])} group steps):"
    )
    print(f"  ours      (answer model, cached KL target, heads+MLPs)      {ms['ours']:8.1f} ms")
    print(f"  plain HF  (o_proj pre-hook + MLP hook multipliers, lm_head) {ms['plain']:8.1f} ms")
    print(
        f"  4 runs one after another                                   {ms['sequential']:8.1f} ms"
    )
    print(f"  4 runs as one group (max_chunk {chunk})                     {ms['group']:8.1f} ms")
    print(f"ours / plain HF       = {ms['ours'] / ms['plain']:.2f}  (target <= 1.15)")
    print(f"group / one after one = {ms['group'] / ms['sequential']:.2f}  (target <= 1.0)")


if __name__ == "__main__":
    main()
