"""What every page shares: the favicon (and /favicon.ico) and the styled 404 page."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_every_page_links_the_static_svg_favicon(client, logged_in_client):
    href = static("favicon.svg")
    for html in (
        client.get(reverse("login")).content.decode(),
        logged_in_client.get(reverse("adaptation:board")).content.decode(),
        logged_in_client.get(reverse("api-docs")).content.decode(),
    ):
        assert f'<link rel="icon" type="image/svg+xml" href="{href}">' in html
    path = finders.find("favicon.svg")
    assert path, "no static/favicon.svg"
    svg = ElementTree.parse(path).getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg" and svg.get("viewBox") == "0 0 32 32"


def test_favicon_ico_redirects_permanently_to_the_svg_without_login(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == static("favicon.svg")


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
