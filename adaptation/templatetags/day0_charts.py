"""`{{ figure|figure_script:"id" }}`: a chart's figure in the page, as `json_script` writes
it, from the text made once with the cached figure (`adaptation.charts.cache`) when it has
one, so a page view does not serialise its figures again."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html, json_script
from django.utils.safestring import SafeString, mark_safe

from adaptation.charts.cache import EmbeddedFigure

register = template.Library()


@register.filter
def figure_script(figure: Any, element_id: str) -> SafeString:
    """`<script id="{element_id}" type="application/json">` holding `figure`."""
    if isinstance(figure, EmbeddedFigure):
        return format_html(
            '<script id="{}" type="application/json">{}</script>',
            element_id,
            mark_safe(figure.script_json),  # escaped for <script> by `script_text`
        )
    return json_script(figure, element_id)
