"""Engine test fixtures: session-scoped scaled twins (built once per config and seed) for the
twin and stage tests, and the real stage results the known limitations are built from
(`tests.limitation_twins`), for the findings tests."""

from __future__ import annotations

import pytest

from engine.twin import build_twin
from tests.engine.stages.realconfigs import load
from tests.limitation_twins import (  # noqa: F401  (the fixtures)
    npu_pool_spec,
    operators_on_npu,
    operators_with_grouped_mm,
    precision_results,
    twins,
)


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
