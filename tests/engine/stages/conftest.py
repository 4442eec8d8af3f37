"""Shared, session-scoped scaled twins for the stage tests (built once per config and seed)."""

from __future__ import annotations

import pytest

from engine.twin import build_twin
from tests.engine.stages.realconfigs import load


@pytest.fixture(scope="session")
def seeded_twin():
    """`seeded_twin(name, seed=0)`: the twin of tests/data/realconfigs/<name>.json, cached.

    Callers must not change the twin's model in place (the precision stage copies it for each
    target, so measuring is safe).
    """
    cache = {}

    def get(name: str, seed: int = 0):
        if (name, seed) not in cache:
            cache[(name, seed)] = build_twin(load(name), seed=seed)
        return cache[(name, seed)]

    return get
