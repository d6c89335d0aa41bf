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
