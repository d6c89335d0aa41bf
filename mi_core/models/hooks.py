"""Hook names, built in one place: TransformerLens's ``get_act_name``.

``act_name("z", 2)`` is ``"blocks.2.attn.hook_z"``; ``act_name("mlp_out", 2)`` is
``"blocks.2.hook_mlp_out"``; ``act_name("q_input", 2)`` is ``"blocks.2.hook_q_input"``;
``act_name("scale", 2, "ln1")`` is ``"blocks.2.ln1.hook_scale"``. Every hook point of a block
goes by TransformerLens's short name (``z``, ``pattern``, ``q``, ``post``, ``attn_out``,
``mlp_out``, ``resid_mid``, ``resid_post``); no module writes ``"blocks.N..."`` by hand (a
test checks the source).
"""

from __future__ import annotations

from transformer_lens.utilities import get_act_name

__all__ = ["act_name"]


def act_name(name: str, layer: int, layer_type: str | None = None) -> str:
    """The full hook name of TransformerLens short name ``name`` in block ``layer``;
    ``layer_type`` picks a sub-module (``act_name("scale", 2, "ln1")`` is
    ``"blocks.2.ln1.hook_scale"``)."""
    return get_act_name(name, layer, layer_type)
