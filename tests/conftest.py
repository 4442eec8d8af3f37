"""Fixtures shared by the whole suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
