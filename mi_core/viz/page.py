"""Pages of sections: text, tables, plotly figures and circuitsvis views, rendered as one
self-contained HTML page and as its Markdown twin.

A method's report builds :class:`ReportSection` objects and renders them with
:func:`render_html` and :func:`render_markdown`::

    section = ReportSection("Subnetworks").text("**6 subnetworks**").table(frame, "Accuracy.")
    page = render_html("Heuristic core: bert", [section])

Every text that reaches the HTML is escaped (titles, captions, table cells and headers; the
Markdown subset of a text block, `code` and **bold**, is applied after escaping). The page works
offline: plotly.js is included once, in the head (every figure is a ``div`` that uses it), and
the circuitsvis views share one copy of their JavaScript bundle.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

__all__ = ["ReportSection", "format_value", "markdown_table", "render_html", "render_markdown"]

_FIGURE_HEIGHT = "460px"
#: The width of a report page's content in pixels: a figure with a fixed width fits in it.
PAGE_WIDTH = 1200
_CSS = """
body { font-family: -apple-system, BlinkMacSystemFont, "Segoe UI", Helvetica, Arial, sans-serif;
       max-width: PAGE_WIDTHpx; margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: .3em; }
h2 { border-bottom: 1px solid #eee; padding-bottom: .2em; margin-top: 2em; }
table.data { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
table.data th, table.data td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
table.data th { background: #f4f4f4; }
table.data td:first-child, table.data th:first-child { text-align: left; }
table.data td.text, table.data th.text { text-align: left; }
.note { color: #555; font-size: 0.92em; }
.view { border: 1px solid #eee; padding: .5em; margin: 1em 0; }
code { background: #f4f4f4; padding: 0 3px; }
""".replace("PAGE_WIDTH", str(PAGE_WIDTH))


def format_value(value: Any, digits: int) -> str:
    """``value`` as a table cell shows it: floats with ``digits`` decimals (in scientific
    notation when tiny or huge), NaN as an empty cell, anything else as ``str``."""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value != 0 and (abs(value) < 10 ** (-digits) or abs(value) >= 1e6):
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


_COUNT_PREFIXES = ("n_", "count_", "mlps_", "seed", "step", "layer", "head")


def _cells(frame: pd.DataFrame, digits: int) -> list[list[str]]:
    """Formatted cells; count-like columns (``n_*``, ``count_*``, ``seed`` ...) as integers."""
    counts = [str(c).startswith(_COUNT_PREFIXES) for c in frame.columns]
    rows = []
    for row in frame.to_numpy():
        cells = []
        for value, is_count in zip(row, counts, strict=True):
            if is_count and isinstance(value, float) and value.is_integer():
                value = int(value)
            cells.append(format_value(value, digits))
        rows.append(cells)
    return rows


def markdown_table(frame: pd.DataFrame, digits: int = 4) -> str:
    """A pipe table of ``frame`` (no index), floats with ``digits`` decimals."""
    if frame.empty:
        return "_(empty)_\n"
    cells = [[v.replace("|", "\\|") for v in row] for row in _cells(frame, digits)]
    header = [str(c).replace("|", "\\|") for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def _html_table(frame: pd.DataFrame, digits: int = 4) -> str:
    if frame.empty:
        return '<p class="note">(empty)</p>'
    # prose columns (findings, verdicts, head lists) read left-aligned, numbers right-aligned
    text = [not pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    attrs = [' class="text"' if t else "" for t in text]
    head = "".join(
        f"<th{a}>{html.escape(str(c))}</th>" for c, a in zip(frame.columns, attrs, strict=True)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td{a}>{html.escape(v)}</td>" for v, a in zip(row, attrs, strict=True))
        + "</tr>"
        for row in _cells(frame, digits)
    )
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


@dataclass
class ReportSection:
    """One section of a page: its title, then text blocks, tables, figures and views, in order
    (each method returns the section, so calls chain)."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def text(self, markdown: str) -> ReportSection:
        """Paragraphs and ``- `` lists, with `code` and **bold** (escaped in the HTML)."""
        self.blocks.append(("text", markdown))
        return self

    def table(self, frame: pd.DataFrame, caption: str = "", digits: int = 4) -> ReportSection:
        """``frame`` as a table (no index), floats with ``digits`` decimals."""
        self.blocks.append(("table", (frame, caption, digits)))
        return self

    def figure(self, fig: Any, caption: str = "") -> ReportSection:
        """A plotly figure (interactive in the HTML; its caption alone in the Markdown)."""
        self.blocks.append(("figure", (fig, caption)))
        return self

    def view(self, fragment: str, caption: str = "") -> ReportSection:
        """A circuitsvis HTML fragment (:func:`~mi_core.viz.attention_view_fragment`)."""
        self.blocks.append(("view", (fragment, caption)))
        return self


def _inline_markdown(text: str) -> str:
    """Escape, then render `code` and **bold** (enough for the report's own sentences)."""
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def _markdown_block_to_html(text: str) -> str:
    parts, items = [], []
    for line in text.strip().splitlines():
        if line.startswith("- "):
            items.append(f"<li>{_inline_markdown(line[2:])}</li>")
            continue
        if items:
            parts.append("<ul>" + "".join(items) + "</ul>")
            items = []
        if line.strip():
            parts.append(f"<p>{_inline_markdown(line)}</p>")
    if items:
        parts.append("<ul>" + "".join(items) + "</ul>")
    return "\n".join(parts)


_RENDER_CALL = "CircuitsVis.render("
_MODULE_TAG = re.compile(r"<script[^>]*>")
_SELF_CLOSING_DIV = re.compile(r"^\s*<div ([^>]*?)\s*/>")


def _split_circuitsvis(fragment: str) -> tuple[str, str] | None:
    """``(bundle JavaScript, view HTML without the bundle)`` of a circuitsvis fragment, or None
    when it does not have the expected shape (then the fragment is inlined whole)."""
    tag = _MODULE_TAG.search(fragment)
    cut = fragment.rfind(_RENDER_CALL)
    end = fragment.rfind("</script>")
    if tag is None or not tag.end() < cut < end:
        return None
    div = _SELF_CLOSING_DIV.sub(r"<div \1></div>", fragment[: tag.start()])
    return fragment[tag.end() : cut], f'{div}<script type="module">{fragment[cut:end]}</script>'


def render_html(
    title: str, sections: Sequence[ReportSection], *, include_plotlyjs: bool | str = True
) -> str:
    """One self-contained HTML page: ``title``, then each section's blocks in order.

    ``include_plotlyjs``: ``True`` puts plotly.js once in the page's head (the page works
    offline); ``False`` leaves it out (for a page shown where plotly.js is loaded already); any
    other value goes to the first figure's ``to_html`` (``"cdn"``: a link to plotly's CDN).
    """
    from plotly.offline import get_plotlyjs

    body: list[str] = [f"<h1>{html.escape(title)}</h1>"]
    bundle: str | None = None
    uses_plotly = False
    for section in sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        for kind, payload in section.blocks:
            if kind == "text":
                body.append(_markdown_block_to_html(payload))
            elif kind == "table":
                frame, caption, digits = payload
                if caption:
                    body.append(f'<p class="note">{_inline_markdown(caption)}</p>')
                body.append(_html_table(frame, digits))
            elif kind == "figure":
                fig, caption = payload
                linked = not isinstance(include_plotlyjs, bool) and not uses_plotly
                uses_plotly = True
                body.append(
                    fig.to_html(
                        full_html=False,
                        include_plotlyjs=include_plotlyjs if linked else False,
                        default_height=_FIGURE_HEIGHT,
                        default_width="100%",
                    )
                )
                if caption:
                    body.append(f'<p class="note">{_inline_markdown(caption)}</p>')
            elif kind == "view":
                fragment, caption = payload
                split = _split_circuitsvis(fragment)
                if split is not None:
                    bundle = bundle or split[0]
                    fragment = split[1]
                body.append(
                    f'<div class="view"><p class="note">{html.escape(caption)}</p>{fragment}</div>'
                )
    head = [
        '<meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style>",
    ]
    if uses_plotly and include_plotlyjs is True:
        head.append(f'<script type="text/javascript">{get_plotlyjs()}</script>')
    if bundle is not None:
        head.append(f'<script type="text/javascript">{bundle}</script>')
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        + "\n".join(head)
        + "\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def render_markdown(
    title: str, sections: Sequence[ReportSection], *, html_file: str = "report.html"
) -> str:
    """The page as Markdown: text and tables as they are; each figure and view a line that
    points to the HTML page ``html_file``, with its caption."""
    lines = [f"# {title}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        for kind, payload in section.blocks:
            if kind == "text":
                lines += [payload.strip(), ""]
            elif kind == "table":
                frame, caption, digits = payload
                if caption:
                    lines += [f"_{caption}_", ""]
                lines += [markdown_table(frame, digits)]
            elif kind == "figure":
                _, caption = payload
                lines += [f"_Figure (interactive, in {html_file}): {caption}_", ""]
            elif kind == "view":
                _, caption = payload
                lines += [f"_Attention view (in {html_file}): {caption}_", ""]
    return "\n".join(lines).rstrip() + "\n"
