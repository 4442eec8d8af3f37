"""Real Chromium for the browser tests, driven by Playwright's sync API.

Debian's `/usr/bin/chromium` is used (Playwright's own browser download cannot work here).
Without it the tests are skipped, except under CI (`CI` set), where they must run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

# Playwright's sync API runs an event loop in this thread; Django would otherwise refuse
# ORM calls from the test body ("You cannot call this from an async context").
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """One Chromium for the session; skipped (outside CI) when it is not installed."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; CI must run the browser tests.")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium) and CI is not set.")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (no cookies) and page, 1440 by 900."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(10_000)
    try:
        yield context.new_page()
    finally:
        context.close()
