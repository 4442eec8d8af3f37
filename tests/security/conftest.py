"""Fixtures of the security suite: the named cast of roles (`tests.cast`), and the Celery
messages the webhook receivers would send."""

import pytest

from tests.cast import cast  # noqa: F401  (the fixture)


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stage and settle messages the webhook receivers would send (recorded, not sent)."""
    from adaptation.services import queueing
    from workers import tasks

    messages: list[str] = []
    monkeypatch.setattr(queueing, "stage_message_send", lambda **kw: messages.append("stage"))
    monkeypatch.setattr(
        tasks.settle_upload, "apply_async", lambda *a, **kw: messages.append("settle")
    )
    return messages
