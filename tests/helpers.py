"""Helpers the tests share: tiny random HookedTransformers (GPT-2-like and Llama-like), the data.

Shared by the separability tests (unit and integration); holds no tests itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

VOCAB = 97
REPO = Path(__file__).resolve().parents[1]
#: The real data sets (``MI_CORE_DATA_DIR``, else ``../shared/data`` beside the checkout).
REAL_DATA_DIR = Path(os.environ.get("MI_CORE_DATA_DIR") or REPO.parent / "shared" / "data")

#: Tolerances for two float64 computations of the same algebra (a fused kernel against the
#: reference, groups against one at a time): float64 rounds them apart by ~1e-15 on these
#: tiny models, a wrong term by many orders more. How the suite treats float rounding:
#: tests/README.md.
SAME_ALGEBRA_FLOAT64 = {"rtol": 1e-10, "atol": 1e-12}
#: float32's machine epsilon, 2**-23: the relative rounding of one operation.
FLOAT32_EPS = torch.finfo(torch.float32).eps


def assert_float32_close(actual: torch.Tensor, expected: torch.Tensor, *, terms: int = 64) -> None:
    """Assert that two float32 computations of the same algebra (another blocking, summation
    order or kernel) agree to float32 rounding, whatever the CPU's BLAS does.

    Summing ``n`` terms in another order moves the result by at most about
    ``n * eps * sum(|terms|)`` (Higham, *Accuracy and Stability of Numerical Algorithms*,
    section 4.2). The tolerance takes the tensor's largest magnitude as the scale of its terms
    and ``terms`` as the length of the longest chain of roundings behind one element (the
    tiny models reduce over at most 64 at a time: ``d_model`` 32, ``d_mlp`` 48, a few
    positions): ``terms * eps`` relative plus ``terms * eps * max|expected|`` absolute. An
    element wrong by one part in 1e5 of the scale still fails."""
    assert actual.dtype == expected.dtype == torch.float32, (actual.dtype, expected.dtype)
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    bound = terms * FLOAT32_EPS
    torch.testing.assert_close(actual, expected, rtol=bound, atol=bound * max(scale, 1e-30))


def tiny_model(kind: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> HookedTransformer:
    """A 2-layer random model: ``"gpt2"`` (LayerNorm, GELU, learnt positions, biases) or
    ``"llama"`` (RMSNorm, gated SiLU MLP, rotary, 4 query heads sharing 2 key-value heads)."""
    common = dict(
        d_model=32,
        d_head=8,
        n_heads=4,
        n_layers=2,
        n_ctx=64,
        d_vocab=VOCAB,
        d_mlp=48,
        seed=seed,
        dtype=dtype,
    )
    if kind == "gpt2":
        cfg = HookedTransformerConfig(act_fn="gelu", normalization_type="LN", **common)
    elif kind == "llama":
        cfg = HookedTransformerConfig(
            act_fn="silu",
            normalization_type="RMS",
            gated_mlp=True,
            positional_embedding_type="rotary",
            rotary_dim=8,
            n_key_value_heads=2,
            **common,
        )
    else:
        raise ValueError(kind)
    model = HookedTransformer(cfg).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # every bias and norm gain random, as a trained model's
        for name, param in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1].lstrip("_")
            if leaf.startswith("b_") or (leaf == "b" and "ln" in name):
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
            elif leaf == "w" and "ln" in name:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return model


def random_tokens(n: int, pos: int, seed: int = 0, low: int = 0, high: int = VOCAB) -> torch.Tensor:
    """Random token windows ``[n, pos]``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n, pos), generator=generator)


def tasks(seed: int = 0):
    """Two 'data sets' drawing tokens from different halves of the vocabulary."""
    from mi_core.methods.separability.run import TaskTokens

    focus = TaskTokens(
        "low", random_tokens(6, 16, seed, 0, 50), random_tokens(4, 16, seed + 1, 0, 50)
    )
    cripple = TaskTokens(
        "high", random_tokens(6, 16, seed + 2, 45, 97), random_tokens(4, 16, seed + 3, 45, 97)
    )
    return focus, cripple


