"""`engine.hubs.http.network_failure_reason` on real exceptions, raised by the HTTP stacks the
hub sources use (requests + urllib3 under modelscope-hub, httpx, httpx2 under
huggingface_hub) against a closed local port, a name that never resolves (`.invalid`, RFC
2606), a server that hangs up, one that never answers, and one with an untrusted certificate;
and the chains the clients wrap them in."""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import httpx
import httpx2
import pytest
import requests
import urllib3
from modelscope_hub import errors as ms_errors
from urllib3.connection import HTTPSConnection
from urllib3.exceptions import MaxRetryError, NameResolutionError, ProxyError

from engine.hubs.http import network_failure_reason, unreachable_message
from tests.adaptation.notifications.test_outbound_http import _self_signed_cert

# `.invalid` never resolves (RFC 2606), with or without a network.
NOWHERE = "day0-hub.invalid"
# What must never reach people: class names, errno numbers, URLs with queries, urllib3 objects.
LEAKS = re.compile(r"Error|Errno|\[|\?|://|0x|HTTPS?Connection|Pool|Caused by")


def raised(call: Callable[[], object]) -> BaseException:
    """The exception `call` raises (it must raise)."""
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("expected an exception")


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A loopback server whose each accepted connection is given to `handle`; yields its
    port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # so that the loop sees `stop` soon
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(5)
            with conn, contextlib.suppress(OSError):
                handle(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)


def hang_up_at_once(conn: socket.socket) -> None:
    """Read the request, then close with a TCP reset (SO_LINGER 0)."""
    conn.recv(65536)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def never_answer(conn: socket.socket) -> None:
    conn.recv(65536)
    threading.Event().wait(1)


def only_reason(exc: BaseException) -> str:
    reason = network_failure_reason(exc)
    assert not LEAKS.search(reason), reason
    return reason


def test_a_closed_port_is_refused_through_every_stack(closed_port):
    url = f"http://127.0.0.1:{closed_port}/api/models?author=x"
    for call in (
        lambda: requests.get(url, timeout=2),
        lambda: httpx.get(url, timeout=2),
        lambda: httpx2.get(url, timeout=2),
        lambda: urllib3.PoolManager(retries=False).request("GET", url),
    ):
        assert only_reason(raised(call)) == "the connection was refused"


def test_an_invalid_name_does_not_resolve_through_every_stack():
    url = f"https://{NOWHERE}/openapi/v1/models?owner=Qwen"
    for call in (
        lambda: requests.get(url, timeout=2),
        lambda: httpx.get(url, timeout=2),
        lambda: httpx2.get(url, timeout=2),
    ):
        assert only_reason(raised(call)) == "the name does not resolve"


def test_a_hang_up_is_a_reset():
    with serving(hang_up_at_once) as port:
        url = f"http://127.0.0.1:{port}/"
        assert only_reason(raised(lambda: requests.get(url, timeout=2))) == (
            "the connection was reset"
        )
        assert only_reason(raised(lambda: httpx.get(url, timeout=2))) == (
            "the connection was reset"
        )


def test_no_answer_is_a_timeout():
    with serving(never_answer) as port:
        url = f"http://127.0.0.1:{port}/"
        for call in (
            lambda: requests.get(url, timeout=0.2),
            lambda: httpx.get(url, timeout=0.2),
            lambda: httpx2.get(url, timeout=0.2),
        ):
            assert only_reason(raised(call)) == "no answer in time"


def test_an_untrusted_certificate_is_named(tmp_path):
    cert, key = _self_signed_cert(tmp_path, "localhost")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def handshake(conn: socket.socket) -> None:
        with context.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1)

    with serving(handshake) as port:
        url = f"https://localhost:{port}/"
        for call in (
            lambda: requests.get(url, timeout=2),
            lambda: httpx.get(url, timeout=2),
        ):
            assert only_reason(raised(call)) == "its TLS certificate was not accepted"


def forbid_tunnels(conn: socket.socket) -> None:
    """A proxy that refuses every CONNECT."""
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")


