"""The reaper's question to the broker: did it lose the messages it held?"""

from __future__ import annotations

import pytest
import redis
from celery import current_app

from workers.broker_watch import EPOCH_KEY, messages_lost

REDIS_URL = "redis://127.0.0.1:6379/13"


@pytest.fixture
def redis_broker(monkeypatch):
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    monkeypatch.setattr(current_app.conf, "broker_url", REDIS_URL)
    client.delete(EPOCH_KEY)
    yield client
    client.delete(EPOCH_KEY)


def test_a_redis_broker_that_came_back_empty_is_noticed(redis_broker):
    assert messages_lost() is True  # first look: the marker was not there
    assert messages_lost() is False
    redis_broker.flushdb()  # what a restart without persistence, or FLUSHALL, leaves
    assert messages_lost() is True
    assert messages_lost() is False


def test_an_unreachable_broker_is_not_a_loss(monkeypatch):
    monkeypatch.setattr(current_app.conf, "broker_url", "redis://127.0.0.1:1/0")
    assert messages_lost() is False


def test_a_filesystem_broker_keeps_its_messages(monkeypatch, tmp_path):
    monkeypatch.setattr(current_app.conf, "broker_url", "filesystem://localhost/")
    assert messages_lost() is False
