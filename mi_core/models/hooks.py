"""Hook names, built in one place: TransformerLens's ``get_act_name``.

``act_name("z", 2)`` is ``"blocks.2.attn.hook_z"``; ``act_name("mlp_out", 2)`` is
``"blocks.2.hook_mlp_out"``; every hook point of a block goes by TransformerLens's short name
(``z``, ``pattern``, ``q``, ``post``, ``attn_out``, ``mlp_out``, ``resid_mid``, ``resid_post``).
"""

from __future__ import annotations

from transformer_lens.utilities import get_act_name

__all__ = ["act_name"]


def act_name(name: str, layer: int) -> str:
    """The full hook name of TransformerLens short name ``name`` in block ``layer``."""
    return get_act_name(name, layer)
