"""What the admin tells a person once: a secret made for them (a webhook endpoint's, a
notification subscription's signing secret), in the message at the top of the next page.

Messages live in the session (`MESSAGE_STORAGE`), never in a cookie: a cookie is signed,
not encrypted, so the secret would travel and sit in the browser in the clear.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest
from django.utils.html import format_html


def secret_show_once(request: HttpRequest, *, owner: str, secret: str, then: str = "") -> None:
    """Show `secret` of `owner` (what it belongs to, e.g. "'hub'") once, with `then`: what
    to do with it (where it goes). It is not stored in the clear and cannot be shown again."""
    messages.warning(
        request,
        format_html(
            "Secret of {}: <code>{}</code> — copy it now: it is shown only this once. {}",
            owner,
            secret,
            then,
        ),
    )
