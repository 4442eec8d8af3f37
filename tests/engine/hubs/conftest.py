"""The hub tests use the suite-wide `fake_hub` fixture and HF isolation (tests/conftest.py),
and each test its own var folder, so that no safetensors header read is cached from another
test (`engine.hubs.safetensors_headers.HeaderCache`)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def own_var_dir(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))
