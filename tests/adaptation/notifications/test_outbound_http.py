"""The outbound HTTP guard: schemes, private addresses in every form, pinning the checked
address, no redirects."""

from __future__ import annotations

import ipaddress

import pytest

from adaptation import outbound_http
from adaptation.outbound_http import OutboundBlocked, OutboundError
from tests.adaptation.notifications.conftest import fake_getaddrinfo


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "not globally routable"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "private"),  # 240.0.0.0/4: "reserved" in RFC 1112, private here
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback (127.0.0.1 inside ::ffff:7f00:1)"),
        ("::ffff:10.0.0.1", "private (10.0.0.1 inside ::ffff:a00:1)"),
        ("2002:7f00:1::", "loopback (127.0.0.1 inside 2002:7f00:1::)"),
        ("2002:a9fe:a9fe::1", "link-local (169.254.169.254 inside 2002:a9fe:a9fe::1)"),
        ("64:ff9b::a00:1", "private (10.0.0.1 inside 64:ff9b::a00:1)"),
    ],
)
def test_internal_addresses_are_named_with_why(address: str, words: str) -> None:
    assert outbound_http.address_blocked_reason(ipaddress.ip_address(address)) == words


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert outbound_http.address_blocked_reason(ipaddress.ip_address(address)) == ""


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        (["10.20.30.40"], "10.20.30.40, a private address"),
        (["169.254.169.254"], "169.254.169.254, a link-local address"),
        (["::1"], "::1, a loopback address"),
        (["::ffff:127.0.0.1"], "::ffff:127.0.0.1, a loopback (127.0.0.1 inside"),
        # ANY internal answer refuses, even after a public one.
        (["93.184.216.34", "192.168.0.10"], "192.168.0.10, a private address"),
    ],
)
def test_a_name_resolving_to_an_internal_address_is_refused_before_connecting(
    monkeypatch: pytest.MonkeyPatch, answer: list[str], shown: str
) -> None:
    fake_getaddrinfo(monkeypatch, {"hooks.example.test": answer})
    with pytest.raises(OutboundBlocked) as refused:
        outbound_http.post("https://hooks.example.test/x", body=b"{}", headers={})
    assert f"hooks.example.test resolves to {shown}" in refused.value.reason


def test_a_public_answer_is_returned_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_getaddrinfo(monkeypatch, {"hooks.example.test": ["93.184.216.34", "2606:4700::1"]})
    addresses = outbound_http.resolve_checked(
        "hooks.example.test", 443, allow_private_network=False
    )
    assert addresses == ["93.184.216.34", "2606:4700::1"]


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "file:///etc/passwd", "gopher://example.com/", "javascript:1"]
)
def test_only_http_and_https_are_allowed(url: str) -> None:
    with pytest.raises(OutboundBlocked, match="Only http and https"):
        outbound_http.post(url, body=b"", headers={}, allow_private_network=True)


def test_an_unresolvable_name_is_an_error_not_a_block() -> None:
    with pytest.raises(OutboundError) as failed:
        outbound_http.post("http://no-such-host.invalid/", body=b"", headers={})
    assert not isinstance(failed.value, OutboundBlocked)
    assert "no-such-host.invalid does not resolve" in failed.value.reason


def test_loopback_is_refused_unless_allowed(receiver) -> None:
    with pytest.raises(OutboundBlocked, match=r"127\.0\.0\.1, a loopback address"):
        outbound_http.post(receiver.url(), body=b"{}", headers={})
    assert receiver.requests == []

    response = outbound_http.post(
        receiver.url(), body=b'{"a": 1}', headers={"X-Test": "1"}, allow_private_network=True
    )
    assert response.status_code == 200
    assert response.body_excerpt == "ok"
    [request] = receiver.requests
    assert request.body == b'{"a": 1}'
    assert request.headers["x-test"] == "1"
    assert request.headers["user-agent"].startswith("day0/")


def test_connects_to_the_checked_address_and_keeps_the_host_name(
    monkeypatch: pytest.MonkeyPatch, receiver
) -> None:
    """The name is resolved once; the request goes to that address with the original Host."""
    asked = fake_getaddrinfo(monkeypatch, {"hooks.example.test": ["127.0.0.1"]})
    response = outbound_http.post(
        f"http://hooks.example.test:{receiver.port}/in?x=1",
        body=b"{}",
        headers={},
        allow_private_network=True,
    )
    assert response.status_code == 200
    assert response.address == "127.0.0.1"
    assert asked == ["hooks.example.test"]
    [request] = receiver.requests
    assert request.path == "/in?x=1"
    assert request.headers["host"] == f"hooks.example.test:{receiver.port}"


def test_redirects_are_returned_not_followed(receiver) -> None:
    receiver.answer("/hook", (302, {"Location": receiver.url("/elsewhere")}))
    response = outbound_http.post(
        receiver.url(), body=b"{}", headers={}, allow_private_network=True
    )
    assert response.status_code == 302
    assert response.headers["location"] == receiver.url("/elsewhere")
    assert [r.path for r in receiver.requests] == ["/hook"]


def test_a_refused_connection_is_an_error(closed_port: int) -> None:
    with pytest.raises(OutboundError, match=r"cannot connect to 127\.0\.0\.1 at 127\.0\.0\.1"):
        outbound_http.post(
            f"http://127.0.0.1:{closed_port}/", body=b"", headers={}, allow_private_network=True
        )


def _self_signed_cert(tmp_path, name: str) -> tuple[str, str]:
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


def test_https_to_the_checked_address_keeps_the_name_for_tls(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """The TLS handshake with the pinned address names the URL's host (SNI), and the
    certificate is verified (an untrusted one is refused)."""
    import contextlib
    import socket
    import ssl
    import threading

    cert, key = _self_signed_cert(tmp_path, "hooks.example.test")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server_names: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: server_names.append(name)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve_one() -> None:
        conn, _ = listener.accept()
        # The client hangs up after refusing the certificate.
        with conn, contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1)

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    fake_getaddrinfo(monkeypatch, {"hooks.example.test": ["127.0.0.1"]})

    with pytest.raises(OutboundError, match="CERTIFICATE_VERIFY_FAILED"):
        outbound_http.post(
            f"https://hooks.example.test:{port}/",
            body=b"{}",
            headers={},
            allow_private_network=True,
        )
    thread.join(timeout=5)
    listener.close()
    assert server_names == ["hooks.example.test"]
