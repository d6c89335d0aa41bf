"""A post-LN encoder's cache refuses the methods that treat the residual stream as a sum."""

from __future__ import annotations

import pytest
import torch
from helpers import random_tokens

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


def test_accumulated_resid_takes_transformer_lens_positional_arguments(tiny):
    """accumulated_resid(layer, incl_mid, apply_ln) positionally, as TL's signature: the
    stack of real residual streams works, applying LN is refused with the clear error."""
    _, cache = tiny.run_with_cache(random_tokens(2, 5, low=1000, high=2000))
    stack = cache.accumulated_resid(None, False, False)
    assert stack.shape[0] == tiny.cfg.n_layers + 1
    torch.testing.assert_close(stack[-1], cache[f"blocks.{tiny.cfg.n_layers - 1}.hook_resid_post"])
    mid = cache.accumulated_resid(1, True)
    torch.testing.assert_close(mid[1], cache["blocks.0.hook_resid_mid"])
    with pytest.raises(ConfigError, match="post-LayerNorm encoder"):
        cache.accumulated_resid(None, False, True)
