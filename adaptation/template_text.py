"""Words of the page templates as plain text, for the API and the management commands.

A value's words live in one template (`partials/device_warning.txt`, `suite_shape.html`); the
pages include it, escaped as HTML. The API and the commands render the same template from the
same values with escaping off, so their text is the page's words, never HTML taken apart
again: a worker named `a&b` reads `a&b`, not `a&amp;b`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.template import Context, Engine


def template_text(name: str, context: Mapping[str, Any]) -> str:
    """The template `name` (of the default template engine) rendered with `context` as plain
    text: nothing HTML-escaped, the blank lines and spaces around it stripped. Raises
    `TemplateDoesNotExist` when there is no such template."""
    template = Engine.get_default().get_template(name)
    return template.render(Context(dict(context), autoescape=False)).strip()
