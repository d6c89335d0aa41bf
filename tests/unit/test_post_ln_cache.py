"""A post-LN encoder's cache refuses the methods that treat the residual stream as a sum."""

from __future__ import annotations

import pytest
import torch
from helpers import FLOAT32_EPS, random_tokens

from mi_core.errors import ConfigError
from mi_core.models.classifier import PostLNActivationCache


@pytest.mark.parametrize(
    "method",
    [
        "decompose_resid",
        "apply_ln_to_stack",
        "get_full_resid_decomposition",
        "logit_attrs",
    ],  # fmt: skip
)
def test_sum_of_components_methods_raise_one_clear_error(tiny, method):
    _, cache = tiny.run_with_cache(random_tokens(2, 5, low=1000, high=2000))
    assert isinstance(cache, PostLNActivationCache)
    with pytest.raises(ConfigError, match="post-LayerNorm encoder .* not a sum"):
        getattr(cache, method)(torch.zeros(1))


def test_the_rest_of_the_cache_works_as_in_transformer_lens(tiny):
    ids = random_tokens(2, 5, low=1000, high=2000)
    logits, cache = tiny.run_with_cache(ids)
    torch.testing.assert_close(logits, tiny(ids))
    tiny.set_use_attn_result(True)
    try:
        _, cache = tiny.run_with_cache(ids)
        stacked, labels = cache.stack_head_results(layer=1, return_labels=True)
    finally:
        tiny.set_use_attn_result(False)
    assert stacked.shape == (tiny.cfg.n_heads, 2, 5, tiny.cfg.d_model) and labels[0] == "L0H0"
    _, plain = tiny.run_with_cache(ids, return_cache_object=False)
    assert isinstance(plain, dict)


def test_accumulated_resid_stacks_the_streams_the_model_reads(tiny):
    """accumulated_resid(layer, incl_mid, apply_ln) positionally, as TL's signature. Its last
    entry is what the head reads (it was TL's hook_resid_post, the sum before the block's
    LayerNorm, off by up to 213 on MiniLM) and a mid entry what the MLP reads; applying LN is
    refused with the clear error."""
    ids = random_tokens(2, 5, low=1000, high=2000)
    logits, cache = tiny.run_with_cache(ids)
    n = tiny.cfg.n_layers
    stack, labels = cache.accumulated_resid(None, False, False, return_labels=True)
    assert stack.shape[0] == n + 1 and labels == [*(f"{l}_pre" for l in range(n)), "final_post"]
    torch.testing.assert_close(stack[-1], cache[f"blocks.{n - 1}.hook_normalized_resid_post"])
    torch.testing.assert_close(tiny.classify(stack[-1]), logits)  # the head reads it
    for layer in range(1, n):  # each pre entry is the previous block's output
        torch.testing.assert_close(
            stack[layer], cache[f"blocks.{layer - 1}.hook_normalized_resid_post"]
        )
    assert not torch.allclose(stack[-1], cache[f"blocks.{n - 1}.hook_resid_post"])
    mid, labels = cache.accumulated_resid(1, True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre"]
    torch.testing.assert_close(mid[1], cache["blocks.0.ln1.hook_normalized"])
    last = cache.accumulated_resid(pos_slice=-1, mlp_input=True, layer=0)
    assert last.shape == (2, 2, tiny.cfg.d_model)  # 0_pre and 0_mid, the last position
    # TL's positional order after apply_ln: pos_slice, mlp_input, return_labels
    torch.testing.assert_close(cache.accumulated_resid(0, False, False, -1, True), last)
    torch.testing.assert_close(last[1], cache["blocks.0.ln1.hook_normalized"][:, -1])
    with pytest.raises(ConfigError, match="post-LayerNorm encoder"):
        cache.accumulated_resid(None, False, True)


def test_the_refusal_points_to_direct_logit_attribution(tiny):
    _, cache = tiny.run_with_cache(random_tokens(2, 5, low=1000, high=2000))
    with pytest.raises(ConfigError, match="mi_core.circuits.direct_logit_attribution"):
        cache.logit_attrs(torch.zeros(1))


def test_direct_logit_attribution_of_a_post_ln_classifier(tiny):
    """Frozen LayerNorm scales make the stream the head reads a sum of sender terms; a sender's
    direct effect is the logit minus the logit without its term. With a linear head the effects
    add up exactly to the whole direct path's effect (total), computed in one separate pass; the
    real dense-tanh head makes them miss, and ``error`` says by how much."""
    from mi_core.circuits import direct_logit_attribution
    from mi_core.models.heads import PooledClassificationHead

    inputs = tiny.to_tokens(["The doctor saw the lawyer .", "A man sleeps ."],
                            ["The lawyer saw the doctor .", "Someone sleeps ."])  # fmt: skip
    result = direct_logit_attribution(tiny, inputs)
    n_senders = 1 + tiny.cfg.n_layers * (tiny.cfg.n_heads + 1)
    assert result.effects.shape == (n_senders, 2) and result.senders[0] == "input"
    assert result.error > 1e-3  # tanh: the effects do not add up
    table = result.frame()
    assert list(table.columns) == ["sender", "effect", "std"]
    assert table["effect"].abs().is_monotonic_decreasing

    class LinearHead(PooledClassificationHead):
        def forward(self, x):
            return self.out(self.dense(x))

    tiny.head.__class__ = LinearHead
    try:
        linear = direct_logit_attribution(tiny, inputs, labels=torch.tensor([0, 2]))
    finally:
        tiny.head.__class__ = PooledClassificationHead
    # exact but for float32 rounding of a sum of the effects (tests/README.md)
    assert linear.error < 64 * FLOAT32_EPS * float(linear.effects.abs().sum(0).max())
    assert linear.total.abs().min() > 1e-3


def test_direct_logit_attribution_refers_pre_ln_models_to_transformer_lens(llama):
    from mi_core.circuits import direct_logit_attribution

    with pytest.raises(ConfigError, match="cache.logit_attrs"):
        direct_logit_attribution(llama, {"input": random_tokens(1, 4)})
