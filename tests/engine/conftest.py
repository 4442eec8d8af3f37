"""Engine test fixtures: the real stage results the known limitations are built from
(`tests.limitation_twins`), for the findings tests."""

from tests.limitation_twins import (  # noqa: F401  (the fixtures)
    npu_pool_spec,
    operators_on_npu,
    operators_with_grouped_mm,
    precision_results,
    twins,
)
