"""The words of a known limitation, rendered when it is shown.

A stage's finding (`engine.findings.Finding`) names a template and the data its words need;
the note (`KnownLimitation`) stores both, and every reader (the release page, the board, the
API, the release notes, the admin) asks the note for `shown_title` and `shown_body`, which
render the template now. A reworded template thus changes every stored note at once, without
re-running a stage.

The templates are `templates/limitations/<stage>/<kind>.md`, Django templates that write
Markdown through the "markdown" engine (`adaptation.markdown_templates`: autoescape off, lines
holding only tags trimmed). What one renders is read so:

- its first paragraph (up to the first blank line) is the title: plain text on one line (its
  lines joined with a space, cut to the column with `engine.findings.cut_title`); the pages
  escape it as HTML and the release notes as Markdown where they show it, so a title writes
  names as they are;
- the rest is the body, Markdown: every string from a result goes through the `md` or
  `md_code` filters (`engine.markdown`), so a config's names can neither open markup nor
  inject links (a test reads every template to hold them to it).

Notes with no template (a person's, or a stage's from rules that write their own words) show
their stored `title` and `body`. A note whose template is gone (renamed since it was stored)
shows the words stored with it, the rendering of the last sync, and logs a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.template import TemplateDoesNotExist, engines

from engine.findings import Finding, cut_title

logger = logging.getLogger(__name__)

# Where the notes' templates live, under the "markdown" engine's folder (`templates/`).
TEMPLATE_FOLDER = "limitations"


@dataclass(frozen=True)
class Words:
    """A note's words: `title` (one line of plain text) and `body` (Markdown, "" when
    none)."""

    title: str
    body: str


def template_path(template: str) -> str:
    """The file of a finding's template name: "plan/no-fit" → "limitations/plan/no-fit.md"."""
    return f"{TEMPLATE_FOLDER}/{template}.md"


def render_words(template: str, data: Mapping[str, Any]) -> Words:
    """The words template `template` writes from `data` (its context, name by name): the
    first paragraph as the title, the rest as the body. Raises `TemplateDoesNotExist` when
    there is no such template."""
    text = engines["markdown"].get_template(template_path(template)).render(dict(data))
    title, _, body = text.strip().partition("\n\n")
    return Words(title=cut_title(title), body=body.strip())


def finding_words(finding: Finding) -> Words:
    """The words of `finding`: its template's, or those it carries when it names none.
    Raises `TemplateDoesNotExist` for a template that is not there."""
    if finding.template:
        return render_words(finding.template, finding.data)
    return Words(title=finding.title, body=finding.body)


def stored_words(template: str, data: Any) -> Words | None:
    """The words of a stored note's `template` and `data` as they read now, or None when it
    names no template or its template is gone (logged)."""
    if not template:
        return None
    try:
        return render_words(template, data if isinstance(data, Mapping) else {})
    except TemplateDoesNotExist:
        logger.warning("Known-limitation template %s is missing", template_path(template))
        return None
