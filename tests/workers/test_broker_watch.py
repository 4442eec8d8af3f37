"""The reaper's question to the broker: did it lose the messages it held?"""

from __future__ import annotations

import pytest
from celery import current_app
from kombu import Connection

from workers.broker_watch import EPOCH_KEY, messages_lost


@pytest.fixture
def redis_client():
    """The app's own broker, when it is Redis (CI's); the test is skipped otherwise."""
    with current_app.connection_for_write() as connection:
        if connection.transport.driver_type != "redis":
            pytest.skip("the broker here is not Redis")
        client = connection.default_channel.client
        yield client


def test_a_redis_broker_that_came_back_empty_is_noticed(redis_client):
    redis_client.delete(EPOCH_KEY)
    assert messages_lost() is True  # the marker was not there
    assert messages_lost() is False
    redis_client.delete(EPOCH_KEY)  # what a restart without persistence, or FLUSHALL, leaves
    assert messages_lost() is True
    assert messages_lost() is False


def test_an_unreachable_broker_is_not_a_loss(monkeypatch):
    monkeypatch.setattr(
        current_app,
        "connection_for_write",
        lambda: Connection("redis://127.0.0.1:1/0", connect_timeout=1),
    )
    assert messages_lost() is False


def test_a_filesystem_broker_keeps_its_messages(monkeypatch, tmp_path):
    monkeypatch.setattr(current_app, "connection_for_write", lambda: Connection("filesystem://"))
    assert messages_lost() is False
