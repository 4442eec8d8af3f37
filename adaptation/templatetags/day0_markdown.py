"""`{{ note.body|markdown }}`: Markdown rendered safely (`adaptation.safe_markdown`)."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from adaptation.safe_markdown import render_markdown

register = template.Library()


@register.filter(name="markdown")
def markdown(value: Any) -> SafeString:
    """The Markdown `value` as HTML: raw HTML is escaped and `javascript:`/`vbscript:`/
    `data:` links are refused by the renderer, so the output is safe to insert."""
    return mark_safe(render_markdown(None if value is None else str(value)))
