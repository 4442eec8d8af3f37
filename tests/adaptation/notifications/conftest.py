"""Notification tests: the subscriber's loopback endpoint (tests/receiver.py), a stand-in for the
broker, teams and pools."""

from __future__ import annotations

import socket

import pytest

from adaptation.models import AcceleratorPool, Team
from tests.cast import cast  # noqa: F401  (the named cast of roles)
from tests.receiver import receiver  # noqa: F401  (the subscriber's endpoint fixture)


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def sent_messages(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Delivery ids whose Celery message would have been sent (no broker in these tests)."""
    from adaptation.notifications import services

    sent: list[int] = []
    monkeypatch.setattr(services, "_send_delivery_messages", sent.extend)
    return sent


@pytest.fixture
def team(db) -> Team:
    return Team.objects.create(name="release-eng")


@pytest.fixture
def other_pool(db) -> AcceleratorPool:
    return AcceleratorPool.objects.create(name="cpu-b", backend="cpu", queue="pool.cpu-b")


def fake_getaddrinfo(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> list:
    """Make `socket.getaddrinfo` answer `answers` (host -> IPs) for those hosts (others
    resolve for real); returns the list of hosts asked, in order."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host in answers:
            asked.append(host)
            result = []
            for ip in answers[host]:
                if ":" in ip:
                    result.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (ip, port, 0, 0)))
                else:
                    result.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)))
            return result
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked
