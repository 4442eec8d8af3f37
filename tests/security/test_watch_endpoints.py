"""Hub watch endpoints: the worker's `HF_TOKEN` goes only to configured hubs, and mirror
watches read only inside the mirror roots.

A canary HTTP server on loopback (IPv4 and IPv6) records every request it gets. For each
internal address spelling (loopback, unspecified, link-local, private ranges, decimal and
hex forms) a watch is refused when saved through the admin, an admin cannot allow-list it
without "allow private network", a row put in the database anyway is refused at the poll,
and the canary sees no request carrying the token. The control test shows the canary does
see the token when it is the configured hub, so its silence means something.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from adaptation.models import AllowedHubEndpoint, HubKind, HubWatch, ModelRelease
from adaptation.services.hub_polling import hub_watch_poll
from engine.hubs import HubSpec
from engine.hubs.huggingface import HuggingFaceSource
from tests.adaptation.webhooks.conftest import Endpoint, hub_body, post_generic, post_hub
from tests.factories import cpu_pool, make_watch

pytestmark = pytest.mark.django_db

TOKEN = "hf_fake_valid_token"  # the token the fake Hub grants; the worker's HF_TOKEN here
BEARER = f"Bearer {TOKEN}"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Canary:
    """A loopback HTTP server that records every request and answers like an empty Hub."""

    port: int = 0
    seen: list[Seen] = field(default_factory=list)

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}"

    @property
    def tokens_seen(self) -> list[str]:
        return [s.headers["authorization"] for s in self.seen if "authorization" in s.headers]


class _DualStackServer(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True

    def server_bind(self) -> None:
        # One socket for ::1 and the IPv4 loopback forms (127.0.0.1, 127.1, 0.0.0.0...).
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


@pytest.fixture
def canary() -> Iterator[Canary]:
    canary = Canary()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            canary.seen.append(Seen(self.command, self.path, headers))
            body = b"[]" if self.path.startswith("/api/models") else b"canary"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = _DualStackServer(("::", 0), Handler)
    canary.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield canary
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture(autouse=True)
def worker_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker holds an HF_TOKEN; HF_ENDPOINT is unset (the public Hub) unless a test
    configures one."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)


# Spellings of the canary's own host (loopback and unspecified), and internal addresses no
# canary listens on (link-local metadata, the private ranges).
CANARY_HOSTS = {
    "loopback": "127.0.0.1",
    "loopback-short": "127.1",
    "localhost": "localhost",
    "ipv6-loopback": "[::1]",
    "unspecified": "0.0.0.0",
    "decimal": "2130706433",
    "hex": "0x7f000001",
    "ipv4-mapped-ipv6": "[::ffff:127.0.0.1]",
}
INTERNAL_URLS = {
    "link-local-metadata": "http://169.254.169.254",
    "private-10": "http://10.0.0.1",
    "private-172.16": "http://172.16.0.1",
    "private-192.168": "http://192.168.1.1",
}
ALL_CASES = [*CANARY_HOSTS, *INTERNAL_URLS]


def case_url(case: str, canary: Canary) -> str:
    """The hub base URL of a case."""
    if case in CANARY_HOSTS:
        return canary.url(CANARY_HOSTS[case])
    return INTERNAL_URLS[case]


def admin_add_watch(client, **fields: str):
    data = {
        "name": "probe",
        "kind": HubKind.HUGGINGFACE,
        "endpoint": "",
        "author": "acme",
        "repo_pattern": "",
        "pool": str(cpu_pool().pk),
        "enabled": "on",
        "poll_interval_s": "300",
        "job_options": "{}",
        **fields,
    }
    return client.post("/admin/adaptation/hubwatch/add/", data)


# -- the control: the canary does see a token sent to it -----------------------------------


def test_control_the_canary_sees_the_token_when_it_is_the_configured_hub(canary, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", canary.url())
    watch = make_watch(kind=HubKind.HUGGINGFACE, endpoint="", author="acme")

    outcome = hub_watch_poll(watch=watch)

    assert outcome.error == ""
    assert canary.tokens_seen and set(canary.tokens_seen) == {BEARER}


# -- refused when saved ----------------------------------------------------------------------


@pytest.mark.parametrize("case", ALL_CASES)
def test_an_engineer_cannot_save_a_watch_on_an_internal_address(case, canary, client, cast):
    client.force_login(cast.eli)
    url = case_url(case, canary) + "/latest/meta-data/"  # a base URL with a path is no better

    response = admin_add_watch(client, endpoint=url)

    assert response.status_code == 200  # the form again, not a redirect to the list
    assert "is not a configured hub" in response.content.decode()
    assert not HubWatch.objects.exists()
    assert canary.seen == []


@pytest.mark.parametrize("case", ALL_CASES)
def test_the_allow_list_refuses_an_internal_address(case, canary, client, cast):
    url = case_url(case, canary)
    entry = AllowedHubEndpoint(url=url)
    with pytest.raises(ValidationError) as refused:
        entry.full_clean()
    assert "address" in refused.value.message_dict["url"][0]

    client.force_login(cast.ada)
    response = client.post("/admin/adaptation/allowedhubendpoint/add/", {"url": url, "note": ""})
    assert response.status_code == 200
    assert not AllowedHubEndpoint.objects.exists()
    assert canary.seen == []


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ("HTTP://[::1]:80/mirror/", "http://[::1]/mirror"),
        ("https://Hub.Example:443", "https://hub.example"),
        ("https://hub.example:8443/", "https://hub.example:8443"),
    ],
)
def test_an_allow_list_entry_is_stored_canonical(typed, stored):
    entry = AllowedHubEndpoint(url=typed, allow_private_network=True)  # resolves nothing
    entry.full_clean()
    assert entry.url == stored


def test_only_the_admin_role_manages_the_allow_list(client, cast):
    client.force_login(cast.eli)
    response = client.post(
        "/admin/adaptation/allowedhubendpoint/add/", {"url": "https://hub.example.com"}
    )
    assert response.status_code == 403
    assert not AllowedHubEndpoint.objects.exists()


def test_a_hub_url_with_credentials_is_refused_whatever_host_it_reads_as(canary, client, cast):
    """`http://huggingface.co@127.0.0.1/` reads as the public Hub but asks 127.0.0.1 (what
    comes before "@" is a user name): refused when saved, allow-listed or polled, and a
    release there gets no token."""
    url = f"http://huggingface.co@127.0.0.1:{canary.port}"
    client.force_login(cast.eli)

    response = admin_add_watch(client, endpoint=url)

    assert response.status_code == 200
    assert "without credentials" in response.content.decode()
    assert not HubWatch.objects.exists()
    with pytest.raises(ValidationError, match="without credentials"):
        AllowedHubEndpoint(url=url, allow_private_network=True).full_clean()
    watch = make_watch(kind=HubKind.HUGGINGFACE, endpoint=url, author="acme")
    assert hub_watch_poll(watch=watch).error.startswith("endpoint refused: ")
    assert HuggingFaceSource(HubSpec(kind="huggingface", endpoint=url)).sends_hf_token is False
    assert canary.seen == []


def test_only_a_superuser_may_allow_a_private_hub(canary, client, cast, django_user_model):
    """As for a pool's engine and a notification subscription: the admin role's form shows
    "allow private network" read-only, and a value posted for it is ignored."""
    data = {"url": canary.url(), "allow_private_network": "on", "note": ""}
    client.force_login(cast.ada)

    form = client.get("/admin/adaptation/allowedhubendpoint/add/").content.decode()
    response = client.post("/admin/adaptation/allowedhubendpoint/add/", data)

    assert 'name="allow_private_network"' not in form
    assert response.status_code == 200
    assert "loopback address" in response.content.decode()
    assert not AllowedHubEndpoint.objects.exists()

    root = django_user_model.objects.create_user("root", is_staff=True, is_superuser=True)
    client.force_login(root)
    response = client.post("/admin/adaptation/allowedhubendpoint/add/", data)

    assert response.status_code == 302
    assert AllowedHubEndpoint.objects.get().allow_private_network is True
    assert canary.seen == []


def test_an_admin_moving_a_private_hub_entry_loses_the_leave(canary, client, cast):
    """An entry a superuser allowed onto a private network keeps that leave for its own URL
    only: the admin role may edit its note, but a new URL is checked by the guard."""
    entry = AllowedHubEndpoint.objects.create(url=canary.url(), allow_private_network=True)
    change = f"/admin/adaptation/allowedhubendpoint/{entry.pk}/change/"
    client.force_login(cast.ada)

    moved = client.post(change, {"url": "http://169.254.169.254", "note": ""})
    noted = client.post(change, {"url": entry.url, "note": "the site's hub"})

    assert moved.status_code == 200
    assert "link-local address" in moved.content.decode()
    assert noted.status_code == 302
    entry.refresh_from_db()
    assert (entry.url, entry.allow_private_network, entry.note) == (
        canary.url(),
        True,
        "the site's hub",
    )


# -- refused at the poll, and no token at the canary -----------------------------------------


@pytest.mark.parametrize("allow_listed", [False, True], ids=["unlisted", "allow-listed-in-db"])
@pytest.mark.parametrize("case", ALL_CASES)
def test_a_watch_row_on_an_internal_address_is_refused_at_the_poll(case, allow_listed, canary):
    """Rows saved before the rule (or written straight to the database, the allow-list entry
    included) are refused before any request."""
    url = case_url(case, canary)
    if allow_listed:
        AllowedHubEndpoint.objects.create(url=url)
    watch = make_watch(kind=HubKind.HUGGINGFACE, endpoint=url, author="acme")

    outcome = hub_watch_poll(watch=watch)

    assert outcome.error.startswith("endpoint refused: ")
    expected = "address" if allow_listed else "is not a configured hub"
    assert expected in outcome.error
    watch.refresh_from_db()
    assert watch.consecutive_failures == 1 and "endpoint refused" in watch.last_error
    assert canary.seen == []
    assert not ModelRelease.objects.exists()


@pytest.mark.parametrize("case", ALL_CASES)
def test_a_release_on_an_internal_address_is_fetched_without_the_token(case, canary):
    """The fetch stage and the upload checks build a source from a release's stored endpoint:
    even an allow-list row written to the database does not give such an address the token."""
    url = case_url(case, canary)
    AllowedHubEndpoint.objects.create(url=url)
    source = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=url))

    assert source.sends_hf_token is False
    if case in CANARY_HOSTS:  # reachable: ask it, and look at what it got
        source.list_releases()
        assert canary.seen
        assert canary.tokens_seen == []


def test_an_admin_may_allow_a_private_hub_explicitly(canary):
    """`allow_private_network` is a superuser's decision: that hub is then used, token and
    all."""
    entry = AllowedHubEndpoint(url=canary.url("127.0.0.1"), allow_private_network=True)
    entry.full_clean()
    entry.save()
    watch = HubWatch(
        name="internal", kind=HubKind.HUGGINGFACE, endpoint=canary.url(), pool=cpu_pool()
    )
    watch.full_clean()
    watch.save()

    assert hub_watch_poll(watch=watch).error == ""
    assert set(canary.tokens_seen) == {BEARER}


def test_the_admin_cannot_point_a_release_at_another_hub_or_folder(client, cast):
    """A release's hub and endpoint are where the stages fetch from: the admin site neither
    adds a release nor changes where one is (which would skip the watch rules)."""
    release = ModelRelease.objects.create(
        hub_kind=HubKind.HUGGINGFACE,
        hub_endpoint="https://huggingface.co",
        repo_id="acme/tiny",
        revision="a" * 40,
        found_by="poll",
    )
    client.force_login(cast.ada)
    moved = {
        "hub_kind": HubKind.MIRROR,
        "hub_endpoint": "/",
        "repo_id": "etc/ssl",
        "revision": "main",
        "found_by": "poll",
        "discovered_at_0": "2026-01-01",
        "discovered_at_1": "00:00:00",
    }

    added = client.post("/admin/adaptation/modelrelease/add/", moved)
    changed = client.post(f"/admin/adaptation/modelrelease/{release.pk}/change/", moved)

    assert added.status_code == 403
    assert changed.status_code == 302
    release.refresh_from_db()
    assert (release.hub_kind, release.hub_endpoint, release.repo_id, release.revision) == (
        HubKind.HUGGINGFACE,
        "https://huggingface.co",
        "acme/tiny",
        "a" * 40,
    )
    assert ModelRelease.objects.count() == 1


# -- redirects off the configured hub ---------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "2130706433"])
def test_a_redirect_from_the_configured_hub_carries_no_token(host, canary, fake_hub, monkeypatch):
    """The configured hub (the fake Hub, a private address the operator chose) answers the
    listing with a redirect to the canary: it is followed, but without `Authorization`."""
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    fake_hub.fail_next("/api/models", 302, {"Location": f"{canary.url(host)}/api/models"})
    watch = make_watch(kind=HubKind.HUGGINGFACE, endpoint="", author="acme")

    hub_watch_poll(watch=watch)

    assert fake_hub.requests[0].headers["authorization"] == BEARER  # the token was in play
    assert [s.path for s in canary.seen] == ["/api/models"]
    assert canary.tokens_seen == []


def test_a_download_redirected_off_the_hub_carries_no_token(canary, fake_hub, monkeypatch):
    """A file's HEAD answered with a redirect to another host (as the Hub sends downloads to
    its CDN): the library fetches it there without the token."""
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    sha = fake_hub.add_repo("acme/tiny", {"config.json": b"{}"}, gated=True)
    fake_hub.fail_next(
        "/acme/tiny/resolve/",
        302,
        {
            "Location": f"{canary.url()}/blob/config.json",
            "X-Repo-Commit": sha,
            "ETag": '"0123abcd"',
            "Content-Length": "6",
        },
        method="HEAD",
    )
    source = HuggingFaceSource(HubSpec(kind="huggingface"))

    fetched = source.fetch_release("acme/tiny", sha)

    assert fetched.files["config.json"] == b"canary"  # what the redirect target served
    assert fake_hub.requests_to("/resolve/")[0].headers["authorization"] == BEARER
    assert [s.path for s in canary.seen] == ["/blob/config.json"]
    assert canary.tokens_seen == []


# -- webhooks cannot name a refused hub or watch -------------------------------------------------


def webhook(kind: str) -> Endpoint:
    from adaptation.webhooks.endpoints import webhook_endpoint_create

    cpu_pool()
    return Endpoint(*webhook_endpoint_create(name=kind, kind=kind))


@pytest.mark.parametrize("hub", ["sneaky", "root", "CANARY"])
def test_a_generic_webhook_cannot_name_a_refused_watch_or_hub(hub, canary, client, queued):
    make_watch(name="sneaky", kind=HubKind.HUGGINGFACE, endpoint=canary.url())
    make_watch(name="root", kind=HubKind.MIRROR, endpoint="/")
    hub = canary.url() if hub == "CANARY" else hub
    payload = {"repo_id": "acme/tiny", "revision": "a" * 40, "hub": hub}

    response = post_generic(client, webhook("generic"), payload)

    assert response.status_code == 400
    reason = response.json()["reason"]
    assert ("is not a hub this day0 reads" if hub.startswith("http") else "hub watch") in reason
    assert not ModelRelease.objects.exists() and queued == []
    assert canary.seen == []


def test_the_hub_webhook_ignores_a_watch_whose_endpoint_is_refused(client, queued):
    make_watch(name="sneaky", kind=HubKind.HUGGINGFACE, endpoint="http://169.254.169.254")

    response = post_hub(client, webhook("huggingface"), hub_body("repo_content_update_main"))

    assert response.status_code == 200
    assert response.json()["verdict"] == "ignored"
    assert "watch 'sneaky' cannot be used" in response.json()["reason"]
    assert queued == []


# -- mirror roots ------------------------------------------------------------------------------


@pytest.fixture
def mirror(tmp_path: Path, settings) -> dict[str, Path]:
    """One mirror root holding a release, and a folder outside it holding another."""
    root, outside = tmp_path / "mirrors", tmp_path / "outside"
    for base in (root / "hub", outside):
        folder = base / "acme" / "tiny"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "escape").symlink_to(outside, target_is_directory=True)
    settings.DAY0_MIRROR_ROOTS = [str(root)]
    return {"root": root, "outside": outside}


def mirror_cases(mirror: dict[str, Path]) -> dict[str, str]:
    root = mirror["root"]
    return {
        "filesystem-root": "/",
        "etc": "/etc",
        "dot-dot": f"{root}/../outside",
        "dot-dot-inside": f"{root}/hub/../../outside",
        "symlink-out": str(root / "escape"),
    }


MIRROR_CASES = ["filesystem-root", "etc", "dot-dot", "dot-dot-inside", "symlink-out"]


def test_control_a_mirror_watch_inside_the_root_finds_the_release(mirror):
    watch = HubWatch(
        name="ok", kind=HubKind.MIRROR, endpoint=str(mirror["root"] / "hub"), pool=cpu_pool()
    )
    watch.full_clean()
    watch.save()
    assert hub_watch_poll(watch=watch).error == ""
    assert ModelRelease.objects.get().repo_id == "acme/tiny"


@pytest.mark.parametrize("case", MIRROR_CASES)
def test_a_mirror_watch_outside_the_roots_is_refused_at_save(case, mirror, client, cast):
    folder = mirror_cases(mirror)[case]
    with pytest.raises(ValidationError, match="outside the mirror roots"):
        HubWatch(name="m", kind=HubKind.MIRROR, endpoint=folder, pool=cpu_pool()).full_clean()

    client.force_login(cast.eli)
    response = admin_add_watch(client, kind=HubKind.MIRROR, endpoint=folder)
    assert response.status_code == 200
    assert "outside the mirror roots" in response.content.decode()
    assert not HubWatch.objects.exists()


@pytest.mark.parametrize("case", MIRROR_CASES)
def test_a_mirror_watch_row_outside_the_roots_is_refused_at_the_poll(case, mirror):
    watch = make_watch(kind=HubKind.MIRROR, endpoint=mirror_cases(mirror)[case])

    outcome = hub_watch_poll(watch=watch)

    assert outcome.error.startswith("endpoint refused: ")
    assert "outside the mirror roots" in outcome.error
    assert not ModelRelease.objects.exists()


def test_a_mirror_folder_replaced_by_a_symlink_after_save_is_refused_at_the_poll(mirror):
    folder = mirror["root"] / "hub"
    watch = HubWatch(name="m", kind=HubKind.MIRROR, endpoint=str(folder), pool=cpu_pool())
    watch.full_clean()
    watch.save()
    (folder / "acme" / "tiny" / "config.json").unlink()
    (folder / "acme" / "tiny").rmdir()
    (folder / "acme").rmdir()
    folder.rmdir()
    folder.symlink_to(mirror["outside"], target_is_directory=True)  # holds acme/tiny too

    outcome = hub_watch_poll(watch=watch)

    assert outcome.error.startswith("endpoint refused: ")
    assert f"(resolved: {mirror['outside']})" in outcome.error
    assert not ModelRelease.objects.exists()
