"""A real Celery worker process for the end-to-end tests, on the suite's own broker and test
database (SQLite file or PostgreSQL `test_*`, whichever the suite runs on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection

from day0web.celery import app

REPO_ROOT = Path(__file__).resolve().parents[2]


def _database_url() -> str:
    """The URL of the database the tests run on, for the worker process."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = quote(db.get("USER") or "")
    password = f":{quote(db['PASSWORD'])}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    host = db.get("HOST") or "localhost"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{db['NAME']}"


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path) -> Iterator[subprocess.Popen]:
    """Start `celery worker` on the day0 and pool.cpu queues; stop it after the test.

    The queues are purged first so messages left by earlier tests cannot reach this worker.
    """
    app.control.purge()
    log_path = tmp_path / "worker.log"
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "DAY0_VAR_DIR": str(settings.VAR_DIR),
        "DAY0_HEARTBEAT_EVERY_S": "1",
    }
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "day0web", "worker",
                "-Q", "day0,pool.cpu", "--concurrency", "1", "--loglevel", "INFO",
                "--hostname", f"e2e-{os.getpid()}@%h", "--without-gossip", "--without-mingle",
            ],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    worker.log_path = log_path  # type: ignore[attr-defined]
    try:
        yield worker
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
        connection.close()


def wait_for(predicate, *, timeout_s: float, worker: subprocess.Popen, what: str) -> None:
    """Poll `predicate` until it is true; fail with the worker's log when it never is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if worker.poll() is not None:
            break
        time.sleep(0.3)
    log = Path(worker.log_path).read_text()[-6000:]  # type: ignore[attr-defined]
    pytest.fail(f"Timed out waiting for {what}. Worker log tail:\n{log}")
