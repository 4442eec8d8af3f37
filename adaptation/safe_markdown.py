"""Markdown rendered safely, for notes people and stages write (known limitations, release
notes' additions).

CommonMark through markdown-it-py with raw HTML off (`<script>` and `<img onerror=...>` come
out as text), linkify off, tables on, and markdown-it's default `validateLink`, which refuses
`javascript:`, `vbscript:`, `file:` and `data:` URLs (other than a few image types): such a
link stays literal text. Links get `rel="nofollow noopener noreferrer"`.
"""

from __future__ import annotations

from typing import Any

from markdown_it import MarkdownIt

_LINK_REL = "nofollow noopener noreferrer"


def _build() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")

    def link_open(self: Any, tokens: list, idx: int, options: Any, env: Any) -> str:
        tokens[idx].attrSet("rel", _LINK_REL)
        return self.renderToken(tokens, idx, options, env)

    md.add_render_rule("link_open", link_open)
    return md


_MARKDOWN = _build()


def render_markdown(text: str | None) -> str:
    """HTML for the Markdown `text` (empty for None): safe to mark safe, as no raw HTML or
    script URL survives."""
    return _MARKDOWN.render(str(text or ""))