def test_a_proxy_that_refuses_is_named_before_the_refusal(closed_port):
    url = "https://hub.example.test/api/models"
    with serving(forbid_tunnels) as port:
        proxy = f"http://127.0.0.1:{port}"
        for call in (
            lambda: requests.get(url, proxies={"https": proxy}, timeout=2),
            lambda: httpx.get(url, proxy=proxy, timeout=2),
            lambda: httpx2.get(url, proxy=proxy, timeout=2),
        ):
            assert only_reason(raised(call)) == "the proxy refused the connection"
    # A proxy nobody listens on: requests says it was the proxy, httpx only that the
    # connection was refused (its error names no proxy).
    down = f"http://127.0.0.1:{closed_port}"
    assert only_reason(raised(lambda: requests.get(url, proxies={"https": down}, timeout=2))) == (
        "the proxy refused the connection"
    )
    assert only_reason(raised(lambda: httpx.get(url, proxy=down, timeout=2))) == (
        "the connection was refused"
    )


def test_a_urllib3_name_resolution_chain_wrapped_by_requests():
    """Built as urllib3 2 raises it (connection.py: `NameResolutionError(host, conn, e) from
    e`), retried into MaxRetryError.reason, and wrapped in requests' ConnectionError args."""
    conn = HTTPSConnection(NOWHERE, 443)
    gai = raised(lambda: socket.getaddrinfo(NOWHERE, 443))
    assert isinstance(gai, socket.gaierror)
    try:
        raise NameResolutionError(NOWHERE, conn, gai) from gai
    except NameResolutionError as exc:
        resolution = exc
    retries = MaxRetryError(None, "/openapi/v1/models?owner=Qwen", reason=resolution)
    wrapped = requests.ConnectionError(retries)
    # Only the wrapper's args lead to the gaierror: no __cause__ / __context__ on it.
    assert wrapped.__cause__ is None and wrapped.__context__ is None
    assert only_reason(wrapped) == "the name does not resolve"
    assert only_reason(retries) == "the name does not resolve"


def test_a_chain_dropped_by_modelscope_hub_is_read_from_its_text(closed_port):
    """modelscope-hub's OpenAPI client keeps only `f"Connection error: {exc}"` of requests'
    error (it raises the NetworkError outside the except block): the message is read."""
    gai = raised(lambda: socket.getaddrinfo(NOWHERE, 443))
    try:
        raise NameResolutionError(NOWHERE, HTTPSConnection(NOWHERE, 443), gai) from gai
    except NameResolutionError as exc:
        resolution = exc
    text = str(requests.ConnectionError(MaxRetryError(None, "/openapi/v1/models?x=1", resolution)))
    error = ms_errors.NetworkError(f"Connection error: {text}")
    assert error.__cause__ is None and error.__context__ is None
    assert only_reason(error) == "the name does not resolve"

    refused = raised(lambda: requests.get(f"http://127.0.0.1:{closed_port}/", timeout=2))
    assert only_reason(ms_errors.NetworkError(f"Connection error: {refused}")) == (
        "the connection was refused"
    )
    timed_out = ms_errors.RequestTimeoutError("Request timed out: read timeout=10")
    assert only_reason(timed_out) == "no answer in time"


def test_a_proxy_error_keeps_its_original_error_outside_the_chain(closed_port):
    refused = raised(lambda: socket.create_connection(("127.0.0.1", closed_port), timeout=2))
    assert only_reason(ProxyError("Unable to connect to proxy", refused)) == (
        "the proxy refused the connection"
    )


def test_an_unknown_failure_is_the_generic_reason():
    assert only_reason(ms_errors.NetworkError("")) == "the connection failed"
    assert only_reason(httpx.RemoteProtocolError("illegal header line")) == (
        "the connection failed"
    )


def test_a_cycle_in_the_chain_ends():
    first, second = ConnectionError("a"), ConnectionError("b")
    first.__context__, second.__context__ = second, first
    assert only_reason(first) == "the connection failed"


def test_the_unreachable_message_blames_the_infrastructure_not_the_release():
    gai = raised(lambda: socket.getaddrinfo(NOWHERE, 443))
    assert unreachable_message(
        "https://modelscope.cn", gai, endpoint_setting="MODELSCOPE_ENDPOINT"
    ) == (
        "cannot reach https://modelscope.cn: the name does not resolve. The hub or the network"
        " is at fault, not the release: check the network, proxy and MODELSCOPE_ENDPOINT;"
        " retry later."
    )
