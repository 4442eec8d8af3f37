"""App test fixtures: the named cast of roles (`tests.cast`), a second pool (`h200`) for the
report tests, a job with chosen stored figures (`perf_job`) for the regression tests, and the
real stage results the known limitations are built from (`tests.limitation_twins`)."""

from tests.cast import cast  # noqa: F401  (the fixture)
from tests.limitation_twins import (  # noqa: F401  (the fixtures)
    npu_pool_spec,
    operators_on_npu,
    operators_with_grouped_mm,
    precision_results,
    twins,
)
from tests.regression_runs import perf_job  # noqa: F401  (the fixture)
from tests.report_runs import h200  # noqa: F401  (the fixture)
