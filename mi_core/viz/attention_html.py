"""Attention patterns as standalone, offline HTML pages (circuitsvis).

circuitsvis' ``RenderedHTML`` carries two renderings: ``cdn_src`` (what ``str(html)`` returns)
imports the JavaScript from unpkg.com and shows nothing offline; ``local_src`` inlines the
bundled JavaScript (~1.3 MB). We always use ``local_src``.
"""

from __future__ import annotations

import html as html_lib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from mi_core.errors import ConfigError
from mi_core.io import write_text

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = [
    "attention_view_fragment",
    "attention_view_html",
    "is_causal",
    "write_attention_html",
]

_RENDER_CALL = "CircuitsVis.render("


def is_causal(pattern: Float[Tensor, "head q k"], model: HookedModel | None = None) -> bool:
    """Whether attention is causal: from ``model`` (a decoder, or a config with
    ``attention_dir``) when given, else from the pattern (no mass above the diagonal)."""
    if model is not None:
        if getattr(model, "is_encoder", None) is not None:
            return not model.is_encoder
        cfg = getattr(model, "cfg", model)
        return getattr(cfg, "attention_dir", "causal") == "causal"
    attn = torch.as_tensor(pattern).detach().float()
    upper = torch.triu(torch.ones(attn.shape[-2:], dtype=torch.bool), diagonal=1)
    return bool((attn[..., upper] == 0).all())


def attention_view_fragment(
    tokens: Sequence[str],
    pattern: Float[Tensor, "head q k"],
    head_names: Sequence[str] | None = None,
    *,
    causal: bool | None = None,
    model: HookedModel | None = None,
) -> str:
    """The circuitsvis ``attention_heads`` view of one example as an HTML fragment (a ``div``
    and an inline ``script``), with the JavaScript inlined. ``pattern[h, q, k]`` is head h's
    attention from token q to token k.

    The upper triangle is greyed out only for causal attention: ``causal`` when given, else
    what ``model`` is (a decoder), else what the pattern shows (no mass above the diagonal),
    so an encoder's attention to later tokens is never hidden.
    """
    from circuitsvis.attention import attention_heads

    attn = torch.as_tensor(pattern).detach().float().cpu()
    if attn.ndim == 2:
        attn = attn[None]
    n = len(tokens)
    if attn.ndim != 3 or attn.shape[1:] != (n, n):
        raise ConfigError(
            f"pattern must be [head, {n}, {n}] for {n} tokens; got {tuple(attn.shape)}"
        )
    names = [f"Head {i}" for i in range(attn.shape[0])] if head_names is None else list(head_names)
    if len(names) != attn.shape[0]:
        raise ConfigError(f"{len(names)} head names for {attn.shape[0]} heads")
    rendered = attention_heads(
        attention=attn,
        tokens=[str(t) for t in tokens],
        attention_head_names=names,
        mask_upper_tri=is_causal(attn, model) if causal is None else causal,
    )
    src = rendered.local_src
    # The props (tokens, head names) are JSON inside a <script>: a token containing
    # "</script>" would end it early. Write every "<" of the render call as "\u003c", the
    # same string in JavaScript (as plotly writes its figures' JSON).
    cut = src.rfind(_RENDER_CALL)
    end = src.rfind("</script>")
    if 0 <= cut < end:
        src = src[:cut] + src[cut:end].replace("<", "\\u003c") + src[end:]
    return src


def attention_view_html(
    tokens: Sequence[str],
    pattern: Float[Tensor, "head q k"],
    head_names: Sequence[str] | None = None,
    *,
    title: str | None = None,
    causal: bool | None = None,
    model: HookedModel | None = None,
) -> str:
    """A complete HTML page with the attention view of one example; works offline (the causal
    mask as in :func:`attention_view_fragment`)."""
    body = attention_view_fragment(tokens, pattern, head_names, causal=causal, model=model)
    heading = f"<h2>{html_lib.escape(title)}</h2>\n" if title else ""
    page_title = html_lib.escape(title or "Attention patterns")
    return (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n'
        f"<title>{page_title}</title>\n</head>\n<body>\n{heading}{body}\n</body>\n</html>\n"
    )


def write_attention_html(
    path: str | os.PathLike[str],
    tokens: Sequence[str],
    pattern: Float[Tensor, "head q k"],
    head_names: Sequence[str] | None = None,
    **kwargs: Any,
) -> Path:
    """Write :func:`attention_view_html` to ``path`` atomically."""
    return write_text(path, attention_view_html(tokens, pattern, head_names, **kwargs))
