"""A stored version of the release notes as people read it: the Markdown download (the
generated document with its version line and people's additions), its HTML (through
`adaptation.safe_markdown`, raw HTML off: a note's text cannot inject markup or script), the
printable page and the download's file name.

Every one of them reads the version's stored Markdown, written when the version was stored
(`adaptation.services.release_notes`): the page, the print and the download say the same.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from django.contrib.staticfiles import finders
from django.template import engines
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from adaptation import safe_markdown
from adaptation.models import ReleaseNotes, ReleaseNotesAdditions

DOWNLOAD_TEMPLATE = "release_notes/download.md"
# The document's stylesheet (screen and print): linked by the notes page, inline in the
# printable page.
STYLESHEET = "release_notes.css"


def release_notes_document(
    notes: ReleaseNotes, additions: ReleaseNotesAdditions | None = None
) -> str:
    """The whole Markdown document: the generated notes with their version line after the
    title, then people's additions (when there are any) under "Additions"
    (`templates/release_notes/download.md`)."""
    title, _, rest = notes.markdown.partition("\n")
    document = (
        engines["markdown"]
        .get_template(DOWNLOAD_TEMPLATE)
        .render(
            {
                "notes": notes,
                "title": title.rstrip(),
                "body": rest.strip(),
                "additions": additions,
            }
        )
    )
    return document.strip() + "\n"


def render_markdown(text: str) -> SafeString:
    """`text` (Markdown) as safe HTML through `adaptation.safe_markdown` (raw HTML escaped,
    script URLs refused, tables on): the notes pages and the printable page use it."""
    return mark_safe(safe_markdown.render_markdown(text))  # nothing unsafe survives it


@cache
def _stylesheet() -> SafeString:
    """The text of `static/release_notes.css` (our own file, so safe to inline)."""
    path = finders.find(STYLESHEET)
    if path is None:
        raise FileNotFoundError(f"static file {STYLESHEET} is missing")
    return mark_safe(Path(path).read_text(encoding="utf-8"))


def render_notes_html(
    notes: ReleaseNotes, additions: ReleaseNotesAdditions | None, *, style_nonce: str = ""
) -> str:
    """The printable page of `notes` with `additions`: one standalone HTML document (no
    navigation, its stylesheet inline) that prints cleanly to PDF from a browser; what the
    print view serves and `manage.py release_report --format html` writes. `style_nonce`: the
    response's Content-Security-Policy nonce, which lets the served page's inline stylesheet
    apply (blank for a file). Raises `FileNotFoundError` if the stylesheet is missing."""
    return render_to_string(
        "adaptation/release_notes_print.html",
        {
            "notes": notes,
            "document_html": render_markdown(release_notes_document(notes, additions)),
            "stylesheet": _stylesheet(),
            "style_nonce": style_nonce,
        },
    )


def notes_filename(notes: ReleaseNotes, extension: str) -> str:
    """A download name: "<org>_<name>-<pool>-notes-v<N>.<extension>"."""
    repo = re.sub(r"[^\w.-]+", "_", notes.release.repo_id)
    return f"{repo}-{notes.pool.name}-notes-v{notes.version}.{extension}"
