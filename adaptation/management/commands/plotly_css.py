"""`python manage.py plotly_css [--check] [--chromium PATH]`: write the stylesheets plotly.js
would otherwise add to a page as inline <style> elements, which day0's Content-Security-Policy
refuses (style-src 'self').

plotly.js adds two when it loads: its own rules (the element id "plotly.js-style-global"; it
leaves them out when an element of that id with the class "no-inline-styles" is already in the
page) and maplibre's (left out when an element of maplibre's id exists).
`templates/adaptation/partials/plotly.html` links `static/plotly.css` and
`static/plotly-maplibre.css` under those ids. This command loads the installed plotly.min.js in
Chromium on a page without a policy, reads what it added, and writes both files; `--check`
only compares, as the browser tests do. Run it after upgrading plotly.

Needs Playwright (the dev extra) and Chromium. Exit status 1 when plotly.js added something
else than the two elements, when the partial does not name maplibre's id, or (`--check`) when a
file is stale.
"""

from __future__ import annotations

import re
from pathlib import Path

import plotly
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
GLOBAL_ID = "plotly.js-style-global"
PARTIAL = Path(settings.BASE_DIR) / "templates" / "adaptation" / "partials" / "plotly.html"
STATIC = Path(settings.BASE_DIR) / "static"
CHROMIUM = "/usr/bin/chromium"

# What plotly.js put in <head>: each <style>'s id and text; the global sheet is filled through
# the CSS object model, so its rules as the browser holds them (in cascade order: plotly
# inserts each at the top).
_READ_STYLES = f"""() => ({{
  version: window.Plotly ? Plotly.version : null,
  styles: Array.from(document.querySelectorAll("style"), (s) => ({{
    id: s.id,
    text: s.id === "{GLOBAL_ID}"
      ? Array.from(s.sheet.cssRules, (r) => r.cssText).join("\\n")
      : s.textContent,
  }})),
}})"""


def injected_styles(chromium: str = CHROMIUM) -> tuple[str, dict[str, str]]:
    """plotly.js's version and {element id: CSS} of the <style> elements it adds on load.
    Raises `CommandError` when Playwright or Chromium is missing."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:
        raise CommandError("Playwright is missing: pip install -e '.[dev]'.") from exc
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium, args=["--headless=new", "--no-sandbox"]
            )
            try:
                page = browser.new_page()
                page.set_content("<!doctype html><html><head></head><body></body></html>")
                page.add_script_tag(path=str(PLOTLY_JS))
                found = page.evaluate(_READ_STYLES)
            finally:
                browser.close()
    except Error as exc:
        raise CommandError(f"Chromium ({chromium}) could not load plotly.js: {exc}") from exc
    return str(found["version"]), {s["id"]: s["text"] for s in found["styles"]}


def stylesheets(chromium: str = CHROMIUM) -> dict[Path, str]:
    """{file under static/: its content} for the two sheets. Raises `CommandError` when
    plotly.js added other elements than its own and maplibre's, or when the partial does not
    link maplibre's under its id."""
    version, styles = injected_styles(chromium)
    others = [key for key in styles if key != GLOBAL_ID]
    if GLOBAL_ID not in styles or len(others) != 1:
        raise CommandError(
            f"plotly.js {version} added <style> elements {sorted(styles)}; expected "
            f"{GLOBAL_ID!r} and maplibre's: update this command and {PARTIAL.name}."
        )
    maplibre_id = others[0]
    if not re.search(rf'\bid="{re.escape(maplibre_id)}"', PARTIAL.read_text(encoding="utf-8")):
        raise CommandError(
            f'{PARTIAL} must link plotly-maplibre.css with id="{maplibre_id}" (plotly.js '
            f"{version} skips its inline maplibre style only when that element exists)."
        )
    head = f"/* Written by `manage.py plotly_css` from plotly.js {version}: do not edit. */\n"
    return {
        STATIC / "plotly.css": head + styles[GLOBAL_ID].strip() + "\n",
        STATIC / "plotly-maplibre.css": head + styles[maplibre_id].strip() + "\n",
    }


class Command(BaseCommand):
    help = "Write static/plotly.css and static/plotly-maplibre.css from the installed plotly.js."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--check", action="store_true", help="Compare only; write nothing.")
        parser.add_argument("--chromium", default=CHROMIUM, help="The Chromium to run.")

    def handle(self, *args, check: bool, chromium: str, **options) -> None:
        sheets = stylesheets(chromium)
        stale = [p for p, text in sheets.items() if not p.exists() or p.read_text() != text]
        if check:
            if stale:
                names = ", ".join(p.name for p in stale)
                raise CommandError(f"{names} differ from plotly.js: run manage.py plotly_css.")
            self.stdout.write("plotly stylesheets are up to date.")
            return
        for path in stale:
            path.write_text(sheets[path], encoding="utf-8")
            self.stdout.write(f"wrote {path.relative_to(settings.BASE_DIR)}")
        if not stale:
            self.stdout.write("plotly stylesheets are up to date.")
