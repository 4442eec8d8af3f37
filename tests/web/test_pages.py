"""What every page shares: the inline favicon and the styled 404 page."""

from __future__ import annotations

import re
from urllib.parse import unquote

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_every_page_has_an_inline_svg_favicon(client, logged_in_client):
    for html in (
        client.get(reverse("login")).content.decode(),
        logged_in_client.get(reverse("adaptation:board")).content.decode(),
    ):
        icon = re.search(r'<link rel="icon" type="image/svg\+xml" href="([^"]+)">', html)
        assert icon, "no favicon link: the browser asks for /favicon.ico"
        assert icon[1].startswith("data:image/svg+xml,")
        svg = unquote(icon[1].removeprefix("data:image/svg+xml,"))
        assert svg.startswith("<svg xmlns='http://www.w3.org/2000/svg'") and svg.endswith("</svg>")


def test_unknown_release_gets_the_styled_404_page(logged_in_client):
    response = logged_in_client.get(reverse("adaptation:release_detail", args=[999999]))
    html = response.content.decode()
    assert response.status_code == 404
    assert '<h1 id="not-found-title">Page not found</h1>' in html
    assert "<code>/releases/999999/</code>" in html
    assert f'href="{reverse("adaptation:board")}"' in html
    assert 'class="site-header"' in html and "day0.css" in html  # extends base.html
    assert "Signed in as" in html


def test_unknown_address_gets_the_404_page_without_login(client):
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "Page not found" in html and "<code>/no/such/page/</code>" in html
    assert "Signed in as" not in html