def word_tokenizer(words: list[str]):
    """A real (tiny, word-level) fast tokenizer shaped like GPT-2's: eos only, no sep, no pad."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1}
    for w in words:
        vocab.setdefault(w, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        unk_token="[UNK]",
    )


def random_prompt_pairs(n: int = 8, pos: int = 6, high: int = VOCAB):
    """Random clean / corrupted language-model prompts with random answers and distractors."""
    from mi_core.data.circuit_pairs import PromptPairs

    gen = torch.Generator().manual_seed(5)
    return PromptPairs(
        clean_ids=random_tokens(n, pos, seed=1, high=high),
        corrupted_ids=random_tokens(n, pos, seed=2, high=high),
        attention_mask=torch.ones(n, pos, dtype=torch.long),
        answer=torch.randint(0, high, (n,), generator=gen),
        distractor=torch.randint(0, high, (n,), generator=gen),
        position=torch.full((n,), pos - 1),
    )


def split_input_scores(model, graph, pairs) -> torch.Tensor:
    """EAP the plain way: every receiver's gradient from TransformerLens's per-head inputs
    (``use_split_qkv_input``), times every sender's difference, densely."""
    from mi_core.circuits import logit_difference
    from mi_core.interventions import graph_switches, node_outputs

    deltas = node_outputs(model, graph, **pairs.corrupted) - node_outputs(
        model, graph, **pairs.clean
    )
    kept: dict[str, torch.Tensor] = {}

    def keep(x, hook):
        x.retain_grad()
        kept[hook.name] = x

    names = [f"blocks.{layer}.hook_{kind}" for layer in range(graph.n_layers)
             for kind in ("q_input", "k_input", "v_input", "mlp_in")]  # fmt: skip
    last = f"blocks.{graph.n_layers - 1}.hook_resid_post"
    with graph_switches(model), model.hooks(fwd_hooks=[(n, keep) for n in [*names, last]]):
        logit_difference(model(**pairs.clean), pairs).mean().backward()
    model.zero_grad(set_to_none=True)
    grads = []
    for layer in range(graph.n_layers):
        for kind in ("q_input", "k_input", "v_input"):
            grads.append(kept[f"blocks.{layer}.hook_{kind}"].grad.permute(2, 0, 1, 3))
        grads.append(kept[f"blocks.{layer}.hook_mlp_in"].grad[None])
    grads.append(kept[last].grad[None])
    dense = torch.einsum("sbpd,rbpd->sr", deltas, torch.cat(grads))
    return graph.from_dense(dense)


#: The names Hugging Face gives the projection from a layer's heads to the residual stream,
#: and the names of the attention modules that hold it.
_HF_OUT_PROJECTIONS = ("o_proj", "out_proj", "c_proj", "dense")
_HF_ATTENTION = {"attn", "self_attn", "attention", "self_attention"}


def hf_output_projections(hf) -> list[torch.nn.Module]:
    """Per layer, the module of a Hugging Face model whose input is its heads' outputs side
    by side (``o_proj``, GPT-2's ``attn.c_proj``, BERT's ``attention.output.dense``, ...)."""
    return [
        module
        for name, module in hf.named_modules()
        if name.rsplit(".", 1)[-1] in _HF_OUT_PROJECTIONS and _HF_ATTENTION & set(name.split("."))
    ]


def hf_with_heads_replaced(hf, d_head: int, values: dict[tuple[int, int], torch.Tensor | None]):
    """A context in which Hugging Face's ``hf`` runs with head ``(layer, head)``'s slice of its
    output projection's input replaced by ``values[layer, head]`` (``[d_head]``; None: zero):
    the head ablation done in Hugging Face itself."""
    import contextlib

    projections = hf_output_projections(hf)

    def replace(layer: int):
        def hook(module, args):
            x = args[0].clone()
            for (at, head), value in values.items():
                if at == layer:
                    part = x[..., head * d_head : (head + 1) * d_head]
                    part[...] = 0.0 if value is None else value.to(x)
            return (x, *args[1:])

        return hook

    @contextlib.contextmanager
    def block():
        handles = [
            projections[layer].register_forward_pre_hook(replace(layer))
            for layer in {at for at, _ in values}
        ]
        try:
            yield hf
        finally:
            for handle in handles:
                handle.remove()

    return block()


def hf_head_means(
    hf, d_head: int, real: torch.Tensor, **inputs
) -> dict[tuple[int, int], torch.Tensor]:
    """Every head's mean input to its output projection over the real tokens ``real``
    (``[batch, pos]``) of the run ``hf(**inputs)``: the mean a mean ablation fills in."""
    projections = hf_output_projections(hf)
    means: dict[tuple[int, int], torch.Tensor] = {}

    def record(layer: int):
        def hook(module, args):
            rows = args[0][real].double().mean(0)
            for head in range(rows.shape[-1] // d_head):
                means[layer, head] = rows[head * d_head : (head + 1) * d_head]

        return hook

    handles = [p.register_forward_pre_hook(record(i)) for i, p in enumerate(projections)]
    try:
        with torch.no_grad():
            hf(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return means


def one_error(capsys) -> str:
    """The one line a failed ``mi-core`` command wrote to stderr (no traceback)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("mi-core: error: "), err
    return err[0]


def kill_at(step: int):
    """A pruning callback that stops the run (``KeyboardInterrupt``, as a kill) after ``step``,
    to test that a run resumes."""

    def kill(at: int, row: object) -> None:
        if at == step:
            raise KeyboardInterrupt

    return kill


def mlp_stats_of_both(model, focus, cripple):
    """The MLP neurons' activation statistics of ``model`` on both tasks' statistics windows."""
    from mi_core.statistics.activations import collect_activation_stats

    return tuple(
        collect_activation_stats(model, task.stats, sites=("mlp",)) for task in (focus, cripple)
    )
