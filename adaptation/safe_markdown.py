"""Markdown rendered safely, for notes people and stages write (known limitations, release
notes' additions).

CommonMark through markdown-it-py with raw HTML off (`<script>` and `<img onerror=...>` come
out as text), linkify off, tables on, and markdown-it's default `validateLink`, which refuses
`javascript:`, `vbscript:`, `file:` and `data:` URLs (other than a few image types): such a
link stays literal text. Links get `rel="nofollow noopener noreferrer"`.

Images are shown only from day0 itself (a path, no host) or a `data:` image, as the
Content-Security-Policy's img-src allows: an image elsewhere (a tracking pixel) is not loaded
at all, but becomes a link to it labelled with its alt text (or, inside a link, that text).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml

_LINK_REL = "nofollow noopener noreferrer"


def image_is_local(src: str) -> bool:
    """Whether an image URL (as markdown-it normalised it: percent-encoded) loads from day0
    itself: a path without scheme or host, or a `data:` URL. Backslashes and control
    characters, which browsers may read as "//", make it not local."""
    if any(ch == "\\" or ord(ch) <= 0x20 for ch in src):
        return False
    parts = urlsplit(src)
    if parts.scheme:
        return parts.scheme.lower() == "data"
    return not parts.netloc and not src.startswith("//")


def _build() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")

    def link_open(self: Any, tokens: list, idx: int, options: Any, env: dict) -> str:
        tokens[idx].attrSet("rel", _LINK_REL)
        env["link_depth"] = env.get("link_depth", 0) + 1
        return self.renderToken(tokens, idx, options, env)

    def link_close(self: Any, tokens: list, idx: int, options: Any, env: dict) -> str:
        env["link_depth"] = env.get("link_depth", 1) - 1
        return self.renderToken(tokens, idx, options, env)

    def image(self: Any, tokens: list, idx: int, options: Any, env: dict) -> str:
        token = tokens[idx]
        src = str(token.attrGet("src") or "")
        if image_is_local(src):
            return self.image(tokens, idx, options, env)
        label = escapeHtml(self.renderInlineAsText(token.children or [], options, env) or src)
        if env.get("link_depth", 0) > 0:  # a link cannot hold another
            return label
        return f'<a href="{escapeHtml(src)}" rel="{_LINK_REL}">{label}</a>'

    md.add_render_rule("link_open", link_open)
    md.add_render_rule("link_close", link_close)
    md.add_render_rule("image", image)
    return md


_MARKDOWN = _build()


def render_markdown(text: str | None) -> str:
    """HTML for the Markdown `text` (empty for None): safe to mark safe, as no raw HTML,
    script URL or image from another host survives."""
    return _MARKDOWN.render(str(text or ""), {})
