"""Fixtures shared by the whole suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakehub import fake_hub  # noqa: F401  (the local Hub fixture, for every test)

DATA_DIR = Path(__file__).parent / "data"
REALCONFIGS_DIR = DATA_DIR / "realconfigs"


def load_realconfig(name: str) -> dict:
    """A real published config.json from tests/data/realconfigs (file name without .json)."""
    return json.loads((REALCONFIGS_DIR / f"{name}.json").read_text())


@pytest.fixture
def staff_user(django_user_model):
    return django_user_model.objects.create_user(
        username="ada", password="correct horse battery", is_staff=True, is_superuser=True
    )


@pytest.fixture
def logged_in_client(client, staff_user):
    client.force_login(staff_user)
    return client


@pytest.fixture(autouse=True)
def isolated_hf_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No real endpoint, token or cache leaks in: each test gets its own download cache."""
    for name in ("HF_ENDPOINT", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
