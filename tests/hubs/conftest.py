"""Fixtures for the hub-source tests: a fake Hub and an isolated Hugging Face environment."""

from __future__ import annotations

import pytest

from tests.fakehub import fake_hub  # noqa: F401  (re-exported fixture)


@pytest.fixture(autouse=True)
def isolated_hf_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No real endpoint, token or cache leaks in: each test gets its own download cache."""
    for name in ("HF_ENDPOINT", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
