"""Django templates that write Markdown (the release notes, `templates/release_notes/*.md`),
loaded by the "markdown" template engine (`settings.TEMPLATES`).

Markdown is line-based and Django's template language keeps the newline after every tag, so
this loader trims the source as Jinja's `trim_blocks` and `lstrip_blocks` would, for whole
lines only: a line that holds nothing but tags (`{% if %}`, `{% for %}`, `{% load %}`,
`{% include %}`, `{# ... #}`) and blanks leaves nothing behind, its newline included; every
other line is written as it stands. A template is thus read as the lines it writes, and an
included one writes whole lines. The engine runs with autoescape off (HTML escaping is wrong
in Markdown): strings go through the `notes_markdown` filters (`engine.markdown`) instead.

Only names ending in ".md" are found here, so that no HTML template is ever rendered
unescaped by this engine.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from django.template import Origin
from django.template.loaders import filesystem

# One tag or comment: nothing between its delimiters closes it, so a line that opens with a tag
# and ends with one ("{% if x %}words{% endif %}") is not read as tags alone.
_TAG = r"\{%(?:(?!%\}).)*%\}|\{#(?:(?!#\}).)*#\}"
# A line of tags and blanks only, with its newline.
_TAG_LINE = re.compile(rf"^[ \t]*((?:(?:{_TAG})[ \t]*)+)$\n?", re.MULTILINE)


def trim_tag_lines(source: str) -> str:
    """`source` with every line that holds only tags reduced to its tags (no indentation,
    no blanks between them, no newline)."""
    return _TAG_LINE.sub(lambda line: "".join(re.findall(_TAG, line.group(1))), source)


class Loader(filesystem.Loader):
    """The filesystem loader for Markdown templates: ".md" names only, tag lines trimmed."""

    def get_template_sources(self, template_name: str) -> Iterator[Origin]:
        if template_name.endswith(".md"):
            yield from super().get_template_sources(template_name)

    def get_contents(self, origin: Origin) -> str:
        return trim_tag_lines(super().get_contents(origin))
